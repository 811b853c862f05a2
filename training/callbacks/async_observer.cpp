// AsyncObserver: a moodycamel::BlockingConcurrentQueue with one producer (the loop) and one consumer (the worker),
// bounded by a counter: the producer drops the oldest snapshot itself when the count reaches the capacity.
#include "training/callbacks/async_observer.h"

#include <concurrentqueue/blockingconcurrentqueue.h>

#include <atomic>
#include <thread>

#include "training/callbacks/callback_context.h"
#include "utils/exception_message.h"
#include "utils/logging.h"

namespace bridge::training {
inline namespace callbacks {

EventSnapshot snapshot_of(Event event, const CallbackContext& ctx) {
  EventSnapshot snapshot;
  snapshot.event = event;
  snapshot.step = iteration_at(event, ctx.state.train_state.step);  // as the log numbers it
  snapshot.consumed_train_samples = ctx.state.train_state.consumed_train_samples;
  snapshot.time = std::chrono::system_clock::now();
  const auto numbers = [](const LossDict& losses, std::map<std::string, double>& out) {
    for (const auto& [name, value] : losses) out[name] = value.item<double>();
  };
  if (ctx.loss_dict.has_value()) numbers(*ctx.loss_dict, snapshot.losses);
  if (ctx.total_loss_dict.has_value()) numbers(*ctx.total_loss_dict, snapshot.losses);
  if (ctx.log.has_value()) snapshot.metrics = ctx.log->metrics;
  if (ctx.timers.has_value()) snapshot.timers = *ctx.timers;
  if (ctx.grad_norm.has_value()) snapshot.grad_norm = *ctx.grad_norm;
  if (ctx.checkpoint.has_value()) snapshot.checkpoint_path = ctx.checkpoint->path;
  return snapshot;
}

struct AsyncObserver::Impl {
  ObserverFn fn;
  std::size_t capacity = 0;
  moodycamel::BlockingConcurrentQueue<EventSnapshot> queue;
  std::atomic<std::size_t> queued{0};  // in the queue, or taken by the worker and not yet done
  std::atomic<bool> stopping{false};
  std::atomic<std::uint64_t> delivered{0}, failed{0}, dropped{0};
  std::thread worker;
};

AsyncObserver::AsyncObserver(std::string name, ObserverFn fn, std::size_t queue_capacity)
    : name_(std::move(name)), impl_(std::make_unique<Impl>()) {
  if (!fn) throw std::invalid_argument("register_observer('" + name_ + "'): the function is empty; pass a callable");
  if (queue_capacity < 1) {
    throw std::invalid_argument("register_observer('" + name_ +
                                "'): ObserverOptions.queue_capacity is 0; use 1 or more");
  }
  impl_->fn = std::move(fn);
  impl_->capacity = queue_capacity;
  impl_->worker = std::thread([impl = impl_.get(), name = name_] {
    EventSnapshot snapshot;
    while (!impl->stopping.load()) {
      if (!impl->queue.wait_dequeue_timed(snapshot, std::chrono::milliseconds(50))) continue;
      try {
        impl->fn(snapshot);
        ++impl->delivered;
      } catch (...) {
        ++impl->failed;
        bridge::utils::logger().error("observer '{}' failed on {} at step {}: {}", name, to_string(snapshot.event),
                                      snapshot.step, bridge::utils::exception_message(std::current_exception()));
      }
      --impl->queued;
    }
  });
}

AsyncObserver::~AsyncObserver() {
  impl_->stopping.store(true);
  impl_->worker.join();
  EventSnapshot left;
  std::uint64_t dropped = 0;
  while (impl_->queue.try_dequeue(left)) ++dropped;
  if (dropped > 0) {
    bridge::utils::logger().warn("observer '{}' stopped with {} snapshot(s) it never saw (flush before the end)", name_,
                                 dropped);
  }
}

void AsyncObserver::push(EventSnapshot snapshot) {
  // Only this thread adds, so the count cannot pass the capacity between the check and the enqueue.
  if (impl_->queued.load() >= impl_->capacity) {
    EventSnapshot oldest;
    if (impl_->queue.try_dequeue(oldest)) {
      --impl_->queued;
      ++impl_->dropped;
    }
  }
  ++impl_->queued;
  impl_->queue.enqueue(std::move(snapshot));
}

bool AsyncObserver::flush(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (impl_->queued.load() > 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      bridge::utils::logger().warn("observer '{}' still has {} snapshot(s) after {} ms; going on without them", name_,
                                   impl_->queued.load(), timeout.count());
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

ObserverStats AsyncObserver::stats() const {
  return ObserverStats{name_, impl_->delivered.load(), impl_->failed.load(), impl_->dropped.load()};
}

}  // namespace callbacks
}  // namespace bridge::training
