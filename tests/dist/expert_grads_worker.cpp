// One rank of expert_grads_dist_test: expert-parallel parameters (ParamAttributes::allreduce false) through
// DistributedDataParallel, the grad norm and clipping, the parameter norm and the distributed optimizer, each checked
// against the same computation done directly on the whole model in every process.
//
// The toy model: a dense layer replicated on every rank, and `kLocalExperts` expert layers per expert-parallel rank
// (global expert e lives on ep rank e / kLocalExperts). As in an MoE layer, an expert on rank s sees the tokens of
// every rank of its expert-parallel group, so its gradient there already sums those ranks' contributions; the loss of
// each rank is a mean over its own tokens. The whole model's objective is the mean of the ranks' losses over the
// data-parallel group, which here (tp 1) is the world. Expert weighting per token is a fixed function of the data.
//
//   expert_grads_worker grads <ep> [cp]   tp 1: grads (with and without overlap, average_in_collective), bucket
//                                         groups, grad norm, clipping, broadcast_params, parameter norm
//   expert_grads_worker distopt <ep> [cp] tp 1: DDP + build_optimizer vs use_distributed_optimizer +
//                                         DistributedOptimizer (AdamW, then SGD), both vs one process's step
//
// With context parallelism (cp, default 1) each rank's tokens are its own as well: the cp ranks of a data-parallel
// replica hold other parts of its sequences. The objective is the same mean over every rank's loss, which the
// gradient reduction over dp x cp (and the experts' over their data-parallel group, folded over cp) must give.
//   expert_grads_worker norm <etp>        world 4, tp 2, ep 2: grad and parameter norms with tensor-parallel shards and
//                                         replicas of dense and expert parameters (duplicates by expert tp rank)
//   expert_grads_worker router <cp>       tp 1: the MoE router's load-balancing (aux, seq, global) and z losses with
//                                         each cp rank routing part of every sequence: their losses and gradients
//                                         add up over tp x cp (tp x dp x cp for the global one) to those of the whole
//                                         sequences, and MoEMetricsTracker reports Megatron's values
//
// Prints "rank R: ... ok" and exits 0, or prints each failure and exits 1.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "bridge/models/gpt_config.h"
#include "bridge/models/moe/moe_logging.h"
#include "bridge/models/moe/moe_utils.h"
#include "bridge/models/moe/router.h"
#include "parallel/distributed.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/distributed/finalize_model_grads.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/param_attributes.h"
#include "training/checkpointing/checkpoint_state.h"
#include "training/optimizer/clip_grads.h"
#include "training/optimizer/distrib_optimizer.h"
#include "training/optimizer/optimizer.h"
#include "training/utils/train_utils.h"

namespace {

using namespace bridge::parallel;
using bridge::parallel::distributed::DistributedDataParallel;
using bridge::parallel::distributed::DistributedDataParallelConfig;
namespace tp = bridge::parallel::tensor_parallel;

int g_failures = 0;
double g_max_diff = 0.0;  // largest relative difference from the direct computation seen

void expect(bool condition, const std::string& what) {
  if (condition) return;
  ++g_failures;
  std::printf("rank %d: FAILED %s\n", get_rank(), what.c_str());
}

double relative_diff(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-30);
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>() / scale;
}

void expect_close(const torch::Tensor& actual, const torch::Tensor& expected, double tolerance,
                  const std::string& what) {
  const double diff = relative_diff(actual, expected);
  g_max_diff = std::max(g_max_diff, diff);
  expect(diff <= tolerance, what + " differs from the direct computation by " + std::to_string(diff));
}

void expect_near(double actual, double expected, double tolerance, const std::string& what) {
  const double diff = std::abs(actual - expected) / std::max(std::abs(expected), 1e-30);
  g_max_diff = std::max(g_max_diff, diff);
  expect(diff <= tolerance, what + " is " + std::to_string(actual) + ", expected " + std::to_string(expected));
}

// A layer of 12 x 16 + 16 = 208 elements: every rank of 4 owns part of a bucket padded to 256 under the distributed
// optimizer (with fewer, a rank holding nothing would have nothing to build an optimizer over).
constexpr int64_t kIn = 12, kOut = 16, kTokens = 4, kLocalExperts = 2;

torch::Tensor leaf(const torch::Tensor& t) { return t.detach().clone().requires_grad_(true); }

// Global expert e's weight and bias, the same in every process whatever the layout.
std::pair<torch::Tensor, torch::Tensor> expert_init(int64_t e, torch::Dtype dtype) {
  torch::manual_seed(100 + e);
  auto options = torch::TensorOptions().dtype(dtype);
  return {torch::randn({kOut, kIn}, options) * 0.5, torch::randn({kOut}, options) * 0.5};
}

