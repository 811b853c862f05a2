// The allgather and alltoall token dispatchers over c10d (parallel::ProcessGroup, tensor_parallel mappings).
#include "bridge/models/moe/token_dispatcher.h"

#include <numeric>
#include <vector>

#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/mappings.h"

namespace bridge::models::moe {
namespace {

namespace tp = parallel::tensor_parallel;

std::vector<int64_t> to_vector(const torch::Tensor& counts) {
  const torch::Tensor host = counts.to(torch::kCPU, torch::kLong).contiguous();
  return {host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel()};
}

// Megatron-Core's MoEAllGatherTokenDispatcher.
class AllGatherDispatcher final : public MoETokenDispatcher {
 public:
  AllGatherDispatcher(int64_t num_experts, int64_t num_local_experts, int64_t first_expert)
      : num_experts_(num_experts), num_local_experts_(num_local_experts), first_expert_(first_expert) {}

  DispatchedTokens dispatch(const torch::Tensor& hidden, const Routing& routing) override {
    parallel::ProcessGroup& group = parallel::get_expert_tensor_and_model_parallel_group();
    torch::Tensor tokens = hidden;
    torch::Tensor probs = routing.probs.to(hidden.scalar_type());
    torch::Tensor map = routing.routing_map;
    if (group.size() > 1) {
      // Gradients of the gathered tokens and probabilities are partial per rank (each rank's experts only): the
      // backward reduce-scatters them.
      tokens = tp::gather_from_sequence_parallel_region(group, tokens, /*tensor_parallel_output_grad=*/true);
      probs = tp::gather_from_sequence_parallel_region(group, probs, /*tensor_parallel_output_grad=*/true);
      std::vector<torch::Tensor> maps = group.all_gather(map.to(torch::kUInt8));
      map = torch::cat(maps, 0).to(torch::kBool);
    }
    num_tokens_ = tokens.size(0);
    const torch::Tensor local_map = map.narrow(1, first_expert_, num_local_experts_);
    const torch::Tensor local_probs = probs.narrow(1, first_expert_, num_local_experts_);
    Permutation permuted = permute(tokens, local_probs, local_map);
    sorted_indices_ = permuted.sorted_indices;
    permuted_probs_ = permuted.probs;
    return {permuted.tokens, permuted.tokens_per_expert};
  }

  torch::Tensor combine(const torch::Tensor& expert_output) override {
    torch::Tensor output = unpermute(expert_output * permuted_probs_.unsqueeze(-1), sorted_indices_, num_tokens_);
    parallel::ProcessGroup& group = parallel::get_expert_tensor_and_model_parallel_group();
    if (group.size() > 1) output = tp::reduce_scatter_to_sequence_parallel_region(group, output);
    return output;
  }

 private:
  int64_t num_experts_, num_local_experts_, first_expert_;
  int64_t num_tokens_ = 0;
  torch::Tensor sorted_indices_, permuted_probs_;
};

// Megatron-Core's MoEAlltoAllTokenDispatcher at expert tensor-parallel size 1.
class AllToAllDispatcher final : public MoETokenDispatcher {
 public:
  AllToAllDispatcher(int64_t num_experts, int64_t num_local_experts, int64_t first_expert)
      : num_experts_(num_experts), num_local_experts_(num_local_experts), first_expert_(first_expert) {}

  DispatchedTokens dispatch(const torch::Tensor& hidden, const Routing& routing) override {
    parallel::ProcessGroup& group = parallel::get_expert_model_parallel_group();
    const int64_t ep = group.size();
    num_tokens_ = hidden.size(0);
    Permutation permuted = permute(hidden, routing.probs.to(hidden.scalar_type()), routing.routing_map);
    sorted_indices_ = permuted.sorted_indices;
    permuted_probs_ = permuted.probs;
    // Tokens this rank sends to each expert-parallel rank (experts are contiguous per rank), and what every rank
    // sends to each expert: one all-gather of the per-expert counts.
    const torch::Tensor local_counts = permuted.tokens_per_expert;  // [E] CPU int64
    input_splits_ = to_vector(local_counts.view({ep, num_local_experts_}).sum(1));
    const torch::Tensor all_counts = torch::stack(group.all_gather(local_counts), 0);                  // [ep, E]
    const torch::Tensor to_me = all_counts.narrow(1, first_expert_, num_local_experts_).contiguous();  // [ep, E_local]
    output_splits_ = to_vector(to_me.sum(1));
    torch::Tensor received = tp::all_to_all(group, permuted.tokens, output_splits_, input_splits_);
    // Arrived as [source rank][local expert] chunks; the experts want [local expert][source rank].
    chunk_sizes_ = to_vector(to_me.reshape({-1}));
    if (num_local_experts_ > 1) received = sort_chunks(received, chunk_sizes_, ep, num_local_experts_);
    return {received, to_me.sum(0).contiguous()};
  }

  torch::Tensor combine(const torch::Tensor& expert_output) override {
    parallel::ProcessGroup& group = parallel::get_expert_model_parallel_group();
    const int64_t ep = group.size();
    torch::Tensor output = expert_output;
    if (num_local_experts_ > 1) {
      // Back to [source rank][local expert]: the chunk sizes in the experts' order are the transpose.
      std::vector<int64_t> by_expert(chunk_sizes_.size());
      for (int64_t r = 0; r < ep; ++r) {
        for (int64_t e = 0; e < num_local_experts_; ++e) {
          by_expert[static_cast<std::size_t>(e * ep + r)] =
              chunk_sizes_[static_cast<std::size_t>(r * num_local_experts_ + e)];
        }
      }
      output = sort_chunks(output, by_expert, num_local_experts_, ep);
    }
    output = tp::all_to_all(group, output, input_splits_, output_splits_);
    return unpermute(output * permuted_probs_.unsqueeze(-1), sorted_indices_, num_tokens_);
  }

 private:
  // Megatron-Core's sort_chunks_by_idxs for a [rows][cols] grid of chunks (sizes row-major): returns them
  // column-major, [cols][rows].
  static torch::Tensor sort_chunks(const torch::Tensor& input, const std::vector<int64_t>& sizes, int64_t rows,
                                   int64_t cols) {
    const std::vector<torch::Tensor> chunks = input.split_with_sizes(sizes, 0);
    std::vector<torch::Tensor> ordered;
    ordered.reserve(chunks.size());
    for (int64_t c = 0; c < cols; ++c) {
      for (int64_t r = 0; r < rows; ++r) ordered.push_back(chunks[static_cast<std::size_t>(r * cols + c)]);
    }
    return torch::cat(ordered, 0);
  }

  int64_t num_experts_, num_local_experts_, first_expert_;
  int64_t num_tokens_ = 0;
  torch::Tensor sorted_indices_, permuted_probs_;
  std::vector<int64_t> input_splits_, output_splits_, chunk_sizes_;
};

}  // namespace

std::unique_ptr<MoETokenDispatcher> make_token_dispatcher(const GPTConfig& config) {
  const int64_t experts = *config.num_moe_experts;
  const int64_t local = experts / parallel::get_expert_model_parallel_world_size();
  const int64_t first = parallel::get_expert_model_parallel_rank() * local;
  switch (config.moe_token_dispatcher_type) {
    case MoETokenDispatcherType::kAlltoall:
      return std::make_unique<AllToAllDispatcher>(experts, local, first);
    case MoETokenDispatcherType::kAllgather:
      break;
  }
  return std::make_unique<AllGatherDispatcher>(experts, local, first);
}

}  // namespace bridge::models::moe
