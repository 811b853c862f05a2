// Model FLOPs of a GPT training step (Megatron's num_floating_point_operations), for the TFLOP/s on the log line.
#pragma once

#include <cstdint>

#include "bridge/models/gpt_config.h"

namespace bridge::training::utils {

/// Floating-point operations of one training step (forward and backward) over `batch_size` sequences:
/// 12 B s L h^2 ((1 + groups/heads + s/h) q + f/h + V/(2 L h)), with q = kv_channels x heads / h (1 here), f the
/// MLP width and V the vocabulary padded as the run pads it for `tensor_model_parallel_size` (the factor 12 is 3
/// GEMMs per weight x 2 GEMMs per block x 2 FLOPs per multiply-add; Narayanan et al. 2021, appendix).
double num_floating_point_operations(const models::GPTConfig& config, int64_t batch_size,
                                     int tensor_model_parallel_size);

}  // namespace bridge::training::utils
