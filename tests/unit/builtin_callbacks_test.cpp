// The built-in callbacks, each driven through a real CallbackManager with the events and fields the loop gives it:
// which values they read, when they ask to stop, save or abort (and why), what they add to the log record, their
// option errors, and their state across a checkpoint (state_dict into a fresh instance). The multi-rank behaviour
// (a decision on the last pipeline stage ending every rank) is in gpt_dist_test (GptBuiltins).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "bridge/models/gpt_model.h"
#include "bridge/models/moe/moe_logging.h"
#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "tests/unit/callback_test_support.h"
#include "training/callbacks.h"
#include "training/config/config.h"
#include "training/utils/flop_utils.h"

namespace bridge::training {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using testing::what_of;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A manager with one built-in and the loop's state: fires events as the loop does and collects the requests.
class Driver {
 public:
  explicit Driver(std::shared_ptr<Callback> callback) : callback_(std::move(callback)) {
    manager_.add(callback_);
    state_.cfg = &config_;
  }

  // on_log with `metrics` (the record the writers would get); returns the record after the callbacks.
  LogRecord log(std::map<std::string, double> metrics) {
    LogRecord record;
    record.iteration = state_.train_state.step;
    record.metrics = std::move(metrics);
    fire(Event::kLog, [&](CallbackContext& ctx) { ctx.log = &record; });
    return record;
  }
  void eval_end(double lm_loss) {
    fire(Event::kEvalEnd, [&](CallbackContext& ctx) {
      ctx.total_loss_dict = LossDict{{"lm loss", torch::tensor(lm_loss, torch::kDouble)}};
    });
  }
  // A training step as the loop fires it: start, end (train_state.step is the step in flight), then counted.
  void step() {
    fire(Event::kTrainStepStart, [](CallbackContext&) {});
    fire(Event::kTrainStepEnd, [](CallbackContext&) {});
    state_.train_state.step += 1;
  }
  template <class Fill>
  void fire(Event event, Fill&& fill) {
    if (!manager_.has_callbacks(event)) return;
    CallbackContext ctx(state_, model_, manager_.user_state());
    ctx.optimizer = optimizer_.get();
    fill(ctx);
    manager_.fire(event, ctx);
  }
  void fire(Event event) {
    fire(event, [](CallbackContext&) {});
  }

  std::vector<ControlRequest> take() { return manager_.control().take(); }
  ConfigContainer& config() { return config_; }
  GlobalState& state() { return state_; }
  void set_optimizer(std::unique_ptr<torch::optim::Optimizer> optimizer) { optimizer_ = std::move(optimizer); }

