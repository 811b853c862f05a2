// Pipeline schedules in one process: Megatron's schedule tables and warmup counts, a dataflow simulation showing the
// 1F1B and interleaved orders cannot deadlock, and the no-pipelining schedule (a world of one) against the whole
// batch at once, with its grad-sync calls, hooks, forward-only mode and validation errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "parallel/pipeline_parallel/schedules.h"

namespace bridge::parallel::pipeline_parallel {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(PipelineScheduleTable, ReproducesMegatronsExample) {
  // PP2, m=5, v=2, G=3: the remainder of 2 micro-batches forms the last group.
  const auto table = get_schedule_table(5, 2, 3);
  std::vector<int64_t> microbatches, chunks;
  for (const auto& [microbatch, chunk] : table) {
    microbatches.push_back(microbatch);
    chunks.push_back(chunk);
  }
  EXPECT_EQ(microbatches, (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 4, 3, 4}));
  EXPECT_EQ(chunks, (std::vector<int64_t>{0, 0, 0, 1, 1, 1, 0, 0, 1, 1}));
}

TEST(PipelineScheduleTable, GroupOfPipelineSize) {
  const std::vector<std::pair<int64_t, int64_t>> expected{{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 2}, {1, 2},
                                                          {2, 0}, {3, 0}, {2, 1}, {3, 1}, {2, 2}, {3, 2}};
  EXPECT_EQ(get_schedule_table(4, 3, 2), expected);
  EXPECT_EQ(get_schedule_table(2, 2, 4), (std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {1, 0}, {0, 1}, {1, 1}}));
}

TEST(PipelineScheduleTable, WarmupCounts) {
  EXPECT_EQ(num_warmup_microbatches(4, 0, 8), 3);
  EXPECT_EQ(num_warmup_microbatches(4, 2, 8), 1);
  EXPECT_EQ(num_warmup_microbatches(4, 3, 8), 0);
  EXPECT_EQ(num_warmup_microbatches(4, 0, 2), 2);
  EXPECT_EQ(num_interleaved_warmup_microbatches(2, 0, 4, 2, 2), 4);
  EXPECT_EQ(num_interleaved_warmup_microbatches(2, 1, 4, 2, 2), 2);
  EXPECT_EQ(num_interleaved_warmup_microbatches(4, 0, 4, 2, 4), 8);  // clamped to m * v
  EXPECT_EQ(num_interleaved_warmup_microbatches(4, 3, 8, 3, 4), 8);
}

std::string describe(const std::vector<ScheduleStep>& order) {
  std::string out;
  for (const ScheduleStep& s : order) {
    out += (s.forward ? "F" : "B") + std::to_string(s.microbatch) + "." + std::to_string(s.model_chunk) + " ";
  }
  return out;
}

TEST(PipelineScheduleOrder, OneForwardOneBackward) {
  EXPECT_EQ(describe(get_1f1b_order(4, 1, 5, false)), "F0.0 F1.0 F2.0 B0.0 F3.0 B1.0 F4.0 B2.0 B3.0 B4.0 ");
  EXPECT_EQ(describe(get_1f1b_order(4, 3, 2, false)), "F0.0 B0.0 F1.0 B1.0 ");
  EXPECT_EQ(describe(get_1f1b_order(4, 0, 2, true)), "F0.0 F1.0 ");
  EXPECT_EQ(describe(get_interleaved_order(2, 1, 2, 2, 2, false)), "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 B0.0 B1.0 ");
}

