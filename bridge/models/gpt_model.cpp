// GPTModel: embedding, this chunk's transformer layers, and the output layer with vocab-parallel loss.
#include "bridge/models/gpt_model.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/cross_entropy.h"
#include "parallel/tensor_parallel/grad_accumulation_fusion.h"
#include "parallel/tensor_parallel/mappings.h"
#include "parallel/tensor_parallel/param_attributes.h"
#include "parallel/tensor_parallel/random.h"
#include "parallel/tensor_parallel/vocab_utils.h"

namespace bridge::models {
namespace tp = parallel::tensor_parallel;
using parallel::distributed::wait_for_param_gather;

namespace {

constexpr const char* kWordEmbeddingName = "embedding.word_embeddings.weight";

// This rank's rows of a [padded_vocab, h] master weight initialised like the word embedding: the output layer's own
// copy on a last stage without the embedding starts equal to the first stage's embedding without communication.
torch::Tensor vocab_shard_of_master(const GPTConfig& config, int64_t padded_vocab, const std::string& name) {
  torch::Tensor master = torch::empty({padded_vocab, config.hidden_size});
  init_method_for(config, name, config.init_method_std)(master);
  const auto [start, end] = tp::vocab_range_from_global_vocab_size(
      padded_vocab, parallel::get_tensor_model_parallel_rank(), parallel::get_tensor_model_parallel_world_size());
  return master.slice(0, start, end).clone();
}

}  // namespace

GPTModelImpl::GPTModelImpl(const GPTConfig& config, const GPTChunkOptions& options)
    : config_(config),
      options_(options),
      padded_vocab_size_(tp::vocab_size_with_padding(config.vocab_size, config.make_vocab_size_divisible_by,
                                                     parallel::get_tensor_model_parallel_world_size())),
      sequence_parallel_(uses_sequence_parallel(config, parallel::get_tensor_model_parallel_world_size())) {
  torch::NoGradGuard no_grad;
  if (options.pre_process) {
    tp::VocabParallelEmbeddingOptions word(padded_vocab_size_, config.hidden_size);
    word.gradient_accumulation_fusion = config.gradient_accumulation_fusion;
    // Without learned positions to add first, the embedding's reduction can leave each rank its part of the sequence.
    word.reduce_scatter_embeddings =
        sequence_parallel_ && config.position_embedding_type != PositionEmbeddingType::kLearnedAbsolute;
    word.init_method = init_method_for(config, kWordEmbeddingName, config.init_method_std);
    word_embeddings = register_module("word_embeddings", tp::VocabParallelEmbedding(word));
    if (config.position_embedding_type == PositionEmbeddingType::kLearnedAbsolute) {
      position_embeddings =
          register_module("position_embeddings", torch::nn::Embedding(config.seq_length, config.hidden_size));
      torch::Tensor& positions = position_embeddings->weight;
      init_method_for(config, "embedding.position_embeddings.weight", config.init_method_std)(positions);
    }
  }
  if (config.rotary()) rotary_pos_emb_.emplace(config);
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < options.num_layers; ++i) layers->push_back(TransformerLayer(config, options.first_layer + i));
  if (options.post_process) {
    final_layernorm =
        register_module("final_layernorm", Norm(config.normalization, config.hidden_size, config.layernorm_epsilon));
    if (sequence_parallel_) tp::mark_sequence_parallel(*final_layernorm);
    const bool tied = config.share_embeddings_and_output_weights;
    if (!(tied && options.pre_process)) {
      output_weight = register_parameter(
          "output_weight",
          vocab_shard_of_master(config, padded_vocab_size_, tied ? kWordEmbeddingName : "output_layer.weight"));
      tp::ParamAttributes attributes;
      attributes.tensor_model_parallel = true;
      attributes.partition_dim = 0;
      attributes.shared_embedding = tied;  // the copy: counted once in the gradient norm
      tp::set_param_attributes(output_weight, attributes);
    }
  }
}

