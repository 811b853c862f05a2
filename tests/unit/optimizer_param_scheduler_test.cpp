// OptimizerParamScheduler against Megatron's formulas, evaluated by hand, and its option validation.
#include "training/optimizer/optimizer_param_scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <stdexcept>

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

}  // namespace
}  // namespace bridge::training
