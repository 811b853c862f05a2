// Megatron-Core's load-balanced split of a sequence over the context-parallel ranks
// (megatron/core/utils.py::get_batch_on_this_cp_rank): the sequence is cut into 2 x cp equal chunks and rank r keeps
// chunks r and 2cp-1-r, so that under a causal mask every rank has the same share of the attention's work (an early
// chunk sees few keys, its mirror many).
//
//   cp = 2, s = 8:  chunks [0 1][2 3][4 5][6 7]   rank 0 keeps [0 1 6 7], rank 1 keeps [2 3 4 5]
//
//   torch::Tensor local = get_tensor_on_this_cp_rank(tokens, /*seq_dim=*/1, cp_size, cp_rank);
//   torch::Tensor whole = restore_from_cp_ranks(every_ranks_local, /*seq_dim=*/1);   // the inverse
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bridge::parallel::context_parallel {

/// Megatron-Core's cp_comm_type: how attention sees the keys and values of the other context-parallel ranks.
enum class CpCommType {
  kP2P,        ///< "p2p": a ring passes key/value blocks on while attention runs on the block in hand
  kAllGather,  ///< "all_gather": every rank gathers the whole sequence's keys and values
  kA2A,        ///< "a2a": Ulysses; an all-to-all trades heads for sequence, attention runs over the whole sequence
};

inline constexpr std::pair<CpCommType, std::string_view> kCpCommTypeNames[] = {
    {CpCommType::kP2P, "p2p"}, {CpCommType::kAllGather, "all_gather"}, {CpCommType::kA2A, "a2a"}};

/// "p2p", "all_gather" or "a2a".
std::string_view to_string(CpCommType type);

/// The global positions (indices into the whole sequence of `seq_length`) that cp rank `cp_rank` keeps, in its local
/// order: [r*c, (r+1)*c) then [(2cp-1-r)*c, (2cp-r)*c) with c = seq_length / (2 cp). int64 on the CPU. Throws
/// std::invalid_argument (naming seq_length and 2 x context_parallel_size) when seq_length is not a multiple of 2 cp.
torch::Tensor positions_on_this_cp_rank(int64_t seq_length, int cp_size, int cp_rank);

/// `tensor` with only this rank's two chunks of dimension `seq_dim` (of length seq_length, a multiple of 2 cp), in
/// the order of positions_on_this_cp_rank. cp_size 1 returns `tensor` itself.
torch::Tensor get_tensor_on_this_cp_rank(const torch::Tensor& tensor, int64_t seq_dim, int cp_size, int cp_rank);

/// The inverse: every rank's local tensor (rank order) put back into one sequence along `seq_dim`.
torch::Tensor restore_from_cp_ranks(const std::vector<torch::Tensor>& locals, int64_t seq_dim);

}  // namespace bridge::parallel::context_parallel
