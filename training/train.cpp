// The training loop (Megatron-Bridge's train.py): steps through the pipeline schedule, data-parallel gradient
// reduction, clipping and the optimizer; the log line; evaluation and checkpoints at their intervals; control
// requests agreed at each step boundary. Events fire in the reference's order.
#include <chrono>
#include <cmath>
#include <optional>

#include "bridge/models/moe/moe_logging.h"
#include "bridge/models/moe/moe_utils.h"
#include "parallel/distributed.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/distributed/finalize_model_grads.h"
#include "parallel/parallel_state.h"
#include "parallel/pipeline_parallel/schedules.h"
#include "training/callbacks/control_sync.h"
#include "training/checkpointing/checkpointing.h"
#include "training/optimizer/clip_grads.h"
#include "training/optimizer/distrib_optimizer.h"
#include "training/pretrain.h"
#include "training/pretrain_setup.h"
#include "utils/exception_message.h"
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
  options.dtype = params_dtype(setup.config.mixed_precision);  // activations travel in the model's dtype
  options.device = setup.device;
  options.forward_only = forward_only;
  options.microbatch_group_size_per_vp_stage = setup.config.parallelism.microbatch_group_size_per_vp_stage;
  if (!forward_only) {
    options.set_grad_sync = [&](bool enabled) {
      for (auto& ddp : setup.ddp) ddp->set_grad_sync(enabled);
    };
    if (setup.grad_scaler() != nullptr) {
      // fp16: the loss is multiplied by the current scale before its backward; the grads are unscaled after.
      options.grad_scale_func = [&setup](const torch::Tensor& loss) { return loss * setup.grad_scaler()->scale(); };
    }
    // An auxiliary loss (MoE) gets the gradient the main loss's backward gives each micro-batch: cp / micro-batches,
    // times fp16's loss scale, as Megatron's schedule sets MoEAuxLossAutoScaler's scale.
    const double loss_scale = setup.grad_scaler() != nullptr ? setup.grad_scaler()->scale() : 1.0;
    models::moe::set_aux_loss_backward_scale(models::moe::main_loss_backward_scale(
        loss_scale, setup.num_microbatches, parallel::get_context_parallel_world_size()));
    options.finalize_model_grads = [&] {
      std::vector<parallel::distributed::DistributedDataParallel*> chunks;
      for (auto& ddp : setup.ddp) chunks.push_back(ddp.get());
      parallel::distributed::finalize_model_grads(chunks, setup.embedding_weights,
                                                  setup.tensor_parallel_partial_weights);
      models::finalize_moe_routers(setup.model);
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
  // Sum every key over the micro-batches, then over data- and context-parallel ranks in one all-reduce: a
  // [sum, count] is then the token-weighted mean over the global batch, whatever share of tokens each cp rank held.
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
  // The replicas the values were summed over: dp x cp (each context-parallel rank reports its own tokens' share).
  const double replicas = static_cast<double>(data_parallel.size());
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
  bool skipped_iter = false;  // fp16: an inf/nan gradient; no update (grad_norm stays 0)
};

// Megatron's train_step: gradients over all micro-batches, reduced and clipped, then the update.
StepOutcome train_step(PretrainSetup& setup) {
  for (auto& ddp : setup.ddp) ddp->zero_grad_buffer();
  const auto reported = forward_backward(setup, setup.train_data, /*forward_only=*/false);
  StepOutcome outcome;
  // The MoE layers' losses and tokens per expert of the step, reduced over the job (collectives on every rank).
  auto moe = std::make_shared<models::moe::MoEReport>(
      models::moe::MoEMetricsTracker::get().report(setup.config.model, setup.num_microbatches));
  setup.state.moe_report = moe;
  const auto with_moe_losses = [&moe](LossDict losses) {
    // Megatron's log line shows them beside "lm loss", where the losses are reported (the last pipeline stage).
    if (!losses.empty()) {
      for (const auto& [name, value] : moe->losses) losses[name] = torch::tensor(value, torch::kFloat);
    }
    return losses;
  };
  // Megatron's mixed-precision optimizer: the fp32 main params take the fp32 main grads (unscaled for fp16); an
  // overflow agreed across the model-parallel group skips the update on every rank.
  MixedPrecision* mp = setup.mixed_precision.get();
  if (mp != nullptr && mp->copy_main_grads_and_unscale()) {
    outcome.skipped_iter = true;
    outcome.loss_dict = with_moe_losses(reduce_losses(setup, reported));
    return outcome;
  }
  // The distributed optimizer's shards hold each element on one data-parallel rank: their norm is the world's, and
  // so is fp16's overflow check.
  DistributedOptimizer* shards = setup.distributed_optimizer.get();
  if (shards != nullptr && shards->prepare_grads()) {
    outcome.skipped_iter = true;
    outcome.loss_dict = with_moe_losses(reduce_losses(setup, reported));
    return outcome;
  }
  const std::vector<torch::Tensor>& grad_params = shards != nullptr ? shards->main_params()
                                                  : mp != nullptr   ? mp->main_params()
                                                                    : setup.params;
  parallel::ProcessGroup* norm_group = shards != nullptr ? &parallel::get_world_group() : nullptr;
  const double clip = setup.config.optimizer.clip_grad;
  outcome.grad_norm =
      clip > 0.0 ? clip_grad_norm(grad_params, clip, norm_group) : get_grad_norm_fp32(grad_params, norm_group);
  // The norm is reduced over the model-parallel group and equal on every rank, so all of them stop here together.
  if (setup.config.train.check_for_nan_in_loss_and_grad && !std::isfinite(outcome.grad_norm)) {
    note_agreed_failure();
    throw std::runtime_error("the gradient norm is " + std::to_string(outcome.grad_norm) + " at step " +
                             std::to_string(setup.state.train_state.step) +
                             ": the loss or gradients are NaN or infinite. Lower optimizer.lr, check the data, or "
                             "set train.check_for_nan_in_loss_and_grad = false to train on");
  }
  setup.fire_training(Event::kOptimizerStepStart, [&](CallbackContext& ctx) { ctx.grad_norm = outcome.grad_norm; });
  setup.optimizer->step();
  if (mp != nullptr) mp->copy_main_params_to_model_params();
  if (shards != nullptr) shards->finish_step();
  setup.fire_training(Event::kOptimizerStepEnd, [&](CallbackContext& ctx) { ctx.grad_norm = outcome.grad_norm; });
  setup.scheduler->step(setup.config.train.global_batch_size);
  outcome.loss_dict = with_moe_losses(reduce_losses(setup, reported));
  return outcome;
}

}  // namespace