 private:
  std::shared_ptr<Callback> callback_;
  CallbackManager manager_;
  ConfigContainer config_;
  GlobalState state_;
  ModelChunks model_{torch::nn::Linear(4, 4).ptr()};
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

// --- MetricMonitor -----------------------------------------------------------------------------------------------

TEST(MetricMonitor, ValidationNamesReadTheEvalLossesOtherNamesTheLogRecord) {
  GlobalState state;
  ModelChunks model;
  CallbackManager manager;
  MetricMonitor validation("lm loss validation", "test.monitor");
  MetricMonitor training("lm loss", "test.monitor");
  EXPECT_EQ(validation.event(), Event::kEvalEnd);
  EXPECT_EQ(training.event(), Event::kLog);
  std::optional<double> at_eval, at_eval_training, at_log, at_log_validation;
  manager.register_callback(Event::kEvalEnd, [&](CallbackContext& ctx) {
    at_eval = validation.read(ctx);
    at_eval_training = training.read(ctx);
  });
  manager.register_callback(Event::kLog, [&](CallbackContext& ctx) {
    at_log = training.read(ctx);
    at_log_validation = validation.read(ctx);
  });
  CallbackContext eval(state, model, manager.user_state());
  eval.total_loss_dict = LossDict{{"lm loss", torch::tensor(2.5)}};
  manager.fire(Event::kEvalEnd, eval);
  LogRecord record;
  record.metrics = {{"lm loss", 3.25}, {"grad-norm", 1.0}};
  CallbackContext log(state, model, manager.user_state());
  log.log = &record;
  manager.fire(Event::kLog, log);
  EXPECT_EQ(at_eval, 2.5);
  EXPECT_EQ(at_eval_training, std::nullopt);
  EXPECT_EQ(at_log, 3.25);
  EXPECT_EQ(at_log_validation, std::nullopt);

  // A metric that is not there (a typo) reads as nothing; off the last stage the losses are absent by design.
  MetricMonitor typo("lm los", "test.monitor");
  std::optional<double> read = 1.0;
  manager.register_callback(Event::kLog, [&](CallbackContext& ctx) { read = typo.read(ctx); });
  manager.fire(Event::kLog, log);
  EXPECT_EQ(read, std::nullopt);
  EXPECT_THAT(what_of([] { MetricMonitor("", "EarlyStopping.monitor"); }), HasSubstr("EarlyStopping.monitor is empty"));
  EXPECT_THAT(what_of([] { parse_monitor_mode("mn", "EarlyStopping.mode"); }),
              HasSubstr("EarlyStopping.mode is 'mn'; use 'min'"));
}

// --- EarlyStopping -----------------------------------------------------------------------------------------------

TEST(EarlyStopping, StopsAfterPatienceChecksWithoutImprovement) {
  EarlyStoppingOptions options;
  options.patience = 3;
  auto early = std::make_shared<EarlyStopping>(options);
  Driver driver(early);
  const std::vector<double> losses = {5.0, 4.0, 4.5, 4.2, 4.0};  // best 4.0 at the second check; 4.0 is no better
  for (std::size_t i = 0; i < losses.size(); ++i) {
    driver.state().train_state.step = static_cast<int64_t>(10 * (i + 1));
    driver.eval_end(losses[i]);
    if (i < 4) {
      EXPECT_THAT(driver.take(), IsEmpty()) << "check " << i;
    }
  }
  const std::vector<ControlRequest> requests = driver.take();
  ASSERT_THAT(requests, SizeIs(1));
  EXPECT_EQ(requests[0].action, ControlAction::kStop);
  EXPECT_EQ(requests[0].callback, "EarlyStopping");
  EXPECT_EQ(requests[0].event, Event::kEvalEnd);
  EXPECT_THAT(requests[0].reason, HasSubstr("lm loss validation did not improve by more than 0 in 3 checks; the best "
                                            "was 4 at step 20"));
  EXPECT_EQ(early->best(), 4.0);
  EXPECT_EQ(early->wait(), 3);
  // The training-loss metrics in the log record.
  const LogRecord record = driver.log({{"lm loss", 4.1}});
  EXPECT_EQ(record.metrics.at("early_stopping/best"), 4.0);
  EXPECT_EQ(record.metrics.at("early_stopping/wait"), 3.0);
}

TEST(EarlyStopping, MinDeltaModeMaxThresholdsAndNonFiniteValues) {
  {  // an improvement must beat the best by more than min_delta
    EarlyStoppingOptions options;
    options.patience = 1;
    options.min_delta = 0.5;
    auto early = std::make_shared<EarlyStopping>(options);
    Driver driver(early);
    driver.eval_end(5.0);
    driver.eval_end(4.4);  // 0.6 better: an improvement
    EXPECT_THAT(driver.take(), IsEmpty());
    driver.eval_end(4.0);  // 0.4 better: not enough
    EXPECT_THAT(driver.take(), SizeIs(1));
    EXPECT_EQ(early->best(), 4.4);
  }
  {  // "max" on a training metric read at log steps
    EarlyStoppingOptions options;
    options.monitor = "accuracy";
    options.mode = "max";
    options.patience = 2;
    Driver driver(std::make_shared<EarlyStopping>(options));
    for (const double value : {0.5, 0.7, 0.6}) driver.log({{"accuracy", value}});
    EXPECT_THAT(driver.take(), IsEmpty());
    driver.log({{"accuracy", 0.7}});
    EXPECT_THAT(driver.take(), SizeIs(1));
  }
  {
    EarlyStoppingOptions options;
    options.stopping_threshold = 3.0;
    options.divergence_threshold = 9.0;
    Driver driver(std::make_shared<EarlyStopping>(options));
    driver.eval_end(3.0);  // not below the threshold
    EXPECT_THAT(driver.take(), IsEmpty());
    driver.eval_end(2.9);
    auto requests = driver.take();
    ASSERT_THAT(requests, SizeIs(1));
    EXPECT_THAT(requests[0].reason, HasSubstr("lm loss validation = 2.9 passed the stopping threshold 3"));
    driver.eval_end(9.5);
    requests = driver.take();
    ASSERT_THAT(requests, SizeIs(1));
    EXPECT_THAT(requests[0].reason, HasSubstr("is above the divergence threshold 9"));
    driver.eval_end(kNaN);
    requests = driver.take();
    ASSERT_THAT(requests, SizeIs(1));
    EXPECT_THAT(requests[0].reason, HasSubstr("lm loss validation is nan"));
  }
  {  // check_finite off: NaN is just not an improvement
    EarlyStoppingOptions options;
    options.check_finite = false;
    options.patience = 2;
    auto early = std::make_shared<EarlyStopping>(options);
    Driver driver(early);
    driver.eval_end(4.0);
    driver.eval_end(kNaN);
    EXPECT_THAT(driver.take(), IsEmpty());
    EXPECT_EQ(early->best(), 4.0);
    EXPECT_EQ(early->wait(), 1);
  }
}

// The validation after training (after on_train_end) is not checked: a stop already taken would be asked for, and
// logged, a second time.
TEST(EarlyStopping, TheValidationAfterTrainingDoesNotAskAgain) {
  EarlyStoppingOptions options;
  options.patience = 1;
  Driver driver(std::make_shared<EarlyStopping>(options));
  driver.fire(Event::kTrainStart);
  driver.eval_end(5.0);
  driver.eval_end(5.0);
  EXPECT_THAT(driver.take(), SizeIs(1));
  driver.fire(Event::kTrainEnd);
  driver.eval_end(5.0);
  EXPECT_THAT(driver.take(), IsEmpty());
  driver.fire(Event::kTrainStart);  // a next run checks again
  driver.eval_end(5.0);
  EXPECT_THAT(driver.take(), SizeIs(1));
}

TEST(EarlyStopping, StateCarriesTheWaitIntoAResumedRun) {
  EarlyStoppingOptions options;
  options.patience = 3;
  auto before = std::make_shared<EarlyStopping>(options);
  Driver first(before);
  for (const double loss : {4.0, 4.5, 4.6}) first.eval_end(loss);
  EXPECT_EQ(before->wait(), 2);
  const StateDict saved = before->state_dict();
  EXPECT_EQ(before->state_key(), "EarlyStopping{monitor=lm loss validation, mode=min}");

  auto after = std::make_shared<EarlyStopping>(options);
  after->load_state_dict(saved);
  Driver resumed(after);
  resumed.eval_end(4.7);  // the third check without improvement, counting the saved two
  EXPECT_THAT(resumed.take(), SizeIs(1));
  EXPECT_EQ(after->best(), 4.0);
}

TEST(EarlyStopping, OptionErrorsNameTheOption) {
  EarlyStoppingOptions options;
  options.patience = 0;
  EXPECT_THAT(what_of([&] { EarlyStopping{options}; }), HasSubstr("EarlyStopping.patience is 0"));
  options = {};
  options.min_delta = -1.0;
  EXPECT_THAT(what_of([&] { EarlyStopping{options}; }), HasSubstr("EarlyStopping.min_delta is -1"));
  options = {};
  options.mode = "lowest";
  EXPECT_THAT(what_of([&] { EarlyStopping{options}; }), HasSubstr("EarlyStopping.mode is 'lowest'"));
}

// --- ThresholdStopper --------------------------------------------------------------------------------------------

TEST(ThresholdStopper, StopsOnceTheMetricPassesTheThreshold) {
  ThresholdStopperOptions options;
  options.threshold = 3.0;
  Driver below(std::make_shared<ThresholdStopper>(options));
  below.eval_end(3.0);
  EXPECT_THAT(below.take(), IsEmpty());
  below.eval_end(2.99);
  const auto requests = below.take();
  ASSERT_THAT(requests, SizeIs(1));
  EXPECT_EQ(requests[0].action, ControlAction::kStop);
  EXPECT_THAT(requests[0].reason, HasSubstr("lm loss validation = 2.99 is below the threshold 3"));
  below.fire(Event::kTrainEnd);
  below.eval_end(2.5);  // the validation after training: nothing left to stop, nothing asked
  EXPECT_THAT(below.take(), IsEmpty());

  options.monitor = "throughput/tokens_per_sec";
  options.mode = "max";
  options.threshold = 1000.0;
  Driver above(std::make_shared<ThresholdStopper>(options));
  above.log({{"throughput/tokens_per_sec", 900.0}});
  EXPECT_THAT(above.take(), IsEmpty());
  above.log({{"throughput/tokens_per_sec", 1200.0}});
  EXPECT_THAT(above.take(), SizeIs(1));
  options.threshold = std::numeric_limits<double>::infinity();
  EXPECT_THAT(what_of([&] { ThresholdStopper{options}; }), HasSubstr("ThresholdStopper.threshold is inf"));
  options.threshold.reset();
  EXPECT_THAT(what_of([&] { ThresholdStopper{options}; }), HasSubstr("ThresholdStopper.threshold is not set"));
}

// --- DivergenceDetector ------------------------------------------------------------------------------------------

TEST(DivergenceDetector, ASpikeAgainstTheWindowStopsWithTheRatioInTheReason) {
  DivergenceDetectorOptions options;
  options.window = 4;
  options.warmup = 3;
  auto detector = std::make_shared<DivergenceDetector>(options);
  Driver driver(detector);
  // Before warmup even a large jump is taken into the window.
  for (const double loss : {8.0, 4.0, 4.0, 4.0, 4.0}) driver.log({{"lm loss", loss}});
  EXPECT_THAT(driver.take(), IsEmpty());
  const LogRecord record = driver.log({{"lm loss", 7.9}});  // window {4, 4, 4, 4}: below 2x the mean
  EXPECT_THAT(driver.take(), IsEmpty());
  EXPECT_DOUBLE_EQ(record.metrics.at("divergence/window_mean"), (4.0 * 3 + 7.9) / 4);
  driver.state().train_state.step = 60;
  driver.log({{"lm loss", 20.0}});
  const auto requests = driver.take();
  ASSERT_THAT(requests, SizeIs(1));
  EXPECT_EQ(requests[0].action, ControlAction::kStop);
  EXPECT_THAT(requests[0].reason, HasSubstr("diverged: lm loss = 20 at step 60 is 4.0"));
  EXPECT_THAT(requests[0].reason, HasSubstr("the mean 4.975 of the last 4 values"));
  EXPECT_EQ(detector->spikes(), 1);
}

TEST(DivergenceDetector, NonFiniteActsAtOnceAbortAndPatience) {
  DivergenceDetectorOptions options;
  options.action = "abort";
  options.patience = 2;
  Driver driver(std::make_shared<DivergenceDetector>(options));
  driver.log({{"lm loss", std::numeric_limits<double>::infinity()}});  // before warmup, and one of two: at once
  auto requests = driver.take();
  ASSERT_THAT(requests, SizeIs(1));
  EXPECT_EQ(requests[0].action, ControlAction::kAbort);
  EXPECT_THAT(requests[0].reason, HasSubstr("lm loss is inf at step 0"));

  options.warmup = 2;
  options.window = 2;
  Driver patient(std::make_shared<DivergenceDetector>(options));
  for (const double loss : {3.0, 3.0, 9.0}) patient.log({{"lm loss", loss}});
  EXPECT_THAT(patient.take(), IsEmpty());  // one spike of the two
  patient.log({{"lm loss", 3.0}});         // back to normal: the count restarts
  patient.log({{"lm loss", 9.0}});
  EXPECT_THAT(patient.take(), IsEmpty());
  patient.log({{"lm loss", 9.5}});  // the second in a row, still against the window before the spikes
  EXPECT_THAT(patient.take(), SizeIs(1));
}

TEST(DivergenceDetector, SkipCountsTheSpikeAndKeepsItOutOfTheWindow) {
  DivergenceDetectorOptions options;
  options.action = "skip";
  options.window = 3;
  options.warmup = 3;
  options.absolute_threshold = 1.0;  // also a spike: more than 1 above the mean
  auto detector = std::make_shared<DivergenceDetector>(options);
  Driver driver(detector);
  for (const double loss : {3.0, 3.0, 3.0}) driver.log({{"lm loss", loss}});
  LogRecord record = driver.log({{"lm loss", 4.5}});  // below 2x, but 1.5 above the mean
  EXPECT_THAT(driver.take(), IsEmpty());
  EXPECT_EQ(detector->spikes(), 1);
  EXPECT_EQ(record.metrics.at("divergence/spikes"), 1.0);
  EXPECT_EQ(record.metrics.at("divergence/window_mean"), 3.0);  // the spike stayed out

  // The window and counts survive a checkpoint.
  auto restored = std::make_shared<DivergenceDetector>(options);
  restored->load_state_dict(detector->state_dict());
  Driver resumed(restored);
  record = resumed.log({{"lm loss", 3.0}});
  EXPECT_EQ(restored->spikes(), 1);
  EXPECT_EQ(record.metrics.at("divergence/window_mean"), 3.0);
}

TEST(DivergenceDetector, OptionErrorsNameTheOption) {
  DivergenceDetectorOptions options;
  options.action = "halt";
  EXPECT_THAT(what_of([&] { DivergenceDetector{options}; }), HasSubstr("DivergenceDetector.action is 'halt'"));
  options = {};
  options.spike_factor = 1.0;
  EXPECT_THAT(what_of([&] { DivergenceDetector{options}; }), HasSubstr("DivergenceDetector.spike_factor is 1"));
  options = {};
  options.warmup = 30;
  EXPECT_THAT(what_of([&] { DivergenceDetector{options}; }), HasSubstr("DivergenceDetector.warmup is 30"));
}

// --- LearningRateMonitor -----------------------------------------------------------------------------------------

TEST(LearningRateMonitor, LogsEveryParameterGroupUnderLightningsNames) {
  LearningRateMonitorOptions options;
  options.log_momentum = true;
  options.log_weight_decay = true;
  Driver driver(std::make_shared<LearningRateMonitor>(options));
  torch::nn::Linear linear(2, 2);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{linear->weight},
                      std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(0.1).weight_decay(0.01)));
  groups.emplace_back(std::vector<torch::Tensor>{linear->bias},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(0.05).weight_decay(0.0).betas({0.8, 0.95})));
  driver.set_optimizer(std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(1.0)));
  const LogRecord record = driver.log({});
  EXPECT_DOUBLE_EQ(record.metrics.at("lr-AdamW/pg0"), 0.1);
  EXPECT_DOUBLE_EQ(record.metrics.at("lr-AdamW/pg1"), 0.05);
  EXPECT_DOUBLE_EQ(record.metrics.at("weight_decay-AdamW/pg0"), 0.01);
  EXPECT_DOUBLE_EQ(record.metrics.at("weight_decay-AdamW/pg1"), 0.0);
  EXPECT_DOUBLE_EQ(record.metrics.at("momentum-AdamW/pg0"), 0.9);
  EXPECT_DOUBLE_EQ(record.metrics.at("momentum-AdamW/pg1"), 0.8);
}

