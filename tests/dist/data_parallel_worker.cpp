// One rank of data_parallel_dist_test: DistributedDataParallel, finalize_model_grads and the grad norm over real
// process groups, each checked against the same computation done in one process on the full batch / full tensors.
//
//   data_parallel_worker ddp <float|double> <overlap 0|1> <average_in_collective 0|1> [reduce_scatter]
//                                   world = dp: 2 micro-batches per rank, grads and one AdamW step vs one process;
//                                   with reduce_scatter (use_distributed_optimizer) padded buckets whose 1/dp of this
//                                   rank holds the full batch's grads and the rest this rank's own, no step
//   data_parallel_worker finalize   world 2, pp = 2: tied embedding copies get the summed grad; norm counts it once
//   data_parallel_worker grad_norm  world 2, tp = 2: a sharded weight and a replicated bias; norm and clip vs full
//
// Prints "rank R: ok ..." (with the largest differences seen) and exits 0, or prints each failure and exits 1.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "parallel/distributed.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/distributed/finalize_model_grads.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/param_attributes.h"
#include "training/optimizer/clip_grads.h"
#include "training/optimizer/optimizer.h"

namespace {

using namespace bridge::parallel;
using bridge::parallel::distributed::DistributedDataParallel;
using bridge::parallel::distributed::DistributedDataParallelConfig;

int g_failures = 0;
double g_max_grad_diff = 0.0;   // largest |grad - reference| relative to max |reference|
double g_max_param_diff = 0.0;  // largest |param - reference| after the optimizer step

void expect(bool condition, const std::string& what) {
  if (condition) return;
  ++g_failures;
  std::printf("rank %d: FAILED %s\n", get_rank(), what.c_str());
}

// max |a - b| / max(max |b|, tiny), and whether it is within `tolerance`.
double relative_diff(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-30);
  return (a - b).abs().max().item<double>() / scale;
}

torch::Tensor leaf(const torch::Tensor& t) { return t.detach().clone().requires_grad_(true); }

// Three layers so that a small bucket_size gives several buckets: parameters w1 b1 w2 b2 w3 b3.
struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(torch::Dtype dtype) {
    torch::manual_seed(1234);  // the same model on every rank and in the reference
    auto options = torch::TensorOptions().dtype(dtype);
    const std::vector<std::vector<int64_t>> shapes = {{16, 6}, {16}, {16, 16}, {16}, {4, 16}, {4}};
    const char* names[] = {"w1", "b1", "w2", "b2", "w3", "b3"};
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      params.push_back(register_parameter(names[i], torch::randn(shapes[i], options) * 0.4));
    }
  }
  static torch::Tensor apply(const std::vector<torch::Tensor>& p, const torch::Tensor& x) {
    torch::Tensor h = torch::tanh(torch::linear(x, p[0], p[1]));
    h = torch::tanh(torch::linear(h, p[2], p[3]));
    return torch::linear(h, p[4], p[5]);
  }
  torch::Tensor forward(const torch::Tensor& x) { return apply(params, x); }
  std::vector<torch::Tensor> params;
};

torch::Tensor mean_loss(const torch::Tensor& output, const torch::Tensor& target) {
  return (output - target).square().mean();
}

