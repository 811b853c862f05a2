// FusedAdamW against torch::optim::AdamW: the same parameters after N steps of random grads over two groups (decay
// and no decay) with the lr changed between steps as the scheduler changes it; state that saves from one and loads
// into the other; amsgrad.
#include "training/optimizer/fused_adam.h"

#include <gtest/gtest.h>
#include <torch/version.h>

#include <algorithm>
#include <memory>
#include <sstream>
#include <vector>

namespace bridge::training {
namespace {

using torch::optim::AdamW;
using torch::optim::AdamWOptions;
using torch::optim::OptimizerParamGroup;

// Shapes of a small transformer: matrices decay, vectors (biases, norm weights) do not.
std::vector<torch::Tensor> make_params(int64_t seed) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> params;
  for (auto shape : std::vector<std::vector<int64_t>>{{64, 32}, {32}, {96, 32}, {96}, {32}, {257, 32}}) {
    params.push_back(torch::randn(shape).requires_grad_(true));
  }
  return params;
}

std::vector<OptimizerParamGroup> groups_of(const std::vector<torch::Tensor>& params, bool amsgrad) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : params) (p.dim() <= 1 ? no_decay : decay).push_back(p);
  auto options = [&](double wd) {
    auto o = std::make_unique<AdamWOptions>(1e-3);
    o->betas({0.9, 0.95}).eps(1e-8).weight_decay(wd).amsgrad(amsgrad);
    return o;
  };
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(decay, options(0.1));
  groups.emplace_back(no_decay, options(0.0));
  return groups;
}

void set_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

// The same random grads into both copies; some steps leave one parameter without a grad, as a frozen or unused
// parameter would be.
void set_grads(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, int step) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (step % 3 == 2 && i == 1) {
      a[i].mutable_grad() = torch::Tensor();
      b[i].mutable_grad() = torch::Tensor();
      continue;
    }
    torch::Tensor grad = torch::randn(a[i].sizes());
    a[i].mutable_grad() = grad.clone();
    b[i].mutable_grad() = grad.clone();
  }
}

double max_relative_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const torch::Tensor diff = (a[i] - b[i]).abs() / b[i].abs().clamp_min(1e-3);
    worst = std::max(worst, diff.max().item<double>());
  }
  return worst;
}

void expect_same_steps(bool amsgrad) {
  std::vector<torch::Tensor> fused_params = make_params(3), ref_params = make_params(3);
  FusedAdamW fused(groups_of(fused_params, amsgrad), AdamWOptions(1e-3));
  AdamW reference(groups_of(ref_params, amsgrad), AdamWOptions(1e-3));
  torch::manual_seed(11);
  for (int step = 0; step < 20; ++step) {
    const double lr = 1e-3 * (1.0 + 0.25 * step) / (1.0 + 0.05 * step * step);  // warm-up, then decay
    set_lr(fused, lr);
    set_lr(reference, lr);
    set_grads(fused_params, ref_params, step);
    fused.step();
    reference.step();
  }
  // float32 in both; the kernel orders the update's arithmetic differently from AdamW's six ops, so they part by a
  // few ulps a step (measured: 1.4e-6 after 20 steps).
  EXPECT_LT(max_relative_difference(fused_params, ref_params), 5e-6);
}

TEST(FusedAdamWTest, StepsEqualAdamWOverTwoGroupsWithChangingLr) { expect_same_steps(/*amsgrad=*/false); }

TEST(FusedAdamWTest, StepsEqualAdamWWithAmsgrad) { expect_same_steps(/*amsgrad=*/true); }

TEST(FusedAdamWTest, StateMovesBetweenFusedAndAdamW) {
  // Three fused steps, save; load into a plain AdamW and a fresh FusedAdamW, three more steps each: both equal an
  // AdamW that took all six.
  std::vector<torch::Tensor> params = make_params(5), ref_params = make_params(5);
  FusedAdamW fused(groups_of(params, false), AdamWOptions(1e-3));
  AdamW reference(groups_of(ref_params, false), AdamWOptions(1e-3));
  torch::manual_seed(13);
  for (int step = 0; step < 3; ++step) {
    set_grads(params, ref_params, step);
    fused.step();
    reference.step();
  }
  std::stringstream saved;
  {
    torch::serialize::OutputArchive archive;
    fused.save(archive);
    archive.save_to(saved);
  }
  for (bool load_into_fused : {false, true}) {
    std::vector<torch::Tensor> resumed_params;
    for (const auto& p : params) resumed_params.push_back(p.detach().clone().requires_grad_(true));
    std::unique_ptr<torch::optim::Optimizer> resumed =
        load_into_fused ? std::unique_ptr<torch::optim::Optimizer>(
                              std::make_unique<FusedAdamW>(groups_of(resumed_params, false), AdamWOptions(1e-3)))
                        : std::make_unique<AdamW>(groups_of(resumed_params, false), AdamWOptions(1e-3));
    torch::serialize::InputArchive archive;
    std::stringstream copy(saved.str());
    archive.load_from(copy);
    resumed->load(archive);
    std::vector<torch::Tensor> continued_ref;
    for (const auto& p : ref_params) continued_ref.push_back(p.detach().clone().requires_grad_(true));
    AdamW continued(groups_of(continued_ref, false), AdamWOptions(1e-3));
    {
      torch::serialize::OutputArchive ref_archive;
      reference.save(ref_archive);
      std::stringstream ref_saved;
      ref_archive.save_to(ref_saved);
      torch::serialize::InputArchive ref_in;
      ref_in.load_from(ref_saved);
      continued.load(ref_in);
    }
    torch::manual_seed(17);
    for (int step = 3; step < 6; ++step) {
      set_grads(resumed_params, continued_ref, step);
      resumed->step();
      continued.step();
    }
    EXPECT_LT(max_relative_difference(resumed_params, continued_ref), 5e-6) << "loaded into fused: " << load_into_fused;
  }
}

TEST(FusedAdamWTest, ReportsWhetherTheKernelIsUsed) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  EXPECT_TRUE(FusedAdamW::fused_available());
#else
  EXPECT_FALSE(FusedAdamW::fused_available());
#endif
}

}  // namespace
}  // namespace bridge::training