// --- ExpertLoadMonitor -------------------------------------------------------------------------------------------

// The busiest expert over the mean per MoE layer, the dropped tokens, the worst layer and the total; with
// moe_per_layer_logging each layer's auxiliary losses. A dense layer (empty counts) and a dense model log nothing.
TEST(ExpertLoadMonitor, LogsEachMoeLayersImbalanceAndDroppedTokens) {
  Driver driver(std::make_shared<ExpertLoadMonitor>());
  EXPECT_TRUE(driver.log({}).metrics.empty());
  auto report = std::make_shared<models::moe::MoEReport>();
  report->tokens_per_expert = {{10, 30, 20, 20}, {}, {20, 20, 20, 20}};
  report->dropped_tokens = {4, 0, 1};
  report->per_layer["load_balancing_loss"] = {1.25, 0.0, 1.0};
  driver.state().moe_report = report;
  LogRecord record = driver.log({});
  EXPECT_DOUBLE_EQ(record.metrics.at("moe/expert_load_imbalance_layer_0"), 1.5);
  EXPECT_DOUBLE_EQ(record.metrics.at("moe/expert_load_imbalance_layer_2"), 1.0);
  EXPECT_EQ(record.metrics.count("moe/expert_load_imbalance_layer_1"), 0u);
  EXPECT_DOUBLE_EQ(record.metrics.at("moe/dropped_tokens_layer_0"), 4.0);
  EXPECT_DOUBLE_EQ(record.metrics.at("moe/expert_load_imbalance"), 1.5);
  EXPECT_DOUBLE_EQ(record.metrics.at("moe/dropped_tokens"), 5.0);
  EXPECT_EQ(record.metrics.count("moe/load_balancing_loss_layer_0"), 0u);
  driver.config().model.moe_per_layer_logging = true;
  record = driver.log({});
  EXPECT_DOUBLE_EQ(record.metrics.at("moe/load_balancing_loss_layer_0"), 1.25);
  EXPECT_EQ(record.metrics.count("moe/load_balancing_loss_layer_1"), 0u);
}