torch::Tensor GPTModelImpl::forward(const torch::Tensor& tokens, const torch::Tensor& position_ids,
                                    const torch::Tensor& labels, const torch::Tensor& attention_mask) {
  // Under sequence parallelism each rank's dropout masks its own part of the sequence: from the tracker's per-rank
  // stream, over the embedding and the whole block (Megatron-Core's TransformerBlock forks it likewise).
  const bool dropout = is_training() && (config_.hidden_dropout > 0.0 || config_.attention_dropout > 0.0);
  const bool fork_rng = sequence_parallel_ && dropout;
  torch::Tensor hidden;
  // Each module waits for its parameters' all-gather just before it runs (ddp.overlap_param_gather; free otherwise).
  if (options_.pre_process) {
    wait_for_param_gather(*word_embeddings);
    if (position_embeddings) wait_for_param_gather(*position_embeddings);
    hidden = word_embeddings(tokens);  // [s / tp, b, h] already when it reduce-scatters
    if (!word_embeddings->options.reduce_scatter_embeddings) {
      if (position_embeddings) hidden = hidden + position_embeddings(position_ids);
      hidden = hidden.transpose(0, 1).contiguous();
      if (sequence_parallel_) hidden = tp::scatter_to_sequence_parallel_region(hidden);
    }
    if (is_training() && config_.hidden_dropout > 0.0) {
      hidden = tp::with_rng_fork(fork_rng, [&] { return torch::dropout(hidden, config_.hidden_dropout, true); });
    }
  } else {
    if (!input_tensor_.defined()) {
      throw std::logic_error(
          "GPTModel chunk starting at layer " + std::to_string(options_.first_layer) +
          " has no input: a chunk without the embedding needs set_input_tensor() with the previous stage's output");
    }
    hidden = input_tensor_;
  }
  std::optional<RotaryTables> rotary;
  if (rotary_pos_emb_) rotary = rotary_pos_emb_->tables(position_ids);
  hidden = tp::with_rng_fork(fork_rng, [&] { return transformer_layers(hidden, attention_mask, rotary); });
  if (!options_.post_process) return hidden;

  wait_for_param_gather(*final_layernorm);
  wait_for_param_gather(shared_embedding_or_output_weight());
  hidden = final_layernorm(hidden);
  // A tied weight takes the embedding's gradient through autograd and this GEMM's straight into its main_grad. Under
  // sequence parallelism the GEMM gathers the sequence (the logits cover all of it) and reduce-scatters its gradient.
  torch::Tensor logits = tp::linear_with_grad_accumulation(
      sequence_parallel_ ? hidden : tp::copy_to_tensor_model_parallel_region(hidden),
      shared_embedding_or_output_weight(), /*bias=*/{}, config_.gradient_accumulation_fusion, sequence_parallel_);
  if (!labels.defined()) return logits.transpose(0, 1);
  // Cross entropy on fp32 logits also for a bf16/fp16 model, as Megatron (fp16_lm_cross_entropy off), in the logits'
  // own storage: nothing else reads them (the output layer's backward keeps its input and weight).
  return tp::vocab_parallel_cross_entropy(logits.to(torch::kFloat32), labels.transpose(0, 1), /*label_smoothing=*/0.0,
                                          /*inplace=*/true)
      .transpose(0, 1)
      .contiguous();
}

torch::Tensor GPTModelImpl::transformer_layers(torch::Tensor hidden, const torch::Tensor& attention_mask,
                                               const std::optional<RotaryTables>& rotary) {
  // Layers [begin, end) as one function of their input: a checkpointed run of full recomputation.
  const auto run = [this, attention_mask, rotary](int64_t begin, int64_t end) {
    return [this, attention_mask, rotary, begin, end](const torch::autograd::variable_list& inputs) {
      torch::Tensor x = inputs[0];
      for (int64_t i = begin; i < end; ++i) {
        wait_for_param_gather(*layers[i]);
        x = layers[i]->as<TransformerLayerImpl>()->forward(x, attention_mask, rotary ? &*rotary : nullptr);
      }
      return torch::autograd::variable_list{x};
    };
  };
  const auto count = static_cast<int64_t>(layers->size());
  if (!is_training() || config_.recompute_granularity != RecomputeGranularity::kFull) return run(0, count)({hidden})[0];
  // Megatron-Core's TransformerBlock._checkpointed_forward over this chunk's layers.
  const int64_t n = config_.recompute_num_layers.value_or(1);
  if (config_.recompute_method == RecomputeMethod::kUniform) {
    for (int64_t begin = 0; begin < count; begin += n) {
      hidden = tp::checkpoint(run(begin, std::min(begin + n, count)), {hidden})[0];
    }
    return hidden;
  }
  for (int64_t i = 0; i < count; ++i) {  // block: the first n layers checkpointed one by one
    hidden = i < n ? tp::checkpoint(run(i, i + 1), {hidden})[0] : run(i, i + 1)({hidden})[0];
  }
  return hidden;
}

torch::Tensor GPTModelImpl::shared_embedding_or_output_weight() const {
  if (options_.pre_process && config_.share_embeddings_and_output_weights) return word_embeddings->weight;
  if (options_.post_process) return output_weight;
  return {};
}

GPTChunkOptions gpt_chunk_options(const GPTConfig& config, int pp, int pp_rank, int vpp, int model_chunk) {
  const int64_t per_chunk = config.num_layers / (static_cast<int64_t>(pp) * vpp);
  GPTChunkOptions options;
  options.pre_process = pp_rank == 0 && model_chunk == 0;
  options.post_process = pp_rank == pp - 1 && model_chunk == vpp - 1;
  options.first_layer = (static_cast<int64_t>(model_chunk) * pp + pp_rank) * per_chunk;
  options.num_layers = per_chunk;
  return options;
}

