// The GPT transformer layer: attention with heads and key/value groups split across tensor-parallel ranks, and the
// MLP.
#include "bridge/models/transformer_layer.h"

#include <torch/version.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "parallel/context_parallel/attention.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/mappings.h"
#include "parallel/tensor_parallel/param_attributes.h"
#include "parallel/tensor_parallel/random.h"

namespace bridge::models {
namespace tp = parallel::tensor_parallel;

namespace {

// FNV-1a: a hash that is the same on every platform and run, unlike std::hash.
uint64_t stable_hash(const std::string& text) {
  uint64_t hash = 1469598103934665603ULL;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ULL;
  }
  return hash;
}

// SplitMix64's finaliser: nearby inputs give unrelated seeds.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

double output_layer_std(const GPTConfig& config) {
  return config.init_method_std / std::sqrt(2.0 * static_cast<double>(config.num_layers));
}

std::string layer_prefix(int64_t layer_number) { return "decoder.layers." + std::to_string(layer_number) + "."; }

// Megatron's core attention, q, k, v ([b, heads or groups, s, head_dim]) to the context [b, heads, s, head_dim]: what
// selective recomputation (core_attn) runs twice. `causal_mask` caches the [s, s] mask of the unfused path. Dropout
// draws from the tracker's per-rank stream: in a fork of its own, or in the caller's (`in_rng_fork`: under sequence
// parallelism the whole block runs in one, as Megatron-Core's TransformerBlock).
torch::Tensor core_attention(const torch::Tensor& q, torch::Tensor k, torch::Tensor v,
                             const torch::Tensor& attention_mask, double dropout, AttnBackend backend, bool in_rng_fork,
                             torch::Tensor& causal_mask) {
  const int64_t per_group = q.size(1) / k.size(1);
  if (per_group > 1) {  // grouped-query attention: query head i reads key/value head i / per_group
    k = k.repeat_interleave(per_group, /*dim=*/1);
    v = v.repeat_interleave(per_group, /*dim=*/1);
  }
#if TORCH_VERSION_MAJOR >= 2
  if (backend == AttnBackend::kAuto) {
    // SDPA draws its dropout mask from the default generator, as torch::dropout does (on CPU it is the same
    // softmax-then-dropout, mask for mask), so the fork gives it the same per-rank stream.
    const auto sdpa = [&] {
      if (attention_mask.defined()) {  // SDPA's boolean mask says where a query may look: the complement
        return at::scaled_dot_product_attention(q, k, v, attention_mask.logical_not(), dropout, /*is_causal=*/false);
      }
      return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, dropout, /*is_causal=*/true);
    };
    return tp::with_rng_fork(dropout > 0.0 && !in_rng_fork, sdpa);
  }
#else
  (void)backend;
#endif
  const int64_t s = q.size(2);
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(3)));
  if (!attention_mask.defined() && (causal_mask.size(0) != s || causal_mask.device() != scores.device())) {
    causal_mask = torch::ones({s, s}, torch::TensorOptions().dtype(torch::kBool).device(scores.device())).triu(1);
  }
  const torch::Tensor& future = attention_mask.defined() ? attention_mask : causal_mask;
  torch::Tensor probs = torch::softmax(scores.masked_fill(future, -std::numeric_limits<double>::infinity()), -1);
  if (dropout == 0.0) return torch::matmul(probs, v);
  // The heads differ across tensor-parallel ranks, so their dropout masks come from the per-rank stream.
  return tp::with_rng_fork(!in_rng_fork,
                           [&] { return torch::matmul(torch::dropout(probs, dropout, /*train=*/true), v); });
}

}  // namespace

tp::InitMethod init_method_for(const GPTConfig& config, const std::string& name, double std) {
  return tp::init_method_normal(std, mix(config.init_seed ^ stable_hash(name)));
}

