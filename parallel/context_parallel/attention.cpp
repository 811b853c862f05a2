// context_parallel_attention (attention.h): the argument checks, a group of one (plain causal attention), all_gather
// and a2a (Ulysses). The p2p ring, which needs an autograd function of its own, lives in ring_attention.cpp; the other
// two are compositions of autograd-aware collectives (tensor_parallel/mappings.h) around ordinary attention.
#include "parallel/context_parallel/attention.h"

#include <torch/version.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/context_parallel/ring_attention.h"
#include "parallel/tensor_parallel/mappings.h"

namespace bridge::parallel::context_parallel {
namespace {

std::string shape_of(const torch::Tensor& tensor) {
  std::ostringstream text;
  text << tensor.sizes();
  return text.str();
}

void check_inputs(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int cp_size) {
  const std::string where = "context_parallel_attention: ";
  const std::string shapes = " (q " + shape_of(q) + ", k " + shape_of(k) + ", v " + shape_of(v) + ")";
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) {
    throw std::invalid_argument(where + "q must be [b, heads, s_local, head_dim] and k, v [b, groups, s_local, " +
                                "head_dim]" + shapes + "; move the heads before the sequence");
  }
  if (k.sizes() != v.sizes() || q.size(0) != k.size(0) || q.size(2) != k.size(2) || q.size(3) != k.size(3)) {
    throw std::invalid_argument(where + "q, k and v must agree in batch, sequence and head_dim, and k and v in " +
                                "every dim" + shapes);
  }
  if (k.size(1) == 0 || q.size(1) % k.size(1) != 0) {
    throw std::invalid_argument(where + "the query heads (q's dim 1) must be a multiple of the key/value groups " +
                                "(k's dim 1)" + shapes + "; check num_attention_heads and num_query_groups");
  }
  if (k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type() || k.device() != q.device() ||
      v.device() != q.device()) {
    throw std::invalid_argument(where + "q, k and v must share one dtype and one device (q " +
                                std::string(c10::toString(q.scalar_type())) + ", k " + c10::toString(k.scalar_type()) +
                                ", v " + c10::toString(v.scalar_type()) + ")");
  }
  if (cp_size > 1 && q.size(2) % 2 != 0) {
    throw std::invalid_argument(where + "this rank's " + std::to_string(q.size(2)) +
                                " positions are not two equal chunks" + shapes +
                                "; split the sequence with get_tensor_on_this_cp_rank (a multiple of 2 x "
                                "context_parallel_size)");
  }
}

// Attention through autograd with an explicit mask `hidden` [sq, sk] (true: the query does not see the key), the
// softmax in fp32 (fp64 for fp64 inputs). Grouped-query attention without repeating the keys: a group's query heads
// are stacked along the rows of one matmul.
torch::Tensor masked_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& hidden, double scale) {
  const auto acc = q.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  const int64_t b = q.size(0), heads = q.size(1), sq = q.size(2), d = q.size(3);
  const int64_t groups = k.size(1), per_group = heads / groups, sk = k.size(2);
  const torch::Tensor scores =
      torch::matmul(q.to(acc).reshape({b, groups, per_group * sq, d}), k.to(acc).transpose(-2, -1))
          .mul(scale)
          .view({b, groups, per_group, sq, sk})
          .masked_fill(hidden, -std::numeric_limits<double>::infinity());
  const torch::Tensor probs = torch::softmax(scores, -1).view({b, groups, per_group * sq, sk});
  return torch::matmul(probs, v.to(acc)).view({b, heads, sq, d}).to(q.scalar_type());
}

// Causal attention over a sequence in its natural order.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double scale) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
  // Fused kernels where LibTorch has them (flash attention keeps no s x s matrix); enable_gqa came in 2.5.
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true, scale,
                                          /*enable_gqa=*/k.size(1) != q.size(1));
#else
  const torch::Tensor hidden =
      torch::ones({q.size(2), k.size(2)}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
  return masked_attention(q, k, v, hidden, scale);
#endif
}

// all_gather: every rank gathers the whole sequence's keys and values (in rank order, each rank's zigzag share) and
// masks by global positions. Keys and values go as one tensor, so one all-gather forward and one reduce-scatter of
// their gradients backward (each rank's queries contribute to every key's gradient).
torch::Tensor all_gather_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                   ProcessGroup& group, double scale) {
  const int cp = group.size();
  const int64_t s = q.size(2), seq_length = s * cp;
  // [2, b, groups, s, d] -> the sequence first, for the dim-0 gather -> back to [2, b, groups, cp s, d].
  const torch::Tensor local = torch::stack({k, v}).permute({3, 0, 1, 2, 4}).contiguous();
  const torch::Tensor gathered =
      tensor_parallel::gather_from_sequence_parallel_region(group, local, /*tensor_parallel_output_grad=*/true)
          .permute({1, 2, 3, 0, 4});
  std::vector<torch::Tensor> key_positions;
  for (int r = 0; r < cp; ++r) key_positions.push_back(positions_on_this_cp_rank(seq_length, cp, r));
  const torch::Tensor query_positions = positions_on_this_cp_rank(seq_length, cp, group.rank());
  const torch::Tensor hidden = (torch::cat(key_positions).unsqueeze(0) > query_positions.unsqueeze(1)).to(q.device());
  return masked_attention(q, gathered[0], gathered[1], hidden, scale);
}

