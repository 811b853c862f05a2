// GPTModel: one model chunk of a Megatron-style GPT (Megatron-Core's GPTModel). The first pipeline stage embeds the
// tokens (vocab-parallel word embedding, plus learned positions when the model has them), every chunk runs its share
// of the transformer layers (with RoPE, each chunk computes the rotary tables of the batch's positions), and the last
// stage applies the final norm and the output layer (tied to the word embedding, or its own), producing
// vocab-parallel logits or, given labels, the per-token loss (vocab-parallel cross entropy).
//
//   parallel::initialize_model_parallel(/*tp=*/2, /*pp=*/2);
//   std::vector<GPTModel> chunks = build_gpt_model(config);  // one chunk, or vpp chunks with a virtual pipeline
//   torch::Tensor loss = chunks[0]->forward(tokens, position_ids, labels);  // [b, s] on the last stage
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bridge/models/gpt_config.h"
#include "bridge/models/normalization.h"
#include "bridge/models/rotary_pos_embedding.h"
#include "bridge/models/transformer_layer.h"
#include "parallel/tensor_parallel/layers.h"

namespace bridge::models {

/// Which part of the model a chunk holds.
struct GPTChunkOptions {
  bool pre_process = true;   ///< holds the embedding (first stage, first chunk)
  bool post_process = true;  ///< holds the final norm and output layer (last stage, last chunk)
  int64_t first_layer = 0;   ///< global index of its first transformer layer
  int64_t num_layers = 0;    ///< layers it holds
};

class GPTModelImpl : public torch::nn::Module {
 public:
  GPTModelImpl(const GPTConfig& config, const GPTChunkOptions& options);

  /// tokens, position_ids: [b, s] int64. On the first stage the input is embedded from `tokens`; elsewhere it is the
  /// tensor given to set_input_tensor ([s, b, h]). Returns, on the last stage, the per-token loss [b, s] when
  /// `labels` is defined, else the vocab-parallel logits [b, s, padded_vocab / tp]; elsewhere the hidden states
  /// [s, b, h] for the next stage ([s / tp, b, h], this rank's part, under sequence parallelism, which needs s
  /// divisible by tp). `attention_mask` (bool [b, 1, s, s], true = masked, as Megatron's; every stage
  /// gets it) replaces the causal mask, e.g. to keep documents apart (dataset.reset_attention_mask).
  torch::Tensor forward(const torch::Tensor& tokens, const torch::Tensor& position_ids,
                        const torch::Tensor& labels = {}, const torch::Tensor& attention_mask = {});

  /// The previous stage's output, used instead of the embedding by chunks without pre_process.
  void set_input_tensor(const torch::Tensor& input_tensor) { input_tensor_ = input_tensor; }

  /// The word-embedding weight on the first stage, the output layer's weight on the last (the tied copy when
  /// pp > 1); undefined on a chunk with neither.
  torch::Tensor shared_embedding_or_output_weight() const;

  const GPTConfig& config() const { return config_; }
  const GPTChunkOptions& chunk_options() const { return options_; }
  int64_t padded_vocab_size() const { return padded_vocab_size_; }

  parallel::tensor_parallel::VocabParallelEmbedding word_embeddings{nullptr};
  torch::nn::Embedding position_embeddings{nullptr};  ///< learned_absolute only
  torch::nn::ModuleList layers;
  Norm final_layernorm{nullptr};
  /// The output layer's own weight: the tied copy on a last stage without the embedding, or the untied weight.
  torch::Tensor output_weight;

 private:
  // The chunk's layers; under full recomputation (training) as Megatron-Core's checkpointed runs.
  torch::Tensor transformer_layers(torch::Tensor hidden, const torch::Tensor& attention_mask,
                                   const std::optional<RotaryTables>& rotary);

  GPTConfig config_;
  GPTChunkOptions options_;
  int64_t padded_vocab_size_;
  std::optional<RotaryEmbedding> rotary_pos_emb_;  ///< with position_embedding_type rope or yarn
  bool sequence_parallel_;                         ///< model.sequence_parallel at tp > 1
  torch::Tensor input_tensor_;
};
TORCH_MODULE(GPTModel);

/// The layers chunk `model_chunk` of pipeline rank `pp_rank` holds (Megatron's layer offsets: with a virtual
/// pipeline, chunk c of rank r holds block c * pp + r of num_layers / (pp * vpp) layers).
GPTChunkOptions gpt_chunk_options(const GPTConfig& config, int pp, int pp_rank, int vpp, int model_chunk);

/// This rank's chunks for the current parallel_state layout: one, or vpp with a virtual pipeline.
std::vector<GPTModel> build_gpt_model(const GPTConfig& config);

/// The chunk's parameters under their names in the whole model, the same in every layout (Megatron-Core's names):
/// "embedding.word_embeddings.weight", "decoder.layers.<global index>.mlp.linear_fc1.weight", ...,
/// "decoder.final_layernorm.weight", "output_layer.weight" (the output layer's own weight, when it has one).
std::vector<std::pair<std::string, torch::Tensor>> global_named_parameters(const GPTModel& chunk);

/// The weights whose gradients are summed over the tensor-parallel group (finalize_model_grads): the q/k norms
/// (qk_layernorm), which each rank applies to its own heads, and under sequence parallelism the norms and row-parallel
/// biases, which each rank applies to its own part of the sequence. Empty at tp 1.
std::vector<torch::Tensor> tensor_parallel_partial_weights(const std::vector<GPTModel>& chunks);

/// After the gradient sync of a step (Megatron-Core's _update_router_expert_bias in finalize_model_grads): every
/// router with moe_router_enable_expert_bias moves its bias toward balance by the tokens each expert got on all
/// tensor- and data-parallel ranks (one all-reduce for all of them), and global_aux_loss counts restart. A no-op for a
/// dense model; every rank of the tensor x data-parallel group calls it.
void finalize_moe_routers(const std::vector<GPTModel>& chunks);

/// The weights whose gradients are summed over the embedding group: the first stage's word embedding and the last
/// stage's tied copy. Empty with pp == 1 (one weight, no copy) and on middle stages.
std::vector<torch::Tensor> embedding_group_weights(const std::vector<GPTModel>& chunks);

}  // namespace bridge::models
