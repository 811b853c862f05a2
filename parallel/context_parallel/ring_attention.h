// The p2p (ring) context-parallel attention behind context_parallel_attention (attention.h): private to
// parallel/context_parallel/.
#pragma once

#include <torch/torch.h>

#include "parallel/process_group.h"

namespace bridge::parallel::context_parallel::detail {

/// Causal attention of this rank's zigzag share over the whole sequence, by a ring over `group` (size > 1).
/// q: [b, heads, 2c, d]; k, v: [b, groups, 2c, d], already checked by the caller; `scale` > 0. Differentiable in q, k
/// and v; the backward runs a second ring. `group` must outlive the backward pass.
torch::Tensor ring_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             ProcessGroup& group, double scale);

}  // namespace bridge::parallel::context_parallel::detail
