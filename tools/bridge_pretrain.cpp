// bridge-pretrain: GPT pretraining from a YAML recipe and key=value overrides, with no code. The same command runs
// alone, under torchrun and under mpirun; with no --config it trains the embedded tiny recipe on the embedded corpus.
//
//   bridge-pretrain                                            # the tiny recipe, about a minute on 2 CPU cores
//   bridge-pretrain --config recipe.yaml train.train_iters=500 optimizer.lr=3e-4
//   mpirun -np 4 bridge-pretrain --config examples/recipes/tp2_pp2.yaml
//   bridge-pretrain --config recipe.yaml --print-config        # the resolved config, as YAML
//
// Exit status: 0 done, 1 training failed (a restart may succeed), 2 bad command line or config (printed once, by
// rank 0), 93 a damaged checkpoint that a restart would refuse again; docs/failures.md. Under
// torchrun, every failing rank also writes TORCHELASTIC_ERROR_FILE, so torchrun's root cause report shows its message.
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cxxopts.hpp>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "bridge/bridge.h"
#include "parallel/distributed.h"
#include "parallel/launch_env.h"
#include "parallel/parallel_state.h"
#include "tools/tiny_corpus.h"
#include "tools/tiny_recipe.h"
#include "training/config/config_yaml.h"
#include "training/config/hf_start.h"
#include "training/preflight.h"
#include "training/tokenizer_setup.h"
#include "training/utils/theoretical_memory.h"
#include "utils/elastic_error_file.h"
#include "utils/exception_message.h"
#include "utils/strings.h"
#include "utils/type_name.h"
#include "utils/zip_archive.h"

namespace {

using namespace bridge;
using namespace bridge::training;

// Exit codes that tell a launcher whether to start the job again (docs/failures.md). 1 is any failure a restart may
// get past (a lost rank, a full disk, a stall). 2 and 93 fail the same way on every restart: 2 is the command line or
// config, found before training; 93 (NVIDIA Resiliency Extension's "do not restart" code, which its Slurm examples
// end a job chain on) a damaged checkpoint the run must load (auto-resume falls back past one instead).
constexpr int kExitTrainingFailed = 1;
constexpr int kExitBadConfig = 2;
constexpr int kExitDoNotRestart = 93;

// Where a failure happened, for torchrun's report: the step is known once training has started (on_exception).
struct FailureContext {
  const parallel::LaunchEnv* env = nullptr;
  std::optional<int64_t> step;
};

// Prints `line` (when `print`) and records it in TORCHELASTIC_ERROR_FILE with what locates it: C++ has no stack to
// show, so the exception's type, the rank and the step stand in for torchelastic's Python traceback. Every failing
// rank records, printing or not (each has its own file; torchrun reports the earliest). Returns `code`.
int fail(int code, const std::string& line, const std::exception& error, const FailureContext& where, bool print) {
  if (print) std::fprintf(stderr, "%s\n", line.c_str());
  const parallel::LaunchEnv& env = *where.env;
  std::string callstack = bridge::utils::demangled_name(typeid(error)) + " on rank " + std::to_string(env.rank) +
                          " of " + std::to_string(env.world_size) + " (local rank " + std::to_string(env.local_rank) +
                          ", attempt " + std::to_string(env.restart_count);
  if (where.step) callstack += ", at step " + std::to_string(*where.step);
  callstack += "), exit " + std::to_string(code) +
               (code == kExitTrainingFailed ? " (a restart may succeed)" : " (a restart would fail the same way)") +
               ":\n" + line;
  bridge::utils::record_elastic_error(line, callstack);
  return code;
}

cxxopts::Options make_options() {
  cxxopts::Options options("bridge-pretrain", "Megatron-style GPT pretraining from a YAML recipe.");
  options.custom_help("[--config RECIPE.yaml] [KEY=VALUE ...] [--print-config]");
  options.add_options()("c,config",
                        "YAML recipe to start from (keys it leaves out keep the defaults listed below); without it, "
                        "the embedded tiny recipe (examples/recipes/tiny.yaml)",
                        cxxopts::value<std::string>(), "RECIPE.yaml")(
      "print-config",
      "print the resolved config as YAML (loadable with --config) and exit; under torchrun or mpirun, first check it "
      "against the launcher's world size and join the world, so a launch line that prints is one that starts")(
      "h,help", "print this help, with every config key, and exit")(
      "help-markdown", "print the config key reference as Markdown (docs/config-reference.md) and exit");
  return options;
}

// `word` as the shell reads it back: as is when it holds only safe characters, else in single quotes.
std::string shell_word(const std::string& word) {
  const bool safe = !word.empty() && word.find_first_not_of(
                                         "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                         "0123456789_./=:,+-@%") == std::string::npos;
  if (safe) return word;
  std::string quoted = "'";
  for (const char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// The torchrun of the PyTorch whose LibTorch this process runs on: a wheel's libtorch is
// <env>/lib/pythonX.Y/site-packages/torch/lib/libtorch_cpu.so, its torchrun <env>/bin/torchrun. Another version's
// torchrun (Debian's is 1.13) hosts a store that LibTorch 2.x's ranks cannot use. Else the one on PATH.
std::string torchrun_command() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&at::get_num_threads), &info) != 0 && info.dli_fname != nullptr) {
    std::error_code error;
    const std::filesystem::path library = std::filesystem::canonical(info.dli_fname, error);
    std::vector<std::filesystem::path> above = {library.parent_path()};  // torch/lib, torch, site-packages, ...
    while (above.size() < 6) above.push_back(above.back().parent_path());
    const std::filesystem::path& env = above[5];
    if (!error && above[2].filename() == "site-packages" && std::filesystem::exists(env / "bin" / "torchrun", error)) {
      return (env / "bin" / "torchrun").string();
    }
  }
  return "torchrun";
}

