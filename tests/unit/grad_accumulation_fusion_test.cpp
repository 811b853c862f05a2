// Gradient accumulation fusion (grad_accumulation_fusion.h): under DistributedDataParallel the linear layers' and the
// embedding's weight gradients are added straight into the grad buffer and reach it equal to plain autograd's, over
// several backward passes, for a weight used by both (a tied embedding), and where the grad was replaced; a weight no
// DistributedDataParallel wraps gets its gradient the ordinary way.
#include "parallel/tensor_parallel/grad_accumulation_fusion.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "parallel/distributed.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/layers.h"

namespace bridge::parallel::tensor_parallel {
namespace {

using distributed::DistributedDataParallel;

class GradAccumulationFusion : public ::testing::Test {
 protected:
  void SetUp() override {
    init_distributed(LaunchEnv{}, {});
    initialize_model_parallel(1);
  }
  void TearDown() override { destroy_distributed(); }
};

torch::Tensor random(at::IntArrayRef sizes, uint64_t seed) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randn(sizes, generator);
}

// An MLP whose first weight is also used outside its layer as a tied embedding is: by a lookup and by the output GEMM.
struct TiedMlpImpl : torch::nn::Module {
  explicit TiedMlpImpl(bool fusion) {
    ColumnParallelLinearOptions fc1(6, 8);
    fc1.init_method = init_method_normal(0.5, 1);
    fc1.gradient_accumulation_fusion = fusion;
    RowParallelLinearOptions fc2(8, 6);
    fc2.init_method = init_method_normal(0.5, 2);
    fc2.gradient_accumulation_fusion = fusion;
    linear_fc1 = register_module("linear_fc1", ColumnParallelLinear(fc1));
    linear_fc2 = register_module("linear_fc2", RowParallelLinear(fc2));
    fusion_ = fusion;
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& tokens) {
    const torch::Tensor embedded =
        embedding_with_grad_accumulation(linear_fc1->weight, tokens, fusion_).sum(-1, /*keepdim=*/true);
    const torch::Tensor hidden = linear_fc2(torch::gelu(linear_fc1(x))) + embedded;
    // The output GEMM on fc1's weight: [.., 6] x [8, 6]^T.
    return linear_with_grad_accumulation(hidden, linear_fc1->weight, {}, fusion_).square().mean();
  }
  ColumnParallelLinear linear_fc1{nullptr};
  RowParallelLinear linear_fc2{nullptr};
  bool fusion_ = false;
};
TORCH_MODULE(TiedMlp);

// Two backward passes (two micro-batches) into whatever accumulates the grads; under `ddp` only the last one syncs.
void two_backwards(TiedMlp& model, DistributedDataParallel* ddp = nullptr) {
  for (uint64_t micro_batch = 0; micro_batch < 2; ++micro_batch) {
    if (ddp != nullptr) ddp->set_grad_sync(micro_batch == 1);
    const torch::Tensor x = random({5, 2, 6}, 10 + micro_batch);
    const torch::Tensor tokens = torch::randint(8, {5, 2}, at::make_generator<at::CPUGeneratorImpl>(20 + micro_batch));
    model->forward(x, tokens).backward();
  }
}

void expect_grads_equal(TiedMlp& reference, const std::vector<torch::Tensor>& grads) {
  const std::vector<torch::Tensor> params = reference->parameters();
  ASSERT_EQ(params.size(), grads.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(grads[i].defined()) << "parameter " << i;
    EXPECT_TRUE(torch::allclose(grads[i], params[i].grad(), /*rtol=*/1e-5, /*atol=*/1e-6))
        << "parameter " << i << ": max difference " << (grads[i] - params[i].grad()).abs().max().item<double>();
  }
}

TEST_F(GradAccumulationFusion, WrappedWeightsReachTheBufferEqualToAutograd) {
  TiedMlp reference(/*fusion=*/false);
  two_backwards(reference);

  TiedMlp fused(/*fusion=*/true);
  DistributedDataParallel ddp(fused.ptr());
  // The ops add into the buffer, so autograd delivers nothing to the weights.
  int delivered = 0;
  for (torch::Tensor weight : {fused->linear_fc1->weight, fused->linear_fc2->weight}) {
    weight.register_hook([&](const torch::Tensor& grad) {
      if (grad.defined()) ++delivered;
    });
  }
  two_backwards(fused, &ddp);
  ddp.finish_grad_sync();
  EXPECT_EQ(delivered, 0) << "a weight's gradient went through autograd: its op did not accumulate it";
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& param : fused->parameters()) {
    grads.push_back(ddp.main_grad(param));
    EXPECT_TRUE(param.grad().is_same(grads.back())) << "the grad is no longer the view into the buffer";
  }
  expect_grads_equal(reference, grads);

  // The next step: the buffer is zeroed and accumulates afresh.
  ddp.zero_grad_buffer();
  for (const torch::Tensor& param : reference->parameters()) param.mutable_grad().zero_();
  two_backwards(reference);
  two_backwards(fused, &ddp);
  ddp.finish_grad_sync();
  grads.clear();
  for (const torch::Tensor& param : fused->parameters()) grads.push_back(ddp.main_grad(param));
  expect_grads_equal(reference, grads);
}

TEST_F(GradAccumulationFusion, AReplacedGradIsAccumulatedThroughAutograd) {
  TiedMlp reference(/*fusion=*/false);
  two_backwards(reference);

  TiedMlp fused(/*fusion=*/true);
  DistributedDataParallel ddp(fused.ptr());
  // As zero_grad(set_to_none) does: the buffer still holds stale values that the hook's re-attach overwrites.
  ddp.main_grad(fused->linear_fc2->weight).fill_(100.0);
  fused->linear_fc2->weight.mutable_grad() = torch::Tensor();
  two_backwards(fused, &ddp);
  ddp.finish_grad_sync();
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& param : fused->parameters()) grads.push_back(ddp.main_grad(param));
  expect_grads_equal(reference, grads);
}

TEST_F(GradAccumulationFusion, UnwrappedWeightsGetOrdinaryGradients) {
  TiedMlp reference(/*fusion=*/false);
  two_backwards(reference);
  TiedMlp fused(/*fusion=*/true);  // no DistributedDataParallel: nothing to fuse into
  two_backwards(fused);
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& param : fused->parameters()) grads.push_back(param.grad());
  expect_grads_equal(reference, grads);
}

TEST_F(GradAccumulationFusion, OffByDefaultInTheLayersAndForwardEqualsTheOrdinaryOps) {
  EXPECT_FALSE(ColumnParallelLinearOptions(2, 2).gradient_accumulation_fusion);
  EXPECT_FALSE(RowParallelLinearOptions(2, 2).gradient_accumulation_fusion);
  EXPECT_FALSE(VocabParallelEmbeddingOptions(2, 2).gradient_accumulation_fusion);
  const torch::Tensor x = random({3, 4}, 1);
  const torch::Tensor weight = random({5, 4}, 2).requires_grad_();
  const torch::Tensor bias = random({5}, 3).requires_grad_();
  EXPECT_TRUE(linear_with_grad_accumulation(x, weight, bias, true).equal(torch::linear(x, weight, bias)));
  const torch::Tensor ids = torch::tensor({{4, 0}, {2, 4}}, torch::kLong);
  EXPECT_TRUE(embedding_with_grad_accumulation(weight, ids, true).equal(torch::embedding(weight, ids)));
}

}  // namespace
}  // namespace bridge::parallel::tensor_parallel
