// Pipeline point-to-point exchanges: see p2p_communication.h.
#include "parallel/pipeline_parallel/p2p_communication.h"

#include <sstream>
#include <stdexcept>
#include <string>

#include "parallel/parallel_state.h"

namespace bridge::parallel::pipeline_parallel {
namespace {

std::string shape_string(c10::IntArrayRef shape) {
  std::ostringstream out;
  out << shape;
  return out.str();
}

// A wrong shape or dtype would not fail here but corrupt or stall the peer, whose buffer was sized from the spec.
torch::Tensor checked_for_send(const torch::Tensor& tensor, const TensorSpec& spec, const char* what) {
  if (tensor.sizes() != c10::IntArrayRef(spec.shape) || tensor.scalar_type() != spec.dtype ||
      tensor.device() != spec.device) {
    throw std::invalid_argument(std::string("pipeline p2p: the ") + what + " to send has shape " +
                                shape_string(tensor.sizes()) + ", dtype " +
                                std::string(c10::toString(tensor.scalar_type())) + " on " + tensor.device().str() +
                                ", but the stages exchange tensor_shape " + shape_string(spec.shape) + " of dtype " +
                                std::string(c10::toString(spec.dtype)) + " on " + spec.device.str() +
                                "; set ForwardBackwardOptions::tensor_shape/dtype/device to what each stage outputs");
  }
  return tensor.detach().contiguous();
}

torch::Tensor receive_buffer(const TensorSpec& spec) {
  if (spec.shape.empty()) {
    throw std::invalid_argument(
        "pipeline p2p: tensor_shape is empty; set it to the activation shape, e.g. {seq, "
        "micro_batch, hidden}");
  }
  return torch::empty(spec.shape, torch::TensorOptions().dtype(spec.dtype).device(spec.device));
}

}  // namespace

P2PTransfers start_communication(const torch::Tensor& send_next, const torch::Tensor& send_prev, bool recv_prev,
                                 bool recv_next, const TensorSpec& spec) {
  P2PTransfers transfers;
  if (!send_next.defined() && !send_prev.defined() && !recv_prev && !recv_next) return transfers;
  ProcessGroup& group = get_pipeline_model_parallel_group();
  const int size = group.size();
  const int next = (group.rank() + 1) % size;
  const int prev = (group.rank() + size - 1) % size;
  // One batch (Megatron's batch_isend_irecv), ordered by tag: activations, then gradients. NCCL ignores tags and
  // matches a peer's sends with its receives in batch order; with two stages the next and previous rank are the same
  // peer, and both sides list the activation before the gradient, so the pairs match. Gloo matches by tag anyway.
  std::vector<P2POp> ops;
  if (recv_prev) {
    transfers.from_prev = receive_buffer(spec);
    ops.push_back({P2POp::Kind::kRecv, transfers.from_prev, prev, kActivationTag});
  }
  if (send_next.defined()) {
    ops.push_back({P2POp::Kind::kSend, checked_for_send(send_next, spec, "activation"), next, kActivationTag});
  }
  if (send_prev.defined()) {
    ops.push_back({P2POp::Kind::kSend, checked_for_send(send_prev, spec, "gradient"), prev, kGradientTag});
  }
  if (recv_next) {
    transfers.from_next = receive_buffer(spec);
    ops.push_back({P2POp::Kind::kRecv, transfers.from_next, next, kGradientTag});
  }
  transfers.works = group.batch_isend_irecv(std::move(ops));
  return transfers;
}

P2PTransfers communicate(const torch::Tensor& send_next, const torch::Tensor& send_prev, bool recv_prev, bool recv_next,
                         const TensorSpec& spec, bool requires_grad) {
  P2PTransfers transfers = start_communication(send_next, send_prev, recv_prev, recv_next, spec);
  wait_all(transfers.works);
  transfers.works.clear();
  if (transfers.from_prev.defined() && requires_grad) transfers.from_prev.requires_grad_(true);
  return transfers;
}

torch::Tensor recv_forward(const TensorSpec& spec, bool requires_grad) {
  if (is_pipeline_first_stage()) return {};
  return communicate({}, {}, /*recv_prev=*/true, /*recv_next=*/false, spec, requires_grad).from_prev;
}

torch::Tensor recv_backward(const TensorSpec& spec) {
  if (is_pipeline_last_stage()) return {};
  return communicate({}, {}, false, /*recv_next=*/true, spec, false).from_next;
}

void send_forward(const torch::Tensor& output, const TensorSpec& spec) {
  if (is_pipeline_last_stage()) return;
  communicate(output, {}, false, false, spec, false);
}

void send_backward(const torch::Tensor& input_grad, const TensorSpec& spec) {
  if (is_pipeline_first_stage()) return;
  communicate({}, input_grad, false, false, spec, false);
}

torch::Tensor send_forward_recv_backward(const torch::Tensor& output, const TensorSpec& spec) {
  if (is_pipeline_last_stage()) return {};
  return communicate(output, {}, false, /*recv_next=*/true, spec, false).from_next;
}

torch::Tensor send_backward_recv_forward(const torch::Tensor& input_grad, const TensorSpec& spec, bool requires_grad) {
  if (is_pipeline_first_stage()) return {};
  return communicate({}, input_grad, /*recv_prev=*/true, false, spec, requires_grad).from_prev;
}

torch::Tensor send_forward_recv_forward(const torch::Tensor& output, bool recv_prev, const TensorSpec& spec,
                                        bool requires_grad) {
  return communicate(output, {}, recv_prev, false, spec, requires_grad).from_prev;
}

torch::Tensor send_backward_recv_backward(const torch::Tensor& input_grad, bool recv_next, const TensorSpec& spec) {
  return communicate({}, input_grad, false, recv_next, spec, false).from_next;
}

std::pair<torch::Tensor, torch::Tensor> send_forward_backward_recv_forward_backward(const torch::Tensor& output,
                                                                                    const torch::Tensor& input_grad,
                                                                                    bool recv_prev, bool recv_next,
                                                                                    const TensorSpec& spec,
                                                                                    bool requires_grad) {
  P2PTransfers transfers = communicate(output, input_grad, recv_prev, recv_next, spec, requires_grad);
  return {transfers.from_prev, transfers.from_next};
}

}  // namespace bridge::parallel::pipeline_parallel
