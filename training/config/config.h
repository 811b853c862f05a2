// ConfigContainer: everything pretrain() needs, in Megatron-Bridge's sections (model, train, optimizer, scheduler,
// parallelism, ddp, dataset, logging, rng, checkpoint, mixed_precision). validate() checks it all up front, before any
// rank builds anything, and every error names the field and the fix:
//   "train.global_batch_size (30) must be divisible by train.micro_batch_size (4) x data-parallel size (2)".
//
//   ConfigContainer config;
//   config.model.num_layers = 4;
//   config.train.train_iters = 100;
//   config.parallelism.tensor_model_parallel_size = 2;
//   pretrain(config, gpt_forward_step);
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bridge/models/gpt_config.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/process_group.h"
#include "training/data.h"
#include "training/optimizer/optimizer.h"
#include "training/tokenizers/build_tokenizer.h"

namespace bridge::training {

struct ConfigContainer;

struct TrainingConfig {
  int64_t micro_batch_size = 1;
  /// Samples per optimizer step over all data-parallel ranks: micro_batch_size x dp x micro-batches per step.
  int64_t global_batch_size = 1;
  /// Optimizer steps to train; with train_samples, finalize() sets it to train_samples / global_batch_size.
  int64_t train_iters = 0;
  /// Megatron's sample-based training: samples to train instead of train_iters (which must then be 0), and the
  /// scheduler's lengths in samples (SchedulerConfig's *_samples).
  std::optional<int64_t> train_samples;
  /// Evaluate every eval_interval steps during training (0: only after training).
  int64_t eval_interval = 0;
  /// Steps per evaluation; 0 disables validation and test.
  int64_t eval_iters = 0;
  bool skip_train = false;
  /// Fail the run when the gradient norm is NaN or infinite (Megatron's check_for_nan_in_loss_and_grad).
  bool check_for_nan_in_loss_and_grad = true;
  /// Intra-op threads per rank; 0 = the machine's cores divided among the ranks on this node. LibTorch otherwise
  /// defaults to one.
  int num_threads = 0;
  /// On SIGTERM or SIGINT (any rank): every rank saves the same step and pretrain() returns without on_train_end,
  /// as Megatron-Bridge exits on preemption. Caught from setup to the last step; SIGKILL still ends a stuck run.
  bool exit_signal_handler = false;
  /// Save and exit after every step that is a multiple of this.
  std::optional<int64_t> exit_interval;
  /// Save and exit once the run has lasted this long (minutes since pretrain() began, on any rank).
  std::optional<double> exit_duration_in_mins;
};

/// Megatron-Bridge's SchedulerConfig. Lengths are in steps (iteration-based training) or, with train.train_samples,
/// in samples (the *_samples keys); the two kinds do not mix.
struct SchedulerConfig {
  int64_t lr_warmup_iters = 0;
  /// Steps over which the learning rate decays to optimizer.min_lr; 0 = train.train_iters.
  int64_t lr_decay_iters = 0;
  /// Warmup as a share of the decay (lr_decay_iters or lr_decay_samples, warmup included), instead of
  /// lr_warmup_iters / lr_warmup_samples.
  std::optional<double> lr_warmup_fraction;
  /// With train.train_samples: the warmup and the decay in samples; decay 0 = train.train_samples.
  int64_t lr_warmup_samples = 0;
  int64_t lr_decay_samples = 0;
  std::string lr_decay_style = "cosine";  ///< constant, linear, cosine or inverse-square-root
};

/// The scheduler's lengths in samples, which OptimizerParamScheduler counts (it steps by global_batch_size per
/// iteration), as Megatron-Bridge's ConfigContainer computes lr_warmup_steps and lr_decay_steps.
struct SchedulerSteps {
  int64_t warmup = 0;
  int64_t decay = 1;  ///< from step 0, warmup included
};

struct ParallelismConfig {
  int tensor_model_parallel_size = 1;
  /// Ranks each sequence is split over (cp; Megatron-Core's context parallelism): each keeps two of 2 x cp chunks
  /// (the load-balanced split) of every sample and attention exchanges keys and values (model.cp_comm_type). The
  /// world = tp x cp x dp x pp; gradients are averaged over dp x cp.
  int context_parallel_size = 1;
  int pipeline_model_parallel_size = 1;
  /// Model chunks per pipeline rank (interleaved 1F1B); unset for the plain schedule.
  std::optional<int> virtual_pipeline_model_parallel_size;
  /// Interleaved schedule's micro-batch group size; unset = pipeline size (Megatron's default).
  std::optional<int64_t> microbatch_group_size_per_vp_stage;
  /// Ranks the routed experts of an MoE model are spread over (ep); carved out of the data-parallel ranks, as in
  /// Megatron-Core: world = etp x ep x expert-dp x pp.
  int expert_model_parallel_size = 1;
  /// Ranks each routed expert is split over (etp); unset = tensor_model_parallel_size (Megatron's default).
  std::optional<int> expert_tensor_parallel_size;
  /// Collective backend; unset (null, "auto") = nccl when the device is CUDA and LibTorch has NCCL, else gloo. Gloo
  /// also works with CUDA tensors (several ranks sharing one GPU).
  std::optional<parallel::Backend> backend;
  /// Where the model, batches, gradient buffers and pipeline tensors live: "auto" (cuda:LOCAL_RANK when every rank
  /// of the node has a GPU, else cpu), "cuda" (cuda:LOCAL_RANK), "cuda:<index>" or "cpu".
  std::string device = "auto";
  /// How long a collective (and the creation of a process group) may wait for the other ranks; at least
  /// kMinimumTimeout.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  /// How long the start-up rendezvous may wait: reaching MASTER_ADDR:MASTER_PORT, and every rank arriving there.
  /// After it, the ranks that waited name those that never joined. At least kMinimumTimeout.
  std::chrono::milliseconds rendezvous_timeout = std::chrono::minutes(2);
  static constexpr std::chrono::seconds kMinimumTimeout{5};
};

struct DatasetConfig {
  /// Megatron indexed datasets (.bin/.idx path prefixes, Megatron's --data-path) to train on; empty with no
  /// provider = mock data (random tokens) of model.seq_length.
  std::vector<std::string> data_path;
  /// Train/validation/test proportions over the documents of data_path, Megatron's "969,30,1".
  std::string split = "969,30,1";
  /// Where the sample indices are cached; empty = <prefix's folder>/cache/GPTDataset_indices.
  std::string path_to_cache;
  /// Check at startup that every token id of data_path is below model.vocab_size (one read of the .bin files);
  /// null = only when they total at most kValidateTokensAutoBytes.
  std::optional<bool> validate_tokens;
  static constexpr uint64_t kValidateTokensAutoBytes = uint64_t{4} << 30;
  /// Megatron's options for documents packed into samples (training/data.h DocumentMasking): at each
  /// end-of-document token positions restart, attention stops, the next token's loss is dropped.
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;
  /// The end-of-document token those look for; null = the tokenizer's (tokenizer section), else
  /// model.vocab_size - 1 (256 for the byte-level tokenizer, 50256 for GPT-2's).
  std::optional<int64_t> eod_token_id;
  /// A blended dataset builds each of its datasets this fraction beyond its share of the samples (Megatron's
  /// mid_level_dataset_surplus), so that the blend's order never asks one for more than it has.
  double mid_level_dataset_surplus = 0.005;
  /// Builds the train/valid/test datasets from code; overrides data_path.
  std::function<GPTDatasets(const ConfigContainer&)> provider;
};

/// Megatron-Bridge's LoggerConfig: the console line and the metric writers (which live on the last rank).
struct LoggingConfig {
  int64_t log_interval = 1;  ///< print the training log line every this many steps
  /// TensorBoard event files go here (read with `tensorboard --logdir`); empty = no TensorBoard.
  std::string tensorboard_dir;
  /// Metrics as JSON lines ({"step": 10, "lm loss": 2.3, ...}) appended to this file; empty = none.
  std::string jsonl_path;
  int64_t tensorboard_log_interval = 1;  ///< write metrics every this many steps
  bool log_throughput = false;           ///< model TFLOP/s per device on the console line
  bool log_params_norm = false;          ///< the parameters' L2 norm (a collective) on the line and in the writers
  bool log_memory_to_tensorboard = false;
  bool log_l2_norm_grad_to_tensorboard = false;  ///< per-parameter and global gradient norms
  /// Rolling-window throughput (`throughput/*`) and the interval's model TFLOP/s (`throughput/tflops/device`,
  /// `throughput/tflops`) in the writers.
  bool log_throughput_to_tensorboard = false;
  int64_t throughput_window_size = 100;  ///< steps in the rolling throughput window
  bool log_runtime_to_tensorboard = false;
  std::string runtime_time_unit = "hours";  ///< seconds, minutes, hours or days
  bool log_loss_scale_to_tensorboard = true;
  bool log_world_size_to_tensorboard = false;
  /// `iteration-time` (seconds per step over the log interval) in the writers, as Megatron's timers.
  bool log_timers_to_tensorboard = false;
  /// `<loss> validation ppl` (and the test one) beside `<loss> validation` in the writers.
  bool log_validation_ppl_to_tensorboard = false;
};

struct RNGConfig {
  uint64_t seed = 1234;  ///< data order of the mock data, dropout (+100 per pipeline rank, as Megatron)
};

/// Megatron-Bridge's MixedPrecisionConfig (Megatron's --bf16/--fp16 and loss-scale flags). Parameters and compute
/// in bf16 or fp16; fp32 main gradients (grad_reduce_in_fp32) and fp32 master weights in the optimizer; fp16 adds
/// loss scaling. The recipes bf16_mixed / fp16_mixed / fp32 set it as Megatron-Bridge's do
/// (apply_mixed_precision_recipe; YAML `mixed_precision: bf16_mixed`).
struct MixedPrecisionConfig {
  bool bf16 = false;  ///< parameters and compute in bfloat16
  bool fp16 = false;  ///< parameters and compute in float16, with loss scaling
  /// Accumulate and all-reduce the gradients in an fp32 buffer (Megatron's main_grad). Copied into
  /// ddp.grad_reduce_in_fp32 when bf16 or fp16 is on.
  bool grad_reduce_in_fp32 = true;
  /// fp16: a static loss scale; unset = dynamic loss scaling from initial_loss_scale.
  std::optional<double> loss_scale;
  double initial_loss_scale = 4294967296.0;  ///< 2^32
  double min_loss_scale = 1.0;
  int64_t loss_scale_window = 1000;  ///< clean steps before the dynamic scale doubles
  int64_t hysteresis = 2;            ///< overflowing steps tolerated before the scale halves

