// bridge-pretrain end to end, as users run it: a few steps alone (the log lines and a summary whose numbers match
// them), four ranks under mpirun with tp=2 pp=2 (sequence parallel, full recomputation) from overrides, two ranks
// under torchrun, config errors (exit 2, printed once, naming the key or file:line), a runtime failure (exit 1; under
// torchrun its message in torchrun's root cause report), a checkpoint a restart would refuse again (exit 93),
// --print-config output that loads back (an hf:<dir> start's model over the recipe's), and --help listing every key
// and launch lines that run as printed. Each run uses a tiny model and a private cache folder for the embedded corpus.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/dist/spawn.h"
#include "training/config/config_yaml.h"
#include "utils/net.h"

namespace bridge::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

constexpr const char* kPretrain = BRIDGE_PRETRAIN;
const fs::path kSourceDir = BRIDGE_SOURCE_DIR;
constexpr std::chrono::seconds kDeadline(240);

// A tiny model for a few steps: seconds per run on a loaded machine.
const std::vector<std::string> kQuick = {
    "model.num_layers=2",        "model.hidden_size=32", "model.seq_length=32",         "train.micro_batch_size=2",
    "train.global_batch_size=4", "train.train_iters=3",  "train.eval_interval=0",       "train.eval_iters=1",
    "logging.log_interval=1",    "train.num_threads=1",  "scheduler.lr_warmup_iters=0", "parallelism.timeout=2min"};

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    cache_ = fs::temp_directory_path() / ("bridge_cli_" + std::to_string(::getpid()));
    fs::remove_all(cache_);
    fs::create_directories(cache_);
  }
  void TearDown() override { fs::remove_all(cache_); }

  std::map<std::string, std::string> env() const { return {{"XDG_CACHE_HOME", cache_.string()}}; }

  RankResult run(std::vector<std::string> args, std::vector<std::string> launcher = {}) const {
    std::vector<std::string> argv = std::move(launcher);
    argv.push_back(kPretrain);
    argv.insert(argv.end(), args.begin(), args.end());
    return run_command(argv, kDeadline, env());
  }

  static std::vector<std::string> quick(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = kQuick;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  fs::path cache_;
};

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The "lm loss: 5.612345E+00" values of the training log lines, in order.
std::vector<double> logged_losses(const std::string& output) {
  std::vector<double> losses;
  const std::regex pattern("iteration +[0-9]+/ +[0-9]+ .*? lm loss: ([-+0-9.eE]+)");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), pattern); it != std::sregex_iterator(); ++it) {
    losses.push_back(std::stod((*it)[1]));
  }
  return losses;
}

