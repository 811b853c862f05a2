// One rank of the tensor-parallel tests: every rank of the job is one tensor-parallel rank (tp = world size), and
// each scenario compares the parallel computation with the same computation done in full on this rank.
//
//   tensor_parallel_worker <scenario>...   mappings | mlp_fp32 | mlp_fp64 | stride | embedding | cross_entropy |
//                                           errors | sequence_parallel | uneven | cp_attention | all
//
// cp_attention (context_parallel_attention_scenario.cpp) takes the world as the context-parallel group instead.
//
// Prints "<scenario>: ok (...)" per scenario; failures print what differed and exit 1.
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/cross_entropy.h"
#include "parallel/tensor_parallel/layers.h"
#include "parallel/tensor_parallel/mappings.h"
#include "parallel/tensor_parallel/param_attributes.h"
#include "tests/dist/context_parallel_attention_scenario.h"

namespace {

using namespace bridge::parallel;
using namespace bridge::parallel::tensor_parallel;
namespace F = torch::nn::functional;

int g_failures = 0;
double g_max_relative = 0.0;  // the worst relative difference seen in the current scenario

void expect(bool condition, const std::string& what) {
  if (condition) return;
  ++g_failures;
  std::printf("rank %d: FAILED %s\n", get_rank(), what.c_str());
}

// |actual - expected| <= relative * max|expected|, elementwise max.
void expect_close(const std::string& what, const torch::Tensor& actual, const torch::Tensor& expected,
                  double relative) {
  if (!actual.defined() || actual.sizes() != expected.sizes()) {
    expect(false, what + ": shape differs");
    return;
  }
  if (expected.numel() == 0) return;  // a rank with no rows of an uneven split
  const double diff = (actual.to(torch::kFloat64) - expected.to(torch::kFloat64)).abs().max().item<double>();
  const double scale = std::max(expected.to(torch::kFloat64).abs().max().item<double>(), 1e-30);
  g_max_relative = std::max(g_max_relative, diff / scale);
  expect(diff <= relative * scale, what + ": max |diff| " + std::to_string(diff) + " (relative " +
                                       std::to_string(diff / scale) + ") > " + std::to_string(relative));
}

torch::Tensor random(at::IntArrayRef sizes, uint64_t seed, torch::Dtype dtype = torch::kFloat32) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randn(sizes, generator, torch::TensorOptions().dtype(dtype));
}

int tp() { return get_tensor_model_parallel_world_size(); }
int tp_rank() { return get_tensor_model_parallel_rank(); }
torch::Tensor mine(const torch::Tensor& full, int64_t dim) {
  return full.chunk(tp(), dim)[static_cast<std::size_t>(tp_rank())];
}

void scenario_mappings() {
  const torch::Tensor full = random({4, 3, 8}, 1);
  const torch::Tensor upstream = random({4, 3, 8}, 2);  // the gradient arriving from above, the same on all ranks
  auto rank_weight = [](int rank) { return random({4, 3, 8}, 100 + static_cast<uint64_t>(rank)); };

  {  // copy_to: identity forward; backward sums the ranks' gradients
    torch::Tensor x = full.clone().requires_grad_();
    torch::Tensor y = copy_to_tensor_model_parallel_region(x);
    expect(y.equal(full), "copy_to forward");
    (y * rank_weight(tp_rank())).sum().backward();
    torch::Tensor sum = torch::zeros_like(full);
    for (int r = 0; r < tp(); ++r) sum += rank_weight(r);
    expect_close("copy_to backward", x.grad(), sum, 1e-6);
  }
  {  // reduce_from: forward sums the ranks' inputs, leaving them intact; identity backward
    torch::Tensor x = rank_weight(tp_rank()).requires_grad_();
    const torch::Tensor before = x.detach().clone();
    torch::Tensor y = reduce_from_tensor_model_parallel_region(x);
    torch::Tensor sum = torch::zeros_like(full);
    for (int r = 0; r < tp(); ++r) sum += rank_weight(r);
    expect_close("reduce_from forward", y, sum, 1e-6);
    expect(x.detach().equal(before), "reduce_from modified its input");
    (y * upstream).sum().backward();
    expect(x.grad().equal(upstream), "reduce_from backward");
  }
  {  // scatter_to: keep this rank's last-dim chunk; backward gathers the chunks' gradients
    torch::Tensor x = full.clone().requires_grad_();
    torch::Tensor y = scatter_to_tensor_model_parallel_region(x);
    expect(y.equal(mine(full, -1)), "scatter_to forward");
    (y * mine(upstream, -1)).sum().backward();
    expect(x.grad().equal(upstream), "scatter_to backward");
  }
  {  // gather_from: all-gather the chunks; backward keeps this rank's chunk
    torch::Tensor x = mine(full, -1).clone().requires_grad_();
    torch::Tensor y = gather_from_tensor_model_parallel_region(x);
    expect(y.equal(full), "gather_from forward");
    (y * upstream).sum().backward();
    expect(x.grad().equal(mine(upstream, -1)), "gather_from backward");
  }
}

