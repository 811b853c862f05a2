// Megatron's finalize_model_grads: the step between the last backward and the optimizer that makes every gradient
// final (data-parallel reduced, and equal on both copies of a tied word embedding).
#pragma once

#include <torch/torch.h>

#include <vector>

#include "parallel/distributed/distributed_data_parallel.h"

namespace bridge::parallel::distributed {

/// Megatron's finalize_model_grads: finish_grad_sync on every chunk, then all-reduce (sum) the word-embedding grads
/// over the embedding group (first and last pipeline stage) so both tied copies take the same update.
/// `embedding_weights` are this rank's word-embedding weights in that group (the first stage's input embedding, the
/// last stage's output-layer copy); empty on ranks outside it. With pp == 1 nothing is reduced.
/// `tensor_parallel_partial` are replicated weights whose gradient each tensor-parallel rank holds only its share of
/// (the q/k norms, applied to each rank's own heads; under sequence parallelism the norms and row-parallel biases,
/// applied to each rank's own tokens): summed over the tensor-parallel group in one coalesced all-reduce, as
/// Megatron's _allreduce_non_tensor_model_parallel_grads, so every replica takes the same update.
void finalize_model_grads(std::vector<DistributedDataParallel*> chunks,
                          const std::vector<torch::Tensor>& embedding_weights,
                          const std::vector<torch::Tensor>& tensor_parallel_partial = {});

}  // namespace bridge::parallel::distributed
