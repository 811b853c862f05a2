// One rank of the statistics tests (stats_dist_test). Launched with the variables torchrun would set.
//
//   stats_worker stats <out_dir> <tp> <pp> <vpp|0>
//       pretrain() a tiny GPT for 3 steps with every statistic on and an evaluation at step 2, the JSON Lines and
//       TensorBoard writers in <out_dir>, and the standalone train_utils collectives called from a callback on every
//       rank after each step; the last rank writes what those returned to <out_dir>/standalone.txt ("<step> <name>
//       <value>" lines).
//   stats_worker count <log_interval> <with_on_log 0|1>
//       pretrain() 7 steps and check, from ProcessGroup::operation_count(), the collectives each step issues on the
//       world group (one per step, log steps included; one more when some rank listens to on_log; two once for the
//       parameter names of the per-parameter grad norms) and that logging adds none on the model-parallel group.
//   stats_worker control <on_log_stop|step_end_stop|on_log_save> <out_dir>
//       6 steps logged every 2; a stop asked in on_log on the last rank at step 4, a stop asked in on_train_step_end
//       on rank 0 during the step that ends as step 4 (a log step, whose collective carries it), or a save asked in
//       on_log on rank 0 at step 2: every rank prints where it ended.
//
// Exit 0 on success; a failed check prints "FAILED ..." and exits 1.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "bridge/bridge.h"
#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "tests/dist/gpt_worker_support.h"
#include "training/utils/train_utils.h"

