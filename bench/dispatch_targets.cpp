// Out-of-line callback bodies for the dispatch benchmark.
#include "bench/dispatch_targets.h"

namespace bridge::bench {
namespace {

class CountingCallback : public training::Callback {
 public:
  explicit CountingCallback(long& counter) : counter_(counter) {}
  void on_train_step_end(training::CallbackContext&) override { ++counter_; }

 private:
  long& counter_;
};

}  // namespace

std::shared_ptr<training::Callback> make_counting_callback(long& counter) {
  return std::make_shared<CountingCallback>(counter);
}

training::CallbackFn make_counting_function(long& counter) {
  return [&counter](training::CallbackContext&) { ++counter; };
}

}  // namespace bridge::bench
