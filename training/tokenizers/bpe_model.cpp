// BPE as tokenizers' models/bpe (model.rs merge_word, word.rs merge_all): characters to ids with byte fallback and
// unknown-token fusion, then merges from a priority queue ordered by (rank, position).
#include "training/tokenizers/bpe_model.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <queue>
#include <stdexcept>

#include "training/tokenizers/utf8.h"

namespace bridge::training::tokenizers {
namespace {

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

struct Symbol {
  int32_t id;
  int64_t prev, next;
  std::size_t length;  // bytes of the word it covers; 0 once merged into its left neighbour
};

struct Merge {
  std::size_t pos;
  int32_t rank, new_id;
  // std::priority_queue pops the largest: the lowest rank, then the leftmost position, must compare largest.
  bool operator<(const Merge& other) const {
    if (rank != other.rank) return rank > other.rank;
    return pos > other.pos;
  }
};

}  // namespace

BpeModel::BpeModel(std::unordered_map<std::string, int32_t> vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options,
                   const std::string& where)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab_) {
    if (id < 0) throw std::invalid_argument(where + ".vocab: token \"" + token + "\" has a negative id");
    max_id = std::max(max_id, id);
  }
  // Checked before the id -> token table is sized by it.
  if (static_cast<std::size_t>(max_id) + 1 != vocab_.size()) {
    throw std::invalid_argument(where + ".vocab: the ids are not contiguous (" + std::to_string(vocab_.size()) +
                                " tokens, the largest id " + std::to_string(max_id) +
                                "); bridge sizes embeddings and token files by the vocabulary");
  }
  tokens_.assign(static_cast<std::size_t>(max_id + 1), std::string());
  has_token_.assign(tokens_.size(), false);
  for (const auto& [token, id] : vocab_) {
    tokens_[static_cast<std::size_t>(id)] = token;
    has_token_[static_cast<std::size_t>(id)] = true;
  }
  const std::size_t prefix_length = options_.continuing_subword_prefix ? options_.continuing_subword_prefix->size() : 0;
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& left = merges[rank].first;  // named, not bound: clang's C++17 lambdas cannot capture bindings
    const std::string& right = merges[rank].second;
    const auto left_id = token_to_id(left), right_id = token_to_id(right);
    const auto merge_name = [&] {
      return where + ".merges[" + std::to_string(rank) + "] (\"" + left + "\", \"" + right + "\")";
    };
    if (!left_id || !right_id) {
      throw std::invalid_argument(merge_name() + ": \"" + (left_id ? right : left) +
                                  "\" is not in the vocabulary; the vocab and merges do not belong together");
    }
    std::string merged = left;
    if (prefix_length > 0 && right.compare(0, prefix_length, *options_.continuing_subword_prefix) == 0) {
      merged += right.substr(prefix_length);
    } else {
      merged += right;
    }
    const auto merged_id = token_to_id(merged);
    if (!merged_id) {
      throw std::invalid_argument(merge_name() + ": the merged token \"" + merged + "\" is not in the vocabulary");
    }
    // A repeated pair keeps its last rank, as the library's map built from the list does.
    merges_.insert_or_assign(pair_key(*left_id, *right_id), std::make_pair(static_cast<int32_t>(rank), *merged_id));
  }
  byte_tokens_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    if (const auto id = token_to_id(name)) byte_tokens_[static_cast<std::size_t>(b)] = *id;
  }
  // An unk_token outside the vocabulary is an error only when a character needs it, as in the library.
  if (options_.unk_token) unk_id_ = token_to_id(*options_.unk_token);
  where_ = where;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto found = vocab_.find(std::string(token));
  if (found == vocab_.end()) return std::nullopt;
  return found->second;
}

