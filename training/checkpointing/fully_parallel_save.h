// Megatron-Core's fully parallel save (FullyParallelSaveStrategyWrapper) for torch_dist checkpoints: a chunk that
// several ranks hold (data-parallel replicas, a layer norm on every tensor-parallel rank) is written by one of them,
// chosen so that the bytes are spread over every rank.
#pragma once

#include <vector>

#include "training/checkpointing/sharded_state_dict.h"

namespace bridge::training {

/// Which of `items` this rank writes. Collective over the world: every distinct chunk (key and offsets) goes to the
/// holder with the fewest bytes assigned so far, largest chunks first (exchange_utils.distribute_shards_to_ranks);
/// without `spread` to the lowest holder. Throws std::logic_error when two holders disagree on a chunk's sizes.
std::vector<bool> assign_writers(const std::vector<SaveItem>& items, bool spread);

}  // namespace bridge::training
