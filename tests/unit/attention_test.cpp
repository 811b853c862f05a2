// SelfAttention's two backends: scaled_dot_product_attention (AttnBackend::kAuto on LibTorch 2.x) against the
// explicit softmax (kUnfused), the same weights and input: equal outputs and input grads, in eval and in training
// with attention dropout drawn from the same per-rank stream.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "bridge/models/transformer_layer.h"
#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/random.h"

namespace bridge::models {
namespace {

class AttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    parallel::init_distributed(parallel::LaunchEnv{}, {});
    parallel::initialize_model_parallel(1);
  }
  void TearDown() override { parallel::destroy_distributed(); }
};

struct Result {
  torch::Tensor output, input_grad;
};

Result run(AttnBackend backend, bool training, double dropout) {
  GPTConfig config;
  config.hidden_size = 64;
  config.num_attention_heads = 4;
  config.attention_dropout = dropout;
  config.attention_backend = backend;
  SelfAttention attention(config, "decoder.layers.0.self_attention.");
  attention->train(training);
  parallel::tensor_parallel::model_parallel_manual_seed(42);             // the same streams for both backends
  torch::Tensor input = torch::randn({16, 3, 64}).requires_grad_(true);  // [s, b, h]
  torch::Tensor output = attention(input);
  output.pow(2).sum().backward();
  return {output.detach(), input.grad()};
}

void expect_backends_agree(bool training, double dropout) {
  const Result fused = run(AttnBackend::kAuto, training, dropout);
  const Result unfused = run(AttnBackend::kUnfused, training, dropout);
  EXPECT_TRUE(torch::allclose(fused.output, unfused.output, 1e-5, 1e-6))
      << (fused.output - unfused.output).abs().max().item<double>();
  EXPECT_TRUE(torch::allclose(fused.input_grad, unfused.input_grad, 1e-4, 1e-5))
      << (fused.input_grad - unfused.input_grad).abs().max().item<double>();
}

TEST_F(AttentionTest, BackendsAgreeInEval) { expect_backends_agree(/*training=*/false, /*dropout=*/0.1); }

TEST_F(AttentionTest, BackendsAgreeInTrainingWithoutDropout) {
  expect_backends_agree(/*training=*/true, /*dropout=*/0.0);
}

// On CPU, SDPA with dropout is softmax then dropout from the default generator, mask for mask: under the tracker's
// fork both backends draw the same mask from the per-rank stream.
TEST_F(AttentionTest, BackendsAgreeInTrainingWithDropout) { expect_backends_agree(/*training=*/true, 0.2); }

TEST_F(AttentionTest, DropoutDrawsFromThePerRankStreamNotTheDefault) {
  // Two runs that differ only in the per-rank stream's seed give different outputs: the mask came from it.
  GPTConfig config;
  config.hidden_size = 64;
  config.num_attention_heads = 4;
  config.attention_dropout = 0.5;
  SelfAttention attention(config, "decoder.layers.0.self_attention.");
  torch::manual_seed(1);
  const torch::Tensor input = torch::randn({16, 3, 64});
  auto output_with_stream_seed = [&](uint64_t rank_seed) {
    parallel::tensor_parallel::model_parallel_manual_seed(7);
    auto& tracker = parallel::tensor_parallel::get_rng_tracker();
    tracker.reset();
    tracker.add(parallel::tensor_parallel::kModelParallelRngTrackerName, rank_seed);
    return attention(input).detach();
  };
  EXPECT_TRUE(torch::equal(output_with_stream_seed(5), output_with_stream_seed(5)));
  EXPECT_FALSE(torch::equal(output_with_stream_seed(5), output_with_stream_seed(6)));
}

}  // namespace
}  // namespace bridge::models
