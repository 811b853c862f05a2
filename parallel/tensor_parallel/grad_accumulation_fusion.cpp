// The fused ops as autograd functions. LinearWithGradAccumulation: forward is at::linear; backward computes the input's
// and bias's gradients as linear's own backward does. EmbeddingWithGradAccumulation: forward is at::embedding. Each
// accumulates its weight's gradient into the weight's main_grad when fusion applies, else returns it to autograd.
#include "parallel/tensor_parallel/grad_accumulation_fusion.h"

#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/mappings.h"

namespace bridge::parallel::tensor_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The buffer the weight's gradient may be added into, or an undefined tensor where autograd must deliver it.
torch::Tensor accumulation_target(const torch::Tensor& weight) {
  torch::Tensor main_grad = distributed::wrapped_main_grad(weight);
  if (!main_grad.defined() || main_grad.scalar_type() != weight.scalar_type()) return {};
  // A replaced .grad holds this step's value so far and DistributedDataParallel's hook moves it into the buffer after
  // this backward, overwriting anything added there first.
  if (!weight.grad().is_same(main_grad)) return {};
  return main_grad;
}

struct LinearWithGradAccumulation : torch::autograd::Function<LinearWithGradAccumulation> {
  // The bias is optional rather than an undefined tensor: a custom function's tensor inputs must be defined.
  // c10::optional: std::optional itself on LibTorch 2.x, its own type on 1.x.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input, const torch::Tensor& weight,
                               const c10::optional<torch::Tensor>& bias, bool fusion, bool sequence_parallel) {
    ctx->save_for_backward({input, weight});
    ctx->saved_data["has_bias"] = bias.has_value();
    ctx->saved_data["fusion"] = fusion;
    ctx->saved_data["sequence_parallel"] = sequence_parallel;
    return at::linear(sequence_parallel ? gather_along_first_dim(input) : input, weight, bias);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const bool sequence_parallel = ctx->saved_data["sequence_parallel"].toBool();
    const torch::Tensor& weight = saved[1];
    const torch::Tensor& grad_output = grads[0];
    torch::Tensor grad_input, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) {
      grad_input = grad_output.matmul(weight);
      // Each rank's gradient for the whole sequence is partial (its share of the output features): summed over the
      // group and split, as the input was gathered.
      if (sequence_parallel) grad_input = reduce_scatter_along_first_dim(grad_input);
    }
    const torch::Tensor grad_2d = grad_output.reshape({-1, grad_output.size(-1)});
    if (ctx->needs_input_grad(1)) {
      const torch::Tensor input = sequence_parallel ? gather_along_first_dim(saved[0]) : saved[0];
      const torch::Tensor input_2d = input.reshape({-1, input.size(-1)});
      torch::Tensor main_grad = ctx->saved_data["fusion"].toBool() ? accumulation_target(weight) : torch::Tensor();
      if (main_grad.defined()) {
        main_grad.addmm_(grad_2d.t(), input_2d);
      } else {
        grad_weight = grad_2d.t().mm(input_2d);
      }
    }
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) grad_bias = grad_2d.sum(0);
    return {grad_input, grad_weight, grad_bias, torch::Tensor(), torch::Tensor()};
  }
};

struct EmbeddingWithGradAccumulation : torch::autograd::Function<EmbeddingWithGradAccumulation> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& weight, const torch::Tensor& indices) {
    ctx->save_for_backward({weight, indices});
    return at::embedding(weight, indices);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& weight = saved[0];
    const torch::Tensor& indices = saved[1];
    const torch::Tensor& grad_output = grads[0];
    torch::Tensor grad_weight;
    if (ctx->needs_input_grad(0)) {
      torch::Tensor main_grad = accumulation_target(weight);
      if (main_grad.defined()) {
        const torch::Tensor rows = grad_output.reshape({-1, weight.size(1)});
        if (main_grad.is_cpu()) {
          main_grad.index_add_(0, indices.reshape({-1}), rows);
        } else {
          // On CUDA index_add_ adds repeated rows with atomics, in no fixed order; the accumulating index_put_ sorts
          // the indices first and so stays as reproducible as embedding's own backward.
          main_grad.index_put_({indices.reshape({-1})}, rows, /*accumulate=*/true);
        }
      } else {
        grad_weight = at::embedding_backward(grad_output, indices, weight.size(0), /*padding_idx=*/-1,
                                             /*scale_grad_by_freq=*/false, /*sparse=*/false);
      }
    }
    return {grad_weight, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor linear_with_grad_accumulation(const torch::Tensor& input, const torch::Tensor& weight,
                                            const torch::Tensor& bias, bool gradient_accumulation_fusion,
                                            bool sequence_parallel) {
  sequence_parallel = sequence_parallel && get_tensor_model_parallel_world_size() > 1;
  if (!torch::GradMode::is_enabled() || (!input.requires_grad() && !weight.requires_grad())) {
    return at::linear(sequence_parallel ? gather_along_first_dim(input) : input, weight, bias);
  }
  // Without a weight gradient to fuse (frozen weights) or a gathered input to keep small, linear's own autograd is as
  // good.
  if (!sequence_parallel && (!gradient_accumulation_fusion || !weight.requires_grad())) {
    return at::linear(input, weight, bias);
  }
  return LinearWithGradAccumulation::apply(input, weight,
                                           bias.defined() ? c10::optional<torch::Tensor>(bias) : c10::nullopt,
                                           gradient_accumulation_fusion, sequence_parallel);
}

torch::Tensor embedding_with_grad_accumulation(const torch::Tensor& weight, const torch::Tensor& indices,
                                               bool gradient_accumulation_fusion) {
  if (!gradient_accumulation_fusion || !torch::GradMode::is_enabled() || !weight.requires_grad()) {
    return at::embedding(weight, indices);
  }
  return EmbeddingWithGradAccumulation::apply(weight, indices);
}

}  // namespace bridge::parallel::tensor_parallel
