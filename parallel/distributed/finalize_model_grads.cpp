// finalize_model_grads: data-parallel sync of every chunk, the q/k norms' all-reduce across the tensor-parallel
// group, then the tied word-embedding all-reduce across the first and last pipeline stage.
#include "parallel/distributed/finalize_model_grads.h"

#include <map>
#include <stdexcept>
#include <string>

#include "parallel/parallel_state.h"

namespace bridge::parallel::distributed {

namespace {

// Sums the gradients of `weights` over `group` (the main_grad, or the grad of an unwrapped weight; a weight that got
// no gradient takes part as zeros, or the peers would wait for it). Coalesced, as Megatron's: one all-reduce per
// dtype over the gradients laid end to end, not one per tensor (under sequence parallelism every norm and row-parallel
// bias takes part: four dozen for GPT-2 124M).
void all_reduce_grads(ProcessGroup& group, const std::vector<torch::Tensor>& weights, const char* what) {
  torch::NoGradGuard no_grad;
  std::map<c10::ScalarType, std::vector<torch::Tensor>> grads_by_dtype;
  for (const torch::Tensor& weight : weights) {
    if (!weight.defined()) {
      throw std::invalid_argument(std::string("finalize_model_grads: ") + what + " is an undefined tensor");
    }
    torch::Tensor grad = main_grad(weight);
    if (!grad.defined()) grad = weight.mutable_grad() = torch::zeros_like(weight);
    grads_by_dtype[grad.scalar_type()].push_back(grad);
  }
  for (auto& [dtype, grads] : grads_by_dtype) {
    std::vector<torch::Tensor> flat;
    flat.reserve(grads.size());
    for (const torch::Tensor& grad : grads) flat.push_back(grad.reshape({-1}));
    torch::Tensor coalesced = torch::cat(flat);
    group.all_reduce(coalesced, ReduceOp::kSum);
    int64_t offset = 0;
    for (torch::Tensor& grad : grads) {
      grad.copy_(coalesced.narrow(0, offset, grad.numel()).view_as(grad));
      offset += grad.numel();
    }
  }
}

}  // namespace

void finalize_model_grads(std::vector<DistributedDataParallel*> chunks,
                          const std::vector<torch::Tensor>& embedding_weights,
                          const std::vector<torch::Tensor>& tensor_parallel_partial) {
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i] == nullptr) {
      throw std::invalid_argument("finalize_model_grads: model chunk " + std::to_string(i) +
                                  " is null; pass the DistributedDataParallel of every chunk on this rank");
    }
    chunks[i]->finish_grad_sync();
  }

  if (!tensor_parallel_partial.empty() && get_tensor_model_parallel_world_size() > 1) {
    all_reduce_grads(get_tensor_model_parallel_group(), tensor_parallel_partial, "a tensor-parallel partial weight");
  }

  if (embedding_weights.empty() || get_pipeline_model_parallel_world_size() == 1) return;
  ProcessGroup* group = get_embedding_group();
  if (group == nullptr) {
    throw std::invalid_argument(
        "finalize_model_grads: this rank is a middle pipeline stage, outside the embedding "
        "group, but was given " +
        std::to_string(embedding_weights.size()) + " embedding weight(s); pass none on such ranks");
  }
  if (group->size() == 1) return;
  all_reduce_grads(*group, embedding_weights, "an embedding weight");
}

}  // namespace bridge::parallel::distributed
