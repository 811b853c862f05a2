// The cache of each word's token ids that a tokenizer keeps in front of its model (a BPE's merges, a SentencePiece
// encode): each thread's own cache of the words it sees most, in front of one shared cache with sharded locks that
// every thread fills. Text repeats its words, so after a short start nearly every word is a hit that takes no lock:
// every thread looking words up in the shared shards made two workers 1.5x one, not 2x (the hot shards' cache lines
// moving between the cores). Each cache is a flat table over two arrays (the words' bytes, their ids), so a hit reads
// three places in memory; std::unordered_maps of strings and vectors, scattered over the heap, cost a quarter of a
// SentencePiece run's time in their lookups.
//
//   WordCache cache;
//   cache.append(word, ids, [&](std::string_view w, std::vector<int32_t>& out) { merge(w, out); });
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace bridge::training::tokenizers {

class WordCache {
 public:
  WordCache();
  ~WordCache();

  /// Appends the ids of `word` to `ids`: the cached ones, or those `compute(word, word_ids)` writes into an empty
  /// std::vector<int32_t>, which are then cached. Words of kMaxWordBytes or more are computed every time.
  template <class Compute>
  void append(std::string_view word, std::vector<int64_t>& ids, const Compute& compute) const {
    if (find(word, ids)) return;
    std::vector<int32_t> word_ids;
    compute(word, word_ids);
    ids.insert(ids.end(), word_ids.begin(), word_ids.end());
    insert(word, word_ids);
  }
  /// Appends the cached ids of `word` to `ids` and returns true, or returns false.
  bool find(std::string_view word, std::vector<int64_t>& ids) const;
  /// Caches `word_ids` as the ids of `word` (nothing for an empty word or one of kMaxWordBytes or more).
  void insert(std::string_view word, const std::vector<int32_t>& word_ids) const;

  static constexpr std::size_t kMaxWordBytes = 256;
  /// Words each thread keeps; past them a thread's misses are served by the shared shards.
  static constexpr std::size_t kThreadWords = 131072;

 private:
  static constexpr std::size_t kShards = 64;
  static constexpr std::size_t kWordsPerShard = 4096;
  class WordTable;
  struct Shard;

  // This thread's words of this cache (one thread cache serves one WordCache at a time: it is emptied when the thread
  // turns to another, told apart by an instance number that is never reused, unlike an address).
  WordTable& thread_words() const;
  Shard& shard_of(uint64_t hash) const;

  std::unique_ptr<Shard[]> shards_;
  uint64_t instance_;
};

}  // namespace bridge::training::tokenizers
