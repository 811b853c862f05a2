// WordCache: the thread's own words and the shared shards behind them.
#include "training/tokenizers/word_cache.h"

#include <atomic>
#include <functional>

namespace bridge::training::tokenizers {
namespace {

uint64_t next_instance() {
  static std::atomic<uint64_t> count{0};
  return ++count;
}

}  // namespace

WordCache::WordCache() : shards_(new Shard[kShards]), instance_(next_instance()) {}

std::unordered_map<std::string, std::vector<int32_t>>& WordCache::thread_words() const {
  struct ThreadWords {
    uint64_t instance = 0;
    std::unordered_map<std::string, std::vector<int32_t>> words;
  };
  thread_local ThreadWords local;
  if (local.instance != instance_) {
    local.instance = instance_;
    local.words.clear();
  }
  return local.words;
}

bool WordCache::find(std::string_view word, std::vector<int64_t>& ids) const {
  if (word.size() >= kMaxWordBytes) return false;
  std::unordered_map<std::string, std::vector<int32_t>>& local = thread_words();
  std::string key(word);
  if (const auto hit = local.find(key); hit != local.end()) {
    ids.insert(ids.end(), hit->second.begin(), hit->second.end());
    return true;
  }
  std::vector<int32_t> word_ids;
  {
    Shard& shard = shards_[std::hash<std::string_view>()(word) % kShards];
    std::lock_guard<std::mutex> lock(shard.mutex);
    const auto hit = shard.words.find(key);
    if (hit == shard.words.end()) return false;
    word_ids = hit->second;
  }
  ids.insert(ids.end(), word_ids.begin(), word_ids.end());
  if (local.size() < kThreadEntries) local.emplace(std::move(key), std::move(word_ids));
  return true;
}

void WordCache::insert(std::string_view word, std::vector<int32_t> word_ids) const {
  if (word.size() >= kMaxWordBytes) return;
  std::string key(word);
  {
    Shard& shard = shards_[std::hash<std::string_view>()(word) % kShards];
    std::lock_guard<std::mutex> lock(shard.mutex);
    if (shard.words.size() < kEntriesPerShard) shard.words.emplace(key, word_ids);
  }
  std::unordered_map<std::string, std::vector<int32_t>>& local = thread_words();
  if (local.size() < kThreadEntries) local.emplace(std::move(key), std::move(word_ids));
}

}  // namespace bridge::training::tokenizers
