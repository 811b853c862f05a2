// Error isolation (ErrorPolicy::isolate) and async observers (register_observer): an isolated callback's errors are
// logged and counted and it is disabled after its limit while the others run on; an observer sees snapshots in order
// on its own thread, never blocks the firing thread, drops the oldest when its queue is full, and its exceptions
// never reach the loop. The benchmark of an observer's cost on real steps is bench/observer_overhead_bench.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tests/unit/callback_test_support.h"
#include "training/callbacks.h"

namespace bridge::training {
namespace {

using testing::CallbackTest;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class Flaky : public Callback {
 public:
  void on_train_start(CallbackContext&) override {
    ++calls;
    throw std::runtime_error("start failed");
  }
  void on_train_end(CallbackContext&) override {
    ++calls;
    throw std::runtime_error("end failed");
  }
  int calls = 0;
};

TEST_F(CallbackTest, AnIsolatedCallbackIsCountedThenDisabledWhileTheOthersRun) {
  int failing = 0, after = 0;
  manager.register_callback(
      Event::kTrainStepEnd, [&](CallbackContext&) { ++failing, throw std::runtime_error("upload failed"); }, "uploader",
      RankFilter::kAll, ErrorPolicy::isolate(2));
  manager.register_callback(
      Event::kTrainStepEnd, [&](CallbackContext&) { ++after; }, "after");
  for (int i = 0; i < 4; ++i) EXPECT_NO_THROW(manager.fire(Event::kTrainStepEnd, ctx));
  EXPECT_EQ(failing, 2);  // disabled after its second failure
  EXPECT_EQ(after, 4);    // the callbacks after it ran every time
  const std::vector<IsolatedFailures> failures = manager.isolated_failures();
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].name, "uploader");
  EXPECT_EQ(failures[0].failures, 2);
  EXPECT_TRUE(failures[0].disabled);
}

TEST_F(CallbackTest, AnIsolatedClassCountsItsFailuresAcrossEvents) {
  auto flaky = std::make_shared<Flaky>();
  manager.add(flaky, RankFilter::kAll, ErrorPolicy::isolate(2));
  manager.fire(Event::kTrainStart, ctx);
  manager.fire(Event::kTrainEnd, ctx);
  manager.fire(Event::kTrainStart, ctx);
  EXPECT_EQ(flaky->calls, 2);
  EXPECT_TRUE(manager.isolated_failures().at(0).disabled);

  // The default still propagates, and a limit below 1 is refused.
  CallbackManager strict;
  strict.add(std::make_shared<Flaky>());
  CallbackContext strict_ctx(state, model, strict.user_state());
  EXPECT_THROW(strict.fire(Event::kTrainStart, strict_ctx), CallbackError);
  try {
    strict.add(std::make_shared<Flaky>(), RankFilter::kAll, ErrorPolicy::isolate(0));
    ADD_FAILURE() << "isolate(0) accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), HasSubstr("ErrorPolicy::isolate(0) for 'Flaky'"));
  }
}

