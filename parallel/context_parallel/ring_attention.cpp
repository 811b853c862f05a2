// The p2p ring of context-parallel attention (Transformer Engine's AttnFuncWithCPAndKVP2P). On LibTorch >= 2.5 each
// block runs LibTorch's fused CPU flash attention (at::_scaled_dot_product_flash_attention_for_cpu and its backward,
// which read grouped keys and values as they are), so no block's scores are ever materialised; older LibTorch (the
// sanitizer leg's 1.13) takes matmuls over the block's fp32 scores. Each rank's key/value block travels once around the
// ring while attention runs on the block in hand; the partial results merge by their log-sum-exp (online softmax),
// accumulated in fp32. The zigzag split makes every step but the first a dense, unmasked block of half the size:
//
//   step 0          the rank's own block: causal (its local order is increasing in global position)
//   block of j < r  every local query sees only the block's first chunk (chunk j), all of it
//   block of j > r  only the local second chunk (2cp-1-r) sees anything: the whole block
//
// The backward recomputes each block's probabilities from the saved output's log-sum-exp (flash-attention style), and
// a second ring carries each block's key/value gradients along with it, so that they arrive home after cp steps. Only
// the local q, k, v, output and log-sum-exp are saved: no other rank's block outlives its step.
#include "parallel/context_parallel/ring_attention.h"

#include <torch/version.h>

#include <atomic>
#include <limits>
#include <utility>
#include <vector>

#include "parallel/context_parallel/attention.h"

namespace bridge::parallel::context_parallel {
namespace {

std::atomic<std::vector<RingEvent>*> g_recorder{nullptr};

void record(bool backward, int step, RingEvent::Kind kind) {
  if (std::vector<RingEvent>* events = g_recorder.load()) events->push_back({backward, step, kind});
}

}  // namespace

void set_ring_event_recorder(std::vector<RingEvent>* events) { g_recorder.store(events); }

namespace detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One tag per stream of blocks: Gloo matches sends to receives by tag (and in order within a tag), so the backward's
// key/value blocks and gradient blocks, in flight at once between the same ranks, never take each other's place.
constexpr int kForwardTag = 0;
constexpr int kBackwardBlockTag = 1;
constexpr int kBackwardGradTag = 2;

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
#define BRIDGE_RING_FUSED_BLOCKS 1
#else
#define BRIDGE_RING_FUSED_BLOCKS 0
#endif

// The group of the attention, kept in its autograd context for backward (an IValue holds no plain pointer).
struct GroupHandle : torch::CustomClassHolder {
  explicit GroupHandle(ProcessGroup& member_of) : group(&member_of) {}
  ProcessGroup* group;
};

// Softmax statistics and sums in fp32 for fp32, bf16 and fp16 inputs; fp64 stays fp64.
torch::ScalarType accumulation_type(torch::ScalarType type) {
  return type == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

// A block's normalised output [b, heads, sq, d] and log-sum-exp [b, heads, sq], in the accumulation type.
struct Partial {
  torch::Tensor out;
  torch::Tensor lse;
};

struct BlockGrads {
  torch::Tensor dq;  // [b, heads, sq, d]
  torch::Tensor dk;  // [b, groups, sk, d]
  torch::Tensor dv;
};

#if BRIDGE_RING_FUSED_BLOCKS
// The block through the fused kernel: queries q [b, heads, sq, d] against keys and values [b, groups, sk, d]. `causal`
// masks the rank's own block (sq = sk), whose local order is increasing in global position, so that the global causal
// mask is its lower triangle.
Partial block_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double scale,
                      bool causal) {
  auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, /*dropout_p=*/0.0, causal,
                                                                    /*attn_mask=*/{}, scale);
  return {std::move(out), std::move(lse)};
}

// The block's gradients from the final (merged) output and log-sum-exp of its query rows: flash attention's backward
// of one key block is exactly that, P = exp(S - lse), delta = rowsum(dO * O).
BlockGrads block_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const torch::Tensor& dout, const torch::Tensor& out, const torch::Tensor& lse, double scale,
                          bool causal) {
  auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      dout, q, k, v, out, lse.contiguous(), /*dropout_p=*/0.0, causal, /*attn_mask=*/{}, scale);
  return {std::move(dq), std::move(dk), std::move(dv)};
}
#else
// The block's scaled scores [b, groups, per_group, sq, sk] of queries q5 [b, groups, per_group, sq, d] against keys
// k [b, groups, sk, d]. Grouped-query attention without repeating the keys: a group's query heads are stacked along
// the rows of one matmul. `causal` masks the rank's own block, whose local order is increasing in global position,
// so that the global causal mask is its lower triangle.
torch::Tensor block_scores(const torch::Tensor& q5, const torch::Tensor& k, double scale, bool causal) {
  const int64_t b = q5.size(0), groups = q5.size(1), per_group = q5.size(2), sq = q5.size(3), d = q5.size(4);
  const int64_t sk = k.size(2);
  torch::Tensor scores = torch::matmul(q5.reshape({b, groups, per_group * sq, d}), k.transpose(-2, -1))
                             .mul_(scale)
                             .view({b, groups, per_group, sq, sk});
  if (causal) {
    const torch::Tensor hidden =
        torch::ones({sq, sk}, torch::TensorOptions().dtype(torch::kBool).device(scores.device())).triu(1);
    scores.masked_fill_(hidden, -std::numeric_limits<double>::infinity());
  }
  return scores;
}

