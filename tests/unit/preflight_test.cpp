// Failing early: validate() refuses non-finite and overflowing values naming the key, --config refuses a directory,
// and pretrain()'s preflight refuses unwritable outputs and models that cannot fit before anything trains, and caps
// train.num_threads at the cores.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/version.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <thread>

#include "bridge/bridge.h"
#include "training/utils/theoretical_memory.h"
#include "utils/write_probe.h"

namespace bridge::training {
namespace {

using models::GPTConfig;
using ::testing::AllOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

ConfigContainer tiny_config() {
  ConfigContainer config;
  config.model.num_layers = 2;
  config.model.hidden_size = 16;
  config.model.num_attention_heads = 2;
  config.model.vocab_size = 64;
  config.model.seq_length = 8;
  config.train.micro_batch_size = 2;
  config.train.global_batch_size = 4;
  config.train.train_iters = 2;
  config.train.num_threads = 1;
  return config;
}

std::string validation_error(const std::function<void(ConfigContainer&)>& change) {
  ConfigContainer config = tiny_config();
  change(config);
  try {
    config.validate(1);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "<accepted>";
}

fs::path fresh_directory(const std::string& name) {
  const fs::path directory =
      fs::temp_directory_path() / ("bridge_preflight_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(directory);
  fs::create_directories(directory);
  return directory;
}

TEST(Validate, NonFiniteAndOutOfRangeFloatsNameTheKey) {
  EXPECT_THAT(validation_error([](ConfigContainer& c) { c.optimizer.adam_eps = kInf; }),
              HasSubstr("optimizer.adam_eps must be in (0, 1)"));
  EXPECT_THAT(validation_error([](ConfigContainer& c) { c.model.layernorm_epsilon = kInf; }),
              HasSubstr("model.layernorm_epsilon must be in (0, 1)"));
  EXPECT_THAT(validation_error([](ConfigContainer& c) { c.optimizer.lr = kInf; }), HasSubstr("optimizer.lr must be"));
  EXPECT_THAT(validation_error([](ConfigContainer& c) { c.optimizer.weight_decay = kInf; }),
              HasSubstr("optimizer.weight_decay must be finite"));
  EXPECT_THAT(validation_error([](ConfigContainer& c) { c.model.init_method_std = kInf; }),
              HasSubstr("model.init_method_std must be in (0, 1]"));
  EXPECT_THAT(validation_error([](ConfigContainer& c) { c.optimizer.clip_grad = std::nan(""); }),
              HasSubstr("optimizer.clip_grad must be finite"));
  EXPECT_THAT(validation_error([](ConfigContainer& c) { c.train.exit_duration_in_mins = kInf; }),
              HasSubstr("train.exit_duration_in_mins must be finite"));
  EXPECT_THAT(validation_error([](ConfigContainer& c) { c.mixed_precision.initial_loss_scale = kInf; }),
              HasSubstr("both finite"));
  EXPECT_EQ(validation_error([](ConfigContainer&) {}), "<accepted>");
}

// YaRN's fields (position_embedding_type yarn) are refused out of range naming the key, NaN included; Llama 3.1's
// scaling on top of YaRN is refused as two scalings.
TEST(Validate, YarnFieldsNameTheKey) {
  const auto yarn = [](const std::function<void(GPTConfig&)>& change) {
    return validation_error([&](ConfigContainer& c) {
      c.model.position_embedding_type = models::PositionEmbeddingType::kYarn;
      c.model.yarn_rotary_scaling_factor = 4.0;
      change(c.model);
    });
  };
  EXPECT_EQ(yarn([](GPTConfig&) {}), "<accepted>");
  const std::pair<std::function<void(GPTConfig&)>, const char*> refused[] = {
      {[](GPTConfig& m) { m.yarn_rotary_scaling_factor = 0.5; }, "model.yarn_rotary_scaling_factor must be >= 1"},
      {[](GPTConfig& m) { m.yarn_rotary_scaling_factor = std::nan(""); }, "model.yarn_rotary_scaling_factor must be"},
      {[](GPTConfig& m) { m.yarn_original_max_position_embeddings = 0; },
       "model.yarn_original_max_position_embeddings must be >= 1"},
      {[](GPTConfig& m) { m.yarn_beta_slow = 0.0; }, "model.yarn_beta_slow must be > 0"},
      {[](GPTConfig& m) { m.yarn_beta_fast = 0.5; }, "model.yarn_beta_fast (0.500000) must be >= model.yarn_beta_slow"},
      {[](GPTConfig& m) { m.yarn_mscale = -1.0; }, "model.yarn_mscale must be >= 0"},
      {[](GPTConfig& m) { m.yarn_mscale_all_dim = kInf; }, "model.yarn_mscale_all_dim must be >= 0"},
      {[](GPTConfig& m) { m.yarn_attention_factor = 0.0; }, "model.yarn_attention_factor must be > 0"},
      {[](GPTConfig& m) { m.rope_scaling = true; }, "set model.rope_scaling to false"},
  };
  for (const auto& [change, message] : refused) EXPECT_THAT(yarn(change), HasSubstr(message));
}

TEST(Validate, SizesThatOverflowNameEveryFactor) {
  EXPECT_THAT(validation_error([](ConfigContainer& c) { c.train.train_iters = kMax; }),
              AllOf(HasSubstr("train.train_iters (" + std::to_string(kMax) + ") x train.global_batch_size (4)"),
                    HasSubstr("overflows a 64-bit integer")));
  EXPECT_THAT(validation_error([](ConfigContainer& c) { c.model.hidden_size = kMax - 1; }),
              AllOf(HasSubstr("model.hidden_size"), HasSubstr("overflows")));
  EXPECT_THAT(validation_error([](ConfigContainer& c) { c.model.seq_length = kMax; }),
              AllOf(HasSubstr("model.seq_length"), HasSubstr("overflows")));
  EXPECT_THAT(validation_error([](ConfigContainer& c) {
                c.train.micro_batch_size = kMax;
                c.train.global_batch_size = kMax;
                c.train.train_iters = 0;
              }),
              AllOf(HasSubstr("train.micro_batch_size"), HasSubstr("overflows")));
  EXPECT_THAT(validation_error([](ConfigContainer& c) { c.scheduler.lr_warmup_iters = kMax / 2; }),
              AllOf(HasSubstr("scheduler.lr_warmup_iters"), HasSubstr("overflows")));
}

TEST(Validate, ATimeoutTooShortForARendezvousIsRefusedWithTheReason) {
  EXPECT_THAT(validation_error([](ConfigContainer& c) { c.parallelism.timeout = std::chrono::milliseconds(100); }),
              AllOf(HasSubstr("parallelism.timeout must be at least 5 s, got 100 ms"), HasSubstr("rendezvous")));
  EXPECT_EQ(validation_error([](ConfigContainer& c) { c.parallelism.timeout = std::chrono::seconds(5); }),
            "<accepted>");
  EXPECT_THAT(
      validation_error([](ConfigContainer& c) { c.parallelism.rendezvous_timeout = std::chrono::milliseconds(4999); }),
      AllOf(HasSubstr("parallelism.rendezvous_timeout must be at least 5 s, got 4999 ms"),
            HasSubstr("starting every rank takes seconds")));
  EXPECT_EQ(validation_error([](ConfigContainer& c) { c.parallelism.rendezvous_timeout = std::chrono::seconds(5); }),
            "<accepted>");
}

// The distributed optimizer's two switches agree, and what it does not do yet is refused before anything runs.
TEST(Validate, TheDistributedOptimizerNeedsBothOfItsKeys) {
  const auto both = [](ConfigContainer& c) {
    c.optimizer.use_distributed_optimizer = true;
    c.ddp.use_distributed_optimizer = true;
  };
  EXPECT_EQ(validation_error(both), "<accepted>");
  EXPECT_THAT(validation_error([](ConfigContainer& c) { c.optimizer.use_distributed_optimizer = true; }),
              AllOf(HasSubstr("optimizer.use_distributed_optimizer and ddp.use_distributed_optimizer differ"),
                    HasSubstr("set both")));
  EXPECT_THAT(validation_error([](ConfigContainer& c) { c.ddp.overlap_param_gather = true; }),
              AllOf(HasSubstr("ddp.overlap_param_gather is true without the distributed optimizer"),
                    HasSubstr("ddp.overlap_param_gather to false")));
  EXPECT_EQ(validation_error([&](ConfigContainer& c) {
              both(c);
              c.ddp.overlap_param_gather = true;
            }),
            "<accepted>");
  // fp16 and checkpoints (tests/dist/gpt_dist_test.cpp, checkpoint_dist_test.cpp).
  EXPECT_EQ(validation_error([&](ConfigContainer& c) {
              both(c);
              c.mixed_precision.fp16 = true;
              c.checkpoint.save = "/tmp/never_written";
              c.checkpoint.load = "/tmp/never_read";
            }),
            "<accepted>");
}

// Megatron's accounting: Adam's 8 bytes (and bf16's fp32 main params, 4) over the data-parallel ranks.
TEST(TheoreticalMemory, TheDistributedOptimizerDividesTheOptimizerStateByTheDataParallelSize) {
  ConfigContainer config = tiny_config();
  const double plain = training::utils::estimate_memory(config, 4).optimizer;
  config.optimizer.use_distributed_optimizer = config.ddp.use_distributed_optimizer = true;
  EXPECT_DOUBLE_EQ(training::utils::estimate_memory(config, 4).optimizer, plain / 4);
  config.parallelism.tensor_model_parallel_size = 2;  // dp 2 of 4 ranks
  ConfigContainer tp2 = config;
  tp2.optimizer.use_distributed_optimizer = tp2.ddp.use_distributed_optimizer = false;
  EXPECT_DOUBLE_EQ(training::utils::estimate_memory(config, 4).optimizer,
                   training::utils::estimate_memory(tp2, 4).optimizer / 2);
}

TEST(ConfigFile, ADirectoryIsNotARecipe) {
  const fs::path directory = fresh_directory("config_dir");
  try {
    load_config_yaml(directory);
    ADD_FAILURE() << "a directory loaded as a recipe";
  } catch (const ConfigError& error) {
    EXPECT_THAT(error.what(), HasSubstr("is a directory; pass the YAML recipe itself"));
  }
  fs::remove_all(directory);
}

TEST(WriteProbe, RefusesPathsThatCannotBeWrittenAndLeavesNothing) {
  const fs::path directory = fresh_directory("probe");
  const fs::path file = directory / "a_file";
  std::ofstream(file) << "x";
  try {
    bridge::utils::require_writable_directory(file / "ckpt", "checkpoint.save");
    ADD_FAILURE() << "a path under a file was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), AllOf(HasSubstr("checkpoint.save"), HasSubstr("is a file, not a directory")));
  }
  // /proc refuses new entries even to root.
  EXPECT_THROW(bridge::utils::require_writable_directory("/proc/bridge_checkpoints", "checkpoint.save"),
               std::invalid_argument);
  try {
    bridge::utils::require_writable_file(directory, "logging.jsonl_path");
    ADD_FAILURE() << "a directory was accepted as the JSONL file";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), AllOf(HasSubstr("logging.jsonl_path"), HasSubstr("is a directory")));
  }
  // A writable path that does not exist yet: accepted, and neither it nor a probe file is left behind.
  bridge::utils::require_writable_directory(directory / "new" / "ckpt", "checkpoint.save");
  bridge::utils::require_writable_file(directory / "metrics.jsonl", "logging.jsonl_path");
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(directory)) left.push_back(entry.path().filename().string());
  EXPECT_THAT(left, ::testing::ElementsAre("a_file"));
  fs::remove_all(directory);
}

// Megatron's expert sharding: a rank holds E / (etp x ep) of each MoE layer's routed experts, and the distributed
// optimizer keeps their state over the expert-data-parallel ranks (world / (etp x ep x pp)), the rest over dp.
TEST(TheoreticalMemory, ExpertsAreCountedPerExpertParallelRank) {
  ConfigContainer config = tiny_config();
  config.model.gated_linear_unit = true;
  config.model.add_bias_linear = false;
  config.model.num_moe_experts = 4;
  config.model.moe_ffn_hidden_size = 10;
  const double h = static_cast<double>(config.model.hidden_size);
  const double experts = static_cast<double>(config.model.num_layers) * 4 * 3 * h * 10;  // [gate; up] and down
  const training::utils::MemoryEstimate ep1 = training::utils::estimate_memory(config, 2);
  config.parallelism.expert_model_parallel_size = 2;
  const training::utils::MemoryEstimate ep2 = training::utils::estimate_memory(config, 2);
  EXPECT_DOUBLE_EQ(ep1.parameters - ep2.parameters, experts / 2);
  config.optimizer.use_distributed_optimizer = config.ddp.use_distributed_optimizer = true;
  const training::utils::MemoryEstimate sharded = training::utils::estimate_memory(config, 2);
  // At ep 2 on 2 ranks the expert-data-parallel size is 1: the experts' Adam state stays whole, the rest halves.
  EXPECT_DOUBLE_EQ(sharded.optimizer, (ep2.parameters - experts / 2) * 8.0 / 2 + experts / 2 * 8.0);
}

// GPT-2's block tied and untied, then Llama's (RMSNorm, RoPE, SwiGLU, grouped queries, no biases), Qwen2's (a QKV
// bias without the others), Qwen3's (q/k norms, a head width of its own) and an MoE model (routed experts, a gated
// shared expert, a dense layer among the MoE ones), and OLMoE's q/k norms over all heads.
TEST(TheoreticalMemory, ParameterCountEqualsTheBuiltModel) {
  for (int variant = 0; variant < 7; ++variant) {
    const bool tied = variant != 1;
    ConfigContainer config = tiny_config();
    config.model.share_embeddings_and_output_weights = tied;
    config.model.ffn_hidden_size = 24;
    if (variant >= 2) {
      config.model.normalization = models::Normalization::kRMSNorm;
      config.model.position_embedding_type = models::PositionEmbeddingType::kRope;
      config.model.gated_linear_unit = true;
      config.model.activation_func = models::ActivationFunc::kSilu;
      config.model.num_query_groups = config.model.num_attention_heads / 2;
      config.model.add_bias_linear = false;
    }
    if (variant == 3) config.model.add_qkv_bias = true;
    if (variant == 4) {
      config.model.qk_layernorm = true;
      config.model.kv_channels = 6;
      config.model.normalization = models::Normalization::kLayerNorm;
    }
    if (variant == 6) {  // OLMoE's q/k norms over all heads
      config.model.qk_layernorm = true;
      config.model.qk_layernorm_across_heads = true;
    }
    if (variant == 5) {
      config.model.num_moe_experts = 4;
      config.model.moe_ffn_hidden_size = 10;
      config.model.moe_shared_expert_intermediate_size = 6;
      config.model.moe_shared_expert_gate = true;
      config.model.moe_layer_freq.pattern.assign(static_cast<std::size_t>(config.model.num_layers), 1);
      config.model.moe_layer_freq.pattern[1] = 0;
    }
    int64_t built = 0;
    auto callbacks = std::make_shared<CallbackManager>();
    callbacks->register_callback(Event::kTrainStart, [&](CallbackContext& ctx) {
      for (const auto& chunk : ctx.model) {
        for (const torch::Tensor& param : chunk->parameters()) built += param.numel();
      }
    });
    config.train.train_iters = 1;
    pretrain(config, gpt_forward_step, callbacks);
    EXPECT_EQ(training::utils::num_parameters(config.model, 1), static_cast<double>(built)) << "variant " << variant;
    const training::utils::MemoryEstimate estimate = training::utils::estimate_memory(config, 1);
    EXPECT_EQ(estimate.parameters, static_cast<double>(built));
    EXPECT_EQ(estimate.weights, 4.0 * built);
    EXPECT_EQ(estimate.optimizer, 8.0 * built);  // AdamW's two fp32 moments
  }
}

// GPT-2 124M (12 layers, hidden 768, 12 heads, GPT-2's vocabulary) at one micro-batch of 4 x 1024 tokens.
ConfigContainer gpt2_124m_at_4x1024() {
  ConfigContainer config;
  config.model.num_layers = 12;
  config.model.hidden_size = 768;
  config.model.num_attention_heads = 12;
  config.model.seq_length = 1024;
  config.model.vocab_size = 50257;
  config.train.micro_batch_size = 4;
  config.train.global_batch_size = 4;
  return config;
}

// GPT-2 124M at 4 x 1024 tokens in fp32, by hand from Korthikanti et al.'s count (s b h (10 + 24 / t) at 16 bits:
// 8 of activations and 2 of one-byte dropout masks on every rank, 24 / t split; the activations take twice that in
// fp32): what each recomputation mode leaves of the activations (the logits, 4096 x 50304 fp32, stay).
TEST(TheoreticalMemory, RecomputationKeepsTheRunsInputsAndOneRunsActivations) {
  ConfigContainer config = gpt2_124m_at_4x1024();
  const double sbh = 1024.0 * 4 * 768, logits = 4096.0 * 50304 * 4;
  const double replicated = 8 * 2 + 2;  // fp32 activations, hidden dropout's masks
  const double layer = sbh * (replicated + 24 * 2), input = sbh * 4;
  const auto activations = [&](const ConfigContainer& c) { return training::utils::estimate_memory(c, 1).activations; };
  EXPECT_DOUBLE_EQ(activations(config), 12 * layer + logits);
  ConfigContainer full = config;
  full.model.recompute_granularity = models::RecomputeGranularity::kFull;
  full.model.recompute_method = models::RecomputeMethod::kUniform;
  full.model.recompute_num_layers = 1;
  EXPECT_DOUBLE_EQ(activations(full), 12 * input + layer + logits);
  full.model.recompute_num_layers = 4;  // 3 runs of 4 layers, one rebuilt at a time
  EXPECT_DOUBLE_EQ(activations(full), 3 * input + 4 * layer + logits);
  full.model.recompute_method = models::RecomputeMethod::kBlock;  // 4 layers keep their inputs, 8 everything
  EXPECT_DOUBLE_EQ(activations(full), 4 * input + 8 * layer + logits);
  ConfigContainer selective = config;
  selective.model.recompute_granularity = models::RecomputeGranularity::kSelective;
  selective.model.recompute_modules = std::vector<std::string>{"mlp"};  // without fc1's and GeLU's outputs: 8 split
  EXPECT_DOUBLE_EQ(activations(selective), 12 * sbh * (replicated + 8 * 2) + logits);
  // The unfused attention keeps the 12 heads' 1024 x 1024 probabilities (2 a s / h without dropout, 5 with), which
  // selective core_attn recomputes.
  config.model.attention_backend = models::AttnBackend::kUnfused;
  config.model.attention_dropout = 0.0;
  EXPECT_DOUBLE_EQ(activations(config), 12 * sbh * (replicated + (24 + 2.0 * 12 * 1024 / 768) * 2) + logits);
  config.model.attention_dropout = 0.1;
  EXPECT_DOUBLE_EQ(activations(config), 12 * sbh * (replicated + (24 + 5.0 * 12 * 1024 / 768) * 2) + logits);
  config.model.hidden_dropout = 0.0;  // no masks
  EXPECT_DOUBLE_EQ(activations(config), 12 * sbh * (8 * 2 + (24 + 5.0 * 12 * 1024 / 768) * 2) + logits);
  config.model.hidden_dropout = 0.1;
  config.model.recompute_granularity = models::RecomputeGranularity::kSelective;
  EXPECT_DOUBLE_EQ(activations(config), 12 * layer + logits);
}

// Korthikanti et al.'s two counts at tp 2: s b h (10 + 24 / t) with tensor parallelism alone, s b h 34 / t with
// sequence parallelism (16 bits; twice in fp32), which also splits full recomputation's kept inputs. At tp 1 the
// switch is off, as in Megatron.
TEST(TheoreticalMemory, SequenceParallelismSplitsTheReplicatedActivationsOverTheTensorParallelRanks) {
  ConfigContainer config = gpt2_124m_at_4x1024();
  config.parallelism.tensor_model_parallel_size = 2;
  const double sbh = 1024.0 * 4 * 768, logits = 4096.0 * 50432 / 2 * 4;  // vocabulary padded to 256 x 197
  const auto activations = [&](const ConfigContainer& c) { return training::utils::estimate_memory(c, 2).activations; };
  const double replicated = 8 * 2 + 2, split = 24.0 / 2 * 2;  // fp32, hidden dropout's masks
  EXPECT_DOUBLE_EQ(activations(config), 12 * sbh * (replicated + split) + logits);
  ConfigContainer sp = config;
  sp.model.sequence_parallel = true;
  EXPECT_DOUBLE_EQ(activations(sp), 12 * sbh * (replicated / 2 + split) + logits);
  sp.model.recompute_granularity = models::RecomputeGranularity::kFull;
  sp.model.recompute_method = models::RecomputeMethod::kUniform;
  sp.model.recompute_num_layers = 1;
  EXPECT_DOUBLE_EQ(activations(sp), 12 * sbh * 4 / 2 + sbh * (replicated / 2 + split) + logits);
  ConfigContainer alone = config;
  alone.parallelism.tensor_model_parallel_size = 1;
  ConfigContainer alone_sp = alone;
  alone_sp.model.sequence_parallel = true;
  EXPECT_DOUBLE_EQ(activations(alone_sp), activations(alone));
}

// Beyond Korthikanti, what bridge's Llama block certainly keeps: RMSNorm's normalised input (one more tensor for each
// of the two norms) and RoPE's rotated q and k beside the QKV projection. GPT-2 124M's shape in fp32 without dropout.
TEST(TheoreticalMemory, RmsNormAndRopeKeepTheirOwnTensors) {
  ConfigContainer config = gpt2_124m_at_4x1024();
  config.model.hidden_dropout = 0.0;
  const double sbh = 1024.0 * 4 * 768, logits = 4096.0 * 50304 * 4;
  const auto activations = [&](const ConfigContainer& c) { return training::utils::estimate_memory(c, 1).activations; };
  const double gpt = 12 * sbh * (8 * 2 + 24 * 2) + logits;
  EXPECT_DOUBLE_EQ(activations(config), gpt);
  config.model.normalization = models::Normalization::kRMSNorm;
  EXPECT_DOUBLE_EQ(activations(config), gpt + 12 * sbh * 2 * 4);
  config.model.position_embedding_type = models::PositionEmbeddingType::kRope;
  config.model.num_query_groups = 4;  // q 768 and k 256 channels a token
  EXPECT_DOUBLE_EQ(activations(config), gpt + 12 * sbh * 2 * 4 + 12 * 1024.0 * 4 * (768 + 256) * 4);
}

// Context parallelism at cp 2: each rank's 512 of the 1024 tokens in every per-token term (the logits too), the
// attention's part as each cp_comm_type keeps it, and the parameters, gradients and optimizer state of cp 1, which
// the distributed optimizer shards over dp x cp. GPT-2 124M's shape at 4 x 1024 tokens in fp32 without dropout.
TEST(TheoreticalMemory, ContextParallelismSplitsTheSequenceAndAddsWhatEachCommTypeKeeps) {
  using parallel::context_parallel::CpCommType;
  ConfigContainer config = gpt2_124m_at_4x1024();
  config.model.hidden_dropout = 0.0;
  config.model.attention_dropout = 0.0;
  const double h = 768, heads = 12, s = 1024, local = 512, b = 4;
  const double outside_attention = local * b * h * (8 * 2 + 16 * 2);  // the norms' and the MLP's, fp32
  const double logits = local * b * 50304 * 4;
  const training::utils::MemoryEstimate cp1 = training::utils::estimate_memory(config, 1);
  ConfigContainer cp2 = config;
  cp2.parallelism.context_parallel_size = 2;
  const auto with = [&](CpCommType type) {
    ConfigContainer c = cp2;
    c.model.cp_comm_type = type;
    return training::utils::estimate_memory(c, 2);
  };
  // a2a: q, k, v of half the heads over the whole sequence (the local q, k and v's size), the fused attention's output
  // over them and its fp32 log-sum-exp, and linear_proj's input: five [512, 4, 768] tensors and the LSE.
  const double a2a_layer = outside_attention + local * b * (5 * h * 4 + heads * 4);
  EXPECT_DOUBLE_EQ(with(CpCommType::kA2A).activations, 12 * a2a_layer + logits);
  // Korthikanti's four attention tensors at cp 1; cp 2 keeps half the tokens and one more tensor (the output).
  EXPECT_DOUBLE_EQ(cp1.activations, 12 * 2 * (outside_attention + local * b * 4 * h * 4) + 2 * logits);
  // p2p keeps as much here (the projection, which v views, the ring's output, the LSE, linear_proj's input); its
  // backward's working set (none with fused blocks on LibTorch >= 2.5; before, the own block's probabilities and their
  // gradient, 2 x 48 x 512 x 512 fp32) stays under the 50304-wide logits freed before it.
  EXPECT_DOUBLE_EQ(with(CpCommType::kP2P).activations, 12 * a2a_layer + logits);
  // all_gather: the local queries (the projection they view), the whole sequence's keys and values, the fp32
  // probabilities of the local queries over the whole sequence with their boolean mask, linear_proj's input.
  const double all_gather_layer =
      outside_attention + local * b * (3 * h * 4 + 2 * h * 2 * 4 + heads * s * 4 + s + h * 4);
  EXPECT_DOUBLE_EQ(with(CpCommType::kAllGather).activations, 12 * all_gather_layer + logits);
  // Replicated over cp as over dp: parameters, gradients and the optimizer's state are those of cp 1, and the
  // distributed optimizer shards its state over the dp x cp = 2 ranks.
  const training::utils::MemoryEstimate p2p = with(CpCommType::kP2P);
  EXPECT_DOUBLE_EQ(p2p.parameters, cp1.parameters);
  EXPECT_DOUBLE_EQ(p2p.weights, cp1.weights);
  EXPECT_DOUBLE_EQ(p2p.gradients, cp1.gradients);
  EXPECT_DOUBLE_EQ(p2p.optimizer, cp1.optimizer);
  cp2.optimizer.use_distributed_optimizer = cp2.ddp.use_distributed_optimizer = true;
  EXPECT_DOUBLE_EQ(training::utils::estimate_memory(cp2, 2).optimizer, cp1.optimizer / 2);
}

// Where the attention's backward needs more room than the logits and the last layer's MLP free before it, that room
// is the peak: a small vocabulary and 8192 tokens (4 layers of hidden 256, 4 heads, fp32, as the benchmark's).
TEST(TheoreticalMemory, TheContextParallelAttentionsWorkingSetIsThePeakWhereItExceedsWhatIsFreedBeforeIt) {
  using parallel::context_parallel::CpCommType;
  ConfigContainer config;
  config.model.num_layers = 4;
  config.model.hidden_size = 256;
  config.model.num_attention_heads = 4;
  config.model.seq_length = 8192;
  config.model.vocab_size = 8192;
  config.model.hidden_dropout = 0.0;
  config.model.attention_dropout = 0.0;
  config.train.micro_batch_size = 1;
  config.train.global_batch_size = 1;
  config.parallelism.context_parallel_size = 2;
  const double h = 256, local = 4096, s = 8192;
  const double outside_attention = local * h * (8 * 2 + 16 * 2), mlp_half = local * h * (4 * 2 + 16 * 2);
  const double logits = local * 8192 * 4;
  const auto activations = [&](CpCommType type) {
    ConfigContainer c = config;
    c.model.cp_comm_type = type;
    return training::utils::estimate_memory(c, 2).activations;
  };
  const double a2a = 4 * (outside_attention + local * (5 * h * 4 + 4 * 4)) + logits;
  EXPECT_DOUBLE_EQ(activations(CpCommType::kA2A), a2a);  // SDPA works in tiles
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
  // p2p keeps what a2a keeps; its blocks run LibTorch's fused CPU flash attention, in tiles.
  EXPECT_DOUBLE_EQ(activations(CpCommType::kP2P), a2a);
#else
  // p2p keeps what a2a keeps, then recomputes its own [4096, 4096] block's probabilities for 4 heads with their
  // gradient beside them (256 MiB each) once the logits and the last MLP are freed.
  EXPECT_DOUBLE_EQ(activations(CpCommType::kP2P), a2a - logits - mlp_half + 2 * 4 * local * local * 4);
#endif
  const double all_gather_kept =
      4 * (outside_attention + local * (3 * h * 4 + 2 * h * 2 * 4 + 4 * s * 4 + s + h * 4)) + logits;
  EXPECT_DOUBLE_EQ(activations(CpCommType::kAllGather), all_gather_kept - logits - mlp_half + 2 * 4 * local * s * 4);
}

// The preflight's error, checked to come before the first step.
std::string preflight_error(ConfigContainer config, int* train_starts) {
  auto callbacks = std::make_shared<CallbackManager>();
  callbacks->register_callback(Event::kTrainStart, [train_starts](CallbackContext&) { ++*train_starts; });
  try {
    pretrain(config, gpt_forward_step, callbacks);
  } catch (const PreflightError& error) {
    EXPECT_EQ(error.source_rank(), 0);
    return error.what();
  }
  return "<no error>";
}

TEST(Preflight, AModelThatCannotFitFailsBeforeAllocatingWithTheEstimateAndTheKeys) {
  ConfigContainer config = tiny_config();
  config.model.hidden_size = 1 << 20;  // hidden 1M: hundreds of terabytes
  config.model.num_attention_heads = 16;
  int starts = 0;
  const auto begin = std::chrono::steady_clock::now();
  EXPECT_THAT(preflight_error(config, &starts),
              AllOf(HasSubstr("need an estimated"), HasSubstr("TiB (weights"), HasSubstr("host memory available"),
                    HasSubstr("model.hidden_size"), HasSubstr("parallelism.tensor_model_parallel_size")));
  EXPECT_EQ(starts, 0);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count(), 10.0);

