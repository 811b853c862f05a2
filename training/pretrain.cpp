// run_pretrain: setup (world, parallel groups, model, optimizer, scheduler, data) and the top level of a run:
// training, post-training validation and test, and on_exception when anything fails; with_loaded_run, the same setup
// up to the loaded checkpoint, for tools.
#include "training/pretrain.h"

#include <algorithm>
#include <utility>

#include "parallel/device.h"
#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/random.h"
#include "training/callbacks/registry.h"
#include "training/checkpointing/checkpointing.h"
#include "training/datasets/gpt_dataset.h"
#include "training/preflight.h"
#include "training/pretrain_setup.h"
#include "training/tokenizer_setup.h"
#include "utils/exception_message.h"
#include "utils/host_allocator.h"
#include "utils/logging.h"

namespace bridge::training {
namespace {

// Releases what run_pretrain created (and only that), also when it throws.
class ParallelScope {
 public:
  // The device is bound before the world exists, as Megatron calls torch.cuda.set_device before
  // init_process_group: NCCL groups and the CUDA RNG state belong to the current device.
  explicit ParallelScope(const ParallelismConfig& config) {
    const bool initialized = parallel::is_distributed_initialized();
    const parallel::LaunchEnv env = initialized ? parallel::get_launch_env() : parallel::detect_launch_env();
    const parallel::DeviceSelection selection = parallel::select_device(config.device, env);
    device_ = selection.device;
    parallel::bind_device(device_);
    if (!initialized) {
      parallel::DistributedOptions options;
      options.backend = parallel::select_backend(config.backend, device_, parallel::cuda_built());
      options.device = device_;
      options.timeout = config.timeout;
      options.rendezvous_timeout = config.rendezvous_timeout;
      options.rendezvous_timeout_source = "parallelism.rendezvous_timeout";
      parallel::init_distributed(options);
      owns_world_ = true;
    }
    if (config.device != "cpu" && device_.is_cpu() && parallel::get_rank() == 0) {
      bridge::utils::logger().info("parallelism.device {}: running on the CPU ({})", config.device, selection.reason);
    }
  }
  const torch::Device& device() const { return device_; }
  void initialize_model_parallel(const ParallelismConfig& config) {
    if (parallel::model_parallel_is_initialized()) {
      const parallel::ParallelOptions& current = parallel::get_rank_layout().options;
      if (current.tensor_model_parallel_size != config.tensor_model_parallel_size ||
          current.context_parallel_size != config.context_parallel_size ||
          current.pipeline_model_parallel_size != config.pipeline_model_parallel_size ||
          current.virtual_pipeline_model_parallel_size != config.virtual_pipeline_model_parallel_size ||
          current.expert_model_parallel_size != config.expert_model_parallel_size ||
          current.expert_tensor_parallel_size != config.expert_tensor_parallel_size.value_or(0)) {
        throw std::invalid_argument(
            "pretrain: the model-parallel groups already initialised do not match config.parallelism; call "
            "destroy_model_parallel() first or let pretrain() create them");
      }
      return;
    }
    parallel::ParallelOptions options;
    options.tensor_model_parallel_size = config.tensor_model_parallel_size;
    options.context_parallel_size = config.context_parallel_size;
    options.pipeline_model_parallel_size = config.pipeline_model_parallel_size;
    options.virtual_pipeline_model_parallel_size = config.virtual_pipeline_model_parallel_size;
    options.expert_model_parallel_size = config.expert_model_parallel_size;
    options.expert_tensor_parallel_size = config.expert_tensor_parallel_size.value_or(0);
    parallel::initialize_model_parallel(options);
    owns_model_parallel_ = true;
  }
  /// An error is leaving pretrain() on this rank alone: the destructor releases every process group, the caller's
  /// world too, which closes this rank's connections so the others' collectives fail now.
  void tear_down_on_exit() { tear_down_ = true; }
  ~ParallelScope() {
    if (tear_down_ && parallel::is_distributed_initialized()) {
      // Said only where it matters: the caller's world of several ranks (pretrain()'s own goes anyway).
      if (!owns_world_ && parallel::get_world_size() > 1) {
        bridge::utils::logger().error(
            "rank {}: pretrain() failed on this rank: releasing the process groups so the other ranks stop now (call "
            "init_distributed() again before another run in this process)",
            parallel::get_rank());
      }
      parallel::destroy_distributed();  // the model-parallel groups first, then the world
      return;
    }
    if (owns_model_parallel_) parallel::destroy_model_parallel();
    if (owns_world_) parallel::destroy_distributed();
  }
  ParallelScope(const ParallelScope&) = delete;
  ParallelScope& operator=(const ParallelScope&) = delete;