// q [b, heads, sq, d] as [b, groups, per_group, sq, d] for keys of `groups` heads.
torch::Tensor per_group(const torch::Tensor& q, int64_t groups) {
  return q.reshape({q.size(0), groups, q.size(1) / groups, q.size(2), q.size(3)});
}

Partial block_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double scale,
                      bool causal) {
  const torch::Tensor q5 = per_group(q, k.size(1));
  torch::Tensor probs = block_scores(q5, k, scale, causal);
  torch::Tensor lse = probs.logsumexp(-1);
  probs.sub_(lse.unsqueeze(-1)).exp_();
  const int64_t b = q5.size(0), groups = q5.size(1), per_group = q5.size(2), sq = q5.size(3);
  torch::Tensor out = torch::matmul(probs.view({b, groups, per_group * sq, k.size(2)}), v);
  return {out.view({b, groups * per_group, sq, v.size(-1)}), lse.view({b, groups * per_group, sq})};
}

// The gradients of one block from the final log-sum-exp of its query rows and delta = rowsum(dO * O):
// P = exp(S - lse), dV = P^T dO, dS = P * (dO V^T - delta), dQ = dS K scale, dK = dS^T Q scale.
BlockGrads block_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const torch::Tensor& dout, const torch::Tensor& out, const torch::Tensor& lse, double scale,
                          bool causal) {
  const torch::Tensor q5 = per_group(q, k.size(1));
  const int64_t b = q5.size(0), groups = q5.size(1), per_group = q5.size(2), sq = q5.size(3), d = q5.size(4);
  const int64_t sk = k.size(2);
  const torch::Tensor delta = (dout * out).sum(-1).view({b, groups, per_group, sq});
  const torch::Tensor probs =
      block_scores(q5, k, scale, causal).sub_(lse.reshape({b, groups, per_group, sq}).unsqueeze(-1)).exp_();
  const torch::Tensor probs2 = probs.view({b, groups, per_group * sq, sk});
  const torch::Tensor dout2 = dout.reshape({b, groups, per_group * sq, d});
  BlockGrads grads;
  grads.dv = torch::matmul(probs2.transpose(-2, -1), dout2);
  const torch::Tensor dscores = torch::matmul(dout2, v.transpose(-2, -1))
                                    .view({b, groups, per_group, sq, sk})
                                    .sub_(delta.unsqueeze(-1))
                                    .mul_(probs)
                                    .view({b, groups, per_group * sq, sk});
  grads.dq = torch::matmul(dscores, k).mul_(scale).view({b, groups * per_group, sq, d});
  grads.dk = torch::matmul(dscores.transpose(-2, -1), q5.reshape({b, groups, per_group * sq, d})).mul_(scale);
  return grads;
}
#endif

// Merges `part` into the running (out, lse) of the same rows, in place: each side weighted by its share of the
// combined softmax denominator, exp(its lse - the combined lse).
void merge(torch::Tensor out, torch::Tensor lse, const Partial& part) {
  const torch::Tensor combined = torch::logaddexp(lse, part.lse);
  out.mul_((lse - combined).exp_().unsqueeze(-1)).add_(part.out * (part.lse - combined).exp_().unsqueeze(-1));
  lse.copy_(combined);
}

// One hop of the ring in flight: `block` on its way to the next rank, the previous rank's arriving in `received`.
struct RingTransfer {
  torch::Tensor received;
  std::vector<Work> works;
};

RingTransfer start_transfer(ProcessGroup& group, const torch::Tensor& block, int tag) {
  const int next = (group.rank() + 1) % group.size();
  const int prev = (group.rank() + group.size() - 1) % group.size();
  RingTransfer transfer{torch::empty_like(block, at::MemoryFormat::Contiguous), {}};
  // One batch, the send first on every rank: NCCL then pairs each send with its neighbour's receive even when next
  // and prev are the same rank (cp = 2); Gloo starts both at once.
  std::vector<P2POp> ops;
  ops.push_back({P2POp::Kind::kSend, block, next, tag});
  ops.push_back({P2POp::Kind::kRecv, transfer.received, prev, tag});
  transfer.works = group.batch_isend_irecv(std::move(ops));
  return transfer;
}