SelfAttentionImpl::SelfAttentionImpl(const GPTConfig& config, const std::string& prefix)
    : local_heads_(config.num_attention_heads / parallel::get_tensor_model_parallel_world_size()),
      local_groups_(config.query_groups() / parallel::get_tensor_model_parallel_world_size()),
      head_dim_(config.head_dim()),
      attention_dropout_(config.attention_dropout),
      attention_backend_(config.attention_backend),
      qk_norm_across_heads_(config.qk_layernorm_across_heads),
      layernorm_epsilon_(config.layernorm_epsilon),
      recompute_core_attention_(config.recomputes("core_attn")),
      sequence_parallel_(uses_sequence_parallel(config, parallel::get_tensor_model_parallel_world_size())),
      context_parallel_(parallel::get_context_parallel_group().size() > 1),
      cp_comm_type_(config.cp_comm_type) {
  const int64_t h = config.hidden_size;
  // The master QKV weight is grouped by key/value head, [q..q k v] per group: stride 1 gives each rank whole groups.
  tp::ColumnParallelLinearOptions qkv(h, config.qkv_size());
  qkv.bias = config.qkv_bias();
  qkv.gradient_accumulation_fusion = config.gradient_accumulation_fusion;
  qkv.sequence_parallel = sequence_parallel_;
  qkv.init_method = init_method_for(config, prefix + "linear_qkv.weight", config.init_method_std);
  linear_qkv = register_module("linear_qkv", tp::ColumnParallelLinear(qkv));
  tp::RowParallelLinearOptions proj(config.query_projection_size(), h);
  proj.bias = config.add_bias_linear;
  proj.gradient_accumulation_fusion = config.gradient_accumulation_fusion;
  proj.sequence_parallel = sequence_parallel_;
  proj.init_method = init_method_for(config, prefix + "linear_proj.weight", output_layer_std(config));
  linear_proj = register_module("linear_proj", tp::RowParallelLinear(proj));
  if (config.qk_layernorm && qk_norm_across_heads_) {
    // This rank's heads' share of weights [heads x head_dim] and [groups x head_dim], split as linear_qkv's heads.
    q_layernorm =
        register_module("q_layernorm", Norm(config.normalization, local_heads_ * head_dim_, config.layernorm_epsilon));
    k_layernorm =
        register_module("k_layernorm", Norm(config.normalization, local_groups_ * head_dim_, config.layernorm_epsilon));
    if (parallel::get_tensor_model_parallel_world_size() > 1) {
      for (const Norm& norm : {q_layernorm, k_layernorm}) {
        tp::ParamAttributes attributes;
        attributes.tensor_model_parallel = true;
        attributes.partition_dim = 0;
        tp::set_param_attributes(norm->weight, attributes);
      }
    }
  } else if (config.qk_layernorm) {
    q_layernorm = register_module("q_layernorm", Norm(config.normalization, head_dim_, config.layernorm_epsilon));
    k_layernorm = register_module("k_layernorm", Norm(config.normalization, head_dim_, config.layernorm_epsilon));
  }
}

torch::Tensor SelfAttentionImpl::norm_across_heads(const torch::Tensor& heads, const Norm& norm) const {
  // [s, b, n, d] -> one RMSNorm over the n x d channels of all ranks: the sum of squares is all-reduced in forward
  // and, since every rank's normalised heads depend on it, its gradient is all-reduced in backward.
  const auto sizes = heads.sizes().vec();
  const torch::Tensor flat = heads.reshape({sizes[0], sizes[1], -1});
  const torch::Tensor x = flat.to(torch::kFloat);
  torch::Tensor sum_squares = x.square().sum(-1, /*keepdim=*/true);
  int64_t width = flat.size(-1);
  if (parallel::get_tensor_model_parallel_world_size() > 1) {
    sum_squares = tp::copy_to_tensor_model_parallel_region(tp::reduce_from_tensor_model_parallel_region(sum_squares));
    width *= parallel::get_tensor_model_parallel_world_size();
  }
  const torch::Tensor normalised =
      (x * torch::rsqrt(sum_squares / static_cast<double>(width) + layernorm_epsilon_)).to(flat.scalar_type());
  return (normalised * norm->weight).view(sizes);
}

