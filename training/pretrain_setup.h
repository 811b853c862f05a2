// What one pretrain() run owns once set up: the model chunks with their data-parallel wrappers, the optimizer and
// scheduler, the data iterators and the callbacks. setup() builds it; train(), evaluate() and save_checkpoint() work
// on it. Internal to the loop; users see these objects through CallbackContext.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "bridge/models/gpt_model.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "training/callbacks/callback_context.h"
#include "training/callbacks/callback_manager.h"
#include "training/config/config.h"
#include "training/data.h"
#include "training/forward_step.h"
#include "training/optimizer/distrib_optimizer.h"
#include "training/optimizer/mixed_precision.h"
#include "training/optimizer/optimizer_param_scheduler.h"
#include "training/state.h"
#include "training/training_logger.h"
#include "utils/exit_signal.h"

namespace bridge::training {

struct PendingCheckpoint;  // training/checkpointing/checkpointing.cpp

struct PretrainSetup {
  ConfigContainer config;
  GlobalState state;
  std::shared_ptr<CallbackManager> callbacks;  // null: no callbacks
  ForwardStepFn step_fn;

  std::vector<models::GPTModel> model;  // this rank's chunks
  ModelChunks chunks;                   // the same modules, as callbacks see them
  std::vector<std::unique_ptr<parallel::distributed::DistributedDataParallel>> ddp;  // one per chunk
  std::vector<torch::Tensor> params;                           // every trainable parameter of this rank
  std::vector<torch::Tensor> embedding_weights;                // summed over the embedding group (pp > 1)
  std::vector<torch::Tensor> tensor_parallel_partial_weights;  // q/k norms: summed over the tensor-parallel group
  /// bf16/fp16: the fp32 main params the optimizer steps on, and the fp16 loss scaler; null in fp32.
  std::unique_ptr<MixedPrecision> mixed_precision;
  /// optimizer.use_distributed_optimizer: this rank's shards of the parameters, which the optimizer steps on.
  std::unique_ptr<DistributedOptimizer> distributed_optimizer;
  /// fp16's loss scaler, the mixed-precision optimizer's or the distributed optimizer's; null without fp16.
  GradScaler* grad_scaler() const {
    if (mixed_precision) return mixed_precision->grad_scaler();
    return distributed_optimizer ? distributed_optimizer->grad_scaler() : nullptr;
  }
  std::unique_ptr<torch::optim::Optimizer> optimizer;  // over the fp32 main params under mixed precision
  std::unique_ptr<OptimizerParamScheduler> scheduler;

  torch::Device device = torch::kCPU;  // this rank's device (parallelism.device): model, batches, buffers
  int world_size = 1;
  int data_parallel_size = 1;
  int data_parallel_rank = 0;
  int64_t num_microbatches = 1;
  std::vector<int64_t> tensor_shape;  // activations between stages: [seq, micro_batch, hidden]

  int64_t last_saved_step = -1;  // the step of the newest checkpoint this run wrote
  /// An asynchronous save not finalised yet (null: none). Destroying it waits for its file write, so an error in
  /// training leaves no thread behind (and no common.pt: the tracker stays on the previous checkpoint).
  std::shared_ptr<PendingCheckpoint> pending_checkpoint;
  /// Requests when there are no callbacks: the loop's own (train.exit_*) still go through the agreement.
  TrainingControl own_control;
  /// train.exit_signal_handler: catches SIGTERM and SIGINT for the run (null when off).
  std::unique_ptr<bridge::utils::ExitSignalHandler> exit_signals;
  std::chrono::steady_clock::time_point started;  // pretrain()'s start, for train.exit_duration_in_mins
  std::unique_ptr<TrainingLogger> logger;

  GPTDatasets datasets;
  // One iterator per model chunk, as Megatron's interleaved schedule keeps: each chunk draws its micro-batches in
  // order, so the first and last chunk see the same micro-batch at the same position.
  std::vector<DataIterator> train_data, valid_data, test_data;

