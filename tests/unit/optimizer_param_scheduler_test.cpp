// OptimizerParamScheduler against Megatron's formulas, evaluated by hand, and its option validation; the schedule a
// config describes (ConfigContainer::scheduler_steps): Megatron-Bridge's lr_warmup_fraction and sample-based training
// give the learning rates of their iteration-based equivalents, in a pretrain() run too.
#include "training/optimizer/optimizer_param_scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "bridge/bridge.h"

namespace bridge::training {
namespace {

using ::testing::HasSubstr;

class SchedulerTest : public ::testing::Test {
 protected:
  torch::nn::Linear layer{2, 2};
  torch::optim::AdamW optimizer{layer->parameters(), torch::optim::AdamWOptions(123.0)};

  OptimizerParamScheduler make(LrDecayStyle style) {
    OptimizerParamSchedulerOptions options;
    options.init_lr = 0.0;
    options.max_lr = 1.0;
    options.min_lr = 0.1;
    options.lr_warmup_steps = 10;
    options.lr_decay_steps = 110;
    options.lr_decay_style = style;
    return OptimizerParamScheduler(optimizer, options);
  }
  double optimizer_lr() { return optimizer.param_groups()[0].options().get_lr(); }
};

TEST_F(SchedulerTest, WarmsUpLinearlyAndWritesTheOptimizer) {
  auto scheduler = make(LrDecayStyle::kCosine);
  EXPECT_DOUBLE_EQ(optimizer_lr(), 0.0);  // step 0 is applied at construction
  scheduler.step(5);
  EXPECT_DOUBLE_EQ(scheduler.get_lr(), 0.5);
  EXPECT_DOUBLE_EQ(optimizer_lr(), 0.5);
  scheduler.step(5);
  EXPECT_DOUBLE_EQ(scheduler.get_lr(), 1.0);
}

TEST_F(SchedulerTest, CosineDecay) {
  auto scheduler = make(LrDecayStyle::kCosine);
  scheduler.step(60);  // half-way through the 100 decay steps: 0.1 + 0.9 * 0.5 * (cos(pi/2) + 1)
  EXPECT_NEAR(scheduler.get_lr(), 0.55, 1e-12);
  scheduler.step(25);  // ratio 0.75
  EXPECT_NEAR(scheduler.get_lr(), 0.1 + 0.9 * 0.5 * (std::cos(std::acos(-1.0) * 0.75) + 1.0), 1e-12);
  scheduler.step(25);  // end of decay
  EXPECT_NEAR(scheduler.get_lr(), 0.1, 1e-12);
  scheduler.step(1000);
  EXPECT_DOUBLE_EQ(optimizer_lr(), 0.1);
}

TEST_F(SchedulerTest, LinearDecay) {
  auto scheduler = make(LrDecayStyle::kLinear);
  scheduler.step(35);  // ratio 0.25
  EXPECT_NEAR(scheduler.get_lr(), 0.1 + 0.9 * 0.75, 1e-12);
}

TEST_F(SchedulerTest, ConstantAfterWarmup) {
  auto scheduler = make(LrDecayStyle::kConstant);
  scheduler.step(500);
  EXPECT_DOUBLE_EQ(scheduler.get_lr(), 1.0);
}

TEST_F(SchedulerTest, InverseSquareRoot) {
  auto scheduler = make(LrDecayStyle::kInverseSquareRoot);
  scheduler.step(40);  // max_lr * sqrt(10) / sqrt(40)
  EXPECT_NEAR(scheduler.get_lr(), 0.5, 1e-12);
}

TEST_F(SchedulerTest, RejectsBadOptionsNamingTheField) {
  OptimizerParamSchedulerOptions options;
  options.max_lr = 1e-3;
  options.min_lr = 1e-2;
  try {
    OptimizerParamScheduler(optimizer, options);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), HasSubstr("min_lr must lie in [0, max_lr]"));
  }
  options = {};
  options.lr_warmup_steps = 5;
  options.lr_decay_steps = 5;
  EXPECT_THROW(OptimizerParamScheduler(optimizer, options), std::invalid_argument);
  EXPECT_DOUBLE_EQ(optimizer_lr(), 123.0);  // a rejected scheduler leaves the optimizer untouched
}

