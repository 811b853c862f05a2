// Cost of callback dispatch: should_fire on an event nobody listens to, and fire() with 1 or 10 lambdas or class
// callbacks. Targets: an empty event <= 2 ns, <= 3 ns per callback. The baselines time the bare loops a hand-written
// trainer would use (a vector of std::function, a vector of virtual objects), so fire()'s overhead reads as a ratio.
#include <benchmark/benchmark.h>

#include <vector>

#include "bench/dispatch_targets.h"
#include "training/callbacks.h"

namespace bridge::bench {
namespace {

using training::CallbackContext;
using training::CallbackManager;
using training::Event;

struct Fixture {
  training::GlobalState state;
  training::ModelChunks model;
  CallbackManager manager;
  CallbackContext ctx{state, model, manager.user_state()};
  long counter = 0;
};

void per_callback_counter(benchmark::State& state, int callbacks) {
  state.counters["per_callback"] =
      benchmark::Counter(callbacks, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void BM_ShouldFireEmptyEvent(benchmark::State& state) {
  Fixture f;
  f.manager.register_callback(Event::kTrainStart, make_counting_function(f.counter));
  const CallbackManager* manager = &f.manager;
  for (auto _ : state) {
    benchmark::DoNotOptimize(manager);
    benchmark::DoNotOptimize(training::should_fire(manager, Event::kTrainStepEnd));
  }
}
BENCHMARK(BM_ShouldFireEmptyEvent);

void BM_FireEmptyEvent(benchmark::State& state) {
  Fixture f;
  for (auto _ : state) {
    f.manager.fire(Event::kTrainStepEnd, f.ctx);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_FireEmptyEvent);

void BM_FireLambdas(benchmark::State& state) {
  Fixture f;
  const int n = static_cast<int>(state.range(0));
  for (int i = 0; i < n; ++i) f.manager.register_callback(Event::kTrainStepEnd, make_counting_function(f.counter));
  for (auto _ : state) f.manager.fire(Event::kTrainStepEnd, f.ctx);
  if (f.counter != static_cast<long>(state.iterations()) * n) state.SkipWithError("callbacks did not all run");
  per_callback_counter(state, n);
}
BENCHMARK(BM_FireLambdas)->Arg(1)->Arg(10);

void BM_FireClassCallbacks(benchmark::State& state) {
  Fixture f;
  const int n = static_cast<int>(state.range(0));
  for (int i = 0; i < n; ++i) f.manager.add(make_counting_callback(f.counter));
  for (auto _ : state) f.manager.fire(Event::kTrainStepEnd, f.ctx);
  if (f.counter != static_cast<long>(state.iterations()) * n) state.SkipWithError("callbacks did not all run");
  per_callback_counter(state, n);
}
BENCHMARK(BM_FireClassCallbacks)->Arg(1)->Arg(10);

void BM_BaselineFunctionLoop(benchmark::State& state) {
  Fixture f;
  const int n = static_cast<int>(state.range(0));
  std::vector<training::CallbackFn> functions;
  for (int i = 0; i < n; ++i) functions.push_back(make_counting_function(f.counter));
  for (auto _ : state) {
    for (auto& fn : functions) fn(f.ctx);
  }
  per_callback_counter(state, n);
}
BENCHMARK(BM_BaselineFunctionLoop)->Arg(10);

void BM_BaselineVirtualLoop(benchmark::State& state) {
  Fixture f;
  const int n = static_cast<int>(state.range(0));
  std::vector<std::shared_ptr<training::Callback>> objects;
  for (int i = 0; i < n; ++i) objects.push_back(make_counting_callback(f.counter));
  for (auto _ : state) {
    for (auto& object : objects) object->on_train_step_end(f.ctx);
  }
  per_callback_counter(state, n);
}
BENCHMARK(BM_BaselineVirtualLoop)->Arg(10);

}  // namespace
}  // namespace bridge::bench

BENCHMARK_MAIN();
