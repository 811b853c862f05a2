// Mixed precision (training/optimizer/mixed_precision.h, the DDP's fp32 main grads, pretrain() with bf16/fp16):
// Megatron's grad scalers step by step, the mixed_precision config and recipes, fp32 main grads under bf16 params, an
// fp16 step with an injected inf that is skipped, and a bf16 run that follows the fp32 loss curve.
#include "training/optimizer/mixed_precision.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/version.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "bridge/bridge.h"
#include "parallel/distributed.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/parallel_state.h"
#include "training/config/config_yaml.h"

namespace bridge::training {
namespace {

using ::testing::HasSubstr;

// ---- GradScaler: Megatron's DynamicGradScaler.update ----

TEST(GradScaler, HysteresisDelaysTheFirstHalvingThenEveryOverflowHalvesDownToTheMinimum) {
  GradScaler scaler = GradScaler::dynamic(/*initial_scale=*/16, /*min_scale=*/4, 2.0, 0.5, /*growth_interval=*/3,
                                          /*hysteresis=*/2);
  scaler.update(true);  // hysteresis 2 -> 1: the scale holds
  EXPECT_EQ(scaler.scale(), 16);
  EXPECT_EQ(scaler.hysteresis_tracker(), 1);
  scaler.update(true);  // -> 0: halves
  EXPECT_EQ(scaler.scale(), 8);
  scaler.update(true);  // still <= 0 until a growth restores it: halves again, then clamps at the minimum
  EXPECT_EQ(scaler.scale(), 4);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 4);
}

TEST(GradScaler, GrowsAfterTheWindowOfCleanStepsAndAnOverflowRestartsTheWindow) {
  GradScaler scaler = GradScaler::dynamic(8, 1, 2.0, 0.5, /*growth_interval=*/3, /*hysteresis=*/2);
  scaler.update(false);
  scaler.update(false);
  scaler.update(true);  // resets the growth count (hysteresis 2 -> 1, no halving)
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 8);
  scaler.update(false);  // the third clean step in a row
  EXPECT_EQ(scaler.scale(), 16);
  EXPECT_EQ(scaler.hysteresis_tracker(), 2);  // restored by the growth
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, AConstantScaleNeverMoves) {
  GradScaler scaler = GradScaler::constant(128);
  for (int i = 0; i < 5; ++i) scaler.update(i % 2 == 0);
  EXPECT_EQ(scaler.scale(), 128);
  EXPECT_FALSE(scaler.is_dynamic());
  MixedPrecisionConfig config;
  config.fp16 = true;
  config.loss_scale = 64.0;
  EXPECT_EQ(GradScaler::from_config(config).scale(), 64);
  EXPECT_FALSE(GradScaler::from_config(config).is_dynamic());
}

// ---- Config ----

TEST(MixedPrecisionConfig, RecipesByNameInYamlAndOverridesAsMegatronBridge) {
  ConfigContainer config = load_config_yaml_string("mixed_precision: bf16_mixed\n", "recipe.yaml");
  EXPECT_TRUE(config.mixed_precision.bf16);
  EXPECT_FALSE(config.mixed_precision.fp16);
  EXPECT_TRUE(config.mixed_precision.grad_reduce_in_fp32);
  apply_override(config, "mixed_precision=fp16_mixed");
  EXPECT_TRUE(config.mixed_precision.fp16);
  EXPECT_FALSE(config.mixed_precision.bf16);
  EXPECT_FALSE(config.mixed_precision.grad_reduce_in_fp32);  // Megatron-Bridge's fp16_mixed
  EXPECT_EQ(config.mixed_precision.initial_loss_scale, 4294967296.0);
  EXPECT_EQ(config.mixed_precision.loss_scale_window, 1000);
  EXPECT_EQ(config.mixed_precision.hysteresis, 2);
  apply_override(config, "mixed_precision.loss_scale=1024");
  EXPECT_EQ(config.mixed_precision.loss_scale, 1024.0);
  EXPECT_THAT([&] { apply_override(config, "mixed_precision=bf17_mixed"); },
              ::testing::ThrowsMessage<ConfigError>(HasSubstr("use bf16_mixed, fp16_mixed or fp32")));
  // The section's keys round-trip through --print-config.
  const ConfigContainer again = load_config_yaml_string(to_yaml(config), "printed");
  EXPECT_TRUE(again.mixed_precision.fp16);
  EXPECT_EQ(again.mixed_precision.loss_scale, 1024.0);
}

TEST(MixedPrecisionConfig, ValidationNamesTheField) {
  ConfigContainer config;
  config.mixed_precision.bf16 = true;
  config.mixed_precision.fp16 = true;
  EXPECT_THAT([&] { config.validate(1); }, ::testing::ThrowsMessage<std::invalid_argument>(
                                               HasSubstr("mixed_precision.bf16 and mixed_precision.fp16")));
  config.mixed_precision.bf16 = false;
  config.mixed_precision.hysteresis = 0;
  EXPECT_THAT([&] { config.validate(1); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("mixed_precision.hysteresis")));
}

