// Vocab-parallel cross entropy as an autograd function. Each rank works on its vocabulary shard; three all-reduces
// (max, the target's logit, the sum of exponentials) give every rank the full softmax denominator, and the
// gradient softmax - onehot is then local to each shard. In place, it works in the logits' own storage.
#include "parallel/tensor_parallel/cross_entropy.h"

#include <stdexcept>
#include <string>

#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/vocab_utils.h"

namespace bridge::parallel::tensor_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::string shape_of(const torch::Tensor& tensor) {
  std::string text = "[";
  for (int64_t i = 0; i < tensor.dim(); ++i) text += (i ? ", " : "") + std::to_string(tensor.size(i));
  return text + "]";
}

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& vocab_parallel_logits,
                               const torch::Tensor& target, double label_smoothing, bool inplace) {
    ProcessGroup& group = get_tensor_model_parallel_group();
    const auto all_reduce = [&group](torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum) {
      if (group.size() > 1) group.all_reduce(tensor, op);
    };
    const int64_t partition_vocab = vocab_parallel_logits.size(-1);
    const int64_t vocab = partition_vocab * group.size();
    const auto [vocab_start, vocab_end] = vocab_range_from_global_vocab_size(vocab, group.rank(), group.size());

    // fp16/bf16 logits are upcast; fp64 stays fp64 so that double-precision equivalence checks stay exact.
    const torch::Dtype compute_dtype = c10::promoteTypes(vocab_parallel_logits.scalar_type(), torch::kFloat32);
    const torch::Tensor logits = vocab_parallel_logits.to(compute_dtype);

    torch::Tensor logits_max = std::get<0>(logits.max(-1)).contiguous();
    all_reduce(logits_max, ReduceOp::kMax);
    // In place, the logits become the shifted logits, then their exponentials, then the softmax that backward turns
    // into the gradient: one logits-sized tensor for the whole loss (Megatron's). Otherwise the caller's stay intact.
    torch::Tensor shifted = inplace ? logits.sub_(logits_max.unsqueeze(-1)) : logits - logits_max.unsqueeze(-1);

    const torch::Tensor target_mask = (target < vocab_start) | (target >= vocab_end);
    const torch::Tensor masked_target = (target - vocab_start).masked_fill(target_mask, 0);
    torch::Tensor predicted =
        shifted.gather(-1, masked_target.unsqueeze(-1)).squeeze(-1).masked_fill(target_mask, 0.0).contiguous();
    all_reduce(predicted);  // exactly one rank holds each target

    // For label smoothing: the sum over the whole vocabulary of the shifted logits (before exp_ overwrites them).
    const torch::Tensor shifted_sum = label_smoothing > 0.0 ? shifted.sum(-1) : torch::Tensor();
    torch::Tensor exp_logits = inplace ? shifted.exp_() : shifted.exp();
    torch::Tensor sum_exp;
    torch::Tensor sum_shifted;
    if (label_smoothing > 0.0) {
      torch::Tensor sums = torch::stack({exp_logits.sum(-1), shifted_sum}, -1).contiguous();
      all_reduce(sums);
      sum_exp = sums.select(-1, 0);
      sum_shifted = sums.select(-1, 1);
    } else {
      sum_exp = exp_logits.sum(-1).contiguous();
      all_reduce(sum_exp);
    }
    const torch::Tensor log_sum_exp = sum_exp.log();
    torch::Tensor loss = log_sum_exp - predicted;

    // Megatron's smoothing: the target gets 1 - label_smoothing, each other class label_smoothing / (V - 1).
    double smoothing = 0.0;
    if (label_smoothing > 0.0) {
      smoothing = label_smoothing * static_cast<double>(vocab) / static_cast<double>(vocab - 1);
      const torch::Tensor mean_log_probs = sum_shifted / static_cast<double>(vocab) - log_sum_exp;
      loss = (1.0 - smoothing) * loss - smoothing * mean_log_probs;
    }

    const torch::Tensor softmax = exp_logits.div_(sum_exp.unsqueeze(-1));
    ctx->save_for_backward({softmax, masked_target, target_mask});
    ctx->saved_data["smoothing"] = smoothing;
    ctx->saved_data["vocab"] = vocab;
    ctx->saved_data["input_dtype"] = static_cast<int64_t>(vocab_parallel_logits.scalar_type());
    ctx->saved_data["inplace"] = inplace;
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& softmax = saved[0];
    const torch::Tensor& masked_target = saved[1];
    const torch::Tensor& target_mask = saved[2];
    const double smoothing = ctx->saved_data["smoothing"].toDouble();
    const auto vocab = static_cast<double>(ctx->saved_data["vocab"].toInt());
    const auto input_dtype = static_cast<torch::Dtype>(ctx->saved_data["input_dtype"].toInt());

    const bool inplace = ctx->saved_data["inplace"].toBool();
    const torch::Tensor grad_output = grads[0].to(softmax.scalar_type()).unsqueeze(-1);
    // d loss / d logits = softmax - (1 - smoothing) onehot(target) - smoothing / V, times the incoming gradient.
    torch::Tensor grad = inplace ? softmax.mul_(grad_output) : softmax * grad_output;
    const torch::Tensor own_target = target_mask.logical_not().unsqueeze(-1).to(grad.scalar_type());
    grad.scatter_add_(-1, masked_target.unsqueeze(-1), -(1.0 - smoothing) * own_target * grad_output);
    if (smoothing > 0.0) grad.sub_(grad_output * (smoothing / vocab));
    return {grad.to(input_dtype), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& vocab_parallel_logits, const torch::Tensor& target,
                                           double label_smoothing, bool inplace) {
  const char* where = "vocab_parallel_cross_entropy";
  if (!vocab_parallel_logits.defined() || vocab_parallel_logits.dim() < 1 ||
      !at::isFloatingType(vocab_parallel_logits.scalar_type())) {
    throw std::invalid_argument(std::string(where) +
                                ": vocab_parallel_logits must be a floating-point tensor [..., V / tp]");
  }
  if (!target.defined() || (target.scalar_type() != torch::kInt64 && target.scalar_type() != torch::kInt32)) {
    throw std::invalid_argument(std::string(where) + ": target must be an int64 tensor of global token ids");
  }
  if (target.sizes() != vocab_parallel_logits.sizes().slice(0, vocab_parallel_logits.dim() - 1)) {
    throw std::invalid_argument(std::string(where) + ": target " + shape_of(target) +
                                " must have the leading shape of vocab_parallel_logits " +
                                shape_of(vocab_parallel_logits));
  }
  const int64_t vocab = vocab_parallel_logits.size(-1) * get_tensor_model_parallel_world_size();
  if (label_smoothing < 0.0 || label_smoothing >= 1.0 || (label_smoothing > 0.0 && vocab < 2)) {
    throw std::invalid_argument(std::string(where) +
                                ": label_smoothing must be in [0, 1) (and the vocabulary "
                                "larger than 1 to smooth), got " +
                                std::to_string(label_smoothing));
  }
  const torch::Dtype dtype = vocab_parallel_logits.scalar_type();
  if (inplace && (dtype == torch::kFloat || dtype == torch::kDouble)) {
    return VocabParallelCrossEntropy::apply(vocab_parallel_logits, target.to(torch::kInt64), label_smoothing, true);
  }
  if (get_tensor_model_parallel_world_size() == 1) {
    // One rank holds the whole vocabulary: PyTorch's fused log-softmax + NLL gives the same loss in fewer passes over
    // the logits. Megatron's smoothing eps spreads eps / (V - 1) over the other classes, PyTorch's eps' / V over all
    // of them, so eps' = eps * V / (V - 1).
    namespace F = torch::nn::functional;
    const int64_t v = vocab_parallel_logits.size(-1);
    const auto loss_dtype = dtype == torch::kDouble ? torch::kDouble : torch::kFloat;
    auto options = F::CrossEntropyFuncOptions().reduction(torch::kNone);
    if (label_smoothing > 0.0) options.label_smoothing(label_smoothing * static_cast<double>(v) / (v - 1.0));
    return F::cross_entropy(vocab_parallel_logits.reshape({-1, v}).to(loss_dtype),
                            target.reshape({-1}).to(torch::kInt64), options)
        .view(target.sizes());
  }
  return VocabParallelCrossEntropy::apply(vocab_parallel_logits, target.to(torch::kInt64), label_smoothing, false);
}

}  // namespace bridge::parallel::tensor_parallel