// The dense layer and this ep rank's experts; the experts are marked allreduce = false, as MoE layers do under
// expert parallelism. Params in order: dense w, dense b, then each local expert's w, b.
struct ToyMoeImpl : torch::nn::Module {
  ToyMoeImpl(int ep_rank, torch::Dtype dtype) {
    torch::manual_seed(7);
    auto options = torch::TensorOptions().dtype(dtype);
    dense_w = register_parameter("dense_w", torch::randn({kOut, kIn}, options) * 0.5);
    dense_b = register_parameter("dense_b", torch::randn({kOut}, options) * 0.5);
    for (int64_t j = 0; j < kLocalExperts; ++j) {
      auto [w, b] = expert_init(ep_rank * kLocalExperts + j, dtype);
      expert_w.push_back(register_parameter("expert_w" + std::to_string(j), w));
      expert_b.push_back(register_parameter("expert_b" + std::to_string(j), b));
      tp::ParamAttributes expert;
      expert.allreduce = false;
      tp::set_param_attributes(expert_w.back(), expert);
      tp::set_param_attributes(expert_b.back(), expert);
    }
  }
  torch::Tensor dense_w, dense_b;
  std::vector<torch::Tensor> expert_w, expert_b;
};
TORCH_MODULE(ToyMoe);

// Every rank's tokens and targets for a step: [world, tokens, ...], the same in every process.
struct Batch {
  torch::Tensor x, t;
};
Batch make_batch(int world, int step, torch::Dtype dtype) {
  torch::manual_seed(1000 + step);
  auto options = torch::TensorOptions().dtype(dtype);
  return {torch::randn({world, kTokens, kIn}, options), torch::randn({world, kTokens, kOut}, options)};
}

torch::Tensor dense_loss(const torch::Tensor& w, const torch::Tensor& b, const torch::Tensor& x,
                         const torch::Tensor& t) {
  return (torch::tanh(torch::linear(x, w, b)) - t).square().mean();
}

// Expert e's part of the loss of tokens x (a mean over them): each token weighted by a fixed routing weight.
torch::Tensor expert_loss(int64_t e, const torch::Tensor& w, const torch::Tensor& b, const torch::Tensor& x,
                          const torch::Tensor& t) {
  const torch::Tensor routing = torch::sigmoid(x.select(1, e % kIn) + 0.3 * static_cast<double>(e)).unsqueeze(1);
  return (routing * (torch::tanh(torch::linear(x, w, b)) - t).square()).mean();
}

// This rank's forward and backward, in two micro-batches (halves of its tokens, each loss / 2) as a schedule runs
// them: its own tokens through the dense layer, and the tokens of every rank of its expert-parallel group through its
// experts (what the token dispatcher hands them).
void local_backward(ToyMoe& model, DistributedDataParallel& ddp, const Batch& batch) {
  const std::vector<int>& ep_ranks = get_expert_model_parallel_group().global_ranks();
  const int ep_rank = get_expert_model_parallel_rank();
  const int me = get_rank();
  constexpr int kMicroBatches = 2;
  const int64_t half = kTokens / kMicroBatches;
  for (int m = 0; m < kMicroBatches; ++m) {
    ddp.set_grad_sync(m == kMicroBatches - 1);
    const auto part = [&](const torch::Tensor& all, int rank) { return all[rank].narrow(0, m * half, half); };
    torch::Tensor loss = dense_loss(model->dense_w, model->dense_b, part(batch.x, me), part(batch.t, me));
    for (int source : ep_ranks) {
      for (int64_t j = 0; j < kLocalExperts; ++j) {
        loss = loss + expert_loss(ep_rank * kLocalExperts + j, model->expert_w[j], model->expert_b[j],
                                  part(batch.x, source), part(batch.t, source));
      }
    }
    (loss / kMicroBatches).backward();
  }
}

// The whole model in one process: the dense layer and every global expert, as leaves.
struct Reference {
  torch::Tensor dense_w, dense_b;
  std::vector<torch::Tensor> expert_w, expert_b;  // global experts

