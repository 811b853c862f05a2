// finalize_model_grads: data-parallel sync of every chunk, then the tied word-embedding all-reduce across the first
// and last pipeline stage.
#include "parallel/distributed/finalize_model_grads.h"

#include <stdexcept>
#include <string>

#include "parallel/parallel_state.h"

namespace bridge::parallel::distributed {

void finalize_model_grads(std::vector<DistributedDataParallel*> chunks,
                          const std::vector<torch::Tensor>& embedding_weights) {
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i] == nullptr) {
      throw std::invalid_argument("finalize_model_grads: model chunk " + std::to_string(i) +
                                  " is null; pass the DistributedDataParallel of every chunk on this rank");
    }
    chunks[i]->finish_grad_sync();
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
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& weight : embedding_weights) {
    if (!weight.defined()) {
      throw std::invalid_argument("finalize_model_grads: an embedding weight is an undefined tensor");
    }
    // The main_grad (the fp32 buffer view under grad_reduce_in_fp32), or the grad of an unwrapped weight.
    torch::Tensor grad = main_grad(weight);
    // A copy that got no gradient still takes part (as zeros), or the peer would wait for it.
    if (!grad.defined()) grad = weight.mutable_grad() = torch::zeros_like(weight);
    if (grad.is_contiguous()) {
      group->all_reduce(grad, ReduceOp::kSum);
    } else {
      torch::Tensor contiguous = grad.contiguous();
      group->all_reduce(contiguous, ReduceOp::kSum);
      grad.copy_(contiguous);
    }
  }
}

}  // namespace bridge::parallel::distributed
