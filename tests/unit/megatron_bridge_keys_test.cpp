// Megatron-Bridge's config names: its overrides and recipes (its ConfigContainer's sections and fields, Hydra's
// override forms, its YAML dumps' `_target_` keys) set bridge's fields; two spellings of one field must agree;
// features bridge lacks are refused unless left off; misspelt keys still get a suggestion.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/unit/config_test_support.h"
#include "training/config/config_yaml.h"
#include "training/tokenizer_setup.h"

namespace bridge::training {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

ConfigContainer with_overrides(std::initializer_list<std::string> overrides) {
  ConfigContainer config;
  for (const std::string& assignment : overrides) apply_override(config, assignment);
  return config;
}

using testing::config_error;
using testing::override_error;

TEST(MegatronBridgeKeys, OverridesWithItsNamesSetBridgesFields) {
  const ConfigContainer config = with_overrides({
      "model.tensor_model_parallel_size=2",
      "model.pipeline_model_parallel_size=2",
      "model.virtual_pipeline_model_parallel_size=2",
      "model.context_parallel_size=2",
      "logger.tensorboard_dir=/tmp/tb",
      "logger.log_interval=5",
      "dataset.seq_length=128",
      "dataset.random_seed=7",
      "validation.eval_iters=3",
      "validation.eval_interval=50",
      "dist.distributed_backend=gloo",
      "dist.distributed_timeout_minutes=15",
      "checkpoint.load_optim=false",
      "checkpoint.load_rng=true",
      "tokenizer.vocab_size=50257",
      "model.bf16=true",
      "ddp.check_for_nan_in_grad=false",
  });
  EXPECT_EQ(config.parallelism.tensor_model_parallel_size, 2);
  EXPECT_EQ(config.parallelism.pipeline_model_parallel_size, 2);
  EXPECT_EQ(config.parallelism.virtual_pipeline_model_parallel_size, 2);
  EXPECT_EQ(config.parallelism.context_parallel_size, 2);
  EXPECT_EQ(config.logging.tensorboard_dir, "/tmp/tb");
  EXPECT_EQ(config.logging.log_interval, 5);
  EXPECT_EQ(config.model.seq_length, 128);
  EXPECT_EQ(config.rng.seed, 7u);
  EXPECT_EQ(config.train.eval_iters, 3);
  EXPECT_EQ(config.train.eval_interval, 50);
  EXPECT_EQ(config.parallelism.backend, parallel::Backend::kGloo);
  EXPECT_EQ(config.parallelism.timeout, std::chrono::minutes(15));
  EXPECT_TRUE(config.checkpoint.no_load_optim);
  EXPECT_FALSE(config.checkpoint.no_load_rng);
  EXPECT_EQ(config.tokenizer.vocab_size, 50257);
  EXPECT_TRUE(config.mixed_precision.bf16);
  EXPECT_FALSE(config.train.check_for_nan_in_loss_and_grad);

  // --print-config shows bridge's names only.
  const std::string yaml = to_yaml(config);
  EXPECT_THAT(yaml, AllOf(HasSubstr("tensorboard_dir: /tmp/tb"), HasSubstr("timeout: 15min")));
  EXPECT_THAT(yaml, AllOf(Not(HasSubstr("logger")), Not(HasSubstr("distributed_timeout_minutes"))));
}

TEST(MegatronBridgeKeys, HydraOverrideFormsSetAndReset) {
  ConfigContainer config = with_overrides({"+train.train_iters=5", "++optimizer.lr=0.5", "mixed_precision=bf16-mixed"});
  EXPECT_EQ(config.train.train_iters, 5);
  EXPECT_EQ(config.optimizer.lr, 0.5);
  EXPECT_TRUE(config.mixed_precision.bf16);
  apply_override(config, "~train.train_iters");
  apply_override(config, "logger.log_interval=9");
  apply_override(config, "~logger.log_interval");
  EXPECT_EQ(config.train.train_iters, ConfigContainer().train.train_iters);
  EXPECT_EQ(config.logging.log_interval, ConfigContainer().logging.log_interval);
  EXPECT_EQ(config.optimizer.lr, 0.5);
  EXPECT_THAT(override_error("~train.train_iterz"), HasSubstr("did you mean 'train.train_iters'?"));
}

TEST(MegatronBridgeKeys, MisspeltKeysInItsSectionsStillGetASuggestion) {
  EXPECT_THAT(override_error("logger.tensorbord_dir=/tmp/tb"),
              AllOf(HasSubstr("unknown config key 'logger.tensorbord_dir'"),
                    HasSubstr("did you mean 'logging.tensorboard_dir'?")));
  EXPECT_THAT(override_error("logger.zzzzzzzz=1"), HasSubstr("the keys of 'logging' are logging.log_interval"));
  EXPECT_THAT(override_error("dist.world_size=8"), HasSubstr("unknown config key 'dist.world_size'"));
}

TEST(MegatronBridgeKeys, FeaturesBridgeLacksAreAcceptedOnlyWhenOff) {
  EXPECT_NO_THROW(with_overrides({"model.sequence_parallel=false", "model.context_parallel_size=1",
                                  "optimizer.use_distributed_optimizer=false", "model.normalization=LayerNorm",
                                  "scheduler.lr_warmup_init=0.0", "model.num_query_groups=null"}));
  EXPECT_THAT(
      override_error("model.moe_enable_deepep=true"),
      AllOf(HasSubstr("model.moe_enable_deepep=true is not supported"), HasSubstr("set it to false or remove it")));
  EXPECT_TRUE(with_overrides({"model.sequence_parallel=true"}).model.sequence_parallel);  // bridge's own keys
  const ConfigContainer distributed =
      with_overrides({"optimizer.use_distributed_optimizer=true", "ddp.use_distributed_optimizer=true"});
  EXPECT_TRUE(distributed.optimizer.use_distributed_optimizer && distributed.ddp.use_distributed_optimizer);
  EXPECT_THAT(override_error("model.apply_residual_connection_post_layernorm=true"),
              HasSubstr("bridge's transformer layers are pre-norm"));
  // Megatron-Core's transformer options are bridge's own keys, under the same names and spellings.
  const ConfigContainer llama =
      with_overrides({"model.normalization=RMSNorm", "model.position_embedding_type=rope", "model.num_query_groups=2",
                      "model.gated_linear_unit=true",
                      "model.activation_func={_target_: torch.nn.functional.silu, "
                      "_call_: false}",
                      "model.add_bias_linear=false", "model.qk_layernorm=true", "model.rotary_base=500000"});
  EXPECT_EQ(llama.model.normalization, models::Normalization::kRMSNorm);
  EXPECT_EQ(llama.model.position_embedding_type, models::PositionEmbeddingType::kRope);
  EXPECT_EQ(llama.model.num_query_groups, 2);
  EXPECT_TRUE(llama.model.gated_linear_unit);
  EXPECT_EQ(llama.model.activation_func, models::ActivationFunc::kSilu);
  EXPECT_FALSE(llama.model.add_bias_linear);
  EXPECT_TRUE(llama.model.qk_layernorm);
  EXPECT_EQ(llama.model.rotary_base, 500000.0);
  EXPECT_THAT(override_error("model.normalization=BatchNorm"), HasSubstr("LayerNorm or RMSNorm"));
  // Megatron-Core's recompute keys, as its recipes write them.
  const ConfigContainer full = with_overrides(
      {"model.recompute_granularity=full", "model.recompute_method=uniform", "model.recompute_num_layers=1",
       "model.distribute_saved_activations=false", "model.recompute_modules=null"});
  EXPECT_EQ(full.model.recompute_granularity, models::RecomputeGranularity::kFull);
  EXPECT_EQ(full.model.recompute_method, models::RecomputeMethod::kUniform);
  EXPECT_EQ(full.model.recompute_num_layers, 1);
  EXPECT_FALSE(full.model.recomputes("core_attn"));
  const ConfigContainer selective =
      with_overrides({"model.recompute_granularity=selective", "model.recompute_modules=[core_attn, mlp]"});
  EXPECT_TRUE(selective.model.recomputes("core_attn"));
  EXPECT_TRUE(selective.model.recomputes("mlp"));
  EXPECT_TRUE(with_overrides({"model.recompute_granularity=selective"}).model.recomputes("core_attn"));
  EXPECT_THAT(override_error("model.distribute_saved_activations=true"),
              HasSubstr("keeps each checkpointed layer input whole"));
  EXPECT_THAT(override_error("model.recompute_granularity=partial"), HasSubstr("full"));
  EXPECT_THAT(override_error("dist.distributed_timeout_minutes=2.5"), HasSubstr("whole number of minutes, got 2.5"));
  EXPECT_THAT(override_error("checkpoint.load_optim=sometimes"), HasSubstr("must be a bool, got sometimes"));
  EXPECT_THAT(override_error("ft={enable_ft_package: true}"),
              AllOf(HasSubstr("'ft' section has no counterpart in bridge"), HasSubstr("set it to null")));
  EXPECT_THAT(override_error("profiling={profile_step_start: 10}"), HasSubstr("type: Profiler"));
}

// The message of the std::invalid_argument that validate() throws for `config` on one rank.
std::string validate_error(const ConfigContainer& config) {
  try {
    config.validate(1);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  ADD_FAILURE() << "validate() threw nothing";
  return "";
}

// Megatron-Bridge's lr_warmup_fraction and sample-based training (train_samples, lr_warmup_samples,
// lr_decay_samples): its recipes' keys load, and what it refuses is refused naming both keys and the fix
// (tests/unit/optimizer_param_scheduler_test.cpp checks the learning rates they give).
TEST(MegatronBridgeKeys, SampleBasedTrainingAndAWarmupFractionAreItsSchedule) {
  const ConfigContainer samples = load_config_yaml_string(R"(
train: {global_batch_size: 8, train_iters: null, train_samples: 800}
scheduler: {lr_warmup_fraction: null, lr_warmup_iters: 0, lr_warmup_samples: 80, lr_decay_iters: null,
            lr_decay_samples: 640, lr_wsd_decay_iters: null, lr_wsd_decay_samples: null,
            lr_wsd_decay_style: exponential}
)");
  EXPECT_EQ(samples.train.train_samples, 800);
  EXPECT_EQ(samples.scheduler.lr_warmup_samples, 80);
  EXPECT_EQ(samples.scheduler.lr_decay_samples, 640);
  EXPECT_NO_THROW(samples.validate(1));
  ConfigContainer finalized = samples;
  finalized.finalize();
  EXPECT_EQ(finalized.train.train_iters, 100);
  EXPECT_EQ(finalized.scheduler_steps().warmup, 80);
  EXPECT_EQ(finalized.scheduler_steps().decay, 640);
  const ConfigContainer fraction = with_overrides({"scheduler.lr_warmup_fraction=0.01", "train.train_iters=1000"});
  EXPECT_NO_THROW(fraction.validate(1));
  EXPECT_EQ(fraction.scheduler_steps().warmup, 10);

  // Both lengths of training, or keys of the other kind: named, with the fix.
  EXPECT_THAT(validate_error(with_overrides({"train.train_iters=100", "train.train_samples=800"})),
              AllOf(HasSubstr("train.train_iters (100) and train.train_samples (800) are both set"),
                    HasSubstr("~train.train_iters")));
  EXPECT_THAT(validate_error(with_overrides({"train.train_samples=800", "scheduler.lr_warmup_iters=10"})),
              AllOf(HasSubstr("scheduler.lr_warmup_iters (10) counts iterations, but train.train_samples makes"),
                    HasSubstr("use scheduler.lr_warmup_samples or scheduler.lr_warmup_fraction")));
  EXPECT_THAT(validate_error(with_overrides({"train.train_samples=800", "scheduler.lr_decay_iters=50"})),
              HasSubstr("scheduler.lr_decay_iters (50) counts iterations"));
  EXPECT_THAT(validate_error(with_overrides({"train.train_iters=100", "scheduler.lr_decay_samples=640"})),
              AllOf(HasSubstr("scheduler.lr_decay_samples (640) counts samples, but the schedule is iteration-based"),
                    HasSubstr("set train.train_samples")));
  EXPECT_THAT(validate_error(with_overrides({"train.train_iters=100", "scheduler.lr_warmup_samples=8"})),
              HasSubstr("scheduler.lr_warmup_samples (8) counts samples"));
  EXPECT_THAT(validate_error(with_overrides({"scheduler.lr_warmup_fraction=0.1", "scheduler.lr_warmup_iters=5"})),
              HasSubstr("scheduler.lr_warmup_fraction and scheduler.lr_warmup_iters (5) are both set; keep one"));
  EXPECT_THAT(validate_error(with_overrides(
                  {"train.train_samples=800", "scheduler.lr_warmup_fraction=0.1", "scheduler.lr_warmup_samples=8"})),
              HasSubstr("scheduler.lr_warmup_fraction and scheduler.lr_warmup_samples (8) are both set"));
  EXPECT_THAT(validate_error(with_overrides({"scheduler.lr_warmup_fraction=1.5"})),
              HasSubstr("scheduler.lr_warmup_fraction must be in [0, 1]"));
  EXPECT_THAT(validate_error(with_overrides({"train.global_batch_size=8", "train.train_samples=4"})),
              HasSubstr("train.train_samples (4) must be at least train.global_batch_size (8)"));
  EXPECT_THAT(override_error("scheduler.lr_wsd_decay_iters=100"), HasSubstr("no WSD decay"));
}

TEST(MegatronBridgeKeys, TwoSpellingsOfOneFieldMustAgree) {
  const ConfigContainer same =
      load_config_yaml_string("model: {seq_length: 256}\ndataset: {seq_length: 256, random_seed: 3}\nrng: {seed: 3}\n");
  EXPECT_EQ(same.model.seq_length, 256);
  EXPECT_EQ(same.rng.seed, 3u);
  EXPECT_THAT(config_error([] {
                load_config_yaml_string("model:\n  seq_length: 1024\ndataset:\n  seq_length: 2048\n", "mb.yaml");
              }),
              AllOf(HasSubstr("mb.yaml:4:3: dataset.seq_length: 2048 disagrees with model.seq_length: 1024"),
                    HasSubstr("both set model.seq_length")));
  // One spelling twice is still an error, even with the same value.
  EXPECT_THAT(config_error([] { load_config_yaml_string("logger: {log_interval: 2}\nlogger.log_interval: 2\n"); }),
              HasSubstr("logger.log_interval is set twice"));
}

TEST(MegatronBridgeKeys, TheSchedulersWeightDecayWinsWhereverItIsWritten) {
  for (const char* yaml : {"optimizer: {weight_decay: 0.1}\nscheduler: {start_weight_decay: 0.033}\n",
                           "scheduler: {start_weight_decay: 0.033, end_weight_decay: 0.033}\n"
                           "optimizer: {weight_decay: 0.1}\n"}) {
    EXPECT_DOUBLE_EQ(load_config_yaml_string(yaml).optimizer.weight_decay, 0.033) << yaml;
  }
  EXPECT_DOUBLE_EQ(load_config_yaml_string("optimizer: {weight_decay: 0.1}\n").optimizer.weight_decay, 0.1);
  EXPECT_THAT(
      config_error([] { load_config_yaml_string("scheduler: {start_weight_decay: 0.0, end_weight_decay: 0.1}\n"); }),
      HasSubstr("scheduler.end_weight_decay: 0.1 disagrees with scheduler.start_weight_decay: 0"));
  EXPECT_THAT(override_error("scheduler.weight_decay_incr_style=linear"), HasSubstr("weight decay is constant"));
}

TEST(MegatronBridgeKeys, NullMeansTheDefaultAndHydraKeysAreIgnored) {
  const ConfigContainer config = load_config_yaml_string(R"(
_target_: megatron.bridge.training.config.ConfigContainer
model:
  _target_: megatron.bridge.models.gpt_provider.GPTModelProvider
  vocab_size: null
  ffn_hidden_size: null
  init_method: {_target_: torch.nn.init.normal_, _partial_: true, _args_: [], mean: 0.0, std: 0.02}
tokenizer: {vocab_size: 32000, tokenizer_type: NullTokenizer}
scheduler: {lr_decay_iters: null, lr_decay_steps: 5120000}
validation: {eval_interval: null}
ft: null
)");
  EXPECT_EQ(config.model.vocab_size, ConfigContainer().model.vocab_size);  // until setup_tokenizer: 32000
  EXPECT_EQ(config.tokenizer.vocab_size, 32000);
  EXPECT_EQ(config.tokenizer.tokenizer_type, "NullTokenizer");
  EXPECT_EQ(config.model.ffn_hidden_size, ConfigContainer().model.ffn_hidden_size);
  EXPECT_EQ(config.scheduler.lr_decay_iters, 0);
  EXPECT_EQ(config.train.eval_interval, 0);
}

TEST(MegatronBridgeKeys, ABlendIsMegatronsDataPathList) {
  EXPECT_EQ(with_overrides({"dataset.blend=[[/d/a, /d/b], [0.3, 0.7]]"}).dataset.data_path,
            (std::vector<std::string>{"0.3", "/d/a", "0.7", "/d/b"}));
  EXPECT_EQ(with_overrides({"dataset.blend=[[/d/a], null]"}).dataset.data_path, (std::vector<std::string>{"/d/a"}));
  EXPECT_THAT(override_error("dataset.blend=[[/d/a, /d/b], [1.0]]"),
              HasSubstr("dataset.blend must be [[prefix, ...], [weight, ...]]"));
}

// A Megatron-Bridge recipe as a run sees it: loaded, then its tokenizer section applied (its model.vocab_size is
// null, "from the tokenizer"). Its NullTokenizer (mock data) is the one thing bridge's recipes leave out, so `ours`
// takes it over before the two are compared.
ConfigContainer megatron_bridge_recipe(const fs::path& path, ConfigContainer& ours) {
  ConfigContainer theirs = load_config_yaml(path);
  setup_tokenizer(theirs);
  EXPECT_EQ(theirs.tokenizer.tokenizer_type, "NullTokenizer");
  EXPECT_EQ(theirs.dataset.eod_token_id, theirs.model.vocab_size - 1);
  ours.tokenizer = theirs.tokenizer;
  ours.dataset.eod_token_id = theirs.dataset.eod_token_id;
  return theirs;
}

// A Llama-3-shaped Megatron-Bridge recipe (RMSNorm, RoPE, SwiGLU, 8 query groups, no biases, untied) is the Llama 3
// 8B recipe in bridge's sections, key for key.
TEST(MegatronBridgeKeys, TheLlama3RecipeInItsLayoutIsBridgesLlama3Recipe) {
  const fs::path recipes = fs::path(BRIDGE_SOURCE_DIR) / "examples" / "recipes";
  ConfigContainer ours = load_config_yaml(recipes / "llama3_8b.yaml");
  const ConfigContainer theirs = megatron_bridge_recipe(recipes / "megatron_bridge_llama3_8b.yaml", ours);
  EXPECT_EQ(theirs.model.normalization, models::Normalization::kRMSNorm);
  EXPECT_EQ(theirs.model.position_embedding_type, models::PositionEmbeddingType::kRope);
  EXPECT_TRUE(theirs.model.gated_linear_unit);
  EXPECT_EQ(theirs.model.activation_func, models::ActivationFunc::kSilu);
  EXPECT_EQ(theirs.model.num_query_groups, 8);
  EXPECT_FALSE(theirs.model.add_bias_linear);
  EXPECT_FALSE(theirs.model.share_embeddings_and_output_weights);
  EXPECT_EQ(theirs.model.vocab_size, 128256);
  EXPECT_TRUE(theirs.mixed_precision.bf16);
  EXPECT_EQ(to_yaml(theirs), to_yaml(ours));
}

// Qwen3 8B adds a head width of its own (kv_channels 128 with hidden 4096 / 32 heads = 128 written out) and q/k
// norms; its recipe in Megatron-Bridge's layout is bridge's, key for key.
TEST(MegatronBridgeKeys, TheQwen3RecipeInItsLayoutIsBridgesQwen3Recipe) {
  const fs::path recipes = fs::path(BRIDGE_SOURCE_DIR) / "examples" / "recipes";
  ConfigContainer ours = load_config_yaml(recipes / "qwen3_8b.yaml");
  const ConfigContainer theirs = megatron_bridge_recipe(recipes / "megatron_bridge_qwen3_8b.yaml", ours);
  EXPECT_TRUE(theirs.model.qk_layernorm);
  EXPECT_EQ(theirs.model.kv_channels, 128);
  EXPECT_EQ(theirs.model.num_query_groups, 8);
  EXPECT_EQ(theirs.model.rotary_base, 1000000.0);
  EXPECT_EQ(theirs.model.layernorm_epsilon, 1e-6);
  EXPECT_EQ(theirs.model.vocab_size, 151936);
  EXPECT_EQ(theirs.parallelism.tensor_model_parallel_size, 4);
  EXPECT_EQ(to_yaml(theirs), to_yaml(ours));
}

// Qwen3-30B-A3B adds the MoE keys under Megatron-Core's names, the expert layout on the model provider (moved to
// parallelism.*) and Transformer Engine's fused-kernel switches (read, the same arithmetic in bridge).
TEST(MegatronBridgeKeys, TheQwen3MoeRecipeInItsLayoutIsBridgesQwen3MoeRecipe) {
  const fs::path recipes = fs::path(BRIDGE_SOURCE_DIR) / "examples" / "recipes";
  ConfigContainer ours = load_config_yaml(recipes / "qwen3_30b_a3b.yaml");
  const ConfigContainer theirs = megatron_bridge_recipe(recipes / "megatron_bridge_qwen3_30b_a3b.yaml", ours);
  EXPECT_EQ(theirs.model.num_moe_experts, 128);
  EXPECT_EQ(theirs.model.moe_ffn_hidden_size, 768);
  EXPECT_EQ(theirs.model.moe_router_topk, 8);
  EXPECT_EQ(theirs.model.moe_token_dispatcher_type, models::MoETokenDispatcherType::kAlltoall);
  EXPECT_EQ(theirs.model.moe_aux_loss_coeff, 1e-3);
  EXPECT_EQ(theirs.parallelism.expert_model_parallel_size, 4);
  EXPECT_EQ(theirs.parallelism.expert_tensor_parallel_size, 1);
  EXPECT_TRUE(theirs.optimizer.use_distributed_optimizer);
  EXPECT_EQ(to_yaml(theirs), to_yaml(ours));
}

TEST(MegatronBridgeKeys, TheShippedRecipeInItsLayoutIsTheTinyRecipe) {
  const fs::path recipes = fs::path(BRIDGE_SOURCE_DIR) / "examples" / "recipes";
  ConfigContainer ours = load_config_yaml(recipes / "tiny.yaml");
  const ConfigContainer theirs = megatron_bridge_recipe(recipes / "megatron_bridge_gpt.yaml", ours);
  EXPECT_EQ(theirs.model.vocab_size, 257);
  EXPECT_EQ(theirs.model.seq_length, 64);
  EXPECT_EQ(theirs.train.eval_iters, 4);
  EXPECT_EQ(theirs.optimizer.weight_decay, 0.01);
  EXPECT_EQ(theirs.dataset.data_path, (std::vector<std::string>{"builtin:tiny_fables"}));
  EXPECT_EQ(theirs.parallelism.timeout, std::chrono::minutes(10));
  // What tiny.yaml leaves to bridge's defaults, the Megatron-Bridge recipe spells out with its own.
  ours.model.ffn_hidden_size = theirs.model.ffn_hidden_size;
  ours.optimizer.adam_beta2 = theirs.optimizer.adam_beta2;
  ours.model.make_vocab_size_divisible_by = theirs.model.make_vocab_size_divisible_by;
  ours.logging.log_timers_to_tensorboard = theirs.logging.log_timers_to_tensorboard;
  ours.parallelism.backend = theirs.parallelism.backend;
  EXPECT_EQ(to_yaml(theirs), to_yaml(ours));
}

}  // namespace
}  // namespace bridge::training
