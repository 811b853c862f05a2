// The machine's GEMM peak through the LibTorch the build uses: the best GFLOP/s of at::mm on square matrices (2048 by
// default, large enough for the BLAS to reach its peak, small enough to stay quick) at a given thread count and
// dtype. run_gpt_train_bench.sh divides a training step's model FLOPs by it: the percentage of peak a step reaches.
// Prints one machine-readable line:
//   gemm_peak threads=<t> dtype=<fp32|bf16> size=<n> gflops=<best> median_gflops=<median>
//
//   gemm_peak_bench --threads 2 --dtype fp32
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cxxopts.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/gpt_bench_model.h"

int main(int argc, char** argv) {
  cxxopts::Options options("gemm_peak_bench", "GEMM peak GFLOP/s through LibTorch");
  options.add_options()("threads", "intra-op threads", cxxopts::value<int>()->default_value("2"))(
      "dtype", "fp32 or bf16", cxxopts::value<std::string>()->default_value("fp32"))(
      "size", "matrix side", cxxopts::value<int64_t>()->default_value("2048"))(
      "repeats", "timed products", cxxopts::value<int>()->default_value("12"))("h,help", "print this help");
  try {
    const cxxopts::ParseResult args = options.parse(argc, argv);
    if (args.count("help")) {
      std::printf("%s\n", options.help().c_str());
      return 0;
    }
    const int threads = args["threads"].as<int>();
    const std::string dtype = args["dtype"].as<std::string>();
    const int64_t n = args["size"].as<int64_t>();
    const int repeats = args["repeats"].as<int>();
    if (dtype != "fp32" && dtype != "bf16") throw std::invalid_argument("--dtype must be fp32 or bf16, got " + dtype);
    if (n <= 0 || repeats <= 0) throw std::invalid_argument("--size and --repeats must be positive");
    torch::set_num_threads(threads);
    torch::NoGradGuard no_grad;
    const auto scalar = dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;
    const torch::Tensor a = torch::randn({n, n}).to(scalar);
    const torch::Tensor b = torch::randn({n, n}).to(scalar);
    torch::Tensor c = torch::empty({n, n}, scalar);
    for (int i = 0; i < 3; ++i) at::mm_out(c, a, b);  // the BLAS's own buffers and threads start here
    std::vector<double> gflops;
    for (int i = 0; i < repeats; ++i) {
      const auto start = std::chrono::steady_clock::now();
      at::mm_out(c, a, b);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      gflops.push_back(2.0 * static_cast<double>(n * n * n) / seconds / 1e9);
    }
    std::printf("gemm_peak threads=%d dtype=%s size=%lld gflops=%.1f median_gflops=%.1f\n", threads, dtype.c_str(),
                static_cast<long long>(n), *std::max_element(gflops.begin(), gflops.end()),
                bridge::bench::median(gflops));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gemm_peak_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