 private:
  torch::Device device_ = torch::kCPU;
  bool owns_world_ = false;
  bool owns_model_parallel_ = false;
  bool tear_down_ = false;
};

// Whether the error now leaving pretrain() on this thread was thrown on every rank together (note_agreed_failure).
thread_local bool failure_agreed = false;

GPTDatasets mock_datasets(const ConfigContainer& config) {
  const int64_t vocab = config.model.vocab_size;
  const int64_t seq = config.model.seq_length;
  const uint64_t seed = config.rng.seed;
  return {std::make_shared<MockGPTDataset>(vocab, seq, seed), std::make_shared<MockGPTDataset>(vocab, seq, seed + 1),
          std::make_shared<MockGPTDataset>(vocab, seq, seed + 2)};
}

// One iterator per model chunk, at `consumed_samples` (where a resumed run left off).
std::vector<DataIterator> iterators(const PretrainSetup& setup, const std::shared_ptr<const GPTDataset>& dataset,
                                    int64_t consumed_samples) {
  std::vector<DataIterator> result;
  if (!dataset) return result;
  if (dataset->seq_length() != setup.config.model.seq_length) {
    throw std::invalid_argument("the dataset's seq_length (" + std::to_string(dataset->seq_length()) +
                                ") differs from model.seq_length (" + std::to_string(setup.config.model.seq_length) +
                                "); build the datasets with model.seq_length");
  }
  const DatasetConfig& options = setup.config.dataset;
  DocumentMasking masking;
  masking.eod_token = options.eod_token_id.value_or(setup.config.model.vocab_size - 1);
  masking.reset_position_ids = options.reset_position_ids;
  masking.reset_attention_mask = options.reset_attention_mask;
  masking.eod_mask_loss = options.eod_mask_loss;
  // The ranks of a context-parallel group read the same samples (they share a data-parallel rank) and keep their
  // own chunks of each.
  parallel::ProcessGroup& context_parallel = parallel::get_context_parallel_group();
  for (std::size_t i = 0; i < setup.model.size(); ++i) {
    result.emplace_back(dataset, setup.config.train.micro_batch_size, setup.data_parallel_rank,
                        setup.data_parallel_size, consumed_samples, setup.device, masking, context_parallel.rank(),
                        context_parallel.size());
  }
  return result;
}

OptimizerParamSchedulerOptions scheduler_options(const ConfigContainer& config) {
  OptimizerParamSchedulerOptions options;
  options.init_lr = 0.0;
  options.max_lr = config.optimizer.lr;
  options.min_lr = config.optimizer.min_lr;
  const SchedulerSteps steps = config.scheduler_steps();  // in samples: step() gets the samples of each iteration
  options.lr_warmup_steps = steps.warmup;
  options.lr_decay_steps = steps.decay;
  options.lr_decay_style = parse_lr_decay_style(config.scheduler.lr_decay_style);
  return options;
}

// Model, data-parallel wrappers, optimizer and scheduler: what a checkpoint holds.
void build_model_and_optimizer(PretrainSetup& setup) {
  const ConfigContainer& config = setup.config;
  setup.world_size = parallel::get_world_size();
  setup.data_parallel_size = parallel::get_data_parallel_world_size();
  setup.data_parallel_rank = parallel::get_data_parallel_rank();
  setup.num_microbatches = config.num_microbatches(setup.world_size);
  // The stages exchange this rank's part of the sequence (Megatron's get_tensor_shapes): 1/cp of it under context
  // parallelism, of which 1/tp under sequence parallelism.
  const int tp = parallel::get_tensor_model_parallel_world_size();
  const int64_t seq = config.model.seq_length / parallel::get_context_parallel_group().size() /
                      (models::uses_sequence_parallel(config.model, tp) ? tp : 1);
  setup.tensor_shape = {seq, config.train.micro_batch_size, config.model.hidden_size};

  setup.model = models::build_gpt_model(config.model);
  // Built in fp32 from the seeded master init, then cast: every layout and precision starts from the same model.
  // Module::to keeps each parameter's TensorImpl, so its model-parallel attributes stay attached.
  const MixedPrecisionConfig& mp = config.mixed_precision;
  if (mp.enabled()) {
    for (models::GPTModel& chunk : setup.model) chunk->to(params_dtype(mp));
  }
  parallel::distributed::DistributedDataParallelConfig ddp_config = config.ddp;
  if (mp.enabled()) ddp_config.grad_reduce_in_fp32 = mp.grad_reduce_in_fp32;  // as Megatron-Bridge's setup
  for (models::GPTModel& chunk : setup.model) {
    // Built on the CPU from the seeded generators (the same weights on any device), then moved.
    if (!setup.device.is_cpu()) chunk->to(setup.device);
  }
  // The tied embedding's grad is summed across the first and last stage: under the distributed optimizer it needs a
  // bucket of its own on both, so that both shard it alike.
  setup.embedding_weights = models::embedding_group_weights(setup.model);
  for (models::GPTModel& chunk : setup.model) {
    setup.chunks.push_back(chunk.ptr());
    setup.ddp.push_back(std::make_unique<parallel::distributed::DistributedDataParallel>(
        chunk.ptr(), ddp_config, nullptr, setup.embedding_weights));
    for (const torch::Tensor& param : chunk->parameters()) {
      if (param.requires_grad()) setup.params.push_back(param);
    }
  }
  setup.tensor_parallel_partial_weights = models::tensor_parallel_partial_weights(setup.model);
  if (config.optimizer.use_distributed_optimizer) {
    std::vector<parallel::distributed::DistributedDataParallel*> wrappers;
    for (const auto& ddp : setup.ddp) wrappers.push_back(ddp.get());
    std::optional<GradScaler> grad_scaler;
    if (mp.fp16) grad_scaler = GradScaler::from_config(mp);
    setup.distributed_optimizer = std::make_unique<DistributedOptimizer>(wrappers, nullptr, grad_scaler);
    setup.optimizer = build_optimizer(config.optimizer, setup.distributed_optimizer->decayed_params(),
                                      setup.distributed_optimizer->not_decayed_params());
  } else if (mp.enabled()) {
    setup.mixed_precision = std::make_unique<MixedPrecision>(mp, setup.params);
    setup.optimizer = build_optimizer(config.optimizer, setup.mixed_precision->main_params());
  } else {
    setup.optimizer = build_optimizer(config.optimizer, setup.params);
  }
  setup.scheduler = std::make_unique<OptimizerParamScheduler>(*setup.optimizer, scheduler_options(config));
}

// The model and optimizer, the metric writers, the checkpoint, then on_data_init_start, then the data.
void build(PretrainSetup& setup) {
  const ConfigContainer& config = setup.config;
  build_model_and_optimizer(setup);
  setup.logger = std::make_unique<TrainingLogger>(setup);

  // As Megatron-Bridge: a resumed run's RNG streams are kept from on_data_init_start's warm-ups (which may draw).
  const std::optional<LoadedCheckpoint> loaded = load_checkpoint(setup);
  std::optional<parallel::tensor_parallel::RngStates> restored_rng;
  if (loaded && loaded->rng_loaded) restored_rng = parallel::tensor_parallel::get_all_rng_states();
  setup.fire_training(Event::kDataInitStart);
  if (restored_rng) parallel::tensor_parallel::set_all_rng_states(*restored_rng);

  // Building the data can fail on some ranks only (a file missing on one node, a cache folder it cannot write):
  // the failure travels in the flags below, so every rank stops with it instead of waiting for the others.
  std::exception_ptr failure;
  try {
    setup.datasets = config.dataset.provider             ? config.dataset.provider(config)
                     : !config.dataset.data_path.empty() ? datasets::build_gpt_datasets(config)
                                                         : mock_datasets(config);
    if (!setup.datasets.train && config.train.train_iters > 0 && !config.train.skip_train) {
      throw std::invalid_argument("dataset.provider returned no train dataset but train.train_iters is " +
                                  std::to_string(config.train.train_iters));
    }
    const TrainState& progress = setup.state.train_state;
    setup.train_data = iterators(setup, setup.datasets.train, progress.consumed_train_samples);
    setup.valid_data = iterators(setup, setup.datasets.valid, progress.consumed_valid_samples);
    setup.test_data = iterators(setup, setup.datasets.test, 0);
  } catch (...) {
    failure = std::current_exception();
  }
  TrainState& train_state = setup.state.train_state;
  train_state.do_train = !config.train.skip_train && config.train.train_iters > 0;
  train_state.do_valid = !setup.valid_data.empty() && config.train.eval_iters > 0;
  train_state.do_test = !setup.test_data.empty() && config.train.eval_iters > 0;
  // Evaluation is collective: a provider that gave a dataset to some ranks only would leave the others waiting.
  torch::Tensor flags =
      torch::tensor({train_state.do_valid ? 1.0 : 0.0, train_state.do_test ? 1.0 : 0.0,
                     train_state.do_valid ? -1.0 : 0.0, train_state.do_test ? -1.0 : 0.0, failure ? 1.0 : 0.0});
  parallel::get_world_group().all_reduce(flags, parallel::ReduceOp::kMax);
  if (flags[4].item<double>() > 0.0 || flags[0].item<double>() != -flags[2].item<double>() ||
      flags[1].item<double>() != -flags[3].item<double>()) {
    note_agreed_failure();
  }
  if (flags[4].item<double>() > 0.0) {
    if (failure) std::rethrow_exception(failure);
    throw std::runtime_error("building the datasets failed on another rank (its error names the cause)");
  }
  if (flags[0].item<double>() != -flags[2].item<double>() || flags[1].item<double>() != -flags[3].item<double>()) {
    throw std::invalid_argument(
        "dataset.provider returned a validation or test dataset on some ranks but not on others; return the same "
        "datasets on every rank");
  }
}

void report_exception(PretrainSetup& setup, std::exception_ptr error) {
  if (!should_fire(setup.callbacks, Event::kException)) return;
  const std::string what = bridge::utils::exception_message(error);
  try {
    setup.fire(Event::kException, [&](CallbackContext& ctx) { ctx.exception = ExceptionInfo{error, what}; });
  } catch (const std::exception& e) {
    bridge::utils::logger().error("an on_exception callback failed too (the original error follows): {}",
                                  bridge::utils::describe(e));
  }
}

// Megatron-LM's on_setup_start: before the tokenizer, the world, the groups and the model, so a callback can start a
// clock or an external run record that covers all of setup. Only the caller's callbacks hear it (the recipe's join once
// the world gives them a rank); their rank filters use the launcher's rank, as the world will. The context has the
// config as passed and an empty model; a failure here leaves before any setup, so on_exception does not fire.
void fire_setup_start(const ConfigContainer& user_config, const std::shared_ptr<CallbackManager>& callbacks) {
  if (!should_fire(callbacks, Event::kSetupStart)) return;
  const parallel::LaunchEnv env =
      parallel::is_distributed_initialized() ? parallel::get_launch_env() : parallel::detect_launch_env();
  callbacks->set_rank(env.rank, env.world_size);
  GlobalState state;
  state.cfg = &user_config;
  ModelChunks no_model;
  CallbackContext ctx(state, no_model, callbacks->user_state());
  callbacks->fire(Event::kSetupStart, ctx);
}

// What every run of this file does around `body`: the config as the tokenizer resolves it, the world (from the
// launcher unless the caller started one) and the parallel groups, the preflight and the seeds, a PretrainSetup with
// the callbacks (the caller's, then the recipe's for this run only); on a failure, on_exception and the release of
// the groups. Returns what `body` returns.
template <class Body>
auto in_run(const ConfigContainer& user_config, ForwardStepFn step_fn, std::shared_ptr<CallbackManager> callbacks,
            Body&& body) {
  fire_setup_start(user_config, callbacks);
  // The tokenizer decides the vocabulary and the EOD id before anything is sized by them.
  ConfigContainer config = user_config;
  setup_tokenizer(config);
  // Before the model and the first step allocate: each step's large blocks are then reused, not faulted in again.
  bridge::utils::logger().debug("host allocator: {}", bridge::utils::configure_host_allocator().detail);
  ParallelScope scope(config.parallelism);
  config.validate(parallel::get_world_size());
  config.finalize();  // train.train_samples -> train_iters
  scope.initialize_model_parallel(config.parallelism);
  torch::set_num_threads(preflight(config, scope.device()));
  // Megatron's seeds: +100 per pipeline stage for the default stream, +2718 + tp rank for the tensor-parallel one.
  parallel::tensor_parallel::model_parallel_manual_seed(
      config.rng.seed + 100 * static_cast<uint64_t>(parallel::get_pipeline_model_parallel_rank()));

  failure_agreed = false;
  auto setup = std::make_unique<PretrainSetup>();
  setup->config = config;
  setup->device = scope.device();
  setup->state.cfg = &setup->config;
  setup->callbacks = std::move(callbacks);
  // The recipe's built-ins and plugins join the caller's callbacks for this run only.
  struct RecipeCallbacks {
    std::shared_ptr<CallbackManager> manager;
    CallbackManager::Mark before;
    ~RecipeCallbacks() {
      if (manager) manager->remove_since(before);
    }
  } recipe_callbacks;
  if (!config.callbacks.empty()) {
    if (!setup->callbacks) setup->callbacks = std::make_shared<CallbackManager>();
    recipe_callbacks = {setup->callbacks, setup->callbacks->mark()};
    add_callbacks(*setup->callbacks, config.callbacks, parallel::get_rank(), parallel::get_world_size());
  }
  if (setup->callbacks) setup->callbacks->set_rank(parallel::get_rank(), parallel::get_world_size());
  setup->step_fn = std::move(step_fn);
  setup->started = std::chrono::steady_clock::now();
  try {
    return body(*setup);
  } catch (...) {
    report_exception(*setup, std::current_exception());
    if (setup->callbacks) setup->callbacks->flush_observers(std::chrono::seconds(2));  // what they have, briefly
    if (!std::exchange(failure_agreed, false)) scope.tear_down_on_exit();
    throw;
  }
}

}  // namespace

TrainState run_pretrain(const ConfigContainer& user_config, ForwardStepFn step_fn,
                        std::shared_ptr<CallbackManager> callbacks) {
  if (!step_fn) throw std::invalid_argument("pretrain: step_fn is empty; pass gpt_forward_step or your own");
  return in_run(user_config, std::move(step_fn), std::move(callbacks), [](PretrainSetup& setup) {
    if (setup.config.train.exit_signal_handler) {
      setup.exit_signals = std::make_unique<bridge::utils::ExitSignalHandler>();
    }
    build(setup);
    const bool exited = setup.state.train_state.do_train && train(setup) == ControlOutcome::kExit;
    // Signals are acted on at step boundaries only: after the last one, SIGTERM and SIGINT end the process again
    // (the final checkpoint is on disk), rather than being recorded with nobody to look.
    setup.exit_signals.reset();
    if (exited) {
      // Requests made since the exit's agreement (say, in on_checkpoint_save) are dropped, not left in the manager
      // for the next run that reuses it.
      for (const ControlRequest& request : setup.control().take()) {
        bridge::utils::logger().warn("exiting: dropped the request of '{}' to {}: {}", request.callback,
                                     to_string(request.action), request.reason);
      }
    } else {
      if (setup.state.train_state.do_valid) evaluate(setup, /*is_test=*/false, /*after_training=*/true);
      if (setup.state.train_state.do_test) evaluate(setup, /*is_test=*/true, /*after_training=*/true);
      // Requests made after the last step (on_train_end, the final save, evaluation) are acted on too, and none is
      // left behind for the next run that reuses this manager.
      act_on_control_requests(setup, /*training=*/false);
      finalize_checkpoint_save(setup, /*blocking=*/true);
    }
    if (setup.callbacks) setup.callbacks->flush_observers();
    return setup.state.train_state;
  });
}

void with_loaded_run(const ConfigContainer& config, std::shared_ptr<CallbackManager> callbacks,
                     const std::function<void(PretrainSetup&)>& work) {
  in_run(config, ForwardStepFn(), std::move(callbacks), [&work](PretrainSetup& setup) {
    build_model_and_optimizer(setup);
    load_checkpoint(setup);
    work(setup);
    finalize_checkpoint_save(setup, /*blocking=*/true);
    if (setup.callbacks) setup.callbacks->flush_observers();
    return 0;
  });
}

void note_agreed_failure() { failure_agreed = true; }

}  // namespace bridge::training