// Runs every rank's program as a dataflow (sends never block, a pass waits only for the tensors it needs) and
// returns whether all of them finish. A forward of virtual stage s needs stage s-1's forward of the same
// micro-batch; a backward needs its own forward and stage s+1's backward. Virtual stage = chunk * pp + rank.
bool runs_to_completion(int64_t pp, int64_t v, int64_t m, const std::vector<std::vector<ScheduleStep>>& programs,
                        std::string* problem) {
  std::set<std::tuple<bool, int64_t, int64_t>> done;  // (forward, microbatch, virtual stage)
  std::vector<std::size_t> next(static_cast<std::size_t>(pp), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t rank = 0; rank < pp; ++rank) {
      const auto& program = programs[static_cast<std::size_t>(rank)];
      std::size_t& at = next[static_cast<std::size_t>(rank)];
      while (at < program.size()) {
        const ScheduleStep& step = program[at];
        const int64_t stage = step.model_chunk * pp + rank;
        const bool ready = step.forward
                               ? (stage == 0 || done.count({true, step.microbatch, stage - 1}) > 0)
                               : (done.count({true, step.microbatch, stage}) > 0 &&
                                  (stage == pp * v - 1 || done.count({false, step.microbatch, stage + 1}) > 0));
        if (!ready) break;
        if (!done.insert({step.forward, step.microbatch, stage}).second) {
          *problem = "a pass ran twice on rank " + std::to_string(rank);
          return false;
        }
        ++at;
        progress = true;
      }
    }
  }
  for (int64_t rank = 0; rank < pp; ++rank) {
    if (next[static_cast<std::size_t>(rank)] != programs[static_cast<std::size_t>(rank)].size()) {
      *problem = "rank " + std::to_string(rank) + " is stuck at step " +
                 std::to_string(next[static_cast<std::size_t>(rank)]) + " of " +
                 describe(programs[static_cast<std::size_t>(rank)]);
      return false;
    }
  }
  const std::size_t passes = programs[0].empty() || programs[0].back().forward ? 1 : 2;
  if (done.size() != passes * static_cast<std::size_t>(m * v * pp)) {
    *problem = "not every pass ran";
    return false;
  }
  return true;
}

TEST(PipelineScheduleOrder, NoLayoutDeadlocks) {
  int layouts = 0;
  for (int64_t pp = 2; pp <= 5; ++pp) {
    for (int64_t m = 1; m <= 3 * pp + 1; ++m) {
      for (bool forward_only : {false, true}) {
        std::vector<std::vector<ScheduleStep>> programs;
        for (int64_t rank = 0; rank < pp; ++rank) programs.push_back(get_1f1b_order(pp, rank, m, forward_only));
        std::string problem;
        EXPECT_TRUE(runs_to_completion(pp, 1, m, programs, &problem)) << "1F1B pp " << pp << " m " << m << problem;
        ++layouts;
        for (int64_t v = 2; v <= 4; ++v) {
          for (int64_t g = pp; g <= m; ++g) {
            if (m % g != 0 && m % g < pp) continue;  // rejected by check_interleaved_schedule
            programs.clear();
            for (int64_t rank = 0; rank < pp; ++rank) {
              programs.push_back(get_interleaved_order(pp, rank, m, v, g, forward_only));
            }
            EXPECT_TRUE(runs_to_completion(pp, v, m, programs, &problem))
                << "interleaved pp " << pp << " v " << v << " m " << m << " G " << g << ": " << problem;
            ++layouts;
          }
        }
      }
    }
  }
  EXPECT_GT(layouts, 300);

  // The simulation does catch a cycle: the last stage running a backward before its forward.
  std::string problem;
  EXPECT_FALSE(runs_to_completion(2, 1, 1, {{{true, 0, 0}, {false, 0, 0}}, {{false, 0, 0}, {true, 0, 0}}}, &problem));
  EXPECT_THAT(problem, HasSubstr("is stuck"));
}

TEST(PipelineScheduleOrder, InterleavingConstraintsNameTheFields) {
  EXPECT_NO_THROW(check_interleaved_schedule(2, 5, 3));
  EXPECT_NO_THROW(check_interleaved_schedule(4, 8, 4));
  EXPECT_THAT(
      [] { check_interleaved_schedule(4, 8, 2); },
      ThrowsMessage<std::invalid_argument>(HasSubstr("microbatch_group_size_per_vp_stage is 2 but must be >=")));
  EXPECT_THAT([] { check_interleaved_schedule(4, 3, 4); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("must be <= num_microbatches 3")));
  EXPECT_THAT([] { check_interleaved_schedule(4, 9, 4); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("dependency bubbles")));
}

