// The optimizer, the grad norm and clipping, and DistributedDataParallel in a world of one: parameter groups,
// AdamW equivalence, config errors, counted-once norms, and grads that live in the contiguous buffer.
#include "training/optimizer/optimizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "parallel/distributed.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/distributed/finalize_model_grads.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/param_attributes.h"
#include "training/optimizer/clip_grads.h"

namespace bridge::training {
namespace {

using parallel::distributed::DistributedDataParallel;
using parallel::distributed::DistributedDataParallelConfig;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

class OptimizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    parallel::init_distributed(parallel::LaunchEnv{}, {});
    parallel::initialize_model_parallel(1);
    torch::manual_seed(7);
  }
  void TearDown() override { parallel::destroy_distributed(); }
};

torch::Tensor leaf(torch::Tensor t) { return t.detach().clone().requires_grad_(true); }

void mark_shared_embedding(const torch::Tensor& param) {
  parallel::tensor_parallel::ParamAttributes attributes;
  attributes.shared_embedding = true;
  parallel::tensor_parallel::set_param_attributes(param, attributes);
}

DistributedDataParallelConfig ddp_config(bool overlap, bool average, int64_t bucket_size) {
  DistributedDataParallelConfig config;
  config.overlap_grad_reduce = overlap;
  config.average_in_collective = average;
  config.bucket_size = bucket_size;
  return config;
}

TEST_F(OptimizerTest, BuildsDecayAndNoDecayGroups) {
  OptimizerConfig config;
  config.lr = 3e-3;
  config.weight_decay = 0.1;
  config.adam_beta1 = 0.8;
  config.adam_beta2 = 0.95;
  config.adam_eps = 1e-6;
  torch::Tensor weight = leaf(torch::randn({4, 3})), bias = leaf(torch::randn({4})), norm = leaf(torch::ones({3}));
  torch::Tensor frozen = torch::randn({2, 2});
  auto optimizer = build_optimizer(config, {bias, weight, norm, frozen});
  auto& groups = optimizer->param_groups();
  ASSERT_EQ(groups.size(), 2u);
  ASSERT_EQ(groups[0].params().size(), 1u);
  EXPECT_TRUE(groups[0].params()[0].is_same(weight));
  ASSERT_EQ(groups[1].params().size(), 2u);
  EXPECT_TRUE(groups[1].params()[0].is_same(bias));
  EXPECT_TRUE(groups[1].params()[1].is_same(norm));
  for (std::size_t g = 0; g < 2; ++g) {
    auto& options = static_cast<torch::optim::AdamWOptions&>(groups[g].options());
    EXPECT_DOUBLE_EQ(options.lr(), 3e-3);
    EXPECT_DOUBLE_EQ(options.weight_decay(), g == 0 ? 0.1 : 0.0);
    EXPECT_DOUBLE_EQ(std::get<0>(options.betas()), 0.8);
    EXPECT_DOUBLE_EQ(std::get<1>(options.betas()), 0.95);
    EXPECT_DOUBLE_EQ(options.eps(), 1e-6);
  }

  config.optimizer = "sgd";
  config.sgd_momentum = 0.5;
  auto sgd = build_optimizer(config, {weight, bias});
  ASSERT_NE(dynamic_cast<torch::optim::SGD*>(sgd.get()), nullptr);
  auto& sgd_options = static_cast<torch::optim::SGDOptions&>(sgd->param_groups()[0].options());
  EXPECT_DOUBLE_EQ(sgd_options.momentum(), 0.5);
  EXPECT_DOUBLE_EQ(sgd_options.weight_decay(), 0.1);
  EXPECT_DOUBLE_EQ(static_cast<torch::optim::SGDOptions&>(sgd->param_groups()[1].options()).weight_decay(), 0.0);

  EXPECT_THAT([&] { build_optimizer(config, {frozen}); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("none of the 1 parameters requires grad")));
}

