// Context parallelism's memory and speed, one rank's view: pretrain() of a small GPT on mock data at a long sequence,
// with each rank's activation peak (the most bytes of live CPU tensors between the start of a micro-batch's forward
// and the end of its backward, less those alive at its start: what the forward keeps for backward plus the
// backward's working set at its worst) beside the preflight's predicted activations for the same config
// (training/utils/theoretical_memory), and the step time. bench/run_context_parallel_bench.sh runs it at cp 1, 2, 4
// and for each cp_comm_type, and prints the table. Each rank prints one machine-readable line:
//   cpbench rank=<r> world=<n> step_ms=<median> best_ms=<fastest> steps=<n> threads=<t> activation_peak_mib=<max over
//       the micro-batches> predicted_activations_mib=<estimate_memory(config, world).activations>
//       forward_kept_mib=<alive at the forward's end, less the start's: what backward will read> forward_peak_mib=<the
//       forward's own peak, less the start's> first_loss=<step 0's lm loss>
// Config overrides follow the flags, as bridge-pretrain's:
//   mpirun -np 2 context_parallel_bench --block llama --seq 8192 --micro-batch 1
//       parallelism.context_parallel_size=2 model.cp_comm_type=p2p
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cxxopts.hpp>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/gpt_bench_model.h"
#include "bridge/bridge.h"
#include "parallel/launch_env.h"
#include "training/config/config_yaml.h"
#include "training/utils/theoretical_memory.h"
#include "utils/counting_allocator.h"
#include "utils/host_allocator.h"

namespace {

using namespace bridge::training;
using Clock = std::chrono::steady_clock;

constexpr double kMiB = 1024.0 * 1024.0;

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options options("context_parallel_bench", "each rank's activation peak and step time under pretrain()");
  bridge::bench::add_gpt_model_options(options);
  options.add_options()("steps", "timed steps", cxxopts::value<int64_t>()->default_value("3"))(
      "warmup-steps", "untimed steps before them", cxxopts::value<int64_t>()->default_value("1"))(
      "threads", "intra-op threads per rank", cxxopts::value<int>()->default_value("1"))("h,help", "print this help");
  try {
    const cxxopts::ParseResult args = options.parse(argc, argv);
    if (args.count("help")) {
      std::printf("%s\n", options.help().c_str());
      return 0;
    }
    const int64_t steps = args["steps"].as<int64_t>();
    const int64_t warmup = args["warmup-steps"].as<int64_t>();
    const int threads = args["threads"].as<int>();

    ConfigContainer config = bridge::bench::gpt_bench_config(args);
    config.train.global_batch_size = config.train.micro_batch_size;  // one micro-batch per step
    config.train.train_iters = warmup + steps;
    config.train.num_threads = threads;
    for (const std::string& assignment : args.unmatched()) {
      if (assignment.find('=') == std::string::npos) {
        throw std::invalid_argument("unexpected argument '" + assignment + "': overrides are KEY=VALUE");
      }
      apply_override(config, assignment);
    }
    // The log line reads losses back and prints; keep it out of every timed step.
    config.logging.log_interval = std::numeric_limits<int64_t>::max();

    // bridge's allocator first (as pretrain() would configure it), then the counter in front of it.
    bridge::utils::configure_host_allocator();
    bridge::utils::CountingCpuAllocator& live = bridge::utils::CountingCpuAllocator::install();

    // A micro-batch's window: the bytes alive when its forward starts, and the most alive until its backward ends.
    int64_t window_base = 0;
    int64_t activation_peak = 0;
    // What the forward leaves for backward (at its end, the loss computed), and its own peak.
    int64_t forward_kept = 0;
    int64_t forward_peak = 0;
    Clock::time_point step_start;
    std::vector<double> step_ms;
    double first_loss = std::numeric_limits<double>::quiet_NaN();
    auto callbacks = std::make_shared<CallbackManager>();
    callbacks->register_callback(Event::kForwardStart, [&](CallbackContext&) {
      window_base = live.allocated_bytes();
      live.reset_peak();
    });
    callbacks->register_callback(Event::kForwardEnd, [&](CallbackContext&) {
      forward_kept = std::max(forward_kept, live.allocated_bytes() - window_base);
      forward_peak = std::max(forward_peak, live.peak_bytes() - window_base);
    });
    callbacks->register_callback(Event::kBackwardEnd, [&](CallbackContext&) {
      activation_peak = std::max(activation_peak, live.peak_bytes() - window_base);
    });
    callbacks->register_callback(Event::kTrainStepStart, [&](CallbackContext&) { step_start = Clock::now(); });
    callbacks->register_callback(Event::kTrainStepEnd, [&](CallbackContext& ctx) {
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - step_start).count();
      if (ctx.state.train_state.step >= warmup) step_ms.push_back(ms);
      if (ctx.state.train_state.step == 0 && !ctx.loss_dict->empty()) {
        first_loss = ctx.loss_dict->at("lm loss").item<double>();
      }
    });

    pretrain(config, gpt_forward_step, callbacks);

    // torchrun's or mpirun's rank and world, as pretrain() read them.
    const bridge::parallel::LaunchEnv env = bridge::parallel::detect_launch_env();
    const utils::MemoryEstimate estimate = utils::estimate_memory(config, env.world_size);
    std::printf(
        "cpbench rank=%d world=%d step_ms=%.1f best_ms=%.1f steps=%zu threads=%d activation_peak_mib=%.1f "
        "predicted_activations_mib=%.1f forward_kept_mib=%.1f forward_peak_mib=%.1f first_loss=%.4f\n",
        env.rank, env.world_size, bridge::bench::median(step_ms),
        step_ms.empty() ? 0.0 : *std::min_element(step_ms.begin(), step_ms.end()), step_ms.size(), threads,
        static_cast<double>(activation_peak) / kMiB, estimate.activations / kMiB,
        static_cast<double>(forward_kept) / kMiB, static_cast<double>(forward_peak) / kMiB, first_loss);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "context_parallel_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