// A world of one: the no-pipelining schedule against a toy model run on the whole batch at once.
class PipelineSingleStage : public ::testing::Test {
 protected:
  static constexpr int64_t kSeq = 3, kBatch = 6, kHidden = 4;

  void SetUp() override {
    init_distributed(LaunchEnv{}, {});
    initialize_model_parallel(1);
    torch::manual_seed(7);
    weight_ = torch::randn({kHidden, kHidden}, torch::kFloat64).requires_grad_(true);
    data_ = torch::randn({kSeq, kBatch, kHidden}, torch::kFloat64);
  }
  void TearDown() override { destroy_distributed(); }

  torch::Tensor model(const torch::Tensor& x) const { return x + torch::tanh(torch::matmul(x, weight_.t())); }

  // The options for `m` micro-batches of the batch (split along dim 1); `per_token` picks the loss form.
  ForwardBackwardOptions options(int64_t m, bool per_token) {
    ForwardBackwardOptions o;
    o.num_microbatches = m;
    o.set_input_tensor = {[this](const torch::Tensor& t) { inputs_seen_.push_back(t.defined()); }};
    o.forward_step_func = [this, m, per_token](int64_t microbatch, int64_t) {
      const int64_t size = kBatch / m;
      torch::Tensor out = model(data_.narrow(1, microbatch * size, size));
      LossFunc loss = [per_token](const torch::Tensor& output) {
        LossOutput result;
        const torch::Tensor sum = output.pow(2).sum();
        result.loss = per_token ? sum : output.pow(2).mean();
        if (per_token) result.num_tokens = torch::tensor(output.numel(), torch::kInt64);
        result.reported["lm loss"] = torch::stack({sum.detach(), torch::tensor(double(output.numel()))});
        return result;
      };
      return std::pair{out, loss};
    };
    return o;
  }

  torch::Tensor weight_, data_;
  std::vector<bool> inputs_seen_;
};

TEST_F(PipelineSingleStage, MicroBatchesGiveTheWholeBatchLossAndGrads) {
  torch::Tensor reference_loss = model(data_).pow(2).mean();
  reference_loss.backward();
  const torch::Tensor reference_grad = weight_.grad().clone();

  for (bool per_token : {true, false}) {
    for (int64_t m : {1, 2, 3, 6}) {
      weight_.mutable_grad() = torch::Tensor();
      ForwardBackwardOptions o = options(m, per_token);
      double loss = 0;
      o.hooks.on_forward_end = [&](int64_t, int64_t, const torch::Tensor& out) { loss += out.item<double>(); };
      const auto reported = get_forward_backward_func()(o);
      ASSERT_EQ(static_cast<int64_t>(reported.size()), m);
      double sum = 0, count = 0;
      for (const auto& values : reported) {
        sum += values.at("lm loss")[0].item<double>();
        count += values.at("lm loss")[1].item<double>();
      }
      EXPECT_NEAR(loss, reference_loss.item<double>(), 1e-14) << "m " << m << " per_token " << per_token;
      EXPECT_NEAR(sum / count, reference_loss.item<double>(), 1e-14);
      EXPECT_LT((weight_.grad() - reference_grad).abs().max().item<double>(), 1e-14) << "m " << m;
    }
  }
  for (bool seen : inputs_seen_) EXPECT_FALSE(seen);  // the first stage gets an undefined input
}

TEST_F(PipelineSingleStage, PerTokenLossLeavesSums) {
  ForwardBackwardOptions o = options(3, /*per_token=*/true);
  o.calculate_per_token_loss = true;
  forward_backward_no_pipelining(o);
  torch::Tensor sum = model(data_).pow(2).sum();
  const torch::Tensor pipelined = weight_.grad().clone();
  weight_.mutable_grad() = torch::Tensor();
  sum.backward();
  EXPECT_LT((pipelined - weight_.grad()).abs().max().item<double>(), 1e-12);
}

