// tokenizer.json normalizers (NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Prepend, Replace, Sequence) with
// ICU doing the Unicode work, and the JSON helpers the other stages share.
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/uniset.h>

#include <algorithm>
#include <array>
#include <memory>
#include <string_view>

#include "training/tokenizers/hf_components.h"
#include "training/tokenizers/regex.h"
#include "training/tokenizers/utf8.h"

namespace bridge::training::tokenizers::hf {

std::invalid_argument unsupported(const std::string& path, const std::string& what) {
  return std::invalid_argument(path + ": " + what);
}

std::string type_of(const nlohmann::json& object, const std::string& path) {
  if (!object.is_object()) throw unsupported(path, "expected a JSON object, got " + std::string(object.type_name()));
  const auto type = object.find("type");
  if (type == object.end() || !type->is_string()) throw unsupported(path, "has no \"type\" string");
  return type->get<std::string>();
}

const nlohmann::json& field(const nlohmann::json& object, const std::string& path, const char* name) {
  const auto found = object.find(name);
  if (found == object.end()) throw unsupported(path, std::string("the field \"") + name + "\" is missing");
  return *found;
}

std::string string_field(const nlohmann::json& object, const std::string& path, const char* name) {
  const nlohmann::json& value = field(object, path, name);
  if (!value.is_string())
    throw unsupported(path + "." + name, "expected a string, got " + std::string(value.type_name()));
  return value.get<std::string>();
}

bool bool_field(const nlohmann::json& object, const std::string& path, const char* name, bool fallback) {
  const auto found = object.find(name);
  if (found == object.end() || found->is_null()) return fallback;
  if (!found->is_boolean()) {
    throw unsupported(path + "." + name, "expected true or false, got " + std::string(found->type_name()));
  }
  return found->get<bool>();
}

void only_keys(const nlohmann::json& object, const std::string& path, std::initializer_list<const char*> known) {
  for (const auto& item : object.items()) {
    bool listed = item.key() == "type";
    for (const char* name : known) listed = listed || item.key() == name;
    if (!listed) {
      throw unsupported(path + "." + item.key(), "bridge does not implement this option of " +
                                                     object.value("type", std::string("the object")) +
                                                     "; a tokenizer that needs it cannot be reproduced exactly");
    }
  }
}

namespace {

bool is_ascii(std::string_view text) {
  for (const char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

void check_icu(UErrorCode status, const char* what) {
  if (U_FAILURE(status)) throw std::runtime_error(std::string("ICU ") + what + " failed: " + u_errorName(status));
}

// NFC/NFD/NFKC/NFKD of the characters Unicode 9.0 had: the tables of the crate tokenizers normalizes with, so a
// character assigned later (U+1FBF0's NFKC "0" came in Unicode 13) stays as it is, as the library leaves it.
class UnicodeNormalization : public Normalizer {
 public:
  explicit UnicodeNormalization(const std::string& form) {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* full = nullptr;
    if (form == "NFC") full = icu::Normalizer2::getNFCInstance(status);
    if (form == "NFD") full = icu::Normalizer2::getNFDInstance(status);
    if (form == "NFKC") full = icu::Normalizer2::getNFKCInstance(status);
    if (form == "NFKD") full = icu::Normalizer2::getNFKDInstance(status);
    check_icu(status, "normalizer instance");
    unicode_9_ = std::make_unique<icu::UnicodeSet>(icu::UnicodeString(u"[:age=9.0:]"), status);
    check_icu(status, "the Unicode 9.0 character set");
    unicode_9_->freeze();
    normalizer_ = std::make_unique<icu::FilteredNormalizer2>(*full, *unicode_9_);
  }
  void normalize(std::string& text) const override {
    if (is_ascii(text)) return;  // ASCII is in every normalization form
    UErrorCode status = U_ZERO_ERROR;
    if (normalizer_->isNormalizedUTF8(text, status) && U_SUCCESS(status)) return;
    std::string out;
    icu::StringByteSink<std::string> sink(&out);
    status = U_ZERO_ERROR;
    normalizer_->normalizeUTF8(0, text, sink, nullptr, status);
    check_icu(status, "normalization");
    text = std::move(out);
  }

 private:
  std::unique_ptr<icu::UnicodeSet> unicode_9_;
  std::unique_ptr<icu::FilteredNormalizer2> normalizer_;
};

// Rust's char::to_lowercase, one character at a time as tokenizers applies it: full mappings (U+0130 becomes "i"
// and a combining dot) and no final-sigma rule.
class Lowercase : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    if (is_ascii(text)) {
      for (char& c : text) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
      return;
    }
    std::string out;
    out.reserve(text.size());
    for (std::size_t i = 0; i < text.size();) {
      char32_t c = 0;
      if (!utf8::next(text, i, c)) return;
      if (c == 0x130) {
        out += "i\xCC\x87";
      } else {
        utf8::append(static_cast<char32_t>(u_tolower(static_cast<UChar32>(c))), out);
      }
    }
    text = std::move(out);
  }
};

// Unicode White_Space, as Rust's char::is_whitespace.
bool is_white_space(char32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)) != 0; }

