// pretrain() in one process: the reference's end-to-end callback test (event order and counts, fields, model mode,
// user_state, functional callbacks, step numbers), what the log shows (the first step, the ETA, the steps a loss
// averages, one line per stop, resuming as info), the configuration errors, and the step-function shapes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "bridge/bridge.h"
#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "utils/logging.h"

namespace bridge::training {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

ConfigContainer tiny_config() {
  ConfigContainer config;
  config.model.num_layers = 2;
  config.model.hidden_size = 16;
  config.model.num_attention_heads = 2;
  config.model.vocab_size = 64;
  config.model.seq_length = 8;
  config.train.micro_batch_size = 2;
  config.train.global_batch_size = 4;
  config.train.num_threads = 1;
  return config;
}

// Records every event with what the reference guarantees about its context.
class Tracking : public Callback {
 public:
  std::vector<std::string> events;
  std::vector<int64_t> step_end_steps, step_end_iterations, eval_end_iterations;
  int missing_fields = 0;
  int wrong_mode = 0;

  void record(CallbackContext& ctx, bool training_event) {
    events.emplace_back(to_string(*ctx.event()));
    if (ctx.model.empty() || ctx.state.cfg == nullptr) ++missing_fields;
    if (training_event && (!ctx.optimizer.has_value() || !ctx.scheduler.has_value())) ++missing_fields;
    for (const auto& chunk : ctx.model) {
      if (chunk->is_training() != training_event) ++wrong_mode;
    }
  }
  void on_train_start(CallbackContext& ctx) override { record(ctx, true); }
  void on_train_step_start(CallbackContext& ctx) override { record(ctx, true); }
  void on_train_step_end(CallbackContext& ctx) override {
    record(ctx, true);
    if (!ctx.loss_dict.has_value() || !ctx.grad_norm.has_value() || !ctx.skipped_iter.has_value()) ++missing_fields;
    if (ctx.loss_dict.has_value() && ctx.loss_dict->count("lm loss") == 0) ++missing_fields;
    step_end_steps.push_back(ctx.state.train_state.step);
    step_end_iterations.push_back(ctx.iteration());
  }
  void on_train_end(CallbackContext& ctx) override { record(ctx, true); }
  void on_eval_start(CallbackContext& ctx) override { record(ctx, false); }
  void on_eval_step_start(CallbackContext& ctx) override { record(ctx, false); }
  void on_eval_step_end(CallbackContext& ctx) override { record(ctx, false); }
  void on_eval_end(CallbackContext& ctx) override {
    record(ctx, false);
    eval_end_iterations.push_back(ctx.iteration());
    if (!ctx.total_loss_dict.has_value() || ctx.total_loss_dict->count("lm loss") == 0) ++missing_fields;
  }
  void on_test_start(CallbackContext& ctx) override { record(ctx, false); }
  void on_test_step_start(CallbackContext& ctx) override { record(ctx, false); }
  void on_test_step_end(CallbackContext& ctx) override { record(ctx, false); }
  void on_test_end(CallbackContext& ctx) override {
    record(ctx, false);
    if (!ctx.total_loss_dict.has_value()) ++missing_fields;
  }
  void on_checkpoint_save(CallbackContext& ctx) override {
    events.emplace_back(to_string(*ctx.event()));
    if (!ctx.optimizer.has_value() || ctx.scheduler.has_value() || !ctx.checkpoint.has_value()) ++missing_fields;
  }
};

// Counts steps in user_state and reads the count back at evaluation and test (the reference's UserState callback).
class Counting : public Callback {
 public:
  std::vector<int64_t> step_counts, eval_reads, test_reads;
  void on_train_step_end(CallbackContext& ctx) override {
    const int64_t count = ctx.user_state.get_or<int64_t>("steps", 0) + 1;
    ctx.user_state.set("steps", count);
    step_counts.push_back(count);
  }
  void on_eval_start(CallbackContext& ctx) override { eval_reads.push_back(ctx.user_state.get<int64_t>("steps")); }
  void on_test_start(CallbackContext& ctx) override { test_reads.push_back(ctx.user_state.get<int64_t>("steps")); }
};

int count(const std::vector<std::string>& events, const std::string& name) {
  return static_cast<int>(std::count(events.begin(), events.end(), name));
}

TEST(PretrainEvents, ReferenceEndToEndSequence) {
  const fs::path save = fs::temp_directory_path() / ("bridge_pretrain_events_" + std::to_string(::getpid()));
  fs::remove_all(save);
  ConfigContainer config = tiny_config();
  config.train.train_iters = 8;
  config.train.eval_interval = 5;
  config.train.eval_iters = 2;
  config.checkpoint.save = save.string();
  config.checkpoint.save_interval = 7;

  auto tracking = std::make_shared<Tracking>();
  auto counting = std::make_shared<Counting>();
  auto manager = std::make_shared<CallbackManager>();
  manager->add({tracking, counting});
  std::vector<std::string> log;
  manager->register_callback("on_train_start", [&](CallbackContext&) { log.push_back("fn_start"); });
  manager->register_callback("on_train_step_end", [&](CallbackContext&) { log.push_back("fn_step"); });
  manager->register_callback("on_train_end", [&](CallbackContext&) { log.push_back("fn_end"); });

  const TrainState final_state = pretrain(config, gpt_forward_step, manager);
  EXPECT_EQ(final_state.step, 8);

  const auto& events = tracking->events;
  EXPECT_EQ(count(events, "on_train_start"), 1);
  EXPECT_EQ(count(events, "on_train_end"), 1);
  EXPECT_EQ(count(events, "on_train_step_start"), 8);
  EXPECT_EQ(count(events, "on_train_step_end"), 8);
  EXPECT_EQ(count(events, "on_checkpoint_save"), 2);  // step 7, and the final save at step 8
  EXPECT_EQ(count(events, "on_eval_start"), 2);       // in the loop at step 5, and after training
  EXPECT_EQ(count(events, "on_eval_end"), 2);
  EXPECT_EQ(count(events, "on_eval_step_start"), 4);
  EXPECT_EQ(count(events, "on_eval_step_end"), 4);
  EXPECT_EQ(count(events, "on_test_start"), 1);
  EXPECT_EQ(count(events, "on_test_end"), 1);
  EXPECT_EQ(count(events, "on_test_step_start"), 2);
  EXPECT_EQ(count(events, "on_test_step_end"), 2);

  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front(), "on_train_start");
  EXPECT_EQ(events.back(), "on_test_end");
  const auto position = [&](const std::string& name) {
    return std::find(events.begin(), events.end(), name) - events.begin();
  };
  EXPECT_LT(position("on_train_end"), position("on_test_start"));
  // Every step_start is followed by its step_end before the next step_start.
  std::string previous;
  for (const std::string& event : events) {
    if (event == "on_train_step_start") {
      EXPECT_NE(previous, "on_train_step_start");
    }
    if (event == "on_train_step_end") {
      EXPECT_EQ(previous, "on_train_step_start");
    }
    if (event.rfind("on_train_step", 0) == 0) previous = event;
  }
  // Order inside step 5 (index 4) and step 7: step_end, then eval, then the save.
  const std::vector<std::string> expected_step_five = {
      "on_train_step_start", "on_train_step_end", "on_eval_start", "on_eval_step_start", "on_eval_step_end",
      "on_eval_step_start",  "on_eval_step_end",  "on_eval_end",   "on_train_step_start"};
  auto fifth = std::find(events.begin(), events.end(), "on_train_step_start");
  for (int i = 0; i < 4; ++i) fifth = std::find(fifth + 1, events.end(), "on_train_step_start");
  EXPECT_EQ(std::vector<std::string>(fifth, fifth + 9), expected_step_five);

