// The GPT step function and loss function pretrain() users start from.
#include "training/forward_step.h"

#include <utility>

namespace bridge::training {

LossFunc masked_token_loss(torch::Tensor loss_mask) {
  return [mask = std::move(loss_mask)](const torch::Tensor& losses) {
    LossOutput output;
    output.loss = (losses.to(torch::kFloat) * mask).sum();
    output.num_tokens = mask.sum();
    output.reported["lm loss"] = torch::stack({output.loss.detach(), output.num_tokens.detach()});
    return output;
  };
}

StepResult gpt_forward_step(DataIterator& data_iterator, models::GPTModel& model) {
  GPTBatch batch = data_iterator.next();
  torch::Tensor output = model->forward(batch.tokens, batch.position_ids, batch.labels, batch.attention_mask);
  return {output, masked_token_loss(batch.loss_mask)};
}

}  // namespace bridge::training
