// An example plugin: callbacks that bridge-pretrain loads from a recipe, built without rebuilding bridge.
//
//   callbacks:
//     - {type: Plugin, path: build/examples/plugin/libbridge_example_plugin.so, stop_at_step: 3, message: hello}
//
// It registers one callback on every rank: it prints `message` with the step and loss at each log step on the rank
// that holds the losses, and asks to stop after step `stop_at_step` (0: never). Build it as a shared library with
// bridge's headers and LibTorch, but not bridge's libraries: their symbols come from the program that loads it
// (examples/CMakeLists.txt shows the target).
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "training/callbacks/callback.h"
#include "training/callbacks/plugin.h"

namespace {

using namespace bridge::training;

class Greeter : public Callback {
 public:
  Greeter(std::string message, std::int64_t stop_at_step, int rank)
      : message_(std::move(message)), stop_at_step_(stop_at_step), rank_(rank) {}

  std::string name() const override { return "example_plugin"; }

  void on_log(CallbackContext& ctx) override {
    const auto loss = ctx.log->metrics.find("lm loss");
    if (loss == ctx.log->metrics.end()) return;  // not the rank with the losses
    std::printf("example plugin (rank %d): %s at step %lld, lm loss %.4f\n", rank_, message_.c_str(),
                static_cast<long long>(ctx.state.train_state.step), loss->second);
    std::fflush(stdout);
  }

  void on_train_step_end(CallbackContext& ctx) override {
    if (stop_at_step_ > 0 && ctx.state.train_state.step + 1 == stop_at_step_) {
      ctx.request_stop("the example plugin's stop_at_step is " + std::to_string(stop_at_step_));
    }
  }

 private:
  std::string message_;
  std::int64_t stop_at_step_;
  int rank_;
};

}  // namespace

BRIDGE_PLUGIN_ABI_EXPORT()

extern "C" __attribute__((visibility("default"))) void bridge_register_callbacks(CallbackManager& manager,
                                                                                 const PluginOptions& options) {
  manager.add(std::make_shared<Greeter>(options.get_string("message", "hello from a plugin"),
                                        options.get_int("stop_at_step", 0), options.rank));
}
