// The key table behind YAML recipes, overrides, --print-config and the key reference: each row binds a dotted key
// to a ConfigContainer member through member pointers, with a codec per C++ type that parses a YAML node and emits
// the value back, so every path reads and writes the same fields the same way.
#include "training/config_yaml.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <system_error>
#include <utility>

#include "training/callbacks/registry.h"
#include "training/megatron_bridge_keys.h"
#include "utils/closest_match.h"
#include "utils/strings.h"

namespace bridge::training {
namespace {

using std::chrono::milliseconds;

// ---- Codecs: one per C++ type; parse returns nullopt when the node is not of the type. ----

using bridge::utils::to_lower;
using bridge::utils::trim;

// A plain (unquoted) YAML null: `key:`, `key: null`, `key: ~`. A quoted "null" is the string.
bool is_null(const YAML::Node& node) { return !node.IsDefined() || node.IsNull(); }

template <class Number>
std::optional<Number> parse_number(const YAML::Node& node) {
  if (!node.IsScalar()) return std::nullopt;
  std::string_view text = trim(node.Scalar());
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  Number value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

template <class T>
struct Codec;

template <>
struct Codec<int64_t> {
  static std::string type() { return "int"; }
  static std::optional<int64_t> parse(const YAML::Node& node) { return parse_number<int64_t>(node); }
  static void emit(YAML::Emitter& out, int64_t value) { out << std::to_string(value); }
};

template <>
struct Codec<int> {
  static std::string type() { return "int"; }
  static std::optional<int> parse(const YAML::Node& node) { return parse_number<int>(node); }
  static void emit(YAML::Emitter& out, int value) { out << std::to_string(value); }
};

template <>
struct Codec<uint64_t> {
  static std::string type() { return "unsigned int"; }
  static std::optional<uint64_t> parse(const YAML::Node& node) { return parse_number<uint64_t>(node); }
  static void emit(YAML::Emitter& out, uint64_t value) { out << std::to_string(value); }
};

template <>
struct Codec<double> {
  static std::string type() { return "float"; }
  static std::optional<double> parse(const YAML::Node& node) { return parse_number<double>(node); }
  static void emit(YAML::Emitter& out, double value) {
    char text[32];
    // The shortest text that reads back as the same double, so to_yaml round-trips exactly.
    const auto result = std::to_chars(text, text + sizeof(text), value);
    out << std::string(text, result.ptr);
  }
};

template <>
struct Codec<bool> {
  static std::string type() { return "bool"; }
  static std::optional<bool> parse(const YAML::Node& node) {
    if (!node.IsScalar()) return std::nullopt;
    const std::string text = to_lower(trim(node.Scalar()));
    if (text == "true" || text == "yes" || text == "on") return true;
    if (text == "false" || text == "no" || text == "off") return false;
    return std::nullopt;
  }
  static void emit(YAML::Emitter& out, bool value) { out << (value ? "true" : "false"); }
};

template <>
struct Codec<std::string> {
  static std::string type() { return "string"; }
  static std::optional<std::string> parse(const YAML::Node& node) {
    if (is_null(node)) return std::string();  // `save:` or `save: null` clears the field
    if (!node.IsScalar()) return std::nullopt;
    return node.Scalar();
  }
  static void emit(YAML::Emitter& out, const std::string& value) { out << value; }
};

template <class T>
struct Codec<std::vector<T>> {
  static std::string type() { return "list of " + Codec<T>::type() + "s"; }
  static std::optional<std::vector<T>> parse(const YAML::Node& node) {
    if (is_null(node)) return std::vector<T>();
    if (node.IsScalar()) {  // one item needs no brackets
      std::optional<T> item = Codec<T>::parse(node);
      if (!item) return std::nullopt;
      return std::vector<T>{std::move(*item)};
    }
    if (!node.IsSequence()) return std::nullopt;
    std::vector<T> items;
    for (const YAML::Node& node_item : node) {
      if (!node_item.IsScalar()) return std::nullopt;
      std::optional<T> item = Codec<T>::parse(node_item);
      if (!item) return std::nullopt;
      items.push_back(std::move(*item));
    }
    return items;
  }
  static void emit(YAML::Emitter& out, const std::vector<T>& value) {
    out << YAML::Flow << YAML::BeginSeq;
    for (const T& item : value) Codec<T>::emit(out, item);
    out << YAML::EndSeq;
  }
};

template <class T>
struct Codec<std::optional<T>> {
  static std::string type() { return Codec<T>::type() + " or null"; }
  static std::optional<std::optional<T>> parse(const YAML::Node& node) {
    if (is_null(node)) return std::optional<T>();
    std::optional<T> value = Codec<T>::parse(node);
    if (!value) return std::nullopt;
    return value;
  }
  static void emit(YAML::Emitter& out, const std::optional<T>& value) {
    if (value) {
      Codec<T>::emit(out, *value);
    } else {
      out << YAML::Null;
    }
  }
};

struct DurationUnit {
  std::string_view name;
  int64_t milliseconds;
};
// Largest first: emit() picks the largest unit that divides the value.
constexpr DurationUnit kDurationUnits[] = {{"h", 3'600'000}, {"min", 60'000}, {"s", 1'000}, {"ms", 1}};

template <>
struct Codec<milliseconds> {
  static std::string type() { return "duration"; }
  static std::optional<milliseconds> parse(const YAML::Node& node) {
    if (!node.IsScalar()) return std::nullopt;
    const std::string_view text = trim(node.Scalar());
    const std::size_t split = text.find_first_not_of("0123456789.");
    if (split == 0 || split == std::string_view::npos) return std::nullopt;  // a bare number has no unit
    double amount = 0.0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + split, amount);
    if (error != std::errc() || end != text.data() + split) return std::nullopt;
    const std::string unit = to_lower(trim(text.substr(split)));
    for (const DurationUnit& candidate : kDurationUnits) {
      if (unit != candidate.name && !(unit == "m" && candidate.name == "min")) continue;
      const double ms = amount * static_cast<double>(candidate.milliseconds);
      if (ms != static_cast<double>(static_cast<int64_t>(ms))) return std::nullopt;  // below a millisecond
      return milliseconds(static_cast<int64_t>(ms));
    }
    return std::nullopt;
  }
  static void emit(YAML::Emitter& out, milliseconds value) {
    for (const DurationUnit& unit : kDurationUnits) {
      if (value.count() % unit.milliseconds == 0) {
        out << std::to_string(value.count() / unit.milliseconds) + std::string(unit.name);
        return;
      }
    }
  }
};

constexpr parallel::Backend kBackends[] = {parallel::Backend::kGloo, parallel::Backend::kNccl};

template <>
struct Codec<parallel::Backend> {
  static std::string type() {
    std::vector<std::string_view> names;
    for (parallel::Backend backend : kBackends) names.push_back(parallel::to_string(backend));
    return utils::join(names, " or ");
  }
  static std::optional<parallel::Backend> parse(const YAML::Node& node) {
    if (!node.IsScalar()) return std::nullopt;
    const std::string text = to_lower(trim(node.Scalar()));
    for (parallel::Backend backend : kBackends) {
      if (text == parallel::to_string(backend)) return backend;
    }
    return std::nullopt;
  }
  static void emit(YAML::Emitter& out, parallel::Backend value) { out << std::string(parallel::to_string(value)); }
};

// Megatron-Core's AttnBackend names, reduced to the two bridge has.
constexpr std::pair<models::AttnBackend, std::string_view> kAttnBackends[] = {
    {models::AttnBackend::kAuto, "auto"}, {models::AttnBackend::kUnfused, "unfused"}};

template <>
struct Codec<models::AttnBackend> {
  static std::string type() { return "auto or unfused"; }
  static std::optional<models::AttnBackend> parse(const YAML::Node& node) {
    if (!node.IsScalar()) return std::nullopt;
    const std::string text = to_lower(trim(node.Scalar()));
    for (const auto& [backend, name] : kAttnBackends) {
      if (text == name) return backend;
    }
    return std::nullopt;
  }
  static void emit(YAML::Emitter& out, models::AttnBackend value) {
    for (const auto& [backend, name] : kAttnBackends) {
      if (value == backend) out << std::string(name);
    }
  }
};

// Megatron-Core's activation names for the two GeLUs. Megatron-Bridge's YAML dumps write the function as
// {_target_: torch.nn.functional.gelu, _call_: false}: its last name is read.
constexpr std::pair<models::ActivationFunc, std::string_view> kActivations[] = {
    {models::ActivationFunc::kGelu, "gelu"},
    {models::ActivationFunc::kOpenaiGelu, "openai_gelu"},
    {models::ActivationFunc::kOpenaiGelu, "fast_gelu"}};

template <>
struct Codec<models::ActivationFunc> {
  static std::string type() { return "gelu or openai_gelu"; }
  static std::optional<models::ActivationFunc> parse(const YAML::Node& node) {
    std::string text;
    if (node.IsMap() && node["_target_"] && node["_target_"].IsScalar()) {
      text = node["_target_"].Scalar();
      text = text.substr(text.rfind('.') + 1);
    } else if (node.IsScalar()) {
      text = to_lower(trim(node.Scalar()));
    } else {
      return std::nullopt;
    }
    for (const auto& [activation, name] : kActivations) {
      if (text == name) return activation;
    }
    return std::nullopt;
  }
  static void emit(YAML::Emitter& out, models::ActivationFunc value) {
    for (const auto& [activation, name] : kActivations) {
      if (value == activation) {
        out << std::string(name);
        return;
      }
    }
  }
};

// ---- The callbacks list ----

// Options keep the YAML text they were written as: a scalar as it reads, anything else in flow style.
std::string yaml_text(const YAML::Node& node) {
  // A quoted scalar ("null", "3", "a: b") stays quoted, so that reading the text again gives the same string.
  if (node.IsScalar() && node.Tag() == "!") {
    YAML::Emitter out;
    out << YAML::DoubleQuoted << node.Scalar();
    return out.c_str();
  }
  if (node.IsScalar()) return node.Scalar();
  YAML::Emitter out;
  out.SetNullFormat(YAML::LowerNull);
  out << YAML::Flow << node;
  return out.c_str();
}

// ---- The table ----

struct Field {
  std::string key;
  std::string type;
  std::string doc;
  std::function<void(YAML::Emitter&, const ConfigContainer&)> emit;
  /// false when the node is not of the field's type (the config is then unchanged).
  std::function<bool(ConfigContainer&, const YAML::Node&)> parse;
  /// Sets the field back to its default.
  std::function<void(ConfigContainer&)> reset;
  /// Whether a YAML null is one of its values (optionals, strings, lists); elsewhere null means the default.
  bool takes_null = false;
};

template <class Section, class T>
Field field(std::string key, Section ConfigContainer::*section, T Section::*member, std::string doc) {
  return Field{std::move(key),
               Codec<T>::type(),
               std::move(doc),
               [section, member](YAML::Emitter& out, const ConfigContainer& config) {
                 Codec<T>::emit(out, (config.*section).*member);
               },
               [section, member](ConfigContainer& config, const YAML::Node& node) {
                 std::optional<T> value = Codec<T>::parse(node);
                 if (!value) return false;
                 (config.*section).*member = std::move(*value);
                 return true;
               },
               [section, member](ConfigContainer& config) {
                 static const ConfigContainer defaults;
                 (config.*section).*member = (defaults.*section).*member;
               },
               Codec<T>::parse(YAML::Node(YAML::NodeType::Null)).has_value()};
}

using C = ConfigContainer;
using models::GPTConfig;
using parallel::distributed::DistributedDataParallelConfig;

// Every user-settable field of ConfigContainer, in the order of config.h. A field added there belongs here too
// (config_yaml_test compares this table with the members declared in the headers).
const std::vector<Field>& fields() {
  static const std::vector<Field> table = {
      field("model.num_layers", &C::model, &GPTConfig::num_layers, "Transformer layers."),
      field("model.hidden_size", &C::model, &GPTConfig::hidden_size, "Width of the residual stream."),
      field("model.num_attention_heads", &C::model, &GPTConfig::num_attention_heads,
            "Attention heads; divides model.hidden_size and parallelism.tensor_model_parallel_size divides it."),
      field("model.ffn_hidden_size", &C::model, &GPTConfig::ffn_hidden_size, "MLP width; 0 = 4 x model.hidden_size."),
      field("model.vocab_size", &C::model, &GPTConfig::vocab_size,
            "Tokenizer vocabulary (257 for the byte-level tokenizer with its end-of-document token, 50257 for GPT-2)."),
      field("model.make_vocab_size_divisible_by", &C::model, &GPTConfig::make_vocab_size_divisible_by,
            "The embedding is padded to a multiple of this x the tensor-parallel size."),
      field("model.seq_length", &C::model, &GPTConfig::seq_length, "Tokens per sample (and positions embedded)."),
      field("model.hidden_dropout", &C::model, &GPTConfig::hidden_dropout, "Dropout after attention and MLP."),
      field("model.attention_dropout", &C::model, &GPTConfig::attention_dropout, "Dropout on attention weights."),
      field("model.attention_backend", &C::model, &GPTConfig::attention_backend,
            "auto = scaled_dot_product_attention on LibTorch 2.x; unfused = explicit softmax(QK^T)V."),
      field("model.activation_func", &C::model, &GPTConfig::activation_func,
            "The MLP's GeLU: gelu (exact erf) or openai_gelu (tanh approximation: GPT-2's gelu_new; fast_gelu)."),
      field("model.layernorm_epsilon", &C::model, &GPTConfig::layernorm_epsilon, "LayerNorm epsilon."),
      field("model.init_method_std", &C::model, &GPTConfig::init_method_std,
            "Std of the normal weight initialisation (output projections: std / sqrt(2 x num_layers))."),
      field("model.init_seed", &C::model, &GPTConfig::init_seed,
            "Seed of the weight initialisation; any tp/pp layout starts from the same weights."),
      field("model.share_embeddings_and_output_weights", &C::model, &GPTConfig::share_embeddings_and_output_weights,
            "Tie the output layer to the word embedding (GPT-2)."),
      field("model.gradient_accumulation_fusion", &C::model, &GPTConfig::gradient_accumulation_fusion,
            "Weight gradients (GEMMs, embedding) add straight into the grad buffer (Megatron's fusion); off for "
            "autograd::grad()."),

      field("train.micro_batch_size", &C::train, &TrainingConfig::micro_batch_size,
            "Samples per forward/backward pass on one rank."),
      field("train.global_batch_size", &C::train, &TrainingConfig::global_batch_size,
            "Samples per optimizer step over all data-parallel ranks (micro_batch_size x dp x micro-batches)."),
      field("train.train_iters", &C::train, &TrainingConfig::train_iters, "Optimizer steps to train."),
      field("train.eval_interval", &C::train, &TrainingConfig::eval_interval,
            "Validate every this many steps; 0 = only after training."),
      field("train.eval_iters", &C::train, &TrainingConfig::eval_iters,
            "Steps per validation or test; 0 disables both."),
      field("train.skip_train", &C::train, &TrainingConfig::skip_train, "Skip training (evaluate only)."),
      field("train.check_for_nan_in_loss_and_grad", &C::train, &TrainingConfig::check_for_nan_in_loss_and_grad,
            "Fail the run when the gradient norm is NaN or infinite."),
      field("train.num_threads", &C::train, &TrainingConfig::num_threads,
            "Intra-op threads per rank; 0 = the node's cores divided among its ranks."),
      field("train.exit_signal_handler", &C::train, &TrainingConfig::exit_signal_handler,
            "On SIGTERM or SIGINT on any rank, save the same step on every rank and exit (preemption)."),
      field("train.exit_interval", &C::train, &TrainingConfig::exit_interval,
            "Save and exit after a step that is a multiple of this; null = never."),
      field("train.exit_duration_in_mins", &C::train, &TrainingConfig::exit_duration_in_mins,
            "Save and exit once the run has lasted this many minutes (on any rank); null = no limit."),

      field("optimizer.optimizer", &C::optimizer, &OptimizerConfig::optimizer,
            "adam (decoupled weight decay, i.e. AdamW) or sgd."),
      field("optimizer.lr", &C::optimizer, &OptimizerConfig::lr, "Peak learning rate."),
      field("optimizer.min_lr", &C::optimizer, &OptimizerConfig::min_lr, "Learning rate at the end of the decay."),
      field("optimizer.weight_decay", &C::optimizer, &OptimizerConfig::weight_decay,
            "Decoupled weight decay on matrices (none on biases and norm weights)."),
      field("optimizer.adam_beta1", &C::optimizer, &OptimizerConfig::adam_beta1, "Adam beta1."),
      field("optimizer.adam_beta2", &C::optimizer, &OptimizerConfig::adam_beta2, "Adam beta2."),
      field("optimizer.adam_eps", &C::optimizer, &OptimizerConfig::adam_eps, "Adam epsilon."),
      field("optimizer.sgd_momentum", &C::optimizer, &OptimizerConfig::sgd_momentum, "SGD momentum."),
      field("optimizer.clip_grad", &C::optimizer, &OptimizerConfig::clip_grad,
            "Clip the global gradient norm to this; 0 disables."),

      field("scheduler.lr_warmup_iters", &C::scheduler, &SchedulerConfig::lr_warmup_iters,
            "Steps of linear warmup from 0 to optimizer.lr."),
      field("scheduler.lr_decay_iters", &C::scheduler, &SchedulerConfig::lr_decay_iters,
            "Steps over which the learning rate decays to optimizer.min_lr; 0 = train.train_iters."),
      field("scheduler.lr_decay_style", &C::scheduler, &SchedulerConfig::lr_decay_style,
            "constant, linear, cosine or inverse-square-root."),

      field("parallelism.tensor_model_parallel_size", &C::parallelism, &ParallelismConfig::tensor_model_parallel_size,
            "Ranks each layer is split over (tp)."),
      field("parallelism.pipeline_model_parallel_size", &C::parallelism,
            &ParallelismConfig::pipeline_model_parallel_size,
            "Pipeline stages (pp); the world size must be a multiple of tp x pp, the rest is data parallel."),
      field("parallelism.virtual_pipeline_model_parallel_size", &C::parallelism,
            &ParallelismConfig::virtual_pipeline_model_parallel_size,
            "Model chunks per pipeline rank (interleaved 1F1B); null = the plain schedule."),
      field("parallelism.microbatch_group_size_per_vp_stage", &C::parallelism,
            &ParallelismConfig::microbatch_group_size_per_vp_stage,
            "Micro-batch group size of the interleaved schedule; null = the pipeline size."),
      field("parallelism.backend", &C::parallelism, &ParallelismConfig::backend,
            "Collective backend; null = nccl on a CUDA device when LibTorch has NCCL, else gloo."),
      field("parallelism.device", &C::parallelism, &ParallelismConfig::device,
            "auto (cuda:LOCAL_RANK when every local rank has a GPU, else cpu), cuda, cuda:<index> or cpu."),
      field("parallelism.timeout", &C::parallelism, &ParallelismConfig::timeout,
            "Limit for every collective and process group creation (e.g. 30s, 10min, 1h)."),
      field("parallelism.rendezvous_timeout", &C::parallelism, &ParallelismConfig::rendezvous_timeout,
            "Limit for joining the world at start-up (reaching MASTER_ADDR:MASTER_PORT, every rank arriving); "
            "then the ranks that never joined are named."),

      field("ddp.overlap_grad_reduce", &C::ddp, &DistributedDataParallelConfig::overlap_grad_reduce,
            "Start each gradient bucket's all-reduce during the last micro-batch's backward."),
      field("ddp.average_in_collective", &C::ddp, &DistributedDataParallelConfig::average_in_collective,
            "false: pre-scale gradients by 1/dp, then sum (Megatron's default)."),
      field("ddp.bucket_size", &C::ddp, &DistributedDataParallelConfig::bucket_size,
            "Elements per gradient bucket; 0 = max(40M, 1M x dp)."),
      field("ddp.grad_reduce_in_fp32", &C::ddp, &DistributedDataParallelConfig::grad_reduce_in_fp32,
            "Gradient buffer in fp32 for bf16/fp16 parameters; set from mixed_precision.grad_reduce_in_fp32 "
            "when bf16 or fp16 is on."),

      field("dataset.data_path", &C::dataset, &DatasetConfig::data_path,
            "Megatron .bin/.idx path prefixes to train on; empty = mock data (random tokens)."),
      field("dataset.split", &C::dataset, &DatasetConfig::split,
            "Train/validation/test proportions over the documents, e.g. \"969,30,1\"."),
      field("dataset.path_to_cache", &C::dataset, &DatasetConfig::path_to_cache,
            "Where the sample indices are cached; empty = <prefix's folder>/cache/GPTDataset_indices."),
      field("dataset.validate_tokens", &C::dataset, &DatasetConfig::validate_tokens,
            "Check at startup that every token id is below model.vocab_size (reads the data once); null = when the "
            "data is at most 4 GiB."),
      field("dataset.reset_position_ids", &C::dataset, &DatasetConfig::reset_position_ids,
            "Positions restart at 0 after each end-of-document token (Megatron's --reset-position-ids)."),
      field("dataset.reset_attention_mask", &C::dataset, &DatasetConfig::reset_attention_mask,
            "Tokens after an end-of-document token do not attend to it or before (an [s, s] mask per sample)."),
      field("dataset.eod_mask_loss", &C::dataset, &DatasetConfig::eod_mask_loss,
            "No loss on the token that follows an end-of-document token."),
      field("dataset.eod_token_id", &C::dataset, &DatasetConfig::eod_token_id,
            "The end-of-document token of those three; null = model.vocab_size - 1 (256 byte-level, 50256 GPT-2)."),
      field("dataset.mid_level_dataset_surplus", &C::dataset, &DatasetConfig::mid_level_dataset_surplus,
            "A blend builds each dataset this fraction beyond its share of the samples (Megatron's 0.005)."),

      field("logging.log_interval", &C::logging, &LoggingConfig::log_interval,
            "Print the training log line every this many steps."),
      field("logging.tensorboard_dir", &C::logging, &LoggingConfig::tensorboard_dir,
            "TensorBoard event files go here; empty = no TensorBoard."),
      field("logging.jsonl_path", &C::logging, &LoggingConfig::jsonl_path,
            "Append metrics as JSON lines to this file; empty = none."),
      field("logging.tensorboard_log_interval", &C::logging, &LoggingConfig::tensorboard_log_interval,
            "Write metrics every this many steps."),
      field("logging.log_throughput", &C::logging, &LoggingConfig::log_throughput,
            "Model TFLOP/s per device on the console line."),
      field("logging.log_params_norm", &C::logging, &LoggingConfig::log_params_norm,
            "The parameters' L2 norm on the line and in the writers."),
      field("logging.log_memory_to_tensorboard", &C::logging, &LoggingConfig::log_memory_to_tensorboard,
            "Write memory use to the metric writers."),
      field("logging.log_l2_norm_grad_to_tensorboard", &C::logging, &LoggingConfig::log_l2_norm_grad_to_tensorboard,
            "Write per-parameter and global gradient norms."),
      field("logging.log_throughput_to_tensorboard", &C::logging, &LoggingConfig::log_throughput_to_tensorboard,
            "Write throughput (rolling-window rates and the model TFLOP/s) to the metric writers."),
      field("logging.throughput_window_size", &C::logging, &LoggingConfig::throughput_window_size,
            "Steps in the rolling throughput window."),
      field("logging.log_runtime_to_tensorboard", &C::logging, &LoggingConfig::log_runtime_to_tensorboard,
            "Write the elapsed run time to the metric writers."),
      field("logging.runtime_time_unit", &C::logging, &LoggingConfig::runtime_time_unit,
            "Unit of the run time: seconds, minutes, hours or days."),
      field("logging.log_loss_scale_to_tensorboard", &C::logging, &LoggingConfig::log_loss_scale_to_tensorboard,
            "Write the loss scale to the metric writers."),
      field("logging.log_world_size_to_tensorboard", &C::logging, &LoggingConfig::log_world_size_to_tensorboard,
            "Write the world size to the metric writers."),
      field("logging.log_timers_to_tensorboard", &C::logging, &LoggingConfig::log_timers_to_tensorboard,
            "Write iteration-time (seconds per step) to the metric writers."),
      field("logging.log_validation_ppl_to_tensorboard", &C::logging, &LoggingConfig::log_validation_ppl_to_tensorboard,
            "Write the validation and test perplexity beside their losses to the metric writers."),

      field("rng.seed", &C::rng, &RNGConfig::seed, "Seed of the data order and dropout."),

      field("checkpoint.save", &C::checkpoint, &CheckpointConfig::save,
            "Directory for checkpoints; empty = never save."),
      field("checkpoint.save_interval", &C::checkpoint, &CheckpointConfig::save_interval,
            "Save every this many steps; 0 = only at the end (when checkpoint.save is set)."),
      field("checkpoint.load", &C::checkpoint, &CheckpointConfig::load,
            "Directory to resume from (its latest checkpoint, or checkpoint.ckpt_step); empty = none. It must "
            "exist; a directory without checkpoints starts from scratch."),
      field("checkpoint.ckpt_step", &C::checkpoint, &CheckpointConfig::ckpt_step,
            "Iteration of checkpoint.load to resume from; null = the latest."),
      field("checkpoint.pretrained_checkpoint", &C::checkpoint, &CheckpointConfig::pretrained_checkpoint,
            "Directory to take the weights from (fresh optimizer, scheduler and step) when nothing is resumed; "
            "hf:<dir> takes them from a Hugging Face GPT-2 (config.json + model.safetensors)."),
      field("checkpoint.finetune", &C::checkpoint, &CheckpointConfig::finetune,
            "Load only the model from checkpoint.load; start at step 0 with a fresh optimizer and RNG."),
      field("checkpoint.no_load_optim", &C::checkpoint, &CheckpointConfig::no_load_optim,
            "Do not load the optimizer state (nor the fp16 loss scale)."),
      field("checkpoint.no_load_rng", &C::checkpoint, &CheckpointConfig::no_load_rng,
            "Do not load the RNG states; keep those seeded from rng.seed."),
      field("checkpoint.auto_resume", &C::checkpoint, &CheckpointConfig::auto_resume,
            "Resume from checkpoint.save when it holds checkpoints and nothing else is loaded; a damaged latest "
            "checkpoint falls back to the newest complete older one (the damaged one kept as iter_N.damaged). "
            "false = stop with an error instead of overwriting them."),
      field("checkpoint.most_recent_k", &C::checkpoint, &CheckpointConfig::most_recent_k,
            "Keep only the newest this many checkpoints in checkpoint.save; -1 = keep all."),
      field("checkpoint.async_save", &C::checkpoint, &CheckpointConfig::async_save,
            "Write checkpoint files on a background thread while training goes on; on_checkpoint_save fires once "
            "the checkpoint is complete."),

      field("mixed_precision.bf16", &C::mixed_precision, &MixedPrecisionConfig::bf16,
            "Parameters and compute in bfloat16, fp32 master weights in the optimizer. `mixed_precision: "
            "bf16_mixed` (or fp16_mixed, fp32) sets the whole section as Megatron-Bridge's recipes."),
      field("mixed_precision.fp16", &C::mixed_precision, &MixedPrecisionConfig::fp16,
            "Parameters and compute in float16 with loss scaling, fp32 master weights in the optimizer."),
      field("mixed_precision.grad_reduce_in_fp32", &C::mixed_precision, &MixedPrecisionConfig::grad_reduce_in_fp32,
            "With bf16/fp16: accumulate and all-reduce gradients in fp32 (sets ddp.grad_reduce_in_fp32)."),
      field("mixed_precision.loss_scale", &C::mixed_precision, &MixedPrecisionConfig::loss_scale,
            "fp16: a static loss scale; null = dynamic loss scaling."),
      field("mixed_precision.initial_loss_scale", &C::mixed_precision, &MixedPrecisionConfig::initial_loss_scale,
            "fp16: the dynamic loss scale's start (2^32)."),
      field("mixed_precision.min_loss_scale", &C::mixed_precision, &MixedPrecisionConfig::min_loss_scale,
            "fp16: the dynamic loss scale never halves below this."),
      field("mixed_precision.loss_scale_window", &C::mixed_precision, &MixedPrecisionConfig::loss_scale_window,
            "fp16: clean steps before the dynamic loss scale doubles."),
      field("mixed_precision.hysteresis", &C::mixed_precision, &MixedPrecisionConfig::hysteresis,
            "fp16: overflowing steps tolerated before the dynamic loss scale halves."),
  };
  return table;
}

std::string_view section_of(std::string_view key) { return key.substr(0, key.find('.')); }
std::string_view leaf_of(std::string_view key) { return key.substr(key.rfind('.') + 1); }

const Field* find_field(std::string_view key) {
  for (const Field& f : fields()) {
    if (f.key == key) return &f;
  }
  return nullptr;
}

// Whether `path` names a section (or a level above some keys): "train", "model".
bool is_section(std::string_view path) {
  for (const Field& f : fields()) {
    if (f.key.size() > path.size() && f.key.compare(0, path.size(), path) == 0 && f.key[path.size()] == '.') {
      return true;
    }
  }
  return false;
}

std::vector<std::string> sections() {
  std::vector<std::string> names;
  for (const Field& f : fields()) {
    const std::string name(section_of(f.key));
    if (names.empty() || names.back() != name) names.push_back(name);
  }
  return names;
}

// ---- Applying YAML ----

// Where a node came from: "recipe.yaml:12:3", or the override for nodes parsed from one.
struct Source {
  std::string name;
  bool has_lines = true;