// Under use_distributed_optimizer: every bucket is padded to a multiple of lcm(dp, 128), and this rank's 1/dp of it
// holds the full batch's gradient while the rest keeps this rank's own (a reduce-scatter, not an all-reduce).
void expect_reduce_scattered(const DistributedDataParallel& ddp, const std::vector<torch::Tensor>& params,
                             const std::vector<torch::Tensor>& reference, int dp, int rank, double tolerance) {
  std::vector<int64_t> bucket_start(static_cast<std::size_t>(ddp.num_buckets()), INT64_MAX);
  for (const torch::Tensor& param : params) {
    int64_t& start = bucket_start[static_cast<std::size_t>(ddp.bucket_of(param))];
    start = std::min(start, ddp.main_grad(param).storage_offset());
  }
  int64_t reduced = 0, local = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const int64_t bucket = ddp.bucket_of(params[i]);
    const int64_t numel = ddp.bucket_numel(bucket);
    expect(numel % std::lcm(dp, 128) == 0, "bucket " + std::to_string(bucket) + " of " + std::to_string(numel) +
                                               " elements is not padded to a multiple of lcm(dp, 128)");
    const int64_t shard = numel / dp;
    const int64_t own_begin = bucket_start[static_cast<std::size_t>(bucket)] + rank * shard;
    const torch::Tensor grad = ddp.main_grad(params[i]).reshape({-1});
    const torch::Tensor expected = reference[i].reshape({-1});
    const int64_t first = ddp.main_grad(params[i]).storage_offset();
    for (int64_t e = 0; e < grad.numel(); ++e) {
      const bool own = first + e >= own_begin && first + e < own_begin + shard;
      const double diff = std::abs(grad[e].item<double>() - expected[e].item<double>());
      const double scale = std::max(expected.abs().max().item<double>(), 1e-30);
      if (own) {
        ++reduced;
        g_max_grad_diff = std::max(g_max_grad_diff, diff / scale);
        expect(diff <= tolerance * scale, "param " + std::to_string(i) + " element " + std::to_string(e) +
                                              " of this rank's shard is not the full batch's gradient");
      } else if (diff > tolerance * scale) {
        ++local;  // this rank's own gradient, not reduced
      }
    }
  }
  expect(reduced > 0, "this rank owns no element");
  expect(local > 0, "every element outside this rank's shard equals the reduced gradient: an all-reduce ran");
}

// Under use_distributed_optimizer the parameters are views of a buffer laid out as the grad buffer, and
// start_param_sync all-gathers each bucket's shards in place: every rank writes `value(rank)` into all of its
// parameters, and afterwards each element holds the value of the rank that owns it. With overlap_param_gather the
// gathers are only started, and wait_for_param_gather (a forward's pre-hook) completes them.
void expect_param_gather(DistributedDataParallel& ddp, const std::vector<torch::Tensor>& params, int dp, int rank,
                         int step, bool overlap) {
  const auto value = [step](int owner) { return static_cast<double>((owner + 1) * 10 + step); };
  std::vector<int64_t> bucket_start(static_cast<std::size_t>(ddp.num_buckets()), INT64_MAX);
  for (const torch::Tensor& param : params) {
    expect(param.storage_offset() == ddp.main_grad(param).storage_offset() && param.is_alias_of(params.front()),
           "a parameter is not a view of the parameter buffer at its gradient's offset");
    int64_t& start = bucket_start[static_cast<std::size_t>(ddp.bucket_of(param))];
    start = std::min(start, param.storage_offset());
  }
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> kept;  // put back afterwards: the next step compares gradients with the reference's
  for (const torch::Tensor& param : params) {
    kept.push_back(param.detach().clone());
    param.detach().fill_(value(rank));
  }
  ddp.start_param_sync();
  const int64_t in_flight = bridge::parallel::distributed::param_gathers_in_flight();
  expect(in_flight == (overlap ? ddp.num_buckets() : 0),
         "parameter all-gathers in flight after start_param_sync: " + std::to_string(in_flight));
  bridge::parallel::distributed::wait_for_param_gather(ddp.module());
  expect(bridge::parallel::distributed::param_gathers_in_flight() == 0, "the pre-hook waited for every bucket");
  for (const torch::Tensor& param : params) {
    const int64_t start = bucket_start[static_cast<std::size_t>(ddp.bucket_of(param))];
    const int64_t shard = ddp.bucket_numel(ddp.bucket_of(param)) / dp;
    const torch::Tensor flat = param.detach().reshape({-1});
    for (int64_t e = 0; e < flat.numel(); ++e) {
      const auto owner = static_cast<int>((param.storage_offset() + e - start) / shard);
      if (flat[e].item<double>() != value(owner)) {
        expect(false, "element " + std::to_string(e) + " of a parameter holds " +
                          std::to_string(flat[e].item<double>()) + ", not the value of rank " + std::to_string(owner) +
                          " that owns it");
        break;
      }
    }
  }
  for (std::size_t i = 0; i < params.size(); ++i) params[i].detach().copy_(kept[i]);
}