  Reference(int experts, torch::Dtype dtype) {
    ToyMoe dense(0, dtype);  // the dense init (its experts are ep rank 0's, unused)
    dense_w = leaf(dense->dense_w);
    dense_b = leaf(dense->dense_b);
    for (int64_t e = 0; e < experts; ++e) {
      auto [w, b] = expert_init(e, dtype);
      expert_w.push_back(leaf(w));
      expert_b.push_back(leaf(b));
    }
  }
  std::vector<torch::Tensor> params() const {
    std::vector<torch::Tensor> all = {dense_w, dense_b};
    for (std::size_t e = 0; e < expert_w.size(); ++e) {
      all.push_back(expert_w[e]);
      all.push_back(expert_b[e]);
    }
    return all;
  }
  // The objective: the mean over the data-parallel ranks (the world, tp 1) of each rank's loss, every rank's tokens
  // through the dense layer and every expert.
  void backward(const Batch& batch) {
    for (torch::Tensor& p : expert_w) p.mutable_grad() = torch::Tensor();
    for (torch::Tensor& p : expert_b) p.mutable_grad() = torch::Tensor();
    dense_w.mutable_grad() = torch::Tensor();
    dense_b.mutable_grad() = torch::Tensor();
    const int64_t world = batch.x.size(0);
    torch::Tensor loss = torch::zeros({}, batch.x.options());
    for (int64_t r = 0; r < world; ++r) {
      loss = loss + dense_loss(dense_w, dense_b, batch.x[r], batch.t[r]);
      for (std::size_t e = 0; e < expert_w.size(); ++e) {
        loss = loss + expert_loss(static_cast<int64_t>(e), expert_w[e], expert_b[e], batch.x[r], batch.t[r]);
      }
    }
    (loss / static_cast<double>(world)).backward();
  }
  double grad_norm() const {
    double sum = 0.0;
    for (const torch::Tensor& p : params()) sum += p.grad().to(torch::kFloat64).square().sum().item<double>();
    return std::sqrt(sum);
  }
  double param_norm() const {
    double sum = 0.0;
    for (const torch::Tensor& p : params()) sum += p.detach().to(torch::kFloat64).square().sum().item<double>();
    return std::sqrt(sum);
  }
  // The reference tensor matching each of `model`'s parameters on this ep rank.
  std::vector<torch::Tensor> matching(int ep_rank) const {
    std::vector<torch::Tensor> out = {dense_w, dense_b};
    for (int64_t j = 0; j < kLocalExperts; ++j) {
      out.push_back(expert_w[static_cast<std::size_t>(ep_rank * kLocalExperts + j)]);
      out.push_back(expert_b[static_cast<std::size_t>(ep_rank * kLocalExperts + j)]);
    }
    return out;
  }
};

std::vector<torch::Tensor> model_params(const ToyMoe& model) {
  std::vector<torch::Tensor> out = {model->dense_w, model->dense_b};
  for (int64_t j = 0; j < kLocalExperts; ++j) {
    out.push_back(model->expert_w[static_cast<std::size_t>(j)]);
    out.push_back(model->expert_b[static_cast<std::size_t>(j)]);
  }
  return out;
}

void init_layout(int tensor_parallel, int expert_parallel, int expert_tensor_parallel, int context_parallel = 1) {
  ParallelOptions options;
  options.tensor_model_parallel_size = tensor_parallel;
  options.expert_model_parallel_size = expert_parallel;
  options.expert_tensor_parallel_size = expert_tensor_parallel;
  options.context_parallel_size = context_parallel;
  initialize_model_parallel(options);
}

// The DDP's buckets: dense ones over the data-parallel group, expert ones over the expert data-parallel group.
void expect_bucket_groups(const DistributedDataParallel& ddp, const ToyMoe& model) {
  expect(ddp.expert_data_parallel_group() == &get_expert_data_parallel_group(),
         "the expert data-parallel group is parallel_state's");
  for (const torch::Tensor& param : model_params(model)) {
    const int64_t bucket = ddp.bucket_of(param);
    const bool expert = tp::is_expert_parallel_param(param);
    expect(ddp.is_expert_bucket(bucket) == expert, "bucket " + std::to_string(bucket) + " kind");
    expect(&ddp.bucket_group(bucket) ==
               (expert ? &get_expert_data_parallel_group() : &get_data_parallel_group(/*with_context_parallel=*/true)),
           "bucket " + std::to_string(bucket) + " group");
  }
}

// Checkpoint writers are elected as the reduction runs: one dense writer (data-parallel rank 0 over dp x cp, as the cp
// ranks hold the same weights) and one expert writer per expert-parallel rank, so no two ranks write the same file.
void check_checkpoint_writers() {
  bridge::training::PretrainSetup setup;
  setup.data_parallel_rank = get_data_parallel_rank();
  setup.data_parallel_size = get_data_parallel_world_size();
  const bridge::training::CheckpointWriter writer = bridge::training::checkpoint_writer(setup);
  expect(writer.dense == (get_data_parallel_rank(/*with_context_parallel=*/true) == 0), "the dense writer");
  torch::Tensor writers = torch::tensor({writer.dense ? 1.0 : 0.0, writer.experts ? 1.0 : 0.0}, torch::kFloat64);
  get_world_group().all_reduce(writers);
  expect(writers[0].item<double>() == 1.0,
         "dense checkpoint writers: " + std::to_string(writers[0].item<double>()) + ", expected 1 (tp 1, pp 1)");
  expect(writers[1].item<double>() == static_cast<double>(get_expert_model_parallel_world_size()),
         "expert checkpoint writers: " + std::to_string(writers[1].item<double>()) + ", expected one per ep rank");
}