// ColumnParallelLinear -> GeLU -> RowParallelLinear against the same MLP computed in full from the master weights.
void scenario_mlp(torch::Dtype dtype, double relative) {
  const int64_t hidden = 16, ffn = 64;
  const auto init1 = init_method_normal(0.02, 11), init2 = init_method_normal(0.02, 12);
  auto master = [&](const InitMethod& init, int64_t rows, int64_t columns) {
    torch::Tensor weight = torch::empty({rows, columns});
    init(weight);
    return weight.to(dtype);
  };
  const torch::Tensor w1 = master(init1, ffn, hidden).requires_grad_(),
                      w2 = master(init2, hidden, ffn).requires_grad_();
  const torch::Tensor b1 = random({ffn}, 13, dtype).requires_grad_(), b2 = random({hidden}, 14, dtype).requires_grad_();
  const torch::Tensor input = random({4, 3, hidden}, 15, dtype);
  const torch::Tensor upstream = random({4, 3, hidden}, 16, dtype);

  torch::Tensor x_ref = input.clone().requires_grad_();
  const torch::Tensor ref = F::linear(torch::gelu(F::linear(x_ref, w1, b1)), w2, b2);
  (ref * upstream).sum().backward();

  ColumnParallelLinearOptions fc1(hidden, ffn);
  fc1.init_method = init1;
  fc1.params_dtype = dtype;
  RowParallelLinearOptions fc2(ffn, hidden);
  fc2.init_method = init2;
  fc2.params_dtype = dtype;
  ColumnParallelLinear column(fc1);
  RowParallelLinear row(fc2);
  expect(column->weight.equal(mine(w1.detach(), 0)), "column weight is this rank's slice of the master");
  expect(row->weight.equal(mine(w2.detach(), 1)), "row weight is this rank's slice of the master");
  {
    torch::NoGradGuard no_grad;
    column->bias.copy_(mine(b1.detach(), 0));
    row->bias.copy_(b2.detach());
  }
  torch::Tensor x = input.clone().requires_grad_();
  const torch::Tensor out = row(torch::gelu(column(x)));
  (out * upstream).sum().backward();

  expect_close("mlp output", out, ref, relative);
  expect_close("mlp input grad", x.grad(), x_ref.grad(), relative);
  expect_close("column weight grad", column->weight.grad(), mine(w1.grad(), 0), relative);
  expect_close("column bias grad", column->bias.grad(), mine(b1.grad(), 0), relative);
  expect_close("row weight grad", row->weight.grad(), mine(w2.grad(), 1), relative);
  expect_close("row bias grad", row->bias.grad(), b2.grad(), relative);
  for (const torch::Tensor& replica : get_tensor_model_parallel_group().all_gather(row->bias.grad())) {
    expect(replica.equal(row->bias.grad()), "row bias grad differs across tensor-parallel ranks");
  }
}

