// Tensor-parallel layers: master-weight initialisation and slicing, shape checks, and the forward passes built from
// the region operators in mappings.h.
#include "parallel/tensor_parallel/layers.h"

#include <ATen/CPUGeneratorImpl.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/grad_accumulation_fusion.h"
#include "parallel/tensor_parallel/mappings.h"
#include "parallel/tensor_parallel/param_attributes.h"
#include "parallel/tensor_parallel/vocab_utils.h"
#include "utils/check.h"

namespace bridge::parallel::tensor_parallel {
namespace {

using utils::require;

void check_init_method(const InitMethod& init_method, const char* layer) {
  require(static_cast<bool>(init_method),
          std::string(layer) +
              ": options.init_method is not set; pass e.g. init_method_normal(0.02, seed) so that "
              "every rank and every parallel layout builds the same master weight");
}

// Megatron's _initialize_affine_weight_cpu: the full master weight in fp32 from init_method, cast to the parameter
// dtype, split along partition_dim into tp * stride chunks, of which this rank keeps r, r + tp, r + 2 tp, ...
torch::Tensor initialize_affine_weight(int64_t rows, int64_t columns, int64_t partition_dim, int64_t stride,
                                       const InitMethod& init_method, torch::Dtype dtype) {
  torch::NoGradGuard no_grad;
  torch::Tensor master = torch::empty({rows, columns}, torch::kFloat32);
  init_method(master);
  master = master.to(dtype);
  const int tp = get_tensor_model_parallel_world_size();
  const int rank = get_tensor_model_parallel_rank();
  const int64_t chunk = master.size(partition_dim) / (tp * stride);
  const std::vector<torch::Tensor> chunks = master.split(chunk, partition_dim);
  std::vector<torch::Tensor> mine;
  for (std::size_t i = static_cast<std::size_t>(rank); i < chunks.size(); i += static_cast<std::size_t>(tp)) {
    mine.push_back(chunks[i]);
  }
  return torch::cat(mine, partition_dim).contiguous();
}

}  // namespace

InitMethod init_method_normal(double std, uint64_t seed) {
  require(std >= 0.0, "init_method_normal: std must be >= 0, got " + std::to_string(std));
  return [std, seed](torch::Tensor& master_weight) {
    torch::NoGradGuard no_grad;
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
    master_weight.normal_(0.0, std, generator);
  };
}

InitMethod init_method_zeros() {
  return [](torch::Tensor& master_weight) {
    torch::NoGradGuard no_grad;
    master_weight.zero_();
  };
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(ColumnParallelLinearOptions opts) : options(std::move(opts)) {
  const int tp = get_tensor_model_parallel_world_size();
  require(options.input_size > 0 && options.output_size > 0,
          "ColumnParallelLinear: input_size (" + std::to_string(options.input_size) + ") and output_size (" +
              std::to_string(options.output_size) + ") must be positive");
  require(options.output_size % tp == 0, "ColumnParallelLinear: output_size " + std::to_string(options.output_size) +
                                             " is not divisible by the tensor-model-parallel size (tp) " +
                                             std::to_string(tp));
  require(options.stride >= 1 && (options.output_size / tp) % options.stride == 0,
          "ColumnParallelLinear: stride " + std::to_string(options.stride) +
              " must be >= 1 and divide output_size / tp = " + std::to_string(options.output_size / tp));
  check_init_method(options.init_method, "ColumnParallelLinear");

  weight =
      register_parameter("weight", initialize_affine_weight(options.output_size, options.input_size, 0, options.stride,
                                                            options.init_method, options.params_dtype));
  set_param_attributes(weight, {/*tensor_model_parallel=*/true, /*partition_dim=*/0, options.stride});
  if (options.bias) {
    bias = register_parameter("bias", torch::zeros({options.output_size / tp}, options.params_dtype));
    set_param_attributes(bias, {/*tensor_model_parallel=*/true, /*partition_dim=*/0, options.stride});
  }
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& input) {
  // Under sequence parallelism the GEMM gathers the input itself and reduce-scatters its gradient.
  const torch::Tensor input_parallel = options.sequence_parallel ? input : copy_to_tensor_model_parallel_region(input);
  const torch::Tensor output_parallel =
      linear_with_grad_accumulation(input_parallel, weight, options.skip_bias_add ? torch::Tensor() : bias,
                                    options.gradient_accumulation_fusion, options.sequence_parallel);
  return options.gather_output ? gather_from_tensor_model_parallel_region(output_parallel) : output_parallel;
}

RowParallelLinearImpl::RowParallelLinearImpl(RowParallelLinearOptions opts) : options(std::move(opts)) {
  const int tp = get_tensor_model_parallel_world_size();
  require(options.input_size > 0 && options.output_size > 0,
          "RowParallelLinear: input_size (" + std::to_string(options.input_size) + ") and output_size (" +
              std::to_string(options.output_size) + ") must be positive");
  require(options.input_size % tp == 0, "RowParallelLinear: input_size " + std::to_string(options.input_size) +
                                            " is not divisible by the tensor-model-parallel size (tp) " +
                                            std::to_string(tp));
  check_init_method(options.init_method, "RowParallelLinear");

  weight = register_parameter("weight", initialize_affine_weight(options.output_size, options.input_size, 1, 1,
                                                                 options.init_method, options.params_dtype));
  set_param_attributes(weight, {/*tensor_model_parallel=*/true, /*partition_dim=*/1, /*partition_stride=*/1});
  if (options.bias) {
    bias = register_parameter("bias", torch::zeros({options.output_size}, options.params_dtype));
    // Replicated: its gradient is the same on every tensor-parallel rank, or, under sequence parallelism, a partial
    // sum over this rank's tokens that finalize_model_grads all-reduces over the group.
    ParamAttributes attributes;
    attributes.sequence_parallel = options.sequence_parallel;
    set_param_attributes(bias, attributes);
  }
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& input) {
  // Alone, there is no reduction to wait for: the bias joins the GEMM (addmm).
  const bool fusion = options.gradient_accumulation_fusion;
  if (!options.skip_bias_add && get_tensor_model_parallel_world_size() == 1) {
    return linear_with_grad_accumulation(input, weight, bias, fusion);
  }
  const torch::Tensor input_parallel =
      options.input_is_parallel ? input : scatter_to_tensor_model_parallel_region(input);
  const torch::Tensor partial = linear_with_grad_accumulation(input_parallel, weight, {}, fusion);
  const torch::Tensor output = options.sequence_parallel ? reduce_scatter_to_sequence_parallel_region(partial)
                                                         : reduce_from_tensor_model_parallel_region(partial);
  return options.skip_bias_add || !bias.defined() ? output : output + bias;
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(VocabParallelEmbeddingOptions opts) : options(std::move(opts)) {
  const int tp = get_tensor_model_parallel_world_size();
  require(options.num_embeddings > 0 && options.embedding_dim > 0,
          "VocabParallelEmbedding: num_embeddings (" + std::to_string(options.num_embeddings) +
              ") and embedding_dim (" + std::to_string(options.embedding_dim) + ") must be positive");
  require(options.num_embeddings % tp == 0,
          "VocabParallelEmbedding: num_embeddings " + std::to_string(options.num_embeddings) +
              " is not divisible by the tensor-model-parallel size (tp) " + std::to_string(tp) +
              "; pad the vocabulary with vocab_size_with_padding");
  check_init_method(options.init_method, "VocabParallelEmbedding");

  std::tie(vocab_start_index, vocab_end_index) =
      vocab_range_from_global_vocab_size(options.num_embeddings, get_tensor_model_parallel_rank(), tp);
  weight = register_parameter("weight", initialize_affine_weight(options.num_embeddings, options.embedding_dim, 0, 1,
                                                                 options.init_method, options.params_dtype));
  set_param_attributes(weight, {/*tensor_model_parallel=*/true, /*partition_dim=*/0, /*partition_stride=*/1});
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& input_ids) {
  if (input_ids.scalar_type() != torch::kInt64 && input_ids.scalar_type() != torch::kInt32) {
    throw std::invalid_argument("VocabParallelEmbedding: input_ids must be int64 (or int32), got " +
                                std::string(c10::toString(input_ids.scalar_type())));
  }
  const bool fusion = options.gradient_accumulation_fusion;
  if (get_tensor_model_parallel_world_size() == 1) return embedding_with_grad_accumulation(weight, input_ids, fusion);
  // Ids owned by another rank look up row 0 here and are zeroed, so the all-reduce adds exactly one real row.
  const torch::Tensor foreign = (input_ids < vocab_start_index) | (input_ids >= vocab_end_index);
  const torch::Tensor local_ids = (input_ids - vocab_start_index).masked_fill(foreign, 0);
  const torch::Tensor output_parallel =
      embedding_with_grad_accumulation(weight, local_ids, fusion).masked_fill(foreign.unsqueeze(-1), 0.0);
  if (options.reduce_scatter_embeddings) {
    return reduce_scatter_to_sequence_parallel_region(output_parallel.transpose(0, 1).contiguous());
  }
  return reduce_from_tensor_model_parallel_region(output_parallel);
}

}  // namespace bridge::parallel::tensor_parallel
