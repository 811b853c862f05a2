// The cp_attention scenario of tensor_parallel_worker (see context_parallel_attention_scenario.h): every rank builds
// the same seeded q, k, v and output gradient of the whole sequence, runs context_parallel_attention on its zigzag
// share over the world group, and compares its output and q/k/v gradients with its positions of the fp64 causal
// attention of the whole sequence.
#include "tests/dist/context_parallel_attention_scenario.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/context_parallel/attention.h"
#include "parallel/distributed.h"
#include "tests/causal_attention_reference.h"

namespace bridge::testing {
namespace {

using namespace bridge::parallel;
using namespace bridge::parallel::context_parallel;

int g_failures = 0;

void expect(bool condition, const std::string& what) {
  if (condition) return;
  ++g_failures;
  std::printf("rank %d: FAILED %s\n", get_rank(), what.c_str());
}

// max |actual - expected| / max |expected|, checked against `tolerance` and folded into `worst`.
void expect_close(const std::string& what, const torch::Tensor& actual, const torch::Tensor& expected, double tolerance,
                  double& worst) {
  if (!actual.defined() || actual.sizes() != expected.sizes()) {
    expect(false, what + ": missing or of another shape");
    return;
  }
  const torch::Tensor reference = expected.to(torch::kFloat64);
  const double relative =
      (actual.to(torch::kFloat64) - reference).abs().max().item<double>() / reference.abs().max().item<double>();
  worst = std::max(worst, relative);
  expect(relative <= tolerance,
         what + ": relative difference " + std::to_string(relative) + " > " + std::to_string(tolerance));
}

torch::Tensor seeded(at::IntArrayRef sizes, uint64_t seed, torch::Dtype dtype) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randn(sizes, generator).to(dtype);
}

// The worst relative differences seen, by dtype and by output / gradient.
struct Worst {
  double fp32_output = 0, fp32_grad = 0, bf16_output = 0, bf16_grad = 0;
};

void check_attention(CpCommType type, int64_t heads, int64_t groups, torch::Dtype dtype, double scale, Worst& worst) {
  ProcessGroup& group = get_world_group();
  const int cp = group.size(), rank = group.rank();
  const int64_t b = 2, chunk = 3, s = 2 * cp * chunk, d = 8;
  const std::string what = std::string(to_string(type)) + " heads " + std::to_string(heads) + " groups " +
                           std::to_string(groups) + " " + c10::toString(dtype) + " scale " + std::to_string(scale);
  const uint64_t seed = 100 * static_cast<uint64_t>(groups) + (dtype == torch::kFloat32 ? 0 : 50);
  const torch::Tensor q = seeded({b, heads, s, d}, seed + 1, dtype), k = seeded({b, groups, s, d}, seed + 2, dtype),
                      v = seeded({b, groups, s, d}, seed + 3, dtype), dout = seeded({b, heads, s, d}, seed + 4, dtype);

  // The whole sequence in fp64 from the same (rounded) values, on every rank.
  const torch::Tensor q64 = q.to(torch::kFloat64).requires_grad_(), k64 = k.to(torch::kFloat64).requires_grad_(),
                      v64 = v.to(torch::kFloat64).requires_grad_();
  const torch::Tensor ref = reference_causal_attention(q64, k64, v64, scale == 0.0 ? 1.0 / std::sqrt(d) : scale);
  ref.backward(dout.to(torch::kFloat64));
  auto mine = [&](const torch::Tensor& whole) { return get_tensor_on_this_cp_rank(whole, 2, cp, rank); };

  const torch::Tensor q_local = mine(q).requires_grad_(), k_local = mine(k).requires_grad_(),
                      v_local = mine(v).requires_grad_();
  const torch::Tensor out = context_parallel_attention(q_local, k_local, v_local, type, group, scale);
  expect(out.scalar_type() == dtype, what + ": output dtype " + c10::toString(out.scalar_type()));
  out.backward(mine(dout));

  const bool fp32 = dtype == torch::kFloat32;
  // bf16: the inputs are exact in both; the output and gradients are rounded to bf16 (2^-9 relative) and the
  // backward's delta uses the bf16 output, as flash attention's does.
  const double tolerance = fp32 ? 1e-5 : 2e-2;
  double& output_worst = fp32 ? worst.fp32_output : worst.bf16_output;
  double& grad_worst = fp32 ? worst.fp32_grad : worst.bf16_grad;
  expect_close(what + " output", out, mine(ref), tolerance, output_worst);
  expect_close(what + " dq", q_local.grad(), mine(q64.grad()), tolerance, grad_worst);
  expect_close(what + " dk", k_local.grad(), mine(k64.grad()), tolerance, grad_worst);
  expect_close(what + " dv", v_local.grad(), mine(v64.grad()), tolerance, grad_worst);
}

// The p2p ring sends and receives asynchronously and computes while its transfer is in flight: each step's compute
// lies between the start of the next block's transfer and the wait for it, forward and backward; and it starts
// exactly the ring's operations (a send and a receive per hop: cp - 1 hops forward; backward cp - 1 of blocks and cp
// of their gradients).
void check_ring_schedule() {
  ProcessGroup& group = get_world_group();
  const int cp = group.size();
  const torch::Tensor q = seeded({1, 2, 4 * cp, 4}, 7, torch::kFloat32).requires_grad_();
  const torch::Tensor kv = seeded({1, 1, 4 * cp, 4}, 8, torch::kFloat32).requires_grad_();
  std::vector<RingEvent> events;
  set_ring_event_recorder(&events);
  const uint64_t before_forward = group.operation_count();
  const torch::Tensor out = context_parallel_attention(q, kv, kv, CpCommType::kP2P, group);
  const uint64_t forward_ops = group.operation_count() - before_forward;
  out.sum().backward();
  const uint64_t backward_ops = group.operation_count() - before_forward - forward_ops;
  set_ring_event_recorder(nullptr);
  expect(forward_ops == static_cast<uint64_t>(2 * (cp - 1)),
         "p2p forward started " + std::to_string(forward_ops) + " operations, not 2 (cp - 1)");
  expect(backward_ops == static_cast<uint64_t>(2 * (cp - 1) + 2 * cp),
         "p2p backward started " + std::to_string(backward_ops) + " operations, not 2 (cp - 1) + 2 cp");
  for (const bool backward : {false, true}) {
    for (int step = 0; step < cp; ++step) {
      auto position = [&](RingEvent::Kind kind) {
        for (std::size_t i = 0; i < events.size(); ++i) {
          if (events[i].backward == backward && events[i].step == step && events[i].kind == kind) {
            return static_cast<int>(i);
          }
        }
        return -1;
      };
      const int start = position(RingEvent::Kind::kStartTransfer), compute = position(RingEvent::Kind::kCompute),
                wait = position(RingEvent::Kind::kWaitTransfer);
      const std::string where = std::string(backward ? "backward" : "forward") + " step " + std::to_string(step);
      expect(compute >= 0, "p2p " + where + " computed nothing");
      if (step + 1 < cp) {
        expect(start >= 0 && start < compute && compute < wait,
               "p2p " + where + " did not compute while its transfer was in flight (start " + std::to_string(start) +
                   ", compute " + std::to_string(compute) + ", wait " + std::to_string(wait) + ")");
      } else {
        expect(start < 0 && wait < 0, "p2p " + where + ": the last step transfers no block");
      }
    }
  }
}

// Ulysses needs the heads to divide by cp: the error names the fields and the other comm types, on every rank,
// before any communication (so no rank waits on another).
void check_a2a_head_count_error() {
  ProcessGroup& group = get_world_group();
  const int cp = group.size();
  const torch::Tensor q = torch::zeros({1, 2 * cp - 1, 2, 4}), kv = torch::zeros({1, 1, 2, 4});
  try {
    context_parallel_attention(q, kv, kv, CpCommType::kA2A, group);
    expect(false, "a2a with " + std::to_string(2 * cp - 1) + " heads over cp " + std::to_string(cp) + " did not throw");
  } catch (const std::invalid_argument& error) {
    const std::string message = error.what();
    for (const char* field :
         {"num_attention_heads", "tensor_model_parallel_size", "context_parallel_size", "p2p", "all_gather"}) {
      expect(message.find(field) != std::string::npos,
             "a2a head-count error lacks '" + std::string(field) + "': " + message);
    }
  }
}

}  // namespace

int run_context_parallel_attention_scenario(double& max_relative) {
  g_failures = 0;
  Worst worst;
  for (const auto& [type, name] : kCpCommTypeNames) {
    for (const int64_t groups : {4, 2, 1}) {  // multi-head, grouped-query, multi-query (a2a repeats groups < cp)
      for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
        check_attention(type, /*heads=*/4, groups, dtype, /*scale=*/groups == 2 ? 0.3 : 0.0, worst);
      }
    }
  }
  check_ring_schedule();
  check_a2a_head_count_error();
  std::printf("rank %d cp %d: max relative |diff| fp32 output %.3g grad %.3g, bf16 output %.3g grad %.3g\n", get_rank(),
              get_world_size(), worst.fp32_output, worst.fp32_grad, worst.bf16_output, worst.bf16_grad);
  max_relative = std::max({worst.fp32_output, worst.fp32_grad, worst.bf16_output, worst.bf16_grad});
  return g_failures;
}

}  // namespace bridge::testing
