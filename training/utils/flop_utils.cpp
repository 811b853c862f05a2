// num_floating_point_operations: Megatron's formula for a GPT, with grouped-query attention, gated MLPs and MoE layers
// (their active experts).
#include "training/utils/flop_utils.h"

#include "bridge/models/moe/moe_config.h"
#include "parallel/tensor_parallel/vocab_utils.h"

namespace bridge::training::utils {

double num_floating_point_operations(const models::GPTConfig& config, int64_t batch_size,
                                     int tensor_model_parallel_size) {
  const double b = static_cast<double>(batch_size);
  const double s = static_cast<double>(config.seq_length);
  const double layers = static_cast<double>(config.num_layers);
  const double h = static_cast<double>(config.hidden_size);
  const double ffn = static_cast<double>(config.ffn_size());
  const double vocab = static_cast<double>(parallel::tensor_parallel::vocab_size_with_padding(
      config.vocab_size, config.make_vocab_size_divisible_by, tensor_model_parallel_size));
  const double query_groups_per_head =
      static_cast<double>(config.query_groups()) / static_cast<double>(config.num_attention_heads);
  const double query_projection_ratio = static_cast<double>(config.query_projection_size()) / h;
  const double attention = (1.0 + query_groups_per_head + s / h) * query_projection_ratio;
  const double gated_linear_multiplier = config.gated_linear_unit ? 1.5 : 1.0;  // three MLP GEMMs instead of two
  // MoE layers count the experts a token goes through (k routed, plus the shared ones), not all E: the FLOPs of the
  // active parameters, as Megatron's formula (the router's h x E GEMM and the dispatch are not counted).
  const double moe_layers = static_cast<double>(models::num_moe_layers(config));
  const double moe_ffn = static_cast<double>(config.moe_ffn_size() * config.moe_router_topk +
                                             config.moe_shared_expert_intermediate_size.value_or(0));
  const double mean_ffn = ((layers - moe_layers) * ffn + moe_layers * moe_ffn) / layers;
  const double mlp = mean_ffn / h * gated_linear_multiplier;
  const double logits = vocab / (2.0 * layers * h);
  return 12.0 * b * s * layers * h * h * (attention + mlp + logits);
}

}  // namespace bridge::training::utils