// --- SpeedMonitor ------------------------------------------------------------------------------------------------

TEST(SpeedMonitor, RatesFlopsAndMfuFollowFromTheStepTimes) {
  SpeedMonitorOptions options;
  options.window_size = 3;     // 4 timestamps
  options.peak_tflops = 2e-6;  // a made-up device, so that the MFU of a tiny model is a visible number
  auto monitor = std::make_shared<SpeedMonitor>(options);
  Driver driver(monitor);
  ConfigContainer& config = driver.config();
  config.model.num_layers = 2;
  config.model.hidden_size = 32;
  config.model.num_attention_heads = 4;
  config.model.vocab_size = 128;
  config.model.seq_length = 16;
  config.train.global_batch_size = 8;
  driver.fire(Event::kTrainStart);
  EXPECT_EQ(monitor->peak_tflops(), 2e-6);
  driver.step();
  EXPECT_THAT(driver.log({}).metrics, IsEmpty());  // one timestamp is no rate
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    driver.step();
  }
  const LogRecord record = driver.log({});
  const auto& m = record.metrics;
  const double steps_per_second = m.at("throughput/batches_per_sec");
  EXPECT_GT(steps_per_second, 0.0);
  EXPECT_LT(steps_per_second, 1.0 / 0.019);  // at least 20 ms per step
  EXPECT_DOUBLE_EQ(m.at("throughput/samples_per_sec"), steps_per_second * 8);
  EXPECT_DOUBLE_EQ(m.at("throughput/tokens_per_sec"), steps_per_second * 8 * 16);
  const double flops = utils::num_floating_point_operations(config.model, 8, 1);
  EXPECT_DOUBLE_EQ(m.at("throughput/device/tflops_per_sec"), flops * steps_per_second / 1e12);
  EXPECT_DOUBLE_EQ(m.at("throughput/device/mfu"), m.at("throughput/device/tflops_per_sec") / 2e-6);
  ASSERT_THAT(record.text, SizeIs(2));
  EXPECT_THAT(record.text[0], HasSubstr("tokens/s: "));
  EXPECT_THAT(record.text[1], HasSubstr("MFU: "));

  // Time in evaluation is left out of the window.
  driver.fire(Event::kEvalStart);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  driver.fire(Event::kEvalEnd, [](CallbackContext& ctx) { ctx.total_loss_dict = LossDict{}; });
  driver.step();
  EXPECT_GT(driver.log({}).metrics.at("throughput/batches_per_sec"), 1.0 / 0.25);

  EXPECT_EQ(known_peak_tflops("NVIDIA H100 80GB HBM3"), 989.0);
  EXPECT_EQ(known_peak_tflops("NVIDIA H100 PCIe"), 756.0);
  EXPECT_EQ(known_peak_tflops("NVIDIA A100-SXM4-80GB"), 312.0);
  EXPECT_EQ(known_peak_tflops("Some CPU"), std::nullopt);
  options.window_size = 0;
  EXPECT_THAT(what_of([&] { SpeedMonitor{options}; }), HasSubstr("SpeedMonitor.window_size is 0"));
}