namespace {

using namespace bridge;
using namespace bridge::training;

using testing::expect;

void enable_every_statistic(ConfigContainer& config) {
  config.logging.log_params_norm = true;
  config.logging.log_l2_norm_grad_to_tensorboard = true;
  config.logging.log_memory_to_tensorboard = true;
  config.logging.log_throughput = true;
  config.logging.log_throughput_to_tensorboard = true;
  config.logging.throughput_window_size = 2;
  config.logging.log_runtime_to_tensorboard = true;
  config.logging.log_world_size_to_tensorboard = true;
  config.logging.log_timers_to_tensorboard = true;
  config.logging.log_validation_ppl_to_tensorboard = true;
}

int run_stats(const std::string& out_dir, int tp, int pp, int vpp, bool distributed_optimizer) {
  ConfigContainer config = testing::tiny_gpt_config(tp, pp, vpp, 3);
  config.optimizer.use_distributed_optimizer = config.ddp.use_distributed_optimizer = distributed_optimizer;
  enable_every_statistic(config);
  config.train.eval_interval = 2;  // validation at step 2, then validation and test after step 3
  config.train.eval_iters = 1;
  config.logging.jsonl_path = out_dir + "/metrics.jsonl";
  config.logging.tensorboard_dir = out_dir + "/tensorboard";

  // The standalone functions are collectives: called from a callback that every rank runs.
  auto standalone = std::make_shared<std::ofstream>();
  const bool last = parallel::get_rank() == parallel::get_world_size() - 1;
  if (last) standalone->open(out_dir + "/standalone.txt");
  auto callbacks = std::make_shared<CallbackManager>();
  callbacks->register_callback(Event::kTrainStepEnd, [standalone, last](CallbackContext& ctx) {
    const int64_t step = ctx.state.train_state.step + 1;
    const double params_norm = training::utils::calc_params_l2_norm(ctx.model);
    const training::utils::StatReport grads = training::utils::report_l2_norm_grad(ctx.model);
    const std::optional<double> grad_norm = training::utils::reduce_max_stat_across_model_parallel_group(
        ctx.grad_norm.has_value() ? std::optional<double>(*ctx.grad_norm) : std::nullopt,
        parallel::get_model_parallel_group());
    parallel::ProcessGroup& model_parallel = parallel::get_model_parallel_group();
    expect(training::utils::logical_and_across_model_parallel_group(true, model_parallel),
           "logical_and of true on every rank is true");
    // Rank 0 says false: false on every member of its model-parallel group, true elsewhere.
    const auto& members = model_parallel.global_ranks();
    const bool with_rank0 = std::find(members.begin(), members.end(), 0) != members.end();
    expect(training::utils::logical_and_across_model_parallel_group(parallel::get_rank() != 0, model_parallel) ==
               !with_rank0,
           "logical_and with one false");
    // Pipeline maxima keep integer counters integers; a statistic missing on rank 0 is the others' maximum.
    parallel::ProcessGroup& pipeline = parallel::get_pipeline_model_parallel_group();
    const training::utils::StatReport memory = {{"count", int64_t{pipeline.rank() + 3}},
                                                {"peak", 0.25 * (pipeline.rank() + 1)}};
    const training::utils::StatReport maxima = training::utils::reduce_max_memory_across_pp_group(memory, &pipeline);
    expect(std::holds_alternative<int64_t>(maxima.at(0).second) &&
               std::get<int64_t>(maxima.at(0).second) == pipeline.size() + 2,
           "integer memory counter reduced to an integer maximum");
    expect(std::get<double>(maxima.at(1).second) == 0.25 * pipeline.size(), "memory maximum over the pipeline");
    const int rank = parallel::get_rank();
    const std::optional<double> partial = training::utils::reduce_max_stat_across_model_parallel_group(
        rank == 0 ? std::nullopt : std::optional<double>(rank), model_parallel);
    std::optional<double> expected;
    for (const int member : members) {
      if (member != 0) expected = std::max(expected.value_or(0.0), static_cast<double>(member));
    }
    expect(partial == expected, "reduce_max_stat with no value on rank 0");
    if (!last) return;
    *standalone << step << " params-norm " << params_norm << "\n";
    *standalone << step << " reduced-grad-norm " << grad_norm.value_or(-1.0) << "\n";
    for (const auto& [name, value] : grads)
      *standalone << step << " " << name << " " << training::utils::to_double(value) << "\n";
  });
  standalone->precision(17);
  pretrain(config, gpt_forward_step, callbacks);
  return 0;
}

int run_count(int64_t log_interval, bool with_on_log) {
  const int64_t steps = 7;
  // The model-parallel collectives of each step without any logging, then with everything on.
  std::vector<std::vector<int64_t>> mp_deltas(2), world_deltas(2);
  for (int logging_on = 0; logging_on < 2; ++logging_on) {
    ConfigContainer config = testing::tiny_gpt_config(1, parallel::get_world_size(), 0, steps);
    if (logging_on != 0) {
      enable_every_statistic(config);
      config.logging.log_interval = log_interval;
      config.logging.tensorboard_log_interval = log_interval;
      config.logging.jsonl_path = "/dev/null";
    } else {
      config.logging.log_interval = steps + 1;
    }
    auto callbacks = std::make_shared<CallbackManager>();
    auto world_before = std::make_shared<int64_t>(-1);
    auto mp_before = std::make_shared<int64_t>(-1);
    auto record = [&, world_before, mp_before, logging_on](CallbackContext&) {
      const auto world = static_cast<int64_t>(parallel::get_world_group().operation_count());
      const auto mp = static_cast<int64_t>(parallel::get_model_parallel_group().operation_count());
      if (*world_before >= 0) {
        world_deltas[logging_on].push_back(world - *world_before);
        mp_deltas[logging_on].push_back(mp - *mp_before);
      }
      *world_before = world;
      *mp_before = mp;
    };
    callbacks->register_callback(Event::kTrainStepStart, record, "count");
    callbacks->register_callback(Event::kTrainEnd, record, "count_end");
    if (with_on_log && logging_on != 0 && parallel::get_rank() == 0) {
      callbacks->register_callback(Event::kLog, [](CallbackContext& ctx) { ctx.log->text.push_back("listened"); });
    }
    pretrain(config, gpt_forward_step, callbacks);
  }
  // Step i (1-based) ends with its boundary: the first log step with per-parameter grad norms gathers the names once.
  for (std::size_t i = 0; i + 1 < world_deltas[1].size(); ++i) {
    const int64_t step = static_cast<int64_t>(i) + 1;
    const bool log_step = step % log_interval == 0 || step == 1;  // the run's first step is logged too
    int64_t expected = 1;
    if (log_step && with_on_log) expected += 1;
    if (step == log_interval) expected += 2;
    expect(world_deltas[1][i] == expected, "step " + std::to_string(step) + ": " + std::to_string(world_deltas[1][i]) +
                                               " world collectives, expected " + std::to_string(expected));
    expect(world_deltas[0][i] == 1, "step " + std::to_string(step) + " without logging: " +
                                        std::to_string(world_deltas[0][i]) + " world collectives, expected 1");
    expect(mp_deltas[1][i] == mp_deltas[0][i], "step " + std::to_string(step) + ": logging added " +
                                                   std::to_string(mp_deltas[1][i] - mp_deltas[0][i]) +
                                                   " model-parallel collectives");
    std::printf("rank %d: step %lld world %lld mp %lld (without logging: world %lld mp %lld)\n", parallel::get_rank(),
                static_cast<long long>(step), static_cast<long long>(world_deltas[1][i]),
                static_cast<long long>(mp_deltas[1][i]), static_cast<long long>(world_deltas[0][i]),
                static_cast<long long>(mp_deltas[0][i]));
  }
  std::fflush(stdout);
  return 0;
}

int run_control(const std::string& mode, const std::string& out_dir) {
  ConfigContainer config = testing::tiny_gpt_config(1, parallel::get_world_size(), 0, 6);
  config.logging.log_interval = 2;
  const int rank = parallel::get_rank();
  const bool last = rank == parallel::get_world_size() - 1;
  auto callbacks = std::make_shared<CallbackManager>();
  if (mode == "on_log_stop" && last) {
    callbacks->register_callback(
        Event::kLog,
        [](CallbackContext& ctx) {
          if (ctx.log->iteration == 4) ctx.request_stop("enough at 4");
        },
        "stopper");
  } else if (mode == "step_end_stop" && rank == 0) {
    callbacks->register_callback(
        Event::kTrainStepEnd,
        [](CallbackContext& ctx) {
          if (ctx.state.train_state.step == 3) ctx.request_stop("enough during step 4");
        },
        "stopper");
  } else if (mode == "on_log_save") {
    config.checkpoint.save = out_dir;
    if (rank == 0) {
      callbacks->register_callback(
          Event::kLog,
          [](CallbackContext& ctx) {
            if (ctx.log->iteration == 2) ctx.request_save("save at 2");
          },
          "saver");
    }
  } else if (mode != "on_log_stop" && mode != "step_end_stop") {
    throw std::invalid_argument("unknown control mode " + mode);
  }
  const TrainState state = pretrain(config, gpt_forward_step, callbacks);
  std::printf("rank %d: ended at step %lld\n", rank, static_cast<long long>(state.step));
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bridge::testing::worker_main(argc, argv,
                                      "usage: stats_worker stats <out_dir> <tp> <pp> <vpp|0> <plain|distopt>\n"
                                      "       stats_worker count <log_interval> <with_on_log 0|1>\n"
                                      "       stats_worker control <on_log_stop|step_end_stop|on_log_save> <out_dir>\n",
                                      [&](const std::string& scenario) {
                                        if (scenario == "stats" && argc == 7) {
                                          return run_stats(argv[2], std::stoi(argv[3]), std::stoi(argv[4]),
                                                           std::stoi(argv[5]), std::string(argv[6]) == "distopt");
                                        }
                                        if (scenario == "control" && argc == 4) return run_control(argv[2], argv[3]);
                                        if (scenario == "count" && argc == 4)
                                          return run_count(std::stoll(argv[2]), std::string(argv[3]) == "1");
                                        return -1;
                                      });
}
