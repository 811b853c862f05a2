// What the MoE layers report per step (Megatron-Core's MoEMetricsTracker in moe_logging.py): each router records its
// auxiliary losses per layer and micro-batch, and its tokens per expert; report() reduces them over the ranks as
// Megatron does and clears them for the next step. The training loop puts the averages beside "lm loss" in the log
// line ("load_balancing_loss", "z_loss", ...) and hands the per-layer counts to callbacks.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bridge/models/gpt_config.h"

namespace bridge::models::moe {

/// How a metric is combined over ranks before the average over layers (Megatron-Core's reduce_group / avg_group).
enum class MetricReduce {
  /// partial per tensor x context-parallel rank (load_balancing_loss): sum over tp x cp (reduce_group tp_cp), average
  /// over dp
  kSumTensorAndContext,
  /// partial per tensor x data x context-parallel rank (global_load_balancing_loss): sum over all three (tp_dp_cp)
  kSumTensorDataAndContext,
  /// a mean per rank (z_loss): average over tensor x data x context-parallel ranks (avg_group tp_dp_cp)
  kAverage,
};

/// One step's MoE statistics after report(): every rank of the job holds the same values.
struct MoEReport {
  /// name -> sum over MoE layers of (per-layer value / micro-batches), divided by the number of MoE layers
  std::map<std::string, double> losses;
  /// name -> per global layer (0 for dense layers), as moe/<name>_layer_<i> with moe_per_layer_logging
  std::map<std::string, std::vector<double>> per_layer;
  /// per global layer: tokens routed to each expert over the step and the whole job, context-parallel ranks' tokens
  /// included ([E] double; empty for dense layers), and the tokens dropped past an expert's capacity
  std::vector<std::vector<double>> tokens_per_expert;
  std::vector<double> dropped_tokens;
};

/// The auxiliary-loss names a config logs, in a fixed order (every rank reports the same ones).
std::vector<std::pair<std::string, MetricReduce>> tracked_moe_metrics(const GPTConfig& config);

class MoEMetricsTracker {
 public:
  static MoEMetricsTracker& get();

  /// Adds `value` (a scalar, detached here) to this step's sum for `name` at global layer `layer`.
  void record(const std::string& name, int64_t layer, const torch::Tensor& value);
  /// Adds a layer's routed tokens per expert ([E]) and dropped tokens for this micro-batch on this rank.
  void record_tokens(int64_t layer, const torch::Tensor& tokens_per_expert, int64_t dropped);
  /// Reduces this step's records over the pipeline, tensor-, data- and context-parallel groups (collectives: every
  /// rank of the job calls it, with the same config) and clears them.
  MoEReport report(const GPTConfig& config, int64_t num_microbatches);
  void clear();

 private:
  std::map<std::string, std::map<int64_t, torch::Tensor>> values_;
  std::map<int64_t, torch::Tensor> tokens_;
  std::map<int64_t, int64_t> dropped_;
};

}  // namespace bridge::models::moe
