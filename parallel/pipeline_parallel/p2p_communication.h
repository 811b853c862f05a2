// Point-to-point exchange of activations and gradients between neighbouring pipeline stages (Megatron's
// p2p_communication), over parallel_state's pipeline group. Activations flow to the next rank, gradients to the
// previous one, wrapping around for the interleaved schedule. Every exchange starts its sends and receives together
// and then waits on all of them (Megatron's batch_isend_irecv), so neighbours never wait on each other's ordering.
//
//   TensorSpec spec{{seq, micro_batch, hidden}, torch::kFloat32};
//   torch::Tensor input = recv_forward(spec);            // undefined on the first stage
//   ...
//   torch::Tensor output_grad = send_forward_recv_backward(output, spec);
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "parallel/process_group.h"

namespace bridge::parallel::pipeline_parallel {

/// What every tensor exchanged between stages looks like; receive buffers are allocated from it.
struct TensorSpec {
  std::vector<int64_t> shape;
  torch::Dtype dtype = torch::kFloat32;
  torch::Device device = torch::kCPU;
};

/// Activations and gradients travel on separate tags: with two stages the next and previous rank are the same peer,
/// and the two streams between them must not mix.
constexpr int kActivationTag = 0;
constexpr int kGradientTag = 1;

/// Transfers started by start_communication; the received tensors must not be read before wait_all(works).
struct P2PTransfers {
  torch::Tensor from_prev;  ///< activation from the previous rank, if asked for
  torch::Tensor from_next;  ///< gradient from the next rank, if asked for
  std::vector<Work> works;
};

/// Starts sending `send_next` (an activation) to the next rank and `send_prev` (a gradient) to the previous rank,
/// each only if defined, and receiving from the previous/next rank if `recv_prev`/`recv_next`. No stage checks: the
/// caller decides. Sent tensors must match `spec` (shape and dtype), since the peer's buffer was sized from it.
P2PTransfers start_communication(const torch::Tensor& send_next, const torch::Tensor& send_prev, bool recv_prev,
                                 bool recv_next, const TensorSpec& spec);
/// start_communication and wait; a received activation gets requires_grad(`requires_grad`).
P2PTransfers communicate(const torch::Tensor& send_next, const torch::Tensor& send_prev, bool recv_prev, bool recv_next,
                         const TensorSpec& spec, bool requires_grad);

// The stage-aware operations of the non-interleaved schedule. They ask parallel_state (with the current virtual
// chunk) whether this is the first/last stage and skip the missing side: receives then return an undefined tensor.
// `requires_grad` marks a received activation as needing a gradient (false in forward-only runs).
torch::Tensor recv_forward(const TensorSpec& spec, bool requires_grad = true);
torch::Tensor recv_backward(const TensorSpec& spec);
void send_forward(const torch::Tensor& output, const TensorSpec& spec);
void send_backward(const torch::Tensor& input_grad, const TensorSpec& spec);
torch::Tensor send_forward_recv_backward(const torch::Tensor& output, const TensorSpec& spec);
torch::Tensor send_backward_recv_forward(const torch::Tensor& input_grad, const TensorSpec& spec,
                                         bool requires_grad = true);

// The interleaved forms: the caller passes an undefined tensor for "nothing to send" and says what to receive.
torch::Tensor send_forward_recv_forward(const torch::Tensor& output, bool recv_prev, const TensorSpec& spec,
                                        bool requires_grad = true);
torch::Tensor send_backward_recv_backward(const torch::Tensor& input_grad, bool recv_next, const TensorSpec& spec);
/// Returns {activation from the previous rank, gradient from the next rank}.
std::pair<torch::Tensor, torch::Tensor> send_forward_backward_recv_forward_backward(const torch::Tensor& output,
                                                                                    const torch::Tensor& input_grad,
                                                                                    bool recv_prev, bool recv_next,
                                                                                    const TensorSpec& spec,
                                                                                    bool requires_grad = true);

}  // namespace bridge::parallel::pipeline_parallel