const std::string* BpeModel::id_to_token(int64_t id) const {
  if (id < 0 || id >= size() || !has_token_[static_cast<std::size_t>(id)]) return nullptr;
  return &tokens_[static_cast<std::size_t>(id)];
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& ids) const {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  const auto add = [&](int32_t id, std::size_t length) {
    const auto index = static_cast<int64_t>(symbols.size());
    if (!symbols.empty()) symbols.back().next = index;
    symbols.push_back({id, index - 1, -1, length});
  };
  int32_t unk = -1;            // a pending unknown token ...
  std::size_t unk_length = 0;  // ... and the bytes it covers
  std::string piece;
  for (std::size_t i = 0; i < word.size();) {
    const std::size_t start = i;
    char32_t c = 0;
    if (!utf8::next(word, i, c)) i = start + 1;  // cannot happen after validation; never loop forever
    const bool first = start == 0, last = i == word.size();
    const std::size_t length = i - start;
    piece.assign(word.substr(start, length));
    if (!first && options_.continuing_subword_prefix) piece.insert(0, *options_.continuing_subword_prefix);
    if (last && options_.end_of_word_suffix) piece += *options_.end_of_word_suffix;
    if (const auto id = token_to_id(piece)) {
      if (unk >= 0) {
        add(unk, unk_length);
        unk = -1;
      }
      add(*id, length);
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (const char b : piece) all = all && byte_tokens_[static_cast<unsigned char>(b)] >= 0;
      if (all) {
        for (const char b : piece) add(byte_tokens_[static_cast<unsigned char>(b)], 1);
        continue;
      }
    }
    if (options_.unk_token && !unk_id_) {
      throw std::invalid_argument(where_ + ".unk_token: \"" + *options_.unk_token +
                                  "\" is not in the vocabulary, and the text has a character the vocabulary lacks");
    }
    if (unk_id_) {
      if (unk >= 0 && options_.fuse_unk) {
        unk_length += length;
      } else {
        if (unk >= 0) add(unk, unk_length);
        unk = *unk_id_;
        unk_length = length;
      }
    }
    // Without unk_token the character is dropped, as the library drops it.
  }
  if (unk >= 0) add(unk, unk_length);

  std::priority_queue<Merge> queue;
  const auto lookup = [&](int32_t left, int32_t right) -> const std::pair<int32_t, int32_t>* {
    const auto found = merges_.find(pair_key(left, right));
    return found == merges_.end() ? nullptr : &found->second;
  };
  for (std::size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const auto* merge = lookup(symbols[i].id, symbols[i + 1].id)) queue.push({i, merge->first, merge->second});
  }
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& current = symbols[top.pos];
    if (current.length == 0 || current.next < 0) continue;
    const auto next_pos = static_cast<std::size_t>(current.next);
    const Symbol right = symbols[next_pos];
    // An entry made stale by an earlier merge no longer names this pair.
    const auto* still = lookup(current.id, right.id);
    if (still == nullptr || still->second != top.new_id) continue;
    current.id = top.new_id;
    current.length += right.length;
    current.next = right.next;
    symbols[next_pos].length = 0;
    if (right.next >= 0 && static_cast<std::size_t>(right.next) < symbols.size()) {
      symbols[static_cast<std::size_t>(right.next)].prev = static_cast<int64_t>(top.pos);
    }
    if (current.prev >= 0) {
      const auto prev = static_cast<std::size_t>(current.prev);
      if (const auto* merge = lookup(symbols[prev].id, current.id)) queue.push({prev, merge->first, merge->second});
    }
    if (current.next >= 0 && static_cast<std::size_t>(current.next) < symbols.size()) {
      const Symbol& after = symbols[static_cast<std::size_t>(current.next)];
      if (const auto* merge = lookup(current.id, after.id)) queue.push({top.pos, merge->first, merge->second});
    }
  }
  for (const Symbol& symbol : symbols) {
    if (symbol.length != 0) ids.push_back(symbol.id);
  }
}

void BpeModel::tokenize(std::string_view word, std::vector<int64_t>& ids) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (const auto id = token_to_id(word)) {
      ids.push_back(*id);
      return;
    }
  }
  cache_.append(word, ids, [this](std::string_view w, std::vector<int32_t>& word_ids) { merge_word(w, word_ids); });
}

}  // namespace bridge::training::tokenizers