  std::string at(const YAML::Node& node) const {
    const YAML::Mark mark = node.Mark();
    if (!has_lines || mark.is_null()) return name;
    return name + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
  }
};

std::string describe(const YAML::Node& node) {
  if (is_null(node)) return "null (no value)";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "'" + node.Scalar() + "'";
}

// A `callbacks:` list: entries {type: <built-in>, <option>: <value>, ...}, each checked against its type.
std::vector<CallbackConfig> parse_callbacks(const YAML::Node& list, const Source& source) {
  std::vector<CallbackConfig> entries;
  if (is_null(list)) return entries;
  if (!list.IsSequence()) {
    throw ConfigError(source.at(list) +
                      ": callbacks must be a list of {type: <name>, <option>: <value>} entries, e.g. "
                      "[{type: EarlyStopping, patience: 3}], got " +
                      describe(list));
  }
  for (std::size_t i = 0; i < list.size(); ++i) {
    const YAML::Node item = list[i];
    const std::string where = "callbacks[" + std::to_string(i) + "]";
    if (!item.IsMap()) {
      throw ConfigError(source.at(item) + ": " + where + " must be a mapping {type: <name>, ...}, got " +
                        describe(item));
    }
    CallbackConfig entry;
    for (auto it = item.begin(); it != item.end(); ++it) {
      const YAML::Node key = it->first;
      const YAML::Node value = it->second;
      if (!key.IsScalar()) throw ConfigError(source.at(key) + ": keys must be names, got " + describe(key));
      const std::string name = key.Scalar();
      if (name == "type") {
        if (!value.IsScalar()) throw ConfigError(source.at(value) + ": " + where + ".type must be a name");
        entry.type = value.Scalar();
      } else if (!entry.options.emplace(name, yaml_text(value)).second) {
        throw ConfigError(source.at(key) + ": " + where + "." + name + " is set twice; keep one");
      }
    }
    try {
      validate_callback_config(entry, where, /*load_plugins=*/false);  // ConfigContainer::validate loads them
    } catch (const std::invalid_argument& error) {
      throw ConfigError(source.at(item) + ": " + error.what());
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

std::string a_or_an(const std::string& noun) {
  return (noun.empty() || std::string_view("aeiou").find(noun[0]) == std::string_view::npos ? "a " : "an ") + noun;
}

std::string unknown_key_message(const std::string& written) {
  // Megatron-Bridge's section names suggest bridge's keys: "logger.tensorbord_dir" -> "logging.tensorboard_dir".
  const std::string path = to_bridge_section(written);
  std::vector<std::string_view> keys;
  for (const Field& f : fields()) keys.push_back(f.key);
  std::optional<std::string> suggestion = utils::closest_match(path, keys);
  if (!suggestion) {
    // Right name, wrong or missing section: "global_batch_size", "model.train_iters".
    for (const Field& f : fields()) {
      if (leaf_of(f.key) == leaf_of(path)) {
        suggestion = f.key;
        break;
      }
    }
  }
  if (!suggestion) {
    std::vector<std::string_view> leaves;
    for (const Field& f : fields()) leaves.push_back(leaf_of(f.key));
    if (std::optional<std::string> leaf = utils::closest_match(leaf_of(path), leaves)) {
      for (const Field& f : fields()) {
        if (leaf_of(f.key) == *leaf) {
          suggestion = f.key;
          break;
        }
      }
    }
  }
  std::string message = "unknown config key '" + written + "'";
  if (suggestion) {
    message += "; did you mean '" + *suggestion + "'?";
  } else if (const std::string section(section_of(path)); is_section(section)) {
    std::vector<std::string_view> in_section;
    for (const Field& f : fields()) {
      if (section_of(f.key) == section) in_section.push_back(f.key);
    }
    message += "; the keys of '" + section + "' are " + utils::join(in_section, ", ");
  } else {
    message += "; the sections are " + utils::join(sections(), ", ");
  }
  return message + " (bridge-pretrain --help lists every key)";
}

std::string emit_value(const Field& f, const ConfigContainer& config) {
  YAML::Emitter out;
  out.SetNullFormat(YAML::LowerNull);
  f.emit(out, config);
  return out.c_str();
}

void set_field(const Field& f, ConfigContainer& config, const YAML::Node& value, const Source& source) {
  if (!f.parse(config, value)) {
    std::string expected = a_or_an(f.type);
    if (f.type == "duration") expected += " with a unit (ms, s, min, h), e.g. 30s or 10min";
    throw ConfigError(source.at(value) + ": " + f.key + " must be " + expected + ", got " + describe(value));
  }
}

// How a document set a key so far, to tell a key set twice from Megatron-Bridge's two spellings of one value.
struct Written {
  std::string as;     // the key as written: "dataset.seq_length"
  std::string value;  // the value it left, as to_yaml writes it
  bool overrides = false;
};
using WrittenKeys = std::map<std::string, Written>;  // by bridge's key

// Sets `f` from `value`, written as `as`. A plain null on a field that takes no null means "the default" (as in
// Megatron-Bridge, where null leaves a field to be derived): it resets a field this document has not set and is
// otherwise ignored. Two spellings of one key (model.seq_length and dataset.seq_length) must agree, unless one of
// them is Megatron-Bridge's overriding key, which wins.
void set_written(const Field& f, ConfigContainer& config, const YAML::Node& value, const Source& source,
                 const YAML::Node& key, const std::string& as, bool overrides, WrittenKeys& written) {
  const auto previous = written.find(f.key);
  if (previous != written.end()) {
    if (previous->second.as == as) throw ConfigError(source.at(key) + ": " + as + " is set twice; keep one");
    if (previous->second.overrides && !overrides) return;
  }
  if (is_null(value) && !f.takes_null) {
    if (previous == written.end()) f.reset(config);
    return;
  }
  set_field(f, config, value, source);
  Written now{as, emit_value(f, config), overrides};
  if (previous == written.end()) {
    written.emplace(f.key, std::move(now));
  } else if (overrides && !previous->second.overrides) {
    previous->second = std::move(now);
  } else if (now.value != previous->second.value) {
    throw ConfigError(source.at(key) + ": " + as + ": " + now.value + " disagrees with " + previous->second.as + ": " +
                      previous->second.value + "; both set " + f.key + ", keep one");
  }
}

KeyValue key_value(const YAML::Node& node) {
  if (is_null(node)) return {KeyValue::Kind::kNull, ""};
  if (node.IsScalar()) return {KeyValue::Kind::kScalar, node.Scalar()};
  return {KeyValue::Kind::kOther, ""};
}

// Megatron-Bridge's dataset.blend, [[prefix, ...], [weight, ...] or null], as Megatron's data_path list:
// [weight, prefix, ...], or the prefixes alone when there are no weights.
YAML::Node data_path_of_blend(const YAML::Node& blend, const std::string& path, const Source& source) {
  if (is_null(blend)) return blend;
  const auto fail = [&] {
    throw ConfigError(source.at(blend) + ": " + path +
                      " must be [[prefix, ...], [weight, ...]] or [[prefix, ...], null], as Megatron-Bridge's "
                      "get_blend_from_list writes it; got " +
                      describe(blend));
  };
  if (!blend.IsSequence() || blend.size() < 1 || blend.size() > 2 || !blend[0].IsSequence()) fail();
  const YAML::Node prefixes = blend[0];
  const YAML::Node weights = blend.size() == 2 ? blend[1] : YAML::Node();
  if (!is_null(weights) && (!weights.IsSequence() || weights.size() != prefixes.size())) fail();
  YAML::Node list(YAML::NodeType::Sequence);
  for (std::size_t i = 0; i < prefixes.size(); ++i) {
    if (!prefixes[i].IsScalar() || (!is_null(weights) && !weights[i].IsScalar())) fail();
    if (!is_null(weights)) list.push_back(weights[i].Scalar());
    list.push_back(prefixes[i].Scalar());
  }
  return list;
}

// Megatron-Bridge's name for a key, translated (nullopt: not one of its names).
std::optional<KeyTranslation> translate(const std::string& path, const YAML::Node& key, const YAML::Node& value,
                                        const Source& source) {
  try {
    return translate_megatron_bridge_key(path, key_value(value));
  } catch (const std::invalid_argument& error) {
    throw ConfigError(source.at(key) + ": " + error.what());
  }
}

void apply_map(ConfigContainer& config, const YAML::Node& map, const std::string& prefix, const Source& source,
               WrittenKeys& written) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    // Copies: yaml-cpp's iterator hands out a temporary pair, so references to its members would dangle.
    const YAML::Node key = it->first;
    const YAML::Node value = it->second;
    if (!key.IsScalar()) throw ConfigError(source.at(key) + ": keys must be names, got " + describe(key));
    const std::string path = prefix.empty() ? key.Scalar() : prefix + "." + key.Scalar();
    const auto once = [&] {
      if (written.count(path) != 0) throw ConfigError(source.at(key) + ": " + path + " is set twice; keep one");
      written.emplace(path, Written{path});
    };
    if (const Field* f = find_field(path)) {
      set_written(*f, config, value, source, key, path, /*overrides=*/false, written);
    } else if (path == "mixed_precision" && value.IsScalar()) {
      // Megatron-Bridge's ConfigContainer.mixed_precision also takes a recipe name.
      once();
      try {
        apply_mixed_precision_recipe(config.mixed_precision, value.Scalar());
      } catch (const std::invalid_argument& error) {
        throw ConfigError(source.at(value) + ": " + error.what());
      }
    } else if (path == "callbacks") {
      once();
      config.callbacks = parse_callbacks(value, source);
    } else if (const std::optional<KeyTranslation> translation = translate(path, key, value, source)) {
      if (translation->key.empty()) continue;  // read; no effect in bridge
      const Field* target = find_field(translation->key);
      if (target == nullptr) throw ConfigError(source.at(key) + ": " + unknown_key_message(path));
      const YAML::Node node = translation->blend               ? data_path_of_blend(value, path, source)
                              : translation->value.has_value() ? YAML::Load(*translation->value)
                                                               : value;
      set_written(*target, config, node, source, key, path, translation->overrides, written);
    } else if (is_section(path) || is_megatron_bridge_section(path)) {
      if (is_null(value)) continue;  // a section with every key commented out
      if (!value.IsMap()) {
        throw ConfigError(source.at(key) + ": '" + path + "' is a section, not a value; set its keys (" + path +
                          ".<key>), got " + describe(value));
      }
      apply_map(config, value, path, source, written);
    } else {
      throw ConfigError(source.at(key) + ": " + unknown_key_message(path));
    }
  }
}

YAML::Node parse_yaml(std::string_view text, const std::string& source_name) {
  try {
    return YAML::Load(std::string(text));
  } catch (const YAML::Exception& error) {
    std::string where = source_name;
    if (!error.mark.is_null()) {
      where += ":" + std::to_string(error.mark.line + 1) + ":" + std::to_string(error.mark.column + 1);
    }
    throw ConfigError(where + ": bad YAML: " + error.msg);
  }
}

// `text` wrapped to `width` columns, each line starting with `indent`.
std::string wrap(std::string_view text, std::string_view indent, std::size_t width) {
  std::string result, line;
  std::istringstream words{std::string(text)};
  std::string word;
  while (words >> word) {
    if (!line.empty() && indent.size() + line.size() + 1 + word.size() > width) {
      result += std::string(indent) + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) result += std::string(indent) + line + "\n";
  return result;
}

}  // namespace

std::vector<ConfigKeyInfo> config_keys() {
  std::vector<ConfigKeyInfo> keys;
  for (const Field& f : fields()) keys.push_back(ConfigKeyInfo{f.key, f.type, f.doc});
  return keys;
}

template <class T>
T parse_config_value(std::string_view text, std::string_view where) {
  const YAML::Node node = parse_yaml(text, std::string(where));
  std::optional<T> value = Codec<T>::parse(node);
  if (!value) {
    std::string expected = a_or_an(Codec<T>::type());
    if (Codec<T>::type() == "duration") expected += " with a unit (ms, s, min, h), e.g. 30s or 10min";
    throw ConfigError(std::string(where) + " must be " + expected + ", got " + describe(node));
  }
  return std::move(*value);
}

template <class T>
std::string config_value_type() {
  return Codec<T>::type();
}

template <class T>
std::string config_value_text(const T& value) {
  YAML::Emitter out;
  out.SetNullFormat(YAML::LowerNull);
  Codec<T>::emit(out, value);
  return out.c_str();
}

#define BRIDGE_CONFIG_VALUE(T)                                          \
  template T parse_config_value<T>(std::string_view, std::string_view); \
  template std::string config_value_type<T>();                          \
  template std::string config_value_text<T>(const T&);
BRIDGE_CONFIG_VALUE(int)
BRIDGE_CONFIG_VALUE(int64_t)
BRIDGE_CONFIG_VALUE(double)
BRIDGE_CONFIG_VALUE(bool)
BRIDGE_CONFIG_VALUE(std::string)
BRIDGE_CONFIG_VALUE(milliseconds)
BRIDGE_CONFIG_VALUE(std::vector<std::string>)
BRIDGE_CONFIG_VALUE(std::vector<int64_t>)
BRIDGE_CONFIG_VALUE(std::optional<int64_t>)
BRIDGE_CONFIG_VALUE(std::optional<double>)
BRIDGE_CONFIG_VALUE(std::optional<bool>)
#undef BRIDGE_CONFIG_VALUE

void merge_config_yaml(ConfigContainer& config, std::string_view text, std::string_view source) {
  const Source origin{std::string(source)};
  const YAML::Node root = parse_yaml(text, origin.name);
  if (is_null(root)) return;  // an empty file (or only comments): the config as it is
  if (!root.IsMap()) {
    throw ConfigError(origin.at(root) + ": the top level must be a mapping of sections (" +
                      utils::join(sections(), ":, ") + ":), got " + describe(root));
  }
  WrittenKeys written;
  apply_map(config, root, "", origin, written);
}

ConfigContainer load_config_yaml_string(std::string_view text, std::string_view source) {
  ConfigContainer config;
  merge_config_yaml(config, text, source);
  return config;
}

ConfigContainer load_config_yaml(const std::filesystem::path& path) {
  // A directory opens as a stream that reads nothing, which would train the defaults; a pipe (<(...)) is fine.
  std::error_code status_error;
  const std::filesystem::file_status status = std::filesystem::status(path, status_error);
  if (std::filesystem::is_directory(status)) {
    throw ConfigError("the config file '" + path.string() +
                      "' is a directory; pass the YAML recipe itself, e.g. --config " +
                      (path / "recipe.yaml").string());
  }
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status) &&
      !std::filesystem::is_fifo(status) && !std::filesystem::is_character_file(status)) {
    throw ConfigError("the config file '" + path.string() + "' is not a regular file; pass a YAML recipe");
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    throw ConfigError("cannot read the config file '" + path.string() +
                      "': " + std::error_code(errno, std::generic_category()).message());
  }
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) {
    throw ConfigError("cannot read the config file '" + path.string() +
                      "': " + std::error_code(errno, std::generic_category()).message());
  }
  return load_config_yaml_string(text.str(), path.string());
}

