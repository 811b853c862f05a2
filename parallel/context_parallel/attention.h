// Causal attention over a sequence split across the context-parallel ranks by the load-balanced (zigzag) split
// (utils.h), built from LibTorch operations and c10d, for each of Megatron-Core's cp_comm_type (which Megatron-Core
// itself runs only inside Transformer Engine's context_parallel.py):
//
//   p2p         a ring: cp - 1 steps pass each rank's key/value block to the next rank (asynchronous send/recv)
//               while attention runs on the block in hand; the partial results are merged by their log-sum-exp.
//               The backward runs a second ring that carries the blocks' key/value gradients home.
//   all_gather  the keys and values of the whole sequence gathered on every rank; the backward reduce-scatters
//               their gradients.
//   a2a         Ulysses: an all-to-all gives each rank cp-th of the heads over the whole sequence, attention runs
//               there, and a second all-to-all gives the sequence back; the backward is the same pair reversed.
//
// Each rank's queries, keys and values are its two chunks in local order (chunks r and 2cp-1-r of 2 cp); the causal
// mask is the one of the whole sequence: a query at global position i sees the keys at global positions <= i.
//
//   torch::Tensor context = context_parallel_attention(q, k, v, CpCommType::kP2P, get_context_parallel_group());
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "parallel/context_parallel/utils.h"
#include "parallel/process_group.h"

namespace bridge::parallel::context_parallel {

/// The causal attention context of this rank's queries over the whole sequence's keys.
/// q: [b, heads, s_local, head_dim]; k, v: [b, groups, s_local, head_dim] with heads a multiple of groups
/// (grouped-query attention: query head i reads key/value head i / (heads / groups)); s_local = 2 x chunk. Returns
/// [b, heads, s_local, head_dim] in q's dtype (bf16 and fp16 inputs accumulate the softmax in fp32), differentiable in
/// q, k and v. `softmax_scale` 0 means 1 / sqrt(head_dim). A group of one is plain causal attention. No dropout.
torch::Tensor context_parallel_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                         CpCommType comm_type, ProcessGroup& cp_group, double softmax_scale = 0.0);

/// One event of the p2p ring's schedule, as it ran: step `step` (0 .. cp-1) of the forward or the backward ring
/// started the transfer of the next key/value block, computed on the block in hand, or waited for the transfer. The
/// ring overlaps when each step's compute lies between its start and its wait.
struct RingEvent {
  enum class Kind : std::uint8_t { kStartTransfer, kCompute, kWaitTransfer };
  bool backward;
  int step;
  Kind kind;
};

/// While set, the p2p ring appends its events to `*events` (for tests and profiling; one process-wide recorder, not
/// synchronised, so only while one attention runs at a time). nullptr stops recording.
void set_ring_event_recorder(std::vector<RingEvent>* events);

}  // namespace bridge::parallel::context_parallel