  config = tiny_config();
  config.model.num_layers = 100000;  // 100k layers of hidden 256: terabytes
  config.model.hidden_size = 256;
  EXPECT_THAT(preflight_error(config, &starts), AllOf(HasSubstr("need an estimated"), HasSubstr("model.num_layers")));
  EXPECT_EQ(starts, 0);
}

TEST(Preflight, UnwritableOutputsFailBeforeTraining) {
  const fs::path directory = fresh_directory("outputs");
  std::ofstream(directory / "a_file") << "x";
  int starts = 0;
  ConfigContainer config = tiny_config();
  config.checkpoint.save = (directory / "a_file" / "ckpt").string();
  EXPECT_THAT(preflight_error(config, &starts), AllOf(HasSubstr("checkpoint.save"), HasSubstr("not a directory")));
  config = tiny_config();
  config.logging.tensorboard_dir = "/proc/bridge_tensorboard";
  EXPECT_THAT(preflight_error(config, &starts), HasSubstr("logging.tensorboard_dir: cannot write in /proc"));
  config = tiny_config();
  config.logging.jsonl_path = directory.string();
  EXPECT_THAT(preflight_error(config, &starts), AllOf(HasSubstr("logging.jsonl_path"), HasSubstr("is a directory")));
  EXPECT_EQ(starts, 0);
  fs::remove_all(directory);
}

TEST(Preflight, NumThreadsIsCappedAtTheCores) {
  ConfigContainer config = tiny_config();
  config.train.num_threads = 1000;
  config.train.train_iters = 1;
  int threads = 0;
  auto callbacks = std::make_shared<CallbackManager>();
  callbacks->register_callback(Event::kTrainStart, [&](CallbackContext&) { threads = torch::get_num_threads(); });
  pretrain(config, gpt_forward_step, callbacks);
  EXPECT_GE(threads, 1);
  EXPECT_LE(threads, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace
}  // namespace bridge::training