// Sequence parallelism: the three dim-0 operators, and ColumnParallelLinear -> GeLU -> RowParallelLinear on this
// rank's part of the sequence against the MLP computed in full (fp64): each rank gets its rows of the output and of
// the input's gradient, the weights their slices' full gradients, and the row bias a partial gradient that sums over
// the group to the full one.
void scenario_sequence_parallel() {
  const torch::Tensor full = random({4, 3, 8}, 1);
  const torch::Tensor upstream = random({4, 3, 8}, 2);
  auto rank_input = [](int rank) { return random({4, 3, 8}, 100 + static_cast<uint64_t>(rank)); };
  torch::Tensor sum = torch::zeros_like(full);
  for (int r = 0; r < tp(); ++r) sum += rank_input(r);
  {  // scatter: keep this rank's rows; backward gathers the rows' gradients
    torch::Tensor x = full.clone().requires_grad_();
    torch::Tensor y = scatter_to_sequence_parallel_region(x);
    expect(y.equal(mine(full, 0)), "scatter_to_sequence forward");
    (y * mine(upstream, 0)).sum().backward();
    expect(x.grad().equal(upstream), "scatter_to_sequence backward");
  }
  {  // gather: all rows; backward reduce-scatters the ranks' partial gradients (or, given full ones, splits them)
    torch::Tensor x = mine(full, 0).clone().requires_grad_();
    torch::Tensor y = gather_from_sequence_parallel_region(x);
    expect(y.equal(full), "gather_from_sequence forward");
    (y * rank_input(tp_rank())).sum().backward();
    expect_close("gather_from_sequence backward", x.grad(), mine(sum, 0), 1e-6);
    torch::Tensor z = mine(full, 0).clone().requires_grad_();
    (gather_from_sequence_parallel_region(z, /*tensor_parallel_output_grad=*/false) * upstream).sum().backward();
    expect(z.grad().equal(mine(upstream, 0)), "gather_from_sequence backward without reduction");
  }
  {  // reduce-scatter: this rank's rows of the sum, inputs intact; backward gathers
    torch::Tensor x = rank_input(tp_rank()).requires_grad_();
    const torch::Tensor before = x.detach().clone();
    torch::Tensor y = reduce_scatter_to_sequence_parallel_region(x);
    expect_close("reduce_scatter_to_sequence forward", y, mine(sum, 0), 1e-6);
    expect(x.detach().equal(before), "reduce_scatter_to_sequence modified its input");
    (y * mine(upstream, 0)).sum().backward();
    expect(x.grad().equal(upstream), "reduce_scatter_to_sequence backward");
  }

  const int64_t hidden = 16, ffn = 64;
  const auto init1 = init_method_normal(0.02, 11), init2 = init_method_normal(0.02, 12);
  auto master = [](const InitMethod& init, int64_t rows, int64_t columns) {
    torch::Tensor weight = torch::empty({rows, columns});
    init(weight);
    return weight.to(torch::kFloat64);
  };
  const torch::Tensor w1 = master(init1, ffn, hidden).requires_grad_(),
                      w2 = master(init2, hidden, ffn).requires_grad_();
  const torch::Tensor b2 = random({hidden}, 14, torch::kFloat64).requires_grad_();
  const torch::Tensor input = random({8, 3, hidden}, 15, torch::kFloat64);
  const torch::Tensor grad = random({8, 3, hidden}, 16, torch::kFloat64);
  torch::Tensor x_ref = input.clone().requires_grad_();
  const torch::Tensor ref = F::linear(torch::gelu(F::linear(x_ref, w1)), w2, b2);
  (ref * grad).sum().backward();
  for (const bool fusion : {false, true}) {  // fusion off: the weights' gradients through autograd
    ColumnParallelLinearOptions fc1(hidden, ffn);
    fc1.init_method = init1;
    fc1.params_dtype = torch::kFloat64;
    fc1.bias = false;
    fc1.sequence_parallel = true;
    fc1.gradient_accumulation_fusion = fusion;
    RowParallelLinearOptions fc2(ffn, hidden);
    fc2.init_method = init2;
    fc2.params_dtype = torch::kFloat64;
    fc2.sequence_parallel = true;
    fc2.gradient_accumulation_fusion = fusion;
    ColumnParallelLinear column(fc1);
    RowParallelLinear row(fc2);
    {
      torch::NoGradGuard no_grad;
      row->bias.copy_(b2.detach());
    }
    expect(get_param_attributes(row->bias).sequence_parallel, "the row bias is marked sequence_parallel");
    torch::Tensor x = mine(input, 0).clone().requires_grad_();
    const torch::Tensor out = row(torch::gelu(column(x)));
    (out * mine(grad, 0)).sum().backward();
    const std::string tag = fusion ? " (fusion on)" : " (fusion off)";
    expect_close("sequence-parallel mlp output" + tag, out, mine(ref, 0), 1e-12);
    expect_close("sequence-parallel mlp input grad" + tag, x.grad(), mine(x_ref.grad(), 0), 1e-12);
    expect_close("column weight grad" + tag, column->weight.grad(), mine(w1.grad(), 0), 1e-12);
    expect_close("row weight grad" + tag, row->weight.grad(), mine(w2.grad(), 1), 1e-12);
    torch::Tensor bias_grad = row->bias.grad().clone();
    get_tensor_model_parallel_group().all_reduce(bias_grad);
    expect_close("row bias grad summed over the group" + tag, bias_grad, b2.grad(), 1e-12);
  }
}

