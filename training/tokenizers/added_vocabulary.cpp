// Added-token splitting as tokenizers' added_vocabulary.rs (find_matches): leftmost-longest, non-overlapping matches,
// then each token's single_word / lstrip / rstrip rules, with Unicode whitespace and word characters from ICU.
#include "training/tokenizers/added_vocabulary.h"

#include <unicode/uchar.h>

#include <algorithm>

#include "training/tokenizers/utf8.h"

namespace bridge::training::tokenizers {
namespace {

bool is_white_space(char32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)) != 0; }

// The Rust regex crate's \w, which single_word's word-boundary test uses: Alphabetic, marks, decimal digits,
// connector punctuation and the joiners.
bool is_word_char(char32_t c) {
  const auto code = static_cast<UChar32>(c);
  if (u_hasBinaryProperty(code, UCHAR_ALPHABETIC) || u_hasBinaryProperty(code, UCHAR_JOIN_CONTROL)) return true;
  return (U_GET_GC_MASK(code) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}

// The last character of text[0, end), decoded backwards.
bool last_char(std::string_view text, std::size_t end, char32_t& c, std::size_t& start) {
  if (end == 0) return false;
  start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  std::size_t i = start;
  return utf8::next(text, i, c);
}

}  // namespace

void AddedVocabulary::Trie::insert(const std::string& content, int32_t token) {
  if (content.empty()) return;
  empty = false;
  first_byte[static_cast<unsigned char>(content[0])] = true;
  int32_t node = 0;
  for (const char ch : content) {
    const auto byte = static_cast<unsigned char>(ch);
    auto& children = nodes[static_cast<std::size_t>(node)].children;
    auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1}));
    if (it != children.end() && it->first == byte) {
      node = it->second;
    } else {
      const auto child = static_cast<int32_t>(nodes.size());
      children.insert(it, {byte, child});
      nodes.emplace_back();
      node = child;
    }
  }
  // A repeated content keeps its first token, as the library's pattern list does.
  if (nodes[static_cast<std::size_t>(node)].token < 0) nodes[static_cast<std::size_t>(node)].token = token;
}

std::pair<int32_t, std::size_t> AddedVocabulary::Trie::longest_at(std::string_view text, std::size_t i) const {
  std::pair<int32_t, std::size_t> best{-1, 0};
  int32_t node = 0;
  for (std::size_t k = i; k < text.size(); ++k) {
    const auto byte = static_cast<unsigned char>(text[k]);
    const auto& children = nodes[static_cast<std::size_t>(node)].children;
    auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1}));
    if (it == children.end() || it->first != byte) break;
    node = it->second;
    if (nodes[static_cast<std::size_t>(node)].token >= 0)
      best = {nodes[static_cast<std::size_t>(node)].token, k + 1 - i};
  }
  return best;
}

AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  for (std::size_t k = 0; k < tokens_.size(); ++k) {
    by_id_.emplace(tokens_[k].id, k);
    by_content_.emplace(tokens_[k].content, k);
    (tokens_[k].normalized ? normalized_ : raw_).insert(tokens_[k].form, static_cast<int32_t>(k));
  }
}

const AddedToken* AddedVocabulary::find(int64_t id) const {
  const auto found = by_id_.find(id);
  return found == by_id_.end() ? nullptr : &tokens_[found->second];
}

const AddedToken* AddedVocabulary::find(std::string_view content) const {
  const auto found = by_content_.find(std::string(content));
  return found == by_content_.end() ? nullptr : &tokens_[found->second];
}

void AddedVocabulary::split(std::string_view text, bool normalized, std::vector<Segment>& segments) const {
  segments.clear();
  const Trie& trie = normalized ? normalized_ : raw_;
  std::size_t start_offset = 0;
  if (!trie.empty) {
    for (std::size_t i = 0; i < text.size();) {
      if (!trie.first_byte[static_cast<unsigned char>(text[i])]) {
        ++i;
        continue;
      }
      const auto [index, length] = trie.longest_at(text, i);
      if (index < 0) {
        ++i;
        continue;
      }
      const AddedToken& token = tokens_[static_cast<std::size_t>(index)];
      std::size_t start = i, stop = i + length;
      // The next match is searched from this match's end, even where rstrip takes the whitespace after it: a token
      // that starts in that whitespace is still found (the library's iterator works on the raw matches).
      i = stop;
      if (token.single_word) {
        char32_t c = 0;
        std::size_t at = 0;
        const bool word_before = last_char(text, start, c, at) && is_word_char(c);
        std::size_t k = stop;
        const bool word_after = stop < text.size() && utf8::next(text, k, c) && is_word_char(c);
        if (word_before || word_after) continue;
      }
      if (token.lstrip) {
        std::size_t new_start = start;
        char32_t c = 0;
        std::size_t at = 0;
        while (last_char(text, new_start, c, at) && is_white_space(c)) new_start = at;
        start = std::max(new_start, start_offset);  // spaces an earlier token already took stay with it
      }
      if (token.rstrip) {
        for (std::size_t k = stop; k < text.size();) {
          char32_t c = 0;
          if (!utf8::next(text, k, c) || !is_white_space(c)) break;
          stop = k;
        }
      }
      if (start_offset < start) segments.push_back({-1, start_offset, start});
      segments.push_back({token.id, start, stop});
      start_offset = stop;
    }
  }
  if (start_offset < text.size() || segments.empty()) segments.push_back({-1, start_offset, text.size()});
}

}  // namespace bridge::training::tokenizers
