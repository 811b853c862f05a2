// What an async observer costs the training loop: pretrain() of a small GPT on mock data (A) without observers and
// (B) with an observer of on_train_step_end and one of on_log that each sleep --sleep-ms per event (an upload, a
// notification) on their own threads. A and B alternate in one process so drift in the machine's load hits both;
// the target is B/A < 1.01 with 50 ms sleeps, i.e. the loop never waits for the observers (they drop what they cannot
// keep up with, counted). On a busy 2-core machine steps vary by several percent from run to run, more than the 1 %
// to resolve, so the bench also times what the loop thread itself pays per event: CallbackManager::fire of
// on_train_step_end and on_log with both observers behind full queues (a snapshot of the losses and metrics of a
// log record, and an enqueue that drops the oldest), as a share of the step. Prints one machine-readable line:
//   observerbench a_ms=<median step> b_ms=<median step> ratio=<b/a> paired_ratio=<median of per-repeat b/a>
//     fire_us=<median loop-thread cost of one step's two events> fire_share=<fire_us / a_ms>
//     delivered=<n> dropped=<n> sleep_ms=<s> steps=<timed per configuration>
//
//   observer_overhead_bench --steps 40 --warmup-steps 5 --repeats 3 --sleep-ms 50
#include <chrono>
#include <cstdio>
#include <cxxopts.hpp>
#include <thread>
#include <vector>

#include "bench/gpt_bench_model.h"
#include "bridge/bridge.h"
#include "parallel/distributed.h"
#include "utils/check.h"

namespace {

using namespace bridge::training;
using Clock = std::chrono::steady_clock;
using bridge::bench::median;

struct Run {
  std::vector<double> step_ms;  // on_train_step_start to the next one (or on_train_end)
  ObserverStats stats[2];
};

Run run_once(const ConfigContainer& config, int64_t warmup, int sleep_ms, bool observed) {
  Run run;
  auto manager = std::make_shared<CallbackManager>();
  int64_t step = -1;
  Clock::time_point start;
  auto close = [&](Clock::time_point now) {
    if (step >= warmup) run.step_ms.push_back(std::chrono::duration<double, std::milli>(now - start).count());
  };
  manager->register_callback(Event::kTrainStepStart, [&](CallbackContext& ctx) {
    const auto now = Clock::now();
    close(now);
    step = ctx.state.train_state.step;
    start = now;
  });
  manager->register_callback(Event::kTrainEnd, [&](CallbackContext&) { close(Clock::now()); });
  if (observed) {
    const auto slow = [sleep_ms](const EventSnapshot&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    };
    manager->register_observer(Event::kTrainStepEnd, slow);
    manager->register_observer(Event::kLog, slow);
  }
  pretrain(config, gpt_forward_step, manager);
  if (observed) {
    const std::vector<ObserverStats> stats = manager->observer_stats();
    run.stats[0] = stats[0];
    run.stats[1] = stats[1];
  }
  return run;
}

// The loop thread's cost of one step's two observed events (on_train_step_end with a loss, on_log with a record of
// the loop's size), in microseconds, median over `events` steps with observers that sleep `sleep_ms` each.
double fire_cost_us(int sleep_ms, int events) {
  CallbackManager manager;
  const auto slow = [sleep_ms](const EventSnapshot&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  };
  manager.register_observer(Event::kTrainStepEnd, slow);
  manager.register_observer(Event::kLog, slow);
  GlobalState state;
  ModelChunks model;
  LogRecord record;
  for (const char* name : {"lm loss", "learning-rate", "grad-norm", "batch-size", "samples vs steps", "loss-scale",
                           "iteration-time", "throughput/tflops/device", "params-norm", "world-size"}) {
    record.metrics[name] = 1.5;
  }
  const LossDict losses{{"lm loss", torch::tensor(2.5)}};
  std::vector<double> costs;
  for (int i = 0; i < events; ++i) {
    state.train_state.step = i;
    const auto start = Clock::now();
    {
      CallbackContext ctx(state, model, manager.user_state());
      ctx.loss_dict = losses;
      ctx.grad_norm = 1.0;
      manager.fire(Event::kTrainStepEnd, ctx);
    }
    {
      CallbackContext ctx(state, model, manager.user_state());
      ctx.log = &record;
      manager.fire(Event::kLog, ctx);
    }
    costs.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  manager.flush_observers(std::chrono::milliseconds(0));
  return median(costs);
}

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options options("observer_overhead_bench", "per-step cost of async observers that sleep on every event");
  bridge::bench::add_gpt_model_options(options);
  options.add_options()("steps", "timed steps per run", cxxopts::value<int64_t>()->default_value("40"))(
      "warmup-steps", "untimed steps before them", cxxopts::value<int64_t>()->default_value("5"))(
      "repeats", "runs of each configuration, alternated A, B, A, B, ...", cxxopts::value<int>()->default_value("3"))(
      "sleep-ms", "each observer's sleep per event", cxxopts::value<int>()->default_value("50"))(
      "threads", "intra-op threads", cxxopts::value<int>()->default_value("1"))("h,help", "print this help");
  try {
    const cxxopts::ParseResult args = options.parse(argc, argv);
    if (args.count("help")) {
      std::printf("%s\n", options.help().c_str());
      return 0;
    }
    const int64_t steps = args["steps"].as<int64_t>();
    const int64_t warmup = args["warmup-steps"].as<int64_t>();
    const int repeats = args["repeats"].as<int>();
    const int sleep_ms = args["sleep-ms"].as<int>();
    bridge::utils::require(steps > 0 && warmup >= 0 && repeats > 0 && sleep_ms >= 0,
                           "--steps and --repeats must be positive, --warmup-steps and --sleep-ms not negative");
    bridge::parallel::init_distributed();
    ConfigContainer config = bridge::bench::gpt_bench_config(args);
    config.train.global_batch_size = config.train.micro_batch_size;  // one micro-batch per step
    config.train.train_iters = warmup + steps;
    config.train.num_threads = args["threads"].as<int>();
    config.logging.log_interval = 1;  // on_log every step: both observers see every step

    std::vector<double> a, b, paired;
    uint64_t delivered = 0, dropped = 0;
    for (int repeat = 0; repeat < repeats; ++repeat) {
      const Run without = run_once(config, warmup, sleep_ms, /*observed=*/false);
      const Run with = run_once(config, warmup, sleep_ms, /*observed=*/true);
      a.insert(a.end(), without.step_ms.begin(), without.step_ms.end());
      b.insert(b.end(), with.step_ms.begin(), with.step_ms.end());
      paired.push_back(median(with.step_ms) / median(without.step_ms));
      for (const ObserverStats& stats : with.stats) {
        delivered += stats.delivered;
        dropped += stats.dropped;
      }
    }
    const double fire_us = fire_cost_us(sleep_ms, 2000);
    std::printf(
        "observerbench a_ms=%.3f b_ms=%.3f ratio=%.4f paired_ratio=%.4f fire_us=%.2f fire_share=%.6f delivered=%llu "
        "dropped=%llu sleep_ms=%d steps=%zu\n",
        median(a), median(b), median(b) / median(a), median(paired), fire_us, fire_us / 1000.0 / median(a),
        static_cast<unsigned long long>(delivered), static_cast<unsigned long long>(dropped), sleep_ms, a.size());
    bridge::parallel::destroy_distributed();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "observer_overhead_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