torch::Tensor SelfAttentionImpl::forward(const torch::Tensor& hidden_states, const torch::Tensor& attention_mask,
                                         const RotaryTables* rotary) {
  // The whole sequence from here on: under sequence parallelism linear_qkv gathers it, linear_proj scatters it again.
  const torch::Tensor projected = linear_qkv(hidden_states);
  const int64_t s = projected.size(0);
  const int64_t b = projected.size(1);
  const int64_t per_group = local_heads_ / local_groups_;
  // [s, b, groups, per_group + 2, head_dim]: each group's query heads, then its key head and its value head.
  const torch::Tensor qkv = projected.view({s, b, local_groups_, per_group + 2, head_dim_});
  torch::Tensor q = qkv.narrow(3, 0, per_group).reshape({s, b, local_heads_, head_dim_});
  torch::Tensor k = qkv.select(3, per_group);
  torch::Tensor v = qkv.select(3, per_group + 1);
  if (q_layernorm && qk_norm_across_heads_) {
    q = norm_across_heads(q, q_layernorm);
    k = norm_across_heads(k, k_layernorm);
  } else if (q_layernorm) {
    q = q_layernorm(q);
    k = k_layernorm(k);
  }
  // -> [b, heads, s, head_dim]
  q = q.permute({1, 2, 0, 3});
  k = k.permute({1, 2, 0, 3});
  v = v.permute({1, 2, 0, 3});
  if (rotary != nullptr) {
    q = apply_rotary_pos_emb(q, *rotary);
    k = apply_rotary_pos_emb(k, *rotary);
  }
  const double dropout = is_training() ? attention_dropout_ : 0.0;
  const auto core = [this, attention_mask, dropout](const torch::autograd::variable_list& heads) {
    if (context_parallel_) {
      // This rank's two chunks of the sequence attend over the whole sequence's keys (causal by global position;
      // the config validation refuses attention dropout and document masks at cp > 1, which this attention lacks).
      return torch::autograd::variable_list{parallel::context_parallel::context_parallel_attention(
          heads[0], heads[1], heads[2], cp_comm_type_, parallel::get_context_parallel_group())};
    }
    return torch::autograd::variable_list{core_attention(heads[0], heads[1], heads[2], attention_mask, dropout,
                                                         attention_backend_, sequence_parallel_, causal_mask_)};
  };
  const torch::Tensor context =
      is_training() && recompute_core_attention_ ? tp::checkpoint(core, {q, k, v})[0] : core({q, k, v})[0];
  return linear_proj(context.permute({2, 0, 1, 3}).reshape({s, b, local_heads_ * head_dim_}));
}

TransformerLayerImpl::TransformerLayerImpl(const GPTConfig& config, int64_t layer_number)
    : layer_number_(layer_number),
      hidden_dropout_(config.hidden_dropout),
      recompute_mlp_(config.recomputes(is_moe_layer(config, layer_number) ? "moe" : "mlp")) {
  const std::string prefix = layer_prefix(layer_number);
  auto norm = [&] { return Norm(config.normalization, config.hidden_size, config.layernorm_epsilon); };
  input_layernorm = register_module("input_layernorm", norm());
  self_attention = register_module("self_attention", SelfAttention(config, prefix + "self_attention."));
  pre_mlp_layernorm = register_module("pre_mlp_layernorm", norm());
  if (is_moe_layer(config, layer_number)) {
    moe_layer = register_module("mlp", moe::MoELayer(config, layer_number));
  } else {
    mlp = register_module("mlp", MLP(config, prefix + "mlp."));
  }
  if (uses_sequence_parallel(config, parallel::get_tensor_model_parallel_world_size())) {
    for (const Norm& layer_norm : {input_layernorm, pre_mlp_layernorm}) tp::mark_sequence_parallel(*layer_norm);
  }
}

torch::Tensor TransformerLayerImpl::forward(const torch::Tensor& hidden_states, const torch::Tensor& attention_mask,
                                            const RotaryTables* rotary) {
  // Dropout here acts on activations every tensor-parallel rank holds in full: the default stream, identical
  // across the group, keeps the replicas equal. Under sequence parallelism each rank holds its part of the
  // sequence and the whole block runs in the tracker's fork (GPTModel).
  const bool dropout = is_training() && hidden_dropout_ > 0.0;
  torch::Tensor attention = self_attention(input_layernorm(hidden_states), attention_mask, rotary);
  if (dropout) attention = torch::dropout(attention, hidden_dropout_, /*train=*/true);
  torch::Tensor residual = hidden_states + attention;
  const torch::Tensor mlp_in = pre_mlp_layernorm(residual);
  // The checkpointed function runs again in backward, after this call has returned: it captures `this` only.
  const auto run_mlp = [this](const torch::autograd::variable_list& in) {
    return torch::autograd::variable_list{moe_layer ? moe_layer(in[0]) : mlp(in[0])};
  };
  torch::Tensor mlp_out = is_training() && recompute_mlp_ ? tp::checkpoint(run_mlp, {mlp_in})[0] : run_mlp({mlp_in})[0];
  if (dropout) mlp_out = torch::dropout(mlp_out, hidden_dropout_, /*train=*/true);
  return residual + mlp_out;
}

}  // namespace bridge::models
