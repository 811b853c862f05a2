// The region operators as torch::autograd::Function's. ProcessGroup collectives work in place on contiguous
// tensors, so every reduction runs on a fresh contiguous copy: neither the caller's tensor nor a gradient that
// autograd may still hold is ever overwritten.
#include "parallel/tensor_parallel/mappings.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/parallel_state.h"

namespace bridge::parallel::tensor_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

torch::Tensor all_reduce_copy(const torch::Tensor& tensor) {
  torch::Tensor result = tensor.clone(at::MemoryFormat::Contiguous);
  get_tensor_model_parallel_group().all_reduce(result);
  return result;
}

torch::Tensor split_last_dim(const torch::Tensor& tensor) {
  const int tp = get_tensor_model_parallel_world_size();
  const int64_t last = tensor.dim() == 0 ? 0 : tensor.size(-1);
  if (tensor.dim() == 0 || last % tp != 0) {
    throw std::invalid_argument("tensor-parallel split: the last dimension (" + std::to_string(last) +
                                ") must be divisible by the tensor-model-parallel size " + std::to_string(tp));
  }
  return tensor.chunk(tp, -1)[static_cast<std::size_t>(get_tensor_model_parallel_rank())].contiguous();
}

torch::Tensor gather_last_dim(const torch::Tensor& tensor) {
  if (tensor.dim() == 0) throw std::invalid_argument("tensor-parallel gather: the input is a scalar");
  std::vector<torch::Tensor> parts = get_tensor_model_parallel_group().all_gather(tensor.contiguous());
  return torch::cat(parts, -1);
}

torch::Tensor split_first_dim(const torch::Tensor& tensor) {
  const int tp = get_tensor_model_parallel_world_size();
  const int64_t first = tensor.dim() == 0 ? 0 : tensor.size(0);
  if (tensor.dim() == 0 || first % tp != 0) {
    throw std::invalid_argument("sequence-parallel split: the sequence dimension (dim 0, " + std::to_string(first) +
                                ") must be divisible by the tensor-model-parallel size " + std::to_string(tp) +
                                "; with model.sequence_parallel, model.seq_length must be a multiple of tp");
  }
  // A copy, not a view: the full tensor can be freed (Megatron clones the embedding's scatter output for this).
  return tensor.contiguous().chunk(tp, 0)[static_cast<std::size_t>(get_tensor_model_parallel_rank())].clone();
}

struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& input) { return input; }
  static variable_list backward(AutogradContext*, variable_list grads) { return {all_reduce_copy(grads[0])}; }
};

struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& input) { return all_reduce_copy(input); }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0]}; }
};

struct ScatterToRegion : torch::autograd::Function<ScatterToRegion> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& input) { return split_last_dim(input); }
  static variable_list backward(AutogradContext*, variable_list grads) { return {gather_last_dim(grads[0])}; }
};

struct GatherFromRegion : torch::autograd::Function<GatherFromRegion> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& input) { return gather_last_dim(input); }
  static variable_list backward(AutogradContext*, variable_list grads) { return {split_last_dim(grads[0])}; }
};

struct ScatterToSequenceRegion : torch::autograd::Function<ScatterToSequenceRegion> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& input) { return split_first_dim(input); }
  static variable_list backward(AutogradContext*, variable_list grads) { return {gather_along_first_dim(grads[0])}; }
};

struct GatherFromSequenceRegion : torch::autograd::Function<GatherFromSequenceRegion> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input, bool tensor_parallel_output_grad) {
    ctx->saved_data["reduce"] = tensor_parallel_output_grad;
    return gather_along_first_dim(input);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool reduce = ctx->saved_data["reduce"].toBool();
    return {reduce ? reduce_scatter_along_first_dim(grads[0]) : split_first_dim(grads[0]), torch::Tensor()};
  }
};

struct ReduceScatterToSequenceRegion : torch::autograd::Function<ReduceScatterToSequenceRegion> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& input) {
    return reduce_scatter_along_first_dim(input);
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {gather_along_first_dim(grads[0])}; }
};

bool single_rank() { return get_tensor_model_parallel_world_size() == 1; }

}  // namespace

torch::Tensor copy_to_tensor_model_parallel_region(const torch::Tensor& input) {
  return single_rank() ? input : CopyToRegion::apply(input);
}

torch::Tensor reduce_from_tensor_model_parallel_region(const torch::Tensor& input) {
  return single_rank() ? input : ReduceFromRegion::apply(input);
}

torch::Tensor scatter_to_tensor_model_parallel_region(const torch::Tensor& input) {
  return single_rank() ? input : ScatterToRegion::apply(input);
}

torch::Tensor gather_from_tensor_model_parallel_region(const torch::Tensor& input) {
  return single_rank() ? input : GatherFromRegion::apply(input);
}

torch::Tensor scatter_to_sequence_parallel_region(const torch::Tensor& input) {
  return single_rank() ? input : ScatterToSequenceRegion::apply(input);
}

torch::Tensor gather_from_sequence_parallel_region(const torch::Tensor& input, bool tensor_parallel_output_grad) {
  return single_rank() ? input : GatherFromSequenceRegion::apply(input, tensor_parallel_output_grad);
}

torch::Tensor reduce_scatter_to_sequence_parallel_region(const torch::Tensor& input) {
  return single_rank() ? input : ReduceScatterToSequenceRegion::apply(input);
}

torch::Tensor gather_along_first_dim(const torch::Tensor& input) {
  if (single_rank()) return input;
  if (input.dim() == 0) throw std::invalid_argument("sequence-parallel gather: the input is a scalar");
  return torch::cat(get_tensor_model_parallel_group().all_gather(input.contiguous()), 0);
}

torch::Tensor reduce_scatter_along_first_dim(const torch::Tensor& input) {
  if (single_rank()) return input;
  const int tp = get_tensor_model_parallel_world_size();
  if (input.dim() == 0 || input.size(0) % tp != 0) {
    throw std::invalid_argument("sequence-parallel reduce-scatter: the sequence dimension (dim 0, " +
                                (input.dim() == 0 ? std::string("a scalar") : std::to_string(input.size(0))) +
                                ") must be divisible by the tensor-model-parallel size " + std::to_string(tp));
  }
  return get_tensor_model_parallel_group().reduce_scatter(input.contiguous());
}

}  // namespace bridge::parallel::tensor_parallel