template <class Fn>
void expect_invalid_argument(const std::string& what, Fn&& fn, const std::vector<std::string>& words) {
  try {
    fn();
    expect(false, what + ": no exception");
  } catch (const std::invalid_argument& error) {
    for (const std::string& word : words) {
      expect(std::string(error.what()).find(word) != std::string::npos,
             what + ": '" + error.what() + "' does not name " + word);
    }
  }
}

// The operators over an explicit group with uneven split sizes (MoE token dispatch), forward and backward, against
// the same rows computed directly on this rank from every rank's seeded inputs and weights.
void scenario_uneven() {
  ProcessGroup& group = get_tensor_model_parallel_group();
  const int me = group.rank(), n = group.size();
  auto seeded = [](int64_t rows, uint64_t seed) { return random({rows, 3}, seed, torch::kFloat64); };
  // rows(v, begin, count): rows [begin, begin + count) of v.
  auto rows = [](const torch::Tensor& v, int64_t begin, int64_t count) { return v.narrow(0, begin, count); };

  {  // all_to_all: rank `from` sends count(from, to) rows (some none) of its input to rank `to`
    auto count = [](int from, int to) -> int64_t { return (2 * from + to) % 3; };
    auto total_sent = [&](int from) {
      int64_t sum = 0;
      for (int to = 0; to < n; ++to) sum += count(from, to);
      return sum;
    };
    auto total_received = [&](int to) {
      int64_t sum = 0;
      for (int from = 0; from < n; ++from) sum += count(from, to);
      return sum;
    };
    auto input_of = [&](int rank) { return seeded(total_sent(rank), 200 + static_cast<uint64_t>(rank)); };
    auto weight_of = [&](int rank) { return seeded(total_received(rank), 300 + static_cast<uint64_t>(rank)); };
    // offset(from, to): where rank `from`'s rows for `to` start in its input; arrived(from, to): in `to`'s output.
    auto offset = [&](int from, int to) {
      int64_t sum = 0;
      for (int j = 0; j < to; ++j) sum += count(from, j);
      return sum;
    };
    auto arrived = [&](int from, int to) {
      int64_t sum = 0;
      for (int i = 0; i < from; ++i) sum += count(i, to);
      return sum;
    };
    std::vector<int64_t> input_splits, output_splits;
    std::vector<torch::Tensor> expected, expected_grad;
    for (int peer = 0; peer < n; ++peer) {
      input_splits.push_back(count(me, peer));
      output_splits.push_back(count(peer, me));
      expected.push_back(rows(input_of(peer), offset(peer, me), count(peer, me)));
      // d sum(output_peer * weight_peer) / d input_me: the weights at the rows peer received from this rank.
      expected_grad.push_back(rows(weight_of(peer), arrived(me, peer), count(me, peer)));
    }
    torch::Tensor x = input_of(me).requires_grad_();
    const std::uint64_t before = group.operation_count();
    const torch::Tensor y = all_to_all(group, x, output_splits, input_splits);
    expect(group.operation_count() == before + 1, "all_to_all: one operation forward");
    expect(y.equal(torch::cat(expected)), "all_to_all forward: the rows each rank sent this one");
    (y * weight_of(me)).sum().backward();
    expect(group.operation_count() == before + 2, "all_to_all: one operation backward");
    expect(x.grad().equal(torch::cat(expected_grad)), "all_to_all backward: the weights that came back");
  }

  {  // gather: rank r contributes g(r) rows (rank 1 none); the same splits on every rank
    auto g = [](int rank) -> int64_t { return std::vector<int64_t>{2, 0, 3, 1}[static_cast<std::size_t>(rank % 4)]; };
    std::vector<int64_t> splits;
    std::vector<torch::Tensor> parts, weights;
    for (int r = 0; r < n; ++r) {
      splits.push_back(g(r));
      parts.push_back(seeded(g(r), 400 + static_cast<uint64_t>(r)));
    }
    const torch::Tensor full = torch::cat(parts);
    int64_t mine_at = 0;
    for (int r = 0; r < me; ++r) mine_at += g(r);
    torch::Tensor sum = torch::zeros_like(full);
    for (int r = 0; r < n; ++r) {
      weights.push_back(seeded(full.size(0), 500 + static_cast<uint64_t>(r)));
      sum += weights.back();
    }
    torch::Tensor x = parts[static_cast<std::size_t>(me)].clone().requires_grad_();
    const std::uint64_t before = group.operation_count();
    const torch::Tensor y =
        gather_from_sequence_parallel_region(group, x, /*tensor_parallel_output_grad=*/true, splits);
    expect(group.operation_count() == before + 1, "uneven gather: one all-to-all");
    expect(y.equal(full), "uneven gather forward");
    (y * weights[static_cast<std::size_t>(me)]).sum().backward();
    expect_close("uneven gather backward (reduce-scatter)", x.grad(), rows(sum, mine_at, g(me)), 1e-12);
    torch::Tensor z = parts[static_cast<std::size_t>(me)].clone().requires_grad_();
    (gather_from_sequence_parallel_region(group, z, false, splits) * weights[static_cast<std::size_t>(me)])
        .sum()
        .backward();
    expect(z.grad().equal(rows(weights[static_cast<std::size_t>(me)], mine_at, g(me))),
           "uneven gather backward without reduction: own rows");
  }

  {  // reduce-scatter: rank i keeps s(i) rows (rank 1 none) of the sum of every rank's input
    auto s = [](int rank) -> int64_t { return std::vector<int64_t>{3, 0, 1, 2}[static_cast<std::size_t>(rank % 4)]; };
    std::vector<int64_t> splits;
    int64_t total = 0, mine_at = 0;
    for (int r = 0; r < n; ++r) {
      splits.push_back(s(r));
      if (r < me) mine_at += s(r);
      total += s(r);
    }
    torch::Tensor sum = torch::zeros({total, 3}, torch::kFloat64);
    for (int r = 0; r < n; ++r) sum += seeded(total, 600 + static_cast<uint64_t>(r));
    std::vector<torch::Tensor> weights;
    for (int r = 0; r < n; ++r) weights.push_back(seeded(s(r), 700 + static_cast<uint64_t>(r)));
    torch::Tensor x = seeded(total, 600 + static_cast<uint64_t>(me)).requires_grad_();
    const torch::Tensor before = x.detach().clone();
    const torch::Tensor y = reduce_scatter_to_sequence_parallel_region(group, x, splits);
    expect_close("uneven reduce-scatter forward", y, rows(sum, mine_at, s(me)), 1e-12);
    expect(x.detach().equal(before), "uneven reduce-scatter modified its input");
    (y * weights[static_cast<std::size_t>(me)]).sum().backward();
    expect(x.grad().equal(torch::cat(weights)), "uneven reduce-scatter backward (all-gather)");
  }

  {  // no splits over an explicit group: the equal operators, as over the tensor-parallel group
    const torch::Tensor full = random({2 * n, 3}, 800, torch::kFloat64);
    torch::Tensor x = mine(full, 0).clone().requires_grad_();
    expect(gather_from_sequence_parallel_region(group, x, true).equal(full), "equal gather over a group");
    expect(reduce_scatter_to_sequence_parallel_region(group, full).equal(mine(full, 0) * n),
           "equal reduce-scatter over a group");
  }

  {  // a group of one (dp here): identity, no autograd node, splits still checked
    ProcessGroup& one = get_data_parallel_group();
    expect(one.size() == 1, "dp is a group of one");
    const torch::Tensor x = random({3, 2}, 900).requires_grad_();
    expect(all_to_all(one, x, {3}, {3}).is_same(x), "all_to_all over a group of one is the identity");
    expect(gather_from_sequence_parallel_region(one, x, true, {3}).is_same(x), "gather over a group of one");
    expect(reduce_scatter_to_sequence_parallel_region(one, x, {3}).is_same(x), "reduce-scatter over a group of one");
    expect_invalid_argument("all_to_all over a group of one", [&] { all_to_all(one, x, {2}, {3}); },
                            {"output_split_sizes", "group of one"});
  }

  // Bad splits throw on every rank alike, before any communication, naming the group and the vector.
  const torch::Tensor x = torch::zeros({4, 3});
  std::vector<int64_t> wrong_count(static_cast<std::size_t>(n + 1), 0);
  expect_invalid_argument("all_to_all with a split per rank too many", [&] { all_to_all(group, x, {}, wrong_count); },
                          {"group 'tp'", "input_split_sizes", "one per member"});
  std::vector<int64_t> not_mine(static_cast<std::size_t>(n), 4);
  not_mine[static_cast<std::size_t>(me)] = 3;
  expect_invalid_argument("gather whose split is not this rank's rows",
                          [&] { gather_from_sequence_parallel_region(group, x, true, not_mine); },
                          {"group 'tp'", "output_split_sizes[" + std::to_string(me) + "] (3)", "input rows"});
  std::vector<int64_t> short_sum(static_cast<std::size_t>(n), 0);
  short_sum[0] = 3;
  expect_invalid_argument("reduce-scatter splits short of the rows",
                          [&] { reduce_scatter_to_sequence_parallel_region(group, x, short_sum); },
                          {"group 'tp'", "input_split_sizes", "sum to 3", "dim 0 has 4"});
  std::vector<int64_t> negative(static_cast<std::size_t>(n), 0);
  negative[0] = 5;
  negative[static_cast<std::size_t>(n - 1)] = -1;
  expect_invalid_argument("a negative split", [&] { reduce_scatter_to_sequence_parallel_region(group, x, negative); },
                          {"input_split_sizes[" + std::to_string(n - 1) + "] is -1", "negative"});
}

