// LearningRateMonitor: each parameter group's learning rate (and optionally momentum and weight decay) in the log
// record at every log step, under Lightning's names: "lr-FusedAdamW/pg0", "lr-FusedAdamW/pg1", ... (the optimizer's
// class) ("momentum-..." is Adam's beta1 or SGD's momentum, "weight_decay-..."). The loop's own "learning-rate" is the
// scheduler's base rate; the groups show what each applies (a group without weight decay, a scaled group).
//
//   manager->add(std::make_shared<LearningRateMonitor>());
#pragma once

#include "training/callbacks/callback.h"

namespace bridge::training {
inline namespace callbacks {

struct LearningRateMonitorOptions {
  bool log_momentum = false;
  bool log_weight_decay = false;
};

class LearningRateMonitor : public Callback {
 public:
  explicit LearningRateMonitor(LearningRateMonitorOptions options = {}) : options_(options) {}

  void on_log(CallbackContext& ctx) override;

  const LearningRateMonitorOptions& options() const noexcept { return options_; }

 private:
  LearningRateMonitorOptions options_;
};

}  // namespace callbacks
}  // namespace bridge::training