TEST(LrDecayStyle, ParsesNamesAndRejectsOthers) {
  EXPECT_EQ(parse_lr_decay_style("cosine"), LrDecayStyle::kCosine);
  EXPECT_EQ(parse_lr_decay_style("inverse-square-root"), LrDecayStyle::kInverseSquareRoot);
  try {
    parse_lr_decay_style("cosin");
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), HasSubstr("choose constant, linear, cosine or inverse-square-root"));
  }
}

// ---- The schedule a config describes ----

// Iteration-based: 100 steps of 8 samples, warmup 10 steps, cosine decay over 80 steps from 1.0 to 0.1.
ConfigContainer by_iterations() {
  ConfigContainer config;
  config.train.global_batch_size = 8;
  config.train.train_iters = 100;
  config.optimizer.lr = 1.0;
  config.optimizer.min_lr = 0.1;
  config.scheduler.lr_warmup_iters = 10;
  config.scheduler.lr_decay_iters = 80;
  config.scheduler.lr_decay_style = "cosine";
  return config;
}

// The same schedule in samples (Megatron-Bridge's train_samples, lr_warmup_samples, lr_decay_samples).
ConfigContainer by_samples() {
  ConfigContainer config = by_iterations();
  config.train.train_iters = 0;
  config.train.train_samples = 800;
  config.scheduler.lr_warmup_iters = 0;
  config.scheduler.lr_decay_iters = 0;
  config.scheduler.lr_warmup_samples = 80;
  config.scheduler.lr_decay_samples = 640;
  return config;
}

// The learning rate after each step of `config`'s run, stepped as the training loop steps it (global_batch_size
// samples per step) with the options pretrain() builds.
std::vector<double> learning_rates(ConfigContainer config) {
  config.validate(1);
  config.finalize();
  torch::nn::Linear layer{2, 2};
  torch::optim::SGD optimizer{layer->parameters(), torch::optim::SGDOptions(1.0)};
  OptimizerParamSchedulerOptions options;
  options.max_lr = config.optimizer.lr;
  options.min_lr = config.optimizer.min_lr;
  const SchedulerSteps steps = config.scheduler_steps();
  options.lr_warmup_steps = steps.warmup;
  options.lr_decay_steps = steps.decay;
  options.lr_decay_style = parse_lr_decay_style(config.scheduler.lr_decay_style);
  OptimizerParamScheduler scheduler(optimizer, options);
  std::vector<double> rates;
  for (int64_t step = 0; step < config.train.train_iters; ++step) {
    scheduler.step(config.train.global_batch_size);
    rates.push_back(scheduler.get_lr());
  }
  return rates;
}

TEST(ConfigSchedule, SampleBasedTrainingIsItsIterationBasedEquivalent) {
  const std::vector<double> iterations = learning_rates(by_iterations());
  ASSERT_EQ(iterations.size(), 100u);
  EXPECT_EQ(learning_rates(by_samples()), iterations);  // train_iters = 800 / 8
  // By hand: after step 5, 40 of the 80 warmup samples; after step 50, 400 samples, (400 - 80) / (640 - 80) of the
  // decay; from step 80 on, min_lr.
  EXPECT_DOUBLE_EQ(iterations[4], 0.5);
  EXPECT_NEAR(iterations[49], 0.1 + 0.9 * 0.5 * (std::cos(std::acos(-1.0) * 320.0 / 560.0) + 1.0), 1e-12);
  EXPECT_DOUBLE_EQ(iterations[99], 0.1);

  // Samples that are not a whole number of steps: 805 train 100 steps, and the decay is counted in samples (805 by
  // default), so step 100 (800 samples) is 720 / 725 of the way.
  ConfigContainer odd = by_samples();
  odd.train.train_samples = 805;
  odd.scheduler.lr_decay_samples = 0;
  const std::vector<double> rates = learning_rates(odd);
  ASSERT_EQ(rates.size(), 100u);
  EXPECT_NEAR(rates[99], 0.1 + 0.9 * 0.5 * (std::cos(std::acos(-1.0) * 720.0 / 725.0) + 1.0), 1e-12);
}

