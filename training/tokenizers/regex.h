// The split and replace patterns of tokenizer.json files, compiled with PCRE2 (Unicode properties, look-around and
// case-insensitive groups, as those patterns need) and JIT-compiled when the platform allows.
//
//   Regex words(R"(\p{L}+|\p{N}{1,3})", "pre_tokenizer.pattern");
//   std::vector<Regex::Match> found;
//   words.find_all("abc 1234", found);  // {0, 3}, {4, 7}, {7, 8}
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace bridge::training::tokenizers {

class Regex {
 public:
  struct Match {
    std::size_t begin = 0, end = 0;  ///< byte offsets
  };

  /// Compiles `pattern` (Oniguruma syntax, translated by oniguruma_to_pcre2) in UTF mode with Unicode properties
  /// (\d and case-folding follow Unicode, \w is rewritten to Oniguruma's set, as the engine that Hugging Face
  /// tokenizers uses matches them). Throws
  /// std::invalid_argument naming `where`, the PCRE2 message and the offset in the pattern when it does not compile.
  Regex(std::string pattern, std::string where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  /// Appends to `matches` the non-overlapping matches in `text` (which must be valid UTF-8: it is not checked
  /// again), left to right, empty ones included as Oniguruma reports them. Thread-safe.
  void find_all(std::string_view text, std::vector<Match>& matches) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_, where_;
  void* code_ = nullptr;  // pcre2_code_8, kept out of this header
  bool jit_ = false;
};

/// `pattern` (Oniguruma's Ruby syntax, as tokenizer.json files are written for) in PCRE2's: \s and \S as Unicode
/// White_Space, \w and \W as Oniguruma's word characters, \h as a hex digit, \uHHHH as a code point. Throws
/// std::invalid_argument naming `where` for what PCRE2 would read differently and cannot be rewritten (class
/// intersections, nested classes).
std::string oniguruma_to_pcre2(const std::string& pattern, const std::string& where);

/// `text` with every regex metacharacter escaped, so that Regex matches it literally.
std::string regex_escape(std::string_view text);

}  // namespace bridge::training::tokenizers