// a2a (Ulysses): one all-to-all gives each rank heads / cp query heads and their key/value heads over the whole
// sequence, which it puts in natural order for plain causal attention; a second gives every rank its zigzag share
// of the sequence back for all heads. The autograd all-to-alls send the gradients back the same way.
torch::Tensor a2a_attention(const torch::Tensor& q, torch::Tensor k, torch::Tensor v, ProcessGroup& group,
                            double scale) {
  const int cp = group.size();
  const int64_t b = q.size(0), heads = q.size(1), s = q.size(2), d = q.size(3);
  if (heads % cp != 0) {
    throw std::invalid_argument(
        "context_parallel_attention (cp_comm_type a2a): this rank's " + std::to_string(heads) +
        " attention heads (num_attention_heads / tensor_model_parallel_size) do not divide by "
        "context_parallel_size = " +
        std::to_string(cp) +
        ": Ulysses gives each context-parallel rank an equal share of the heads; change num_attention_heads, "
        "tensor_model_parallel_size or context_parallel_size, or use cp_comm_type p2p or all_gather");
  }
  if (k.size(1) % cp != 0) {
    // Fewer key/value groups than ranks share them: repeat each group (a query head still reads the same one) up to
    // lcm(groups, cp), which divides heads since both groups and cp do.
    const int64_t repeats = std::lcm(k.size(1), static_cast<int64_t>(cp)) / k.size(1);
    k = k.repeat_interleave(repeats, 1);
    v = v.repeat_interleave(repeats, 1);
  }
  const int64_t q_heads = heads / cp, kv_heads = k.size(1) / cp;
  // Heads first, in cp blocks of this rank's q, k and v heads for rank j: one all-to-all for all three.
  auto by_destination = [&](const torch::Tensor& x) {
    return x.permute({1, 0, 2, 3}).reshape({cp, x.size(1) / cp, b, s, d});
  };
  const torch::Tensor packed = torch::cat({by_destination(q), by_destination(k), by_destination(v)}, 1)
                                   .reshape({cp * (q_heads + 2 * kv_heads), b, s, d});
  // Block i of what arrives is rank i's zigzag share of the sequence: restored to natural order along dim 2.
  const torch::Tensor arrived = tensor_parallel::all_to_all(group, packed).view({cp, q_heads + 2 * kv_heads, b, s, d});
  std::vector<torch::Tensor> shares;
  for (int r = 0; r < cp; ++r) shares.push_back(arrived[r]);
  const torch::Tensor whole = restore_from_cp_ranks(shares, /*seq_dim=*/2).permute({1, 0, 2, 3});
  const torch::Tensor context = causal_attention(whole.narrow(1, 0, q_heads), whole.narrow(1, q_heads, kv_heads),
                                                 whole.narrow(1, q_heads + kv_heads, kv_heads), scale);
  // Back: rank j gets its zigzag share of the sequence for this rank's heads, which land as heads block rank().
  const torch::Tensor by_rank = context.permute({1, 0, 2, 3});
  std::vector<torch::Tensor> outgoing;
  for (int r = 0; r < cp; ++r) outgoing.push_back(get_tensor_on_this_cp_rank(by_rank, /*seq_dim=*/2, cp, r));
  const torch::Tensor returned = tensor_parallel::all_to_all(group, torch::stack(outgoing).reshape({heads, b, s, d}));
  return returned.permute({1, 0, 2, 3}).contiguous();
}

}  // namespace

torch::Tensor context_parallel_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                         CpCommType comm_type, ProcessGroup& cp_group, double softmax_scale) {
  const int cp = cp_group.size();
  check_inputs(q, k, v, cp);
  const double scale = softmax_scale == 0.0 ? 1.0 / std::sqrt(static_cast<double>(q.size(3))) : softmax_scale;
  if (cp == 1) return causal_attention(q, k, v, scale);
  switch (comm_type) {
    case CpCommType::kP2P:
      return detail::ring_attention(q, k, v, cp_group, scale);
    case CpCommType::kAllGather:
      return all_gather_attention(q, k, v, cp_group, scale);
    case CpCommType::kA2A:
      return a2a_attention(q, k, v, cp_group, scale);
  }
  throw std::invalid_argument("context_parallel_attention: unknown cp_comm_type " +
                              std::to_string(static_cast<int>(comm_type)));
}

}  // namespace bridge::parallel::context_parallel
