// num_floating_point_operations: Megatron's formula for a dense GPT with full multi-head attention.
#include "training/utils/flop_utils.h"

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
  const double query_groups_per_head = 1.0;  // no grouped-query attention
  const double query_projection_ratio = static_cast<double>(config.head_dim() * config.num_attention_heads) / h;
  const double attention = (1.0 + query_groups_per_head + s / h) * query_projection_ratio;
  const double mlp = ffn / h;
  const double logits = vocab / (2.0 * layers * h);
  return 12.0 * b * s * layers * h * h * (attention + mlp + logits);
}

}  // namespace bridge::training::utils