TEST_F(PipelineSingleStage, OneForwardOneBackwardWithOneStageMatches) {
  ForwardBackwardOptions o = options(3, true);
  forward_backward_no_pipelining(o);
  const torch::Tensor expected = weight_.grad().clone();
  weight_.mutable_grad() = torch::Tensor();
  forward_backward_pipelining_without_interleaving(o);  // pp = 1: no exchange, tensor_shape not needed
  EXPECT_TRUE(weight_.grad().equal(expected));
}

TEST_F(PipelineSingleStage, GradSyncHooksAndFinalizeInOrder) {
  ForwardBackwardOptions o = options(3, true);
  std::vector<std::string> events;
  const auto record = [&](const std::string& what) {
    return [&events, what](int64_t microbatch, int64_t chunk) {
      events.push_back(what + std::to_string(microbatch) + "." + std::to_string(chunk));
    };
  };
  o.hooks.on_forward_start = record("fs");
  o.hooks.on_backward_start = record("bs");
  o.hooks.on_backward_end = record("be");
  o.hooks.on_forward_end = [&](int64_t microbatch, int64_t, const torch::Tensor& output) {
    EXPECT_EQ(output.dim(), 0);  // the normalised loss on the last stage
    events.push_back("fe" + std::to_string(microbatch));
  };
  o.set_grad_sync = [&](bool enabled) { events.push_back(enabled ? "sync" : "nosync"); };
  o.finalize_model_grads = [&] { events.push_back("finalize"); };
  forward_backward_no_pipelining(o);
  EXPECT_EQ(events, (std::vector<std::string>{"fs0.0", "fe0", "nosync", "bs0.0", "be0.0", "fs1.0", "fe1", "nosync",
                                              "bs1.0", "be1.0", "fs2.0", "fe2", "sync", "bs2.0", "be2.0", "finalize"}));
}

TEST_F(PipelineSingleStage, ForwardOnlyRunsNoBackward) {
  ForwardBackwardOptions o = options(2, true);
  std::vector<double> train_losses, eval_losses;
  o.hooks.on_forward_end = [&](int64_t, int64_t, const torch::Tensor& out) {
    train_losses.push_back(out.item<double>());
  };
  forward_backward_no_pipelining(o);
  weight_.mutable_grad() = torch::Tensor();

  o.forward_only = true;
  int calls = 0;
  o.hooks.on_forward_end = [&](int64_t, int64_t, const torch::Tensor& out) {
    EXPECT_FALSE(out.requires_grad());
    eval_losses.push_back(out.item<double>());
  };
  o.hooks.on_backward_start = [&](int64_t, int64_t) { ++calls; };
  o.set_grad_sync = [&](bool) { ++calls; };
  o.finalize_model_grads = [&] { ++calls; };
  const auto reported = forward_backward_no_pipelining(o);
  EXPECT_EQ(calls, 0);
  EXPECT_FALSE(weight_.grad().defined());
  EXPECT_EQ(reported.size(), 2u);
  EXPECT_EQ(eval_losses, train_losses);
}

TEST_F(PipelineSingleStage, ValidationNamesTheField) {
  ForwardBackwardOptions o = options(2, true);
  o.num_microbatches = 0;
  EXPECT_THAT([&] { forward_backward_no_pipelining(o); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("num_microbatches must be >= 1, got 0")));
  o = options(2, true);
  o.set_input_tensor.push_back(o.set_input_tensor[0]);
  EXPECT_THAT([&] { forward_backward_no_pipelining(o); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("set_input_tensor has 2 entries")));
  o = options(2, true);
  o.forward_step_func = nullptr;
  EXPECT_THAT([&] { forward_backward_no_pipelining(o); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("forward_step_func is empty")));
  o = options(2, true);
  o.forward_step_func = [&](int64_t, int64_t) { return std::pair{model(data_), LossFunc()}; };
  EXPECT_THAT([&] { forward_backward_no_pipelining(o); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("returned no loss function on the last pipeline stage")));
  o = options(2, true);
  EXPECT_THAT([&] { forward_backward_pipelining_with_interleaving(o); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("no virtual pipeline")));
}

}  // namespace
}  // namespace bridge::parallel::pipeline_parallel