int run_grads(int expert_parallel, int context_parallel) {
  init_distributed({Backend::kGloo, std::chrono::seconds(60)});
  init_layout(1, expert_parallel, 0, context_parallel);
  check_checkpoint_writers();
  const int world = get_world_group().size();
  const int ep_rank = get_expert_model_parallel_rank();
  constexpr double kTolerance = 1e-12;
  const struct { bool overlap, average; } configs[] = {{true, false}, {false, true}};
  for (const auto& config : configs) {
    const std::string label = std::string(config.overlap ? "overlap" : "no overlap") +
                              (config.average ? ", average_in_collective" : "") + ": ";
    ToyMoe model(ep_rank, torch::kFloat64);
    DistributedDataParallelConfig ddp_config;
    ddp_config.overlap_grad_reduce = config.overlap;
    ddp_config.average_in_collective = config.average;
    ddp_config.bucket_size = 30;  // with overlap: one bucket per weight and bias pair, each kind apart
    DistributedDataParallel ddp(model.ptr(), ddp_config);
    expect_bucket_groups(ddp, model);
    expect(ddp.num_buckets() == (config.overlap ? 1 + kLocalExperts : 2),
           label + "num_buckets " + std::to_string(ddp.num_buckets()));
    Reference reference(expert_parallel * kLocalExperts, torch::kFloat64);
    const std::vector<torch::Tensor> params = model_params(model), expected = reference.matching(ep_rank);
    for (int step = 0; step < 2; ++step) {
      const Batch batch = make_batch(world, step, torch::kFloat64);
      ddp.zero_grad_buffer();
      local_backward(model, ddp, batch);
      ddp.finish_grad_sync();
      if (config.overlap) expect(ddp.buckets_started_in_backward() == ddp.num_buckets(), label + "overlapped");
      reference.backward(batch);
      for (std::size_t i = 0; i < params.size(); ++i) {
        expect_close(params[i].grad(), expected[i].grad(), kTolerance,
                     label + "step " + std::to_string(step) + " grad of param " + std::to_string(i));
      }
    }

    // One global norm: the dense grads counted once over the model-parallel group, every expert once over the expert
    // model-parallel group.
    const double reference_norm = reference.grad_norm();
    expect_near(bridge::training::get_grad_norm_fp32(params), reference_norm, 1e-12, label + "grad norm");
    const double max_norm = 0.5 * reference_norm;
    expect_near(bridge::training::clip_grad_norm(params, max_norm), reference_norm, 1e-12,
                label + "clip_grad_norm's norm");
    const double coefficient = max_norm / (reference_norm + 1e-6);
    for (std::size_t i = 0; i < params.size(); ++i) {
      expect_close(params[i].grad(), expected[i].grad() * coefficient, kTolerance,
                   label + "clipped grad of param " + std::to_string(i));
    }
    expect_near(bridge::training::get_grad_norm_fp32(params), max_norm, 1e-5, label + "norm after clipping");

    // The parameter norm counts each expert once.
    const bridge::training::ModelChunks chunks = {model.ptr()};
    expect_near(bridge::training::utils::calc_params_l2_norm(chunks), reference.param_norm(), 1e-12,
                label + "parameter norm");

    // broadcast_params: dense parameters from data-parallel rank 0, experts from expert data-parallel rank 0.
    {
      torch::NoGradGuard no_grad;
      for (const torch::Tensor& param : params) param.add_(static_cast<double>(get_rank()));
      ddp.broadcast_params();
      const int dense_root = get_data_parallel_group(true).global_ranks().front();
      const int expert_root = get_expert_data_parallel_group().global_ranks().front();
      for (std::size_t i = 0; i < params.size(); ++i) {
        const int root = tp::is_expert_parallel_param(params[i]) ? expert_root : dense_root;
        expect_close(params[i].detach(), expected[i].detach() + static_cast<double>(root), kTolerance,
                     label + "param " + std::to_string(i) + " after broadcast_params");
      }
    }
  }
  std::printf("rank %d: grads world %d cp %d ep %d edp %d: max rel diff %.3g: %s\n", get_rank(), world,
              context_parallel, expert_parallel, get_expert_data_parallel_world_size(), g_max_diff,
              g_failures == 0 ? "ok" : "FAILED");
  destroy_distributed();
  return g_failures == 0 ? 0 : 1;
}

