// The sentence rule of sentence_splitter.h, in one pass over the text.
#include "training/datasets/sentence_splitter.h"

#include <algorithm>
#include <array>
#include <cctype>

#include "utils/strings.h"

namespace bridge::training::datasets {
namespace {

constexpr std::array<std::string_view, 20> kAbbreviations = {"mr", "mrs", "ms",  "dr",  "prof", "sr",  "jr",
                                                             "st", "mt",  "vs",  "etc", "e.g",  "i.e", "cf",
                                                             "al", "inc", "ltd", "co",  "no",   "fig"};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_terminal(char c) { return c == '.' || c == '!' || c == '?'; }
bool is_closing(char c) { return c == '"' || c == '\'' || c == ')' || c == ']' || c == '}'; }

// Whether the word that ends at `end` (exclusive, just before a '.') is an abbreviation.
bool is_abbreviation(std::string_view text, std::size_t end) {
  std::size_t begin = end;
  while (begin > 0 && !is_space(text[begin - 1]) && text[begin - 1] != '(' && text[begin - 1] != '"') --begin;
  const std::string word = bridge::utils::to_lower(text.substr(begin, end - begin));
  if (word.size() == 1 && std::isalpha(static_cast<unsigned char>(word[0]))) return true;
  return std::find(kAbbreviations.begin(), kAbbreviations.end(), word) != kAbbreviations.end();
}

}  // namespace

std::vector<std::string> split_sentences(std::string_view text, bool keep_newlines) {
  std::vector<std::string> sentences;
  std::size_t start = 0, i = 0;
  while (i < text.size()) {
    if (!is_terminal(text[i])) {
      ++i;
      continue;
    }
    const std::size_t run = i;
    while (i < text.size() && is_terminal(text[i])) ++i;
    const bool single_period = text[run] == '.' && i == run + 1;
    while (i < text.size() && is_closing(text[i])) ++i;
    const std::size_t end = i;
    std::size_t next = end;
    while (next < text.size() && is_space(text[next])) ++next;
    const bool spaced = next > end;
    const bool lower_next = next < text.size() && std::islower(static_cast<unsigned char>(text[next]));
    const bool abbreviation = single_period && is_abbreviation(text, run);
    if (!spaced || next == text.size() || lower_next || abbreviation) continue;
    sentences.emplace_back(text.substr(start, (keep_newlines ? next : end) - start));
    start = next;
  }
  if (start < text.size()) {
    std::string_view last = text.substr(start);
    if (!keep_newlines) {
      while (!last.empty() && is_space(last.back())) last.remove_suffix(1);
    }
    if (!last.empty()) sentences.emplace_back(last);
  }
  return sentences;
}

}  // namespace bridge::training::datasets
