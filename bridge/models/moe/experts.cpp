// SequentialMLP: this rank's routed experts, each over its contiguous slice of the permuted tokens.
#include "bridge/models/moe/experts.h"

#include <cmath>

#include "bridge/models/transformer_layer.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/grad_accumulation_fusion.h"
#include "parallel/tensor_parallel/param_attributes.h"

namespace bridge::models::moe {
namespace tp = parallel::tensor_parallel;

namespace {

// This expert tensor-parallel rank's rows of a master weight split along `dim` in `stride` interleaved blocks (the
// GLU fc1 is [gate; up]: each rank holds its rows of both), as the dense layers shard theirs.
torch::Tensor shard_of(const torch::Tensor& master, int64_t dim, int64_t stride, int64_t rank, int64_t size) {
  if (size == 1) return master.clone();
  std::vector<torch::Tensor> parts;
  for (const torch::Tensor& block : master.chunk(stride, dim)) parts.push_back(block.chunk(size, dim)[rank]);
  return torch::cat(parts, dim).contiguous();
}

}  // namespace

ExpertLinearImpl::ExpertLinearImpl(torch::Tensor weight_shard, bool gradient_accumulation_fusion)
    : gradient_accumulation_fusion_(gradient_accumulation_fusion) {
  weight = register_parameter("weight", std::move(weight_shard));
}

torch::Tensor ExpertLinearImpl::forward(const torch::Tensor& input) {
  // As the dense layers: the weight-gradient GEMM adds into the grad buffer (about a tenth of the experts' backward
  // on CPU, bench/moe_layer_bench's experts_fused).
  return tp::linear_with_grad_accumulation(input, weight, /*bias=*/{}, gradient_accumulation_fusion_);
}

ExpertMLPImpl::ExpertMLPImpl(torch::Tensor fc1_shard, torch::Tensor fc2_shard, bool gradient_accumulation_fusion) {
  linear_fc1 = register_module("linear_fc1", ExpertLinear(std::move(fc1_shard), gradient_accumulation_fusion));
  linear_fc2 = register_module("linear_fc2", ExpertLinear(std::move(fc2_shard), gradient_accumulation_fusion));
}

SequentialMLPImpl::SequentialMLPImpl(const GPTConfig& config, int64_t layer_number)
    : activation_func_(config.activation_func), gated_(config.gated_linear_unit) {
  const int64_t ep = parallel::get_expert_model_parallel_world_size();
  const int64_t etp = parallel::get_expert_tensor_parallel_world_size();
  const int64_t etp_rank = parallel::get_expert_tensor_parallel_rank();
  num_local_experts_ = *config.num_moe_experts / ep;
  first_expert_ = parallel::get_expert_model_parallel_rank() * num_local_experts_;
  const int64_t h = config.hidden_size;
  const int64_t ffn = config.moe_ffn_size();
  // Megatron-Core's expert params take the expert groups (allreduce false) once the expert layout differs from the
  // dense one; at ep 1 with etp = tp they are reduced and sharded as dense weights are.
  const bool expert_parallel = ep > 1 || etp != parallel::get_tensor_model_parallel_world_size();
  const double output_std = config.init_method_std / std::sqrt(2.0 * static_cast<double>(config.num_layers));
  local_experts = register_module("local_experts", torch::nn::ModuleList());
  for (int64_t k = 0; k < num_local_experts_; ++k) {
    const std::string prefix = "decoder.layers." + std::to_string(layer_number) + ".mlp.experts.local_experts." +
                               std::to_string(first_expert_ + k) + ".";
    torch::Tensor fc1 = torch::empty({(gated_ ? 2 : 1) * ffn, h});
    init_method_for(config, prefix + "linear_fc1.weight", config.init_method_std)(fc1);
    torch::Tensor fc2 = torch::empty({h, ffn});
    init_method_for(config, prefix + "linear_fc2.weight", output_std)(fc2);
    ExpertMLP expert(shard_of(fc1, 0, gated_ ? 2 : 1, etp_rank, etp), shard_of(fc2, 1, 1, etp_rank, etp),
                     config.gradient_accumulation_fusion);
    const auto mark = [&](const torch::Tensor& weight, int64_t dim, int64_t stride) {
      tp::ParamAttributes attributes;
      attributes.tensor_model_parallel = etp > 1;
      attributes.partition_dim = etp > 1 ? dim : -1;
      attributes.partition_stride = stride;
      attributes.allreduce = !expert_parallel;
      tp::set_param_attributes(weight, attributes);
    };
    mark(expert->linear_fc1->weight, 0, gated_ ? 2 : 1);
    mark(expert->linear_fc2->weight, 1, 1);
    local_experts->push_back(expert);
  }
}

torch::Tensor SequentialMLPImpl::forward(const torch::Tensor& tokens, const torch::Tensor& tokens_per_expert) {
  const auto* counts = tokens_per_expert.data_ptr<int64_t>();
  // One split for all experts: its backward is one cat, where a narrow per expert would each build a zero-filled
  // gradient of all the tokens.
  const std::vector<torch::Tensor> slices =
      tokens.split_with_sizes(c10::IntArrayRef(counts, static_cast<std::size_t>(num_local_experts_)), 0);
  std::vector<torch::Tensor> outputs;
  outputs.reserve(static_cast<std::size_t>(num_local_experts_));
  for (int64_t k = 0; k < num_local_experts_; ++k) {
    // An expert with no tokens still runs on its empty slice: every weight gets a (zero) gradient each step, so the
    // gradient buffers' hooks fire the same way on every rank.
    const auto& expert = local_experts[static_cast<std::size_t>(k)]->as<ExpertMLPImpl>();
    outputs.push_back(expert->linear_fc2(
        mlp_activation(expert->linear_fc1(slices[static_cast<std::size_t>(k)]), activation_func_, gated_)));
  }
  return torch::cat(outputs, 0);
}

}  // namespace bridge::models::moe
