// compute_rank_layout: validation of initialize_model_parallel's arguments and the groups of one rank.
#include "parallel/rank_layout.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "parallel/rank_generator.h"
#include "utils/strings.h"

namespace bridge::parallel {
namespace {

void require(bool condition, const std::string& message) {
  if (!condition) throw std::invalid_argument("initialize_model_parallel: " + message);
}

std::vector<int> group_containing(const RankGroups& groups, int rank) {
  for (const auto& group : groups) {
    if (std::find(group.begin(), group.end(), rank) != group.end()) return group;
  }
  return {};
}

}  // namespace

int RankLayout::rank_in(const std::vector<int>& group) const {
  const auto it = std::find(group.begin(), group.end(), rank);
  if (it == group.end()) {
    throw std::logic_error("rank " + std::to_string(rank) + " is not in group [" + utils::join(group, ", ") + "]");
  }
  return static_cast<int>(it - group.begin());
}

RankLayout compute_rank_layout(int world_size, int rank, const ParallelOptions& options) {
  const int tp = options.tensor_model_parallel_size;
  const int pp = options.pipeline_model_parallel_size;
  const int cp = options.context_parallel_size;
  const int ep = options.expert_model_parallel_size;
  require(world_size >= 1, "world size must be >= 1, got " + std::to_string(world_size));
  require(rank >= 0 && rank < world_size,
          "rank " + std::to_string(rank) + " is outside the world of " + std::to_string(world_size));
  require(tp >= 1, "tensor_model_parallel_size must be >= 1, got " + std::to_string(tp));
  require(pp >= 1, "pipeline_model_parallel_size must be >= 1, got " + std::to_string(pp));
  require(cp == 1, "context_parallel_size must be 1 for now, got " + std::to_string(cp));
  require(ep == 1, "expert_model_parallel_size must be 1 for now, got " + std::to_string(ep));
  require(world_size % (tp * pp * cp) == 0,
          "world size " + std::to_string(world_size) + " is not divisible by tensor_model_parallel_size (" +
              std::to_string(tp) + ") x pipeline_model_parallel_size (" + std::to_string(pp) +
              ") x context_parallel_size (" + std::to_string(cp) + "); launch a multiple of " +
              std::to_string(tp * pp * cp) + " ranks or change the sizes");
  if (options.virtual_pipeline_model_parallel_size) {
    require(*options.virtual_pipeline_model_parallel_size >= 1,
            "virtual_pipeline_model_parallel_size must be >= 1, got " +
                std::to_string(*options.virtual_pipeline_model_parallel_size));
    require(pp > 1,
            "virtual_pipeline_model_parallel_size needs pipeline_model_parallel_size > 1 (interleaved "
            "schedule), got pipeline_model_parallel_size " +
                std::to_string(pp));
  }

  RankLayout layout;
  layout.world_size = world_size;
  layout.rank = rank;
  layout.options = options;
  layout.data_parallel_size = world_size / (tp * pp * cp);
  // Dense layers use a generator without the expert axis, as Megatron-Core does.
  const RankGenerator generator(tp, /*ep=*/1, layout.data_parallel_size, pp, cp, options.order);
  layout.tensor_model_parallel = group_containing(generator.get_ranks("tp"), rank);
  layout.pipeline_model_parallel = group_containing(generator.get_ranks("pp"), rank);
  layout.data_parallel = group_containing(generator.get_ranks("dp"), rank);
  layout.context_parallel = group_containing(generator.get_ranks("cp"), rank);
  layout.data_parallel_with_cp = group_containing(generator.get_ranks("dp-cp"), rank);
  layout.model_parallel = group_containing(generator.get_ranks("tp-pp"), rank);
  layout.tensor_and_data_parallel = group_containing(generator.get_ranks("tp-dp"), rank);
  const std::vector<int> embedding = embedding_ranks(layout.pipeline_model_parallel);
  if (std::find(embedding.begin(), embedding.end(), rank) != embedding.end()) layout.embedding = embedding;
  const std::vector<int> position = position_embedding_ranks(layout.pipeline_model_parallel);
  if (std::find(position.begin(), position.end(), rank) != position.end()) layout.position_embedding = position;
  return layout;
}

}  // namespace bridge::parallel
