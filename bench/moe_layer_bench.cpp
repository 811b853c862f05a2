// One MoE layer of gpt_train_bench's --block qwen3_moe, forward and backward, timed whole and piece by piece (router
// with its load-balancing loss, permute, the experts, unpermute), to say where bridge's MoE layer spends a step; and
// the same experts and unpermute written other ways on the same weights and tokens, to size what a change to
// bridge/models/moe would gain. The layer is wrapped in DistributedDataParallel as pretrain() wraps the model, so its
// gradients land in the grad buffer as in a training step.
//   experts_fused       each expert's weights through linear_with_grad_accumulation (gradient accumulation fusion:
//                       the weight-gradient GEMM adds into the grad buffer, as the dense layers do) instead of
//                       matmul (a fresh gradient, which the buffer's hook then adds)
//   experts_split       the tokens cut per expert by one split_with_sizes (backward: one cat) instead of a narrow
//                       each (backward: a zero-filled full-size gradient per expert, summed)
//   experts_split_fused both
//   experts_split_chunk split, and the SwiGLU's gate and up halves by chunk (one cat back) instead of two narrows
//   experts_grouped_mm  the experts' weights stacked [E, 2f, h] / [E, h, f] once, each weight one at::_grouped_mm
//                       over all experts (transformers' grouped_mm kernel; Megatron-Core's GroupedMLP)
//   unpermute_gather    each token's k rows gathered in token order and summed ([T, k, h].sum(1)), no index_add
// bench/moe_layer_bench.py times transformers' Qwen3MoeSparseMoeBlock of the same shape. Prints one line per piece:
//   cpp_moe piece=<name> fwd_ms=<median> bwd_ms=<median> threads=<t> tokens=<T> ...
//
//   build/bench/moe_layer_bench --hidden 768 --experts 8 --topk 2 --moe-ffn 384 --seq 64 --micro-batch 4 --threads 2
#include <ATen/ATen.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <chrono>
#include <cstdio>
#include <cxxopts.hpp>
#include <functional>
#include <string>
#include <vector>

#include "bench/gpt_bench_model.h"
#include "bridge/models/moe/moe_layer.h"
#include "bridge/models/moe/moe_logging.h"
#include "bridge/models/moe/moe_utils.h"
#include "bridge/models/transformer_layer.h"
#include "parallel/distributed.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/grad_accumulation_fusion.h"

