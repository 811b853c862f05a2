// PCRE2 behind Regex: one compiled pattern shared by all threads, with per-thread match data and JIT stack.
#include "training/tokenizers/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>
#include <memory>
#include <stdexcept>

namespace bridge::training::tokenizers {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

// One thread's scratch: the match data (one pair of offsets: only whole matches are used) and a JIT stack large
// enough for look-aheads over long whitespace runs.
struct ThreadScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  ThreadScratch() {
    if (data == nullptr || context == nullptr || stack == nullptr) throw std::bad_alloc();
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~ThreadScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  ThreadScratch(const ThreadScratch&) = delete;
  ThreadScratch& operator=(const ThreadScratch&) = delete;
};

ThreadScratch& scratch() {
  thread_local ThreadScratch instance;
  return instance;
}

bool is_hex(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }

// Oniguruma's \w in PCRE2's terms (a class body), and what it adds outside a class.
constexpr const char* kOnigurumaWord = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}";
constexpr const char* kLatin1WordNumbers = "\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}";

}  // namespace

std::string oniguruma_to_pcre2(const std::string& pattern, const std::string& where) {
  const auto refuse = [&](const std::string& what) {
    return std::invalid_argument(where + ": " + what + " in the pattern " + pattern +
                                 " means something else to PCRE2, which bridge matches with; such a pattern is not "
                                 "supported");
  };
  std::string out;
  out.reserve(pattern.size() + 32);
  int in_class = 0;  // depth of [...]
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        out += "\\p{White_Space}";  // Unicode White_Space, as Oniguruma's \s (PCRE2's also takes U+180E)
      } else if (e == 'S') {
        out += "\\P{White_Space}";
      } else if (e == 'w') {
        // Oniguruma's word characters: Alphabetic, marks, decimal digits and connectors (PCRE2's \w is letters,
        // all numbers and '_'), and outside a class also Latin-1's number signs ² ³ ¹ ¼ ½ ¾, as the library
        // matches them (measured over every code point with tokenizers 0.23).
        out += in_class ? std::string(kOnigurumaWord) : "[" + std::string(kOnigurumaWord) + kLatin1WordNumbers + "]";
      } else if (e == 'W') {
        if (in_class) throw refuse("\\W inside a character class");
        out += "[^" + std::string(kOnigurumaWord) + kLatin1WordNumbers + "]";
      } else if (e == 'h') {  // Ruby syntax: a hex digit (PCRE2: horizontal space)
        out += in_class ? "0-9a-fA-F" : "[0-9a-fA-F]";
      } else if (e == 'H') {
        if (in_class) throw refuse("\\H inside a character class");
        out += "[^0-9a-fA-F]";
      } else if (e == 'u' && i + 4 < pattern.size() && is_hex(pattern[i + 1]) && is_hex(pattern[i + 2]) &&
                 is_hex(pattern[i + 3]) && is_hex(pattern[i + 4])) {
        out += "\\x{" + pattern.substr(i + 1, 4) + "}";
        i += 4;
      } else {
        out += '\\';
        out += e;
      }
      continue;
    }
    if (c == '[') {
      if (in_class && !(i + 1 < pattern.size() && pattern[i + 1] == ':')) throw refuse("a nested character class");
      if (!in_class) {
        ++in_class;
        out += c;
        // A ']' first in the class (after an optional '^') is a literal to both engines.
        if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
        if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
        continue;
      }
    } else if (c == ']' && in_class) {
      --in_class;
    } else if (c == '&' && in_class && i + 1 < pattern.size() && pattern[i + 1] == '&') {
      throw refuse("a class intersection (&&)");
    }
    out += c;
  }
  return out;
}

Regex::Regex(std::string pattern, std::string where) : pattern_(std::move(pattern)), where_(std::move(where)) {
  const std::string translated = oniguruma_to_pcre2(pattern_, where_);
  int error = 0;
  PCRE2_SIZE offset = 0;
  // MULTILINE: in Oniguruma's Ruby syntax, which tokenizers uses, ^ and $ match at every line's start and end.
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (code == nullptr) {
    throw std::invalid_argument(where_ + ": the pattern does not compile as a regular expression (" +
                                pcre2_message(error) + " at offset " + std::to_string(offset) + "): " + pattern_);
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::find_all(std::string_view text, std::vector<Match>& matches) const {
  auto* code = static_cast<pcre2_code*>(code_);
  ThreadScratch& local = scratch();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // Oniguruma's find_iter, which tokenizers uses: an empty match is reported and the search moves one character on;
  // an empty match right where a non-empty one ended is skipped.
  PCRE2_SIZE start = 0;
  bool skip_empty_at_start = false;
  while (start <= text.size()) {
    int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), start, 0, local.data, local.context)
                  : pcre2_match(code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, local.data, local.context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // the interpreter keeps its backtracking on the heap instead
      rc = pcre2_match(code, subject, text.size(), start, PCRE2_NO_JIT | PCRE2_NO_UTF_CHECK, local.data, local.context);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      throw std::runtime_error(where_ + ": matching the pattern failed (" + pcre2_message(rc) + ") at byte " +
                               std::to_string(start) + " of a " + std::to_string(text.size()) + "-byte text");
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(local.data);
    const std::size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      matches.push_back({begin, end});
      start = end;
      skip_empty_at_start = true;
      continue;
    }
    if (!(skip_empty_at_start && begin == start)) matches.push_back({begin, end});
    skip_empty_at_start = false;
    start = end + 1;
    while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) ++start;
  }
}

std::string regex_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size() * 2);
  for (const char c : text) {
    if (std::string_view("\\^$.|?*+()[]{}-/#&~ ").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace bridge::training::tokenizers
