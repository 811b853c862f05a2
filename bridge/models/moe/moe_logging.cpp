// MoEMetricsTracker: per-layer sums over the step's micro-batches, reduced over the job as Megatron-Core's
// MoEMetricsTracker.report does (pipeline sum, then the metric's tensor/data/context-parallel reduction, then the mean
// over the MoE layers).
#include "bridge/models/moe/moe_logging.h"

#include "bridge/models/moe/moe_config.h"
#include "parallel/parallel_state.h"

namespace bridge::models::moe {

std::vector<std::pair<std::string, MetricReduce>> tracked_moe_metrics(const GPTConfig& config) {
  std::vector<std::pair<std::string, MetricReduce>> names;
  if (!config.num_moe_experts) return names;
  if (config.moe_aux_loss_coeff > 0.0) {
    switch (config.moe_router_load_balancing_type) {
      case MoELoadBalancingType::kAuxLoss:
        names.emplace_back("load_balancing_loss", MetricReduce::kSumTensorAndContext);
        break;
      case MoELoadBalancingType::kSeqAuxLoss:
        names.emplace_back("seq_load_balancing_loss", MetricReduce::kSumTensorAndContext);
        break;
      case MoELoadBalancingType::kGlobalAuxLoss:
        names.emplace_back("global_load_balancing_loss", MetricReduce::kSumTensorDataAndContext);
        break;
      case MoELoadBalancingType::kNone:
        break;
    }
  }
  if (config.moe_z_loss_coeff && *config.moe_z_loss_coeff > 0.0) names.emplace_back("z_loss", MetricReduce::kAverage);
  return names;
}

MoEMetricsTracker& MoEMetricsTracker::get() {
  static MoEMetricsTracker tracker;
  return tracker;
}

void MoEMetricsTracker::record(const std::string& name, int64_t layer, const torch::Tensor& value) {
  const torch::Tensor v = value.detach().to(torch::kDouble).reshape({});
  auto [it, inserted] = values_[name].emplace(layer, v);
  if (!inserted) it->second = it->second + v;
}

void MoEMetricsTracker::record_tokens(int64_t layer, const torch::Tensor& tokens_per_expert, int64_t dropped) {
  const torch::Tensor counts = tokens_per_expert.detach().to(torch::kDouble);
  auto [it, inserted] = tokens_.emplace(layer, counts);
  if (!inserted) it->second = it->second + counts;
  dropped_[layer] += dropped;
}

void MoEMetricsTracker::clear() {
  values_.clear();
  tokens_.clear();
  dropped_.clear();
}

MoEReport MoEMetricsTracker::report(const GPTConfig& config, int64_t num_microbatches) {
  MoEReport out;
  if (!config.num_moe_experts) {
    clear();
    return out;
  }
  const auto metrics = tracked_moe_metrics(config);
  const int64_t layers = config.num_layers;
  const int64_t experts = *config.num_moe_experts;
  const auto n = static_cast<int64_t>(metrics.size());
  // One flat buffer: [metrics x layers | layers x experts tokens | layers dropped], reduced in three collectives.
  torch::Tensor packed = torch::zeros({n * layers + layers * experts + layers}, torch::kDouble);
  for (int64_t m = 0; m < n; ++m) {
    const auto it = values_.find(metrics[static_cast<std::size_t>(m)].first);
    if (it == values_.end()) continue;
    for (const auto& [layer, value] : it->second) packed[m * layers + layer] = value.cpu();
  }
  for (const auto& [layer, counts] : tokens_) {
    packed.narrow(0, n * layers + layer * experts, experts).copy_(counts.cpu());
  }
  for (const auto& [layer, dropped] : dropped_)
    packed[n * layers + layers * experts + layer] = static_cast<double>(dropped);
  clear();
  // Summed over tp x dp x cp (in that order, so that without context parallelism the sums are the ones they were):
  // the cp ranks hold other tokens of the same sequences, their loss shares and token counts add as the tp ranks' do.
  // Megatron's average over dp then divides by dp alone; the cp ranks were already summed.
  parallel::get_pipeline_model_parallel_group().all_reduce(packed);
  parallel::get_tensor_model_parallel_group().all_reduce(packed);
  parallel::get_data_parallel_group().all_reduce(packed);
  parallel::get_context_parallel_group().all_reduce(packed);
  const double tp = parallel::get_tensor_model_parallel_world_size();
  const double dp = parallel::get_data_parallel_world_size();
  const double cp = parallel::get_context_parallel_world_size();
  const double moe_layers = static_cast<double>(std::max<int64_t>(1, num_moe_layers(config)));
  const double micro_batches = static_cast<double>(std::max<int64_t>(1, num_microbatches));
  for (int64_t m = 0; m < n; ++m) {
    const auto& [name, reduce] = metrics[static_cast<std::size_t>(m)];
    const double divisor = reduce == MetricReduce::kSumTensorAndContext ? dp
                           : reduce == MetricReduce::kAverage           ? tp * dp * cp
                                                                        : 1.0;
    std::vector<double> per_layer(static_cast<std::size_t>(layers));
    double total = 0.0;
    for (int64_t layer = 0; layer < layers; ++layer) {
      per_layer[static_cast<std::size_t>(layer)] = packed[m * layers + layer].item<double>() / divisor / micro_batches;
      total += per_layer[static_cast<std::size_t>(layer)];
    }
    out.losses[name] = total / moe_layers;
    out.per_layer[name] = std::move(per_layer);
  }
  out.tokens_per_expert.resize(static_cast<std::size_t>(layers));
  out.dropped_tokens.resize(static_cast<std::size_t>(layers));
  for (int64_t layer = 0; layer < layers; ++layer) {
    out.dropped_tokens[static_cast<std::size_t>(layer)] = packed[n * layers + layers * experts + layer].item<double>();
    if (!is_moe_layer(config, layer)) continue;
    const torch::Tensor counts = packed.narrow(0, n * layers + layer * experts, experts).contiguous();
    out.tokens_per_expert[static_cast<std::size_t>(layer)] =
        std::vector<double>(counts.data_ptr<double>(), counts.data_ptr<double>() + experts);
  }
  return out;
}

}  // namespace bridge::models::moe
