// Async observers: read-only callbacks that run on a worker thread of their own, so that a slow one (an upload, a
// notification) never slows the training loop (InstructLab's design, with a bound).
//
//   ObserverOptions options;
//   options.name = "dashboard";
//   manager->register_observer(Event::kLog, [](const EventSnapshot& event) {
//     post_to_dashboard(event.step, event.metrics);  // on the observer's thread
//   }, options);
//
// At each firing the loop's thread copies what the event carries into an EventSnapshot (numbers, not live tensors)
// and queues it; the observer's thread calls the function in order. The queue is bounded: when it is full the oldest
// snapshot is dropped and counted. An exception in the function is logged with the observer's name and counted,
// never thrown into the loop. pretrain() flushes every observer after on_train_end (and when training fails);
// destroying the manager stops them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "training/callbacks/event.h"

namespace bridge::training {
inline namespace callbacks {

class CallbackContext;

/// What an observer receives: a copy of the event, safe to read on another thread.
struct EventSnapshot {
  Event event = Event::kTrainStart;
  std::int64_t step = 0;  ///< the step as the log numbers it (ctx.iteration()): 1 at the first step's events
  std::int64_t consumed_train_samples = 0;
  /// loss_dict at on_train_step_end (read with .item(): a device sync per step; observe on_log to avoid it), or
  /// total_loss_dict at on_eval_end / on_test_end; empty elsewhere and off the last pipeline stage.
  std::map<std::string, double> losses;
  std::map<std::string, double> metrics;  ///< on_log: the record the metric writers get
  std::map<std::string, double> timers;   ///< on_log: ctx.timers (seconds per iteration by Megatron's timer names)
  std::optional<double> grad_norm;
  std::optional<std::string> checkpoint_path;  ///< on_checkpoint_save / on_checkpoint_load
  std::chrono::system_clock::time_point time;  ///< when the event fired
};

/// The snapshot of `ctx` at `event`.
EventSnapshot snapshot_of(Event event, const CallbackContext& ctx);

using ObserverFn = std::function<void(const EventSnapshot&)>;

struct ObserverOptions {
  std::string name;                  ///< in logs and observer_stats(); default "observer#<n>"
  std::size_t queue_capacity = 256;  ///< snapshots waiting; when full, the oldest is dropped
};

/// An observer's counts so far.
struct ObserverStats {
  std::string name;
  std::uint64_t delivered = 0;  ///< snapshots its function returned from
  std::uint64_t failed = 0;     ///< snapshots its function threw on (logged)
  std::uint64_t dropped = 0;    ///< snapshots dropped because the queue was full
};

/// One observer: its queue and worker thread (CallbackManager::register_observer makes these).
class AsyncObserver {
 public:
  AsyncObserver(std::string name, ObserverFn fn, std::size_t queue_capacity);
  /// Stops the worker after the snapshot in hand; what is still queued is dropped (and counted).
  ~AsyncObserver();
  AsyncObserver(const AsyncObserver&) = delete;
  AsyncObserver& operator=(const AsyncObserver&) = delete;

  /// Queues `snapshot` (the loop's thread); drops the oldest when full. Never blocks on the function.
  void push(EventSnapshot snapshot);
  /// Waits until every queued snapshot was handed to the function and it returned, up to `timeout`; false (with a
  /// warning naming the observer) when time ran out.
  bool flush(std::chrono::milliseconds timeout);
  ObserverStats stats() const;
  const std::string& name() const noexcept { return name_; }

 private:
  struct Impl;
  std::string name_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace callbacks
}  // namespace bridge::training