// --- RuntimeEstimator --------------------------------------------------------------------------------------------

TEST(RuntimeEstimator, ExtrapolatesTheStepTimeAndLeavesEvaluationOut) {
  RuntimeEstimatorOptions options;
  options.skip_steps = 1;
  options.time_unit = "seconds";
  auto estimator = std::make_shared<RuntimeEstimator>(options);
  Driver driver(estimator);
  driver.config().train.train_iters = 20;
  driver.fire(Event::kTrainStart);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a slow first step, skipped
  driver.step();
  EXPECT_THAT(driver.log({}).metrics, IsEmpty());  // no counted step yet
  for (int i = 0; i < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    driver.step();
    if (i == 1) {  // an evaluation inside the clock's span: not step time (eval_interval 0: none ahead)
      driver.fire(Event::kEvalStart);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      driver.fire(Event::kEvalEnd, [](CallbackContext& ctx) { ctx.total_loss_dict = LossDict{}; });
    }
  }
  const LogRecord record = driver.log({});
  const double remaining = record.metrics.at("time/remaining_estimate");
  // 15 steps left at about 20 ms; with the skipped step or the evaluation counted it would be at least 0.75 s more.
  EXPECT_GT(remaining, 15 * 0.019);
  EXPECT_LT(remaining, 15 * 0.019 + 0.7);
  // The line's ETA (and ControlEndpoint's), in seconds: one ETA on the line, this estimator's.
  EXPECT_THAT(record.text, IsEmpty());
  ASSERT_TRUE(record.eta_seconds.has_value());
  EXPECT_DOUBLE_EQ(*record.eta_seconds, remaining);

  options.time_unit = "fortnights";
  EXPECT_THAT(what_of([&] { RuntimeEstimator{options}; }), HasSubstr("RuntimeEstimator.time_unit is 'fortnights'"));
}

