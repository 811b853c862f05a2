// CallbackContext: required and optional fields, absent-field errors, and empty versus absent loss maps.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>

#include "tests/unit/callback_test_support.h"
#include "training/callbacks.h"
#include "training/optimizer/optimizer_param_scheduler.h"

namespace bridge::training {
namespace {

using testing::CallbackTest;
using ::testing::HasSubstr;

TEST_F(CallbackTest, MB01_RequiredFieldsAreAccessible) {
  EXPECT_EQ(&ctx.state, &state);
  EXPECT_EQ(&ctx.model, &model);
  EXPECT_EQ(&ctx.user_state, &manager.user_state());
  ctx.state.train_state.step = 7;
  EXPECT_EQ(state.train_state.step, 7);  // a view of the loop's state, not a copy
}

TEST_F(CallbackTest, MB02_OptionalFieldsDefaultToAbsent) {
  EXPECT_FALSE(ctx.optimizer.has_value());
  EXPECT_FALSE(ctx.scheduler.has_value());
  EXPECT_FALSE(ctx.loss_dict.has_value());
  EXPECT_FALSE(ctx.grad_norm.has_value());
  EXPECT_FALSE(ctx.skipped_iter.has_value());
  EXPECT_FALSE(ctx.total_loss_dict.has_value());
  EXPECT_FALSE(ctx.micro_batch.has_value());
  EXPECT_FALSE(ctx.model_chunk.has_value());
  EXPECT_FALSE(ctx.output_tensor.has_value());
  EXPECT_FALSE(ctx.log.has_value());
  EXPECT_FALSE(ctx.checkpoint.has_value());
  EXPECT_FALSE(ctx.exception.has_value());
}

TEST_F(CallbackTest, MB03_OptionalFieldsAreAccessibleWhenProvided) {
  torch::optim::AdamW optimizer(model[0]->parameters(), torch::optim::AdamWOptions(1e-3));
  OptimizerParamScheduler scheduler(optimizer, {});
  ctx.optimizer = optimizer;
  ctx.scheduler = scheduler;
  ctx.grad_norm = 1.5;
  ctx.skipped_iter = false;
  ctx.loss_dict = LossDict{{"lm loss", torch::tensor(2.5)}};
  ctx.total_loss_dict = LossDict{{"lm loss", torch::tensor(3.0)}};

  EXPECT_EQ(ctx.optimizer.get(), &optimizer);
  EXPECT_EQ(&ctx.scheduler.value(), &scheduler);
  EXPECT_DOUBLE_EQ(*ctx.grad_norm, 1.5);
  EXPECT_FALSE(*ctx.skipped_iter);
  EXPECT_DOUBLE_EQ(ctx.loss_dict->at("lm loss").item<double>(), 2.5);
  EXPECT_DOUBLE_EQ(ctx.total_loss_dict->at("lm loss").item<double>(), 3.0);
  EXPECT_EQ(ctx.optimizer->param_groups().size(), 1u);  // -> reaches the referenced object
}

TEST(CallbackContext, MB04_UserStateDefaultsToEmpty) {
  GlobalState state;
  ModelChunks model;
  CallbackContext ctx(state, model);
  EXPECT_TRUE(ctx.user_state.empty());
}

TEST_F(CallbackTest, MB05_UserStateIsMutable) {
  ctx.user_state.set("key", std::string("value"));
  EXPECT_EQ(manager.user_state().get<std::string>("key"), "value");
}

TEST_F(CallbackTest, ReadingAnAbsentFieldNamesTheFieldAndItsEvents) {
  try {
    (void)ctx.loss_dict.value();
    FAIL() << "expected std::logic_error";
  } catch (const std::logic_error& error) {
    EXPECT_THAT(error.what(), HasSubstr("CallbackContext::loss_dict is absent"));
    EXPECT_THAT(error.what(), HasSubstr("provided by: on_train_step_end."));
    EXPECT_THAT(error.what(), HasSubstr("ctx.loss_dict.has_value()"));
  }
  try {
    (void)ctx.total_loss_dict->size();
    FAIL() << "expected std::logic_error";
  } catch (const std::logic_error& error) {
    EXPECT_THAT(error.what(), HasSubstr("provided by: on_eval_end, on_test_end."));
  }
  EXPECT_THROW((void)*ctx.grad_norm, std::logic_error);
  EXPECT_THROW((void)ctx.optimizer->param_groups(), std::logic_error);
  EXPECT_THROW((void)ctx.scheduler.value(), std::logic_error);
  EXPECT_THROW((void)ctx.log->metrics, std::logic_error);
}

TEST_F(CallbackTest, EmptyLossMapIsDistinctFromAbsent) {
  ctx.loss_dict = LossDict{};  // off the last pipeline stage
  ASSERT_TRUE(ctx.loss_dict.has_value());
  EXPECT_TRUE(ctx.loss_dict->empty());
  ctx.loss_dict.reset();
  EXPECT_FALSE(ctx.loss_dict.has_value());
}

TEST_F(CallbackTest, LogRecordIsSharedWithTheLoop) {
  LogRecord record;
  record.iteration = 10;
  ctx.log = record;
  manager.register_callback(Event::kLog, [](CallbackContext& c) {
    c.log->metrics["tokens/s"] = 1234.0;
    c.log->text.push_back("my metric: 1");
  });
  manager.fire(Event::kLog, ctx);
  EXPECT_DOUBLE_EQ(record.metrics.at("tokens/s"), 1234.0);
  ASSERT_EQ(record.text.size(), 1u);
  EXPECT_EQ(record.text[0], "my metric: 1");
}

TEST(ContextFieldTable, EveryFieldNamesTheEventsThatProvideIt) {
  for (auto field :
       {ContextFieldId::kOptimizer, ContextFieldId::kScheduler, ContextFieldId::kLossDict, ContextFieldId::kGradNorm,
        ContextFieldId::kSkippedIter, ContextFieldId::kTotalLossDict, ContextFieldId::kMicroBatch,
        ContextFieldId::kModelChunk, ContextFieldId::kOutputTensor, ContextFieldId::kLog, ContextFieldId::kTimers,
        ContextFieldId::kCheckpoint, ContextFieldId::kException}) {
    EXPECT_FALSE(events_providing(field).empty()) << to_string(field);
    EXPECT_NE(to_string(field), "unknown");
  }
  // on_setup_start comes before anything is built: no field beyond state, model and user_state names it.
  for (int id = 0; id <= static_cast<int>(ContextFieldId::kException); ++id) {
    const auto& events = events_providing(static_cast<ContextFieldId>(id));
    EXPECT_EQ(std::find(events.begin(), events.end(), Event::kSetupStart), events.end());
  }
  EXPECT_EQ(events_providing(ContextFieldId::kTimers), std::vector<Event>{Event::kLog});
  // Megatron-Bridge: on_checkpoint_save carries the optimizer but not the scheduler.
  const auto& optimizer_events = events_providing(ContextFieldId::kOptimizer);
  const auto& scheduler_events = events_providing(ContextFieldId::kScheduler);
  EXPECT_NE(std::find(optimizer_events.begin(), optimizer_events.end(), Event::kCheckpointSave),
            optimizer_events.end());
  EXPECT_EQ(std::find(scheduler_events.begin(), scheduler_events.end(), Event::kCheckpointSave),
            scheduler_events.end());
}

}  // namespace
}  // namespace bridge::training