  EXPECT_EQ(tracking->missing_fields, 0);
  EXPECT_EQ(tracking->wrong_mode, 0);
  EXPECT_EQ(tracking->step_end_steps, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));  // before the increment
  // ctx.iteration() numbers them as the log does ("iteration 1" is the first), at every event.
  EXPECT_EQ(tracking->step_end_iterations, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(tracking->eval_end_iterations, (std::vector<int64_t>{5, 8}));  // "validation loss at iteration 5"
  EXPECT_EQ(counting->step_counts, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(counting->eval_reads, (std::vector<int64_t>{5, 8}));
  EXPECT_EQ(counting->test_reads, (std::vector<int64_t>{8}));
  ASSERT_EQ(log.size(), 10U);
  EXPECT_EQ(log.front(), "fn_start");
  EXPECT_EQ(log.back(), "fn_end");
  EXPECT_EQ(std::count(log.begin(), log.end(), "fn_step"), 8);

  EXPECT_TRUE(fs::exists(save / "iter_0000007" / "metadata.json"));
  EXPECT_TRUE(fs::exists(save / "iter_0000008" / "metadata.json"));
  fs::remove_all(save);
}

TEST(PretrainEvents, ExtensionEventsFirePerMicroBatchAndAroundTheOptimizer) {
  ConfigContainer config = tiny_config();
  config.train.train_iters = 3;  // 2 micro-batches per step
  std::vector<std::string> sequence;
  auto manager = std::make_shared<CallbackManager>();
  for (Event event : {Event::kForwardStart, Event::kForwardEnd, Event::kBackwardStart, Event::kBackwardEnd,
                      Event::kOptimizerStepStart, Event::kOptimizerStepEnd, Event::kLog, Event::kDataInitStart}) {
    manager->register_callback(event, [&sequence](CallbackContext& ctx) {
      std::string entry(to_string(*ctx.event()));
      if (ctx.micro_batch.has_value()) entry += "#" + std::to_string(*ctx.micro_batch);
      if (ctx.event() == Event::kForwardEnd && !ctx.output_tensor->defined()) entry += "!no-output";
      if (ctx.event() == Event::kOptimizerStepStart && !ctx.grad_norm.has_value()) entry += "!no-grad-norm";
      if (ctx.event() == Event::kLog) {
        if (ctx.log->metrics.count("lm loss") == 0) entry += "!no-loss";
        ctx.log->text.push_back("custom: 1");
      }
      sequence.push_back(entry);
    });
  }
  pretrain(config, gpt_forward_step, manager);
  const std::vector<std::string> one_step = {"on_forward_start#0",
                                             "on_forward_end#0",
                                             "on_backward_start#0",
                                             "on_backward_end#0",
                                             "on_forward_start#1",
                                             "on_forward_end#1",
                                             "on_backward_start#1",
                                             "on_backward_end#1",
                                             "on_optimizer_step_start",
                                             "on_optimizer_step_end",
                                             "on_log"};
  std::vector<std::string> expected = {"on_data_init_start"};
  for (int i = 0; i < 3; ++i) expected.insert(expected.end(), one_step.begin(), one_step.end());
  EXPECT_EQ(sequence, expected);
}

// Megatron-LM's on_setup_start: once, before every other event and before the groups and the model exist, with the
// config as passed; the fields that need what setup builds are absent and say so when read.
class SetupStart : public Callback {
 public:
  std::vector<std::string> events;
  int setup_starts = 0;
  bool groups_existed = true, had_model = true, had_optimizer = true, optimizer_read_threw = false;
  int64_t train_iters_seen = 0;
  void on_setup_start(CallbackContext& ctx) override {
    ++setup_starts;
    events.emplace_back(to_string(*ctx.event()));
    groups_existed = parallel::model_parallel_is_initialized();
    had_model = !ctx.model.empty();
    had_optimizer = ctx.optimizer.has_value();
    train_iters_seen = ctx.state.cfg != nullptr ? ctx.state.cfg->train.train_iters : -1;
    try {
      ctx.optimizer.value();
    } catch (const std::logic_error&) {
      optimizer_read_threw = true;
    }
  }
  void on_data_init_start(CallbackContext& ctx) override { events.emplace_back(to_string(*ctx.event())); }
  void on_train_start(CallbackContext& ctx) override { events.emplace_back(to_string(*ctx.event())); }
  void on_train_end(CallbackContext& ctx) override { events.emplace_back(to_string(*ctx.event())); }
};

TEST(PretrainEvents, SetupStartFiresOnceFirstWithTheConfigAndNoModel) {
  ConfigContainer config = tiny_config();
  config.train.train_iters = 1;
  auto callback = std::make_shared<SetupStart>();
  auto manager = std::make_shared<CallbackManager>();
  manager->add(callback);
  pretrain(config, gpt_forward_step, manager);
  EXPECT_EQ(callback->setup_starts, 1);
  EXPECT_EQ(callback->events,
            (std::vector<std::string>{"on_setup_start", "on_data_init_start", "on_train_start", "on_train_end"}));
  EXPECT_FALSE(callback->groups_existed);
  EXPECT_FALSE(callback->had_model);
  EXPECT_FALSE(callback->had_optimizer);
  EXPECT_TRUE(callback->optimizer_read_threw);
  EXPECT_EQ(callback->train_iters_seen, 1);
}

TEST(PretrainEvents, SkipTrainRunsOnlyValidationAndTest) {
  ConfigContainer config = tiny_config();
  config.train.train_iters = 1;
  config.train.skip_train = true;  // evaluation only: no train events
  config.train.eval_iters = 1;
  std::vector<std::string> events;
  auto manager = std::make_shared<CallbackManager>();
  for (Event event : {Event::kTrainStart, Event::kEvalStart, Event::kEvalEnd, Event::kTestEnd}) {
    manager->register_callback(event, [&](CallbackContext& ctx) { events.emplace_back(to_string(*ctx.event())); });
  }
  pretrain(config, gpt_forward_step, manager);
  EXPECT_EQ(events, (std::vector<std::string>{"on_eval_start", "on_eval_end", "on_test_end"}));
}

TEST(PretrainEvents, StopRequestEndsTrainingAtThatStepWithTrainEnd) {
  ConfigContainer config = tiny_config();
  config.train.train_iters = 10;
  bool train_end = false;
  auto manager = std::make_shared<CallbackManager>();
  manager->register_callback(Event::kTrainStepEnd, [](CallbackContext& ctx) {
    if (ctx.state.train_state.step == 3) ctx.request_stop("enough");
  });
  manager->register_callback(Event::kTrainEnd, [&](CallbackContext&) { train_end = true; });
  EXPECT_EQ(pretrain(config, gpt_forward_step, manager).step, 4);
  EXPECT_TRUE(train_end);
}

TEST(PretrainEvents, AbortThrowsAndFiresOnExceptionButNotTrainEnd) {
  ConfigContainer config = tiny_config();
  config.train.train_iters = 10;
  bool train_end = false;
  std::string seen;
  auto manager = std::make_shared<CallbackManager>();
  manager->register_callback(
      Event::kTrainStepEnd, [](CallbackContext& ctx) { ctx.request_abort("diverged"); }, "guard");
  manager->register_callback(Event::kTrainEnd, [&](CallbackContext&) { train_end = true; });
  manager->register_callback(Event::kException, [&](CallbackContext& ctx) { seen = ctx.exception->what; });
  try {
    pretrain(config, gpt_forward_step, manager);
    FAIL() << "expected TrainingAborted";
  } catch (const TrainingAborted& error) {
    EXPECT_THAT(error.what(), HasSubstr("callback 'guard' asked to abort during on_train_step_end: diverged"));
  }
  EXPECT_FALSE(train_end);
  EXPECT_THAT(seen, HasSubstr("diverged"));
}

TEST(PretrainEvents, RequestsAfterTheLastStepAreActedOnAndNotLeftForTheNextRun) {
  ConfigContainer config = tiny_config();
  config.train.train_iters = 2;
  config.train.eval_iters = 1;
  auto manager = std::make_shared<CallbackManager>();
  bool armed = true;
  manager->register_callback(Event::kTestEnd, [&](CallbackContext& ctx) {
    if (armed) ctx.request_abort("test loss is NaN");
  });
  EXPECT_THROW(pretrain(config, gpt_forward_step, manager), TrainingAborted);
  armed = false;
  EXPECT_EQ(pretrain(config, gpt_forward_step, manager).step, 2);  // nothing stale stops the next run
}

TEST(PretrainEvents, StopRequestedBeforeTheFirstStepTrainsNothing) {
  ConfigContainer config = tiny_config();
  config.train.train_iters = 5;
  int steps = 0;
  bool train_end = false;
  auto manager = std::make_shared<CallbackManager>();
  manager->register_callback(Event::kTrainStart, [](CallbackContext& ctx) { ctx.request_stop("dry run"); });
  manager->register_callback(Event::kTrainStepStart, [&](CallbackContext&) { ++steps; });
  manager->register_callback(Event::kTrainEnd, [&](CallbackContext&) { train_end = true; });
  EXPECT_EQ(pretrain(config, gpt_forward_step, manager).step, 0);
  EXPECT_EQ(steps, 0);
  EXPECT_TRUE(train_end);
}

TEST(PretrainEvents, NonFiniteGradientsFailTheRunNamingTheSwitch) {
  ConfigContainer config = tiny_config();
  config.train.train_iters = 3;
  auto poisoned = [](DataIterator& data, models::GPTModel& model) {
    StepResult result = gpt_forward_step(data, model);
    result.first = result.first * std::numeric_limits<float>::quiet_NaN();
    return result;
  };
  try {
    pretrain(config, poisoned);
    FAIL() << "expected the NaN check to fail the run";
  } catch (const std::runtime_error& error) {
    EXPECT_THAT(error.what(), HasSubstr("train.check_for_nan_in_loss_and_grad"));
  }
  config.train.check_for_nan_in_loss_and_grad = false;
  EXPECT_EQ(pretrain(config, poisoned).step, 3);
}

// The log of the runs below, as a user reads it (rank 0's stderr); stderr again afterwards.
class CapturedLog {
 public:
  CapturedLog() { bridge::utils::configure_logging(0, 1, std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)); }
  ~CapturedLog() {
    bridge::utils::configure_logging(0, 1, std::make_shared<spdlog::sinks::ostream_sink_mt>(std::cerr));
  }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;
  std::string text() {
    bridge::utils::logger().flush();
    return out_.str();
  }

 private:
  std::ostringstream out_;
};

