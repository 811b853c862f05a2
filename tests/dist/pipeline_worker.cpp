// One rank of the pipeline-schedule tests, launched by pipeline_dist_test. A toy model of residual blocks
// x + tanh(x W^T + b), whose layer l is built from seed 1000 + l in every layout, runs split over pipeline stages
// (and virtual chunks), and its loss and every layer's weight gradient must match the whole model run here in one
// process on the whole batch.
//
//   pipeline_worker 1f1b          pp = world size (and pp = 2 x dp = 2 on four ranks), several micro-batch counts
//   pipeline_worker interleaved   two chunks per rank, several micro-batch counts and group sizes, and the checks
//                                 that reject invalid layouts
//
// Exit 0 and a line ending in ": ok" on success; every failure prints what differed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "parallel/pipeline_parallel/schedules.h"

namespace {

using namespace bridge::parallel;
using namespace bridge::parallel::pipeline_parallel;

int g_failures = 0;

void expect(bool condition, const std::string& what) {
  if (condition) return;
  ++g_failures;
  std::printf("rank %d: FAILED %s\n", get_rank(), what.c_str());
}

constexpr int64_t kSeq = 3, kMicroBatch = 2, kHidden = 8, kLayersPerStage = 2;

struct Layer {
  torch::Tensor weight, bias;
};

Layer make_layer(int64_t index, torch::Dtype dtype) {
  torch::manual_seed(1000 + static_cast<uint64_t>(index));
  const auto options = torch::TensorOptions().dtype(dtype);
  return {(torch::randn({kHidden, kHidden}, options) * 0.5).requires_grad_(true),
          (torch::randn({kHidden}, options) * 0.1).requires_grad_(true)};
}

torch::Tensor run_layers(torch::Tensor x, const std::vector<Layer>& layers) {
  for (const Layer& layer : layers) x = x + torch::tanh(torch::matmul(x, layer.weight.t()) + layer.bias);
  return x;
}

torch::Tensor make_data(int64_t m, torch::Dtype dtype) {
  torch::manual_seed(42);
  return torch::randn({kSeq, m * kMicroBatch, kHidden}, torch::TensorOptions().dtype(dtype));
}

struct Case {
  int pp;
  int vpp;  // 1: no virtual pipeline
  int64_t m;
  std::optional<int64_t> group;
  torch::Dtype dtype;
};

std::string name_of(const Case& c) {
  return "pp " + std::to_string(c.pp) + " v " + std::to_string(c.vpp) + " m " + std::to_string(c.m) +
         (c.group ? " G " + std::to_string(*c.group) : "") + (c.dtype == torch::kFloat64 ? " fp64" : " fp32");
}

// Relative difference, scaled by the reference's largest magnitude.
double rel_diff(const torch::Tensor& a, const torch::Tensor& reference) {
  const double scale = std::max(reference.abs().max().item<double>(), 1e-30);
  return (a - reference).abs().max().item<double>() / scale;
}

void run_case(const Case& c) {
  initialize_model_parallel(1, c.pp, c.vpp > 1 ? std::optional<int>(c.vpp) : std::nullopt);
  const std::string name = name_of(c);
  const int64_t stages = static_cast<int64_t>(c.pp) * c.vpp;
  const int rank = get_pipeline_model_parallel_rank();
  // fp32: micro-batches sum their gradients in another order than the whole batch; through 16 layers that is a few
  // ulps (measured up to 2.7e-6 relative to the largest gradient).
  const double tolerance = c.dtype == torch::kFloat64 ? 1e-12 : 1e-5;

  // The reference: every layer, the whole batch, the mean of squares.
  std::vector<Layer> all_layers;
  for (int64_t l = 0; l < stages * kLayersPerStage; ++l) all_layers.push_back(make_layer(l, c.dtype));
  const torch::Tensor data = make_data(c.m, c.dtype);
  const torch::Tensor reference_loss = run_layers(data, all_layers).pow(2).mean();
  reference_loss.backward();

  // This rank's chunks: chunk k holds virtual stage k * pp + rank, as in Megatron's layer assignment.
  std::vector<std::vector<Layer>> chunks(static_cast<std::size_t>(c.vpp));
  std::vector<int64_t> first_layer(static_cast<std::size_t>(c.vpp));
  for (int k = 0; k < c.vpp; ++k) {
    first_layer[k] = (static_cast<int64_t>(k) * c.pp + rank) * kLayersPerStage;
    for (int64_t l = 0; l < kLayersPerStage; ++l) chunks[k].push_back(make_layer(first_layer[k] + l, c.dtype));
  }
  std::vector<torch::Tensor> inputs(static_cast<std::size_t>(c.vpp));

  ForwardBackwardOptions o;
  o.num_microbatches = c.m;
  o.tensor_shape = {kSeq, kMicroBatch, kHidden};
  o.dtype = c.dtype;
  o.microbatch_group_size_per_vp_stage = c.group;
  for (int k = 0; k < c.vpp; ++k) o.set_input_tensor.push_back([&inputs, k](const torch::Tensor& t) { inputs[k] = t; });
  o.forward_step_func = [&](int64_t microbatch, int64_t chunk) {
    const bool first = rank == 0 && chunk == 0;
    expect(is_pipeline_first_stage() == first, name + ": virtual pipeline rank set during the forward step");
    expect(inputs[chunk].defined() != first, name + ": input tensor given exactly to non-first stages");
    const torch::Tensor x = first ? data.narrow(1, microbatch * kMicroBatch, kMicroBatch) : inputs[chunk];
    LossFunc loss = [](const torch::Tensor& output) {
      LossOutput result;
      result.loss = output.pow(2).sum();
      result.num_tokens = torch::tensor(output.numel(), torch::kInt64);
      result.reported["loss"] = torch::stack({result.loss.detach().to(torch::kFloat64),
                                              torch::tensor(static_cast<double>(output.numel()), torch::kFloat64)});
      return result;
    };
    return std::pair{run_layers(x, chunks[chunk]), loss};
  };
  const bool last_rank = rank == c.pp - 1;
  const auto func = get_forward_backward_func();
  expect(func == (c.pp == 1   ? &forward_backward_no_pipelining
                  : c.vpp > 1 ? &forward_backward_pipelining_with_interleaving
                              : &forward_backward_pipelining_without_interleaving),
         name + ": get_forward_backward_func");

  // Forward only first: its losses, and no gradient anywhere.
  std::map<int64_t, double> eval_losses, train_losses;
  o.forward_only = true;
  int forward_only_backward_calls = 0;
  o.hooks.on_forward_end = [&](int64_t microbatch, int64_t chunk, const torch::Tensor& out) {
    if (last_rank && chunk == c.vpp - 1) eval_losses[microbatch] = out.item<double>();
  };
  o.hooks.on_backward_start = [&](int64_t, int64_t) { ++forward_only_backward_calls; };
  o.set_grad_sync = [&](bool) { ++forward_only_backward_calls; };
  o.finalize_model_grads = [&] { ++forward_only_backward_calls; };
  const auto eval_reported = func(o);
  expect(forward_only_backward_calls == 0, name + ": forward_only ran a backward, grad sync or finalize");
  for (const auto& chunk : chunks) {
    for (const Layer& layer : chunk) expect(!layer.weight.grad().defined(), name + ": forward_only made grads");
  }

  // Then a training step, recording the hooks.
  o.forward_only = false;
  std::vector<std::string> events;
  std::set<std::pair<int64_t, int64_t>> forwards, backwards;
  int duplicates = 0;
  o.hooks.on_forward_start = [&](int64_t microbatch, int64_t chunk) {
    duplicates += !forwards.insert({microbatch, chunk}).second;
  };
  o.hooks.on_forward_end = [&](int64_t microbatch, int64_t chunk, const torch::Tensor& out) {
    if (last_rank && chunk == c.vpp - 1) train_losses[microbatch] = out.item<double>();
  };
  o.hooks.on_backward_start = [&](int64_t microbatch, int64_t chunk) {
    expect(forwards.count({microbatch, chunk}) == 1, name + ": backward before its forward");
    duplicates += !backwards.insert({microbatch, chunk}).second;
    events.push_back("backward");
  };
  o.hooks.on_backward_end = [&](int64_t, int64_t) { events.push_back("backward_end"); };
  o.set_grad_sync = [&](bool enabled) { events.push_back(enabled ? "sync" : "nosync"); };
  o.finalize_model_grads = [&] { events.push_back("finalize"); };
  const auto reported = func(o);

  // Hooks: every (micro-batch, chunk) once each way; grad sync off before each backward but the last.
  const auto expected_passes = static_cast<std::size_t>(c.m * c.vpp);
  expect(forwards.size() == expected_passes && backwards.size() == expected_passes && duplicates == 0,
         name + ": each (microbatch, chunk) forward and backward exactly once");
  for (int64_t mb = 0; mb < c.m; ++mb) {
    for (int k = 0; k < c.vpp; ++k) expect(forwards.count({mb, k}) && backwards.count({mb, k}), name + ": pass");
  }
  std::vector<std::string> expected_events;
  for (std::size_t i = 0; i < expected_passes; ++i) {
    for (const char* e : {i + 1 == expected_passes ? "sync" : "nosync", "backward", "backward_end"}) {
      expected_events.push_back(e);
    }
  }
  expected_events.push_back("finalize");
  expect(events == expected_events, name + ": grad sync / backward / finalize order");

  // The loss on the last stage, and every owned layer's gradients.
  double loss_diff = 0, grad_diff = 0;
  if (last_rank) {
    expect(static_cast<int64_t>(reported.size()) == c.m && static_cast<int64_t>(eval_reported.size()) == c.m,
           name + ": reported values per micro-batch on the last stage");
    double loss = 0, sum = 0, count = 0;
    for (const auto& [mb, value] : train_losses) loss += value;
    for (const auto& values : reported) {
      sum += values.at("loss")[0].item<double>();
      count += values.at("loss")[1].item<double>();
    }
    loss_diff = std::abs(loss - reference_loss.item<double>()) / reference_loss.item<double>();
    expect(loss_diff <= tolerance,
           name + ": loss " + std::to_string(loss) + " vs " + std::to_string(reference_loss.item<double>()));
    expect(std::abs(sum / count - reference_loss.item<double>()) <= tolerance * reference_loss.item<double>(),
           name + ": reported loss");
    expect(eval_losses == train_losses && static_cast<int64_t>(eval_losses.size()) == c.m,
           name + ": forward_only gives the training losses");
  } else {
    expect(reported.empty() && eval_reported.empty(), name + ": nothing reported off the last stage");
  }
  for (int k = 0; k < c.vpp; ++k) {
    for (int64_t l = 0; l < kLayersPerStage; ++l) {
      const Layer& mine = chunks[k][l];
      const Layer& reference = all_layers[first_layer[k] + l];
      grad_diff = std::max({grad_diff, rel_diff(mine.weight.grad(), reference.weight.grad()),
                            rel_diff(mine.bias.grad(), reference.bias.grad())});
    }
  }
  expect(grad_diff <= tolerance, name + ": grads differ by " + std::to_string(grad_diff));
  std::printf("rank %d: %s: max rel diff loss %.3g grad %.3g\n", get_rank(), name.c_str(), loss_diff, grad_diff);
  destroy_model_parallel();
}

// Invalid layouts fail on every rank before any exchange, so no rank waits.
void check_rejected(int pp, int vpp, int64_t m, bool empty_shape, int chunks_given, const std::string& message) {
  initialize_model_parallel(1, pp, vpp > 1 ? std::optional<int>(vpp) : std::nullopt);
  ForwardBackwardOptions o;
  o.num_microbatches = m;
  if (!empty_shape) o.tensor_shape = {kSeq, kMicroBatch, kHidden};
  o.set_input_tensor.assign(static_cast<std::size_t>(chunks_given), [](const torch::Tensor&) {});
  o.forward_step_func = [](int64_t, int64_t) { return std::pair{torch::Tensor(), LossFunc()}; };
  try {
    get_forward_backward_func()(o);
    expect(false, "no error for: " + message);
  } catch (const std::invalid_argument& error) {
    expect(std::string(error.what()).find(message) != std::string::npos, std::string("error: ") + error.what());
  }
  destroy_model_parallel();
}

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);
  const std::string mode = argc > 1 ? argv[1] : "";
  init_distributed({Backend::kGloo, std::chrono::seconds(60)});
  const int world = get_world_size();
  if (mode == "1f1b") {
    for (torch::Dtype dtype : {torch::kFloat32, torch::kFloat64}) {
      run_case({world, 1, 2 * world, std::nullopt, dtype});
      run_case({world, 1, world - 1, std::nullopt, dtype});  // fewer micro-batches than stages
    }
    run_case({world, 1, 1, std::nullopt, torch::kFloat64});
    if (world == 4) run_case({2, 1, 3, std::nullopt, torch::kFloat64});  // two pipelines side by side (dp = 2)
    check_rejected(world, 1, 2, /*empty_shape=*/true, 1, "tensor_shape is empty");
  } else if (mode == "interleaved") {
    const int pp = world;
    for (torch::Dtype dtype : {torch::kFloat32, torch::kFloat64}) run_case({pp, 2, pp * 2, std::nullopt, dtype});
    run_case({pp, 2, pp, std::nullopt, torch::kFloat64});
    run_case({pp, 2, pp * 3, std::nullopt, torch::kFloat64});
    if (pp == 2) {
      run_case({2, 2, 5, 3, torch::kFloat64});  // Megatron's example table, remainder group
      run_case({2, 3, 6, 3, torch::kFloat32});
    }
    check_rejected(pp, 2, pp + 1, false, 2, "dependency bubbles");
    check_rejected(pp, 2, pp - 1, false, 2, "must be <= num_microbatches");
    check_rejected(pp, 2, 2 * pp, false, 1, "set_input_tensor has 1 entries but this rank runs 2");
  } else {
    std::printf("usage: pipeline_worker 1f1b|interleaved\n");
    return 2;
  }
  std::printf("rank %d of %d: pipeline %s: %s\n", get_rank(), world, mode.c_str(), g_failures == 0 ? "ok" : "FAILED");
  destroy_distributed();
  return g_failures == 0 ? 0 : 1;
}
