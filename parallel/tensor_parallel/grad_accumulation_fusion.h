// Megatron's gradient accumulation fusion for the layers' weights: the op that makes a weight's gradient adds it
// straight into the weight's main_grad (its view into DistributedDataParallel's grad buffer) instead of producing a
// fresh gradient that autograd then adds into the buffer. For a linear layer the weight-gradient GEMM accumulates
// (addmm with beta 1); for an embedding the looked-up rows' gradients are index-added into the buffer, where autograd
// would build a dense vocabulary-sized gradient for a few hundred rows. Per weight and backward that saves a
// gradient-sized temporary and a pass that reads it and the buffer and writes the buffer: for GPT-2 124M on CPU, the
// whole model's gradient bytes moved three times per step, and the temporaries' memory.
//
// Fusion applies where the weight is wrapped by a live DistributedDataParallel whose buffer has the weight's dtype
// and is still the weight's .grad (not replaced by zero_grad(set_to_none) or an assignment); everywhere else, and with
// gradient_accumulation_fusion off, the weight gets its gradient the ordinary way. A fused weight receives no
// gradient through autograd, so torch::autograd::grad() on it sees none: turn fusion off for such uses.
//
// With sequence_parallel the input is this rank's part of the sequence, [s / tp, ...]: forward all-gathers it along
// dim 0 before the GEMM and keeps only the local part for backward, which gathers it again for the weight's gradient
// and reduce-scatters the input's gradient (Megatron's LinearWithGradAccumulationAndAsyncCommunication). Keeping the
// gathered input instead would undo most of what sequence parallelism saves.
//
//   torch::Tensor y = linear_with_grad_accumulation(x, weight, bias, /*gradient_accumulation_fusion=*/true);
//   torch::Tensor e = embedding_with_grad_accumulation(table, token_ids, /*gradient_accumulation_fusion=*/true);
#pragma once

#include <torch/torch.h>

namespace bridge::parallel::tensor_parallel {

/// y = x weight^T + bias (bias may be undefined), x [..., in], weight [out, in]; with sequence_parallel, y =
/// all-gather(x) weight^T + bias.
torch::Tensor linear_with_grad_accumulation(const torch::Tensor& input, const torch::Tensor& weight,
                                            const torch::Tensor& bias, bool gradient_accumulation_fusion,
                                            bool sequence_parallel = false);

/// The rows of weight [num_embeddings, dim] at `indices` (int64 or int32, any shape): [..., dim], as at::embedding.
torch::Tensor embedding_with_grad_accumulation(const torch::Tensor& weight, const torch::Tensor& indices,
                                               bool gradient_accumulation_fusion);

}  // namespace bridge::parallel::tensor_parallel