int occurrences(const std::string& text, const std::string& needle) {
  int n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// A new user saw nothing before the first log_interval and no ETA: the first step is logged at once, every line has
// the time elapsed and the ETA, and says how many steps its losses are the means of. The callbacks' ctx.iteration() and
// the log number the steps alike.
TEST(PretrainLog, TheFirstStepIsLoggedAndEveryLineHasTheEtaAndTheStepsItsLossAverages) {
  ConfigContainer config = tiny_config();
  config.train.train_iters = 7;
  config.logging.log_interval = 3;
  std::vector<int64_t> step_iterations, log_iterations;
  auto manager = std::make_shared<CallbackManager>();
  manager->register_callback(Event::kTrainStepEnd,
                             [&](CallbackContext& ctx) { step_iterations.push_back(ctx.iteration()); });
  manager->register_callback(Event::kLog, [&](CallbackContext& ctx) {
    log_iterations.push_back(ctx.iteration());
    EXPECT_EQ(ctx.iteration(), ctx.log->iteration);
  });
  CapturedLog log;
  EXPECT_EQ(pretrain(config, gpt_forward_step, manager).step, 7);
  const std::string text = log.text();
  std::vector<int64_t> lines;
  std::vector<std::string> averaged;
  const std::regex line(R"(iteration +([0-9]+)/ +7 \|.*? \| elapsed: [0-9]+:[0-5][0-9]:[0-5][0-9] \| ETA: )"
                        R"([0-9]+:[0-5][0-9]:[0-5][0-9] \|.*?( losses averaged over: [0-9]+ steps \|)? lm loss: )"
                        R"([-+0-9.E]+ \|)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), line); it != std::sregex_iterator(); ++it) {
    lines.push_back(std::stoll((*it)[1]));
    averaged.push_back((*it)[2]);
  }
  EXPECT_EQ(lines, (std::vector<int64_t>{1, 3, 6})) << text;
  EXPECT_EQ(averaged,
            (std::vector<std::string>{"", " losses averaged over: 2 steps |", " losses averaged over: 3 steps |"}))
      << text;
  EXPECT_EQ(log_iterations, (std::vector<int64_t>{1, 3, 6}));
  EXPECT_EQ(step_iterations, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
}

// on_log's timers are the log line's: "iteration-time" is its elapsed time per iteration in seconds (and the writers'
// iteration-time); a step that only the writers log times no interval, so its timers are empty.
TEST(PretrainLog, OnLogTimersAreTheIntervalTimesTheLogLinePrints) {
  const fs::path jsonl =
      fs::temp_directory_path() / ("bridge_pretrain_timers_" + std::to_string(::getpid()) + ".jsonl");
  ConfigContainer config = tiny_config();
  config.train.train_iters = 4;
  config.logging.log_interval = 2;  // console lines at 1, 2 and 4; step 3 only goes to the writer
  config.logging.jsonl_path = jsonl.string();
  config.logging.log_timers_to_tensorboard = true;
  std::map<int64_t, std::map<std::string, double>> timers;
  auto manager = std::make_shared<CallbackManager>();
  manager->register_callback(Event::kLog, [&](CallbackContext& ctx) {
    timers[ctx.iteration()] = *ctx.timers;
    const auto metric = ctx.log->metrics.find("iteration-time");
    if (ctx.timers->count("iteration-time") != 0) {
      ASSERT_NE(metric, ctx.log->metrics.end());
      EXPECT_EQ(metric->second, ctx.timers->at("iteration-time"));
    }
  });
  CapturedLog log;
  pretrain(config, gpt_forward_step, manager);
  const std::string text = log.text();
  std::map<int64_t, double> printed_ms;
  const std::regex line(R"(iteration +([0-9]+)/ +4 \|.*? elapsed time per iteration \(ms\): ([0-9.]+) \|)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), line); it != std::sregex_iterator(); ++it) {
    printed_ms[std::stoll((*it)[1])] = std::stod((*it)[2]);
  }
  ASSERT_EQ(printed_ms.size(), 3U) << text;
  ASSERT_EQ(timers.size(), 4U);
  EXPECT_TRUE(timers.at(3).empty());
  for (const auto& [iteration, ms] : printed_ms) {
    ASSERT_EQ(timers.at(iteration).size(), 1U) << iteration;
    EXPECT_NEAR(timers.at(iteration).at("iteration-time") * 1000.0, ms, 0.05 + 1e-9) << iteration;  // "%.1f"
    EXPECT_GT(timers.at(iteration).at("iteration-time"), 0.0);
  }
  fs::remove(jsonl);
}

// A stop asked for at an evaluation ends training; the validation after training must not ask again, which logged
// the same stop a second time.
TEST(PretrainLog, AnEarlyStoppingStopIsLoggedOnce) {
  ConfigContainer config = tiny_config();
  config.train.train_iters = 20;
  config.train.eval_interval = 2;
  config.train.eval_iters = 1;
  EarlyStoppingOptions options;
  options.stopping_threshold = 1e9;  // any validation loss passes it: a stop at the first evaluation
  CapturedLog log;
  EXPECT_EQ(pretrain(config, gpt_forward_step, {std::make_shared<EarlyStopping>(options)}).step, 2);
  const std::string text = log.text();
  EXPECT_EQ(occurrences(text, "callback 'EarlyStopping' asked to stop"), 1) << text;
  EXPECT_EQ(occurrences(text, "stopping after step 2 as requested"), 1) << text;
}

// Resuming is routine: info, not a warning.
TEST(PretrainLog, ResumingFromACheckpointIsInfo) {
  const fs::path save = fs::temp_directory_path() / ("bridge_pretrain_resume_log_" + std::to_string(::getpid()));
  fs::remove_all(save);
  ConfigContainer config = tiny_config();
  config.train.train_iters = 2;
  config.checkpoint.save = save.string();
  pretrain(config, gpt_forward_step);
  config.train.train_iters = 3;
  config.checkpoint.load = save.string();
  CapturedLog log;
  EXPECT_EQ(pretrain(config, gpt_forward_step).step, 3);
  const std::string text = log.text();
  EXPECT_THAT(text, HasSubstr("[info] resuming from checkpoint " + (save / "iter_0000002").string()));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("[warning]"))) << text;
  fs::remove_all(save);
}

