// Cross entropy over logits whose vocabulary is split across the tensor-parallel group (the output of a
// ColumnParallelLinear without gather), without ever gathering the full logits (Megatron's cross_entropy.py).
#pragma once

#include <torch/torch.h>

namespace bridge::parallel::tensor_parallel {

/// Per-token loss (fp32, shape of `target`) for logits [..., V / tp] and int64 targets [...] holding global ids.
/// Forward makes exactly 3 all-reduces on the tensor-parallel group (max, target logit, sum of exp; none at tp 1);
/// backward none (the input gradient's all-reduce belongs to the ColumnParallelLinear before it). Computes in fp32;
/// the logits are not modified, unless `inplace`.
///
/// `inplace` (fp32 or fp64 logits that are not a leaf): as Megatron's, the logits' storage becomes the softmax,
/// which backward turns into the gradient in place, so the loss holds one logits-sized tensor instead of three
/// (at GPT-2's vocabulary, 4 x 1024 tokens: 0.8 GB rather than 2.4). The caller must not read the logits after, and
/// the graph can be backpropagated once. Half-precision logits are upcast into a new tensor either way.
///
/// label_smoothing follows Megatron: the target keeps 1 - label_smoothing and the rest is spread over the other
/// V - 1 classes, which equals torch's cross_entropy with label_smoothing * V / (V - 1). Unlike Megatron, the
/// smoothing term is averaged over the whole vocabulary, not only this rank's shard (folded into the third
/// all-reduce), so every tp gives the same loss.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& vocab_parallel_logits, const torch::Tensor& target,
                                           double label_smoothing = 0.0, bool inplace = false);

}  // namespace bridge::parallel::tensor_parallel