ControlOutcome act_on_control(PretrainSetup& setup, const AgreedControl& control, bool training) {
  if (!control.any()) return ControlOutcome::kContinue;
  const int64_t step = setup.state.train_state.step;
  bridge::utils::logger().info("control requests after step {}:\n{}", step, control.summary);
  if (control.abort) {
    // Every rank agreed, so the collectives of a pending asynchronous save are safe: keep that checkpoint. Its
    // failure (the same on every rank) is logged; the abort's reason is what pretrain() reports.
    try {
      finalize_checkpoint_save(setup, /*blocking=*/true);
    } catch (const std::exception& error) {
      bridge::utils::logger().error("{}", bridge::utils::describe(error));
    }
    note_agreed_failure();
    throw TrainingAborted("training aborted after step " + std::to_string(step) + " on a callback's request:\n" +
                          control.summary);
  }
  if (control.save || control.exit) {
    if (setup.config.checkpoint.save.empty()) {
      bridge::utils::logger().warn("{}, but checkpoint.save (the directory) is not set: not saved",
                                   control.exit ? "exiting" : "a callback asked to save");
    } else if (setup.last_saved_step != step) {
      save_checkpoint(setup);
    }
  }
  if (!training) {
    if (control.stop || control.exit) bridge::utils::logger().info("training is over: nothing left to stop");
    return ControlOutcome::kContinue;
  }
  if (control.exit) return ControlOutcome::kExit;
  return control.stop ? ControlOutcome::kStop : ControlOutcome::kContinue;
}

ControlOutcome act_on_control_requests(PretrainSetup& setup, bool training) {
  return act_on_control(setup, agree_on_control(&setup.control(), parallel::get_world_group()), training);
}

