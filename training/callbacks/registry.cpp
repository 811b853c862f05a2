// The registry: one table row per built-in, its options bound to the members of its options struct.
#include "training/callbacks/registry.h"

#include <algorithm>
#include <functional>
#include <stdexcept>

#include "training/callbacks/callback_manager.h"
#include "training/callbacks/control_endpoint.h"
#include "training/callbacks/divergence_detector.h"
#include "training/callbacks/early_stopping.h"
#include "training/callbacks/expert_load_monitor.h"
#include "training/callbacks/learning_rate_monitor.h"
#include "training/callbacks/memory_monitor.h"
#include "training/callbacks/plugin.h"
#include "training/callbacks/profiler.h"
#include "training/callbacks/progress_bar.h"
#include "training/callbacks/runtime_estimator.h"
#include "training/callbacks/speed_monitor.h"
#include "training/callbacks/text_generator.h"
#include "training/callbacks/threshold_stopper.h"
#include "training/callbacks/time_limit.h"
#include "training/config/config_yaml.h"
#include "utils/closest_match.h"
#include "utils/strings.h"

namespace bridge::training {
inline namespace callbacks {
namespace {

// One option of Options: its description, and how its YAML text sets the member.
template <class Options>
struct Option {
  CallbackOptionInfo info;
  std::function<void(Options&, const std::string& text, const std::string& where)> set;
};

template <class Options, class T>
Option<Options> option(const char* name, T Options::*member, const char* doc) {
  return Option<Options>{CallbackOptionInfo{name, config_value_type<T>(), config_value_text(Options{}.*member), doc},
                         [member](Options& options, const std::string& text, const std::string& where) {
                           options.*member = parse_config_value<T>(text, where);
                         }};
}

// A type of the table: its description, and a builder that applies the entry's options to a default Options.
struct Builtin {
  CallbackTypeInfo info;
  std::function<std::shared_ptr<Callback>(const CallbackConfig&, const std::string& where)> build;
};

template <class CallbackType, class Options>
Builtin builtin(const char* type, const char* doc, std::vector<Option<Options>> options) {
  CallbackTypeInfo info{type, doc, {}};
  for (const Option<Options>& o : options) info.options.push_back(o.info);
  return Builtin{std::move(info), [options](const CallbackConfig& entry, const std::string& where) {
                   Options values;
                   for (const auto& [name, text] : entry.options) {
                     for (const Option<Options>& o : options) {
                       if (o.info.name == name) o.set(values, text, where + "." + name);
                     }
                   }
                   try {
                     return std::shared_ptr<Callback>(std::make_shared<CallbackType>(values));
                   } catch (const std::invalid_argument& error) {
                     throw std::invalid_argument(where + ": " + error.what());
                   }
                 }};
}

// Callbacks without options.
template <class CallbackType>
Builtin builtin(const char* type, const char* doc) {
  return Builtin{CallbackTypeInfo{type, doc, {}},
                 [](const CallbackConfig&, const std::string&) { return std::make_shared<CallbackType>(); }};
}

using CE = ControlEndpointOptions;
using ES = EarlyStoppingOptions;
using TS = ThresholdStopperOptions;
using DD = DivergenceDetectorOptions;
using LR = LearningRateMonitorOptions;
using SM = SpeedMonitorOptions;
using RE = RuntimeEstimatorOptions;
using PB = ProgressBarOptions;
using PR = ProfilerOptions;
using TG = TextGeneratorOptions;
using TL = TimeLimitOptions;

const std::vector<Builtin>& table() {
  static const std::vector<Builtin> builtins = {
      builtin<ControlEndpoint, CE>(
          "ControlEndpoint", "HTTP control on the last rank: GET /status, /metrics; POST /stop, /save, /abort.",
          {option("host", &CE::host, "Address to bind; other than loopback needs a bearer token."),
           option("port", &CE::port, "Port; 0 = a free one (logged, and written to endpoint_file)."),
           option("endpoint_file", &CE::endpoint_file, "Where to write http://<host>:<port> once bound."),
           option("token_file", &CE::token_file, "A file holding the bearer token."),
           option("token_env", &CE::token_env, "Or the environment variable holding it."),
           option("max_body_bytes", &CE::max_body_bytes, "Larger requests get 413.")}),
      builtin<DivergenceDetector, DD>(
          "DivergenceDetector", "Acts on a NaN/inf or spiking loss: stop, abort, or count it and train on.",
          {option("monitor", &DD::monitor, "The loss to watch (a logged metric, or '<loss> validation')."),
           option("window", &DD::window, "Recent values a spike is measured against."),
           option("warmup", &DD::warmup, "Values in the window before spikes are judged (NaN/inf always are)."),
           option("spike_factor", &DD::spike_factor, "A spike: above this many times the window's mean."),
           option("absolute_threshold", &DD::absolute_threshold, "Also a spike: above the mean by this much."),
           option("patience", &DD::patience, "Consecutive spikes before acting."),
           option("action", &DD::action, "stop, abort or skip (count and train on).")}),
      builtin<EarlyStopping, ES>(
          "EarlyStopping", "Stops training when a monitored metric stops improving (Lightning's semantics).",
          {option("monitor", &ES::monitor, "The metric ('<loss> validation' at evaluations, or a logged metric)."),
           option("min_delta", &ES::min_delta, "An improvement must beat the best by more than this."),
           option("patience", &ES::patience, "Checks without improvement before stopping."),
           option("mode", &ES::mode, "min (lower is better) or max."),
           option("check_finite", &ES::check_finite, "Stop on NaN or infinity."),
           option("stopping_threshold", &ES::stopping_threshold, "Stop once the metric is better than this."),
           option("divergence_threshold", &ES::divergence_threshold, "Stop once the metric is worse than this.")}),
      builtin<ExpertLoadMonitor>("ExpertLoadMonitor",
                                 "MoE: logs moe/expert_load_imbalance_layer_<i> (busiest expert / mean) and "
                                 "moe/dropped_tokens_layer_<i>, and the per-layer auxiliary losses."),
      builtin<LearningRateMonitor, LR>(
          "LearningRateMonitor", "Logs each parameter group's learning rate as lr-<Optimizer>/pg<i>.",
          {option("log_momentum", &LR::log_momentum, "Also momentum-<Optimizer>/pg<i> (Adam's beta1)."),
           option("log_weight_decay", &LR::log_weight_decay, "Also weight_decay-<Optimizer>/pg<i>.")}),
      builtin<MemoryMonitor>("MemoryMonitor",
                             "Logs memory/<name> as the max over ranks (and /min), the peak on the console line."),
      builtin<Profiler, PR>("Profiler", "LibTorch's autograd profiler over a window of steps: a Chrome trace per rank.",
                            {option("start_step", &PR::start_step, "The first step recorded."),
                             option("num_steps", &PR::num_steps, "Steps recorded."),
                             option("output_dir", &PR::output_dir, "Where trace_rank<r>.json is written."),
                             option("ranks", &PR::ranks, "The ranks that record; [] = all.")}),
      builtin<ProgressBar, PB>(
          "ProgressBar", "A live bar on the last rank: step, loss, tokens/s and ETA (plain lines off a terminal).",
          {option("width", &PB::width, "Characters of the bar."),
           option("refresh_seconds", &PB::refresh_seconds, "On a terminal: the least time between redraws."),
           option("line_seconds", &PB::line_seconds, "Off a terminal: the least time between lines."),
           option("loss", &PB::loss, "The logged metric shown as the loss.")}),
      builtin<RuntimeEstimator, RE>(
          "RuntimeEstimator", "Logs time/remaining_estimate and an ETA from the step and evaluation times so far.",
          {option("skip_steps", &RE::skip_steps, "Steps left out of the mean at the start."),
           option("time_unit", &RE::time_unit, "Unit of time/remaining_estimate: seconds, minutes, hours, days.")}),
      builtin<SpeedMonitor, SM>(
          "SpeedMonitor", "Logs tokens/s, samples/s, TFLOP/s per device and MFU over a window of steps.",
          {option("window_size", &SM::window_size, "Steps the rates are averaged over."),
           option("peak_tflops", &SM::peak_tflops,
                  "A device's dense peak TFLOP/s for MFU; 0 = the GPU's bf16/fp16 peak when known.")}),
      builtin<TextGenerator, TG>(
          "TextGenerator", "Continues prompts with the model every N steps: logged, and written as texts.",
          {option("prompts", &TG::prompts, "The prompts (at least one)."),
           option("interval", &TG::interval, "Steps between generations (at the next log step)."),
           option("max_new_tokens", &TG::max_new_tokens, "Tokens added to each prompt."),
           option("top_k", &TG::top_k, "1 = greedy; k > 1 samples among the k likeliest tokens."),
           option("temperature", &TG::temperature, "Divides the logits before sampling."),
           option("seed", &TG::seed, "Sampling seed (combined with the step)."),
           option("stop_at_eod", &TG::stop_at_eod, "End a continuation at the end-of-document token."),
           option("tokenizer_type", &TG::tokenizer_type,
                  "ByteLevel, GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer (or its other names) or "
                  "NullTokenizer, as bridge-preprocess-data's --tokenizer-type; empty = the run's tokenizer section, "
                  "else ByteLevel."),
           option("tokenizer_model", &TG::tokenizer_model,
                  "HuggingFaceTokenizer's directory (or tokenizer.json); SentencePieceTokenizer's tokenizer.model."),
           option("vocab_file", &TG::vocab_file, "GPT2BPETokenizer's vocab.json."),
           option("merge_file", &TG::merge_file, "GPT2BPETokenizer's merges.txt.")}),
      builtin<ThresholdStopper, TS>(
          "ThresholdStopper", "Stops training once a monitored metric passes a threshold.",
          {option("monitor", &TS::monitor, "The metric ('<loss> validation' at evaluations, or a logged metric)."),
           option("threshold", &TS::threshold, "The value to pass."),
           option("mode", &TS::mode, "min (stop below the threshold) or max (above).")}),
      builtin<TimeLimit, TL>(
          "TimeLimit", "Saves and stops before a wall-clock budget runs out (counted from the start of the run).",
          {option("duration", &TL::duration, "The budget, e.g. 4h or 90min."),
           option("reserve", &TL::reserve, "Time kept free at the end (final evaluation, copying).")}),
  };
  return builtins;
}

const Builtin& find_builtin(const CallbackConfig& entry, const std::string& where) {
  std::vector<std::string_view> names;
  for (const Builtin& b : table()) {
    if (b.info.type == entry.type) return b;
    names.push_back(b.info.type);
  }
  names.push_back(kPluginType);
  const std::optional<std::string> closest = bridge::utils::closest_match(entry.type, names);
  throw std::invalid_argument(
      where + ": " +
      (entry.type.empty() ? std::string("the entry has no type") : "unknown callback type '" + entry.type + "'") +
      (closest ? "; did you mean '" + *closest + "'?" : ".") + " The types are " + bridge::utils::join(names, ", ") +
      " (bridge-pretrain --help lists their options).");
}

}  // namespace

std::vector<CallbackTypeInfo> builtin_callback_types() {
  std::vector<CallbackTypeInfo> types;
  for (const Builtin& b : table()) types.push_back(b.info);
  types.push_back(CallbackTypeInfo{
      std::string(kPluginType),
      "Callbacks from a shared library exporting bridge_register_callbacks (examples/plugin/); every other key is "
      "one of the plugin's options.",
      {CallbackOptionInfo{"path", "string", "\"\"", "The library (.so)."}}});
  std::sort(types.begin(), types.end(), [](const auto& a, const auto& b) { return a.type < b.type; });
  return types;
}

namespace {

PluginOptions plugin_options(const CallbackConfig& entry, const std::string& where, int rank, int world_size) {
  PluginOptions options;
  options.rank = rank;
  options.world_size = world_size;
  for (const auto& [name, text] : entry.options) {
    if (name == "path") {
      options.path = parse_config_value<std::string>(text, where + ".path");
    } else {
      options.values.emplace(name, text);
    }
  }
  if (options.path.empty()) {
    throw std::invalid_argument(where +
                                ": a Plugin entry needs the library's path, e.g. {type: Plugin, path: "
                                "build/libmine.so}");
  }
  return options;
}

}  // namespace

void validate_callback_config(const CallbackConfig& entry, std::string_view where_view, bool load_plugins) {
  const std::string where(where_view);
  if (entry.type == kPluginType) {
    const PluginOptions options = plugin_options(entry, where, 0, 1);
    if (load_plugins) load_plugin(options.path, where);
    return;
  }
  build_callback(entry, where);
}

void add_callbacks(CallbackManager& manager, const std::vector<CallbackConfig>& entries, int rank, int world_size) {
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const std::string where = "callbacks[" + std::to_string(i) + "]";
    if (entries[i].type != kPluginType) {
      manager.add(build_callback(entries[i], where));
      continue;
    }
    const PluginOptions options = plugin_options(entries[i], where, rank, world_size);
    load_plugin(options.path, where)(manager, options);
  }
}

std::shared_ptr<Callback> build_callback(const CallbackConfig& entry, std::string_view where_view) {
  const std::string where(where_view);
  if (entry.type == kPluginType) {
    throw std::invalid_argument(where + ": a Plugin entry registers its own callbacks; add it with add_callbacks");
  }
  const Builtin& builtin = find_builtin(entry, where);
  std::vector<std::string_view> names;
  for (const CallbackOptionInfo& o : builtin.info.options) names.push_back(o.name);
  for (const auto& entry_option : entry.options) {
    const std::string& name = entry_option.first;
    if (std::find(names.begin(), names.end(), name) != names.end()) continue;
    const std::optional<std::string> closest = bridge::utils::closest_match(name, names);
    throw std::invalid_argument(
        where + ": " + entry.type + " has no option '" + name + "'" +
        (closest ? "; did you mean '" + *closest + "'?" : ".") +
        (names.empty() ? " It takes none." : " Its options are " + bridge::utils::join(names, ", ") + "."));
  }
  return builtin.build(entry, where);
}

}  // namespace callbacks
}  // namespace bridge::training
