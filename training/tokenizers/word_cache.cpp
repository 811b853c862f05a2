// WordCache: the thread's own words and the shared shards behind them, each a WordTable.
#include "training/tokenizers/word_cache.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <utility>

namespace bridge::training::tokenizers {
namespace {

uint64_t next_instance() {
  static std::atomic<uint64_t> count{0};
  return ++count;
}

uint64_t hash_of(std::string_view word) { return std::hash<std::string_view>()(word); }

}  // namespace

// Words and their ids in one flat table: linear probing over a power-of-two array of 16-byte slots, at most half
// full, never erased from (cleared whole); a slot holds the hash's high half and where the word's bytes and ids lie
// in two arrays. It starts small and doubles as it fills, up to a number of words. Not thread-safe.
class WordCache::WordTable {
 public:
  WordTable(std::size_t initial_slots, std::size_t max_words)
      : initial_slots_(initial_slots), max_words_(max_words), slots_(initial_slots) {}

  // Empties the table and gives back what it grew to.
  void clear() {
    if (size_ == 0) return;
    std::vector<Slot>(initial_slots_).swap(slots_);
    std::string().swap(bytes_);
    std::vector<int32_t>().swap(ids_);
    size_ = 0;
  }

  // Where the ids of `word` lie (valid until the next insert or clear), or nothing when it is not in the table. A
  // word may have no ids (spaces alone, to SentencePiece).
  std::optional<std::pair<const int32_t*, std::size_t>> find(std::string_view word, uint64_t hash) const {
    for (std::size_t at = hash & mask();; at = (at + 1) & mask()) {
      const Slot& slot = slots_[at];
      if (slot.word_size == 0) return std::nullopt;
      if (matches(slot, word, hash)) return std::make_pair(ids_.data() + slot.ids, std::size_t{slot.ids_size});
    }
  }

  // Adds `word` (not empty, under kMaxWordBytes) unless the table has it or is full.
  void insert(std::string_view word, uint64_t hash, const int32_t* word_ids, std::size_t count) {
    if (size_ >= max_words_ || count > UINT16_MAX) return;
    std::size_t at = hash & mask();
    for (; slots_[at].word_size != 0; at = (at + 1) & mask()) {
      if (matches(slots_[at], word, hash)) return;
    }
    const Slot slot{static_cast<uint32_t>(hash >> 32), static_cast<uint32_t>(bytes_.size()),
                    static_cast<uint32_t>(ids_.size()), static_cast<uint16_t>(word.size()),
                    static_cast<uint16_t>(count)};
    bytes_.append(word);  // the arrays first: should they throw, no slot points past their end
    ids_.insert(ids_.end(), word_ids, word_ids + count);
    slots_[at] = slot;
    if (2 * ++size_ >= slots_.size()) grow();
  }

 private:
  struct Slot {
    uint32_t tag = 0, word = 0, ids = 0;
    uint16_t word_size = 0, ids_size = 0;  // word_size 0: empty
  };
  std::size_t mask() const { return slots_.size() - 1; }
  bool matches(const Slot& slot, std::string_view word, uint64_t hash) const {
    return slot.tag == static_cast<uint32_t>(hash >> 32) && slot.word_size == word.size() &&
           std::memcmp(bytes_.data() + slot.word, word.data(), word.size()) == 0;
  }
  // Doubles the slots (the words' hashes again from their bytes), unless they already fit max_words_.
  void grow() {
    if (slots_.size() >= 2 * max_words_) return;
    std::vector<Slot> old(2 * slots_.size());
    old.swap(slots_);
    for (const Slot& slot : old) {
      if (slot.word_size == 0) continue;
      std::size_t at = hash_of(std::string_view(bytes_.data() + slot.word, slot.word_size)) & mask();
      while (slots_[at].word_size != 0) at = (at + 1) & mask();
      slots_[at] = slot;
    }
  }

  std::size_t initial_slots_, max_words_;
  std::vector<Slot> slots_;
  std::string bytes_;
  std::vector<int32_t> ids_;
  std::size_t size_ = 0;
};

// On a cache line of its own: neighbouring shards' locks would otherwise move one line between the cores.
struct alignas(64) WordCache::Shard {
  // A shard's table indexes its slots with the hash's low bits, below those that choose the shard (shard_of); a
  // thread table's arrays stay under 4 GiB (32-bit offsets; a word of under 256 bytes has fewer than 256 ids).
  static_assert(2 * kWordsPerShard <= (std::size_t{1} << 24));
  static_assert(kThreadWords * kMaxWordBytes < (std::size_t{1} << 30));

  std::mutex mutex;
  WordTable words{64, kWordsPerShard};
};

WordCache::WordCache() : shards_(new Shard[kShards]), instance_(next_instance()) {}

WordCache::~WordCache() = default;

WordCache::WordTable& WordCache::thread_words() const {
  struct ThreadWords {
    uint64_t instance = 0;
    WordTable words{1024, kThreadWords};
  };
  thread_local ThreadWords local;
  if (local.instance != instance_) {
    local.instance = instance_;
    local.words.clear();
  }
  return local.words;
}

// The shard of a hash: bits that neither the tables' slot index (the low ones) nor their tag (the high half) use.
WordCache::Shard& WordCache::shard_of(uint64_t hash) const { return shards_[(hash >> 24) % kShards]; }

bool WordCache::find(std::string_view word, std::vector<int64_t>& ids) const {
  if (word.empty() || word.size() >= kMaxWordBytes) return false;
  WordTable& local = thread_words();
  const uint64_t hash = hash_of(word);
  if (const auto found = local.find(word, hash)) {
    ids.insert(ids.end(), found->first, found->first + found->second);
    return true;
  }
  thread_local std::vector<int32_t> shared;  // the shard's ids, copied out under its lock
  {
    Shard& shard = shard_of(hash);
    std::lock_guard<std::mutex> lock(shard.mutex);
    const auto found = shard.words.find(word, hash);
    if (!found) return false;
    shared.assign(found->first, found->first + found->second);
  }
  ids.insert(ids.end(), shared.begin(), shared.end());
  local.insert(word, hash, shared.data(), shared.size());
  return true;
}

void WordCache::insert(std::string_view word, const std::vector<int32_t>& word_ids) const {
  if (word.empty() || word.size() >= kMaxWordBytes) return;
  const uint64_t hash = hash_of(word);
  thread_words().insert(word, hash, word_ids.data(), word_ids.size());
  Shard& shard = shard_of(hash);
  std::lock_guard<std::mutex> lock(shard.mutex);
  shard.words.insert(word, hash, word_ids.data(), word_ids.size());
}

}  // namespace bridge::training::tokenizers
