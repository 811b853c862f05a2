// GPT training throughput through bridge's real pretrain(config, gpt_forward_step, callbacks), one process (tp = pp
// = dp = 1) on mock data, for comparison with the same model and step in Python PyTorch (gpt_train_bench.py, run
// side by side by run_gpt_train_bench.sh). Prints one machine-readable line:
//   cpp tokens_per_s=<x> step_ms=<median> best_ms=<fastest step> steps=<n> threads=<t> params=<count> attention=<a>
//       dtype=<d> torch=<v> model_gflops=<per step> peak_rss_mb=<this process's peak resident memory>
//       live_peak_mb=<peak bytes of live CPU tensors> predicted_mb=<the preflight's estimate>
//       predicted_activations_mb=<its activations> [cuda_peak_mb=<the caching allocator's peak of live bytes>
//       cuda_reserved_peak_mb=<its peak reserved from the device, the GPU's counterpart of peak_rss_mb>]
// Config overrides follow the flags as bridge-pretrain's: gpt_train_bench ... model.recompute_granularity=selective
// Under torchrun each rank prints its own line, with rank=<r> and the per-rank prediction (the memory figures of
// tensor and sequence parallelism):
//   torchrun --nproc-per-node 2 gpt_train_bench ... parallelism.tensor_model_parallel_size=2
//   model.sequence_parallel=true
// --attention unfused times the explicit softmax attention against the default (SDPA on LibTorch 2.x).
//
//   gpt_train_bench --layers 12 --hidden 768 --heads 12 --seq 64 --vocab 50257 --micro-batch 4 --steps 4
#include <sys/resource.h>
#include <torch/version.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cxxopts.hpp>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench/gpt_bench_model.h"
#include "bridge/bridge.h"
#include "training/config/config_yaml.h"
#include "training/utils/cuda_memory.h"
#include "training/utils/flop_utils.h"
#include "training/utils/theoretical_memory.h"
#include "utils/counting_allocator.h"
#include "utils/host_allocator.h"

