// What the training log costs per step: pretrain() of a small GPT on mock data with (A) logging off as far as it goes
// (no log step, no writers, no extra statistics) and (B) everything on at every step (console line, TensorBoard and
// JSONL writers, params norm, per-parameter grad norms, memory, throughput, runtime, world size). The two alternate
// A, B, A, B, ... in one process so drift in the machine's load hits both. Run it alone or under a launcher; with
// several ranks the world is initialised once here, so every pretrain() reuses it. bench/run_logging_overhead_bench.sh
// runs both. Rank 0 prints one machine-readable line per rank:
//   logbench rank=<r> world=<n> tp=<t> pp=<p> a_ms=<median> b_ms=<median> ratio=<b/a> overhead_ms=<b-a>
//     paired_overhead_ms=.. a_tail_ms=.. b_tail_ms=.. tail_overhead_ms=.. a_world_ops=.. a_mp_ops=.. b_world_ops=..
//     b_mp_ops=.. steps=<timed per configuration> threads=<t>
// A step here is one iteration of the training loop, from on_train_step_start to the next one (or on_train_end):
// the log step runs after on_train_step_end, so a window ending there would miss it. a_ms and b_ms are medians over
// all runs' timed steps; paired_overhead_ms is the median over repeats of B - A of the two neighbouring runs. The
// tail is the part after on_train_step_end (the log step and the control agreement), the same work in both but for
// the logging, so tail_overhead_ms is the overhead least disturbed by noise in the step. ops are collectives per
// step on the world and the model-parallel group (groups of one communicate nothing and count none).
//
//   logging_overhead_bench --steps 30 --warmup-steps 5 --repeats 3 --threads 1
//   mpirun -np 2 logging_overhead_bench --pp 2 --threads 1
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cxxopts.hpp>
#include <filesystem>
#include <limits>
#include <numeric>
#include <string>
#include <system_error>
#include <vector>

#include "bench/gpt_bench_model.h"
#include "bridge/bridge.h"
#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "utils/check.h"

namespace {

using namespace bridge::training;
using Clock = std::chrono::steady_clock;

using bridge::bench::median;

double mean(const std::vector<double>& values) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  return std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
}

// The timed steps of one configuration, pooled over its runs.
struct Samples {
  std::vector<double> step_ms;  // on_train_step_start to the next on_train_step_start
  std::vector<double> tail_ms;  // on_train_step_end to the next on_train_step_start
  std::vector<double> world_ops;
  std::vector<double> model_parallel_ops;

  void append(const Samples& other) {
    step_ms.insert(step_ms.end(), other.step_ms.begin(), other.step_ms.end());
    tail_ms.insert(tail_ms.end(), other.tail_ms.begin(), other.tail_ms.end());
    world_ops.insert(world_ops.end(), other.world_ops.begin(), other.world_ops.end());
    model_parallel_ops.insert(model_parallel_ops.end(), other.model_parallel_ops.begin(),
                              other.model_parallel_ops.end());
  }
};

// A private folder for run B's writers, removed when the benchmark ends (also when it throws).
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "logging_overhead_bench.XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("cannot create a temporary folder from " + pattern + "; set TMPDIR to a writable one");
    }
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Everything on, at every step; `dir` gets this run's TensorBoard events and JSONL file.
void enable_all_logging(LoggingConfig& logging, const std::filesystem::path& dir) {
  logging.log_interval = 1;
  logging.tensorboard_log_interval = 1;
  logging.tensorboard_dir = (dir / "tensorboard").string();
  logging.jsonl_path = (dir / "metrics.jsonl").string();
  logging.log_params_norm = true;
  logging.log_l2_norm_grad_to_tensorboard = true;
  logging.log_memory_to_tensorboard = true;
  logging.log_throughput = true;
  logging.log_throughput_to_tensorboard = true;
  logging.log_runtime_to_tensorboard = true;
  logging.log_world_size_to_tensorboard = true;
}