TEST_F(OptimizerTest, AdamStepEqualsAdamW) {
  OptimizerConfig config;
  config.lr = 1e-2;
  config.weight_decay = 0.05;
  config.adam_beta2 = 0.98;
  torch::Tensor weight = leaf(torch::randn({5, 3})), bias = leaf(torch::randn({5}));
  torch::Tensor ref_weight = leaf(weight), ref_bias = leaf(bias);
  auto optimizer = build_optimizer(config, {weight, bias});
  auto ref_options = [&](double wd) {
    return torch::optim::AdamWOptions(config.lr).betas({0.9, 0.98}).eps(1e-8).weight_decay(wd);
  };
  torch::optim::AdamW ref_decay({ref_weight}, ref_options(0.05));
  torch::optim::AdamW ref_no_decay({ref_bias}, ref_options(0.0));
  for (int step = 0; step < 3; ++step) {
    torch::Tensor gw = torch::randn({5, 3}), gb = torch::randn({5});
    weight.mutable_grad() = gw.clone();
    bias.mutable_grad() = gb.clone();
    ref_weight.mutable_grad() = gw.clone();
    ref_bias.mutable_grad() = gb.clone();
    optimizer->step();
    ref_decay.step();
    ref_no_decay.step();
  }
  EXPECT_TRUE(weight.equal(ref_weight)) << (weight - ref_weight).abs().max().item<double>();
  EXPECT_TRUE(bias.equal(ref_bias)) << (bias - ref_bias).abs().max().item<double>();
}

TEST_F(OptimizerTest, ValidationNamesTheField) {
  auto expect_error = [](OptimizerConfig config, const std::string& text) {
    EXPECT_THAT([&] { config.validate(); }, ThrowsMessage<std::invalid_argument>(HasSubstr(text)));
    EXPECT_THAT([&] { build_optimizer(config, {leaf(torch::ones({2}))}); },
                ThrowsMessage<std::invalid_argument>(HasSubstr(text)));
  };
  OptimizerConfig config;
  EXPECT_NO_THROW(config.validate());
  config.lr = -1;
  expect_error(config, "optimizer.lr must be finite, > 0 and <= 10, got -1");
  config.lr = std::nan("");
  expect_error(config, "optimizer.lr must be finite, > 0 and <= 10, got nan");
  config.lr = std::numeric_limits<double>::infinity();
  expect_error(config, "optimizer.lr must be finite, > 0 and <= 10, got inf");
  config = {};
  config.optimizer = "adamw";
  expect_error(config, "optimizer.optimizer must be \"adam\" or \"sgd\", got \"adamw\"");
  config = {};
  config.min_lr = 1.0;
  expect_error(config, "optimizer.min_lr must be >= 0 and <= optimizer.lr");
  config = {};
  config.adam_beta2 = 1.0;
  expect_error(config, "optimizer.adam_beta2 must be in [0, 1), got 1");
  config = {};
  config.adam_eps = 0;
  expect_error(config, "optimizer.adam_eps must be in (0, 1), got 0");
  config = {};
  config.weight_decay = -0.1;
  expect_error(config, "optimizer.weight_decay must be finite and >= 0");
  config = {};
  config.clip_grad = -1;
  expect_error(config, "optimizer.clip_grad must be finite and >= 0, got -1; use 0 to disable");
  config = {};
  config.sgd_momentum = 1.5;
  expect_error(config, "optimizer.sgd_momentum must be in [0, 1)");
}

