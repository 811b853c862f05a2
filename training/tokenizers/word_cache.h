// The cache of each word's token ids that a tokenizer keeps in front of its model (a BPE's merges, a SentencePiece
// encode): each thread's own cache of the words it sees most, in front of one shared cache with sharded locks that
// every thread fills. Text repeats its words, so after a short start nearly every word is a hit that takes no lock:
// every thread looking words up in the shared shards made two workers 1.5x one, not 2x (the hot shards' cache lines
// moving between the cores).
//
//   WordCache cache;
//   cache.append(word, ids, [&](std::string_view w, std::vector<int32_t>& out) { merge(w, out); });
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace bridge::training::tokenizers {

class WordCache {
 public:
  WordCache();

  /// Appends the ids of `word` to `ids`: the cached ones, or those `compute(word, word_ids)` writes into an empty
  /// std::vector<int32_t>, which are then cached. Words of kMaxWordBytes or more are computed every time.
  template <class Compute>
  void append(std::string_view word, std::vector<int64_t>& ids, const Compute& compute) const {
    if (find(word, ids)) return;
    std::vector<int32_t> word_ids;
    compute(word, word_ids);
    ids.insert(ids.end(), word_ids.begin(), word_ids.end());
    insert(word, std::move(word_ids));
  }
  /// Appends the cached ids of `word` to `ids` and returns true, or returns false.
  bool find(std::string_view word, std::vector<int64_t>& ids) const;
  /// Caches `word_ids` as the ids of `word` (nothing for a word of kMaxWordBytes or more).
  void insert(std::string_view word, std::vector<int32_t> word_ids) const;

  static constexpr std::size_t kMaxWordBytes = 256;

 private:
  static constexpr std::size_t kShards = 64;
  static constexpr std::size_t kEntriesPerShard = 4096;
  static constexpr std::size_t kThreadEntries = 16384;
  struct Shard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>> words;
  };

  // This thread's words of this cache (one thread cache serves one WordCache at a time: it is emptied when the thread
  // turns to another, told apart by an instance number that is never reused, unlike an address).
  std::unordered_map<std::string, std::vector<int32_t>>& thread_words() const;

  std::unique_ptr<Shard[]> shards_;
  uint64_t instance_;
};

}  // namespace bridge::training::tokenizers