// A fused [Q; K; V] weight with stride 3: each rank gets the q, k and v rows of its own heads.
void scenario_stride() {
  const int64_t heads = 4, head_dim = 2, hidden = heads * head_dim;
  ColumnParallelLinearOptions options(hidden, 3 * hidden);
  options.init_method = init_method_normal(1.0, 21);
  options.stride = 3;
  ColumnParallelLinear qkv(options);
  torch::Tensor master = torch::empty({3 * hidden, hidden});
  options.init_method(master);
  const std::vector<torch::Tensor> q_k_v = master.chunk(3, 0);
  const torch::Tensor expected = torch::cat({mine(q_k_v[0], 0), mine(q_k_v[1], 0), mine(q_k_v[2], 0)}, 0);
  expect(qkv->weight.equal(expected), "stride 3: weight rows are not this rank's heads' q, k and v");
  const ParamAttributes attributes = get_param_attributes(qkv->weight);
  expect(attributes.tensor_model_parallel && attributes.partition_dim == 0 && attributes.partition_stride == 3,
         "stride 3: weight attributes");
}

void scenario_embedding() {
  const int64_t vocab = 16, dim = 6;
  VocabParallelEmbeddingOptions options(vocab, dim);
  options.init_method = init_method_normal(1.0, 31);
  VocabParallelEmbedding embedding(options);
  torch::Tensor master = torch::empty({vocab, dim});
  options.init_method(master);
  master.requires_grad_();
  expect(embedding->vocab_start_index == tp_rank() * vocab / tp() &&
             embedding->vocab_end_index == (tp_rank() + 1) * vocab / tp(),
         "embedding vocab range");
  // Every id, on both sides of every split, some twice (their gradients accumulate).
  const torch::Tensor ids = torch::cat({torch::arange(vocab), torch::tensor({0, 15, 7, 8, 8, 3, 12, 4})}).view({3, 8});
  const torch::Tensor upstream = random({3, 8, dim}, 32);
  const torch::Tensor ref = torch::embedding(master, ids);
  (ref * upstream).sum().backward();
  const torch::Tensor out = embedding(ids);
  (out * upstream).sum().backward();
  expect_close("embedding output", out, ref, 1e-7);
  expect_close("embedding weight grad", embedding->weight.grad(), mine(master.grad(), 0), 1e-6);
}