namespace {

namespace moe = bridge::models::moe;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// forward() returns the output (its graph built from fresh leaves); backward() runs it back with a fixed gradient.
struct Piece {
  std::string name;
  std::function<torch::Tensor()> forward;
};

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options options("moe_layer_bench", "One MoE layer's forward and backward, whole and by piece");
  bridge::bench::add_gpt_model_options(options);
  options.add_options()("iters", "timed iterations", cxxopts::value<int>()->default_value("30"))(
      "threads", "intra-op threads", cxxopts::value<int>()->default_value("2"))("h,help", "print this help");
  try {
    const cxxopts::ParseResult args = options.parse(argc, argv);
    if (args.count("help")) {
      std::printf("%s\n", options.help().c_str());
      return 0;
    }
    const int threads = args["threads"].as<int>();
    const int iters = args["iters"].as<int>();
    torch::set_num_threads(threads);
    bridge::training::ConfigContainer container = bridge::bench::gpt_bench_config(args);
    bridge::models::GPTConfig& config = container.model;
    if (!config.num_moe_experts) throw std::invalid_argument("moe_layer_bench needs --block qwen3_moe");
    bridge::parallel::init_distributed(bridge::parallel::LaunchEnv{}, {});
    bridge::parallel::initialize_model_parallel(1);
    moe::set_aux_loss_backward_scale(1.0);

    moe::MoELayer layer(config, /*layer_number=*/0);
    layer->train();
    bridge::parallel::distributed::DistributedDataParallel ddp(layer.ptr());
    const int64_t s = config.seq_length;
    const int64_t b = container.train.micro_batch_size;
    const int64_t h = config.hidden_size;
    const int64_t experts = *config.num_moe_experts;
    const int64_t ffn = config.moe_ffn_size();
    torch::manual_seed(1234);
    const torch::Tensor input = torch::randn({s, b, h});
    const torch::Tensor grad_out = torch::randn({s, b, h});

    // One routing of `input`, fixed, for the pieces after the router.
    moe::Routing routing;
    moe::Permutation permuted;
    {
      torch::NoGradGuard no_grad;
      routing = layer->router(input);
      permuted = moe::permute(input.reshape({-1, h}), routing.probs, routing.routing_map);
    }
    const int64_t tokens = s * b;
    const int64_t rows = permuted.tokens.size(0);
    const torch::Tensor counts = permuted.tokens_per_expert;
    const torch::Tensor grad_rows = torch::randn({rows, h});
    const torch::Tensor grad_tokens = torch::randn({tokens, h});
    auto leaf = [](const torch::Tensor& t) { return t.detach().clone().requires_grad_(true); };
    std::vector<torch::Tensor> fc1, fc2;
    for (const auto& module : *layer->experts->local_experts) {
      const auto& expert = module->as<moe::ExpertMLPImpl>();
      fc1.push_back(expert->linear_fc1->weight);
      fc2.push_back(expert->linear_fc2->weight);
    }
    // [E, h, 2f] and [E, f, h] leaves: x @ w per group, as at::_grouped_mm takes them.
    const torch::Tensor fc1_stacked = leaf(torch::stack(fc1, 0).transpose(1, 2));
    const torch::Tensor fc2_stacked = leaf(torch::stack(fc2, 0).transpose(1, 2));
    const torch::Tensor offsets = counts.cumsum(0).to(torch::kInt);
    const std::vector<int64_t> count_list(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + experts);
    // Per token its k permuted rows, in token order: the inverse of the permutation, grouped by token.
    const torch::Tensor by_token =
        std::get<1>(permuted.sorted_indices.sort(std::optional<bool>(true), /*dim=*/0, /*descending=*/false));
    const int64_t k = config.moe_router_topk;

    auto swiglu_narrow = [&](const torch::Tensor& x) {
      return torch::silu(x.narrow(-1, 0, ffn)) * x.narrow(-1, ffn, ffn);
    };
    auto swiglu_chunk = [&](const torch::Tensor& x) {
      const std::vector<torch::Tensor> halves = x.chunk(2, -1);
      return torch::silu(halves[0]) * halves[1];
    };
    auto linear = [](const torch::Tensor& x, const torch::Tensor& weight, bool fused) {
      return fused ? bridge::parallel::tensor_parallel::linear_with_grad_accumulation(x, weight, {}, true)
                   : torch::matmul(x, weight.t());
    };
    auto variant_experts = [&](const torch::Tensor& x, bool split, bool chunk, bool fused) {
      std::vector<torch::Tensor> slices;
      if (split) {
        slices = x.split_with_sizes(count_list, 0);
      } else {
        int64_t offset = 0;
        for (int64_t e = 0; e < experts; ++e) {
          slices.push_back(x.narrow(0, offset, count_list[e]));
          offset += count_list[e];
        }
      }
      std::vector<torch::Tensor> outputs;
      for (int64_t e = 0; e < experts; ++e) {
        const torch::Tensor hidden = linear(slices[e], fc1[e], fused);
        outputs.push_back(linear(chunk ? swiglu_chunk(hidden) : swiglu_narrow(hidden), fc2[e], fused));
      }
      return torch::cat(outputs, 0);
    };

    const std::vector<Piece> pieces = {
        {"layer", [&] { return layer(leaf(input)); }},
        {"router", [&] { return layer->router(leaf(input)).probs; }},
        {"permute",
         [&] {
           const moe::Permutation p =
               moe::permute(leaf(input).reshape({-1, h}), leaf(routing.probs), routing.routing_map);
           return p.tokens + p.probs.unsqueeze(-1);  // both outputs' backward
         }},
        {"experts", [&] { return layer->experts(leaf(permuted.tokens), counts); }},
        {"unpermute",
         [&] {
           return moe::unpermute(leaf(permuted.tokens) * leaf(permuted.probs).unsqueeze(-1), permuted.sorted_indices,
                                 tokens);
         }},
        {"experts_fused", [&] { return variant_experts(leaf(permuted.tokens), false, false, true); }},
        {"experts_split", [&] { return variant_experts(leaf(permuted.tokens), true, false, false); }},
        {"experts_split_fused", [&] { return variant_experts(leaf(permuted.tokens), true, false, true); }},
        {"experts_split_chunk", [&] { return variant_experts(leaf(permuted.tokens), true, true, false); }},
        {"experts_grouped_mm",
         [&] {
           const torch::Tensor hidden = at::_grouped_mm(leaf(permuted.tokens), fc1_stacked, offsets);
           return at::_grouped_mm(swiglu_chunk(hidden), fc2_stacked, offsets);
         }},
        {"unpermute_gather",
         [&] {
           const torch::Tensor weighted = leaf(permuted.tokens) * leaf(permuted.probs).unsqueeze(-1);
           return weighted.index_select(0, by_token).view({tokens, k, h}).sum(1);
         }},
    };
    // Round-robin: each iteration runs every piece once, so that the machine's load drifts over all pieces alike.
    std::vector<std::vector<double>> forward_ms(pieces.size()), backward_ms(pieces.size());
    for (int i = 0; i < iters + 2; ++i) {
      for (std::size_t p = 0; p < pieces.size(); ++p) {
        moe::MoEMetricsTracker::get().clear();
        ddp.zero_grad_buffer();
        auto start = Clock::now();
        const torch::Tensor out = pieces[p].forward();
        const double forward = ms_since(start);
        const torch::Tensor grad = out.numel() == grad_out.numel()      ? grad_out.view(out.sizes())
                                   : out.numel() == grad_rows.numel()   ? grad_rows.view(out.sizes())
                                   : out.numel() == grad_tokens.numel() ? grad_tokens.view(out.sizes())
                                                                        : torch::ones_like(out);
        start = Clock::now();
        out.backward(grad);
        const double backward = ms_since(start);
        if (i >= 2) {
          forward_ms[p].push_back(forward);
          backward_ms[p].push_back(backward);
        }
      }
    }
    for (std::size_t p = 0; p < pieces.size(); ++p) {
      std::printf("cpp_moe piece=%s fwd_ms=%.3f bwd_ms=%.3f threads=%d tokens=%lld rows=%lld experts=%lld torch=%s\n",
                  pieces[p].name.c_str(), bridge::bench::median(forward_ms[p]), bridge::bench::median(backward_ms[p]),
                  threads, static_cast<long long>(tokens), static_cast<long long>(rows),
                  static_cast<long long>(experts), TORCH_VERSION);
    }
    bridge::parallel::destroy_distributed();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe_layer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