// --help, whose launch lines run as printed: this program as it was invoked, the matching torchrun with --no_python
// (without it torchrun runs python3 on the program), mpirun's flag for root.
std::string help_text(cxxopts::Options& options, const std::string& program) {
  const std::string self = shell_word(program);
  std::string text = options.help();
  text += R"(
Overrides:
  KEY=VALUE sets one config key after the recipe, left to right, in the style of Megatron-Bridge recipes:
)";
  text += "    " + self + " train.train_iters=500 optimizer.lr=3e-4 'model={num_layers: 6, hidden_size: 256}'\n";
  text += R"(  Values are YAML: 5, 3e-4, true, [a, b] (lists), null (unset an optional key), 10min (durations), text;
  quote what the shell would split or expand. ~KEY unsets a key: its default, and no longer your choice (an
  hf:<dir> start's config.json then decides the model's).

Data:
  dataset.data_path lists Megatron .bin/.idx path prefixes (bridge-preprocess-data writes them from text or JSON
  lines; Megatron-LM's tools/preprocess_data.py output works as is). builtin:tiny_fables is the embedded corpus of
  generated fables, written once to $XDG_CACHE_HOME/bridge (else ~/.cache/bridge). An empty list trains on random
  tokens.

Launching (the same command under each launcher; the world size must be a multiple of tp x cp x pp, the rest is
data parallel):
)";
  text += "  " + shell_word(torchrun_command()) + " --nproc_per_node=2 --no_python " + self +
          " parallelism.pipeline_model_parallel_size=2\n";
  text += std::string("  mpirun ") + (::geteuid() == 0 ? "--allow-run-as-root " : "") + "-np 2 " + self +
          " parallelism.tensor_model_parallel_size=2\n";
  text += R"(  (--no_python: torchrun runs the program itself, not python3 on it. Use the torchrun shown, of the PyTorch
  bridge runs on: another version's rendezvous store refuses these ranks. mpirun also needs --oversubscribe for more
  ranks than cores.)

Exit status: 0 done, 1 training failed (a restart may succeed), 2 bad command line or config, 93 a damaged
checkpoint that a restart would refuse again. torchrun restarts on any failure, whatever its code: see
docs/failures.md for using the codes to decide on a restart.