void scenario_cross_entropy(double label_smoothing) {
  const int64_t vocab = 20;
  const torch::Tensor full = random({4, 3, vocab}, 41) * 3.0;
  torch::Tensor target = torch::tensor({0, 19, 4, 5, 10, 9, 14, 15, 1, 18, 11, 7}).view({4, 3});
  const torch::Tensor weights = random({4, 3}, 42);  // d total / d loss per token

  torch::Tensor full_ref = full.clone().requires_grad_();
  // Megatron's smoothing spreads over the V - 1 other classes; torch's over all V.
  const torch::Tensor ref =
      F::cross_entropy(
          full_ref.view({-1, vocab}), target.view({-1}),
          F::CrossEntropyFuncOptions().reduction(torch::kNone).label_smoothing(label_smoothing * vocab / (vocab - 1)))
          .view({4, 3});
  (ref * weights).sum().backward();

  ProcessGroup& group = get_tensor_model_parallel_group();
  torch::Tensor local = mine(full, -1).clone().requires_grad_();
  const torch::Tensor before = local.detach().clone();
  const std::uint64_t start = group.operation_count();
  const torch::Tensor loss = vocab_parallel_cross_entropy(local, target, label_smoothing);
  const std::uint64_t after_forward = group.operation_count();
  (loss * weights).sum().backward();
  const std::uint64_t after_backward = group.operation_count();

  const std::string name = "cross entropy (smoothing " + std::to_string(label_smoothing) + ")";
  expect(after_forward - start == 3,
         name + ": " + std::to_string(after_forward - start) + " forward operations, not 3");
  expect(after_backward == after_forward, name + ": backward communicated");
  expect(loss.scalar_type() == torch::kFloat32, name + ": loss is not fp32");
  expect(local.detach().equal(before), name + ": the logits were modified");
  expect_close(name + " loss", loss, ref, 1e-6);
  expect_close(name + " grad", local.grad(), mine(full_ref.grad(), -1), 1e-6);
}