namespace {

using namespace bridge::training;
using Clock = std::chrono::steady_clock;

using bridge::bench::median;

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options options("gpt_train_bench", "GPT training throughput through bridge's pretrain()");
  bridge::bench::add_gpt_model_options(options);
  options.add_options()("steps", "timed steps", cxxopts::value<int64_t>()->default_value("10"))(
      "warmup-steps", "untimed steps before them", cxxopts::value<int64_t>()->default_value("2"))(
      "threads", "intra-op threads", cxxopts::value<int>()->default_value("2"))(
      "attention", "auto (SDPA on LibTorch 2.x) or unfused (explicit softmax)",
      cxxopts::value<std::string>()->default_value("auto"))("dtype", "fp32 or bf16 (bf16_mixed)",
                                                            cxxopts::value<std::string>()->default_value("fp32"))(
      "gradient-accumulation-fusion",
      "weight-gradient GEMMs add into the grad buffer (model.gradient_accumulation_fusion)",
      cxxopts::value<bool>()->default_value("true"))("h,help", "print this help");
  try {
    const cxxopts::ParseResult args = options.parse(argc, argv);
    if (args.count("help")) {
      std::printf("%s\n", options.help().c_str());
      return 0;
    }
    const int64_t steps = args["steps"].as<int64_t>();
    const int64_t warmup = args["warmup-steps"].as<int64_t>();
    const int threads = args["threads"].as<int>();

    ConfigContainer config = bridge::bench::gpt_bench_config(args);
    config.train.global_batch_size = config.train.micro_batch_size;  // one micro-batch per step
    config.train.train_iters = warmup + steps;
    config.train.num_threads = threads;
    config.model.gradient_accumulation_fusion = args["gradient-accumulation-fusion"].as<bool>();
    const std::string attention = args["attention"].as<std::string>();
    if (attention != "auto" && attention != "unfused") {
      throw std::invalid_argument("--attention must be auto or unfused, got " + attention);
    }
    config.model.attention_backend =
        attention == "auto" ? bridge::models::AttnBackend::kAuto : bridge::models::AttnBackend::kUnfused;
    const std::string dtype = args["dtype"].as<std::string>();
    if (dtype == "bf16") {
      apply_mixed_precision_recipe(config.mixed_precision, "bf16_mixed");
    } else if (dtype != "fp32") {
      throw std::invalid_argument("--dtype must be fp32 or bf16, got " + dtype);
    }
    // Config overrides after the flags, as bridge-pretrain's: model.recompute_granularity=full ...
    for (const std::string& assignment : args.unmatched()) {
      if (assignment.find('=') == std::string::npos) {
        throw std::invalid_argument("unexpected argument '" + assignment + "': overrides are KEY=VALUE");
      }
      bridge::training::apply_override(config, assignment);
    }
    // The log line reads losses back and prints; keep it out of every timed step.
    config.logging.log_interval = std::numeric_limits<int64_t>::max();

    // pretrain() configures malloc and LibTorch's CPU allocator; here first, so that the counter below wraps bridge's
    // allocator instead of keeping LibTorch's default in place (peak_rss_mb is then what bridge-pretrain's would be).
    bridge::utils::configure_host_allocator();
    // Counts the bytes of live tensors from here on: the step's own memory, apart from what malloc keeps.
    bridge::utils::CountingCpuAllocator& live = bridge::utils::CountingCpuAllocator::install();
    int64_t params = 0;
    double first_loss = std::numeric_limits<double>::quiet_NaN();
    // Marks in the order the step reaches them; the phases between them say where a difference to Python lies.
    // zero: grad-buffer zeroing; fwd: batch, model and loss; clip: finalize_model_grads and the grad-norm clip;
    // rest: what is left, the scheduler and the loss read-back (reduce_losses) mostly.
    enum Mark { kStepStart, kForwardStart, kForwardEnd, kBackwardStart, kBackwardEnd, kOptStart, kOptEnd, kMarks };
    std::array<Clock::time_point, kMarks> marks;
    std::vector<double> step_ms;
    std::map<std::string, std::vector<double>> phase_ms;
    auto callbacks = std::make_shared<CallbackManager>();
    callbacks->register_callback(Event::kTrainStart, [&](CallbackContext& ctx) {
      for (const auto& chunk : ctx.model) {
        for (const torch::Tensor& param : chunk->parameters()) params += param.numel();
      }
    });
    const std::pair<Event, Mark> mark_events[] = {
        {Event::kTrainStepStart, kStepStart}, {Event::kForwardStart, kForwardStart},
        {Event::kForwardEnd, kForwardEnd},    {Event::kBackwardStart, kBackwardStart},
        {Event::kBackwardEnd, kBackwardEnd},  {Event::kOptimizerStepStart, kOptStart},
        {Event::kOptimizerStepEnd, kOptEnd}};
    for (const auto& [event, mark] : mark_events) {
      callbacks->register_callback(event, [&marks, mark = mark](CallbackContext&) { marks[mark] = Clock::now(); });
    }
    callbacks->register_callback(Event::kTrainStepEnd, [&](CallbackContext& ctx) {
      // Read the clock before anything else so the loss read-back below stays out of the step.
      const auto end = Clock::now();
      auto ms_between = [](Clock::time_point a, Clock::time_point b) {
        return std::chrono::duration<double, std::milli>(b - a).count();
      };
      const double ms = ms_between(marks[kStepStart], end);
      if (ctx.state.train_state.step >= warmup) {
        step_ms.push_back(ms);
        const double zero = ms_between(marks[kStepStart], marks[kForwardStart]);
        const double forward = ms_between(marks[kForwardStart], marks[kForwardEnd]);
        const double backward = ms_between(marks[kBackwardStart], marks[kBackwardEnd]);
        const double clip = ms_between(marks[kBackwardEnd], marks[kOptStart]);
        const double opt = ms_between(marks[kOptStart], marks[kOptEnd]);
        phase_ms["zero"].push_back(zero);
        phase_ms["fwd"].push_back(forward);
        phase_ms["bwd"].push_back(backward);
        phase_ms["clip"].push_back(clip);
        phase_ms["opt"].push_back(opt);
        phase_ms["rest"].push_back(ms - zero - forward - backward - clip - opt);
      }
      if (ctx.state.train_state.step == 0 && !ctx.loss_dict->empty()) {
        first_loss = ctx.loss_dict->at("lm loss").item<double>();
      }
    });

    pretrain(config, gpt_forward_step, callbacks);

    const double ms = median(step_ms);
    const auto tokens = static_cast<double>(config.train.micro_batch_size * config.model.seq_length);
    std::printf("cpp first_loss=%.4f ln_vocab=%.4f\n", first_loss,
                std::log(static_cast<double>(config.model.vocab_size)));
    std::printf("cpp phases_ms");
    for (const char* phase : {"zero", "fwd", "bwd", "clip", "opt", "rest"}) {
      std::printf(" %s=%.2f", phase, median(phase_ms[phase]));
    }
    std::printf("\n");
    const char* world_env = std::getenv("WORLD_SIZE");
    const char* rank_env = std::getenv("RANK");
    const int world = world_env != nullptr ? std::atoi(world_env) : 1;
    const bridge::training::utils::MemoryEstimate estimate = bridge::training::utils::estimate_memory(config, world);
    constexpr double kMiB = 1024.0 * 1024.0;
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);  // ru_maxrss is in KiB on Linux
    const double gflops =
        bridge::training::utils::num_floating_point_operations(config.model, config.train.micro_batch_size, /*tp=*/1) /
        1e9;
    if (world > 1) std::printf("cpp rank=%s world=%d\n", rank_env != nullptr ? rank_env : "?", world);
    // On a GPU the process's resident memory is the host side only: the device's figures are the caching allocator's,
    // on the main line (what run_gpt_train_bench.sh keeps) when the run used the device.
    std::string cuda_fields;
    const std::map<std::string, int64_t> cuda = bridge::training::utils::cuda_memory_stats();
    const auto stat = [&](const std::string& name) {
      const auto found = cuda.find(name);
      return found == cuda.end() ? 0.0 : static_cast<double>(found->second) / kMiB;
    };
    if (stat("reserved_bytes.all.peak") > 0) {
      cuda_fields = " cuda_peak_mb=" + std::to_string(std::lround(stat("allocated_bytes.all.peak"))) +
                    " cuda_reserved_peak_mb=" + std::to_string(std::lround(stat("reserved_bytes.all.peak")));
    }
    std::printf(
        "cpp tokens_per_s=%.1f step_ms=%.2f best_ms=%.2f steps=%zu threads=%d params=%lld attention=%s dtype=%s "
        "torch=%s model_gflops=%.2f peak_rss_mb=%.0f live_peak_mb=%.0f predicted_mb=%.0f "
        "predicted_activations_mb=%.0f%s\n",
        tokens / (ms / 1000.0), ms, step_ms.empty() ? 0.0 : *std::min_element(step_ms.begin(), step_ms.end()),
        step_ms.size(), threads, static_cast<long long>(params),
        attention == "auto" && TORCH_VERSION_MAJOR >= 2 ? "sdpa" : "unfused", dtype.c_str(), TORCH_VERSION, gflops,
        static_cast<double>(usage.ru_maxrss) / 1024.0, static_cast<double>(live.peak_bytes()) / kMiB,
        estimate.total() / kMiB, estimate.activations / kMiB, cuda_fields.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_train_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