class RingAttention : public torch::autograd::Function<RingAttention> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, ProcessGroup* group, double scale) {
    const int cp = group->size(), rank = group->rank();
    const auto acc = accumulation_type(q.scalar_type());
    const int64_t chunk = q.size(2) / 2;
    const torch::Tensor qa = q.to(acc);
    // Keys and values travel as one tensor in their own dtype: one send per hop, no widening on the wire.
    torch::Tensor block = torch::stack({k, v}).contiguous();
    torch::Tensor out, lse;
    for (int step = 0; step < cp; ++step) {
      const bool more = step + 1 < cp;
      RingTransfer transfer;
      if (more) {
        transfer = start_transfer(*group, block, kForwardTag);
        record(false, step, RingEvent::Kind::kStartTransfer);
      }
      const int source = (rank - step + cp) % cp;
      const torch::Tensor key = block[0].to(acc), value = block[1].to(acc);
      if (step == 0) {
        Partial own = block_forward(qa, key, value, scale, /*causal=*/true);
        out = std::move(own.out);
        lse = own.lse.contiguous();
      } else if (source < rank) {
        merge(out, lse, block_forward(qa, key.narrow(2, 0, chunk), value.narrow(2, 0, chunk), scale, false));
      } else {
        merge(out.narrow(2, chunk, chunk), lse.narrow(2, chunk, chunk),
              block_forward(qa.narrow(2, chunk, chunk), key, value, scale, false));
      }
      record(false, step, RingEvent::Kind::kCompute);
      if (more) {
        wait_all(transfer.works);
        block = std::move(transfer.received);
        record(false, step, RingEvent::Kind::kWaitTransfer);
      }
    }
    torch::Tensor result = out.to(q.scalar_type());
    ctx->save_for_backward({q, k, v, result, lse});
    ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupHandle>(*group));
    ctx->saved_data["scale"] = scale;
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    ProcessGroup& group = *static_cast<GroupHandle*>(ctx->saved_data["group"].toCapsule().get())->group;
    const double scale = ctx->saved_data["scale"].toDouble();
    const int cp = group.size(), rank = group.rank();
    const auto acc = accumulation_type(q.scalar_type());
    const int64_t chunk = q.size(2) / 2;
    const torch::Tensor qa = q.to(acc), outa = out.to(acc);
    const torch::Tensor dout = grad_outputs[0].to(acc).contiguous();
    torch::Tensor dq = torch::zeros_like(qa);
    torch::Tensor block = torch::stack({k, v}).contiguous();
    RingTransfer grad_transfer;  // the previous step's key/value gradients, on their way to the next rank
    for (int step = 0; step < cp; ++step) {
      const bool more = step + 1 < cp;
      RingTransfer transfer;
      if (more) {
        transfer = start_transfer(group, block, kBackwardBlockTag);
        record(true, step, RingEvent::Kind::kStartTransfer);
      }
      const int source = (rank - step + cp) % cp;
      const torch::Tensor key = block[0].to(acc), value = block[1].to(acc);
      // This rank's share of the block's gradients, stacked as the block is (keys, values); fp32 on the wire, so
      // that cp partial sums add up without rounding to bf16 in between.
      torch::Tensor dblock = torch::zeros({2, k.size(0), k.size(1), k.size(2), k.size(3)}, qa.options());
      if (step == 0) {
        const BlockGrads g = block_backward(qa, key, value, dout, outa, lse, scale, /*causal=*/true);
        dq.add_(g.dq);
        dblock[0].copy_(g.dk);
        dblock[1].copy_(g.dv);
      } else if (source < rank) {
        const BlockGrads g =
            block_backward(qa, key.narrow(2, 0, chunk), value.narrow(2, 0, chunk), dout, outa, lse, scale, false);
        dq.add_(g.dq);
        dblock[0].narrow(2, 0, chunk).copy_(g.dk);
        dblock[1].narrow(2, 0, chunk).copy_(g.dv);
      } else {
        const BlockGrads g = block_backward(qa.narrow(2, chunk, chunk), key, value, dout.narrow(2, chunk, chunk),
                                            outa.narrow(2, chunk, chunk), lse.narrow(2, chunk, chunk), scale, false);
        dq.narrow(2, chunk, chunk).add_(g.dq);
        dblock[0].copy_(g.dk);
        dblock[1].copy_(g.dv);
      }
      record(true, step, RingEvent::Kind::kCompute);
      if (step > 0) {  // the gradients the previous ranks computed for this same block
        wait_all(grad_transfer.works);
        dblock.add_(grad_transfer.received);
      }
      grad_transfer = start_transfer(group, dblock, kBackwardGradTag);
      if (more) {
        wait_all(transfer.works);
        block = std::move(transfer.received);
        record(true, step, RingEvent::Kind::kWaitTransfer);
      }
    }
    // The last hop brings this rank's own block's gradients home, summed over every rank's queries.
    wait_all(grad_transfer.works);
    const torch::Tensor& dblock = grad_transfer.received;
    return {dq.to(q.scalar_type()), dblock[0].to(k.scalar_type()), dblock[1].to(v.scalar_type()), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor ring_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             ProcessGroup& group, double scale) {
  return RingAttention::apply(q, k, v, &group, scale);
}

}  // namespace detail
}  // namespace bridge::parallel::context_parallel