// One pretrain() of `config`; appends its steps from `warmup` on to `samples`.
void run_once(const ConfigContainer& config, int64_t warmup, Samples& samples) {
  struct Mark {
    int64_t step = -1;
    Clock::time_point start, end;
    std::uint64_t world_ops = 0, model_parallel_ops = 0;
  };
  Mark open;  // the step under way
  // Closes the step under way at `now`: the next step's start or the end of training.
  auto close = [&](Clock::time_point now) {
    if (open.step < warmup) return;
    const std::uint64_t world_ops = bridge::parallel::get_world_group().operation_count();
    const std::uint64_t model_parallel_ops = bridge::parallel::get_model_parallel_group().operation_count();
    samples.step_ms.push_back(std::chrono::duration<double, std::milli>(now - open.start).count());
    samples.tail_ms.push_back(std::chrono::duration<double, std::milli>(now - open.end).count());
    samples.world_ops.push_back(static_cast<double>(world_ops - open.world_ops));
    samples.model_parallel_ops.push_back(static_cast<double>(model_parallel_ops - open.model_parallel_ops));
  };
  auto callbacks = std::make_shared<CallbackManager>();
  callbacks->register_callback(Event::kTrainStepStart, [&](CallbackContext& ctx) {
    const auto now = Clock::now();
    close(now);
    open.step = ctx.state.train_state.step;
    open.start = now;
    open.world_ops = bridge::parallel::get_world_group().operation_count();
    open.model_parallel_ops = bridge::parallel::get_model_parallel_group().operation_count();
  });
  callbacks->register_callback(Event::kTrainStepEnd, [&](CallbackContext&) { open.end = Clock::now(); });
  callbacks->register_callback(Event::kTrainEnd, [&](CallbackContext&) { close(Clock::now()); });
  pretrain(config, gpt_forward_step, callbacks);
}

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options options("logging_overhead_bench", "per-step cost of pretrain()'s training log, all off vs all on");
  bridge::bench::add_gpt_model_options(options);
  options.add_options()("microbatches", "micro-batches per step and data-parallel rank",
                        cxxopts::value<int64_t>()->default_value("1"))("tp", "tensor-model-parallel size",
                                                                       cxxopts::value<int>()->default_value("1"))(
      "pp", "pipeline-model-parallel size", cxxopts::value<int>()->default_value("1"))(
      "steps", "timed steps per run", cxxopts::value<int64_t>()->default_value("30"))(
      "warmup-steps", "untimed steps before them in every run", cxxopts::value<int64_t>()->default_value("5"))(
      "repeats", "runs of each configuration, alternated A, B, A, B, ...", cxxopts::value<int>()->default_value("3"))(
      "threads", "intra-op threads per rank", cxxopts::value<int>()->default_value("1"))("h,help", "print this help");
  try {
    const cxxopts::ParseResult args = options.parse(argc, argv);
    if (args.count("help")) {
      std::printf("%s\n", options.help().c_str());
      return 0;
    }
    const int64_t steps = args["steps"].as<int64_t>();
    const int64_t warmup = args["warmup-steps"].as<int64_t>();
    const int repeats = args["repeats"].as<int>();
    bridge::utils::require(steps > 0 && warmup >= 0 && repeats > 0,
                           "--steps and --repeats must be positive and --warmup-steps not negative");

    // One world for all runs: each pretrain() builds and releases only its model-parallel groups.
    bridge::parallel::init_distributed();
    const int world_size = bridge::parallel::get_world_size();

    ConfigContainer base = bridge::bench::gpt_bench_config(args);
    base.parallelism.tensor_model_parallel_size = args["tp"].as<int>();
    base.parallelism.pipeline_model_parallel_size = args["pp"].as<int>();
    base.train.global_batch_size =
        base.train.micro_batch_size * args["microbatches"].as<int64_t>() * base.data_parallel_size(world_size);
    base.train.train_iters = warmup + steps;
    base.train.num_threads = args["threads"].as<int>();

    // A: no log step at all (log_interval past train_iters), no writers, no optional statistic.
    ConfigContainer off = base;
    off.logging.log_interval = std::numeric_limits<int64_t>::max();
    TempDir temp;
    Samples a, b;
    // B - A of each repeat's medians: the two runs of a repeat are next to each other, so slower drift cancels.
    std::vector<double> paired_ms;
    for (int repeat = 0; repeat < repeats; ++repeat) {
      Samples a_run, b_run;
      run_once(off, warmup, a_run);
      ConfigContainer on = base;
      enable_all_logging(on.logging, temp.path() / ("run" + std::to_string(repeat)));
      run_once(on, warmup, b_run);
      paired_ms.push_back(median(b_run.step_ms) - median(a_run.step_ms));
      a.append(a_run);
      b.append(b_run);
    }

    // Rank 0 prints every rank's figures: the last rank writes the metrics, the others wait for it.
    enum Figure { kAMs, kBMs, kATail, kBTail, kPaired, kAWorld, kAModelParallel, kBWorld, kBModelParallel, kFigures };
    std::vector<double> mine(kFigures);
    mine[kAMs] = median(a.step_ms);
    mine[kBMs] = median(b.step_ms);
    mine[kATail] = median(a.tail_ms);
    mine[kBTail] = median(b.tail_ms);
    mine[kPaired] = median(paired_ms);
    mine[kAWorld] = mean(a.world_ops);
    mine[kAModelParallel] = mean(a.model_parallel_ops);
    mine[kBWorld] = mean(b.world_ops);
    mine[kBModelParallel] = mean(b.model_parallel_ops);
    const std::vector<torch::Tensor> all =
        bridge::parallel::get_world_group().all_gather(torch::tensor(mine, torch::kDouble));
    if (bridge::parallel::get_rank() == 0) {
      for (std::size_t rank = 0; rank < all.size(); ++rank) {
        const auto v = all[rank].accessor<double, 1>();
        std::printf("logbench rank=%zu world=%d tp=%d pp=%d a_ms=%.3f b_ms=%.3f ratio=%.4f overhead_ms=%.3f ", rank,
                    world_size, base.parallelism.tensor_model_parallel_size,
                    base.parallelism.pipeline_model_parallel_size, v[kAMs], v[kBMs], v[kBMs] / v[kAMs],
                    v[kBMs] - v[kAMs]);
        std::printf("paired_overhead_ms=%.3f a_tail_ms=%.3f b_tail_ms=%.3f tail_overhead_ms=%.3f ", v[kPaired],
                    v[kATail], v[kBTail], v[kBTail] - v[kATail]);
        std::printf("a_world_ops=%.2f a_mp_ops=%.2f b_world_ops=%.2f b_mp_ops=%.2f steps=%zu threads=%d\n", v[kAWorld],
                    v[kAModelParallel], v[kBWorld], v[kBModelParallel], a.step_ms.size(), base.train.num_threads);
      }
      std::fflush(stdout);
    }
    bridge::parallel::destroy_distributed();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "logging_overhead_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
