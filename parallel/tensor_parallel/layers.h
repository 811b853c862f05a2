// Tensor-parallel layers (Megatron's layers.py) as PyTorch C++ frontend modules: ColumnParallelLinear (weight split
// by output rows), RowParallelLinear (weight split by input columns) and VocabParallelEmbedding (table split by
// vocabulary rows). Every rank builds the full master weight with the same init_method and keeps its own slice
// (Megatron's _initialize_affine_weight_cpu), so tp = 1, 2, 4 ... all start from the same model.
//
// init_method is required: a silent default would let two layers (or two layouts) draw identical or unrelated
// weights without anyone noticing. Pass e.g. init_method_normal(0.02, seed) with a per-layer seed.
//
//   ColumnParallelLinearOptions fc1(h, 4 * h);
//   fc1.init_method = init_method_normal(0.02, 1234);
//   ColumnParallelLinear layer(fc1);
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>

namespace bridge::parallel::tensor_parallel {

/// Fills the full (unsharded) master weight in place.
using InitMethod = std::function<void(torch::Tensor& master_weight)>;

/// N(0, std^2) from a private CPU generator seeded with `seed`: independent of the global RNG, and the same draw
/// on every rank and in every layout.
InitMethod init_method_normal(double std, uint64_t seed);
InitMethod init_method_zeros();

struct ColumnParallelLinearOptions {
  ColumnParallelLinearOptions(int64_t input, int64_t output) : input_size(input), output_size(output) {}
  int64_t input_size;
  int64_t output_size;
  bool bias = true;
  bool gather_output = false;
  /// >1 for fused weights such as [Q; K; V]: each of the `stride` blocks is split across ranks separately.
  int64_t stride = 1;
  /// Leaves the bias out of forward; the caller adds the public `bias` (e.g. fused into a later op).
  bool skip_bias_add = false;
  /// Megatron's gradient_accumulation_fusion: the weight's gradient GEMM adds into its main_grad
  /// (grad_accumulation_fusion.h).
  bool gradient_accumulation_fusion = false;
  /// Megatron's sequence_parallel: the input is this rank's part of the sequence ([s / tp, b, in]) and is all-gathered
  /// before the GEMM (its gradient reduce-scattered), in place of copy_to_tensor_model_parallel_region.
  bool sequence_parallel = false;
  InitMethod init_method;
  torch::Dtype params_dtype = torch::kFloat32;
};

/// y = x A^T + b with A split by rows: weight [output_size / tp, input_size], bias [output_size / tp].
class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  explicit ColumnParallelLinearImpl(ColumnParallelLinearOptions options);
  torch::Tensor forward(const torch::Tensor& input);

  ColumnParallelLinearOptions options;
  torch::Tensor weight, bias;
};
TORCH_MODULE(ColumnParallelLinear);

struct RowParallelLinearOptions {
  RowParallelLinearOptions(int64_t input, int64_t output) : input_size(input), output_size(output) {}
  int64_t input_size;
  int64_t output_size;
  bool bias = true;
  /// The input is already split along its last dim (the output of a ColumnParallelLinear); else it is scattered.
  bool input_is_parallel = true;
  bool skip_bias_add = false;
  /// As ColumnParallelLinearOptions::gradient_accumulation_fusion.
  bool gradient_accumulation_fusion = false;
  /// The partial outputs are reduce-scattered along the sequence (dim 0) instead of all-reduced: each rank keeps
  /// [s / tp, b, out]. The bias, added after, then gets a partial gradient (attribute sequence_parallel).
  bool sequence_parallel = false;
  InitMethod init_method;
  torch::Dtype params_dtype = torch::kFloat32;
};

/// y = x A^T + b with A split by columns: weight [output_size, input_size / tp]; the bias [output_size] is not
/// split and is added once, after the all-reduce (or reduce-scatter).
class RowParallelLinearImpl : public torch::nn::Module {
 public:
  explicit RowParallelLinearImpl(RowParallelLinearOptions options);
  torch::Tensor forward(const torch::Tensor& input);

  RowParallelLinearOptions options;
  torch::Tensor weight, bias;
};
TORCH_MODULE(RowParallelLinear);

struct VocabParallelEmbeddingOptions {
  VocabParallelEmbeddingOptions(int64_t vocab, int64_t dim) : num_embeddings(vocab), embedding_dim(dim) {}
  int64_t num_embeddings;  ///< the padded vocabulary size, divisible by tp
  int64_t embedding_dim;
  /// As ColumnParallelLinearOptions::gradient_accumulation_fusion: the looked-up rows' gradients are added into the
  /// weight's main_grad.
  bool gradient_accumulation_fusion = false;
  /// Megatron's reduce_scatter_embeddings (sequence parallelism without learned positions): the output is
  /// [s / tp, b, dim], sequence-first and reduce-scattered, in place of the all-reduced [b, s, dim].
  bool reduce_scatter_embeddings = false;
  InitMethod init_method;
  torch::Dtype params_dtype = torch::kFloat32;
};

/// An embedding table split by vocabulary rows: weight [num_embeddings / tp, embedding_dim]; ids of any shape.
class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  explicit VocabParallelEmbeddingImpl(VocabParallelEmbeddingOptions options);
  torch::Tensor forward(const torch::Tensor& input_ids);

  VocabParallelEmbeddingOptions options;
  torch::Tensor weight;
  int64_t vocab_start_index = 0, vocab_end_index = 0;  ///< this rank's ids, [start, end)
};
TORCH_MODULE(VocabParallelEmbedding);

}  // namespace bridge::parallel::tensor_parallel