namespace {

// Queues this rank's train.exit_* requests after a step: a caught signal, the time limit (both seen per rank) and
// exit_interval (rank 0 asks for everyone). The next agreement makes every rank exit after the same step.
void request_exits(PretrainSetup& setup) {
  const TrainingConfig& config = setup.config.train;
  const int64_t step = setup.state.train_state.step;
  TrainingControl& control = setup.control();
  const int signal = setup.exit_signals ? setup.exit_signals->received() : 0;
  if (signal != 0) {
    control.request(ControlAction::kExit, bridge::utils::signal_name(signal) + " received", "train.exit_signal_handler",
                    Event::kTrainStepEnd);
  }
  if (config.exit_duration_in_mins) {
    const std::chrono::duration<double, std::ratio<60>> elapsed = std::chrono::steady_clock::now() - setup.started;
    if (elapsed.count() > *config.exit_duration_in_mins) {
      control.request(
          ControlAction::kExit,
          fmt::format("ran {:.2f} minutes, over {} minutes", elapsed.count(), *config.exit_duration_in_mins),
          "train.exit_duration_in_mins", Event::kTrainStepEnd);
    }
  }
  if (config.exit_interval && step % *config.exit_interval == 0 && parallel::get_rank() == 0) {
    control.request(ControlAction::kExit,
                    "step " + std::to_string(step) + " is a multiple of " + std::to_string(*config.exit_interval),
                    "train.exit_interval", Event::kTrainStepEnd);
  }
}

}  // namespace

ControlOutcome train(PretrainSetup& setup) {
  const ConfigContainer& config = setup.config;
  TrainState& train_state = setup.state.train_state;
  for (models::GPTModel& chunk : setup.model) chunk->train();
  setup.fire_training(Event::kTrainStart);
  // A pre-flight check in on_data_init_start or on_train_start may already have asked to stop, exit or abort.
  if (const ControlOutcome early = act_on_control_requests(setup, /*training=*/true);
      early != ControlOutcome::kContinue) {
    bridge::utils::logger().info("{} before the first step as requested",
                                 early == ControlOutcome::kExit ? "exiting" : "stopping");
    finalize_checkpoint_save(setup, /*blocking=*/true);
    if (early == ControlOutcome::kStop) setup.fire_training(Event::kTrainEnd);
    return early;
  }

  setup.logger->start();
  ControlOutcome outcome = ControlOutcome::kStop;
  while (train_state.step < config.train.train_iters) {
    finalize_checkpoint_save(setup, /*blocking=*/false);  // an asynchronous save all ranks have written
    setup.fire_training(Event::kTrainStepStart);
    const StepOutcome step = train_step(setup);
    setup.fire_training(Event::kTrainStepEnd, [&](CallbackContext& ctx) {
      ctx.loss_dict = step.loss_dict;
      ctx.grad_norm = step.grad_norm;
      ctx.skipped_iter = step.skipped_iter;
    });
    train_state.step += 1;
    train_state.consumed_train_samples += config.train.global_batch_size;
    request_exits(setup);
    // A log step shares the statistics and the control requests made so far in one collective.
    const std::optional<LoggedStep> logged =
        setup.logger->after_step(step.loss_dict, step.grad_norm, step.skipped_iter);

    const bool evaluate_now =
        train_state.do_valid && config.train.eval_interval > 0 && train_state.step % config.train.eval_interval == 0;
    if (evaluate_now) evaluate(setup, /*is_test=*/false, /*after_training=*/false);
    const bool save_now =
        config.checkpoint.save_interval > 0 && train_state.step % config.checkpoint.save_interval == 0;
    if (save_now) save_checkpoint(setup);

    // Every rank learns the same requests here, so all act on this same step. After a log step's collective, only
    // callbacks that ran since (on_log, evaluation, checkpointing; the same decision on every rank) can have asked.
    AgreedControl control;
    if (logged) control = logged->control;
    if (!logged || logged->on_log_fired || evaluate_now || save_now) {
      control.merge(agree_on_control(&setup.control(), parallel::get_world_group()));
    }
    const ControlOutcome acted = act_on_control(setup, control, /*training=*/true);
    if (acted != ControlOutcome::kContinue) {
      bridge::utils::logger().info("{} after step {} as requested",
                                   acted == ControlOutcome::kExit ? "exiting" : "stopping", train_state.step);
      outcome = acted;
      break;
    }
  }
  // ddp.overlap_param_gather: the last step's all-gathers had no forward to wait for them; what reads the model from
  // here on (the final checkpoint, on_train_end, an export) sees the trained parameters.
  parallel::distributed::finish_param_gathers();
  if (outcome != ControlOutcome::kExit && !config.checkpoint.save.empty() && train_state.step > 0 &&
      setup.last_saved_step != train_state.step) {
    save_checkpoint(setup);
  }
  finalize_checkpoint_save(setup, /*blocking=*/true);
  setup.logger->flush();
  // Megatron-Bridge leaves on an exit without on_train_end.
  if (outcome != ControlOutcome::kExit) setup.fire_training(Event::kTrainEnd);
  if (setup.callbacks) setup.callbacks->flush_observers();  // the observers have seen training to its end
  return outcome;
}

}  // namespace bridge::training