void scenario_errors() {
  const int64_t odd = 4 * tp() + 1;
  expect_invalid_argument("column output_size",
                          [&] {
                            ColumnParallelLinearOptions options(8, odd);
                            options.init_method = init_method_zeros();
                            ColumnParallelLinear layer(options);
                          },
                          {"output_size", "tp"});
  expect_invalid_argument("row input_size",
                          [&] {
                            RowParallelLinearOptions options(odd, 8);
                            options.init_method = init_method_zeros();
                            RowParallelLinear layer(options);
                          },
                          {"input_size", "tp"});
  expect_invalid_argument("embedding num_embeddings",
                          [&] {
                            VocabParallelEmbeddingOptions options(odd, 8);
                            options.init_method = init_method_zeros();
                            VocabParallelEmbedding layer(options);
                          },
                          {"num_embeddings", "vocab_size_with_padding"});
  expect_invalid_argument("scatter of an indivisible last dim",
                          [&] {
                            scatter_to_tensor_model_parallel_region(torch::zeros({2, odd}));
                          },
                          {"divisible"});
  // Replicated parameters are duplicates on every rank but 0; sharded ones never are.
  ColumnParallelLinearOptions options(8, 8 * tp());
  options.init_method = init_method_zeros();
  RowParallelLinearOptions row_options(8 * tp(), 8);
  row_options.init_method = init_method_zeros();
  ColumnParallelLinear column(options);
  RowParallelLinear row(row_options);
  expect(!param_is_tensor_parallel_duplicate(column->weight), "column weight counted as a duplicate");
  expect(param_is_tensor_parallel_duplicate(row->bias) == (tp_rank() != 0), "row bias duplicate flag");
}