// --- TimeLimit ---------------------------------------------------------------------------------------------------

TEST(TimeLimit, AsksToSaveAndStopWhileTheNextStepStillFits) {
  TimeLimitOptions options;
  options.duration = std::chrono::milliseconds(400);
  options.reserve = std::chrono::milliseconds(100);
  auto limit = std::make_shared<TimeLimit>(options);
  Driver driver(limit);
  std::vector<ControlRequest> requests;
  // The budget less the reserve is 300 ms. After each step the callback asks when the elapsed time plus the longest
  // step would pass it; the test measures the same steps (around the same events) to check that rule.
  double longest = 0.0, elapsed = 0.0, before = 0.0, longest_before = 0.0;
  while (requests.empty() && elapsed < 2.0) {
    before = elapsed;
    longest_before = longest;
    const auto start = std::chrono::steady_clock::now();
    driver.fire(Event::kTrainStepStart);
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    driver.fire(Event::kTrainStepEnd);
    longest = std::max(longest, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    elapsed = limit->elapsed_seconds();
    requests = driver.take();
  }
  constexpr double kSlack = 0.005;  // the callback's clock reads differ from the test's by microseconds
  EXPECT_GT(elapsed + longest, 0.3 - kSlack) << "asked too early";
  EXPECT_LE(before + longest_before, 0.3 + kSlack) << "should have asked a step earlier";
  ASSERT_THAT(requests, SizeIs(2));
  EXPECT_EQ(requests[0].action, ControlAction::kSave);
  EXPECT_EQ(requests[1].action, ControlAction::kStop);
  EXPECT_THAT(requests[1].reason, HasSubstr("of the 0:00:00 time limit used (0:00:00 reserved)"));
  driver.fire(Event::kTrainStepStart);
  driver.fire(Event::kTrainStepEnd);
  EXPECT_THAT(driver.take(), IsEmpty());  // asked once

  options.reserve = options.duration;
  EXPECT_THAT(what_of([&] { TimeLimit{options}; }), HasSubstr("TimeLimit.reserve is 400 ms"));
  options.duration = std::chrono::milliseconds(0);
  EXPECT_THAT(what_of([&] { TimeLimit{options}; }), HasSubstr("TimeLimit.duration is 0 ms"));
}

// --- MemoryMonitor -----------------------------------------------------------------------------------------------

TEST(MemoryMonitor, ReportsThisProcessAsTheMaxAndMinOfAWorldOfOne) {
  Driver driver(std::make_shared<MemoryMonitor>());
  // 64 MiB where report_memory looks: the CUDA allocator on a GPU machine, the resident set otherwise.
  const torch::Tensor ballast =
      torch::ones({64, 1024, 1024},
                  torch::TensorOptions(torch::kByte).device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU));
  const LogRecord record = driver.log({});
  const std::string key =
      torch::cuda::is_available() ? "memory/mem-max-allocated-gigabytes" : "memory/mem-max-resident-gigabytes";
  ASSERT_EQ(record.metrics.count(key), 1u) << "metrics: " << record.metrics.size();
  EXPECT_GT(record.metrics.at(key), 0.06);
  EXPECT_EQ(record.metrics.at(key), record.metrics.at(key + "/min"));
  ASSERT_THAT(record.text, SizeIs(1));
  EXPECT_THAT(record.text[0], HasSubstr("peak mem: "));
  EXPECT_EQ(ballast.sum().item<int64_t>(), 64 << 20);
}