TEST(PretrainCheckpoint, AFailedWriteFailsTheRunAndKeepsThePreviousCheckpoint) {
  const fs::path root = fs::temp_directory_path() / ("bridge_pretrain_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(root);
  ConfigContainer config = tiny_config();
  config.train.train_iters = 4;
  config.checkpoint.save = root.string();
  config.checkpoint.save_interval = 2;
  auto manager = std::make_shared<CallbackManager>();
  manager->register_callback(Event::kCheckpointSave, [&](CallbackContext& ctx) {
    // Block the next save: a regular file where its directory should go.
    std::ofstream(root / "iter_0000004") << "not a directory";
    EXPECT_EQ(ctx.checkpoint->iteration, 2);
  });
  try {
    pretrain(config, gpt_forward_step, manager);
    FAIL() << "expected the second save to fail";
  } catch (const std::runtime_error& error) {
    EXPECT_THAT(error.what(), HasSubstr("saving checkpoint iteration 4"));
    EXPECT_THAT(error.what(), HasSubstr("still names the previous complete checkpoint"));
  }
  std::ifstream tracker(root / "latest_checkpointed_iteration.txt");
  int64_t latest = 0;
  tracker >> latest;
  EXPECT_EQ(latest, 2);
  EXPECT_TRUE(fs::exists(root / "iter_0000002" / "metadata.json"));  // torch_dist's last file: complete
  fs::remove_all(root);
}

TEST(PretrainSteps, BothStepFunctionShapesAndFunctorsWork) {
  ConfigContainer config = tiny_config();
  config.train.train_iters = 2;
  int calls = 0;
  pretrain(config, [&](DataIterator& data, models::GPTModel& model) {
    ++calls;
    return gpt_forward_step(data, model);
  });
  EXPECT_EQ(calls, 4);  // 2 steps x 2 micro-batches
  std::vector<int64_t> steps_seen;
  pretrain(config, [&](GlobalState& state, DataIterator& data, models::GPTModel& model) {
    steps_seen.push_back(state.train_state.step);
    return gpt_forward_step(data, model);
  });
  EXPECT_EQ(steps_seen, (std::vector<int64_t>{0, 0, 1, 1}));
  struct Functor {
    int calls = 0;
    StepResult operator()(DataIterator& data, models::GPTModel& model) {
      ++calls;
      return gpt_forward_step(data, model);
    }
  } functor;
  pretrain(config, std::ref(functor), nullptr);
  EXPECT_EQ(functor.calls, 4);
}

TEST(PretrainSteps, CallbacksAsNothingAListOrAManager) {
  ConfigContainer config = tiny_config();
  config.train.train_iters = 1;
  auto tracking = std::make_shared<Tracking>();
  pretrain(config, gpt_forward_step, {tracking});
  EXPECT_EQ(count(tracking->events, "on_train_step_end"), 1);
  pretrain(config, gpt_forward_step, std::vector<std::shared_ptr<Callback>>{tracking});
  EXPECT_EQ(count(tracking->events, "on_train_step_end"), 2);
  EXPECT_EQ(pretrain(config, gpt_forward_step).step, 1);
}

// A CallbackManager the caller owns (not a shared_ptr) is passed as it is.
TEST(PretrainSteps, AManagerObjectIsTakenByReference) {
  ConfigContainer config = tiny_config();
  config.train.train_iters = 2;
  CallbackManager manager;
  int steps = 0;
  manager.register_callback(Event::kTrainStepEnd, [&](CallbackContext&) { ++steps; });
  EXPECT_EQ(pretrain(config, gpt_forward_step, manager).step, 2);
  EXPECT_EQ(steps, 2);
}

// config.callbacks (a recipe's `callbacks:` list) are built and run after the caller's, for that run only: a threshold
// every loss passes stops at the first log step; a bad option fails validation before anything is built.
TEST(PretrainSteps, TheRecipesCallbacksAreBuiltAndRun) {
  ConfigContainer config = tiny_config();
  config.train.train_iters = 10;
  config.callbacks = {{"ThresholdStopper", {{"monitor", "lm loss"}, {"threshold", "1000"}}}};
  auto manager = std::make_shared<CallbackManager>();
  std::vector<std::string> stopped_by;
  manager->register_callback(Event::kTrainEnd, [&](CallbackContext&) { stopped_by.push_back("train end"); });
  EXPECT_EQ(pretrain(config, gpt_forward_step, manager).step, 1);
  EXPECT_EQ(stopped_by.size(), 1u);
  EXPECT_FALSE(manager->has_callbacks(Event::kLog));               // it joined the caller's manager for that run only,
  EXPECT_EQ(pretrain(config, gpt_forward_step, manager).step, 1);  // so a second run is the same
  EXPECT_EQ(stopped_by.size(), 2u);
  EXPECT_EQ(pretrain(config, gpt_forward_step).step, 1);  // and without a manager, one of its own

  config.callbacks = {{"EarlyStopping", {{"patience", "0"}}}};
  try {
    pretrain(config, gpt_forward_step);
    ADD_FAILURE() << "a patience of 0 trained";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), HasSubstr("callbacks[0]: EarlyStopping.patience is 0"));
  }
}