int run_ddp(torch::Dtype dtype, bool overlap, bool average_in_collective, bool reduce_scatter) {
  init_distributed({Backend::kGloo, std::chrono::seconds(60)});
  initialize_model_parallel(1);
  ProcessGroup& dp_group = get_data_parallel_group(true);
  const int dp = dp_group.size();
  const int rank = dp_group.rank();
  constexpr int kMicroBatches = 2;
  constexpr int64_t kRowsPerMicroBatch = 3;
  const int64_t global_rows = kRowsPerMicroBatch * kMicroBatches * dp;
  const double tolerance = dtype == torch::kFloat64 ? 1e-12 : 2e-6;
  {
    auto model = std::make_shared<MlpImpl>(dtype);
    std::vector<torch::Tensor> ref_params;
    for (const auto& p : model->params) ref_params.push_back(leaf(p));
    DistributedDataParallelConfig config;
    config.overlap_grad_reduce = overlap;
    config.average_in_collective = average_in_collective;
    config.bucket_size = 50;  // reverse order: b3+w3 | b2+w2 | b1+w1 = 3 buckets with overlap
    config.use_distributed_optimizer = reduce_scatter;
    config.overlap_param_gather = reduce_scatter && overlap;
    // Under use_distributed_optimizer the parameters move into the param buffer: their own storages must be freed
    // then, or the model's weights are held twice (nothing here but the parameters refers to them).
    std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> own_storages;
    for (const torch::Tensor& param : model->params) own_storages.push_back(param.storage().getWeakStorageImpl());
    DistributedDataParallel ddp(model, config);
    for (std::size_t i = 0; i < own_storages.size(); ++i) {
      expect(own_storages[i].expired() == reduce_scatter,
             "parameter " + std::to_string(i) + "'s own storage " +
                 (reduce_scatter ? "outlived its move into the param buffer" : "was replaced without a param buffer"));
    }
    expect(ddp.num_buckets() == (overlap ? 3 : 1), "num_buckets " + std::to_string(ddp.num_buckets()));

    bridge::training::OptimizerConfig optimizer_config;
    optimizer_config.lr = 1e-2;
    auto optimizer = bridge::training::build_optimizer(optimizer_config, model->parameters());
    auto reference_optimizer = bridge::training::build_optimizer(optimizer_config, ref_params);

    for (int step = 0; step < 2; ++step) {
      torch::manual_seed(100 + step);  // the same global batch on every rank
      const torch::Tensor x = torch::randn({global_rows, 6}, torch::TensorOptions().dtype(dtype));
      const torch::Tensor y = torch::randn({global_rows, 4}, torch::TensorOptions().dtype(dtype));

      // This rank's contiguous share, in micro-batches; each micro-batch's mean loss / micro-batches, as Megatron.
      ddp.zero_grad_buffer();
      const std::uint64_t operations_before = dp_group.operation_count();
      for (int m = 0; m < kMicroBatches; ++m) {
        ddp.set_grad_sync(m == kMicroBatches - 1);
        const int64_t start = (rank * kMicroBatches + m) * kRowsPerMicroBatch;
        const torch::Tensor xm = x.narrow(0, start, kRowsPerMicroBatch), ym = y.narrow(0, start, kRowsPerMicroBatch);
        (mean_loss(model->forward(xm), ym) / kMicroBatches).backward();
      }
      const int64_t started_in_backward = ddp.buckets_started();
      ddp.finish_grad_sync();
      expect(ddp.buckets_started_in_backward() == started_in_backward, "buckets_started_in_backward");
      expect(started_in_backward == (overlap ? ddp.num_buckets() : 0),
             "buckets started during backward: " + std::to_string(started_in_backward));
      expect(dp_group.operation_count() - operations_before == static_cast<std::uint64_t>(ddp.num_buckets()),
             "one all-reduce (or reduce-scatter) per bucket");

      // The single-process reference: the full batch's mean loss.
      for (auto& p : ref_params) p.mutable_grad() = torch::Tensor();
      mean_loss(MlpImpl::apply(ref_params, x), y).backward();
      if (reduce_scatter) {
        std::vector<torch::Tensor> reference;
        for (const auto& p : ref_params) reference.push_back(p.grad());
        expect_reduce_scattered(ddp, model->params, reference, dp, rank, tolerance);
        // The distributed optimizer steps the shards (training::DistributedOptimizer); the gather is DDP's.
        expect_param_gather(ddp, model->params, dp, rank, step, overlap);
        continue;
      }
      for (std::size_t i = 0; i < ref_params.size(); ++i) {
        const double diff = relative_diff(model->params[i].grad(), ref_params[i].grad());
        g_max_grad_diff = std::max(g_max_grad_diff, diff);
        expect(diff <= tolerance, "step " + std::to_string(step) + " grad of param " + std::to_string(i) +
                                      " differs from the full batch by " + std::to_string(diff));
      }

      optimizer->step();
      reference_optimizer->step();
      for (std::size_t i = 0; i < ref_params.size(); ++i) {
        const torch::Tensor param = model->params[i].detach();
        const double diff = relative_diff(param, ref_params[i].detach());
        g_max_param_diff = std::max(g_max_param_diff, diff);
        expect(diff <= 10 * tolerance, "step " + std::to_string(step) + " param " + std::to_string(i) +
                                           " differs from the single-process step by " + std::to_string(diff));
        for (const torch::Tensor& other : dp_group.all_gather(param.contiguous())) {
          expect(other.equal(param), "param " + std::to_string(i) + " differs between data-parallel ranks");
        }
      }
    }
  }
  std::printf(
      "rank %d: dp %d %s overlap %d average_in_collective %d reduce_scatter %d: max grad rel diff %.3g, max param "
      "rel diff %.3g: %s\n",
      get_rank(), dp, dtype == torch::kFloat64 ? "fp64" : "fp32", overlap, average_in_collective, reduce_scatter,
      g_max_grad_diff, g_max_param_diff, g_failures == 0 ? "ok" : "FAILED");
  destroy_distributed();
  return g_failures == 0 ? 0 : 1;
}