TEST_F(Cli, AloneTrainsAFewStepsAndEndsWithASummaryOfThem) {
  const RankResult result = run(quick());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::vector<double> losses = logged_losses(result.output);
  ASSERT_EQ(losses.size(), 3u) << result.output;
  EXPECT_THAT(result.output, HasSubstr("tp=1 pp=1 dp=1 | 3 steps of 4 x 32 tokens"));
  EXPECT_THAT(result.output, HasSubstr("data: " + (cache_ / "bridge" / "tiny_fables_v1_text_document").string()));
  EXPECT_TRUE(fs::exists(cache_ / "bridge" / "tiny_fables_v1_text_document.idx"));
  EXPECT_THAT(result.output, HasSubstr("validation loss at iteration 3 on validation set"));

  // The summary reports the last logged loss, the first one, and the validation loss.
  EXPECT_EQ(count(result.output, "bridge-pretrain: done"), 1) << result.output;
  EXPECT_THAT(result.output, HasSubstr("steps:           3 of 3"));
  std::smatch match;
  ASSERT_TRUE(std::regex_search(result.output, match,
                                std::regex("train lm loss: +([0-9.]+) \\(step 3; ([0-9.]+) at step 1\\)")))
      << result.output;
  EXPECT_NEAR(std::stod(match[1]), losses.back(), 1e-4);
  EXPECT_NEAR(std::stod(match[2]), losses.front(), 1e-4);
  EXPECT_GT(losses.front(), 4.5);  // about ln(257) from random weights
  EXPECT_THAT(result.output, AllOf(HasSubstr("valid lm loss:"), HasSubstr("wall time:"), HasSubstr("tokens/s")));

  // A second run finds the corpus already prepared and trains the same (deterministic) losses.
  const RankResult again = run(quick());
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(logged_losses(again.output), losses);
  EXPECT_THAT(again.output, ::testing::Not(HasSubstr("damaged")));

  // A damaged corpus is written again: an in-range token changed in the .bin (which would train silently on other
  // text), then a truncated .idx (which would stop the run).
  const fs::path prefix = cache_ / "bridge" / "tiny_fables_v1_text_document";
  const auto read = [](const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  const auto write = [](const fs::path& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  };
  const std::string bin = read(prefix.string() + ".bin"), idx = read(prefix.string() + ".idx");
  std::string flipped = bin;
  flipped[1000] ^= 1;  // a byte-level token stays below the vocabulary
  write(prefix.string() + ".bin", flipped);
  const RankResult repaired = run(quick());
  ASSERT_EQ(repaired.exit_code, 0) << repaired.output;
  EXPECT_THAT(repaired.output, AllOf(HasSubstr("is damaged (document"), HasSubstr("writing it again")));
  EXPECT_EQ(logged_losses(repaired.output), losses);
  EXPECT_EQ(read(prefix.string() + ".bin"), bin);
  write(prefix.string() + ".idx", idx.substr(0, 20));
  const RankResult truncated = run(quick());
  ASSERT_EQ(truncated.exit_code, 0) << truncated.output;
  EXPECT_THAT(truncated.output, AllOf(HasSubstr("at least 34 bytes"), HasSubstr("writing it again")));
  EXPECT_EQ(read(prefix.string() + ".idx"), idx);
}

// The embedded default, shortened: the tiny recipe's model and data learn (the README's promise).
TEST_F(Cli, TheDefaultRecipeLearnsTheEmbeddedCorpus) {
  const RankResult result = run({"train.train_iters=40", "train.eval_interval=0", "logging.log_interval=10"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::vector<double> losses = logged_losses(result.output);
  ASSERT_EQ(losses.size(), 5u) << result.output;  // steps 1, 10, 20, 30, 40
  for (std::size_t i = 1; i < losses.size(); ++i) EXPECT_LT(losses[i], losses[i - 1]) << result.output;
  EXPECT_LT(losses.back(), 4.0) << "from about ln(257) = 5.5 at the start";
}

// A dataset written by an independent port of Megatron-Core's writer (uint16 tokens up to 65535, unaligned arrays),
// as users bring from Megatron-LM's tools, trains as it is.
TEST_F(Cli, TrainsOnAMegatronFormatDataset) {
  const fs::path prefix = cache_ / "megatron_text_document";
  const RankResult written =
      run_command({BRIDGE_NUMPY_PYTHON, (kSourceDir / "tests/tools/megatron_indexed_writer.py").string(),
                   prefix.string(), "uint16", "300"},
                  kDeadline);
  ASSERT_EQ(written.exit_code, 0) << written.output;
  const RankResult result =
      run(quick({"model.vocab_size=65536", "dataset.data_path=[" + prefix.string() + "]", "dataset.split=98,1,1"}));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("data: " + prefix.string()));
  EXPECT_EQ(logged_losses(result.output).size(), 3u) << result.output;
  EXPECT_THAT(result.output, HasSubstr("bridge-pretrain: done"));
  EXPECT_TRUE(fs::exists(cache_ / "cache" / "GPTDataset_indices")) << "the sample indices are cached next to the data";
}

// With Megatron-Core's memory switches on, under the names Megatron-Bridge's recipes use too.
TEST_F(Cli, MpirunFourRanksWithTensorAndPipelineParallelOverrides) {
  const RankResult result =
      run(quick({"parallelism.tensor_model_parallel_size=2", "parallelism.pipeline_model_parallel_size=2",
                 "model.sequence_parallel=true", "model.recompute_granularity=full", "model.recompute_method=uniform",
                 "model.recompute_num_layers=1"}),
          {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4", "-x", "XDG_CACHE_HOME"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(count(result.output, "tp=2 pp=2 dp=1"), 1) << result.output;  // announced by rank 0 only
  EXPECT_EQ(logged_losses(result.output).size(), 3u) << result.output;
  EXPECT_EQ(count(result.output, "bridge-pretrain: done"), 1) << result.output;  // the last rank's summary
  EXPECT_THAT(result.output, HasSubstr("steps:           3 of 3"));
}

// Megatron-Bridge's recipe as it writes it, with Megatron-Core's three memory switches on under its names: four
// ranks, tp 2 x dp 2, under mpirun.
TEST_F(Cli, MpirunFourRanksTrainAMegatronBridgeRecipeWithTheThreeMemorySwitches) {
  const RankResult result =
      run({"--config", (kSourceDir / "examples/recipes/megatron_bridge_gpt.yaml").string(),
           "model.tensor_model_parallel_size=2", "model.sequence_parallel=true", "model.recompute_granularity=full",
           "model.recompute_method=uniform", "model.recompute_num_layers=1", "optimizer.use_distributed_optimizer=true",
           "ddp.use_distributed_optimizer=true", "ddp.overlap_param_gather=true", "train.train_iters=3",
           "logger.log_interval=1", "validation.eval_iters=1", "dist.distributed_timeout_minutes=2"},
          {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4", "-x", "XDG_CACHE_HOME"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(count(result.output, "tp=2 pp=1 dp=2"), 1) << result.output;
  EXPECT_EQ(logged_losses(result.output).size(), 3u) << result.output;
  EXPECT_EQ(count(result.output, "bridge-pretrain: done"), 1) << result.output;
}

// Megatron-Bridge's recipe with context parallelism as its long-context recipes set it (model.context_parallel_size,
// model.cp_comm_type) under torchrun: four ranks, tp 2 x cp 2 with sequence parallelism, train the losses of tp 2
// alone on two ranks (the same samples per step; each cp rank half of every sequence).
TEST_F(Cli, TorchrunFourRanksTrainAMegatronBridgeRecipeWithContextParallelism) {
  const auto recipe = [&](int ranks, std::vector<std::string> extra) {
    std::vector<std::string> args = {"--config",
                                     (kSourceDir / "examples/recipes/megatron_bridge_gpt.yaml").string(),
                                     "model.tensor_model_parallel_size=2",
                                     "model.sequence_parallel=true",
                                     "train.train_iters=3",
                                     "logger.log_interval=1",
                                     "validation.eval_iters=1"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run(args, {BRIDGE_TORCHRUN, "--no_python", "--nproc_per_node=" + std::to_string(ranks),
                      "--master_addr=127.0.0.1", "--master_port=" + std::to_string(utils::find_free_port())});
  };
  const RankResult cp = recipe(4, {"model.context_parallel_size=2", "model.cp_comm_type=a2a"});
  ASSERT_EQ(cp.exit_code, 0) << cp.output;
  EXPECT_EQ(count(cp.output, "tp=2 pp=1 dp=1 cp=2"), 1) << cp.output;
  EXPECT_EQ(count(cp.output, "bridge-pretrain: done"), 1) << cp.output;
  const RankResult tp = recipe(2, {});
  ASSERT_EQ(tp.exit_code, 0) << tp.output;
  const std::vector<double> with_cp = logged_losses(cp.output), without = logged_losses(tp.output);
  ASSERT_EQ(with_cp.size(), 3u) << cp.output;
  ASSERT_EQ(without.size(), 3u) << tp.output;
  for (std::size_t i = 0; i < without.size(); ++i) {
    EXPECT_NEAR(with_cp[i], without[i], 1e-5 * without[i]) << "step " << i + 1;  // the log's 7 significant digits
  }
}

TEST_F(Cli, TorchrunTwoDataParallelRanks) {
  const RankResult result =
      run(quick(), {BRIDGE_TORCHRUN, "--no_python", "--nproc_per_node=2", "-r", "0:1,1:1", "-t", "0:1,1:1",
                    "--master_addr=127.0.0.1", "--master_port=" + std::to_string(utils::find_free_port())});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(count(result.output, "tp=1 pp=1 dp=2"), 1) << result.output;
  EXPECT_EQ(count(result.output, "bridge-pretrain: done"), 1) << result.output;
}

// A job whose other rank never starts: rank 0 names it once parallelism.rendezvous_timeout has passed (not at
// parallelism.timeout, 2 min here), in one line.
TEST_F(Cli, ARankThatNeverStartsIsNamedAtTheRendezvousTimeout) {
  const std::string store = "127.0.0.1:" + std::to_string(utils::find_free_port());
  std::map<std::string, std::string> vars = env();
  vars.insert({{"RANK", "0"},
               {"LOCAL_RANK", "0"},
               {"WORLD_SIZE", "2"},
               {"LOCAL_WORLD_SIZE", "2"},
               {"MASTER_ADDR", "127.0.0.1"},
               {"MASTER_PORT", store.substr(store.find(':') + 1)}});
  std::vector<std::string> argv = quick({"parallelism.rendezvous_timeout=5s"});
  argv.insert(argv.begin(), kPretrain);
  const RankResult result = run_command(argv, kDeadline, vars);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_LT(result.seconds, 30.0) << result.output;
  EXPECT_EQ(
      count(result.output, "bridge-pretrain: rank 0: training failed: rank 1 of 2 never joined the rendezvous at " +
                               store + " within 5 s (parallelism.rendezvous_timeout)"),
      1)
      << result.output;
  EXPECT_THAT(result.output, ::testing::Not(HasSubstr("[c10d]")));
}

TEST_F(Cli, ConfigErrorsExitTwoNamingTheKeyOnce) {
  const RankResult typo = run({"train.global_bach_size=8"});
  EXPECT_EQ(typo.exit_code, 2) << typo.output;
  EXPECT_THAT(typo.output, AllOf(HasSubstr("unknown config key 'train.global_bach_size'"),
                                 HasSubstr("did you mean 'train.global_batch_size'?")));

  const fs::path recipe = cache_ / "bad.yaml";
  std::ofstream(recipe) << "model:\n  num_layers: 2\ntrain:\n  train_iters: many\n";
  const RankResult wrong_type = run({"--config", recipe.string()});
  EXPECT_EQ(wrong_type.exit_code, 2) << wrong_type.output;
  EXPECT_THAT(wrong_type.output, HasSubstr(recipe.string() + ":4:16: train.train_iters must be an int, got 'many'"));

  const RankResult invalid = run({"train.global_batch_size=6"});  // not a multiple of micro_batch_size 4
  EXPECT_EQ(invalid.exit_code, 2) << invalid.output;
  EXPECT_THAT(invalid.output, HasSubstr("train.global_batch_size (6)"));

  const RankResult unknown_option = run({"--confg", "x.yaml"});
  EXPECT_EQ(unknown_option.exit_code, 2) << unknown_option.output;
  EXPECT_THAT(unknown_option.output, HasSubstr("confg"));

  // Every rank finds the same error; only rank 0 prints it.
  const RankResult two_ranks =
      run({"model.num_layerz=2"}, {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"});
  EXPECT_NE(two_ranks.exit_code, 0) << two_ranks.output;
  EXPECT_EQ(count(two_ranks.output, "unknown config key 'model.num_layerz'"), 1) << two_ranks.output;
}

#if defined(BRIDGE_EXAMPLE_PLUGIN)
// A callback plugin (examples/plugin/) that bridge-pretrain loads from the recipe on every rank under mpirun: its
// callback logs on both data-parallel ranks (each holds the losses) and its stop after step 2 ends both. A library
// of another plugin protocol, one that is no plugin, a truncated one and a missing file are config errors (exit 2)
// naming the entry.
TEST_F(Cli, MpirunLoadsACallbackPluginFromTheRecipe) {
  const std::vector<std::string> mpirun = {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
                                           "-x",     "XDG_CACHE_HOME"};
  const auto entry = [](const std::string& path) {
    return "callbacks=[{type: Plugin, path: " + path + ", stop_at_step: 2, message: hi}]";
  };
  const RankResult result = run(quick({"train.train_iters=10", entry(BRIDGE_EXAMPLE_PLUGIN)}), mpirun);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (const char* line : {"example plugin (rank 0): hi at step 1, lm loss", "example plugin (rank 1): hi at step 2"}) {
    EXPECT_EQ(count(result.output, line), 1) << line << "\n" << result.output;
  }
  EXPECT_EQ(count(result.output, "example plugin (rank"), 4) << result.output;  // 2 steps x 2 ranks
  EXPECT_THAT(result.output, HasSubstr("callback 'example_plugin' asked to stop during on_train_step_end: the "
                                       "example plugin's stop_at_step is 2"));
  EXPECT_THAT(result.output, HasSubstr("steps:           2 of 10"));

  const RankResult other_abi = run(quick({entry(BRIDGE_OTHER_ABI_PLUGIN)}), mpirun);
  EXPECT_EQ(other_abi.exit_code, 2) << other_abi.output;
  EXPECT_THAT(other_abi.output, AllOf(HasSubstr("callbacks[0].path: '"), HasSubstr("was built for \"bridge-plugin 0;"),
                                      HasSubstr("rebuild the plugin against this bridge")));
  const RankResult not_a_plugin = run(quick({entry(BRIDGE_PRETRAIN)}));  // an executable cannot be dlopen'ed
  EXPECT_EQ(not_a_plugin.exit_code, 2) << not_a_plugin.output;
  EXPECT_THAT(not_a_plugin.output, HasSubstr("callbacks[0].path: cannot load"));
  // A plugin cut short (a partial copy, a full disk): dlopen would map it past its end and die of SIGBUS.
  const fs::path truncated = cache_ / "libtruncated_plugin.so";
  fs::create_directories(cache_);
  fs::copy_file(BRIDGE_EXAMPLE_PLUGIN, truncated, fs::copy_options::overwrite_existing);
  fs::resize_file(truncated, fs::file_size(truncated) / 2);
  const RankResult cut = run(quick({entry(truncated.string())}), mpirun);
  EXPECT_EQ(cut.exit_code, 2) << cut.output;
  EXPECT_THAT(cut.output, AllOf(HasSubstr("callbacks[0].path: '" + truncated.string() +
                                          "' is not a loadable shared library: it is truncated"),
                                HasSubstr("copy or build it again")));
  const RankResult missing = run(quick({entry("/nonexistent/libmine.so")}));
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_THAT(missing.output, HasSubstr("callbacks[0].path: no plugin at '/nonexistent/libmine.so'"));
}
#endif

TEST_F(Cli, RuntimeFailureExitsOne) {
  const RankResult result = run(quick({"dataset.data_path=[/nonexistent/corpus_text_document]"}));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_THAT(result.output, AllOf(HasSubstr("training failed"), HasSubstr("/nonexistent/corpus_text_document")));
}

// Under torchrun, a failing rank writes TORCHELASTIC_ERROR_FILE, so torchrun's "Root Cause (first observed failure)"
// shows bridge's message, its type and rank instead of "<N/A>"; a failure a restart would meet again (a damaged
// checkpoint to load) exits 93, which torchrun's report names as the rank's exit code.
TEST_F(Cli, TorchrunReportsTheRootCauseAndTheExitCodeSaysWhetherToRestart) {
  const auto torchrun = [&](std::vector<std::string> args) {
    return run(quick(std::move(args)), {BRIDGE_TORCHRUN, "--no_python", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                                        "--master_port=" + std::to_string(utils::find_free_port())});
  };
  const auto root_cause = [](const std::string& output) {
    const std::size_t at = output.find("Root Cause (first observed failure):");
    return at == std::string::npos ? std::string() : output.substr(at);
  };
  const RankResult missing = torchrun({"dataset.data_path=[/nonexistent/corpus_text_document]"});
  EXPECT_NE(missing.exit_code, 0) << missing.output;
  const std::string cause = root_cause(missing.output);
  ASSERT_FALSE(cause.empty()) << missing.output;
  EXPECT_THAT(cause, AllOf(HasSubstr("exitcode  : 1"), HasSubstr("error_file: "), HasSubstr("(a restart may succeed)"),
                           HasSubstr(": training failed: "), HasSubstr("/nonexistent/corpus_text_document")))
      << missing.output;
  EXPECT_THAT(cause, ::testing::Not(HasSubstr("<N/A>"))) << missing.output;
  EXPECT_THAT(cause, ::testing::Not(HasSubstr("To enable traceback"))) << missing.output;

  // A damaged checkpoint to load: every restart would refuse it again.
  const fs::path save = cache_ / "ckpt";
  const RankResult saved = run(quick({"checkpoint.ckpt_format=torch", "checkpoint.save=" + save.string()}));
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  const fs::path file = save / "iter_0000003" / "mp_rank_00" / "model_optim_rng.pt";
  {  // one byte inverted in the middle of the rank file
    const auto middle = static_cast<std::streamoff>(fs::file_size(file) / 2);
    std::fstream bytes(file, std::ios::in | std::ios::out | std::ios::binary);
    bytes.seekg(middle);
    const int byte = bytes.get();
    bytes.seekp(middle);
    bytes.put(static_cast<char>(byte ^ 0xFF));
  }
  const RankResult damaged = torchrun({"checkpoint.load=" + save.string()});
  EXPECT_NE(damaged.exit_code, 0) << damaged.output;
  EXPECT_THAT(root_cause(damaged.output), AllOf(HasSubstr("exitcode  : 93"), HasSubstr("DamagedFileError"),
                                                HasSubstr("(a restart would fail the same way)"),
                                                HasSubstr("training failed, and a restart would fail the same way: "),
                                                HasSubstr(file.string() + " is damaged")))
      << damaged.output;
}

TEST_F(Cli, PrintConfigLoadsBackAndTheEmbeddedRecipeIsTheFile) {
  const RankResult printed = run(
      {"--print-config", "train.train_iters=42", "dataset.data_path=[a, b c]", "parallelism.rendezvous_timeout=45s"});
  ASSERT_EQ(printed.exit_code, 0) << printed.output;
  const training::ConfigContainer config = training::load_config_yaml_string(printed.output, "--print-config");
  EXPECT_EQ(config.train.train_iters, 42);
  EXPECT_EQ(config.parallelism.rendezvous_timeout, std::chrono::seconds(45));
  EXPECT_EQ(config.dataset.data_path, (std::vector<std::string>{"a", "b c"}));
  const training::ConfigContainer tiny = training::load_config_yaml(kSourceDir / "examples/recipes/tiny.yaml");
  EXPECT_EQ(config.model.num_layers, tiny.model.num_layers);
  EXPECT_EQ(config.train.global_batch_size, tiny.train.global_batch_size);

  const RankResult embedded = run({"--print-config"});
  const RankResult from_file =
      run({"--config", (kSourceDir / "examples/recipes/tiny.yaml").string(), "--print-config"});
  ASSERT_EQ(embedded.exit_code, 0) << embedded.output;
  EXPECT_EQ(embedded.output, from_file.output);
  EXPECT_EQ(embedded.output, training::to_yaml(tiny));
}

TEST_F(Cli, TheTokenizerSectionSetsTheVocabularyAndEodBeforeAnyRankStarts) {
  const RankResult printed =
      run({"--print-config", "tokenizer.tokenizer_type=NullTokenizer", "tokenizer.vocab_size=500"});
  ASSERT_EQ(printed.exit_code, 0) << printed.output;
  const training::ConfigContainer config = training::load_config_yaml_string(printed.output, "--print-config");
  EXPECT_EQ(config.model.vocab_size, 500);  // the tiny recipe's 257 is smaller
  EXPECT_EQ(config.dataset.eod_token_id, 499);

  const RankResult missing = run(quick({"tokenizer.tokenizer_type=HuggingFaceTokenizer"}));
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_THAT(missing.output, HasSubstr("needs tokenizer.tokenizer_model"));
  const RankResult small = run(quick({"tokenizer.tokenizer_type=NullTokenizer", "tokenizer.vocab_size=500",
                                      "tokenizer.use_tokenizer_vocab_size=false"}));
  EXPECT_EQ(small.exit_code, 2) << small.output;
  EXPECT_THAT(small.output, HasSubstr("model.vocab_size (257) is smaller than the 500 ids"));
}

TEST_F(Cli, HelpListsEveryConfigKey) {
  const RankResult help = run({"--help"});
  ASSERT_EQ(help.exit_code, 0) << help.output;
  EXPECT_THAT(help.output, AllOf(HasSubstr("--config"), HasSubstr("--print-config"), HasSubstr("KEY=VALUE"),
                                 HasSubstr("torchrun"), HasSubstr("mpirun"), HasSubstr("builtin:tiny_fables")));
  for (const training::ConfigKeyInfo& key : training::config_keys()) {
    EXPECT_THAT(help.output, HasSubstr("  " + key.key + " (" + key.type)) << key.key;
  }
}

// The launch lines --help prints have what running them as copied needs: the program as invoked, torchrun with
// --no_python (else it runs python3 on the program) and the torchrun of bridge's PyTorch, mpirun with its flag for
// root. DocsCommands runs them through their launchers.
TEST_F(Cli, HelpsLaunchLinesNameTheBuildsTorchrunAndTheirFlags) {
  const RankResult help = run({"--help"});
  ASSERT_EQ(help.exit_code, 0) << help.output;
  std::istringstream lines(help.output);
  int launch_lines = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.find(std::string(" ") + kPretrain + " ") == std::string::npos) continue;
    if (line.find("torchrun") != std::string::npos) {
      ++launch_lines;
      EXPECT_THAT(line, HasSubstr(" --no_python " + std::string(kPretrain) + " ")) << line;
      // The build's torchrun (BRIDGE_TORCHRUN: the wheel's, beside its LibTorch), not whichever is on PATH.
      EXPECT_EQ(line.substr(2, line.find(' ', 2) - 2), fs::canonical(BRIDGE_TORCHRUN).string()) << line;
    } else if (line.find("mpirun") != std::string::npos) {
      ++launch_lines;
      if (::geteuid() == 0) {
        EXPECT_THAT(line, HasSubstr("mpirun --allow-run-as-root ")) << line;
      }
    }
  }
  EXPECT_EQ(launch_lines, 2) << help.output;
}

// checkpoint.pretrained_checkpoint=hf:<dir> takes the model from <dir>/config.json over any recipe's model.* (the
// embedded one and the same file by --config give the same run); a disagreeing override exits 2 naming both values;
// ~key hands the key back to the directory. Only config.json is read before the ranks start.
TEST_F(Cli, AnHfStartTakesTheModelOverTheRecipe) {
  const fs::path hf = cache_ / "hf";
  fs::create_directories(hf);
  std::ofstream(hf / "config.json") << R"({"model_type": "gpt2", "n_layer": 3, "n_embd": 48, "n_head": 4,
                                         "vocab_size": 301, "n_positions": 128})";
  const std::string start = "checkpoint.pretrained_checkpoint=hf:" + hf.string();
  const std::string tiny = (kSourceDir / "examples/recipes/tiny.yaml").string();
  const RankResult embedded = run({start, "--print-config"});
  const RankResult from_file = run({"--config", tiny, start, "--print-config"});
  ASSERT_EQ(from_file.exit_code, 0) << from_file.output;
  EXPECT_EQ(from_file.output, embedded.output);
  const training::ConfigContainer config = training::load_config_yaml_string(from_file.output, "--print-config");
  EXPECT_EQ(config.model.num_layers, 3);
  EXPECT_EQ(config.model.hidden_size, 48);
  EXPECT_EQ(config.model.vocab_size, 301);
  EXPECT_EQ(config.model.seq_length, 64);  // the recipe's
  const RankResult handed_back =
      run({"--config", tiny, start, "model.num_layers=4", "~model.num_layers", "--print-config"});
  EXPECT_EQ(handed_back.output, from_file.output);
  const RankResult disagreeing = run({"--config", tiny, start, "model.num_layers=4", "--print-config"});
  EXPECT_EQ(disagreeing.exit_code, 2) << disagreeing.output;
  EXPECT_THAT(disagreeing.output, HasSubstr("but model.num_layers (4, config.json: 3) disagrees"));
}

}  // namespace
}  // namespace bridge::testing
