// Megatron-Core's fully parallel save: which rank writes each chunk (see fully_parallel_save.h).
#include "training/checkpointing/fully_parallel_save.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "parallel/distributed.h"
#include "parallel/parallel_state.h"

namespace bridge::training {
namespace {

std::string join_ints(const std::vector<int64_t>& values) {
  std::string text;
  for (std::size_t i = 0; i < values.size(); ++i) text += (i ? "," : "") + std::to_string(values[i]);
  return text;
}

}  // namespace

std::vector<bool> assign_writers(const std::vector<SaveItem>& items, bool spread) {
  parallel::ProcessGroup& world = parallel::get_world_group();
  std::ostringstream lines;
  for (const SaveItem& item : items) {
    lines << item.chunk.key << '\t' << join_ints(item.chunk.offsets) << '\t' << join_ints(item.chunk.sizes) << '\t'
          << item.data.numel() * static_cast<int64_t>(item.data.element_size()) << '\n';
  }
  const std::vector<std::string> gathered = parallel::all_gather_strings(world, lines.str());
  struct Holders {
    std::string sizes;
    int64_t bytes = 0;
    std::vector<int> ranks;
  };
  std::map<std::pair<std::string, std::string>, Holders> chunks;
  for (int rank = 0; rank < static_cast<int>(gathered.size()); ++rank) {
    std::istringstream in(gathered[static_cast<std::size_t>(rank)]);
    for (std::string line; std::getline(in, line);) {
      std::vector<std::string> fields;
      std::istringstream parts(line);
      for (std::string field; std::getline(parts, field, '\t');) fields.push_back(field);
      Holders& holders = chunks[{fields[0], fields[1]}];
      if (holders.ranks.empty()) {
        holders.sizes = fields[2];
        holders.bytes = std::stoll(fields[3]);
      } else if (holders.sizes != fields[2]) {
        throw std::logic_error("the checkpoint's chunk " + fields[0] + " at [" + fields[1] + "] has the sizes [" +
                               holders.sizes + "] on one rank and [" + fields[2] + "] on rank " + std::to_string(rank) +
                               "; report it with the parallelism.* settings");
      }
      if (holders.ranks.empty() || holders.ranks.back() != rank) holders.ranks.push_back(rank);
    }
  }
  std::vector<std::pair<const std::pair<std::string, std::string>*, const Holders*>> order;
  for (const auto& [id, holders] : chunks) order.emplace_back(&id, &holders);
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.second->bytes > b.second->bytes; });
  std::vector<int64_t> load(gathered.size(), 0);
  std::set<std::pair<std::string, std::string>> mine;
  for (const auto& [id, holders] : order) {
    int writer = holders->ranks.front();
    if (spread) {
      for (int rank : holders->ranks) {
        if (load[static_cast<std::size_t>(rank)] < load[static_cast<std::size_t>(writer)]) writer = rank;
      }
    }
    load[static_cast<std::size_t>(writer)] += holders->bytes;
    if (writer == world.rank()) mine.insert(*id);
  }
  std::vector<bool> writes(items.size(), false);
  std::set<std::pair<std::string, std::string>> taken;  // a chunk twice on one rank (a tied pair) is written once
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::pair<std::string, std::string> id{items[i].chunk.key, join_ints(items[i].chunk.offsets)};
    writes[i] = mine.count(id) > 0 && taken.insert(id).second;
  }
  return writes;
}

}  // namespace bridge::training