class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    // The first and one past the last non-whitespace character's bytes.
    std::size_t first = text.size(), past_last = 0;
    for (std::size_t i = 0; i < text.size();) {
      const std::size_t at = i;
      char32_t c = 0;
      if (!utf8::next(text, i, c)) return;
      if (!is_white_space(c)) {
        first = std::min(first, at);
        past_last = i;
      }
    }
    if (first == text.size()) {  // all whitespace
      if (left_ || right_) text.clear();
      return;
    }
    const std::size_t begin = left_ ? first : 0, end = right_ ? past_last : text.size();
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class StripAccents : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    if (is_ascii(text)) return;
    std::string out;
    for (std::size_t i = 0; i < text.size();) {
      const std::size_t start = i;
      char32_t c = 0;
      if (!utf8::next(text, i, c)) return;
      // A combining mark as Unicode 9.0 knew them (the library's tables): a later mark stays.
      UVersionInfo age;
      u_charAge(static_cast<UChar32>(c), age);
      const bool known_in_9 = age[0] < 9 || (age[0] == 9 && age[1] == 0);
      if (known_in_9 && (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_M_MASK) != 0) continue;
      out.append(text, start, i - start);
    }
    text = std::move(out);
  }
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class Sequence : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> stages) : stages_(std::move(stages)) {}
  void normalize(std::string& text) const override {
    for (const auto& stage : stages_) stage->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> stages_;
};

}  // namespace

/// A {"String": s} or {"Regex": r} pattern of Split, Replace normalizers and decoders, as a Regex.
std::unique_ptr<Regex> make_pattern(const nlohmann::json& pattern, const std::string& path) {
  if (pattern.is_object() && pattern.size() == 1) {
    if (pattern.contains("String") && pattern["String"].is_string()) {
      return std::make_unique<Regex>(regex_escape(pattern["String"].get<std::string>()), path);
    }
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      return std::make_unique<Regex>(pattern["Regex"].get<std::string>(), path);
    }
  }
  throw unsupported(path, "expected {\"String\": ...} or {\"Regex\": ...}, got " + pattern.dump());
}

/// Replaces each match of `pattern` in `text` by `content`.
void replace_all(const Regex& pattern, const std::string& content, std::string& text) {
  if (text.empty()) return;  // the library finds no match in an empty string, even for a pattern matching ""
  std::vector<Regex::Match> matches;
  pattern.find_all(text, matches);
  if (matches.empty()) return;
  std::string out;
  std::size_t done = 0;
  for (const Regex::Match& match : matches) {
    out.append(text, done, match.begin - done);
    out += content;
    done = match.end;
  }
  out.append(text, done, std::string::npos);
  text = std::move(out);
}

namespace {

class Replace : public Normalizer {
 public:
  Replace(std::unique_ptr<Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& text) const override { replace_all(*pattern_, content_, text); }

 private:
  std::unique_ptr<Regex> pattern_;
  std::string content_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& object, const std::string& path) {
  const std::string type = type_of(object, path);
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    only_keys(object, path, {});
    return std::make_unique<UnicodeNormalization>(type);
  }
  if (type == "Lowercase") {
    only_keys(object, path, {});
    return std::make_unique<Lowercase>();
  }
  if (type == "Strip") {
    only_keys(object, path, {"strip_left", "strip_right"});
    return std::make_unique<Strip>(bool_field(object, path, "strip_left", false),
                                   bool_field(object, path, "strip_right", false));
  }
  if (type == "StripAccents") {
    only_keys(object, path, {});
    return std::make_unique<StripAccents>();
  }
  if (type == "Prepend") {
    only_keys(object, path, {"prepend"});
    return std::make_unique<Prepend>(string_field(object, path, "prepend"));
  }
  if (type == "Replace") {
    only_keys(object, path, {"pattern", "content"});
    return std::make_unique<Replace>(make_pattern(field(object, path, "pattern"), path + ".pattern"),
                                     string_field(object, path, "content"));
  }
  if (type == "Sequence") {
    only_keys(object, path, {"normalizers"});
    const nlohmann::json& list = field(object, path, "normalizers");
    if (!list.is_array()) throw unsupported(path + ".normalizers", "expected a list");
    std::vector<std::unique_ptr<Normalizer>> stages;
    for (std::size_t i = 0; i < list.size(); ++i) {
      stages.push_back(make_normalizer(list[i], path + ".normalizers[" + std::to_string(i) + "]"));
    }
    return std::make_unique<Sequence>(std::move(stages));
  }
  throw unsupported(path + ".type", "the normalizer \"" + type +
                                        "\" is not implemented (bridge has NFC, NFD, NFKC, NFKD, Lowercase, Strip, "
                                        "StripAccents, Prepend, Replace and Sequence)" +
                                        (type == "Precompiled" ? "; a SentencePiece model converted to tokenizer.json "
                                                                 "loads exactly as SentencePieceTokenizer with its "
                                                                 "tokenizer.model"
                                                               : ""));
}

const std::string& byte_level_char(unsigned char b) {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> result;
    char32_t next = 256;
    for (int i = 0; i < 256; ++i) {
      const bool printable = (i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE && i <= 0xFF);
      utf8::append(printable ? static_cast<char32_t>(i) : next++, result[static_cast<std::size_t>(i)]);
    }
    return result;
  }();
  return table[b];
}

int byte_level_byte(char32_t c) {
  static const std::array<int, 512> table = [] {
    std::array<int, 512> result;
    result.fill(-1);
    for (int b = 0; b < 256; ++b) {
      const std::string& s = byte_level_char(static_cast<unsigned char>(b));
      std::size_t i = 0;
      char32_t code = 0;
      utf8::next(s, i, code);
      result[code] = b;
    }
    return result;
  }();
  return c < 512 ? table[c] : -1;
}

}  // namespace bridge::training::tokenizers::hf