TEST(PretrainConfig, ErrorsNameTheField) {
  auto expect_error = [](ConfigContainer config, const std::string& field) {
    try {
      config.validate(1);
      FAIL() << "expected an error naming " << field;
    } catch (const std::invalid_argument& error) {
      EXPECT_THAT(error.what(), HasSubstr(field));
    }
  };
  ConfigContainer config = tiny_config();
  config.train.global_batch_size = 3;
  expect_error(config, "train.global_batch_size (3)");
  config = tiny_config();
  config.model.num_attention_heads = 3;
  expect_error(config, "model.hidden_size (16) must be divisible by model.num_attention_heads (3)");
  config = tiny_config();
  config.parallelism.tensor_model_parallel_size = 2;
  expect_error(config,
               "parallelism.tensor_model_parallel_size x parallelism.context_parallel_size x "
               "parallelism.pipeline_model_parallel_size (2)");
  config = tiny_config();
  config.optimizer.lr = -1;
  expect_error(config, "optimizer.lr");
  config = tiny_config();
  config.scheduler.lr_decay_style = "cosin";
  expect_error(config, "scheduler.lr_decay_style");
  config = tiny_config();
  config.checkpoint.save_interval = 5;
  expect_error(config, "checkpoint.save");
  config = tiny_config();
  config.model.num_layers = 3;
  ConfigContainer pipelined = config;
  pipelined.parallelism.pipeline_model_parallel_size = 1;
  pipelined.parallelism.virtual_pipeline_model_parallel_size = 2;
  expect_error(pipelined, "virtual_pipeline_model_parallel_size needs parallelism.pipeline_model_parallel_size >= 2");
}

TEST(PretrainConfig, DatasetWithAnotherSequenceLengthIsRejected) {
  ConfigContainer config = tiny_config();
  config.train.train_iters = 1;
  config.dataset.provider = [](const ConfigContainer& c) {
    return GPTDatasets{std::make_shared<MockGPTDataset>(c.model.vocab_size, c.model.seq_length * 2, 1), nullptr,
                       nullptr};
  };
  EXPECT_THROW(
      {
        try {
          pretrain(config, gpt_forward_step);
        } catch (const std::invalid_argument& error) {
          EXPECT_THAT(error.what(), HasSubstr("model.seq_length"));
          throw;
        }
      },
      std::invalid_argument);
}

}  // namespace
}  // namespace bridge::training
