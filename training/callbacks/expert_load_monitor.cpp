// ExpertLoadMonitor: per-layer expert imbalance and dropped tokens from the step's MoE report.
#include "training/callbacks/expert_load_monitor.h"

#include <algorithm>
#include <string>

#include "bridge/models/moe/moe_logging.h"
#include "training/config/config.h"

namespace bridge::training {
inline namespace callbacks {

void ExpertLoadMonitor::on_log(CallbackContext& ctx) {
  const std::shared_ptr<const models::moe::MoEReport> report = ctx.state.moe_report;
  if (!report) return;
  auto& metrics = ctx.log->metrics;
  double worst = 0.0, dropped = 0.0;
  for (std::size_t layer = 0; layer < report->tokens_per_expert.size(); ++layer) {
    const std::vector<double>& tokens = report->tokens_per_expert[layer];
    if (tokens.empty()) continue;  // a dense layer
    double total = 0.0, busiest = 0.0;
    for (double count : tokens) {
      total += count;
      busiest = std::max(busiest, count);
    }
    const double mean = total / static_cast<double>(tokens.size());
    const double imbalance = mean > 0.0 ? busiest / mean : 0.0;
    const std::string suffix = "_layer_" + std::to_string(layer);
    metrics["moe/expert_load_imbalance" + suffix] = imbalance;
    metrics["moe/dropped_tokens" + suffix] = report->dropped_tokens[layer];
    worst = std::max(worst, imbalance);
    dropped += report->dropped_tokens[layer];
  }
  metrics["moe/expert_load_imbalance"] = worst;
  metrics["moe/dropped_tokens"] = dropped;
  if (ctx.state.cfg != nullptr && ctx.state.cfg->model.moe_per_layer_logging) {
    for (const auto& [name, values] : report->per_layer) {
      for (std::size_t layer = 0; layer < values.size(); ++layer) {
        if (report->tokens_per_expert[layer].empty()) continue;
        metrics["moe/" + name + "_layer_" + std::to_string(layer)] = values[layer];
      }
    }
  }
}

}  // namespace callbacks
}  // namespace bridge::training