void apply_override(ConfigContainer& config, std::string_view assignment) {
  const Source origin{"override '" + std::string(assignment) + "'", /*has_lines=*/false};
  // Hydra's forms, as Megatron-Bridge's scripts take them: +key=value and ++key=value set the key (bridge's keys all
  // exist already); ~key puts it back to its default.
  std::string_view text = trim(assignment);
  const bool reset = !text.empty() && text.front() == '~';
  if (reset) {
    text.remove_prefix(1);
  } else {
    while (!text.empty() && text.front() == '+') text.remove_prefix(1);
  }
  const std::size_t equals = text.find('=');
  const std::string key(trim(text.substr(0, equals)));
  if (reset) {
    const Field* f = find_field(key);
    if (f == nullptr) {
      const std::optional<KeyTranslation> translation = translate_megatron_bridge_key(key, {KeyValue::Kind::kNull});
      if (!translation) throw ConfigError(origin.name + ": " + unknown_key_message(key));
      if (translation->key.empty()) return;  // nothing in bridge to put back
      f = find_field(translation->key);
      if (f == nullptr) throw ConfigError(origin.name + ": " + unknown_key_message(key));
    }
    f->reset(config);
    return;
  }
  if (equals == std::string_view::npos || key.empty()) {
    throw ConfigError(origin.name + ": an override is key=value, e.g. train.train_iters=100 (keys: --help)");
  }
  YAML::Node map(YAML::NodeType::Map);
  map[key] = parse_yaml(text.substr(equals + 1), origin.name);
  WrittenKeys written;
  apply_map(config, map, "", origin, written);
}

