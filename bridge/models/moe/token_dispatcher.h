// Token dispatchers (Megatron-Core's token_dispatcher.py): move each token to the ranks holding its experts, grouped
// by local expert, and bring the experts' outputs back weighted by the routing probabilities. One interface, one
// implementation per moe_token_dispatcher_type:
//
//   allgather  every rank of the tensor x expert-parallel group gathers all the group's tokens (dim 0), keeps those
//              routed to its local experts, and after the experts scatter-adds them back and reduce-scatters (the
//              sum over the experts of every rank, and over expert tensor-parallel partial sums).
//   alltoall   each token goes only to the expert-parallel ranks of its experts: counts exchanged first, then an
//              all-to-all with uneven splits there and back (expert tensor-parallel size 1).
//
// dispatch() keeps what combine() needs, so the two are called in pairs, as Megatron's token_dispatch/token_combine.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "bridge/models/gpt_config.h"
#include "bridge/models/moe/moe_utils.h"

namespace bridge::models::moe {

/// The tokens the local experts process: grouped by local expert, with each expert's count.
struct DispatchedTokens {
  torch::Tensor tokens;             ///< [N, h]
  torch::Tensor tokens_per_expert;  ///< [num_local_experts] int64, CPU
};

class MoETokenDispatcher {
 public:
  virtual ~MoETokenDispatcher() = default;
  /// `hidden`: [T, h] this rank's tokens; `routing`: their probabilities and map over all E experts.
  virtual DispatchedTokens dispatch(const torch::Tensor& hidden, const Routing& routing) = 0;
  /// `expert_output`: [N, h], the rows of the last dispatch() in its order. Returns [T, h]: for each token the sum
  /// over its experts of probability x output.
  virtual torch::Tensor combine(const torch::Tensor& expert_output) = 0;
};

/// The dispatcher of config.moe_token_dispatcher_type over parallel_state's expert groups.
std::unique_ptr<MoETokenDispatcher> make_token_dispatcher(const GPTConfig& config);

}  // namespace bridge::models::moe