// The reference's clipped step with `optimizer` over its params (AdamW or SGD with weight decay on matrices).
void reference_step(Reference& reference, torch::optim::Optimizer& optimizer, double max_norm) {
  const double norm = reference.grad_norm();
  const double coefficient = max_norm / (norm + 1e-6);
  torch::NoGradGuard no_grad;
  if (coefficient < 1.0) {
    for (const torch::Tensor& p : reference.params()) p.grad().mul_(coefficient);
  }
  optimizer.step();
}

int run_distributed_optimizer(int expert_parallel, int context_parallel) {
  init_distributed({Backend::kGloo, std::chrono::seconds(60)});
  init_layout(1, expert_parallel, 0, context_parallel);
  const int world = get_world_group().size();
  const int ep_rank = get_expert_model_parallel_rank();
  ProcessGroup& dp_group = get_data_parallel_group(true);
  ProcessGroup& edp_group = get_expert_data_parallel_group();
  constexpr double kTolerance = 2e-5;  // fp32, the fused AdamW against the per-piece one
  for (const std::string optimizer_name : {"adam", "sgd"}) {
    bridge::training::OptimizerConfig optimizer_config;
    optimizer_config.optimizer = optimizer_name;
    optimizer_config.lr = 1e-2;
    DistributedDataParallelConfig ddp_config;
    ddp_config.bucket_size = 30;

    ToyMoe plain(ep_rank, torch::kFloat32);
    DistributedDataParallel plain_ddp(plain.ptr(), ddp_config);
    auto plain_optimizer = bridge::training::build_optimizer(optimizer_config, plain->parameters());

    ToyMoe sharded(ep_rank, torch::kFloat32);
    ddp_config.use_distributed_optimizer = true;
    DistributedDataParallel sharded_ddp(sharded.ptr(), ddp_config);
    bridge::training::DistributedOptimizer shards({&sharded_ddp});
    auto sharded_optimizer =
        bridge::training::build_optimizer(optimizer_config, shards.decayed_params(), shards.not_decayed_params());
    expect_bucket_groups(sharded_ddp, sharded);

    // Each parameter's elements are owned once over its group: the data-parallel group for dense ones, the expert
    // data-parallel group for experts (1/edp of an expert bucket per rank).
    for (const torch::Tensor& param : model_params(sharded)) {
      int64_t owned = 0;
      for (const auto& piece : bridge::training::distributed_optimizer_pieces(param)) owned += piece.model_view.numel();
      torch::Tensor total = torch::tensor({owned}, torch::kInt64);
      ProcessGroup& group = tp::is_expert_parallel_param(param) ? edp_group : dp_group;
      group.all_reduce(total);
      expect(total.item<int64_t>() == param.numel(),
             optimizer_name + ": a parameter of " + std::to_string(param.numel()) + " elements has " +
                 std::to_string(total.item<int64_t>()) + " owned over its group");
    }
    for (int64_t b = 0; b < sharded_ddp.num_buckets(); ++b) {
      const int64_t ranks = sharded_ddp.bucket_group(b).size();
      expect(ranks == 1 || sharded_ddp.bucket_numel(b) % std::lcm<int64_t>(ranks, 128) == 0,
             "bucket " + std::to_string(b) + " is not padded to its group's lcm(size, 128)");
    }

    Reference reference(expert_parallel * kLocalExperts, torch::kFloat32);
    auto reference_optimizer = bridge::training::build_optimizer(optimizer_config, reference.params());
    double max_norm = 0.0;
    for (int step = 0; step < 3; ++step) {
      const std::string label = optimizer_name + " step " + std::to_string(step) + ": ";
      const Batch batch = make_batch(world, step, torch::kFloat32);
      reference.backward(batch);
      const double reference_norm = reference.grad_norm();
      if (step == 0) max_norm = 0.6 * reference_norm;  // clipping is active, at least on the first step

      plain_ddp.zero_grad_buffer();
      local_backward(plain, plain_ddp, batch);
      plain_ddp.finish_grad_sync();
      const double plain_norm = bridge::training::clip_grad_norm(model_params(plain), max_norm);
      plain_optimizer->step();

      sharded_ddp.zero_grad_buffer();
      local_backward(sharded, sharded_ddp, batch);
      sharded_ddp.finish_grad_sync();
      expect(!shards.prepare_grads(), label + "no overflow without a scaler");
      // The pieces of every rank: each element of either kind on one rank of the world (as train.cpp calls it).
      const double sharded_norm = bridge::training::clip_grad_norm(shards.main_params(), max_norm, &get_world_group());
      sharded_optimizer->step();
      shards.finish_step();

      reference_step(reference, *reference_optimizer, max_norm);
      expect_near(plain_norm, reference_norm, 1e-5, label + "the grad norm without the distributed optimizer");
      expect_near(sharded_norm, reference_norm, 1e-5, label + "the grad norm with the distributed optimizer");
      const std::vector<torch::Tensor> expected = reference.matching(ep_rank);
      const std::vector<torch::Tensor> plain_params = model_params(plain), sharded_params = model_params(sharded);
      for (std::size_t i = 0; i < expected.size(); ++i) {
        expect_close(plain_params[i].detach(), expected[i].detach(), kTolerance,
                     label + "param " + std::to_string(i) + " after the step");
        expect_close(sharded_params[i].detach(), expected[i].detach(), kTolerance,
                     label + "param " + std::to_string(i) + " after the distributed optimizer's step");
      }
    }
  }
  std::printf("rank %d: distributed optimizer world %d cp %d ep %d edp %d: max rel diff %.3g: %s\n", get_rank(), world,
              context_parallel, expert_parallel, edp_group.size(), g_max_diff, g_failures == 0 ? "ok" : "FAILED");
  destroy_distributed();
  return g_failures == 0 ? 0 : 1;
}

