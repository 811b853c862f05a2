// forward_logits: one forward-only pass of the pipeline schedule.
#include "training/inference.h"

#include <numeric>
#include <utility>

#include "parallel/context_parallel/utils.h"
#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "parallel/pipeline_parallel/schedules.h"
#include "parallel/tensor_parallel/mappings.h"

namespace bridge::training {
namespace pp = parallel::pipeline_parallel;
namespace context_parallel = parallel::context_parallel;

torch::Tensor forward_logits(const std::vector<models::GPTModelImpl*>& chunks, const torch::Tensor& tokens,
                             torch::Dtype dtype, const torch::Tensor& positions) {
  if (chunks.empty()) throw std::invalid_argument("forward_logits: no model chunks");
  const models::GPTConfig& config = chunks.front()->config();
  const int64_t batch = tokens.size(0), seq_length = tokens.size(1);
  if (seq_length > config.seq_length) {
    throw std::invalid_argument("forward_logits: " + std::to_string(seq_length) + " tokens per row, the model embeds " +
                                std::to_string(config.seq_length) + " positions (model.seq_length)");
  }
  const torch::Device device = chunks.front()->parameters().front().device();
  const bool distributed = parallel::is_distributed_initialized();
  const int pipeline_size = distributed ? parallel::get_pipeline_model_parallel_world_size() : 1;
  const bool virtual_pipeline =
      distributed && parallel::get_virtual_pipeline_model_parallel_world_size().value_or(1) > 1;
  // Context parallelism splits the sequence into 2 cp pieces, two per cp rank, and sequence parallelism each rank's
  // part over the tensor-parallel ranks: a prompt of any length is padded at the end to a length they divide, which
  // the causal mask keeps from the real positions (model.seq_length is such a multiple).
  const int tp = distributed ? parallel::get_tensor_model_parallel_world_size() : 1;
  const int cp = distributed ? parallel::get_context_parallel_group().size() : 1;
  const bool sequence_parallel = models::uses_sequence_parallel(config, tp);
  const int64_t pieces = cp > 1 ? int64_t{2} * cp : 1;
  const int64_t multiple = std::lcm(pieces, int64_t{cp} * (sequence_parallel ? tp : 1));
  const int64_t padded_length = (seq_length + multiple - 1) / multiple * multiple;
  torch::Tensor input = tokens.to(device, torch::kInt64);
  if (padded_length > seq_length) input = torch::constant_pad_nd(input, {0, padded_length - seq_length}, 0);
  torch::Tensor position_ids = torch::arange(padded_length, torch::dtype(torch::kInt64).device(device))
                                   .unsqueeze(0)
                                   .expand({batch, padded_length})
                                   .contiguous();
  const int cp_rank = cp > 1 ? parallel::get_context_parallel_group().rank() : 0;
  // Each cp rank runs its chunks (positions global), as training's DataIterator gives them.
  input = context_parallel::get_tensor_on_this_cp_rank(input, /*seq_dim=*/1, cp, cp_rank);
  position_ids = context_parallel::get_tensor_on_this_cp_rank(position_ids, /*seq_dim=*/1, cp, cp_rank);
  const torch::Tensor rows = torch::arange(batch, torch::dtype(torch::kInt64).device(device));
  const torch::Tensor kept = positions.defined() ? positions.to(device, torch::kInt64) : torch::Tensor();

  pp::ForwardBackwardOptions schedule;
  for (models::GPTModelImpl* chunk : chunks) {
    schedule.set_input_tensor.emplace_back([chunk](const torch::Tensor& in) { chunk->set_input_tensor(in); });
  }
  schedule.num_microbatches = virtual_pipeline ? pipeline_size : 1;
  if (virtual_pipeline) schedule.microbatch_group_size_per_vp_stage = pipeline_size;
  schedule.tensor_shape = {padded_length / cp / (sequence_parallel ? tp : 1), batch, config.hidden_size};
  schedule.dtype = dtype;
  schedule.device = device;
  schedule.forward_only = true;
  torch::Tensor logits;  // [b, s or -, vocab / tp] on the last stage
  schedule.forward_step_func = [&](int64_t microbatch, int64_t chunk) {
    torch::Tensor output = chunks[static_cast<std::size_t>(chunk)]->forward(input, position_ids);
    pp::LossFunc loss = [&, microbatch](const torch::Tensor& out) {
      if (microbatch == 0) {
        // Under context parallelism the rows' positions are picked once the ranks' chunks are put back in order.
        logits = cp > 1 ? out : kept.defined() ? out.index({rows, kept}) : out.narrow(1, 0, seq_length);
      }
      return pp::LossOutput{torch::zeros({}, out.options().dtype(torch::kFloat)), {}, {}};
    };
    return std::pair{output, loss};
  };
  torch::NoGradGuard no_grad;
  pp::get_forward_backward_func()(schedule);
  if (!logits.defined()) return logits;
  if (distributed) logits = parallel::tensor_parallel::gather_from_tensor_model_parallel_region(logits);
  if (cp > 1) {
    // Every rank of a cp group is on the last stage together: each gets the whole sequence's logits.
    logits =
        context_parallel::restore_from_cp_ranks(parallel::get_context_parallel_group().all_gather(logits.contiguous()),
                                                /*seq_dim=*/1);
    logits = kept.defined() ? logits.index({rows, kept}) : logits.narrow(1, 0, seq_length);
  }
  return logits.to(torch::kCPU, torch::kFloat);
}

}  // namespace bridge::training