Config keys (type, default when a recipe leaves the key out):
)";
  return text + config_help();
}

// The overrides (KEY=VALUE, Hydra's ~KEY) applied to `config` in order; returns the keys the user set with them.
std::set<std::string> apply_user_overrides(ConfigContainer& config, const cxxopts::ParseResult& args) {
  for (const std::string& argument : args.unmatched()) {
    if (argument.find('=') == std::string::npos && argument.rfind('~', 0) != 0) {
      throw ConfigError("unexpected argument '" + argument +
                        "': overrides are KEY=VALUE (e.g. train.train_iters=100) or ~KEY; see --help");
    }
  }
  return apply_overrides(config, args.unmatched());
}

// The config the command line describes: the recipe (or the embedded one), then the overrides in order; with an
// hf:<dir> start, the directory's model over the recipe's (only an override may disagree with it, and then it is an
// error); then what the tokenizer decides (model.vocab_size, dataset.eod_token_id).
ConfigContainer resolve_config(const cxxopts::ParseResult& args) {
  ConfigContainer config = args.count("config") ? load_config_yaml(args["config"].as<std::string>())
                                                : load_config_yaml_string(tools::kTinyRecipeYaml, "<tiny recipe>");
  adopt_hf_architecture(config, apply_user_overrides(config, args));
  try {
    setup_tokenizer(config);
  } catch (const std::exception& error) {
    throw ConfigError(bridge::utils::describe(error));
  }
  return config;
}

// Checks that every builtin:NAME in dataset.data_path names a shipped corpus (before anything is written).
void check_builtin_data(const ConfigContainer& config) {
  const std::string builtin = tools::kBuiltinPrefix;
  for (const std::string& path : config.dataset.data_path) {
    if (path.rfind(builtin, 0) == 0 && path != builtin + tools::kTinyCorpusName) {
      throw ConfigError("dataset.data_path: unknown builtin corpus '" + path + "'; the one shipped is " + builtin +
                        tools::kTinyCorpusName);
    }
  }
}

// Replaces builtin:NAME entries by the prepared dataset's prefix.
void prepare_builtin_data(ConfigContainer& config) {
  for (std::string& path : config.dataset.data_path) {
    if (path.rfind(tools::kBuiltinPrefix, 0) == 0) path = tools::prepare_tiny_corpus(tools::default_data_dir());
  }
}

// What the last rank (which holds the losses) reports at the end.
struct RunSummary {
  // Training of this run: from on_train_start to the end of its last step (a resumed run starts part-way), which
  // also holds for an exit (train.exit_*), where on_train_end does not fire.
  std::chrono::steady_clock::time_point train_start, train_end;
  int64_t samples_at_start = 0;
  int64_t train_iters = 0;                                          // the run's, after train.train_samples
  std::optional<std::pair<int64_t, double>> first_loss, last_loss;  // (step, lm loss)
  std::optional<double> valid_loss, test_loss;
};

std::optional<double> lm_loss(const LossDict& losses) {
  const auto it = losses.find("lm loss");
  if (it == losses.end()) return std::nullopt;
  return it->second.item<double>();
}

