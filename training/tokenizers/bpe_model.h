// The BPE model of Hugging Face tokenizer.json files (tokenizers' models::bpe::BPE): a vocabulary, ranked merges,
// and the options byte_fallback (<0xXX> tokens for characters outside the vocabulary), unk_token with fuse_unk,
// ignore_merges (a whole word in the vocabulary is one token), continuing_subword_prefix and end_of_word_suffix.
// Merges apply lowest rank first, leftmost first among equals, exactly as the library's priority queue does; each
// word's ids are cached (WordCache).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "training/tokenizers/word_cache.h"

namespace bridge::training::tokenizers {

struct BpeOptions {
  std::optional<std::string> unk_token;
  std::optional<std::string> continuing_subword_prefix;
  std::optional<std::string> end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
};

class BpeModel {
 public:
  /// `merges` in rank order, each a pair of vocabulary tokens whose concatenation is in the vocabulary too. Throws
  /// std::invalid_argument naming `where` (the JSON path) for a merge outside the vocabulary or ids with gaps.
  BpeModel(std::unordered_map<std::string, int32_t> vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options,
           const std::string& where);

  /// Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<int64_t>& ids) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  /// The token of `id`, or nullptr for an id the vocabulary lacks.
  const std::string* id_to_token(int64_t id) const;
  /// One more than the largest id.
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  /// The number of vocabulary entries (the library's get_vocab_size).
  int64_t entries() const { return static_cast<int64_t>(vocab_.size()); }

 private:
  void merge_word(std::string_view word, std::vector<int32_t>& ids) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> tokens_;  // id -> token ("" where no token has the id)
  std::vector<bool> has_token_;
  // (left id, right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  std::array<int32_t, 256> byte_tokens_{};  // <0xXX> ids, -1 where missing (byte_fallback)
  BpeOptions options_;
  std::optional<int32_t> unk_id_;
  std::string where_;  // the JSON path, for errors while encoding

  WordCache cache_;  // each word's ids
};

}  // namespace bridge::training::tokenizers
