// compute_rank_layout: validation of initialize_model_parallel's arguments and the groups of one rank, from
// Megatron-Core's dense and expert rank generators.
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

int expert_tensor_parallel_size(const ParallelOptions& options) {
  return options.expert_tensor_parallel_size == 0 ? options.tensor_model_parallel_size
                                                  : options.expert_tensor_parallel_size;
}

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
  const int etp = expert_tensor_parallel_size(options);
  require(world_size >= 1, "world size must be >= 1, got " + std::to_string(world_size));
  require(rank >= 0 && rank < world_size,
          "rank " + std::to_string(rank) + " is outside the world of " + std::to_string(world_size));
  require(tp >= 1, "tensor_model_parallel_size must be >= 1, got " + std::to_string(tp));
  require(pp >= 1, "pipeline_model_parallel_size must be >= 1, got " + std::to_string(pp));
  require(ep >= 1, "expert_model_parallel_size must be >= 1, got " + std::to_string(ep));
  require(options.expert_tensor_parallel_size >= 0,
          "expert_tensor_parallel_size must be >= 1 (or 0 for tensor_model_parallel_size), got " +
              std::to_string(options.expert_tensor_parallel_size));
  require(cp >= 1, "context_parallel_size must be >= 1, got " + std::to_string(cp));
  require(world_size % (tp * pp * cp) == 0,
          "world size " + std::to_string(world_size) + " is not divisible by tensor_model_parallel_size (" +
              std::to_string(tp) + ") x pipeline_model_parallel_size (" + std::to_string(pp) +
              ") x context_parallel_size (" + std::to_string(cp) + "); launch a multiple of " +
              std::to_string(tp * pp * cp) + " ranks or change the sizes");
  if (world_size % (etp * ep * pp) != 0) {
    // Expert tensor parallelism of 1 is the usual MoE setting and the likeliest fix, where it divides.
    const std::string etp_fix =
        etp > 1 && world_size % (ep * pp) == 0
            ? std::string("set expert_tensor_parallel_size 1") +
                  (options.expert_tensor_parallel_size == 0 ? " (it defaults to tensor_model_parallel_size)" : "") +
                  " or "
            : "";
    require(false, "world size " + std::to_string(world_size) + " is not divisible by expert_tensor_parallel_size (" +
                       std::to_string(etp) + ") x expert_model_parallel_size (" + std::to_string(ep) +
                       ") x pipeline_model_parallel_size (" + std::to_string(pp) + "); " + etp_fix +
                       "launch a multiple of " + std::to_string(etp * ep * pp) + " ranks or change the sizes");
  }
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
  layout.expert_data_parallel_size = world_size / (etp * ep * pp);
  const bool pp_last = options.order.size() >= 2 && options.order.compare(options.order.size() - 2, 2, "pp") == 0;
  require(pp_last || pp == 1 || layout.expert_data_parallel_size == layout.data_parallel_size,
          "with order '" + options.order + "' (not ending in pp) and pipeline_model_parallel_size " +
              std::to_string(pp) + ", the expert data-parallel size (" +
              std::to_string(layout.expert_data_parallel_size) + ") must equal the data-parallel size (" +
              std::to_string(layout.data_parallel_size) + "); use an order ending in pp such as tp-cp-ep-dp-pp");
  // Dense layers use a generator without the expert axis, as Megatron-Core does.
  const RankGenerator generator(tp, /*ep=*/1, layout.data_parallel_size, pp, cp, options.order);
  // Experts use one without the context axis (a generator may not have both ep and cp > 1): etp x ep x edp over the
  // same ranks as tp x cp x dp, so with cp > 1 the expert data-parallel (or ep) ranks include the cp ranks.
  const RankGenerator expert_generator(etp, ep, layout.expert_data_parallel_size, pp, /*cp=*/1, options.order);
  // A rank must be on the same pipeline stage, with the same neighbours, in its dense and its expert layers. Megatron
  // asserts it; here it is a std::invalid_argument (a std::logic_error) that names the fix.
  require(generator.get_ranks("pp") == expert_generator.get_ranks("pp"),
          "the pipeline groups of the dense layers and of the experts differ with order '" + options.order +
              "'; use an order ending in pp such as tp-cp-ep-dp-pp");
  layout.tensor_model_parallel = group_containing(generator.get_ranks("tp"), rank);
  layout.pipeline_model_parallel = group_containing(generator.get_ranks("pp"), rank);
  layout.data_parallel = group_containing(generator.get_ranks("dp"), rank);
  layout.context_parallel = group_containing(generator.get_ranks("cp"), rank);
  layout.data_parallel_with_cp = group_containing(generator.get_ranks("dp-cp"), rank);
  layout.model_parallel = group_containing(generator.get_ranks("tp-pp"), rank);
  layout.tensor_and_data_parallel = group_containing(generator.get_ranks("tp-dp"), rank);
  layout.tensor_and_context_parallel = group_containing(generator.get_ranks("tp-cp"), rank);
  layout.tensor_and_data_parallel_with_cp = group_containing(generator.get_ranks("tp-dp-cp"), rank);
  const std::vector<int> embedding = embedding_ranks(layout.pipeline_model_parallel);
  if (std::find(embedding.begin(), embedding.end(), rank) != embedding.end()) layout.embedding = embedding;
  const std::vector<int> position = position_embedding_ranks(layout.pipeline_model_parallel);
  if (std::find(position.begin(), position.end(), rank) != position.end()) layout.position_embedding = position;
  layout.expert_model_parallel = group_containing(expert_generator.get_ranks("ep"), rank);
  layout.expert_tensor_parallel = group_containing(expert_generator.get_ranks("tp"), rank);
  layout.expert_tensor_and_model_parallel = group_containing(expert_generator.get_ranks("tp-ep"), rank);
  layout.expert_tensor_model_pipeline_parallel = group_containing(expert_generator.get_ranks("tp-ep-pp"), rank);
  layout.expert_data_parallel = group_containing(expert_generator.get_ranks("dp"), rank);
  return layout;
}

}  // namespace bridge::parallel