TEST_F(OptimizerTest, GradNormIsThePlainNormAndSkipsTheSharedEmbedding) {
  torch::Tensor a = leaf(torch::randn({3, 4})), b = leaf(torch::randn({4})), none = leaf(torch::randn({2}));
  torch::Tensor shared = leaf(torch::randn({6, 4}));
  a.mutable_grad() = torch::randn({3, 4});
  b.mutable_grad() = torch::randn({4});
  shared.mutable_grad() = torch::randn({6, 4});
  const double expected = torch::cat({a.grad().flatten(), b.grad()}).norm().item<double>();
  const double with_shared = torch::cat({a.grad().flatten(), b.grad(), shared.grad().flatten()}).norm().item<double>();
  EXPECT_NEAR(get_grad_norm_fp32({a, b, none}), expected, 1e-6 * expected);
  EXPECT_NEAR(get_grad_norm_fp32({a, b, shared}), with_shared, 1e-6 * with_shared);
  EXPECT_NEAR(get_grad_norm_fp32({a, a, b}), expected, 1e-6 * expected);  // a repeated param counts once

  mark_shared_embedding(shared);
  EXPECT_NEAR(get_grad_norm_fp32({a, b, shared}), expected, 1e-6 * expected);
  // tp = 1: every rank is tensor-parallel rank 0, so a replicated param is no duplicate.
  EXPECT_FALSE(parallel::tensor_parallel::param_is_tensor_parallel_duplicate(a));
  EXPECT_EQ(get_grad_norm_fp32({none}), 0.0);

  torch::Tensor d = leaf(torch::randn({7}, torch::kFloat64));
  d.mutable_grad() = torch::randn({7}, torch::kFloat64);
  EXPECT_DOUBLE_EQ(get_grad_norm_fp32({d}), d.grad().norm().item<double>());
}

TEST_F(OptimizerTest, ClipScalesOnlyAboveTheLimit) {
  torch::Tensor a = leaf(torch::zeros({2})), b = leaf(torch::zeros({1})), shared = leaf(torch::zeros({1}));
  a.mutable_grad() = torch::tensor({6.0f, 0.0f});
  b.mutable_grad() = torch::tensor({8.0f});
  shared.mutable_grad() = torch::tensor({2.0f});
  mark_shared_embedding(shared);

  EXPECT_NEAR(clip_grad_norm({a, b, shared}, 20.0), 10.0, 1e-5);  // below: untouched
  EXPECT_TRUE(a.grad().equal(torch::tensor({6.0f, 0.0f})));

  EXPECT_NEAR(clip_grad_norm({a, b, shared}, 1.0), 10.0, 1e-5);
  const float coefficient = static_cast<float>(1.0 / (10.0 + 1e-6));
  EXPECT_NEAR(a.grad()[0].item<float>(), 6.0f * coefficient, 1e-6);
  EXPECT_NEAR(b.grad()[0].item<float>(), 8.0f * coefficient, 1e-6);
  EXPECT_NEAR(shared.grad()[0].item<float>(), 2.0f * coefficient, 1e-6);  // not counted, but scaled
  EXPECT_NEAR(get_grad_norm_fp32({a, b, shared}), 1.0, 1e-5);
  EXPECT_THAT([&] { clip_grad_norm({a}, 0.0); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("max_norm must be > 0")));
}

// y = W2 tanh(W1 x + b1) + b2, parameters registered in that order.
struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t in, int64_t hidden, int64_t out, torch::Dtype dtype = torch::kFloat32) {
    auto options = torch::TensorOptions().dtype(dtype);
    w1 = register_parameter("w1", torch::randn({hidden, in}, options) * 0.5);
    b1 = register_parameter("b1", torch::randn({hidden}, options) * 0.1);
    w2 = register_parameter("w2", torch::randn({out, hidden}, options) * 0.5);
    b2 = register_parameter("b2", torch::randn({out}, options) * 0.1);
  }
  static torch::Tensor apply(const std::vector<torch::Tensor>& p, const torch::Tensor& x) {
    return torch::linear(torch::tanh(torch::linear(x, p[0], p[1])), p[2], p[3]);
  }
  torch::Tensor forward(const torch::Tensor& x) { return apply({w1, b1, w2, b2}, x); }
  torch::Tensor w1, b1, w2, b2;
};

std::vector<torch::Tensor> reference_grads(const std::shared_ptr<MlpImpl>& model,
                                           const std::vector<torch::Tensor>& xs) {
  std::vector<torch::Tensor> p;
  for (const auto& t : model->parameters()) p.push_back(leaf(t));
  torch::Tensor loss = torch::zeros({});
  for (const auto& x : xs) loss = loss + MlpImpl::apply(p, x).square().sum();
  loss.backward();
  std::vector<torch::Tensor> grads;
  for (const auto& t : p) grads.push_back(t.grad());
  return grads;
}