// ---- fp32 main grads in the DDP buffer ----

class MainGradTest : public ::testing::Test {
 protected:
  void SetUp() override {
    parallel::init_distributed(parallel::LaunchEnv{}, {});
    parallel::initialize_model_parallel(1);
  }
  void TearDown() override { parallel::destroy_distributed(); }
};

models::GPTConfig small_gpt() {
  models::GPTConfig config;
  config.num_layers = 2;
  config.hidden_size = 32;
  config.num_attention_heads = 4;
  config.vocab_size = 128;
  config.make_vocab_size_divisible_by = 64;
  config.seq_length = 16;
  config.hidden_dropout = 0.0;
  config.attention_dropout = 0.0;
  return config;
}

TEST_F(MainGradTest, Bf16ParamsAccumulateTheirGradsInAnFp32BufferThatMatchesAnFp32Reference) {
  const models::GPTConfig config = small_gpt();
  models::GPTModel model = models::build_gpt_model(config)[0];
  models::GPTModel reference = models::build_gpt_model(config)[0];  // the same seeded init, kept in fp32
  model->to(torch::kBFloat16);
  parallel::distributed::DistributedDataParallelConfig ddp_config;
  ddp_config.grad_reduce_in_fp32 = true;
  parallel::distributed::DistributedDataParallel ddp(model.ptr(), ddp_config);
  for (const torch::Tensor& buffer : ddp.grad_buffers()) EXPECT_EQ(buffer.scalar_type(), torch::kFloat32);

  torch::manual_seed(3);
  const torch::Tensor positions = torch::arange(16).unsqueeze(0).expand({2, 16});
  std::vector<torch::Tensor> grads_bf16_summed_in_fp32;  // what the buffer must hold: each backward's grad added
  const int micro_batches = 3;
  ddp.zero_grad_buffer();
  for (int m = 0; m < micro_batches; ++m) {
    const torch::Tensor tokens = torch::randint(0, 128, {2, 16});
    const torch::Tensor labels = torch::randint(0, 128, {2, 16});
    ddp.set_grad_sync(m == micro_batches - 1);
    model->forward(tokens, positions, labels).mean().backward();
    reference->forward(tokens, positions, labels).mean().backward();
    for (const torch::Tensor& param : model->parameters()) {
      EXPECT_FALSE(param.grad().defined()) << "param.grad is dropped once added into the main grad";
    }
  }
  ddp.finish_grad_sync();
  const auto params = model->parameters();
  const auto reference_params = reference->parameters();
  ASSERT_EQ(params.size(), reference_params.size());
  double largest = 0.0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const torch::Tensor main_grad = parallel::distributed::main_grad(params[i]);
    ASSERT_TRUE(main_grad.defined());
    EXPECT_EQ(main_grad.scalar_type(), torch::kFloat32);
    EXPECT_TRUE(main_grad.is_same(ddp.main_grad(params[i])));
    const torch::Tensor expected = reference_params[i].grad();
    const double relative = ((main_grad - expected).norm() / expected.norm().clamp_min(1e-12)).item<double>();
    largest = std::max(largest, relative);
    // bf16 compute (8-bit mantissa) against fp32 compute; measured largest 1.2e-2 (LibTorch 2.15, CPU).
    EXPECT_LT(relative, 5e-2) << "parameter " << i << " shape " << params[i].sizes();
  }
  std::printf("bf16 main grads vs fp32 grads: largest relative difference %.2e\n", largest);
  EXPECT_GT(largest, 0.0);  // bf16 compute really ran
}

// ---- pretrain() in fp16 and bf16 ----

ConfigContainer tiny(int64_t steps) {
  ConfigContainer config;
  config.model = small_gpt();
  config.model.init_seed = 7;
  config.train.micro_batch_size = 2;
  config.train.global_batch_size = 4;
  config.train.train_iters = steps;
  config.train.num_threads = 1;
  config.optimizer.lr = 3e-3;
  config.optimizer.clip_grad = 1.0;
  config.logging.log_interval = 1;
  // A learnable stream (next token = previous + 7 mod 128, shifted every 50 tokens) instead of the mock data's
  // uniform random tokens, whose loss cannot fall below ln(128).
  config.dataset.provider = [](const ConfigContainer& c) {
    std::vector<int64_t> tokens(20000);
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>((i * 7 + i / 50) % 128);
    GPTDatasets datasets;
    datasets.train = std::make_shared<TokenStreamDataset>(std::move(tokens), c.model.seq_length);
    return datasets;
  };
  return config;
}

