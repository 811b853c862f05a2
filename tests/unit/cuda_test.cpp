// The checks that need a GPU (ctest label `cuda`; scripts/gpu_check.sh runs them): the training step on CUDA against
// the same step on the CPU, bf16 against fp32 on the GPU, and activation recomputation replaying CUDA dropout (SDPA's
// and torch::dropout's masks come from the CUDA generator, whose state tensor_parallel::checkpoint saves and
// restores) bit for bit. Without a visible CUDA device every test skips, so the suite builds and passes anywhere.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "bridge/bridge.h"
#include "bridge/models/gpt_model.h"
#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/random.h"
#include "tests/dist/gpt_worker_support.h"

namespace bridge {
namespace {

namespace tp = parallel::tensor_parallel;
using training::ConfigContainer;

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device is visible"

// The parity tests' tiny model with the Llama block (RMSNorm, RoPE, SwiGLU, grouped-query attention), 3 steps.
ConfigContainer tiny_llama(const std::string& device) {
  ConfigContainer config = testing::tiny_gpt_config(/*tp=*/1, /*pp=*/1, /*vpp=*/0, /*steps=*/3);
  testing::use_llama_block(config.model);
  config.parallelism.device = device;
  return config;
}

std::vector<double> losses_of(const ConfigContainer& config) {
  std::vector<double> losses;
  auto manager = std::make_shared<training::CallbackManager>();
  manager->register_callback(training::Event::kTrainStepEnd, [&](training::CallbackContext& ctx) {
    losses.push_back(ctx.loss_dict->at("lm loss").item<double>());
  });
  training::pretrain(config, training::gpt_forward_step, manager);
  return losses;
}

// The same model, data and optimizer on both devices: fp32 round-off apart (cuBLAS and SDPA sum in other orders).
TEST(Cuda, ThreeStepsOnTheGpuFollowTheCpuSteps) {
  SKIP_WITHOUT_CUDA();
  const std::vector<double> cpu = losses_of(tiny_llama("cpu"));
  const std::vector<double> gpu = losses_of(tiny_llama("cuda"));
  ASSERT_EQ(gpu.size(), 3u);
  for (std::size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(gpu[i], cpu[i], 1e-4 * cpu[i]) << "step " << i;
}

// bf16 on the GPU follows the fp32 run on the GPU: bf16 parameters and compute, fp32 main grads and master weights.
TEST(Cuda, Bf16StepsFollowTheFp32Steps) {
  SKIP_WITHOUT_CUDA();
  const std::vector<double> fp32 = losses_of(tiny_llama("cuda"));
  ConfigContainer config = tiny_llama("cuda");
  training::apply_mixed_precision_recipe(config.mixed_precision, "bf16_mixed");
  const std::vector<double> bf16 = losses_of(config);
  ASSERT_EQ(bf16.size(), fp32.size());
  for (std::size_t i = 0; i < fp32.size(); ++i) EXPECT_NEAR(bf16[i], fp32[i], 1e-2 * fp32[i]) << "step " << i;
}

class CudaRecompute : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device is visible";
    parallel::init_distributed(parallel::LaunchEnv{}, {});
    parallel::initialize_model_parallel(1);
  }
  void TearDown() override {
    if (parallel::is_distributed_initialized()) parallel::destroy_distributed();
  }
};

struct Step {
  torch::Tensor loss;
  std::vector<torch::Tensor> grads;
};

Step cuda_step(const models::GPTConfig& config) {
  tp::model_parallel_manual_seed(11);
  models::GPTChunkOptions options;
  options.num_layers = config.num_layers;
  models::GPTModel model(config, options);
  model->to(torch::kCUDA);
  model->train();
  torch::manual_seed(5);
  const torch::Tensor tokens = torch::randint(config.vocab_size, {4, config.seq_length}).to(torch::kCUDA);
  const torch::Tensor positions = torch::arange(config.seq_length).expand({4, config.seq_length}).to(torch::kCUDA);
  Step step;
  step.loss = model->forward(tokens, positions, tokens.roll(-1, 1)).mean();
  step.loss.backward();
  for (const auto& param : model->parameters()) step.grads.push_back(param.grad().cpu());
  step.loss = step.loss.cpu();
  return step;
}

// Dropout 0.1 in attention (SDPA's fused kernels draw from the CUDA generator) and on the hidden states: full and
// selective recomputation replay every mask.
TEST_F(CudaRecompute, EveryModeReplaysTheCudaDropoutMasksBitForBit) {
  models::GPTConfig base = tiny_llama("cuda").model;
  base.hidden_dropout = 0.1;
  base.attention_dropout = 0.1;
  base.gradient_accumulation_fusion = false;  // no grad buffer here: plain .grad
  const Step plain = cuda_step(base);
  for (const char* mode : {"full", "selective"}) {
    SCOPED_TRACE(mode);
    models::GPTConfig config = base;
    if (std::string(mode) == "full") {
      config.recompute_granularity = models::RecomputeGranularity::kFull;
      config.recompute_method = models::RecomputeMethod::kUniform;
      config.recompute_num_layers = 1;
    } else {
      config.recompute_granularity = models::RecomputeGranularity::kSelective;
      config.recompute_modules = std::vector<std::string>{"core_attn", "mlp"};
    }
    const Step step = cuda_step(config);
    EXPECT_TRUE(step.loss.equal(plain.loss)) << step.loss.item<double>() << " vs " << plain.loss.item<double>();
    ASSERT_EQ(step.grads.size(), plain.grads.size());
    for (std::size_t i = 0; i < step.grads.size(); ++i) EXPECT_TRUE(step.grads[i].equal(plain.grads[i])) << i;
  }
}

}  // namespace
}  // namespace bridge
