// The Llama-family pieces of bridge's GPT against references written here from their definitions: the fused QKV
// layout (Megatron-Core's grouping, both ways), RMSNorm, RoPE with Llama 3.1's scaling, interleaved RoPE (against
// Meta's complex multiplication, and the whole model against the halves' layout with q/k channels reordered),
// grouped-query attention against the same attention with every key/value head repeated, and GPTConfig's messages for
// layouts a group count or a context-parallel size does not allow. Also the size text of bridge-export's
// --max-shard-size (transformers' max_shard_size).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "bridge/hf/shard_size.h"
#include "bridge/models/gpt_config.h"
#include "bridge/models/gpt_model.h"
#include "bridge/models/normalization.h"
#include "bridge/models/qkv_layout.h"
#include "bridge/models/rotary_pos_embedding.h"
#include "bridge/models/transformer_layer.h"
#include "parallel/distributed.h"
#include "parallel/parallel_state.h"

namespace bridge::models {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

GPTConfig grouped(int64_t heads, int64_t groups, int64_t head_dim) {
  GPTConfig config;
  config.num_attention_heads = heads;
  config.num_query_groups = groups;
  config.kv_channels = head_dim;
  config.hidden_size = 32;
  return config;
}

TEST(QkvLayout, GroupsEachKeyValueHeadAfterItsQueryHeads) {
  const GPTConfig config = grouped(/*heads=*/4, /*groups=*/2, /*head_dim=*/1);
  // One row per head: q0..q3 = 0..3, k0 k1 = 10 11, v0 v1 = 20 21.
  const torch::Tensor q = torch::arange(4).to(torch::kFloat).unsqueeze(1);
  const torch::Tensor k = torch::tensor({10.0f, 11.0f}).unsqueeze(1), v = torch::tensor({20.0f, 21.0f}).unsqueeze(1);
  const torch::Tensor fused = fuse_qkv(q, k, v, config);
  EXPECT_TRUE(fused.squeeze(1).equal(torch::tensor({0.0f, 1.0f, 10.0f, 20.0f, 2.0f, 3.0f, 11.0f, 21.0f})));
  const auto [q2, k2, v2] = split_qkv(fused, config);
  EXPECT_TRUE(q2.equal(q));
  EXPECT_TRUE(k2.equal(k));
  EXPECT_TRUE(v2.equal(v));
  // Weights with wider heads and biases round-trip too.
  const GPTConfig wide = grouped(8, 2, 3);
  const torch::Tensor w = torch::randn({wide.qkv_size(), 5});
  const auto [wq, wk, wv] = split_qkv(w, wide);
  EXPECT_EQ(wq.sizes(), (std::vector<int64_t>{24, 5}));
  EXPECT_TRUE(fuse_qkv(wq, wk, wv, wide).equal(w));
  EXPECT_THROW(fuse_qkv(wq, wq, wv, wide), std::invalid_argument);
}

TEST(Normalization, RmsNormIsItsDefinition) {
  const torch::Tensor x = torch::randn({3, 7, 16});
  Norm norm(Normalization::kRMSNorm, 16, 1e-5);
  norm->weight.data().uniform_(0.5, 1.5);
  const torch::Tensor expected = x / torch::sqrt(x.pow(2).mean(-1, true) + 1e-5) * norm->weight;
  EXPECT_TRUE(torch::allclose(norm(x), expected, 1e-6, 1e-6));
  EXPECT_FALSE(norm->bias.defined());
  EXPECT_EQ(norm->named_parameters().size(), 1u);
  Norm layer_norm(Normalization::kLayerNorm, 16, 1e-5);
  EXPECT_EQ(layer_norm->named_parameters().size(), 2u);
}

TEST(Rope, RotatesPairsOfChannelsByPositionTimesFrequency) {
  GPTConfig config;
  config.hidden_size = 16;
  config.num_attention_heads = 2;  // head width 8: frequencies base^(-i/4), i = 0..3
  config.position_embedding_type = PositionEmbeddingType::kRope;
  config.rotary_base = 100.0;
  const RotaryEmbedding rope(config);
  const torch::Tensor positions = torch::tensor({{0, 3, 5}});
  const torch::Tensor t = torch::randn({1, 2, 3, 8});  // [b, heads, s, d]
  const torch::Tensor out = apply_rotary_pos_emb(t, rope.tables(positions));
  for (int64_t s = 0; s < 3; ++s) {
    const double position = positions[0][s].item<double>();
    for (int64_t i = 0; i < 4; ++i) {
      const double angle = position * std::pow(100.0, -static_cast<double>(i) / 4.0);
      const torch::Tensor x1 = t.select(2, s).select(-1, i), x2 = t.select(2, s).select(-1, i + 4);
      EXPECT_TRUE(
          torch::allclose(out.select(2, s).select(-1, i), x1 * std::cos(angle) - x2 * std::sin(angle), 1e-5, 1e-5));
      EXPECT_TRUE(
          torch::allclose(out.select(2, s).select(-1, i + 4), x2 * std::cos(angle) + x1 * std::sin(angle), 1e-5, 1e-5));
    }
  }
}

// rotary_interleaved (Megatron-Core's, RoFormer's and GPT-J's layout) against Meta's original Llama apply_rotary_emb
// written out here: each adjacent pair (x_2i, x_2i+1) of the rotated channels read as the complex number
// x_2i + i x_2i+1 and multiplied by e^(i p f_i), f_i = base^(-2i / rotary_dim); the channels past rotary_dim (here half
// of them: rotary_percent 0.5) pass through, and each sample of the batch has its own positions.
TEST(Rope, InterleavedTurnsAdjacentPairsAsComplexNumbers) {
  GPTConfig config;
  config.hidden_size = 32;
  config.num_attention_heads = 2;  // head width 16, rotary_dim 8: frequencies 100^(-i/4), i = 0..3
  config.position_embedding_type = PositionEmbeddingType::kRope;
  config.rotary_base = 100.0;
  config.rotary_percent = 0.5;
  config.rotary_interleaved = true;
  const RotaryEmbedding rope(config);
  const torch::Tensor positions = torch::tensor({{0, 3, 5, 11}, {7, 1, 2, 40}});
  const torch::Tensor t = torch::randn({2, 2, 4, 16}, torch::kFloat64);  // [b, heads, s, d]
  const RotaryTables tables = rope.tables(positions);
  EXPECT_TRUE(tables.interleaved);
  const torch::Tensor out = apply_rotary_pos_emb(t, tables);

  const torch::Tensor inv_freq = 1.0 / torch::pow(100.0, torch::arange(0, 8, 2, torch::kFloat64) / 8.0);
  const torch::Tensor angles = positions.to(torch::kFloat64).unsqueeze(-1) * inv_freq;     // [b, s, 4]
  const torch::Tensor turn = torch::polar(torch::ones_like(angles), angles).unsqueeze(1);  // [b, 1, s, 4]
  const torch::Tensor pairs = torch::view_as_complex(t.narrow(-1, 0, 8).reshape({2, 2, 4, 4, 2}).contiguous());
  const torch::Tensor expected = torch::cat({torch::view_as_real(pairs * turn).flatten(-2), t.narrow(-1, 8, 8)}, -1);
  // The tables are fp32 (as Megatron-Core's and transformers'): agreement to fp32's precision.
  EXPECT_TRUE(torch::allclose(out, expected, 1e-6, 1e-6)) << (out - expected).abs().max();
  EXPECT_TRUE(torch::equal(out.narrow(-1, 8, 8), t.narrow(-1, 8, 8)));
  // The halves' layout rotates other pairs: the switch is not a no-op.
  config.rotary_interleaved = false;
  const RotaryTables halves = RotaryEmbedding(config).tables(positions);
  EXPECT_FALSE(halves.interleaved);
  EXPECT_FALSE(torch::allclose(apply_rotary_pos_emb(t, halves), expected, 1e-3, 1e-3));
  // In a bf16 model the rotation runs in bf16, as the halves' does.
  EXPECT_EQ(apply_rotary_pos_emb(t.to(torch::kBFloat16), tables).scalar_type(), torch::kBFloat16);
}

TEST(Rope, Llama31ScalingKeepsDividesAndBlendsByWavelength) {
  GPTConfig config;
  config.hidden_size = 32;
  config.num_attention_heads = 2;  // head width 16: 8 frequencies
  config.position_embedding_type = PositionEmbeddingType::kRope;
  const torch::Tensor plain = RotaryEmbedding(config).inv_freq();
  config.rope_scaling = true;
  config.rope_scaling_original_max_position_embeddings = 64;  // wavelengths < 16 kept, > 64 divided by 8
  const torch::Tensor scaled = RotaryEmbedding(config).inv_freq();
  int kept = 0, divided = 0, blended = 0;
  for (int64_t i = 0; i < plain.size(0); ++i) {
    const double f = plain[i].item<double>(), g = scaled[i].item<double>(), wavelength = 2 * M_PI / f;
    if (wavelength < 16) {
      EXPECT_FLOAT_EQ(g, f);
      ++kept;
    } else if (wavelength > 64) {
      EXPECT_FLOAT_EQ(g, f / 8);
      ++divided;
    } else {
      const double smooth = (64 / wavelength - 1) / (4 - 1);
      EXPECT_NEAR(g, (1 - smooth) * f / 8 + smooth * f, 1e-6 * f);
      ++blended;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
}

class GroupedAttention : public ::testing::Test {
 protected:
  void SetUp() override {
    parallel::init_distributed(parallel::LaunchEnv{}, {});
    parallel::initialize_model_parallel(1);
  }
  void TearDown() override { parallel::destroy_distributed(); }
};

// Grouped-query attention is multi-head attention whose key/value heads are repeated for each group's queries: the
// same weights laid out for 4 groups of 1 (each group's k and v copied) give the same output.
TEST_F(GroupedAttention, EqualsMultiHeadAttentionWithRepeatedKeyValueHeads) {
  GPTConfig config;
  config.hidden_size = 32;
  config.num_attention_heads = 4;
  config.num_query_groups = 2;
  config.attention_dropout = 0.0;
  config.position_embedding_type = PositionEmbeddingType::kRope;
  config.qk_layernorm = true;
  config.normalization = Normalization::kRMSNorm;
  SelfAttention gqa(config, "decoder.layers.0.self_attention.");
  GPTConfig mha_config = config;
  mha_config.num_query_groups = 4;
  SelfAttention mha(mha_config, "decoder.layers.0.self_attention.");
  {
    torch::NoGradGuard no_grad;
    const auto [q, k, v] = split_qkv(gqa->linear_qkv->weight, config);
    const auto repeat = [&](const torch::Tensor& heads) {  // [2 * d, h] -> [4 * d, h], each head twice
      return heads.view({2, 1, 8, 32}).expand({2, 2, 8, 32}).reshape({32, 32});
    };
    mha->linear_qkv->weight.copy_(fuse_qkv(q, repeat(k), repeat(v), mha_config));
    mha->linear_qkv->bias.copy_(torch::zeros_like(mha->linear_qkv->bias));
    gqa->linear_qkv->bias.zero_();
    mha->linear_proj->weight.copy_(gqa->linear_proj->weight);
    mha->linear_proj->bias.copy_(gqa->linear_proj->bias);
    gqa->q_layernorm->weight.uniform_(0.5, 1.5);
    mha->q_layernorm->weight.copy_(gqa->q_layernorm->weight);
    mha->k_layernorm->weight.copy_(gqa->k_layernorm->weight);
  }
  const RotaryEmbedding rope(config);
  const torch::Tensor input = torch::randn({6, 2, 32});
  const RotaryTables tables = rope.tables(torch::arange(6).unsqueeze(0).expand({2, 6}));
  gqa->eval();
  mha->eval();
  EXPECT_TRUE(torch::allclose(gqa(input, torch::Tensor(), &tables), mha(input, torch::Tensor(), &tables), 1e-5, 1e-5));
}

// The whole model with rotary_interleaved (the flag reaching every layer through GPTModel's RotaryEmbedding) computes
// what the halves' layout computes once each query and key head's channels are reordered [0, 2, 4, ..; 1, 3, 5, ..]:
// a channel order q and k share leaves q.k unchanged, and it puts each adjacent pair at (i, i + d / 2). This is how
// Hugging Face's convert_llama_weights_to_hf reads Meta's interleaved checkpoints into its halves' Llama.
TEST_F(GroupedAttention, InterleavedModelIsTheHalvesModelWithQueryAndKeyChannelsReordered) {
  GPTConfig config;
  config.num_layers = 2;
  config.hidden_size = 32;
  config.num_attention_heads = 4;
  config.num_query_groups = 2;  // head width 8
  config.vocab_size = 64;
  config.seq_length = 6;
  config.hidden_dropout = config.attention_dropout = 0.0;
  config.position_embedding_type = PositionEmbeddingType::kRope;
  config.normalization = Normalization::kRMSNorm;
  config.init_method_std = 0.3;  // scores far from 0, so that which channels turn together shows in the logits
  config.rotary_interleaved = true;
  GPTChunkOptions whole;
  whole.num_layers = config.num_layers;
  GPTModel interleaved(config, whole);
  GPTConfig halves_config = config;
  halves_config.rotary_interleaved = false;
  GPTModel halves(halves_config, whole), unchanged(halves_config, whole);
  const int64_t d = config.head_dim();
  const torch::Tensor order = torch::cat({torch::arange(0, d, 2), torch::arange(1, d, 2)});
  const auto reorder_heads = [&](const torch::Tensor& rows) {  // [heads * d, ...]: each head's rows in `order`
    return rows.view({-1, d, rows.numel() / rows.size(0)}).index_select(1, order).reshape(rows.sizes());
  };
  {
    torch::NoGradGuard no_grad;
    auto theirs = interleaved->named_parameters();
    for (GPTModel* model : {&halves, &unchanged}) {
      for (auto& param : (*model)->named_parameters()) {
        torch::Tensor value = theirs[param.key()];
        if (model == &halves && param.key().find("linear_qkv") != std::string::npos) {
          const auto [q, k, v] = split_qkv(value, config);
          value = fuse_qkv(reorder_heads(q), reorder_heads(k), v, config);
        }
        param.value().copy_(value);
      }
    }
  }
  const torch::Tensor tokens = torch::randint(64, {2, 6});
  const torch::Tensor positions = torch::arange(6).unsqueeze(0).expand({2, 6});
  for (GPTModel* model : {&interleaved, &halves, &unchanged}) (*model)->eval();
  const torch::Tensor expected = interleaved(tokens, positions);
  const torch::Tensor reordered = halves(tokens, positions);
  EXPECT_TRUE(torch::allclose(reordered, expected, 1e-5, 1e-5)) << (reordered - expected).abs().max();
  const torch::Tensor not_reordered = unchanged(tokens, positions);
  EXPECT_GT((not_reordered - expected).abs().max().item<double>(), 1e-2) << "the flag changed nothing";
}

TEST(GPTConfig, GroupCountsNameTheLayoutsTheyAllow) {
  GPTConfig config;
  config.hidden_size = 64;
  config.num_attention_heads = 8;
  config.num_query_groups = 3;
  try {
    config.validate();
    ADD_FAILURE() << "3 groups for 8 heads validated";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(),
                HasSubstr("model.num_attention_heads (8) must be divisible by model.num_query_groups (3)"));
  }
  config.num_query_groups = 2;
  EXPECT_NO_THROW(config.validate(2));
  try {
    config.validate(4);
    ADD_FAILURE() << "2 groups at tp4 validated";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(),
                HasSubstr("model.num_query_groups (2) must be divisible by the tensor-parallel size (4)"));
    EXPECT_THAT(error.what(), HasSubstr("use a tensor-parallel size that divides 2"));
  }
  config.position_embedding_type = PositionEmbeddingType::kRope;
  config.rotary_percent = 0.1;  // 8 x 0.1 = 0 channels
  EXPECT_THROW(config.validate(), std::invalid_argument);
}

// The message of the std::invalid_argument that config.validate(...) throws ("" and a failure if none).
template <class... Sizes>
std::string validate_error(const GPTConfig& config, Sizes... sizes) {
  try {
    config.validate(sizes...);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  ADD_FAILURE() << "validated";
  return "";
}

// What the load-balanced split and the context-parallel attention need of the model, each named with its fix.
TEST(GPTConfig, ContextParallelNamesWhatItNeeds) {
  GPTConfig config;  // seq_length 64, 4 heads, learned absolute positions (global under cp, so allowed)
  config.attention_dropout = 0.0;
  const auto at_cp = [&](int tp, int cp) { return validate_error(config, tp, 1, std::nullopt, 1, 0, cp); };
  EXPECT_NO_THROW(config.validate(1, 1, std::nullopt, 1, 0, /*cp=*/4));
  config.seq_length = 36;
  EXPECT_THAT(at_cp(1, 4), AllOf(HasSubstr("model.seq_length (36) must be divisible by 2 x "
                                           "parallelism.context_parallel_size (8)"),
                                 HasSubstr("use a multiple of 8")));
  // Sequence parallelism splits each cp rank's 18 tokens over tp 4.
  config.sequence_parallel = true;
  EXPECT_THAT(at_cp(4, 2), AllOf(HasSubstr("model.seq_length / parallelism.context_parallel_size = 18"),
                                 HasSubstr("tensor-parallel size (4)"), HasSubstr("a multiple of 16"),
                                 HasSubstr("model.sequence_parallel: false")));
  config.sequence_parallel = false;
  EXPECT_NO_THROW(config.validate(4, 1, std::nullopt, 1, 0, 2));
  config.seq_length = 64;

  config.attention_dropout = 0.1;
  EXPECT_THAT(at_cp(1, 2), AllOf(HasSubstr("model.attention_dropout is 0.1"), HasSubstr("has no dropout"),
                                 HasSubstr("set model.attention_dropout: 0")));
  EXPECT_NO_THROW(config.validate(1, 1, std::nullopt, 1, 0, 1));  // cp 1: the model's own dropout
  config.attention_dropout = 0.0;

  // Ulysses gives each cp rank whole heads: 4 heads / tp 2 = 2 per tensor-parallel rank, not divisible by cp 4.
  config.cp_comm_type = parallel::context_parallel::CpCommType::kA2A;
  EXPECT_THAT(at_cp(2, 4), AllOf(HasSubstr("model.cp_comm_type a2a"),
                                 HasSubstr("(2) is not divisible by "
                                           "parallelism.context_parallel_size (4)"),
                                 HasSubstr("use model.cp_comm_type p2p or all_gather")));
  EXPECT_NO_THROW(config.validate(2, 1, std::nullopt, 1, 0, 2));
  config.cp_comm_type = parallel::context_parallel::CpCommType::kAllGather;
  EXPECT_NO_THROW(config.validate(2, 1, std::nullopt, 1, 0, 4));
}

// transformers' convert_file_size_to_int: KB/MB/GB are powers of 1000, KiB/MiB/GiB of 1024, in any case.
TEST(ShardSize, ReadsTransformersSizes) {
  EXPECT_EQ(hf::parse_shard_size("5GB"), 5'000'000'000);
  EXPECT_EQ(hf::parse_shard_size("500mb"), 500'000'000);
  EXPECT_EQ(hf::parse_shard_size("100KB"), 100'000);
  EXPECT_EQ(hf::parse_shard_size("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(hf::parse_shard_size("64MiB"), int64_t{64} << 20);
  EXPECT_EQ(hf::parse_shard_size("4kib"), 4096);
  EXPECT_EQ(hf::parse_shard_size("123456"), 123456);
  EXPECT_EQ(hf::parse_shard_size("7B"), 7);
  for (const char* bad : {"", "GB", "5 GB", "5TB", "-5GB", "0", "0GB", "1.5GB", "99999999999999GB"}) {
    EXPECT_THAT([&] { hf::parse_shard_size(bad); },
                ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("is not a size")))
        << bad;
  }
}

}  // namespace
}  // namespace bridge::models