// pp = 2: stage 0 holds the input embedding, stage 1 the output layer's copy (shared_embedding), plus one own param.
int run_finalize() {
  init_distributed({Backend::kGloo, std::chrono::seconds(60)});
  initialize_model_parallel(1, 2);
  const int stage = get_pipeline_model_parallel_rank();
  {
    auto module = std::make_shared<torch::nn::Module>();
    torch::manual_seed(5);
    torch::Tensor embedding = module->register_parameter("embedding", torch::randn({10, 4}));
    torch::Tensor own = module->register_parameter("own", torch::randn({3}));
    if (stage == 1) {
      bridge::parallel::tensor_parallel::ParamAttributes shared;
      shared.shared_embedding = true;
      bridge::parallel::tensor_parallel::set_param_attributes(embedding, shared);
    }
    DistributedDataParallel ddp(module);  // dp = 1: no communication, grads still in the buffer

    // Stage s's embedding grad is (s + 1) * c; its own param's grad is (s + 2) * d.
    torch::manual_seed(6);
    const torch::Tensor c = torch::randn({10, 4}), d = torch::randn({3});
    ddp.zero_grad_buffer();
    ((embedding * c).sum() * (stage + 1) + (own * d).sum() * (stage + 2)).backward();
    bridge::parallel::distributed::finalize_model_grads({&ddp}, {embedding});
    g_max_grad_diff = relative_diff(embedding.grad(), 3 * c);  // 1 + 2
    expect(g_max_grad_diff <= 1e-6,
           "tied embedding grad is not the sum of both copies: " + std::to_string(g_max_grad_diff));
    // Reverse order: `own` first, then the embedding.
    expect(embedding.grad().data_ptr<float>() == ddp.grad_buffers()[0].data_ptr<float>() + 3,
           "embedding grad left the buffer");

    // Counted once over the model-parallel group (the two stages): the embedding, stage 0's own, stage 1's own.
    const double expected = std::sqrt((3 * c).square().sum().item<double>() + (2 * d).square().sum().item<double>() +
                                      (3 * d).square().sum().item<double>());
    const double norm = bridge::training::get_grad_norm_fp32({embedding, own});
    expect(std::abs(norm - expected) <= 1e-6 * expected,
           "grad norm " + std::to_string(norm) + ", expected " + std::to_string(expected));
  }
  std::printf("rank %d: finalize pp 2: embedding grad rel diff %.3g: %s\n", get_rank(), g_max_grad_diff,
              g_failures == 0 ? "ok" : "FAILED");
  destroy_distributed();
  return g_failures == 0 ? 0 : 1;
}