std::shared_ptr<CallbackManager> make_callbacks(RunSummary& summary, FailureContext& failure) {
  auto callbacks = std::make_shared<CallbackManager>();
  callbacks->register_callback(
      Event::kException, [&failure](CallbackContext& ctx) { failure.step = ctx.state.train_state.step; },
      "failure_step");
  callbacks->register_callback(
      Event::kTrainStart,
      [](CallbackContext& ctx) {
        // The run's config: pretrain() has finalized it (train.train_samples gives the steps).
        const ConfigContainer& config = *ctx.state.cfg;
        const std::string data = config.dataset.data_path.empty() ? std::string("mock data (random tokens)")
                                                                  : bridge::utils::join(config.dataset.data_path, ", ");
        const tokenizers::TokenizerConfig& tokenizer = config.tokenizer;
        const std::string vocab = std::to_string(config.model.vocab_size);
        const std::string tokens =
            tokenizer.tokenizer_type.empty()
                ? "none, vocab " + vocab
                : tokenizer.tokenizer_type +
                      (tokenizer.tokenizer_model.empty() ? "" : " " + tokenizer.tokenizer_model) + ", vocab " + vocab;
        std::printf(
            "bridge-pretrain: GPT of %lld layers, hidden %lld, ~%.2fM parameters | tp=%d pp=%d dp=%d%s | %lld steps of "
            "%lld x %lld tokens | data: %s | tokenizer: %s\n",
            static_cast<long long>(config.model.num_layers), static_cast<long long>(config.model.hidden_size),
            bridge::training::utils::num_parameters(config.model, config.parallelism.tensor_model_parallel_size) / 1e6,
            parallel::get_tensor_model_parallel_world_size(), parallel::get_pipeline_model_parallel_world_size(),
            parallel::get_data_parallel_world_size(),
            parallel::get_context_parallel_world_size() > 1
                ? (" cp=" + std::to_string(parallel::get_context_parallel_world_size())).c_str()
                : "",
            static_cast<long long>(config.train.train_iters), static_cast<long long>(config.train.global_batch_size),
            static_cast<long long>(config.model.seq_length), data.c_str(), tokens.c_str());
      },
      "announce", RankFilter::kFirst);
  callbacks->register_callback(
      Event::kTrainStart,
      [&summary](CallbackContext& ctx) {
        summary.train_start = summary.train_end = std::chrono::steady_clock::now();
        summary.samples_at_start = ctx.state.train_state.consumed_train_samples;
      },
      "summary_start", RankFilter::kLast);
  callbacks->register_callback(
      Event::kTrainStepEnd,
      [&summary](CallbackContext& ctx) {
        summary.train_end = std::chrono::steady_clock::now();
        const std::optional<double> loss = lm_loss(*ctx.loss_dict);
        if (!loss) return;
        const std::pair<int64_t, double> record{ctx.state.train_state.step + 1, *loss};
        if (!summary.first_loss) summary.first_loss = record;
        summary.last_loss = record;
      },
      "summary_loss", RankFilter::kLast);
  callbacks->register_callback(
      Event::kEvalEnd, [&summary](CallbackContext& ctx) { summary.valid_loss = lm_loss(*ctx.total_loss_dict); },
      "summary_valid", RankFilter::kLast);
  callbacks->register_callback(
      Event::kTestEnd, [&summary](CallbackContext& ctx) { summary.test_loss = lm_loss(*ctx.total_loss_dict); },
      "summary_test", RankFilter::kLast);
  return callbacks;
}

void print_summary(const ConfigContainer& config, const RunSummary& summary, const TrainState& state,
                   double wall_seconds) {
  const double train_seconds = std::chrono::duration<double>(summary.train_end - summary.train_start).count();
  const double tokens = static_cast<double>(state.consumed_train_samples - summary.samples_at_start) *
                        static_cast<double>(config.model.seq_length);
  std::string text = "bridge-pretrain: done\n";
  text += "  steps:           " + std::to_string(state.step) + " of " + std::to_string(summary.train_iters) + "\n";
  char line[256];
  if (summary.last_loss) {
    std::snprintf(line, sizeof(line), "  train lm loss:   %.4f (step %lld; %.4f at step %lld)\n",
                  summary.last_loss->second, static_cast<long long>(summary.last_loss->first),
                  summary.first_loss->second, static_cast<long long>(summary.first_loss->first));
    text += line;
  }
  if (summary.valid_loss) {
    std::snprintf(line, sizeof(line), "  valid lm loss:   %.4f\n", *summary.valid_loss);
    text += line;
  }
  if (summary.test_loss) {
    std::snprintf(line, sizeof(line), "  test lm loss:    %.4f\n", *summary.test_loss);
    text += line;
  }
  std::snprintf(line, sizeof(line), "  wall time:       %.1f s (training %.1f s)\n  throughput:      %.0f tokens/s\n",
                wall_seconds, train_seconds, train_seconds > 0 ? tokens / train_seconds : 0.0);
  text += line;
  std::fputs(text.c_str(), stdout);
}

