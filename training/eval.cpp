// Evaluation (Megatron-Bridge's eval.py): forward passes only, in eval mode, over train.eval_iters steps of the
// validation or test data; the end event sees the total loss dict while the model is still in eval mode. The losses
// go to the metric writers and the console under Megatron's names.
#include <cmath>
#include <cstdio>

#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "training/pretrain_setup.h"
#include "training/utils/train_utils.h"
#include "utils/logging.h"

namespace bridge::training {

LossDict evaluate(PretrainSetup& setup, bool is_test, bool after_training) {
  const Event start = is_test ? Event::kTestStart : Event::kEvalStart;
  const Event step_start = is_test ? Event::kTestStepStart : Event::kEvalStepStart;
  const Event step_end = is_test ? Event::kTestStepEnd : Event::kEvalStepEnd;
  const Event end = is_test ? Event::kTestEnd : Event::kEvalEnd;
  std::vector<DataIterator>& data = is_test ? setup.test_data : setup.valid_data;

  for (models::GPTModel& chunk : setup.model) chunk->eval();
  setup.fire(start);
  std::vector<std::map<std::string, torch::Tensor>> reported;
  {
    torch::NoGradGuard no_grad;
    for (int64_t i = 0; i < setup.config.train.eval_iters; ++i) {
      setup.fire(step_start);
      auto step = forward_backward(setup, data, /*forward_only=*/true);
      reported.insert(reported.end(), std::make_move_iterator(step.begin()), std::make_move_iterator(step.end()));
      setup.fire(step_end);
      if (!is_test) setup.state.train_state.consumed_valid_samples += setup.config.train.global_batch_size;
    }
  }
  const LossDict total = reduce_losses(setup, reported);
  setup.fire(end, [&](CallbackContext& ctx) { ctx.total_loss_dict = total; });
  for (models::GPTModel& chunk : setup.model) chunk->train();

  if (setup.logger) setup.logger->write_evaluation(total, is_test);
  if (parallel::is_last_rank() && !total.empty()) {
    // Megatron's block: a test's line also reads "validation loss at", told apart by its "on test set".
    std::string line = " validation loss at iteration " + std::to_string(setup.state.train_state.step);
    if (after_training) line += is_test ? " on test set" : " on validation set";
    line += " | ";
    for (const auto& [key, value] : total) {
      const double loss = value.item<double>();
      char text[96];
      std::snprintf(text, sizeof(text), "%s value: %E | %s PPL: %E | ", key.c_str(), loss, key.c_str(),
                    utils::validation_ppl(loss));
      line += text;
    }
    const std::string rule(line.size() + 1, '-');
    bridge::utils::log_info_on_this_rank(rule);
    bridge::utils::log_info_on_this_rank(line);
    bridge::utils::log_info_on_this_rank(rule);
  }
  return total;
}

}  // namespace bridge::training