  bool enabled() const { return bf16 || fp16; }
};

/// Sets `config` to Megatron-Bridge's recipe `name`: "bf16_mixed", "fp16_mixed" or "fp32". Throws
/// std::invalid_argument listing the names otherwise.
void apply_mixed_precision_recipe(MixedPrecisionConfig& config, const std::string& name);

/// Megatron-Bridge's CheckpointConfig. A run resumes from `load` (or, with auto_resume, from `save` when it already
/// holds checkpoints); a checkpoint saved in any parallel layout loads in any other.
struct CheckpointConfig {
  std::string save;           ///< directory for checkpoints; empty = never save
  int64_t save_interval = 0;  ///< save every this many steps (0: only at the end and on request)
  /// Directory to resume from (its latest_checkpointed_iteration.txt, or ckpt_step); empty = nothing (see
  /// auto_resume). A directory without checkpoints starts from scratch, as Megatron does; one that does not exist
  /// is an error (exit 2).
  std::string load;
  /// Load this iteration of `load` instead of the tracker's.
  std::optional<int64_t> ckpt_step;
  /// Weights only (fresh optimizer, scheduler and step 0) from this directory, when nothing else is resumed; or
  /// `hf:<dir>`, a Hugging Face directory of GPT-2 or the Llama family (config.json + safetensors, bridge/hf/).
  std::string pretrained_checkpoint;
  /// Load only the model from `load`: fresh optimizer, scheduler, RNG and counters (Megatron's --finetune).
  bool finetune = false;
  bool no_load_optim = false;  ///< keep a fresh optimizer and grad scaler (the scheduler and step still load)
  bool no_load_rng = false;    ///< keep the RNG streams seeded from rng.seed
  /// With `load` empty and `save` holding checkpoints: resume from `save` (logged). When that checkpoint is damaged,
  /// fall back to the newest complete older one, loudly (the damaged one renamed <iter>.damaged, the tracker moved
  /// to the older one). Off: such a run stops with an error instead of overwriting them.
  bool auto_resume = true;
  /// Keep only the newest this many checkpoints in `save` (older ones are deleted once a new one is complete);
  /// -1 = keep all.
  int64_t most_recent_k = -1;
  /// Write the checkpoint files on a background thread from a snapshot taken at the save step; the checkpoint is
  /// finalised (common.pt, the tracker, then on_checkpoint_save) at a later step boundary, once every rank wrote.
  /// The next save waits for the previous one.
  bool async_save = false;
  /// The on-disk format: "torch_dist" (Megatron-Core's distributed checkpoint: every rank writes its own shards) or
  /// "torch" (Megatron's legacy files, written by data-parallel rank 0). Loading reads either, whatever this says.
  std::string ckpt_format = "torch_dist";
  /// torch_dist: spread the writing of replicated tensors over the ranks holding them (Megatron-Core's fully
  /// parallel save); false: the lowest such rank writes each.
  bool fully_parallel_save = true;
  /// torch_dist: what a load does with tensors the checkpoint holds and the model lacks (Megatron-Core's
  /// StrictHandling): assume_ok_unexpected (ignore them), log_unexpected / log_all (warn), raise_unexpected /
  /// raise_all (refuse), return_unexpected / return_all / ignore_all (ignore). Missing tensors are always refused.
  std::string dist_ckpt_strictness = "assume_ok_unexpected";
  /// torch_dist with the distributed optimizer: save its state in model space, resharded on load along any axis
  /// (Megatron-Core's fully_reshardable); false: each rank's shard of each gradient bucket as it lies
  /// (dp_reshardable: loads only under the same tensor and pipeline layout, any data-parallel size).
  bool dist_ckpt_optim_fully_reshardable = false;
  /// Also write the model as a Hugging Face checkpoint (config.json, model.safetensors, the tokenizer's files) in
  /// each saved iteration's hf/ directory, off the training thread (Megatron-Bridge's also_save_hf_checkpoint).
  bool also_save_hf_checkpoint = false;
};

/// One entry of the `callbacks:` list: a built-in callback (training/callbacks/registry.h) and its options, each as
/// the YAML text it was written as (`3`, `lm loss validation`, `10min`); validate() checks them against the type.
///
///   callbacks:
///     - {type: EarlyStopping, monitor: lm loss validation, patience: 3}
///     - {type: ProgressBar}
struct CallbackConfig {
  std::string type;
  std::map<std::string, std::string> options;
  bool operator==(const CallbackConfig& other) const { return type == other.type && options == other.options; }
};

struct ConfigContainer {
  models::GPTConfig model;
  TrainingConfig train;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  ParallelismConfig parallelism;
  parallel::distributed::DistributedDataParallelConfig ddp;
  DatasetConfig dataset;
  LoggingConfig logging;
  RNGConfig rng;
  CheckpointConfig checkpoint;
  MixedPrecisionConfig mixed_precision;
  /// Megatron-Bridge's tokenizer section: the tokenizer the data was prepared with. Set, it decides model.vocab_size,
  /// dataset.eod_token_id and the TextGenerator's tokenizer (setup_tokenizer, training/tokenizer_setup.h); empty
  /// tokenizer_type = none (token ids are read as they are).
  tokenizers::TokenizerConfig tokenizer;
  /// Built-in callbacks pretrain() adds to its callbacks, after the caller's, in list order.
  std::vector<CallbackConfig> callbacks;

  /// Checks every section for a job of `world_size` ranks; throws std::invalid_argument naming the field.
  void validate(int world_size) const;
  /// Sets what Megatron-Bridge derives from the keys as written: train.train_iters = train.train_samples /
  /// global_batch_size with sample-based training. pretrain() calls it once, after validate() (which refuses
  /// train_iters and train_samples both set, so a finalized sample-based config no longer validates).
  void finalize();
  /// The scheduler's warmup and decay in samples: lr_warmup_fraction x decay, or lr_warmup_iters x
  /// global_batch_size (lr_warmup_samples); decay lr_decay_iters (train_iters) x global_batch_size (lr_decay_samples,
  /// train_samples); the decay lasts at least one step beyond the warmup.
  SchedulerSteps scheduler_steps() const;
  /// world_size / (tp x cp x pp).
  int data_parallel_size(int world_size) const;
  /// global_batch_size / (micro_batch_size x dp).
  int64_t num_microbatches(int world_size) const;
};

}  // namespace bridge::training
