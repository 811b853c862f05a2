// The training loop (Megatron-Bridge's train.py): steps through the pipeline schedule, data-parallel gradient
// reduction, clipping and the optimizer; the log line; evaluation and checkpoints at their intervals; control
// requests agreed at each step boundary. Events fire in the reference's order.
#include <chrono>
#include <cmath>
#include <cstdio>

#include "parallel/distributed.h"
#include "parallel/distributed/finalize_model_grads.h"
#include "parallel/parallel_state.h"
#include "parallel/pipeline_parallel/schedules.h"
#include "training/checkpointing.h"
#include "training/clip_grads.h"
#include "training/control_sync.h"
#include "training/pretrain.h"
#include "training/pretrain_setup.h"
#include "utils/logging.h"

namespace bridge::training {
namespace pp = parallel::pipeline_parallel;

std::vector<std::map<std::string, torch::Tensor>> forward_backward(PretrainSetup& setup,
                                                                   std::vector<DataIterator>& data, bool forward_only) {
  pp::ForwardBackwardOptions options;
  options.forward_step_func = [&](int64_t, int64_t chunk) {
    const auto index = static_cast<std::size_t>(chunk);
    return setup.step_fn(setup.state, data[index], setup.model[index]);
  };
  for (models::GPTModel& chunk : setup.model) {
    options.set_input_tensor.emplace_back(
        [module = chunk.ptr()](const torch::Tensor& input) { module->set_input_tensor(input); });
  }
  options.num_microbatches = setup.num_microbatches;
  options.tensor_shape = setup.tensor_shape;
  options.forward_only = forward_only;
  options.microbatch_group_size_per_vp_stage = setup.config.parallelism.microbatch_group_size_per_vp_stage;
  if (!forward_only) {
    options.set_grad_sync = [&](bool enabled) {
      for (auto& ddp : setup.ddp) ddp->set_grad_sync(enabled);
    };
    options.finalize_model_grads = [&] {
      std::vector<parallel::distributed::DistributedDataParallel*> chunks;
      for (auto& ddp : setup.ddp) chunks.push_back(ddp.get());
      parallel::distributed::finalize_model_grads(chunks, setup.embedding_weights);
    };
    // Per-micro-batch events of training steps; the hooks exist only when someone listens.
    auto micro_batch_event = [&](Event event) -> std::function<void(int64_t, int64_t)> {
      if (!should_fire(setup.callbacks, event)) return nullptr;
      return [&setup, event](int64_t micro_batch, int64_t chunk) {
        setup.fire(event, [&](CallbackContext& ctx) {
          ctx.micro_batch = micro_batch;
          ctx.model_chunk = chunk;
        });
      };
    };
    options.hooks.on_forward_start = micro_batch_event(Event::kForwardStart);
    options.hooks.on_backward_start = micro_batch_event(Event::kBackwardStart);
    options.hooks.on_backward_end = micro_batch_event(Event::kBackwardEnd);
    if (should_fire(setup.callbacks, Event::kForwardEnd)) {
      options.hooks.on_forward_end = [&setup](int64_t micro_batch, int64_t chunk, const torch::Tensor& output) {
        setup.fire(Event::kForwardEnd, [&](CallbackContext& ctx) {
          ctx.micro_batch = micro_batch;
          ctx.model_chunk = chunk;
          ctx.output_tensor = output;
        });
      };
    }
  }
  return pp::get_forward_backward_func()(options);
}

LossDict reduce_losses(PretrainSetup& setup, const std::vector<std::map<std::string, torch::Tensor>>& reported) {
  LossDict losses;
  if (!parallel::is_pipeline_last_stage(/*ignore_virtual=*/true)) return losses;
  // Sum every key over the micro-batches, then over data-parallel ranks in one all-reduce.
  std::map<std::string, torch::Tensor> sums;
  for (const auto& micro_batch : reported) {
    for (const auto& [key, value] : micro_batch) {
      if (value.numel() != 1 && value.numel() != 2) {
        throw std::invalid_argument("the loss function reported '" + key + "' with " + std::to_string(value.numel()) +
                                    " elements; report [sum, count] (2 elements) or a per-micro-batch mean (1)");
      }
      torch::Tensor flat = value.detach().reshape({-1}).to(torch::kDouble);
      auto [it, inserted] = sums.emplace(key, flat);
      if (!inserted) it->second = it->second + flat;
    }
  }
  // Replicas must report the same keys and shapes, or the all-reduce below would mix them up: check that first.
  std::vector<torch::Tensor> parts;
  for (const auto& entry : sums) parts.push_back(entry.second);
  parallel::ProcessGroup& data_parallel = parallel::get_data_parallel_group(/*with_context_parallel=*/true);
  double elements = 0;
  for (const torch::Tensor& part : parts) elements += static_cast<double>(part.numel());
  torch::Tensor extent = torch::tensor({elements, -elements}, torch::kDouble);
  data_parallel.all_reduce(extent, parallel::ReduceOp::kMax);
  if (extent[0].item<double>() != -extent[1].item<double>()) {
    throw std::runtime_error(
        "data-parallel ranks reported different loss keys or shapes (this rank: " + std::to_string(sums.size()) +
        " keys); a loss function must report the same keys on every rank and micro-batch");
  }
  if (sums.empty()) return losses;
  torch::Tensor packed = torch::cat(parts);
  data_parallel.all_reduce(packed);
  int64_t offset = 0;
  const double replicas = static_cast<double>(setup.data_parallel_size);
  const double micro_batches = static_cast<double>(reported.size());
  for (const auto& [key, value] : sums) {
    const int64_t n = value.numel();
    torch::Tensor total = packed.slice(0, offset, offset + n);
    offset += n;
    // [sum, count]: a token-weighted mean; a 1-element value: the mean over micro-batches and replicas.
    const double mean = n == 2 ? total[0].item<double>() / std::max(total[1].item<double>(), 1.0)
                               : total[0].item<double>() / (micro_batches * replicas);
    losses[key] = torch::tensor(mean, torch::kFloat);
  }
  return losses;
}

namespace {

struct StepOutcome {
  LossDict loss_dict;
  double grad_norm = 0.0;
};

// Megatron's train_step: gradients over all micro-batches, reduced and clipped, then the update.
StepOutcome train_step(PretrainSetup& setup) {
  for (auto& ddp : setup.ddp) ddp->zero_grad_buffer();
  const auto reported = forward_backward(setup, setup.train_data, /*forward_only=*/false);
  StepOutcome outcome;
  const double clip = setup.config.optimizer.clip_grad;
  outcome.grad_norm = clip > 0.0 ? clip_grad_norm(setup.params, clip) : get_grad_norm_fp32(setup.params);
  // The norm is reduced over the model-parallel group and equal on every rank, so all of them stop here together.
  if (setup.config.train.check_for_nan_in_loss_and_grad && !std::isfinite(outcome.grad_norm)) {
    throw std::runtime_error("the gradient norm is " + std::to_string(outcome.grad_norm) + " at step " +
                             std::to_string(setup.state.train_state.step) +
                             ": the loss or gradients are NaN or infinite. Lower optimizer.lr, check the data, or "
                             "set train.check_for_nan_in_loss_and_grad = false to train on");
  }
  setup.fire_training(Event::kOptimizerStepStart, [&](CallbackContext& ctx) { ctx.grad_norm = outcome.grad_norm; });
  setup.optimizer->step();
  setup.fire_training(Event::kOptimizerStepEnd, [&](CallbackContext& ctx) { ctx.grad_norm = outcome.grad_norm; });
  setup.scheduler->step(setup.config.train.global_batch_size);
  outcome.loss_dict = reduce_losses(setup, reported);
  return outcome;
}

std::string format_value(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%E", value);
  return text;
}

// The log line, written by the last rank (which holds the losses), after on_log callbacks added to it.
void training_log(PretrainSetup& setup, const StepOutcome& outcome, double milliseconds_per_step) {
  const TrainState& train_state = setup.state.train_state;
  LogRecord record;
  record.iteration = train_state.step;
  record.metrics["learning-rate"] = setup.scheduler->get_lr();
  record.metrics["grad-norm"] = outcome.grad_norm;
  record.metrics["iteration-time-ms"] = milliseconds_per_step;
  for (const auto& [key, value] : outcome.loss_dict) record.metrics[key] = value.item<double>();
  setup.fire_training(Event::kLog, [&](CallbackContext& ctx) { ctx.log = &record; });
  if (parallel::get_rank() != setup.world_size - 1) return;

  char head[160];
  std::snprintf(head, sizeof(head),
                " iteration %8lld/%8lld | consumed samples: %12lld | elapsed time per iteration (ms): %.1f |",
                static_cast<long long>(train_state.step), static_cast<long long>(setup.config.train.train_iters),
                static_cast<long long>(train_state.consumed_train_samples), milliseconds_per_step);
  std::string line = head;
  line += " learning rate: " + format_value(setup.scheduler->get_lr()) + " |";
  line += " global batch size: " + std::to_string(setup.config.train.global_batch_size) + " |";
  for (const auto& [key, value] : outcome.loss_dict)
    line += " " + key + ": " + format_value(value.item<double>()) + " |";
  char grad_norm[48];
  std::snprintf(grad_norm, sizeof(grad_norm), " grad norm: %.3f |", outcome.grad_norm);
  line += grad_norm;
  for (const std::string& text : record.text) line += " " + text + " |";
  utils::log_info_on_this_rank(line);
}

}  // namespace

bool act_on_control_requests(PretrainSetup& setup, bool training) {
  const AgreedControl control =
      agree_on_control(setup.callbacks ? &setup.callbacks->control() : nullptr, parallel::get_world_group());
  if (!control.any()) return false;
  const int64_t step = setup.state.train_state.step;
  utils::logger().info("control requests after step {}:\n{}", step, control.summary);
  if (control.abort) {
    throw TrainingAborted("training aborted after step " + std::to_string(step) + " on a callback's request:\n" +
                          control.summary);
  }
  if (control.save) {
    if (setup.config.checkpoint.save.empty()) {
      utils::logger().warn("a callback asked to save, but checkpoint.save (the directory) is not set: not saved");
    } else if (setup.last_saved_step != step) {
      save_checkpoint(setup);
    }
  }
  if (control.stop && !training) utils::logger().info("a stop request after training has nothing left to stop");
  return control.stop && training;
}

void train(PretrainSetup& setup) {
  const ConfigContainer& config = setup.config;
  TrainState& train_state = setup.state.train_state;
  for (models::GPTModel& chunk : setup.model) chunk->train();
  setup.fire_training(Event::kTrainStart);
  // A pre-flight check in on_data_init_start or on_train_start may already have asked to stop or abort.
  if (act_on_control_requests(setup, /*training=*/true)) {
    utils::logger().info("stopping before the first step as requested");
    setup.fire_training(Event::kTrainEnd);
    return;
  }

  auto interval_start = std::chrono::steady_clock::now();
  int64_t steps_in_interval = 0;
  while (train_state.step < config.train.train_iters) {
    setup.fire_training(Event::kTrainStepStart);
    const StepOutcome outcome = train_step(setup);
    setup.fire_training(Event::kTrainStepEnd, [&](CallbackContext& ctx) {
      ctx.loss_dict = outcome.loss_dict;
      ctx.grad_norm = outcome.grad_norm;
      ctx.skipped_iter = false;
    });
    train_state.step += 1;
    train_state.consumed_train_samples += config.train.global_batch_size;
    ++steps_in_interval;

    if (train_state.step % config.logging.log_interval == 0) {
      const auto now = std::chrono::steady_clock::now();
      const double ms = std::chrono::duration<double, std::milli>(now - interval_start).count() /
                        static_cast<double>(steps_in_interval);
      training_log(setup, outcome, ms);
      interval_start = now;
      steps_in_interval = 0;
    }
    if (train_state.do_valid && config.train.eval_interval > 0 && train_state.step % config.train.eval_interval == 0) {
      evaluate(setup, /*is_test=*/false, /*after_training=*/false);
    }

    const bool interval_save =
        config.checkpoint.save_interval > 0 && train_state.step % config.checkpoint.save_interval == 0;
    if (interval_save) save_checkpoint(setup);
    // Every rank learns the same requests here, so all act on this same step.
    if (act_on_control_requests(setup, /*training=*/true)) {
      utils::logger().info("stopping after step {} as requested", train_state.step);
      break;
    }
  }
  if (!config.checkpoint.save.empty() && train_state.step > 0 && setup.last_saved_step != train_state.step) {
    save_checkpoint(setup);
  }
  setup.fire_training(Event::kTrainEnd);
}

}  // namespace bridge::training