// World 4, tp 2, ep 2, expert tp `etp` (1 or 2): a dense weight sharded over tp and a replicated dense bias; per
// expert, a weight sharded over expert tp (replicated with etp 1) and a replicated bias. Grads and values are set
// directly from full tensors every process makes alike, equal on data-parallel (expert data-parallel) replicas.
int run_norm(int expert_tensor_parallel) {
  init_distributed({Backend::kGloo, std::chrono::seconds(60)});
  init_layout(2, 2, expert_tensor_parallel);
  const int tp_rank = get_tensor_model_parallel_rank();
  const int ep_rank = get_expert_model_parallel_rank();
  const int etp_rank = get_expert_tensor_parallel_rank();
  const int64_t experts = 2;  // one per ep rank
  torch::manual_seed(11);
  const torch::Tensor dense_w = torch::randn({8, 3}), dense_b = torch::randn({8});
  std::vector<torch::Tensor> expert_w, expert_b;
  for (int64_t e = 0; e < experts; ++e) {
    expert_w.push_back(torch::randn({6, 3}) * (e + 2));
    expert_b.push_back(torch::randn({6}));
  }
  double expected_squares = dense_w.square().sum().item<double>() + dense_b.square().sum().item<double>();
  for (int64_t e = 0; e < experts; ++e) {
    expected_squares += expert_w[e].square().sum().item<double>() + expert_b[e].square().sum().item<double>();
  }
  const double expected = std::sqrt(expected_squares);

  auto module = std::make_shared<torch::nn::Module>();
  const int64_t expert_rows = 6 / expert_tensor_parallel;
  torch::Tensor w = module->register_parameter("dense_w", dense_w.narrow(0, 4 * tp_rank, 4).clone());
  torch::Tensor b = module->register_parameter("dense_b", dense_b.clone());
  torch::Tensor ew =
      module->register_parameter("expert_w", expert_w[ep_rank].narrow(0, expert_rows * etp_rank, expert_rows).clone());
  torch::Tensor eb = module->register_parameter("expert_b", expert_b[ep_rank].clone());
  tp::ParamAttributes sharded;
  sharded.tensor_model_parallel = true;
  sharded.partition_dim = 0;
  tp::set_param_attributes(w, sharded);
  tp::ParamAttributes expert;
  expert.allreduce = false;
  tp::set_param_attributes(eb, expert);
  expert.tensor_model_parallel = expert_tensor_parallel > 1;
  expert.partition_dim = expert.tensor_model_parallel ? 0 : -1;
  tp::set_param_attributes(ew, expert);
  expect(tp::param_is_tensor_parallel_duplicate(b) == (tp_rank != 0), "the dense bias is a duplicate off tp rank 0");
  expect(tp::param_is_tensor_parallel_duplicate(eb) == (etp_rank != 0),
         "the expert bias is a duplicate off expert tp rank 0 (and only there)");
  expect(!tp::param_is_tensor_parallel_duplicate(ew), "an expert weight is never a duplicate here");
  const std::vector<torch::Tensor> params = {w, b, ew, eb};
  for (const torch::Tensor& param : params) param.mutable_grad() = param.detach().clone();

  const std::string label = "etp " + std::to_string(expert_tensor_parallel) + ": ";
  expect_near(bridge::training::get_grad_norm_fp32(params), expected, 1e-6, label + "grad norm");
  const bridge::training::ModelChunks chunks = {module};
  expect_near(bridge::training::utils::calc_params_l2_norm(chunks), expected, 1e-6, label + "parameter norm");
  // The per-parameter report's global norm, summed over the world with each replica counted once.
  const auto report = bridge::training::utils::report_l2_norm_grad(chunks);
  expect(report.back().first == "l2_norm/grad/global", "the report ends with the global norm");
  expect_near(bridge::training::utils::to_double(report.back().second), expected, 1e-6, label + "l2_norm/grad/global");

  const double max_norm = 0.25 * expected;
  expect_near(bridge::training::clip_grad_norm(params, max_norm), expected, 1e-6, label + "clip_grad_norm's norm");
  for (const torch::Tensor& param : params) {
    expect_close(param.grad(), param.detach() * (max_norm / (expected + 1e-6)), 1e-6, label + "a clipped grad");
  }
  std::printf("rank %d: norms world 4 tp 2 ep 2 etp %d: max rel diff %.3g: %s\n", get_rank(), expert_tensor_parallel,
              g_max_diff, g_failures == 0 ? "ok" : "FAILED");
  destroy_distributed();
  return g_failures == 0 ? 0 : 1;
}