// tp = 2: a weight sharded along dim 0 and a replicated bias; the norm must equal the full tensors' norm.
int run_grad_norm() {
  init_distributed({Backend::kGloo, std::chrono::seconds(60)});
  initialize_model_parallel(2);
  const int tp_rank = get_tensor_model_parallel_rank();
  torch::manual_seed(9);
  const torch::Tensor full_grad = torch::randn({8, 5}) * 3, bias_grad = torch::randn({8});
  torch::Tensor weight = leaf(torch::zeros({4, 5})), bias = leaf(torch::zeros({8}));
  bridge::parallel::tensor_parallel::ParamAttributes sharded;
  sharded.tensor_model_parallel = true;
  sharded.partition_dim = 0;
  bridge::parallel::tensor_parallel::set_param_attributes(weight, sharded);
  weight.mutable_grad() = full_grad.narrow(0, 4 * tp_rank, 4).clone();
  bias.mutable_grad() = bias_grad.clone();

  const double expected = std::sqrt(full_grad.square().sum().item<double>() + bias_grad.square().sum().item<double>());
  const double norm = bridge::training::get_grad_norm_fp32({weight, bias});
  g_max_grad_diff = std::abs(norm - expected) / expected;
  expect(g_max_grad_diff <= 1e-6, "grad norm " + std::to_string(norm) + ", expected " + std::to_string(expected));

  const double total = bridge::training::clip_grad_norm({weight, bias}, 1.0);
  expect(std::abs(total - expected) <= 1e-6 * expected, "clip_grad_norm returned " + std::to_string(total));
  const double coefficient = 1.0 / (expected + 1e-6);
  expect(relative_diff(weight.grad(), full_grad.narrow(0, 4 * tp_rank, 4) * coefficient) <= 1e-6, "clipped shard");
  expect(relative_diff(bias.grad(), bias_grad * coefficient) <= 1e-6, "clipped bias");
  const double after = bridge::training::get_grad_norm_fp32({weight, bias});
  expect(std::abs(after - 1.0) <= 1e-5, "norm after clipping " + std::to_string(after));
  std::printf("rank %d: grad norm tp 2: %.6f vs %.6f, rel diff %.3g: %s\n", get_rank(), norm, expected, g_max_grad_diff,
              g_failures == 0 ? "ok" : "FAILED");
  destroy_distributed();
  return g_failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);
  try {
    const std::string scenario = argc > 1 ? argv[1] : "";
    if (scenario == "ddp" && argc > 4) {
      const torch::Dtype dtype = std::string(argv[2]) == "double" ? torch::kFloat64 : torch::kFloat32;
      const bool reduce_scatter = argc > 5 && std::string(argv[5]) == "reduce_scatter";
      return run_ddp(dtype, std::atoi(argv[3]) != 0, std::atoi(argv[4]) != 0, reduce_scatter);
    }
    if (scenario == "finalize") return run_finalize();
    if (scenario == "grad_norm") return run_grad_norm();
    std::fprintf(
        stderr,
        "usage: data_parallel_worker ddp <float|double> <overlap 0|1> <average 0|1> [reduce_scatter] | finalize | "
        "grad_norm\n");
    return 2;
  } catch (const std::exception& error) {
    std::printf("rank %s: FAILED with exception: %s\n", std::getenv("RANK") ? std::getenv("RANK") : "?", error.what());
    return 1;
  }
}
