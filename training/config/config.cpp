// ConfigContainer validation: all of it before anything is built, each error naming the field and the fix.
#include "training/config/config.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "training/callbacks/registry.h"
#include "training/datasets/gpt_dataset.h"
#include "training/optimizer/optimizer_param_scheduler.h"
#include "utils/check.h"

namespace bridge::training {
namespace {

using utils::checked_product;
using utils::require;

std::string str(int64_t value) { return std::to_string(value); }

}  // namespace

void apply_mixed_precision_recipe(MixedPrecisionConfig& config, const std::string& name) {
  MixedPrecisionConfig recipe;  // the defaults: fp32
  // Megatron-Bridge registers each recipe under both spellings.
  if (name == "bf16_mixed" || name == "bf16-mixed") {
    recipe.bf16 = true;
    recipe.grad_reduce_in_fp32 = true;
  } else if (name == "fp16_mixed" || name == "fp16-mixed") {
    recipe.fp16 = true;
    recipe.grad_reduce_in_fp32 = false;  // as Megatron-Bridge's fp16_mixed
  } else if (name != "fp32") {
    throw std::invalid_argument("mixed_precision: unknown recipe '" + name +
                                "'; use bf16_mixed, fp16_mixed or fp32, or set mixed_precision.bf16 / .fp16");
  }
  config = recipe;
}

int ConfigContainer::data_parallel_size(int world_size) const {
  return world_size / (parallelism.tensor_model_parallel_size * parallelism.context_parallel_size *
                       parallelism.pipeline_model_parallel_size);
}

int64_t ConfigContainer::num_microbatches(int world_size) const {
  return train.global_batch_size / (train.micro_batch_size * data_parallel_size(world_size));
}

namespace {

// Megatron-Bridge's two switches of the distributed optimizer must agree.
void validate_distributed_optimizer(const ConfigContainer& config) {
  const bool on = config.optimizer.use_distributed_optimizer;
  if (on != config.ddp.use_distributed_optimizer) {
    throw std::invalid_argument("optimizer.use_distributed_optimizer and ddp.use_distributed_optimizer differ (" +
                                std::string(on ? "true" : "false") + " and " +
                                std::string(config.ddp.use_distributed_optimizer ? "true" : "false") +
                                "); set both, as Megatron-Bridge requires");
  }
  if (config.ddp.overlap_param_gather && !on) {
    throw std::invalid_argument(
        "ddp.overlap_param_gather is true without the distributed optimizer: only it all-gathers parameters after the "
        "step. Set optimizer.use_distributed_optimizer and ddp.use_distributed_optimizer to true, or "
        "ddp.overlap_param_gather to false");
  }
}

// Megatron-Bridge's two kinds of schedule (its _validate_training_scheduler_compatibility): iteration-based keys with
// train.train_iters, sample-based ones with train.train_samples, never mixed; the warmup as a fraction or a length.
void validate_schedule(const ConfigContainer& config) {
  const TrainingConfig& t = config.train;
  const SchedulerConfig& s = config.scheduler;
  require(s.lr_warmup_iters >= 0, "scheduler.lr_warmup_iters must be >= 0, got " + str(s.lr_warmup_iters));
  require(s.lr_decay_iters >= 0,
          "scheduler.lr_decay_iters must be >= 0 (0: train.train_iters), got " + str(s.lr_decay_iters));
  require(s.lr_warmup_samples >= 0, "scheduler.lr_warmup_samples must be >= 0, got " + str(s.lr_warmup_samples));
  require(s.lr_decay_samples >= 0,
          "scheduler.lr_decay_samples must be >= 0 (0: train.train_samples), got " + str(s.lr_decay_samples));
  if (s.lr_warmup_fraction) {
    require(std::isfinite(*s.lr_warmup_fraction) && *s.lr_warmup_fraction >= 0.0 && *s.lr_warmup_fraction <= 1.0,
            "scheduler.lr_warmup_fraction must be in [0, 1] (a share of the decay), got " +
                std::to_string(*s.lr_warmup_fraction));
  }
  if (t.train_samples) {
    require(*t.train_samples >= t.global_batch_size,
            "train.train_samples (" + str(*t.train_samples) + ") must be at least train.global_batch_size (" +
                str(t.global_batch_size) + "): training runs train_samples / global_batch_size steps");
    require(t.train_iters == 0, "train.train_iters (" + str(t.train_iters) + ") and train.train_samples (" +
                                    str(*t.train_samples) +
                                    ") are both set; keep one, unsetting the other (~train.train_iters or "
                                    "~train.train_samples), as Megatron-Bridge requires");
  }
  // The schedule's lengths, each counted in iterations or in samples: one of the other kind is an error naming the key
  // that decides the kind and the key to use instead, and a warmup fraction replaces the warmup length.
  struct Length {
    const char* key;
    int64_t value;
    bool counts_samples;
    bool is_warmup;
    const char* instead;
  };
  const bool sample_based = t.train_samples.has_value();
  for (const Length& length :
       {Length{"scheduler.lr_decay_iters", s.lr_decay_iters, false, false, "scheduler.lr_decay_samples"},
        Length{"scheduler.lr_warmup_iters", s.lr_warmup_iters, false, true,
               "scheduler.lr_warmup_samples or scheduler.lr_warmup_fraction"},
        Length{"scheduler.lr_decay_samples", s.lr_decay_samples, true, false, "scheduler.lr_decay_iters"},
        Length{"scheduler.lr_warmup_samples", s.lr_warmup_samples, true, true,
               "scheduler.lr_warmup_iters or scheduler.lr_warmup_fraction"}}) {
    if (length.value == 0) continue;
    const std::string key = length.key;
    if (length.counts_samples != sample_based) {
      const std::string why = sample_based
                                  ? ") counts iterations, but train.train_samples makes the schedule "
                                    "sample-based; use "
                                  : ") counts samples, but the schedule is iteration-based (train.train_samples "
                                    "is not set); set train.train_samples instead of train.train_iters, or use ";
      throw std::invalid_argument(key + " (" + str(length.value) + why + length.instead + " and unset it (~" + key +
                                  ")");
    }
    require(!length.is_warmup || !s.lr_warmup_fraction,
            "scheduler.lr_warmup_fraction and " + key + " (" + str(length.value) + ") are both set; keep one");
  }
}

}  // namespace

void ConfigContainer::finalize() {
  if (train.train_samples) train.train_iters = *train.train_samples / train.global_batch_size;
}

SchedulerSteps ConfigContainer::scheduler_steps() const {
  const int64_t batch = train.global_batch_size;
  const SchedulerConfig& s = scheduler;
  SchedulerSteps steps;
  if (train.train_samples) {
    steps.decay = s.lr_decay_samples > 0 ? s.lr_decay_samples : *train.train_samples;
    steps.warmup = s.lr_warmup_samples;
  } else {
    steps.decay = (s.lr_decay_iters > 0 ? s.lr_decay_iters : train.train_iters) * batch;
    steps.warmup = s.lr_warmup_iters * batch;
  }
  // Megatron-Bridge's lr_warmup_steps = lr_warmup_fraction x lr_decay_steps, here in whole samples.
  if (s.lr_warmup_fraction) {
    steps.warmup = static_cast<int64_t>(*s.lr_warmup_fraction * static_cast<double>(steps.decay));
  }
  // A decay shorter than the warmup (a short run of a long recipe) would never start: it ends a step after it.
  steps.decay = std::max({steps.decay, steps.warmup + batch, batch});
  return steps;
}

void ConfigContainer::validate(int world_size) const {
  const ParallelismConfig& p = parallelism;
  require(p.tensor_model_parallel_size >= 1,
          "parallelism.tensor_model_parallel_size must be >= 1, got " + str(p.tensor_model_parallel_size));
  require(p.pipeline_model_parallel_size >= 1,
          "parallelism.pipeline_model_parallel_size must be >= 1, got " + str(p.pipeline_model_parallel_size));
  require(p.context_parallel_size >= 1,
          "parallelism.context_parallel_size must be >= 1, got " + str(p.context_parallel_size));
  const int64_t model_parallel =
      int64_t{p.tensor_model_parallel_size} * p.context_parallel_size * p.pipeline_model_parallel_size;
  require(world_size % model_parallel == 0,
          "the world size (" + str(world_size) +
              ") must be divisible by parallelism.tensor_model_parallel_size x parallelism.context_parallel_size x "
              "parallelism.pipeline_model_parallel_size (" +
              str(model_parallel) + "); launch a multiple of " + str(model_parallel) + " ranks or change the sizes");
  require(p.expert_model_parallel_size >= 1,
          "parallelism.expert_model_parallel_size must be >= 1, got " + str(p.expert_model_parallel_size));
  const int64_t etp = p.expert_tensor_parallel_size.value_or(p.tensor_model_parallel_size);
  require(etp >= 1,
          "parallelism.expert_tensor_parallel_size must be >= 1 (null = the tensor-parallel size), got " + str(etp));
  const int64_t expert_parallel = etp * p.expert_model_parallel_size * p.pipeline_model_parallel_size;
  require(world_size % expert_parallel == 0,
          "the world size (" + str(world_size) + ") must be divisible by parallelism.expert_tensor_parallel_size (" +
              str(etp) + ") x parallelism.expert_model_parallel_size (" + str(p.expert_model_parallel_size) +
              ") x parallelism.pipeline_model_parallel_size (" + str(p.pipeline_model_parallel_size) +
              "); launch a "
              "multiple of " +
              str(expert_parallel) + " ranks or change the sizes" +
              (p.expert_tensor_parallel_size ? ""
                                             : " (expert_tensor_parallel_size defaults to the tensor-parallel size; "
                                               "set it to 1 to keep experts whole)"));
  if (p.virtual_pipeline_model_parallel_size) {
    require(*p.virtual_pipeline_model_parallel_size >= 2,
            "parallelism.virtual_pipeline_model_parallel_size must be >= 2 when set (unset it for the plain 1F1B "
            "schedule), got " +
                str(*p.virtual_pipeline_model_parallel_size));
    require(p.pipeline_model_parallel_size >= 2,
            "parallelism.virtual_pipeline_model_parallel_size needs parallelism.pipeline_model_parallel_size >= 2");
  }
  require(p.timeout >= ParallelismConfig::kMinimumTimeout,
          "parallelism.timeout must be at least " + str(ParallelismConfig::kMinimumTimeout.count()) + " s, got " +
              str(p.timeout.count()) +
              " ms: starting every rank and their rendezvous take seconds, so a shorter timeout fails a healthy job "
              "(a rank that dies is detected at once by its closed connection, whatever the timeout)");
  require(p.rendezvous_timeout >= ParallelismConfig::kMinimumTimeout,
          "parallelism.rendezvous_timeout must be at least " + str(ParallelismConfig::kMinimumTimeout.count()) +
              " s, got " + str(p.rendezvous_timeout.count()) +
              " ms: starting every rank takes seconds, so a shorter limit fails a healthy job");

  const TrainingConfig& t = train;
  require(t.micro_batch_size >= 1, "train.micro_batch_size must be >= 1, got " + str(t.micro_batch_size));
  const int64_t dp = data_parallel_size(world_size);
  checked_product({{"train.micro_batch_size", t.micro_batch_size}, {"the data-parallel size", dp}},
                  "the samples of one micro-batch over every data-parallel rank");
  require(t.global_batch_size >= 1 && t.global_batch_size % (t.micro_batch_size * dp) == 0,
          "train.global_batch_size (" + str(t.global_batch_size) +
              ") must be a positive multiple of "
              "train.micro_batch_size (" +
              str(t.micro_batch_size) + ") x data-parallel size (" + str(dp) + ")");
  require(t.train_iters >= 0, "train.train_iters must be >= 0, got " + str(t.train_iters));
  validate_schedule(*this);
  require(t.eval_interval >= 0,
          "train.eval_interval must be >= 0 (0: evaluate only after training), got " + str(t.eval_interval));
  require(t.eval_iters >= 0, "train.eval_iters must be >= 0, got " + str(t.eval_iters));
  require(t.num_threads >= 0, "train.num_threads must be >= 0 (0: automatic), got " + str(t.num_threads));
  if (p.virtual_pipeline_model_parallel_size) {
    const int64_t m = num_microbatches(world_size);
    const int64_t group = p.microbatch_group_size_per_vp_stage.value_or(p.pipeline_model_parallel_size);
    require(group >= p.pipeline_model_parallel_size && group <= m,
            "the interleaved schedule needs parallelism.pipeline_model_parallel_size <= micro-batch group size (" +
                str(group) + ") <= micro-batches per step (" + str(m) + "); raise train.global_batch_size");
    require(m % group == 0 || m % group >= p.pipeline_model_parallel_size,
            "micro-batches per step (" + str(m) + ") % micro-batch group size (" + str(group) +
                ") must be 0 or >= the pipeline size, or the interleaved schedule stalls on dependency bubbles");
  }

  // The counters and tensors these sizes make, named here rather than overflowing inside the run.
  // With train.train_samples the run's steps are train_samples / global_batch_size (finalize()).
  const int64_t iterations = t.train_samples ? *t.train_samples / t.global_batch_size : t.train_iters;
  checked_product({{"train.train_iters", t.train_iters}, {"train.global_batch_size", t.global_batch_size}},
                  "the samples consumed by training");
  checked_product({{"train.eval_iters", t.eval_iters},
                   {"train.global_batch_size", t.global_batch_size},
                   {"the training steps", std::max<int64_t>(1, iterations)}},
                  "the samples consumed by every evaluation of the run");
  checked_product(
      {{"scheduler.lr_warmup_iters", scheduler.lr_warmup_iters}, {"train.global_batch_size", t.global_batch_size}},
      "the scheduler's warm-up, counted in samples");
  checked_product(
      {{"scheduler.lr_decay_iters", scheduler.lr_decay_iters}, {"train.global_batch_size", t.global_batch_size}},
      "the scheduler's decay, counted in samples");
  checked_product({{"model.seq_length", model.seq_length},
                   {"train.micro_batch_size", t.micro_batch_size},
                   {"model.hidden_size", model.hidden_size}},
                  "the activations of one micro-batch");
  checked_product({{"model.seq_length", model.seq_length},
                   {"train.micro_batch_size", t.micro_batch_size},
                   {"model.vocab_size", model.vocab_size}},
                  "the logits of one micro-batch");
  require(ddp.bucket_size >= 0, "ddp.bucket_size must be >= 0 (0: Megatron's default), got " + str(ddp.bucket_size));
  model.validate(p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.virtual_pipeline_model_parallel_size,
                 p.expert_model_parallel_size, p.expert_tensor_parallel_size.value_or(0), p.context_parallel_size);
  // Megatron-Core's context parallelism takes per-document masks only in the packed THD format, which bridge's
  // batches ([b, s] with an [s, s] mask) are not: a document mask of the whole sequence cannot be split in two chunks.
  require(p.context_parallel_size == 1 || !dataset.reset_attention_mask,
          "dataset.reset_attention_mask (document attention masks) is on with parallelism.context_parallel_size " +
              str(p.context_parallel_size) +
              ": the context-parallel attention is causal over the whole sequence (Megatron-Core needs packed THD "
              "sequences for per-document masks under context parallelism); set dataset.reset_attention_mask: false "
              "or context_parallel_size: 1");
  optimizer.validate();
  validate_distributed_optimizer(*this);
  try {
    parse_lr_decay_style(scheduler.lr_decay_style);
  } catch (const std::invalid_argument& error) {
    throw std::invalid_argument(std::string("scheduler.") + error.what());
  }
  require(logging.log_interval >= 1, "logging.log_interval must be >= 1, got " + str(logging.log_interval));
  require(logging.tensorboard_log_interval >= 1,
          "logging.tensorboard_log_interval must be >= 1, got " + str(logging.tensorboard_log_interval));
  require(logging.throughput_window_size >= 2,
          "logging.throughput_window_size must be >= 2 (a rate needs two timestamps), got " +
              str(logging.throughput_window_size));
  const std::string& unit = logging.runtime_time_unit;
  require(unit == "seconds" || unit == "minutes" || unit == "hours" || unit == "days",
          "logging.runtime_time_unit must be seconds, minutes, hours or days, got '" + unit + "'");
  require(!train.exit_interval || *train.exit_interval >= 1,
          "train.exit_interval must be >= 1 when set (null = never), got " + str(train.exit_interval.value_or(0)));
  require(!train.exit_duration_in_mins ||
              (std::isfinite(*train.exit_duration_in_mins) && *train.exit_duration_in_mins >= 0.0),
          "train.exit_duration_in_mins must be finite and >= 0 when set (null = no limit), got " +
              std::to_string(train.exit_duration_in_mins.value_or(0.0)));
  require(checkpoint.save_interval >= 0, "checkpoint.save_interval must be >= 0, got " + str(checkpoint.save_interval));
  require(checkpoint.save_interval == 0 || !checkpoint.save.empty(),
          "checkpoint.save_interval is set but checkpoint.save (the directory) is empty; set both or neither");
  require(!checkpoint.ckpt_step || *checkpoint.ckpt_step >= 0,
          "checkpoint.ckpt_step must be >= 0, got " + str(checkpoint.ckpt_step.value_or(0)));
  require(!checkpoint.ckpt_step || !checkpoint.load.empty(),
          "checkpoint.ckpt_step is set but checkpoint.load is empty; set checkpoint.load to the directory holding "
          "iteration " +
              str(checkpoint.ckpt_step.value_or(0)));
  require(!checkpoint.finetune || !checkpoint.load.empty() || !checkpoint.pretrained_checkpoint.empty(),
          "checkpoint.finetune is set but neither checkpoint.load nor checkpoint.pretrained_checkpoint is; set the "
          "directory to take the weights from");
  require(checkpoint.ckpt_format == "torch_dist" || checkpoint.ckpt_format == "torch",
          "checkpoint.ckpt_format must be torch_dist (Megatron-Core's distributed checkpoint) or torch (Megatron's "
          "legacy files), got '" +
              checkpoint.ckpt_format + "'");
  {
    static const char* const kStrictness[] = {"assume_ok_unexpected", "log_unexpected", "log_all",
                                              "raise_unexpected",     "raise_all",      "return_unexpected",
                                              "return_all",           "ignore_all"};
    bool known = false;
    for (const char* value : kStrictness) known = known || checkpoint.dist_ckpt_strictness == value;
    require(known,
            "checkpoint.dist_ckpt_strictness must be one of Megatron-Core's StrictHandling values "
            "(assume_ok_unexpected, log_unexpected, log_all, raise_unexpected, raise_all, return_unexpected, "
            "return_all, ignore_all), got '" +
                checkpoint.dist_ckpt_strictness + "'");
  }
  require(checkpoint.most_recent_k == -1 || checkpoint.most_recent_k >= 1,
          "checkpoint.most_recent_k must be -1 (keep all) or >= 1, got " + str(checkpoint.most_recent_k));
  const MixedPrecisionConfig& mp = mixed_precision;
  require(!(mp.bf16 && mp.fp16), "mixed_precision.bf16 and mixed_precision.fp16 are both true; choose one");
  if (mp.loss_scale) {
    require(std::isfinite(*mp.loss_scale) && *mp.loss_scale > 0,
            "mixed_precision.loss_scale must be finite and > 0 when set (unset = dynamic loss scaling)");
  }
  require(std::isfinite(mp.initial_loss_scale) && mp.min_loss_scale > 0 && mp.min_loss_scale <= mp.initial_loss_scale,
          "mixed_precision needs 0 < min_loss_scale <= initial_loss_scale, both finite (Megatron: 1 and 2^32)");
  require(mp.loss_scale_window >= 1,
          "mixed_precision.loss_scale_window must be >= 1, got " + str(mp.loss_scale_window));
  require(mp.hysteresis >= 1, "mixed_precision.hysteresis must be >= 1, got " + str(mp.hysteresis));
  if (dataset.eod_token_id) {
    require(*dataset.eod_token_id >= 0 && *dataset.eod_token_id < model.vocab_size,
            "dataset.eod_token_id (" + str(*dataset.eod_token_id) + ") must be a token id below model.vocab_size (" +
                str(model.vocab_size) + "), or null for model.vocab_size - 1");
  }
  require(std::isfinite(dataset.mid_level_dataset_surplus) && dataset.mid_level_dataset_surplus >= 0.0 &&
              dataset.mid_level_dataset_surplus <= 1.0,
          "dataset.mid_level_dataset_surplus must be in [0, 1] (Megatron's default: 0.005)");
  if (!dataset.data_path.empty() && !dataset.provider) {
    datasets::parse_split(dataset.split);  // throws naming dataset.split
    require(rng.seed <= 0xFFFFFFFFULL, "rng.seed (" + std::to_string(rng.seed) +
                                           ") must be below 2^32 with dataset.data_path: Megatron's sample order comes "
                                           "from NumPy's RandomState(seed)");
  }
  if (!tokenizer.tokenizer_type.empty()) {
    tokenizers::validate_tokenizer_config(tokenizer, "tokenizer.");
  } else {
    // Without a type the tokenizer's fields would be ignored; Megatron-Bridge's tokenizer.vocab_size, once a rename
    // of model.vocab_size here, is the NullTokenizer's.
    for (const std::string& name : tokenizers::given_tokenizer_fields(tokenizer)) {
      require(false, "tokenizer." + name +
                         " is set but tokenizer.tokenizer_type is not; name the tokenizer (e.g. tokenizer_type: "
                         "NullTokenizer with vocab_size, HuggingFaceTokenizer with tokenizer_model), or set "
                         "model.vocab_size for data without one");
    }
  }
  for (std::size_t i = 0; i < callbacks.size(); ++i) {
    validate_callback_config(callbacks[i], "callbacks[" + std::to_string(i) + "]");
  }
}

}  // namespace bridge::training