bool run(const std::string& scenario) {
  const int failures_before = g_failures;
  g_max_relative = 0.0;
  if (scenario == "mappings") {
    scenario_mappings();
  } else if (scenario == "mlp_fp32") {
    scenario_mlp(torch::kFloat32, 2e-6);
  } else if (scenario == "mlp_fp64") {
    scenario_mlp(torch::kFloat64, 1e-12);
  } else if (scenario == "stride") {
    scenario_stride();
  } else if (scenario == "embedding") {
    scenario_embedding();
  } else if (scenario == "cross_entropy") {
    scenario_cross_entropy(0.0);
    scenario_cross_entropy(0.1);
  } else if (scenario == "errors") {
    scenario_errors();
  } else if (scenario == "sequence_parallel") {
    scenario_sequence_parallel();
  } else if (scenario == "uneven") {
    scenario_uneven();
  } else if (scenario == "cp_attention") {
    g_failures += bridge::testing::run_context_parallel_attention_scenario(g_max_relative);
  } else {
    std::printf("unknown scenario '%s'\n", scenario.c_str());
    return false;
  }
  std::printf("rank %d tp %d: %s: %s (max relative |diff| %.3g)\n", get_rank(), tp(), scenario.c_str(),
              g_failures == failures_before ? "ok" : "FAILED", g_max_relative);
  return g_failures == failures_before;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    torch::set_num_threads(1);
    std::vector<std::string> scenarios(argv + 1, argv + argc);
    if (scenarios.empty()) {
      std::fprintf(stderr, "usage: tensor_parallel_worker <scenario>... (see the file's header)\n");
      return 2;
    }
    if (scenarios == std::vector<std::string>{"all"}) {
      scenarios = {"mappings",      "mlp_fp32", "mlp_fp64",          "stride", "embedding",
                   "cross_entropy", "errors",   "sequence_parallel", "uneven", "cp_attention"};
    }
    init_distributed({Backend::kGloo, std::chrono::seconds(60)});
    initialize_model_parallel(get_world_size());
    bool ok = true;
    for (const std::string& scenario : scenarios) ok = run(scenario) && ok;
    std::fflush(stdout);
    destroy_distributed();
    return ok ? 0 : 1;
  } catch (const std::exception& error) {
    std::printf("error: %s\n", error.what());
    return 1;
  }
}
