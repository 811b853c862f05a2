// MemoryMonitor: this rank's report, reduced to the max and min over the world in one all-reduce.
#include "training/callbacks/memory_monitor.h"

#include <vector>

#include "parallel/distributed.h"
#include "training/utils/train_utils.h"
#include "utils/logging.h"

namespace bridge::training {
inline namespace callbacks {

void MemoryMonitor::on_log(CallbackContext& ctx) {
  const utils::StatReport report = utils::report_memory();
  const auto n = static_cast<int64_t>(report.size());
  // [max..., -min...] under one MAX. The names are the same on every rank of a job (one device type).
  torch::Tensor values = torch::empty({2 * n}, torch::kDouble);
  double* data = values.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) {
    data[i] = utils::to_double(report[static_cast<std::size_t>(i)].second);
    data[n + i] = -data[i];
  }
  if (parallel::is_distributed_initialized()) parallel::get_world_group().all_reduce(values, parallel::ReduceOp::kMax);
  data = values.data_ptr<double>();
  auto& metrics = ctx.log->metrics;
  const std::string* peak = nullptr;
  for (int64_t i = 0; i < n; ++i) {
    const std::string& name = report[static_cast<std::size_t>(i)].first;
    metrics["memory/" + name] = data[i];
    metrics["memory/" + name + "/min"] = -data[n + i];
    if (peak == nullptr && name.find("max-") != std::string::npos && name.find("gigabytes") != std::string::npos) {
      peak = &name;
      ctx.log->text.push_back(fmt::format("peak mem: {:.3f} GB", data[i]));
    }
  }
}

}  // namespace callbacks
}  // namespace bridge::training
