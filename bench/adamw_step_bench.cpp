// The optimizer step alone on GPT-2 124M's parameters (shapes as gpt_train_bench's model: padded vocab 50304, seq
// 64, tied embedding), two groups (decay / no decay): torch::optim::AdamW's per-parameter loop against FusedAdamW.
// adamw_step_bench.py times torch.optim.AdamW's loop/foreach/fused on the same shapes; run_gpt_train_bench.sh
// --adamw runs both. Prints one line per optimizer:
//   cpp_adamw impl=<loop|fused> step_ms=<median> min_ms=<min> max_ms=<max> steps=<n> threads=<t> params=<count>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cxxopts.hpp>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/gpt_bench_model.h"
#include "training/optimizer/fused_adam.h"

namespace {

using Clock = std::chrono::steady_clock;

std::vector<torch::Tensor> gpt_parameters(int64_t layers, int64_t hidden, int64_t seq, int64_t padded_vocab) {
  std::vector<std::vector<int64_t>> shapes = {{padded_vocab, hidden}, {seq, hidden}};
  for (int64_t l = 0; l < layers; ++l) {
    for (auto shape : std::vector<std::vector<int64_t>>{{hidden},
                                                        {hidden},
                                                        {3 * hidden, hidden},
                                                        {3 * hidden},
                                                        {hidden, hidden},
                                                        {hidden},
                                                        {hidden},
                                                        {hidden},
                                                        {4 * hidden, hidden},
                                                        {4 * hidden},
                                                        {hidden, 4 * hidden},
                                                        {hidden}}) {
      shapes.push_back(shape);
    }
  }
  shapes.push_back({hidden});
  shapes.push_back({hidden});
  std::vector<torch::Tensor> params;
  for (const auto& shape : shapes) params.push_back((0.02 * torch::randn(shape)).requires_grad_(true));
  return params;
}

std::vector<torch::optim::OptimizerParamGroup> groups_of(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : params) (p.dim() <= 1 ? no_decay : decay).push_back(p);
  auto options = [](double wd) {
    auto o = std::make_unique<torch::optim::AdamWOptions>(1e-4);
    o->weight_decay(wd);
    return o;
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, options(0.01));
  groups.emplace_back(no_decay, options(0.0));
  return groups;
}

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options options("adamw_step_bench", "AdamW step time on GPT-2 124M's parameters: loop vs fused");
  options.add_options()("layers", "transformer layers", cxxopts::value<int64_t>()->default_value("12"))(
      "hidden", "hidden size", cxxopts::value<int64_t>()->default_value("768"))(
      "seq", "sequence length (position embedding rows)", cxxopts::value<int64_t>()->default_value("64"))(
      "vocab", "padded vocabulary", cxxopts::value<int64_t>()->default_value("50304"))(
      "steps", "timed steps per optimizer", cxxopts::value<int64_t>()->default_value("10"))(
      "threads", "intra-op threads", cxxopts::value<int>()->default_value("1"))("h,help", "print this help");
  try {
    const auto args = options.parse(argc, argv);
    if (args.count("help")) {
      std::printf("%s\n", options.help().c_str());
      return 0;
    }
    const int threads = args["threads"].as<int>();
    torch::set_num_threads(threads);
    torch::manual_seed(1234);
    const auto params = gpt_parameters(args["layers"].as<int64_t>(), args["hidden"].as<int64_t>(),
                                       args["seq"].as<int64_t>(), args["vocab"].as<int64_t>());
    int64_t count = 0;
    for (const auto& p : params) {
      p.mutable_grad() = 1e-3 * torch::randn(p.sizes());
      count += p.numel();
    }
    // Alternate the two, one step each, so that drift in the machine's load hits both.
    torch::optim::AdamW loop(groups_of(params));
    bridge::training::FusedAdamW fused(groups_of(params));
    std::vector<double> loop_ms, fused_ms;
    const int64_t steps = args["steps"].as<int64_t>();
    for (int64_t step = -1; step < steps; ++step) {  // step -1: state allocation, untimed
      for (auto* optimizer : std::vector<torch::optim::Optimizer*>{&loop, &fused}) {
        const auto start = Clock::now();
        optimizer->step();
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
        if (step >= 0) (optimizer == &loop ? loop_ms : fused_ms).push_back(ms);
      }
    }
    for (auto& [name, ms] : {std::pair{"loop", loop_ms}, std::pair{"fused", fused_ms}}) {
      std::printf("cpp_adamw impl=%s step_ms=%.2f min_ms=%.2f max_ms=%.2f steps=%zu threads=%d params=%lld\n", name,
                  bridge::bench::median(ms), *std::min_element(ms.begin(), ms.end()),
                  *std::max_element(ms.begin(), ms.end()), ms.size(), threads, static_cast<long long>(count));
    }
    if (!bridge::training::FusedAdamW::fused_available()) {
      std::printf("cpp_adamw note=this LibTorch has no fused AdamW kernel: fused ran AdamW's loop\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "adamw_step_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
