// The config key table: one field(...) row per user-settable member of ConfigContainer, with its help text. A field
// added to config.h belongs here too (config_yaml_test compares this table with the members declared in the headers).
#include "training/config/config_table.h"

namespace bridge::training::detail {

using C = ConfigContainer;
using models::GPTConfig;
using parallel::distributed::DistributedDataParallelConfig;
using tokenizers::TokenizerConfig;

const std::vector<Field>& fields() {
  static const std::vector<Field> table = {
      field("model.num_layers", &C::model, &GPTConfig::num_layers, "Transformer layers."),
      field("model.hidden_size", &C::model, &GPTConfig::hidden_size, "Width of the residual stream."),
      field("model.num_attention_heads", &C::model, &GPTConfig::num_attention_heads,
            "Attention (query) heads; divides model.hidden_size unless model.kv_channels is set, and "
            "parallelism.tensor_model_parallel_size divides it."),
      field("model.num_query_groups", &C::model, &GPTConfig::num_query_groups,
            "Key/value heads (grouped-query attention; 1 = multi-query); 0 = model.num_attention_heads. The "
            "tensor-parallel size divides it."),
      field("model.kv_channels", &C::model, &GPTConfig::kv_channels,
            "Width of one attention head; 0 = model.hidden_size / model.num_attention_heads."),
      field("model.ffn_hidden_size", &C::model, &GPTConfig::ffn_hidden_size, "MLP width; 0 = 4 x model.hidden_size."),
      field("model.vocab_size", &C::model, &GPTConfig::vocab_size,
            "Tokenizer vocabulary (257 for the byte-level tokenizer with its end-of-document token, 50257 for GPT-2)."),
      field("model.make_vocab_size_divisible_by", &C::model, &GPTConfig::make_vocab_size_divisible_by,
            "The embedding is padded to a multiple of this x the tensor-parallel size."),
      field("model.seq_length", &C::model, &GPTConfig::seq_length, "Tokens per sample (and positions embedded)."),
      field("model.hidden_dropout", &C::model, &GPTConfig::hidden_dropout, "Dropout after attention and MLP."),
      field("model.attention_dropout", &C::model, &GPTConfig::attention_dropout, "Dropout on attention weights."),
      field("model.attention_backend", &C::model, &GPTConfig::attention_backend,
            "auto = scaled_dot_product_attention on LibTorch 2.x; unfused = explicit softmax(QK^T)V."),
      field("model.activation_func", &C::model, &GPTConfig::activation_func,
            "The MLP's activation: gelu (exact erf), openai_gelu (tanh approximation: GPT-2's gelu_new; fast_gelu) "
            "or silu."),
      field("model.gated_linear_unit", &C::model, &GPTConfig::gated_linear_unit,
            "Gated MLP: linear_fc1 is [gate; up] and its output act(gate) * up (SwiGLU with silu, GeGLU with gelu)."),
      field("model.normalization", &C::model, &GPTConfig::normalization,
            "LayerNorm (weight and bias) or RMSNorm (weight only), for every norm of the model."),
      field("model.layernorm_epsilon", &C::model, &GPTConfig::layernorm_epsilon, "Epsilon of every norm."),
      field("model.position_embedding_type", &C::model, &GPTConfig::position_embedding_type,
            "learned_absolute (a position table, GPT-2), rope (rotary, Llama), yarn (rotary with YaRN's scaling: the "
            "model.yarn_* keys; Qwen's long context) or none."),
      field("model.rotary_base", &C::model, &GPTConfig::rotary_base, "RoPE's base (Llama 2: 10000, Llama 3: 500000)."),
      field("model.rotary_percent", &C::model, &GPTConfig::rotary_percent,
            "Share of each head's channels that RoPE rotates."),
      field("model.rotary_interleaved", &C::model, &GPTConfig::rotary_interleaved,
            "RoPE rotates adjacent channel pairs (0, 1), (2, 3), ... (RoFormer, GPT-J) instead of channel i with i + "
            "half (GPT-NeoX, Hugging Face's Llama)."),
      field("model.rope_scaling", &C::model, &GPTConfig::rope_scaling, "Llama 3.1's scaling of RoPE's frequencies."),
      field("model.rope_scaling_factor", &C::model, &GPTConfig::rope_scaling_factor,
            "Llama 3.1's scaling: the factor long wavelengths are stretched by (3.1: 8, 3.2: 32)."),
      field("model.rope_scaling_low_freq_factor", &C::model, &GPTConfig::rope_scaling_low_freq_factor,
            "Llama 3.1's scaling: wavelengths above original / this are scaled in full."),
      field("model.rope_scaling_high_freq_factor", &C::model, &GPTConfig::rope_scaling_high_freq_factor,
            "Llama 3.1's scaling: wavelengths below original / this are kept."),
      field("model.rope_scaling_original_max_position_embeddings", &C::model,
            &GPTConfig::rope_scaling_original_max_position_embeddings,
            "Llama 3.1's scaling: the context length the model was first trained at."),
      field("model.yarn_rotary_scaling_factor", &C::model, &GPTConfig::yarn_rotary_scaling_factor,
            "YaRN: the factor the context is extended by, long wavelengths divided by it (Qwen3: 4)."),
      field("model.yarn_original_max_position_embeddings", &C::model, &GPTConfig::yarn_original_max_position_embeddings,
            "YaRN: the context length the model was first trained at."),
      field("model.yarn_beta_fast", &C::model, &GPTConfig::yarn_beta_fast,
            "YaRN: frequencies turning more than this many times over the original context are kept."),
      field("model.yarn_beta_slow", &C::model, &GPTConfig::yarn_beta_slow,
            "YaRN: frequencies turning fewer times than this are divided by the factor; those between, blended."),
      field("model.yarn_mscale", &C::model, &GPTConfig::yarn_mscale,
            "YaRN: the attention factor is (0.1 x this x ln(factor) + 1) / (0.1 x model.yarn_mscale_all_dim x "
            "ln(factor) + 1)."),
      field("model.yarn_mscale_all_dim", &C::model, &GPTConfig::yarn_mscale_all_dim,
            "YaRN: the attention factor's denominator (see model.yarn_mscale); 0 makes it 1."),
      field("model.yarn_correction_range_round_to_int", &C::model, &GPTConfig::yarn_correction_range_round_to_int,
            "YaRN: round the blended band's ends outwards to whole dimensions (Hugging Face's truncate)."),
      field("model.yarn_attention_factor", &C::model, &GPTConfig::yarn_attention_factor,
            "YaRN: what cos and sin are multiplied by, in place of the mscales' (Hugging Face's attention_factor); "
            "null derives it."),
      field("model.add_bias_linear", &C::model, &GPTConfig::add_bias_linear,
            "Biases on QKV, the attention projection and both MLP layers (GPT-2: true, Llama: false)."),
      field("model.add_qkv_bias", &C::model, &GPTConfig::add_qkv_bias,
            "A bias on QKV even without model.add_bias_linear (Qwen2)."),
      field("model.qk_layernorm", &C::model, &GPTConfig::qk_layernorm,
            "Normalize each query and key head before RoPE (Qwen3, OLMo-2)."),
      field("model.qk_layernorm_across_heads", &C::model, &GPTConfig::qk_layernorm_across_heads,
            "With model.qk_layernorm: one RMSNorm over all query heads together and one over all key heads (OLMoE), "
            "instead of one per head."),
      field("model.init_method_std", &C::model, &GPTConfig::init_method_std,
            "Std of the normal weight initialisation (output projections: std / sqrt(2 x num_layers))."),
      field("model.init_seed", &C::model, &GPTConfig::init_seed,
            "Seed of the weight initialisation; any tp/pp layout starts from the same weights."),
      field("model.share_embeddings_and_output_weights", &C::model, &GPTConfig::share_embeddings_and_output_weights,
            "Tie the output layer to the word embedding (GPT-2, Llama 3.2 1B/3B); false: an output layer of its own."),
      field("model.gradient_accumulation_fusion", &C::model, &GPTConfig::gradient_accumulation_fusion,
            "Weight gradients (GEMMs, embedding) add straight into the grad buffer (Megatron's fusion); off for "
            "autograd::grad()."),
      field("model.recompute_granularity", &C::model, &GPTConfig::recompute_granularity,
            "Activation recomputation: null keeps every activation; full recomputes whole layers in backward "
            "(model.recompute_method, model.recompute_num_layers); selective the model.recompute_modules of every "
            "layer."),
      field("model.recompute_method", &C::model, &GPTConfig::recompute_method,
            "full recomputation: uniform (every model.recompute_num_layers layers form one checkpointed run) or block "
            "(the first model.recompute_num_layers layers of each model chunk are checkpointed)."),
      field("model.recompute_num_layers", &C::model, &GPTConfig::recompute_num_layers,
            "full recomputation: layers per run (uniform) or layers checkpointed (block); 1 to the layers of a "
            "pipeline stage."),
      field("model.recompute_modules", &C::model, &GPTConfig::recompute_modules,
            "selective recomputation: core_attn (the attention from q, k, v to its output) and/or mlp; null = "
            "[core_attn]."),
      field("model.sequence_parallel", &C::model, &GPTConfig::sequence_parallel,
            "Sequence parallelism: norms, dropouts and residuals on seq_length / tp tokens per tensor-parallel rank "
            "(all-gather and reduce-scatter replace the all-reduce); needs seq_length divisible by tp; off at tp 1."),
      field("model.cp_comm_type", &C::model, &GPTConfig::cp_comm_type,
            "With parallelism.context_parallel_size > 1, how attention reaches the other ranks' keys and values: p2p "
            "(a ring passing key/value blocks on while attention runs), all_gather (the whole sequence's keys and "
            "values on every rank) or a2a (Ulysses: heads traded for sequence; the heads per tensor-parallel rank must "
            "divide by cp). Hierarchical a2a+p2p is not supported."),
      field("model.num_moe_experts", &C::model, &GPTConfig::num_moe_experts,
            "Routed experts per MoE layer (Mixture of Experts, docs/moe.md); null = a dense model."),
      field("model.moe_layer_freq", &C::model, &GPTConfig::moe_layer_freq,
            "Which layers are MoE: an int N (layers i with i % N == 0) or a 0/1 list with one entry per layer."),
      field("model.moe_ffn_hidden_size", &C::model, &GPTConfig::moe_ffn_hidden_size,
            "Width of one routed expert's MLP; null = model.ffn_hidden_size."),
      field("model.moe_router_topk", &C::model, &GPTConfig::moe_router_topk, "Experts each token is routed to."),
      field("model.moe_router_score_function", &C::model, &GPTConfig::moe_router_score_function,
            "softmax or sigmoid (the k chosen renormalised; DeepSeek-V3)."),
      field("model.moe_router_pre_softmax", &C::model, &GPTConfig::moe_router_pre_softmax,
            "softmax over all experts before top-k (no renormalisation); needed for top-1 softmax routing."),
      field("model.moe_router_topk_scaling_factor", &C::model, &GPTConfig::moe_router_topk_scaling_factor,
            "Multiplies the routing probabilities (DeepSeek's routed_scaling_factor); null = 1."),
      field("model.moe_router_num_groups", &C::model, &GPTConfig::moe_router_num_groups,
            "Group-limited routing: the experts form this many groups (with model.moe_router_group_topk)."),
      field("model.moe_router_group_topk", &C::model, &GPTConfig::moe_router_group_topk,
            "Group-limited routing: tokens choose experts within this many best groups."),
      field("model.moe_router_enable_expert_bias", &C::model, &GPTConfig::moe_router_enable_expert_bias,
            "Auxiliary-loss-free balance (DeepSeek-V3): a per-expert bias on the scores that choose experts, moved "
            "toward balance after every step; sigmoid only."),
      field("model.moe_router_bias_update_rate", &C::model, &GPTConfig::moe_router_bias_update_rate,
            "Step of the expert-bias update."),
      field("model.moe_router_load_balancing_type", &C::model, &GPTConfig::moe_router_load_balancing_type,
            "aux_loss (per micro-batch), seq_aux_loss (per sequence), global_aux_loss (over the global batch) or "
            "none."),
      field("model.moe_aux_loss_coeff", &C::model, &GPTConfig::moe_aux_loss_coeff,
            "Weight of the load-balancing loss; 0 leaves it out (Megatron suggests 1e-2)."),
      field("model.moe_z_loss_coeff", &C::model, &GPTConfig::moe_z_loss_coeff,
            "Weight of the router z-loss; null = none (Megatron suggests 1e-3)."),
      field("model.moe_expert_capacity_factor", &C::model, &GPTConfig::moe_expert_capacity_factor,
            "Expert capacity = ceil(tokens x topk / experts x factor), tokens past it dropped; null = dropless."),
      field("model.moe_token_drop_policy", &C::model, &GPTConfig::moe_token_drop_policy,
            "Which tokens an expert over capacity keeps: probs (the most probable) or position (the earliest)."),
      field("model.moe_pad_expert_input_to_capacity", &C::model, &GPTConfig::moe_pad_expert_input_to_capacity,
            "Every expert processes exactly its capacity of tokens (needs model.moe_expert_capacity_factor)."),
      field("model.moe_shared_expert_intermediate_size", &C::model, &GPTConfig::moe_shared_expert_intermediate_size,
            "Total width of the shared experts every token also takes (Qwen2-MoE, DeepSeek); null = none."),
      field("model.moe_shared_expert_gate", &C::model, &GPTConfig::moe_shared_expert_gate,
            "Scale the shared experts' output by sigmoid(x . gate_weight) (Qwen2-MoE)."),
      field("model.moe_router_dtype", &C::model, &GPTConfig::moe_router_dtype,
            "The router's logits and probabilities in fp32 or fp64; null = fp32 (bridge's router always runs in fp32 "
            "or wider)."),
      field("model.moe_token_dispatcher_type", &C::model, &GPTConfig::moe_token_dispatcher_type,
            "allgather (every token to every tensor x expert-parallel rank) or alltoall (each token only to its "
            "experts' ranks)."),
      field("model.moe_per_layer_logging", &C::model, &GPTConfig::moe_per_layer_logging,
            "Also write each MoE layer's auxiliary losses (moe/<name>_layer_<i>)."),

      field("train.micro_batch_size", &C::train, &TrainingConfig::micro_batch_size,
            "Samples per forward/backward pass on one rank."),
      field("train.global_batch_size", &C::train, &TrainingConfig::global_batch_size,
            "Samples per optimizer step over all data-parallel ranks (micro_batch_size x dp x micro-batches)."),
      field("train.train_iters", &C::train, &TrainingConfig::train_iters,
            "Optimizer steps to train (0 with train.train_samples)."),
      field("train.train_samples", &C::train, &TrainingConfig::train_samples,
            "Sample-based training (Megatron's --train-samples): train train_samples / global_batch_size steps, "
            "with the scheduler's lengths in samples (scheduler.lr_*_samples); train.train_iters must be 0. null = "
            "iteration-based (train.train_iters)."),
      field("train.eval_interval", &C::train, &TrainingConfig::eval_interval,
            "Validate every this many steps; 0 = only after training."),
      field("train.eval_iters", &C::train, &TrainingConfig::eval_iters,
            "Steps per validation or test; 0 disables both."),
      field("train.skip_train", &C::train, &TrainingConfig::skip_train, "Skip training (evaluate only)."),
      field("train.check_for_nan_in_loss_and_grad", &C::train, &TrainingConfig::check_for_nan_in_loss_and_grad,
            "Fail the run when the gradient norm is NaN or infinite."),
      field("train.num_threads", &C::train, &TrainingConfig::num_threads,
            "Intra-op threads per rank; 0 = the node's cores divided among its ranks."),
      field("train.exit_signal_handler", &C::train, &TrainingConfig::exit_signal_handler,
            "On SIGTERM or SIGINT on any rank, save the same step on every rank and exit (preemption)."),
      field("train.exit_interval", &C::train, &TrainingConfig::exit_interval,
            "Save and exit after a step that is a multiple of this; null = never."),
      field("train.exit_duration_in_mins", &C::train, &TrainingConfig::exit_duration_in_mins,
            "Save and exit once the run has lasted this many minutes (on any rank); null = no limit."),

      field("optimizer.optimizer", &C::optimizer, &OptimizerConfig::optimizer,
            "adam (decoupled weight decay, i.e. AdamW) or sgd."),
      field("optimizer.lr", &C::optimizer, &OptimizerConfig::lr, "Peak learning rate."),
      field("optimizer.min_lr", &C::optimizer, &OptimizerConfig::min_lr, "Learning rate at the end of the decay."),
      field("optimizer.weight_decay", &C::optimizer, &OptimizerConfig::weight_decay,
            "Decoupled weight decay on matrices (none on biases and norm weights)."),
      field("optimizer.adam_beta1", &C::optimizer, &OptimizerConfig::adam_beta1, "Adam beta1."),
      field("optimizer.adam_beta2", &C::optimizer, &OptimizerConfig::adam_beta2, "Adam beta2."),
      field("optimizer.adam_eps", &C::optimizer, &OptimizerConfig::adam_eps, "Adam epsilon."),
      field("optimizer.sgd_momentum", &C::optimizer, &OptimizerConfig::sgd_momentum, "SGD momentum."),
      field("optimizer.clip_grad", &C::optimizer, &OptimizerConfig::clip_grad,
            "Clip the global gradient norm to this; 0 disables."),
      field("optimizer.use_distributed_optimizer", &C::optimizer, &OptimizerConfig::use_distributed_optimizer,
            "Distributed optimizer (ZeRO-1): each data-parallel rank keeps the optimizer state (and fp32 main params) "
            "of its 1/dp of the parameters; must equal ddp.use_distributed_optimizer."),

      field("scheduler.lr_warmup_iters", &C::scheduler, &SchedulerConfig::lr_warmup_iters,
            "Steps of linear warmup from 0 to optimizer.lr."),
      field("scheduler.lr_decay_iters", &C::scheduler, &SchedulerConfig::lr_decay_iters,
            "Steps over which the learning rate decays to optimizer.min_lr, warmup included; 0 = train.train_iters."),
      field("scheduler.lr_warmup_fraction", &C::scheduler, &SchedulerConfig::lr_warmup_fraction,
            "The warmup as a share of the decay (lr_decay_iters or lr_decay_samples), instead of lr_warmup_iters or "
            "lr_warmup_samples (which must then be 0), as Megatron-Bridge's; null = those."),
      field("scheduler.lr_warmup_samples", &C::scheduler, &SchedulerConfig::lr_warmup_samples,
            "With train.train_samples: samples of linear warmup (as lr_warmup_iters x global_batch_size)."),
      field("scheduler.lr_decay_samples", &C::scheduler, &SchedulerConfig::lr_decay_samples,
            "With train.train_samples: samples over which the learning rate decays, warmup included; 0 = "
            "train.train_samples."),
      field("scheduler.lr_decay_style", &C::scheduler, &SchedulerConfig::lr_decay_style,
            "constant, linear, cosine or inverse-square-root."),

      field("parallelism.tensor_model_parallel_size", &C::parallelism, &ParallelismConfig::tensor_model_parallel_size,
            "Ranks each layer is split over (tp)."),
      field("parallelism.context_parallel_size", &C::parallelism, &ParallelismConfig::context_parallel_size,
            "Ranks each sequence is split over (cp): each keeps 2 of 2 x cp chunks of every sample (model.seq_length "
            "divisible by 2 x cp) and attention exchanges keys and values (model.cp_comm_type); gradients are averaged "
            "over dp x cp. Needs model.attention_dropout 0 and no dataset.reset_attention_mask."),
      field("parallelism.pipeline_model_parallel_size", &C::parallelism,
            &ParallelismConfig::pipeline_model_parallel_size,
            "Pipeline stages (pp); the world size must be a multiple of tp x cp x pp, the rest is data parallel."),
      field("parallelism.virtual_pipeline_model_parallel_size", &C::parallelism,
            &ParallelismConfig::virtual_pipeline_model_parallel_size,
            "Model chunks per pipeline rank (interleaved 1F1B); null = the plain schedule."),
      field("parallelism.microbatch_group_size_per_vp_stage", &C::parallelism,
            &ParallelismConfig::microbatch_group_size_per_vp_stage,
            "Micro-batch group size of the interleaved schedule; null = the pipeline size."),
      field("parallelism.expert_model_parallel_size", &C::parallelism, &ParallelismConfig::expert_model_parallel_size,
            "Ranks the routed experts are spread over (ep, MoE models); taken from the data-parallel ranks: the world "
            "must be a multiple of expert_tensor_parallel_size x ep x pp."),
      field("parallelism.expert_tensor_parallel_size", &C::parallelism, &ParallelismConfig::expert_tensor_parallel_size,
            "Ranks each routed expert is split over (etp); null = parallelism.tensor_model_parallel_size."),
      field("parallelism.backend", &C::parallelism, &ParallelismConfig::backend,
            "Collective backend; null = nccl on a CUDA device when LibTorch has NCCL, else gloo."),
      field("parallelism.device", &C::parallelism, &ParallelismConfig::device,
            "auto (cuda:LOCAL_RANK when every local rank has a GPU, else cpu), cuda, cuda:<index> or cpu."),
      field("parallelism.timeout", &C::parallelism, &ParallelismConfig::timeout,
            "Limit for every collective and process group creation (e.g. 30s, 10min, 1h)."),
      field("parallelism.rendezvous_timeout", &C::parallelism, &ParallelismConfig::rendezvous_timeout,
            "Limit for joining the world at start-up (reaching MASTER_ADDR:MASTER_PORT, every rank arriving); "
            "then the ranks that never joined are named."),

      field("ddp.overlap_grad_reduce", &C::ddp, &DistributedDataParallelConfig::overlap_grad_reduce,
            "Start each gradient bucket's all-reduce during the last micro-batch's backward."),
      field("ddp.average_in_collective", &C::ddp, &DistributedDataParallelConfig::average_in_collective,
            "false: pre-scale gradients by 1/dp, then sum (Megatron's default)."),
      field("ddp.bucket_size", &C::ddp, &DistributedDataParallelConfig::bucket_size,
            "Elements per gradient bucket; 0 = max(40M, 1M x dp)."),
      field("ddp.grad_reduce_in_fp32", &C::ddp, &DistributedDataParallelConfig::grad_reduce_in_fp32,
            "Gradient buffer in fp32 for bf16/fp16 parameters; set from mixed_precision.grad_reduce_in_fp32 "
            "when bf16 or fp16 is on."),
      field("ddp.use_distributed_optimizer", &C::ddp, &DistributedDataParallelConfig::use_distributed_optimizer,
            "Megatron-Core's name of optimizer.use_distributed_optimizer; the two must agree."),
      field("ddp.overlap_param_gather", &C::ddp, &DistributedDataParallelConfig::overlap_param_gather,
            "With the distributed optimizer: start the parameters' all-gather after the step and wait for each "
            "bucket in the next forward, just before the layers that use it."),

      field("dataset.data_path", &C::dataset, &DatasetConfig::data_path,
            "Megatron .bin/.idx path prefixes to train on; empty = mock data (random tokens)."),
      field("dataset.split", &C::dataset, &DatasetConfig::split,
            "Train/validation/test proportions over the documents, e.g. \"969,30,1\"."),
      field("dataset.path_to_cache", &C::dataset, &DatasetConfig::path_to_cache,
            "Where the sample indices are cached; empty = <prefix's folder>/cache/GPTDataset_indices."),
      field("dataset.validate_tokens", &C::dataset, &DatasetConfig::validate_tokens,
            "Check at startup that every token id is below model.vocab_size (reads the data once); null = when the "
            "data is at most 4 GiB."),
      field("dataset.reset_position_ids", &C::dataset, &DatasetConfig::reset_position_ids,
            "Positions restart at 0 after each end-of-document token (Megatron's --reset-position-ids)."),
      field("dataset.reset_attention_mask", &C::dataset, &DatasetConfig::reset_attention_mask,
            "Tokens after an end-of-document token do not attend to it or before (an [s, s] mask per sample)."),
      field("dataset.eod_mask_loss", &C::dataset, &DatasetConfig::eod_mask_loss,
            "No loss on the token that follows an end-of-document token."),
      field("dataset.eod_token_id", &C::dataset, &DatasetConfig::eod_token_id,
            "The end-of-document token of those three; null = model.vocab_size - 1 (256 byte-level, 50256 GPT-2)."),
      field("dataset.mid_level_dataset_surplus", &C::dataset, &DatasetConfig::mid_level_dataset_surplus,
            "A blend builds each dataset this fraction beyond its share of the samples (Megatron's 0.005)."),

      field("logging.log_interval", &C::logging, &LoggingConfig::log_interval,
            "Print the training log line every this many steps."),
      field("logging.tensorboard_dir", &C::logging, &LoggingConfig::tensorboard_dir,
            "TensorBoard event files go here; empty = no TensorBoard."),
      field("logging.jsonl_path", &C::logging, &LoggingConfig::jsonl_path,
            "Append metrics as JSON lines to this file; empty = none."),
      field("logging.tensorboard_log_interval", &C::logging, &LoggingConfig::tensorboard_log_interval,
            "Write metrics every this many steps."),
      field("logging.log_throughput", &C::logging, &LoggingConfig::log_throughput,
            "Model TFLOP/s per device on the console line."),
      field("logging.log_params_norm", &C::logging, &LoggingConfig::log_params_norm,
            "The parameters' L2 norm on the line and in the writers."),
      field("logging.log_memory_to_tensorboard", &C::logging, &LoggingConfig::log_memory_to_tensorboard,
            "Write memory use to the metric writers."),
      field("logging.log_l2_norm_grad_to_tensorboard", &C::logging, &LoggingConfig::log_l2_norm_grad_to_tensorboard,
            "Write per-parameter and global gradient norms."),
      field("logging.log_throughput_to_tensorboard", &C::logging, &LoggingConfig::log_throughput_to_tensorboard,
            "Write throughput (rolling-window rates and the model TFLOP/s) to the metric writers."),
      field("logging.throughput_window_size", &C::logging, &LoggingConfig::throughput_window_size,
            "Steps in the rolling throughput window."),
      field("logging.log_runtime_to_tensorboard", &C::logging, &LoggingConfig::log_runtime_to_tensorboard,
            "Write the elapsed run time to the metric writers."),
      field("logging.runtime_time_unit", &C::logging, &LoggingConfig::runtime_time_unit,
            "Unit of the run time: seconds, minutes, hours or days."),
      field("logging.log_loss_scale_to_tensorboard", &C::logging, &LoggingConfig::log_loss_scale_to_tensorboard,
            "Write the loss scale to the metric writers."),
      field("logging.log_world_size_to_tensorboard", &C::logging, &LoggingConfig::log_world_size_to_tensorboard,
            "Write the world size to the metric writers."),
      field("logging.log_timers_to_tensorboard", &C::logging, &LoggingConfig::log_timers_to_tensorboard,
            "Write iteration-time (seconds per step) to the metric writers."),
      field("logging.log_validation_ppl_to_tensorboard", &C::logging, &LoggingConfig::log_validation_ppl_to_tensorboard,
            "Write the validation and test perplexity beside their losses to the metric writers."),

      field("rng.seed", &C::rng, &RNGConfig::seed, "Seed of the data order and dropout."),

      field("checkpoint.save", &C::checkpoint, &CheckpointConfig::save,
            "Directory for checkpoints; empty = never save."),
      field("checkpoint.save_interval", &C::checkpoint, &CheckpointConfig::save_interval,
            "Save every this many steps; 0 = only at the end (when checkpoint.save is set)."),
      field("checkpoint.load", &C::checkpoint, &CheckpointConfig::load,
            "Directory to resume from (its latest checkpoint, or checkpoint.ckpt_step); empty = none. It must "
            "exist; a directory without checkpoints starts from scratch."),
      field("checkpoint.ckpt_step", &C::checkpoint, &CheckpointConfig::ckpt_step,
            "Iteration of checkpoint.load to resume from; null = the latest."),
      field(
          "checkpoint.pretrained_checkpoint", &C::checkpoint, &CheckpointConfig::pretrained_checkpoint,
          "Directory to take the weights from (fresh optimizer, scheduler and step) when nothing is resumed; "
          "hf:<dir> takes them from a Hugging Face GPT-2, Llama, Mistral, Qwen2 or Qwen3 (config.json + safetensors)."),
      field("checkpoint.finetune", &C::checkpoint, &CheckpointConfig::finetune,
            "Load only the model from checkpoint.load; start at step 0 with a fresh optimizer and RNG."),
      field("checkpoint.no_load_optim", &C::checkpoint, &CheckpointConfig::no_load_optim,
            "Do not load the optimizer state (nor the fp16 loss scale)."),
      field("checkpoint.no_load_rng", &C::checkpoint, &CheckpointConfig::no_load_rng,
            "Do not load the RNG states; keep those seeded from rng.seed."),
      field("checkpoint.auto_resume", &C::checkpoint, &CheckpointConfig::auto_resume,
            "Resume from checkpoint.save when it holds checkpoints and nothing else is loaded; a damaged latest "
            "checkpoint falls back to the newest complete older one (the damaged one kept as iter_N.damaged). "
            "false = stop with an error instead of overwriting them."),
      field("checkpoint.most_recent_k", &C::checkpoint, &CheckpointConfig::most_recent_k,
            "Keep only the newest this many checkpoints in checkpoint.save; -1 = keep all."),
      field("checkpoint.async_save", &C::checkpoint, &CheckpointConfig::async_save,
            "Write checkpoint files on a background thread while training goes on; on_checkpoint_save fires once "
            "the checkpoint is complete."),
      field("checkpoint.ckpt_format", &C::checkpoint, &CheckpointConfig::ckpt_format,
            "torch_dist: Megatron-Core's distributed checkpoint (PyTorch DCP files every rank writes, its own shards); "
            "torch: Megatron's legacy mp_rank_* files written by data-parallel rank 0. Loads read either."),
      field("checkpoint.fully_parallel_save", &C::checkpoint, &CheckpointConfig::fully_parallel_save,
            "torch_dist: spread the writing of replicated tensors over the ranks that hold them."),
      field("checkpoint.dist_ckpt_strictness", &C::checkpoint, &CheckpointConfig::dist_ckpt_strictness,
            "torch_dist: tensors the checkpoint has and the model lacks are ignored (assume_ok_unexpected, "
            "return_unexpected, return_all, ignore_all), logged (log_unexpected, log_all) or refused "
            "(raise_unexpected, raise_all)."),
      field("checkpoint.dist_ckpt_optim_fully_reshardable", &C::checkpoint,
            &CheckpointConfig::dist_ckpt_optim_fully_reshardable,
            "torch_dist with the distributed optimizer: its state in model space, loadable in any layout; false: "
            "each rank's bucket shard as it lies (dp_reshardable), loadable at any data-parallel size only."),
      field("checkpoint.also_save_hf_checkpoint", &C::checkpoint, &CheckpointConfig::also_save_hf_checkpoint,
            "Also write each saved iteration as a Hugging Face checkpoint in its hf/ directory (config.json, "
            "model.safetensors, tokenizer files), off the training thread."),

      field("mixed_precision.bf16", &C::mixed_precision, &MixedPrecisionConfig::bf16,
            "Parameters and compute in bfloat16, fp32 master weights in the optimizer. `mixed_precision: "
            "bf16_mixed` (or fp16_mixed, fp32) sets the whole section as Megatron-Bridge's recipes."),
      field("mixed_precision.fp16", &C::mixed_precision, &MixedPrecisionConfig::fp16,
            "Parameters and compute in float16 with loss scaling, fp32 master weights in the optimizer."),
      field("mixed_precision.grad_reduce_in_fp32", &C::mixed_precision, &MixedPrecisionConfig::grad_reduce_in_fp32,
            "With bf16/fp16: accumulate and all-reduce gradients in fp32 (sets ddp.grad_reduce_in_fp32)."),
      field("mixed_precision.loss_scale", &C::mixed_precision, &MixedPrecisionConfig::loss_scale,
            "fp16: a static loss scale; null = dynamic loss scaling."),
      field("mixed_precision.initial_loss_scale", &C::mixed_precision, &MixedPrecisionConfig::initial_loss_scale,
            "fp16: the dynamic loss scale's start (2^32)."),
      field("mixed_precision.min_loss_scale", &C::mixed_precision, &MixedPrecisionConfig::min_loss_scale,
            "fp16: the dynamic loss scale never halves below this."),
      field("mixed_precision.loss_scale_window", &C::mixed_precision, &MixedPrecisionConfig::loss_scale_window,
            "fp16: clean steps before the dynamic loss scale doubles."),
      field("mixed_precision.hysteresis", &C::mixed_precision, &MixedPrecisionConfig::hysteresis,
            "fp16: overflowing steps tolerated before the dynamic loss scale halves."),

      field("tokenizer.tokenizer_type", &C::tokenizer, &TokenizerConfig::tokenizer_type,
            "The tokenizer the data was prepared with (as bridge-preprocess-data's --tokenizer-type): ByteLevel, "
            "GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer, GPTSentencePieceTokenizer, "
            "Llama2Tokenizer or NullTokenizer. It sets model.vocab_size (see tokenizer.use_tokenizer_vocab_size), "
            "dataset.eod_token_id when null, and the TextGenerator's tokenizer. null = none, except that an hf:<dir> "
            "start uses <dir>'s tokenizer.json."),
      field("tokenizer.tokenizer_model", &C::tokenizer, &TokenizerConfig::tokenizer_model,
            "HuggingFaceTokenizer: a directory with tokenizer.json (or the file); the SentencePiece types: "
            "tokenizer.model."),
      field("tokenizer.vocab_file", &C::tokenizer, &TokenizerConfig::vocab_file, "GPT2BPETokenizer: vocab.json."),
      field("tokenizer.merge_file", &C::tokenizer, &TokenizerConfig::merge_file, "GPT2BPETokenizer: merges.txt."),
      field("tokenizer.vocab_size", &C::tokenizer, &TokenizerConfig::vocab_size, "NullTokenizer: the number of ids."),
      field("tokenizer.null_tokenizer_eod_id", &C::tokenizer, &TokenizerConfig::null_tokenizer_eod_id,
            "NullTokenizer: its end-of-document id; null = tokenizer.vocab_size - 1."),
      field("tokenizer.use_tokenizer_vocab_size", &C::tokenizer, &TokenizerConfig::use_tokenizer_vocab_size,
            "true: model.vocab_size becomes the tokenizer's; false: model.vocab_size stays and must hold the "
            "tokenizer's ids; null = true when the model trains from scratch and model.vocab_size is smaller, false "
            "with checkpoint.pretrained_checkpoint."),
  };
  return table;
}

std::string_view section_of(std::string_view key) { return key.substr(0, key.find('.')); }
std::string_view leaf_of(std::string_view key) { return key.substr(key.rfind('.') + 1); }

const Field* find_field(std::string_view key) {
  for (const Field& f : fields()) {
    if (f.key == key) return &f;
  }
  return nullptr;
}

bool is_section(std::string_view path) {
  for (const Field& f : fields()) {
    if (f.key.size() > path.size() && f.key.compare(0, path.size(), path) == 0 && f.key[path.size()] == '.') {
      return true;
    }
  }
  return false;
}

std::vector<std::string> sections() {
  std::vector<std::string> names;
  for (const Field& f : fields()) {
    const std::string name(section_of(f.key));
    if (names.empty() || names.back() != name) names.push_back(name);
  }
  return names;
}

std::string emit_value(const Field& f, const ConfigContainer& config) {
  YAML::Emitter out;
  out.SetNullFormat(YAML::LowerNull);
  f.emit(out, config);
  return out.c_str();
}

}  // namespace bridge::training::detail