// The router of one MoE layer on every rank with the same gate; rank (dp d, cp r) routes the r-th of cp contiguous
// parts of replica d's sequences ([s, b, h], b = 2 sequences). Each kind of load-balancing loss is checked against
// Megatron's formula over the whole sequences, for the losses the tracker reports and for the gate's gradient (the
// shares' gradients summed over the group that completes them).
int run_router(int context_parallel) {
  namespace moe = bridge::models::moe;
  using bridge::models::GPTConfig;
  init_distributed({Backend::kGloo, std::chrono::seconds(60)});
  init_layout(1, 1, 0, context_parallel);
  constexpr int64_t kHidden = 8, kExperts = 4, kTopk = 2, kSeq = 8, kBatch = 2;
  constexpr double kAuxCoeff = 1e-2, kZCoeff = 1e-3, kTolerance = 1e-10;
  const int dp = get_data_parallel_world_size(), cp = get_context_parallel_world_size();
  const int dp_rank = get_data_parallel_rank(), cp_rank = get_context_parallel_rank();
  const int64_t local_seq = kSeq / cp;
  torch::manual_seed(5);
  const torch::Tensor hidden = torch::randn({dp, kSeq, kBatch, kHidden}, torch::kFloat64);
  torch::manual_seed(11);
  const torch::Tensor gate = torch::randn({kExperts, kHidden}) * 0.5;
  const torch::Tensor local = hidden[dp_rank].narrow(0, cp_rank * local_seq, local_seq);

  // logsumexp(z)^2 per token of `tokens` ([..., h]) through `w`, and the routing scores for the aux losses.
  const auto logits_of = [](const torch::Tensor& tokens, const torch::Tensor& w) {
    return torch::matmul(tokens.reshape({-1, kHidden}), w.t());
  };
  const auto seq_loss = [&](const torch::Tensor& tokens, const torch::Tensor& w) {  // [S, b, h]: per sequence, / b
    const moe::Routing aux = moe::compute_routing_scores_for_aux_loss(logits_of(tokens, w), kTopk,
                                                                      bridge::models::MoERouterScoreFunction::kSoftmax);
    const int64_t s = tokens.size(0);
    return moe::switch_load_balancing_loss_func(aux.probs.reshape({s, -1}),
                                                aux.routing_map.reshape({s, -1}).sum(0).to(torch::kDouble), s, kTopk,
                                                kExperts, kAuxCoeff) /
           static_cast<double>(tokens.size(1));
  };
  const auto aux_loss = [&](const torch::Tensor& tokens, const torch::Tensor& w) {
    const torch::Tensor logits = logits_of(tokens, w);
    const moe::Routing aux =
        moe::compute_routing_scores_for_aux_loss(logits, kTopk, bridge::models::MoERouterScoreFunction::kSoftmax);
    return moe::switch_load_balancing_loss_func(aux.probs, aux.routing_map.sum(0).to(torch::kDouble), logits.size(0),
                                                kTopk, kExperts, kAuxCoeff);
  };
  const auto z_mean = [&](const torch::Tensor& tokens, const torch::Tensor& w) {
    return moe::z_loss_func(logits_of(tokens, w), 1.0);
  };

  struct Kind {
    bridge::models::MoELoadBalancingType type;
    std::string name;
  };
  for (const Kind& kind : {Kind{bridge::models::MoELoadBalancingType::kAuxLoss, "load_balancing_loss"},
                           Kind{bridge::models::MoELoadBalancingType::kSeqAuxLoss, "seq_load_balancing_loss"},
                           Kind{bridge::models::MoELoadBalancingType::kGlobalAuxLoss, "global_load_balancing_loss"}}) {
    GPTConfig config;
    config.num_layers = 1;
    config.hidden_size = kHidden;
    config.num_attention_heads = 2;
    config.num_moe_experts = kExperts;
    config.moe_router_topk = kTopk;
    config.moe_router_dtype = bridge::models::MoERouterDtype::kFp64;
    config.moe_aux_loss_coeff = kAuxCoeff;
    config.moe_z_loss_coeff = kZCoeff;
    config.moe_router_load_balancing_type = kind.type;
    moe::TopKRouter router(config, /*layer_number=*/0);
    {
      torch::NoGradGuard no_grad;
      router->weight.copy_(gate);
    }
    router->train();
    moe::MoEMetricsTracker::get().clear();
    moe::set_aux_loss_backward_scale(1.0);
    const moe::Routing routing = router->forward(local);
    (routing.probs.sum() * 0.0).backward();  // only the attached losses' gradients reach the gate
    const moe::MoEReport report = moe::MoEMetricsTracker::get().report(config, /*num_microbatches=*/1);

    // The reference: leaves over the whole sequences of this rank's replica (all replicas for the global loss).
    const bool global = kind.type == bridge::models::MoELoadBalancingType::kGlobalAuxLoss;
    const torch::Tensor w = gate.to(torch::kFloat64).detach().requires_grad_(true);
    torch::Tensor expected_loss = torch::zeros({}, torch::kFloat64);  // the reported value, Megatron's
    torch::Tensor objective = torch::zeros({}, torch::kFloat64);      // whose gradient the summed shares give
    torch::Tensor z_all = torch::zeros({}, torch::kFloat64);
    for (int d = 0; d < dp; ++d) {
      z_all = z_all + z_mean(hidden[d], w) / static_cast<double>(dp);
      if (global) continue;
      const torch::Tensor replica =
          kind.type == bridge::models::MoELoadBalancingType::kAuxLoss ? aux_loss(hidden[d], w) : seq_loss(hidden[d], w);
      expected_loss = expected_loss + replica.detach() / kAuxCoeff / static_cast<double>(dp);  // average over dp
      if (d == dp_rank) objective = replica + kZCoeff * z_mean(hidden[d], w);
    }
    if (global) {
      // Counts over every rank and T the job's tokens: the shares of all ranks add up to the loss of all tokens.
      const torch::Tensor all = hidden.transpose(0, 1).reshape({kSeq, dp * kBatch, kHidden});
      const torch::Tensor loss = aux_loss(all, w);
      expected_loss = loss.detach() / kAuxCoeff;
      objective = loss;
      for (int d = 0; d < dp; ++d) objective = objective + kZCoeff * z_mean(hidden[d], w);
    }
    objective.backward();
    torch::Tensor summed = router->weight.grad().to(torch::kFloat64).clone();
    (global ? get_tensor_and_data_parallel_group(/*with_context_parallel=*/true)
            : get_tensor_and_context_parallel_group())
        .all_reduce(summed);
    const std::string label = kind.name + " (cp " + std::to_string(cp) + "): ";
    expect_near(report.losses.at(kind.name), expected_loss.item<double>(), kTolerance, label + "reported");
    expect_near(report.losses.at("z_loss"), z_all.item<double>(), kTolerance, label + "z_loss reported");
    // The gate is an fp32 parameter (the logits fp64): its gradient lands in fp32.
    expect_close(summed, w.grad(), 1e-6, label + "the gate's gradient summed over the shares");
  }
  std::printf("rank %d: router world %d cp %d dp %d: max rel diff %.3g: %s\n", get_rank(), get_world_size(), cp, dp,
              g_max_diff, g_failures == 0 ? "ok" : "FAILED");
  destroy_distributed();
  return g_failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);
  try {
    const std::string scenario = argc > 2 ? argv[1] : "";
    const int size = argc > 2 ? std::atoi(argv[2]) : 0;
    const int context_parallel = argc > 3 ? std::atoi(argv[3]) : 1;
    if (scenario == "grads") return run_grads(size, context_parallel);
    if (scenario == "distopt") return run_distributed_optimizer(size, context_parallel);
    if (scenario == "norm") return run_norm(size);
    if (scenario == "router") return run_router(size);
    std::fprintf(stderr,
                 "usage: expert_grads_worker grads <ep> [cp] | distopt <ep> [cp] | norm <expert tp> | router <cp>\n");
    return 2;
  } catch (const std::exception& error) {
    std::printf("rank %s: FAILED with exception: %s\n", std::getenv("RANK") ? std::getenv("RANK") : "?", error.what());
    return 1;
  }
}