// --- ProgressBar -------------------------------------------------------------------------------------------------

std::string read_all(std::FILE* file) {
  std::rewind(file);
  std::string text;
  char buffer[4096];
  while (const std::size_t n = std::fread(buffer, 1, sizeof(buffer), file)) text.append(buffer, n);
  return text;
}

TEST(ProgressBar, PlainLinesOffATerminal) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  ProgressBarOptions options;
  options.stream = file;
  options.terminal = false;
  options.line_seconds = 0.0;  // a line per step
  options.width = 10;
  auto bar = std::make_shared<ProgressBar>(options);
  Driver driver(bar);
  driver.config().train.train_iters = 4;
  driver.config().train.global_batch_size = 2;
  driver.config().model.seq_length = 8;
  driver.fire(Event::kTrainStart);
  driver.step();
  driver.log({{"lm loss", 5.5}});
  driver.step();
  driver.fire(Event::kTrainEnd);
  const std::string text = read_all(file);
  std::fclose(file);
  EXPECT_THAT(text, HasSubstr("step 1/4 [##--------]  25%"));
  EXPECT_THAT(text, HasSubstr("step 2/4 [#####-----]  50% | loss 5.5000 | "));
  EXPECT_THAT(text, HasSubstr(" tokens/s | ETA 0:00:00"));
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 3);  // two steps and the end
}