// An observer whose function waits until the test lets it go: what the loop's thread does meanwhile is exact.
class Gate {
 public:
  void wait_open() {
    inside.store(true);
    while (!open.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void wait_inside() const {
    while (!inside.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::atomic<bool> inside{false}, open{false};
};

void fire_log(CallbackManager& manager, CallbackContext& ctx, GlobalState& state, int64_t step) {
  state.train_state.step = step;
  LogRecord record;
  record.metrics["lm loss"] = static_cast<double>(step) / 10;
  ctx.log = &record;
  manager.fire(Event::kLog, ctx);
  ctx.log.reset();
}

TEST_F(CallbackTest, AnObserverSeesSnapshotsInOrderOnItsOwnThread) {
  std::mutex mutex;
  std::vector<int64_t> steps;
  std::vector<double> losses;
  std::thread::id observer_thread;
  manager.register_observer(Event::kLog, [&](const EventSnapshot& snapshot) {
    std::lock_guard<std::mutex> lock(mutex);
    steps.push_back(snapshot.step);
    losses.push_back(snapshot.metrics.at("lm loss"));
    observer_thread = std::this_thread::get_id();
  });
  for (int64_t step = 1; step <= 5; ++step) fire_log(manager, ctx, state, step);
  ASSERT_TRUE(manager.flush_observers(std::chrono::seconds(10)));
  std::lock_guard<std::mutex> lock(mutex);
  EXPECT_THAT(steps, ElementsAre(1, 2, 3, 4, 5));
  EXPECT_THAT(losses, ElementsAre(0.1, 0.2, 0.3, 0.4, 0.5));
  EXPECT_NE(observer_thread, std::this_thread::get_id());
  const ObserverStats stats = manager.observer_stats().at(0);
  EXPECT_EQ(stats.name, "observer#1");
  EXPECT_EQ(stats.delivered, 5u);
  EXPECT_EQ(stats.dropped, 0u);
}

TEST_F(CallbackTest, ASlowObserverNeverBlocksTheLoopAndDropsTheOldest) {
  Gate gate;
  std::mutex mutex;
  std::vector<int64_t> seen;
  ObserverOptions options;
  options.name = "slow";
  options.queue_capacity = 3;
  manager.register_observer(
      Event::kLog,
      [&](const EventSnapshot& snapshot) {
        if (snapshot.step == 1) gate.wait_open();
        std::lock_guard<std::mutex> lock(mutex);
        seen.push_back(snapshot.step);
      },
      options);
  fire_log(manager, ctx, state, 1);
  gate.wait_inside();                                                              // the worker holds step 1 and waits
  for (int64_t step = 2; step <= 10; ++step) fire_log(manager, ctx, state, step);  // returns: nothing blocks
  EXPECT_FALSE(manager.flush_observers(std::chrono::milliseconds(50)));            // still held
  gate.open.store(true);
  ASSERT_TRUE(manager.flush_observers(std::chrono::seconds(10)));
  std::lock_guard<std::mutex> lock(mutex);
  // One in hand and two waiting: steps 2-8 were dropped, oldest first.
  EXPECT_THAT(seen, ElementsAre(1, 9, 10));
  const ObserverStats stats = manager.observer_stats().at(0);
  EXPECT_EQ(stats.delivered, 3u);
  EXPECT_EQ(stats.dropped, 7u);
}

TEST_F(CallbackTest, AnObserversExceptionIsCountedAndNeverReachesTheLoop) {
  manager.register_observer(Event::kTrainStepEnd, [](const EventSnapshot& snapshot) {
    if (snapshot.step == 2) throw std::runtime_error("dashboard unreachable");
  });
  std::vector<EventSnapshot> snapshots;
  std::mutex mutex;
  manager.register_observer(Event::kTrainStepEnd, [&](const EventSnapshot& snapshot) {
    std::lock_guard<std::mutex> lock(mutex);
    snapshots.push_back(snapshot);
  });
  for (int64_t step = 1; step <= 3; ++step) {
    state.train_state.step = step - 1;  // Megatron-Bridge's step in flight; the snapshot numbers it as the log does
    ctx.loss_dict = LossDict{{"lm loss", torch::tensor(2.5 * step, torch::kFloat)}};
    ctx.grad_norm = 0.5;
    EXPECT_NO_THROW(manager.fire(Event::kTrainStepEnd, ctx));
  }
  ASSERT_TRUE(manager.flush_observers());
  const std::vector<ObserverStats> stats = manager.observer_stats();
  EXPECT_EQ(stats[0].failed, 1u);
  EXPECT_EQ(stats[0].delivered, 2u);
  std::lock_guard<std::mutex> lock(mutex);
  ASSERT_EQ(snapshots.size(), 3u);
  EXPECT_EQ(snapshots[1].event, Event::kTrainStepEnd);
  EXPECT_EQ(snapshots[1].step, 2) << "the second step, as the log's iteration 2";
  EXPECT_EQ(snapshots[1].losses.at("lm loss"), 5.0);  // a number, not a tensor
  EXPECT_EQ(snapshots[1].grad_norm, 0.5);
  EXPECT_TRUE(snapshots[1].metrics.empty());
}

}  // namespace
}  // namespace bridge::training
