// Proves that firing an event allocates nothing: this binary replaces the global operator new with a counting one.
// It is its own test binary because the replacement applies to everything linked into it.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>

#include "training/callbacks.h"

namespace {
std::atomic<long> g_allocations{0};
}  // namespace

void* operator new(std::size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace bridge::training {
namespace {

class Counter : public Callback {
 public:
  void on_train_step_end(CallbackContext& ctx) override { ctx.grad_norm = *ctx.grad_norm + 1.0; }
};

TEST(FireAllocations, FiringLambdasAndClassCallbacksAllocatesNothing) {
  GlobalState state;
  ModelChunks model;
  CallbackManager manager;
  for (int i = 0; i < 10; ++i) {
    manager.register_callback(Event::kTrainStepEnd, [](CallbackContext& ctx) { ctx.grad_norm = *ctx.grad_norm + 1.0; });
    manager.add(std::make_shared<Counter>());
  }
  CallbackContext ctx(state, model, manager.user_state());
  ctx.grad_norm = 0.0;
  manager.fire(Event::kTrainStepEnd, ctx);  // warm up

  const long before = g_allocations.load();
  for (int i = 0; i < 1000; ++i) {
    manager.fire(Event::kTrainStepEnd, ctx);
    manager.fire(Event::kEvalEnd, ctx);  // an event nobody listens to
  }
  const long after = g_allocations.load();
  EXPECT_EQ(after - before, 0) << "allocations on the fire path";
  EXPECT_DOUBLE_EQ(*ctx.grad_norm, 20.0 * 1001);  // every callback really ran
}

TEST(FireAllocations, CounterSeesAllocations) {
  const long before = g_allocations.load();
  void* p = ::operator new(16);  // an explicit call, which no compiler may elide
  const long after = g_allocations.load();
  ::operator delete(p);
  EXPECT_EQ(after - before, 1);  // the counting operator new is the one in use
}

}  // namespace
}  // namespace bridge::training