std::vector<GPTModel> build_gpt_model(const GPTConfig& config) {
  const int pp = parallel::get_pipeline_model_parallel_world_size();
  const int vpp = parallel::get_virtual_pipeline_model_parallel_world_size().value_or(1);
  config.validate(parallel::get_tensor_model_parallel_world_size(), pp,
                  parallel::get_virtual_pipeline_model_parallel_world_size(),
                  parallel::get_expert_model_parallel_world_size(), parallel::get_expert_tensor_parallel_world_size());
  std::vector<GPTModel> chunks;
  for (int chunk = 0; chunk < vpp; ++chunk) {
    chunks.emplace_back(config,
                        gpt_chunk_options(config, pp, parallel::get_pipeline_model_parallel_rank(), vpp, chunk));
  }
  return chunks;
}

std::vector<std::pair<std::string, torch::Tensor>> global_named_parameters(const GPTModel& chunk) {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  const int64_t first_layer = chunk->chunk_options().first_layer;
  for (const auto& item : chunk->named_parameters()) {
    const std::string& local = item.key();
    std::string global;
    if (local.rfind("word_embeddings.", 0) == 0 || local.rfind("position_embeddings.", 0) == 0) {
      global = "embedding." + local;
    } else if (local.rfind("layers.", 0) == 0) {
      const std::size_t dot = local.find('.', 7);
      std::string rest = local.substr(dot);
      // Experts are named by their global index, as Megatron-Core's sharded state dict: rank r's local expert k is
      // expert r * E / ep + k.
      static const std::string kLocalExperts = ".mlp.experts.local_experts.";
      if (rest.rfind(kLocalExperts, 0) == 0) {
        const std::size_t end = rest.find('.', kLocalExperts.size());
        const int64_t local_expert = std::stoll(rest.substr(kLocalExperts.size(), end - kLocalExperts.size()));
        const int64_t per_rank = *chunk->config().num_moe_experts / parallel::get_expert_model_parallel_world_size();
        rest = kLocalExperts + std::to_string(parallel::get_expert_model_parallel_rank() * per_rank + local_expert) +
               rest.substr(end);
      }
      global = "decoder.layers." + std::to_string(first_layer + std::stoll(local.substr(7, dot - 7))) + rest;
    } else if (local.rfind("final_layernorm.", 0) == 0) {
      global = "decoder." + local;
    } else if (local == "output_weight") {
      global = "output_layer.weight";
    } else {
      global = local;
    }
    named.emplace_back(std::move(global), item.value());
  }
  return named;
}

std::vector<torch::Tensor> tensor_parallel_partial_weights(const std::vector<GPTModel>& chunks) {
  std::vector<torch::Tensor> weights;
  if (parallel::get_tensor_model_parallel_world_size() == 1) return weights;
  for (const GPTModel& chunk : chunks) {
    for (const auto& layer : *chunk->layers) {
      const SelfAttention& attention = layer->as<TransformerLayerImpl>()->self_attention;
      // Across heads the q/k norms are split with the heads (whole gradients per rank), not partial.
      if (!attention->q_layernorm || chunk->config().qk_layernorm_across_heads) continue;
      for (const Norm& norm : {attention->q_layernorm, attention->k_layernorm}) {
        for (const torch::Tensor& param : norm->parameters()) weights.push_back(param);
      }
    }
    // Under sequence parallelism: the norms and row-parallel biases, used on this rank's tokens only.
    for (const torch::Tensor& param : chunk->parameters()) {
      if (tp::get_param_attributes(param).sequence_parallel) weights.push_back(param);
    }
  }
  return weights;
}

void finalize_moe_routers(const std::vector<GPTModel>& chunks) {
  std::vector<moe::TopKRouterImpl*> biased;
  for (const GPTModel& chunk : chunks) {
    for (const auto& layer : *chunk->layers) {
      moe::MoELayer moe_layer = layer->as<TransformerLayerImpl>()->moe_layer;
      if (!moe_layer) continue;
      moe_layer->router->reset_global_tokens();
      if (moe_layer->router->expert_bias.defined()) biased.push_back(moe_layer->router.ptr().get());
    }
  }
  if (biased.empty()) return;
  std::vector<torch::Tensor> counts;
  for (moe::TopKRouterImpl* router : biased) counts.push_back(router->local_tokens_per_expert);
  torch::Tensor stacked = torch::stack(counts);
  // Megatron-Core sums the expert-bias counts over tp x dp x cp: the cp ranks hold different tokens of a sequence.
  parallel::get_tensor_and_data_parallel_group(/*with_context_parallel=*/true).all_reduce(stacked);
  for (std::size_t i = 0; i < biased.size(); ++i) biased[i]->update_expert_bias(stacked[static_cast<int64_t>(i)]);
}

std::vector<torch::Tensor> embedding_group_weights(const std::vector<GPTModel>& chunks) {
  std::vector<torch::Tensor> weights;
  if (parallel::get_pipeline_model_parallel_world_size() == 1) return weights;
  for (const GPTModel& chunk : chunks) {
    if (!chunk->config().share_embeddings_and_output_weights) continue;
    const GPTChunkOptions& options = chunk->chunk_options();
    if (options.pre_process || options.post_process) weights.push_back(chunk->shared_embedding_or_output_weight());
  }
  return weights;
}

}  // namespace bridge::models