TEST_F(OptimizerTest, DdpGradsLiveInTheContiguousBuffer) {
  auto model = std::make_shared<MlpImpl>(4, 8, 2);
  DistributedDataParallelConfig config;
  config.bucket_size = 10;
  DistributedDataParallel ddp(model, config);
  ASSERT_EQ(ddp.params().size(), 4u);
  ASSERT_EQ(ddp.grad_buffers().size(), 1u);
  const torch::Tensor buffer = ddp.grad_buffers()[0];
  ASSERT_EQ(buffer.numel(), 32 + 8 + 16 + 2);
  // Reverse order: b2 (2) + w2 (16) reach 10 and close bucket 0; b1 (8) + w1 (32) form bucket 1.
  EXPECT_EQ(ddp.num_buckets(), 2);
  EXPECT_EQ(ddp.bucket_of(model->b2), 0);
  EXPECT_EQ(ddp.bucket_of(model->w2), 0);
  EXPECT_EQ(ddp.bucket_of(model->b1), 1);
  EXPECT_EQ(ddp.bucket_of(model->w1), 1);
  EXPECT_EQ(ddp.bucket_of(torch::ones({1})), -1);
  EXPECT_EQ(ddp.bucket_numel(0), 18);
  EXPECT_EQ(ddp.bucket_numel(1), 40);
  EXPECT_EQ(model->b2.grad().data_ptr<float>(), buffer.data_ptr<float>());

  const torch::Tensor x = torch::randn({5, 4});
  ddp.zero_grad_buffer();
  model->forward(x).square().sum().backward();
  EXPECT_EQ(ddp.buckets_started(), 2);  // a world of one still walks the buckets, without communication
  ddp.finish_grad_sync();
  EXPECT_EQ(ddp.buckets_started_in_backward(), 2);
  const auto expected = reference_grads(model, {x});
  const torch::Tensor expected_flat =
      torch::cat({expected[3].flatten(), expected[2].flatten(), expected[1].flatten(), expected[0].flatten()});
  EXPECT_TRUE(buffer.allclose(expected_flat, 1e-6, 1e-6)) << (buffer - expected_flat).abs().max().item<double>();
  EXPECT_EQ(model->w1.grad().data_ptr<float>(), buffer.data_ptr<float>() + 26);

  ddp.zero_grad_buffer();
  EXPECT_EQ(buffer.abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(model->w1.grad().abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(model->w1.grad().data_ptr<float>(), buffer.data_ptr<float>() + 26);
}

TEST_F(OptimizerTest, DdpAccumulatesMicroBatches) {
  auto model = std::make_shared<MlpImpl>(3, 6, 2, torch::kFloat64);
  DistributedDataParallelConfig config;
  config.bucket_size = 1;  // one bucket per param
  DistributedDataParallel ddp(model, config);
  EXPECT_EQ(ddp.num_buckets(), 4);
  EXPECT_EQ(ddp.grad_buffers()[0].scalar_type(), torch::kFloat64);
  const std::vector<torch::Tensor> xs = {torch::randn({4, 3}, torch::kFloat64), torch::randn({4, 3}, torch::kFloat64)};
  for (int step = 0; step < 2; ++step) {  // the second step checks that the sync state was reset
    ddp.zero_grad_buffer();
    ddp.set_grad_sync(false);
    model->forward(xs[0]).square().sum().backward();
    EXPECT_EQ(ddp.buckets_started(), 0);
    ddp.set_grad_sync(true);
    model->forward(xs[1]).square().sum().backward();
    EXPECT_EQ(ddp.buckets_started(), 4);
    ddp.finish_grad_sync();
    EXPECT_EQ(ddp.buckets_started_in_backward(), 4);
    const auto expected = reference_grads(model, xs);
    for (std::size_t i = 0; i < 4; ++i) {
      EXPECT_TRUE(ddp.params()[i].grad().allclose(expected[i], 1e-12, 1e-12)) << i;
    }
  }

  // Overlap off: one bucket, started only by finish_grad_sync.
  auto other = std::make_shared<MlpImpl>(3, 6, 2);
  DistributedDataParallel serial(other, ddp_config(false, false, 1));
  EXPECT_EQ(serial.num_buckets(), 1);
  other->forward(torch::randn({2, 3})).sum().backward();
  EXPECT_EQ(serial.buckets_started(), 0);
  serial.finish_grad_sync();
  EXPECT_EQ(serial.buckets_started_in_backward(), 0);
}

TEST_F(OptimizerTest, DdpRepairsReplacedGradsAndUnusedParams) {
  auto model = std::make_shared<MlpImpl>(3, 5, 2);
  torch::Tensor unused = model->register_parameter("unused", torch::ones({3}));
  model->register_parameter("frozen", torch::ones({2}), /*requires_grad=*/false);
  DistributedDataParallel ddp(model, ddp_config(true, false, 1));
  ASSERT_EQ(ddp.params().size(), 5u);   // the frozen one is left out
  EXPECT_EQ(ddp.bucket_of(unused), 0);  // last registered, so first in the buffer

  // optimizer.zero_grad() in LibTorch 2.x sets grads to none: backward then creates fresh tensors, which the
  // hooks move back into the buffer.
  for (const auto& p : ddp.params()) p.mutable_grad() = torch::Tensor();
  const torch::Tensor x = torch::randn({4, 3});
  model->forward(x).square().sum().backward();
  // `unused` got no grad, so bucket 0 is never ready and, launched in order, nothing starts during backward.
  EXPECT_EQ(ddp.buckets_started(), 0);
  ddp.finish_grad_sync();  // must not hang
  EXPECT_EQ(ddp.buckets_started_in_backward(), 0);
  const torch::Tensor buffer = ddp.grad_buffers()[0];
  EXPECT_EQ(model->w2.grad().data_ptr<float>(), buffer.data_ptr<float>() + 3 + 2);
  const auto expected = reference_grads(model, {x});
  EXPECT_TRUE(model->w1.grad().allclose(expected[0], 1e-6, 1e-6));
  EXPECT_TRUE(model->b2.grad().allclose(expected[3], 1e-6, 1e-6));
  EXPECT_EQ(unused.grad().abs().sum().item<float>(), 0.0f);

  // Two backward passes in one grad sync without set_grad_sync(false): a clear error, not a silent double reduce.
  ddp.zero_grad_buffer();
  model->forward(x).sum().backward();
  EXPECT_THAT([&] { model->forward(x).sum().backward(); },
              ThrowsMessage<std::exception>(HasSubstr("completed twice in one grad sync")));
  ddp.zero_grad_buffer();

  // Averaging in the collective is the same in a world of one.
  auto averaged_model = std::make_shared<MlpImpl>(3, 5, 2);
  DistributedDataParallel averaged(averaged_model, ddp_config(true, true, 0));
  averaged_model->forward(x).square().sum().backward();
  averaged.finish_grad_sync();
  EXPECT_TRUE(averaged_model->w1.grad().allclose(reference_grads(averaged_model, {x})[0], 1e-6, 1e-6));
}

TEST_F(OptimizerTest, DdpDestroyedLeavesTheModuleUsable) {
  auto model = std::make_shared<MlpImpl>(3, 4, 1);
  {
    DistributedDataParallel ddp(model);
    DistributedDataParallel moved(std::move(ddp));
    model->forward(torch::randn({2, 3})).sum().backward();
    moved.finish_grad_sync();
    parallel::distributed::finalize_model_grads({&moved}, {model->w1});  // pp = 1: nothing more to reduce
  }
  model->forward(torch::randn({2, 3})).sum().backward();  // no hook into a dead object
  EXPECT_TRUE(model->w1.grad().defined());
}

}  // namespace
}  // namespace bridge::training
