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
//   experts_parallel    one autograd node for all experts whose forward and backward run the experts side by side,
//                       one expert per thread (at::parallel_for; each expert's GEMMs single-threaded), the SwiGLU
//                       by hand and the weight gradients added into the grad buffer (addmm_), instead of every small
//                       GEMM split over the threads one after another
//   experts_grouped_mm  the experts' weights stacked [E, 2f, h] / [E, h, f] once, each weight one at::_grouped_mm
//                       over all experts (transformers' grouped_mm kernel; Megatron-Core's GroupedMLP)
//   unpermute_gather    each token's k rows gathered in token order and summed ([T, k, h].sum(1)), no index_add
// bench/moe_layer_bench.py times transformers' Qwen3MoeSparseMoeBlock of the same shape. Prints one line per piece:
//   cpp_moe piece=<name> fwd_ms=<median> bwd_ms=<median> threads=<t> tokens=<T> ...
//
//   build/bench/moe_layer_bench --hidden 768 --experts 8 --topk 2 --moe-ffn 384 --seq 64 --micro-batch 4 --threads 2
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
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

// The routed experts as one autograd node that runs them side by side, an expert per thread: forward keeps each
// expert's fc1 output and SwiGLU output; backward derives the SwiGLU by hand and adds each weight's gradient into its
// .grad (under DistributedDataParallel, the grad buffer: gradient accumulation fusion). Returns no gradient for the
// weights through autograd, as bridge's fused linear layers.
class ParallelExperts : public torch::autograd::Function<ParallelExperts> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& tokens, at::TensorList fc1,
                               at::TensorList fc2, std::vector<int64_t> counts) {
    const int64_t experts = static_cast<int64_t>(counts.size());
    const int64_t ffn = fc2[0].size(1);
    std::vector<int64_t> offsets(counts.size() + 1, 0);
    for (std::size_t e = 0; e < counts.size(); ++e) offsets[e + 1] = offsets[e] + counts[e];
    torch::Tensor hidden = torch::empty({tokens.size(0), 2 * ffn}, tokens.options());
    torch::Tensor activated = torch::empty({tokens.size(0), ffn}, tokens.options());
    torch::Tensor out = torch::empty({tokens.size(0), fc2[0].size(0)}, tokens.options());
    at::parallel_for(0, experts, 1, [&](int64_t begin, int64_t end) {
      for (int64_t e = begin; e < end; ++e) {
        const int64_t n = counts[e];
        if (n == 0) continue;
        torch::Tensor h = hidden.narrow(0, offsets[e], n);
        torch::Tensor a = activated.narrow(0, offsets[e], n);
        at::mm_out(h, tokens.narrow(0, offsets[e], n), fc1[e].t());
        at::mul_out(a, at::silu(h.narrow(1, 0, ffn)), h.narrow(1, ffn, ffn));
        torch::Tensor y = out.narrow(0, offsets[e], n);
        at::mm_out(y, a, fc2[e].t());
      }
    });
    ctx->save_for_backward({tokens, hidden, activated});
    ctx->saved_data["counts"] = counts;
    ctx->saved_data["offsets"] = offsets;
    std::vector<torch::Tensor> weights(fc1.begin(), fc1.end());
    weights.insert(weights.end(), fc2.begin(), fc2.end());
    ctx->saved_data["weights"] = weights;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& tokens = saved[0];
    const torch::Tensor& hidden = saved[1];
    const torch::Tensor& activated = saved[2];
    const std::vector<int64_t> counts = ctx->saved_data["counts"].toIntVector();
    const std::vector<int64_t> offsets = ctx->saved_data["offsets"].toIntVector();
    const std::vector<torch::Tensor> weights = ctx->saved_data["weights"].toTensorVector();
    const int64_t experts = static_cast<int64_t>(counts.size());
    const int64_t ffn = activated.size(1);
    const torch::Tensor grad_out = grads[0].contiguous();
    torch::Tensor grad_tokens = torch::empty_like(tokens);
    torch::Tensor grad_hidden = torch::empty_like(hidden);
    for (const torch::Tensor& w : weights) {
      if (!w.grad().defined()) w.mutable_grad() = torch::zeros_like(w);
    }
    at::parallel_for(0, experts, 1, [&](int64_t begin, int64_t end) {
      for (int64_t e = begin; e < end; ++e) {
        const int64_t n = counts[e];
        const torch::Tensor& w1 = weights[e];
        const torch::Tensor& w2 = weights[experts + e];
        if (n == 0) continue;
        const torch::Tensor dy = grad_out.narrow(0, offsets[e], n);
        const torch::Tensor x = tokens.narrow(0, offsets[e], n);
        const torch::Tensor h = hidden.narrow(0, offsets[e], n);
        w2.grad().addmm_(dy.t(), activated.narrow(0, offsets[e], n));
        const torch::Tensor da = dy.mm(w2);  // [n, f]
        const torch::Tensor gate = h.narrow(1, 0, ffn);
        const torch::Tensor up = h.narrow(1, ffn, ffn);
        const torch::Tensor sig = torch::sigmoid(gate);
        torch::Tensor dh = grad_hidden.narrow(0, offsets[e], n);
        // d silu(g) / dg = sig(g) (1 + g (1 - sig(g)))
        torch::Tensor d_gate = dh.narrow(1, 0, ffn);
        torch::Tensor d_up = dh.narrow(1, ffn, ffn);
        at::mul_out(d_gate, da * up, sig * (1 + gate * (1 - sig)));
        at::mul_out(d_up, da, gate * sig);
        w1.grad().addmm_(dh.t(), x);
        torch::Tensor dx = grad_tokens.narrow(0, offsets[e], n);
        at::mm_out(dx, dh, w1);
      }
    });
    torch::autograd::variable_list out(1 + 2 * experts + 1);
    out[0] = grad_tokens;
    return out;
  }
};

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
        {"experts_parallel",
         [&] {
           return ParallelExperts::apply(leaf(permuted.tokens), at::TensorList(fc1), at::TensorList(fc2), count_list);
         }},
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
    {
      // The rewritten experts against bridge's: the same output, input gradient and weight gradients.
      auto run = [&](const Piece& piece) {
        ddp.zero_grad_buffer();
        const torch::Tensor in = leaf(permuted.tokens);
        std::vector<torch::Tensor> results;
        // Each piece makes its own leaf; rerun the forward on a known one through the piece's code path.
        torch::Tensor out = piece.forward();
        out.backward(grad_rows.view(out.sizes()));
        results.push_back(out.detach().clone());
        for (const torch::Tensor& w : fc1) results.push_back(w.grad().clone());
        for (const torch::Tensor& w : fc2) results.push_back(w.grad().clone());
        return results;
      };
      const auto find = [&](const std::string& name) {
        for (const Piece& piece : pieces) {
          if (piece.name == name) return piece;
        }
        throw std::logic_error("no piece " + name);
      };
      const std::vector<torch::Tensor> reference = run(find("experts"));
      for (const char* name : {"experts_fused", "experts_split_fused", "experts_parallel"}) {
        const std::vector<torch::Tensor> other = run(find(name));
        double worst = 0.0;
        for (std::size_t i = 0; i < reference.size(); ++i) {
          worst = std::max(worst, (other[i] - reference[i]).abs().max().item<double>() /
                                      std::max(1e-12, reference[i].abs().max().item<double>()));
        }
        std::printf("cpp_moe check=%s max_rel_diff=%.2e (output and weight gradients against experts)\n", name, worst);
      }
      ddp.zero_grad_buffer();
    }
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
