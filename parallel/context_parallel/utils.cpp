// The load-balanced (zigzag) split of a sequence over context-parallel ranks, and its inverse.
#include "parallel/context_parallel/utils.h"

#include <stdexcept>

namespace bridge::parallel::context_parallel {

std::string_view to_string(CpCommType type) {
  for (const auto& [candidate, name] : kCpCommTypeNames) {
    if (candidate == type) return name;
  }
  return "?";
}

namespace {

void check_split(int64_t seq_length, int cp_size, int cp_rank) {
  if (cp_size < 1 || cp_rank < 0 || cp_rank >= cp_size) {
    throw std::invalid_argument("context parallel: rank " + std::to_string(cp_rank) + " is outside a group of " +
                                std::to_string(cp_size));
  }
  if (seq_length % (2 * static_cast<int64_t>(cp_size)) != 0) {
    throw std::invalid_argument("context parallel: the sequence length " + std::to_string(seq_length) +
                                " is not a multiple of 2 x context_parallel_size = " + std::to_string(2 * cp_size) +
                                " (each rank keeps two equal chunks); change dataset.seq_length or "
                                "context_parallel_size");
  }
}

}  // namespace

torch::Tensor positions_on_this_cp_rank(int64_t seq_length, int cp_size, int cp_rank) {
  check_split(seq_length, cp_size, cp_rank);
  const int64_t chunk = seq_length / (2 * cp_size);
  return torch::cat(
      {torch::arange(cp_rank * chunk, (cp_rank + 1) * chunk, torch::kLong),
       torch::arange((2 * cp_size - 1 - cp_rank) * chunk, (2 * cp_size - cp_rank) * chunk, torch::kLong)});
}

torch::Tensor get_tensor_on_this_cp_rank(const torch::Tensor& tensor, int64_t seq_dim, int cp_size, int cp_rank) {
  if (cp_size == 1) return tensor;
  const int64_t dim = seq_dim < 0 ? seq_dim + tensor.dim() : seq_dim;
  const int64_t s = tensor.size(dim);
  check_split(s, cp_size, cp_rank);
  const int64_t chunk = s / (2 * cp_size);
  return torch::cat(
      {tensor.narrow(dim, cp_rank * chunk, chunk), tensor.narrow(dim, (2 * cp_size - 1 - cp_rank) * chunk, chunk)},
      dim);
}

torch::Tensor restore_from_cp_ranks(const std::vector<torch::Tensor>& locals, int64_t seq_dim) {
  const int cp = static_cast<int>(locals.size());
  if (cp == 0) throw std::invalid_argument("restore_from_cp_ranks: no ranks' tensors");
  if (cp == 1) return locals[0];
  const int64_t dim = seq_dim < 0 ? seq_dim + locals[0].dim() : seq_dim;
  const int64_t local = locals[0].size(dim);
  if (local % 2 != 0) {
    throw std::invalid_argument("restore_from_cp_ranks: a rank's sequence of " + std::to_string(local) +
                                " is not two equal chunks");
  }
  const int64_t chunk = local / 2;
  std::vector<torch::Tensor> chunks(static_cast<std::size_t>(2 * cp));
  for (int r = 0; r < cp; ++r) {
    const torch::Tensor& part = locals[static_cast<std::size_t>(r)];
    if (part.size(dim) != local) {
      throw std::invalid_argument("restore_from_cp_ranks: rank " + std::to_string(r) + " holds " +
                                  std::to_string(part.size(dim)) + " positions, rank 0 " + std::to_string(local));
    }
    chunks[static_cast<std::size_t>(r)] = part.narrow(dim, 0, chunk);
    chunks[static_cast<std::size_t>(2 * cp - 1 - r)] = part.narrow(dim, chunk, chunk);
  }
  return torch::cat(chunks, dim);
}

}  // namespace bridge::parallel::context_parallel