TEST(ConfigSchedule, AWarmupFractionIsThatShareOfTheDecay) {
  const std::vector<double> iterations = learning_rates(by_iterations());
  ConfigContainer fraction = by_iterations();  // 0.125 x 80 steps = 10 steps
  fraction.scheduler.lr_warmup_iters = 0;
  fraction.scheduler.lr_warmup_fraction = 0.125;
  EXPECT_EQ(fraction.scheduler_steps().warmup, 80);
  EXPECT_EQ(learning_rates(fraction), iterations);
  ConfigContainer samples = by_samples();  // 0.125 x 640 samples
  samples.scheduler.lr_warmup_samples = 0;
  samples.scheduler.lr_warmup_fraction = 0.125;
  EXPECT_EQ(learning_rates(samples), iterations);
  // By hand: a fraction of the decay that train_iters gives when lr_decay_iters is 0 (100 steps x 8 x 0.05 = 40).
  fraction.scheduler.lr_decay_iters = 0;
  fraction.scheduler.lr_warmup_fraction = 0.05;
  EXPECT_EQ(fraction.scheduler_steps().warmup, 40);
  EXPECT_DOUBLE_EQ(learning_rates(fraction)[2], 24.0 / 40.0);
}

TEST(ConfigSchedule, TheDecayEndsAStepAfterAWarmupLongerThanTheRun) {
  ConfigContainer config = by_iterations();  // the old rule, kept: max(decay, warmup + 1 step)
  config.scheduler.lr_decay_iters = 5;
  EXPECT_EQ(config.scheduler_steps().decay, 88);
  EXPECT_EQ(config.scheduler_steps().warmup, 80);
}

// pretrain() with train.train_samples: train_samples / global_batch_size steps, each at the learning rate of the
// iteration-based run (the scheduler built from scheduler_steps(), train_iters set by finalize()).
TEST(ConfigSchedule, PretrainTrainsTheSamplesAtTheSameLearningRates) {
  const auto run = [](ConfigContainer config) {
    config.model.num_layers = 1;
    config.model.hidden_size = 16;
    config.model.num_attention_heads = 2;
    config.model.vocab_size = 64;
    config.model.seq_length = 8;
    config.train.micro_batch_size = 2;
    config.train.global_batch_size = 4;
    config.train.num_threads = 1;
    config.optimizer.lr = 1e-3;
    config.optimizer.min_lr = 1e-4;
    auto callbacks = std::make_shared<CallbackManager>();
    std::vector<double> rates;
    callbacks->register_callback(Event::kTrainStepEnd,
                                 [&](CallbackContext& ctx) { rates.push_back(ctx.scheduler->get_lr()); });
    const TrainState state = pretrain(config, gpt_forward_step, callbacks);
    EXPECT_EQ(state.consumed_train_samples, 20);
    return rates;
  };
  ConfigContainer iterations;
  iterations.train.train_iters = 5;
  iterations.scheduler.lr_warmup_iters = 2;
  ConfigContainer samples;
  samples.train.train_samples = 22;  // 5 steps of 4; the decay as the 20 samples they train
  samples.scheduler.lr_warmup_samples = 8;
  samples.scheduler.lr_decay_samples = 20;
  const std::vector<double> expected = run(iterations);
  ASSERT_EQ(expected.size(), 5u);
  EXPECT_EQ(run(samples), expected);
  EXPECT_DOUBLE_EQ(expected[0], 0.5e-3);
}

}  // namespace
}  // namespace bridge::training