  /// Where control requests collect: the callbacks' manager, or own_control without one.
  TrainingControl& control() { return callbacks ? callbacks->control() : own_control; }

  /// Fires `event` on this rank's callbacks with a context over the state and model; `fill` sets the event's fields.
  template <class Fill>
  void fire(Event event, Fill&& fill) {
    if (!should_fire(callbacks, event)) return;
    CallbackContext ctx(state, chunks, callbacks->user_state());
    fill(ctx);
    callbacks->fire(event, ctx);
  }
  void fire(Event event) {
    fire(event, [](CallbackContext&) {});
  }
  /// As fire(), with the optimizer and scheduler set (the training events).
  template <class Fill>
  void fire_training(Event event, Fill&& fill) {
    fire(event, [&](CallbackContext& ctx) {
      ctx.optimizer = optimizer.get();
      ctx.scheduler = scheduler.get();
      fill(ctx);
    });
  }
  void fire_training(Event event) {
    fire_training(event, [](CallbackContext&) {});
  }
};

/// Called just before throwing an error that every rank throws at the same point, because a collective told every
/// rank of it (a failed save, an agreed abort, a NaN gradient norm). pretrain() then leaves the process groups as they
/// are; any other error leaving pretrain() on one rank tears them down, so that the other ranks fail at once rather
/// than at parallelism.timeout.
void note_agreed_failure();

/// Runs the step function over `data` (one iterator per chunk) through the pipeline schedule. With `forward_only`,
/// no gradients (evaluation); otherwise gradients are accumulated, reduced over data parallel and finalised. Returns
/// the reported losses of each micro-batch on the last stage, empty elsewhere.
std::vector<std::map<std::string, torch::Tensor>> forward_backward(PretrainSetup& setup,
                                                                   std::vector<DataIterator>& data, bool forward_only);

/// Reduces the reported [sum, count] pairs of every micro-batch over data-parallel ranks into key -> sum / count on
/// the last stage; an empty map elsewhere (Megatron's loss_dict).
LossDict reduce_losses(PretrainSetup& setup, const std::vector<std::map<std::string, torch::Tensor>>& reported);

/// Evaluates on the validation (or, with `is_test`, test) data for train.eval_iters steps with the eval/test events;
/// returns the total loss dict (empty off the last stage). `after_training` only changes the log line.
LossDict evaluate(PretrainSetup& setup, bool is_test, bool after_training);

/// What the loop does after the requests every rank agreed on.
enum class ControlOutcome : std::uint8_t {
  kContinue,
  kStop,  ///< finish: on_train_end, then evaluation after training
  kExit,  ///< train.exit_*: leave without on_train_end or evaluation, as Megatron-Bridge exits
};

/// The training loop; returns kStop at train_iters or on a requested stop, kExit on an exit (train.exit_signal_handler,
/// exit_interval, exit_duration_in_mins), and throws TrainingAborted on abort.
ControlOutcome train(PretrainSetup& setup);

/// Acts on requests every rank agreed on: throws TrainingAborted on an abort, saves on a save or exit request (when
/// checkpoint.save is set). Outside training (`training` false) a stop or exit has nothing left to stop and is only
/// logged.
ControlOutcome act_on_control(PretrainSetup& setup, const AgreedControl& control, bool training);

/// Agrees with every rank on the control requests made since the last agreement (one collective) and acts on them.
ControlOutcome act_on_control_requests(PretrainSetup& setup, bool training);

/// A run's whole state without training it, for tools that work on it (bridge-checkpoint convert): the world, groups,
/// model, optimizer and scheduler as pretrain() sets them up (config.callbacks and `callbacks` included), then the
/// checkpoint config.checkpoint names loaded; no metric writers, no on_data_init_start, no data, no step. `work` runs
/// on it, then a pending save is finalised; the world and groups this started are released. Collective, as
/// pretrain(); a failure throws on every rank (after on_exception).
void with_loaded_run(const ConfigContainer& config, std::shared_ptr<CallbackManager> callbacks,
                     const std::function<void(PretrainSetup&)>& work);

}  // namespace bridge::training