TEST(MixedPrecisionPretrain, AnInfGradientSkipsTheFp16StepHalvesTheScaleAfterHysteresisAndCleanStepsGrowIt) {
#if TORCH_VERSION_MAJOR < 2
  // The sanitizer leg's LibTorch: its CPU has no fp16 LayerNorm kernel ("LayerNormKernelImpl" not implemented for
  // 'Half'), so an fp16 model cannot run there; the grad scaler's own tests above still do.
  GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no fp16 LayerNorm on the CPU";
#endif
  ConfigContainer config = tiny(8);
  apply_mixed_precision_recipe(config.mixed_precision, "fp16_mixed");
  config.mixed_precision.initial_loss_scale = 1024;  // small enough that the tiny model never overflows on its own
  config.mixed_precision.loss_scale_window = 3;
  config.mixed_precision.hysteresis = 2;
  const std::set<int64_t> poisoned = {1, 2};  // steps whose gradient gets an inf

  auto manager = std::make_shared<CallbackManager>();
  std::map<int64_t, torch::Tensor> weight_before, weight_after;
  std::map<int64_t, bool> skipped;
  std::map<int64_t, double> scale;
  auto first_weight = [](CallbackContext& ctx) {
    return ctx.model[0]->parameters()[0].detach().to(torch::kFloat32).clone();
  };
  manager->register_callback(Event::kTrainStepStart, [&](CallbackContext& ctx) {
    weight_before[ctx.state.train_state.step] = first_weight(ctx);
  });
  manager->register_callback(Event::kBackwardEnd, [&](CallbackContext& ctx) {
    if (!poisoned.count(ctx.state.train_state.step)) return;
    torch::NoGradGuard no_grad;
    parallel::distributed::main_grad(ctx.model[0]->parameters()[3]).view(-1)[0] =
        std::numeric_limits<float>::infinity();
  });
  manager->register_callback(Event::kTrainStepEnd, [&](CallbackContext& ctx) {
    weight_after[ctx.state.train_state.step] = first_weight(ctx);
    skipped[ctx.state.train_state.step] = *ctx.skipped_iter;
  });
  int64_t logged_skips = 0;
  manager->register_callback(Event::kLog, [&](CallbackContext& ctx) {
    scale[ctx.log->iteration] = ctx.log->metrics.at("loss-scale");
    logged_skips += ctx.log->metrics.count("grad-norm") == 0 ? 1 : 0;  // a skipped step logs no grad norm
  });
  const TrainState state = pretrain(config, gpt_forward_step, manager);
  EXPECT_EQ(state.step, 8);

  for (int64_t step = 0; step < 8; ++step) {
    const bool poison = poisoned.count(step) != 0;
    EXPECT_EQ(skipped.at(step), poison) << "step " << step;
    EXPECT_EQ(torch::equal(weight_before.at(step), weight_after.at(step)), poison)
        << "step " << step << ": a skipped step leaves the weights unchanged, a clean one updates them";
  }
  EXPECT_EQ(logged_skips, 2);
  // The log's iteration is the step count after the step. Step 0 clean; step 1 inf: hysteresis 2 -> 1, scale holds;
  // step 2 inf: halves; steps 3, 4, 5 clean: the third doubles it back; 6, 7 clean.
  EXPECT_EQ(scale.at(1), 1024);
  EXPECT_EQ(scale.at(2), 1024);
  EXPECT_EQ(scale.at(3), 512);
  EXPECT_EQ(scale.at(5), 512);
  EXPECT_EQ(scale.at(6), 1024);
  EXPECT_EQ(scale.at(8), 1024);
}

std::vector<double> losses_of(const ConfigContainer& config, bool check_params_dtype) {
  auto manager = std::make_shared<CallbackManager>();
  std::vector<double> losses;
  manager->register_callback(Event::kTrainStepEnd, [&](CallbackContext& ctx) {
    losses.push_back(ctx.loss_dict->at("lm loss").item<double>());
    if (check_params_dtype) {
      for (const torch::Tensor& param : ctx.model[0]->parameters()) {
        EXPECT_EQ(param.scalar_type(), torch::kBFloat16);
      }
    }
  });
  pretrain(config, gpt_forward_step, manager);
  return losses;
}

TEST(MixedPrecisionPretrain, Bf16FollowsTheFp32LossCurve) {
  constexpr int64_t kSteps = 40;
  const ConfigContainer fp32 = tiny(kSteps);
  ConfigContainer bf16 = fp32;
  apply_mixed_precision_recipe(bf16.mixed_precision, "bf16_mixed");
  const std::vector<double> reference = losses_of(fp32, false);
  const std::vector<double> losses = losses_of(bf16, true);
  ASSERT_EQ(losses.size(), reference.size());
  double largest = 0.0;
  for (std::size_t i = 0; i < losses.size(); ++i) largest = std::max(largest, std::abs(losses[i] - reference[i]));
  std::printf("bf16 vs fp32 over %lld steps: loss %.4f -> %.4f (fp32 %.4f -> %.4f), largest difference %.4f\n",
              static_cast<long long>(kSteps), losses.front(), losses.back(), reference.front(), reference.back(),
              largest);
  // Tolerance 0.01 nats (absolute) while the loss falls from 4.85 to 3.81; measured largest difference 0.0016 (LibTorch
  // 2.15, CPU). Without fp32 master weights or main grads the updates would round away and the curves part.
  EXPECT_LT(largest, 0.01);
  EXPECT_LT(losses.back(), losses.front() - 0.3) << "bf16 trains";
}

}  // namespace
}  // namespace bridge::training