// --print-config under a launcher: every rank reaches the rendezvous store and joins a CPU (Gloo) world with the
// run's timeouts, then leaves it. The launcher's store, address, port and rank variables are those a run would use;
// a torchrun of another PyTorch, a wrong MASTER_ADDR or a rank that never starts fails here, naming what it tried.
void join_world_and_leave(const ParallelismConfig& parallelism) {
  parallel::DistributedOptions options;
  options.timeout = parallelism.timeout;
  options.rendezvous_timeout = parallelism.rendezvous_timeout;
  options.rendezvous_timeout_source = "parallelism.rendezvous_timeout";
  parallel::init_distributed(options);
  parallel::get_world_group().barrier();
  parallel::destroy_distributed();
}

}  // namespace

int main(int argc, char** argv) {
  const auto start = std::chrono::steady_clock::now();
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines from several ranks interleave whole
  parallel::LaunchEnv env;
  ConfigContainer config;
  bool print_config = false;
  try {
    // The launcher's rank, read before anything else, so config errors (the same on every rank) print once.
    env = parallel::detect_launch_env();
    cxxopts::Options options = make_options();
    const cxxopts::ParseResult args = options.parse(argc, argv);
    if (args.count("help")) {
      if (env.rank == 0) std::fputs(help_text(options, argc > 0 ? argv[0] : "bridge-pretrain").c_str(), stdout);
      return 0;
    }
    if (args.count("help-markdown")) {
      if (env.rank == 0) std::fputs(config_reference_markdown().c_str(), stdout);
      return 0;
    }
    config = resolve_config(args);
    if (args.count("print-config")) {
      // Alone, --print-config only resolves the config (a recipe for 4 ranks prints in a world of one). Under a
      // launcher it checks the launch too: the config against the launcher's world size here, every rank joining
      // the world below; so a launch line that prints its config is one that starts.
      if (env.launcher != parallel::Launcher::kNone) config.validate(env.world_size);
      print_config = true;
    } else {
      check_builtin_data(config);
      config.validate(env.world_size);
    }
  } catch (const std::exception& error) {  // cxxopts errors, ConfigError, validate()'s invalid_argument
    return fail(kExitBadConfig, "bridge-pretrain: error: " + bridge::utils::describe(error), error, {&env, {}},
                env.rank == 0);
  }
  if (print_config) {
    try {
      if (env.launcher != parallel::Launcher::kNone) join_world_and_leave(config.parallelism);
    } catch (const std::exception& error) {
      return fail(kExitTrainingFailed,
                  "bridge-pretrain: rank " + std::to_string(env.rank) +
                      ": could not join the launcher's world: " + bridge::utils::describe(error),
                  error, {&env, {}}, true);
    }
    if (env.rank == 0) std::fputs(to_yaml(config).c_str(), stdout);
    return 0;
  }

  FailureContext failure{&env, {}};
  try {
    prepare_builtin_data(config);
    RunSummary summary;
    ConfigContainer finalized = config;  // as pretrain() will run it
    finalized.finalize();
    summary.train_iters = finalized.train.train_iters;
    const TrainState state = pretrain(config, gpt_forward_step, make_callbacks(summary, failure));
    if (env.rank == env.world_size - 1) {
      print_summary(config, summary, state,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return 0;
  } catch (const PreflightError& error) {  // the same on every rank: printed by the rank that found it
    return fail(kExitBadConfig, "bridge-pretrain: error: " + bridge::utils::describe(error), error, failure,
                env.rank == error.source_rank());
  } catch (const bridge::utils::DamagedFileError& error) {  // every rank throws it when one rank's file is damaged
    return fail(kExitDoNotRestart,
                "bridge-pretrain: rank " + std::to_string(env.rank) +
                    ": training failed, and a restart would fail the same way: " + bridge::utils::describe(error),
                error, failure, true);
  } catch (const std::exception& error) {
    return fail(
        kExitTrainingFailed,
        "bridge-pretrain: rank " + std::to_string(env.rank) + ": training failed: " + bridge::utils::describe(error),
        error, failure, true);
  }
}
