// A batch's logits through bridge's GPT in any tp/pp/vpp layout: the pipeline schedule run forward only (the same
// batch pp times under the interleaved schedule, which needs that many micro-batches), the last stage's
// vocab-parallel logits gathered over the tensor-parallel group. The TextGenerator decodes with it; tests compare
// layouts and other implementations (Hugging Face's) with it.
//
//   torch::Tensor logits = forward_logits(chunks, tokens, torch::kFloat);  // [b, s, padded vocab] on the last stage
#pragma once

#include <torch/torch.h>

#include <vector>

#include "bridge/models/gpt_model.h"

namespace bridge::training {

/// `tokens` [b, s] (s at most model.seq_length) at positions 0..s-1, through this rank's `chunks` (in their current
/// train/eval mode; dtype: the activations' between stages). A collective of the model-parallel group: each of its
/// ranks calls it with the same tokens. Returns, on the last pipeline stage, float CPU logits [b, s, padded vocab]
/// (or, given `positions` [b], only each row's logits there: [b, padded vocab]); an undefined tensor elsewhere.
torch::Tensor forward_logits(const std::vector<models::GPTModelImpl*>& chunks, const torch::Tensor& tokens,
                             torch::Dtype dtype, const torch::Tensor& positions = {});

}  // namespace bridge::training