TEST(ProgressBar, RedrawsInPlaceOnATerminalAndClearsBeforeTheLogLine) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  ProgressBarOptions options;
  options.stream = file;
  options.terminal = true;
  options.refresh_seconds = 0.0;
  auto bar = std::make_shared<ProgressBar>(options);
  Driver driver(bar);
  driver.config().train.train_iters = 3;
  driver.fire(Event::kTrainStart);
  driver.step();
  driver.log({});
  driver.step();
  driver.fire(Event::kTrainEnd);
  const std::string text = read_all(file);
  std::fclose(file);
  // Drawn after step 1, cleared for the log line, drawn after step 2, and drawn for good at the end.
  EXPECT_EQ(text.find("\r\033[Kstep 1/3"), 0u) << text;
  EXPECT_THAT(text, HasSubstr("\r\033[K\r\033[Kstep 2/3"));
  EXPECT_THAT(text, HasSubstr("\r\033[Kstep 2/3"));
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1);
}

// --- Friction an outside user hit (issue 15, part 9) ---------------------------------------------------------------

TEST(CallbackFriction, AnIntegerStoredAsIntAndReadAsInt64SaysHowToWriteIt) {
  UserState state;
  state.set("n", 1);
  const std::string message = what_of([&] { state.get<int64_t>("n"); });
  EXPECT_THAT(message, HasSubstr("user_state['n'] holds a value of type int, not int64_t"));
  EXPECT_THAT(message, HasSubstr("get<int>(\"n\")"));
  EXPECT_THAT(message, HasSubstr("set(\"n\", int64_t{...})"));
  state.set("lr", 1e-3);
  EXPECT_THAT(what_of([&] { state.get<float>("lr"); }), HasSubstr("holds a value of type double, not float"));
}

TEST(CallbackFriction, NormalizeCallbacksOfAnEmptyBraceListIsAnEmptyManager) {
  const std::shared_ptr<CallbackManager> manager = normalize_callbacks({});
  ASSERT_NE(manager, nullptr);
  for (const Event event : all_events()) EXPECT_FALSE(manager->has_callbacks(event));
  EXPECT_TRUE(normalize_callbacks({std::make_shared<EarlyStopping>()})->has_callbacks(Event::kEvalEnd));
}

class MyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

TEST(CallbackFriction, TheCallbacksOwnExceptionIsCaughtByTypeWithTheDocumentedIdiom) {
  CallbackManager manager;
  manager.register_callback(
      Event::kTrainStart, [](CallbackContext&) { throw MyError("mine"); }, "thrower");
  GlobalState state;
  ModelChunks model;
  CallbackContext ctx(state, model, manager.user_state());
  std::string caught;
  try {
    manager.fire(Event::kTrainStart, ctx);
  } catch (const CallbackError& e) {
    EXPECT_THAT(e.what(), HasSubstr("thrower"));
    try {
      std::rethrow_if_nested(e);
    } catch (const MyError& mine) {
      caught = mine.what();
    }
  }
  EXPECT_EQ(caught, "mine");
}

TEST(CallbackFriction, TheGptIsReachedWithoutACast) {
  // A world of one, for the GPT's parallel layers; released at the end so the other tests see none.
  parallel::init_distributed(parallel::LaunchEnv{}, {});
  parallel::initialize_model_parallel(1, 1);
  struct Release {
    ~Release() {
      parallel::destroy_model_parallel();
      parallel::destroy_distributed();
    }
  } release;
  GlobalState state;
  models::GPTConfig config;
  config.num_layers = 1;
  config.hidden_size = 8;
  config.num_attention_heads = 2;
  config.vocab_size = 16;
  config.seq_length = 4;
  models::GPTChunkOptions whole;  // one chunk with every layer, as a pipeline of one builds it
  whole.num_layers = config.num_layers;
  ModelChunks model{models::GPTModel(config, whole).ptr(), torch::nn::Linear(2, 2).ptr()};
  CallbackContext ctx(state, model);
  EXPECT_EQ(ctx.gpt().config().hidden_size, 8);
  EXPECT_THAT(what_of([&] { ctx.gpt(1); }), HasSubstr("ctx.gpt(1): the chunk is torch::nn::LinearImpl, not a GPT"));
  EXPECT_THAT(what_of([&] { ctx.gpt(2); }), HasSubstr("this rank holds 2 model chunk(s)"));
}

}  // namespace
}  // namespace bridge::training
