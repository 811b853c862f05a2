// Vocabulary arithmetic for vocab-parallel layers: the padded vocabulary size (so that every tensor-parallel rank
// holds an equal, GEMM-friendly shard) and the id range [start, end) a rank owns.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace bridge::parallel::tensor_parallel {

/// ceil(vocab_size / (d * tp)) * (d * tp), d = make_vocab_size_divisible_by. GPT-2: 50257 -> 50304 (tp 1), 50432 (tp
/// 2).
inline int64_t vocab_size_with_padding(int64_t vocab_size, int64_t make_vocab_size_divisible_by,
                                       int tensor_model_parallel_size) {
  if (vocab_size <= 0) {
    throw std::invalid_argument("vocab_size_with_padding: vocab_size must be positive, got " +
                                std::to_string(vocab_size));
  }
  if (make_vocab_size_divisible_by <= 0) {
    throw std::invalid_argument("vocab_size_with_padding: make_vocab_size_divisible_by must be positive, got " +
                                std::to_string(make_vocab_size_divisible_by) + " (Megatron's default is 128)");
  }
  if (tensor_model_parallel_size <= 0) {
    throw std::invalid_argument("vocab_size_with_padding: tensor_model_parallel_size must be positive, got " +
                                std::to_string(tensor_model_parallel_size));
  }
  const int64_t multiple = make_vocab_size_divisible_by * tensor_model_parallel_size;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

/// The ids [start, end) that `rank` of `world_size` owns; global_vocab_size must split evenly (pad it first).
inline std::pair<int64_t, int64_t> vocab_range_from_global_vocab_size(int64_t global_vocab_size, int rank,
                                                                      int world_size) {
  if (world_size <= 0) {
    throw std::invalid_argument("vocab_range_from_global_vocab_size: world_size must be positive, got " +
                                std::to_string(world_size));
  }
  if (rank < 0 || rank >= world_size) {
    throw std::invalid_argument("vocab_range_from_global_vocab_size: rank " + std::to_string(rank) + " is not in [0, " +
                                std::to_string(world_size) + ")");
  }
  if (global_vocab_size <= 0 || global_vocab_size % world_size != 0) {
    throw std::invalid_argument("vocab_range_from_global_vocab_size: global_vocab_size " +
                                std::to_string(global_vocab_size) + " must be a positive multiple of world_size " +
                                std::to_string(world_size) + "; pad it with vocab_size_with_padding");
  }
  const int64_t per_partition = global_vocab_size / world_size;
  return {per_partition * rank, per_partition * (rank + 1)};
}

}  // namespace bridge::parallel::tensor_parallel