std::string to_yaml(const ConfigContainer& config) {
  YAML::Emitter out;
  out.SetNullFormat(YAML::LowerNull);
  out << YAML::BeginMap;
  std::string_view open_section;
  for (const Field& f : fields()) {
    const std::string_view section = section_of(f.key);
    if (section != open_section) {
      if (!open_section.empty()) out << YAML::EndMap;
      out << YAML::Key << std::string(section) << YAML::Value << YAML::BeginMap;
      open_section = section;
    }
    out << YAML::Key << std::string(leaf_of(f.key)) << YAML::Value;
    f.emit(out, config);
  }
  if (!open_section.empty()) out << YAML::EndMap;
  out << YAML::Key << "callbacks" << YAML::Value;
  if (config.callbacks.empty()) out << YAML::Flow;  // "callbacks: []"
  out << YAML::BeginSeq;
  for (const CallbackConfig& entry : config.callbacks) {
    out << YAML::Flow << YAML::BeginMap << YAML::Key << "type" << YAML::Value << entry.type;
    for (const auto& [name, text] : entry.options) out << YAML::Key << name << YAML::Value << YAML::Load(text);
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::string config_help(const ConfigContainer& defaults) {
  std::string text;
  std::string_view open_section;
  for (const Field& f : fields()) {
    const std::string_view section = section_of(f.key);
    if (section != open_section) {
      if (!open_section.empty()) text += "\n";
      text += std::string(section) + ":\n";
      open_section = section;
    }
    text += "  " + f.key + " (" + f.type + ", default " + emit_value(f, defaults) + ")\n";
    text += wrap(f.doc, "      ", 120);
  }
  text +=
      "\ncallbacks: a list of built-in callbacks, each {type: <name>, <option>: <value>, ...}; e.g.\n"
      "  callbacks=[{type: EarlyStopping, patience: 3}, {type: ProgressBar}]\n";
  for (const CallbackTypeInfo& type : builtin_callback_types()) {
    text += "  " + type.type + "\n" + wrap(type.doc, "      ", 120);
    for (const CallbackOptionInfo& option : type.options) {
      text += "    " + option.name + " (" + option.type + ", default " + option.default_value + ")\n";
      text += wrap(option.doc, "        ", 120);
    }
  }
  return text;
}

namespace {

// `text` as Markdown: '<' would open an HTML tag ("<dir>" would vanish); in a table cell, '|' would end the cell (also
// inside a code span) and a newline the row.
std::string markdown_text(const std::string& text, bool in_table = true) {
  std::string out;
  for (const char c : text) {
    if (c == '<') {
      out += "&lt;";
    } else if (in_table && (c == '|' || c == '\n')) {
      out += c == '|' ? "\\|" : " ";
    } else {
      out += c;
    }
  }
  return out;
}

std::string code_cell(const std::string& text) {
  std::string cell;
  for (const char c : text) cell += c == '|' ? std::string("\\|") : std::string(1, c);
  return "`" + (cell.empty() ? std::string("\"\"") : cell) + "`";
}

}  // namespace

std::string config_reference_markdown(const ConfigContainer& defaults) {
  std::string text =
      "# Config reference\n\n"
      "Generated by `bridge-pretrain --help-markdown` from the one key table (`training/config_yaml.cpp`) that also\n"
      "drives parsing, `--print-config` and `--help`; do not edit it by hand. Each key's default is its value when a\n"
      "recipe leaves it out.\n";
  std::string_view open_section;
  for (const Field& f : fields()) {
    const std::string_view section = section_of(f.key);
    if (section != open_section) {
      text += "\n## " + std::string(section) + "\n\n| key | type | default | meaning |\n|---|---|---|---|\n";
      open_section = section;
    }
    text += "| " + code_cell(f.key) + " | " + markdown_text(f.type) + " | " + code_cell(emit_value(f, defaults)) +
            " | " + markdown_text(f.doc) + " |\n";
  }
  text +=
      "\n## callbacks\n\n"
      "A list of built-in callbacks, each `{type: <name>, <option>: <value>, ...}`, e.g.\n"
      "`callbacks=[{type: EarlyStopping, patience: 3}, {type: ProgressBar}]`.\n";
  for (const CallbackTypeInfo& type : builtin_callback_types()) {
    text += "\n### " + type.type + "\n\n" + markdown_text(type.doc, false) + "\n";
    if (type.options.empty()) continue;
    text += "\n| option | type | default | meaning |\n|---|---|---|---|\n";
    for (const CallbackOptionInfo& option : type.options) {
      text += "| " + code_cell(option.name) + " | " + markdown_text(option.type) + " | " +
              code_cell(option.default_value) + " | " + markdown_text(option.doc) + " |\n";
    }
  }
  return text;
}

}  // namespace bridge::training
