// Tensor parallelism in one process (tp = 1): vocabulary padding, the layers and the vocab-parallel cross entropy
// against plain torch, the parameter-attribute registry and the RNG tracker. tests/dist covers tp = 2 and 4.
#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <unordered_set>
#include <vector>

#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/cross_entropy.h"
#include "parallel/tensor_parallel/layers.h"
#include "parallel/tensor_parallel/mappings.h"
#include "parallel/tensor_parallel/param_attributes.h"
#include "parallel/tensor_parallel/random.h"
#include "parallel/tensor_parallel/vocab_utils.h"
#include "tests/sanitizers.h"

namespace bridge::parallel::tensor_parallel {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
namespace F = torch::nn::functional;

class TensorParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    init_distributed(LaunchEnv{}, {});
    initialize_model_parallel(1);
  }
  void TearDown() override { destroy_distributed(); }
};

torch::Tensor random(at::IntArrayRef sizes, uint64_t seed, torch::Dtype dtype = torch::kFloat32) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randn(sizes, generator, torch::TensorOptions().dtype(dtype));
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

TEST(TensorParallelVocab, PaddingFigures) {
  EXPECT_EQ(vocab_size_with_padding(50257, 128, 1), 50304);
  EXPECT_EQ(vocab_size_with_padding(50257, 128, 2), 50432);
  EXPECT_EQ(vocab_size_with_padding(50304, 128, 1), 50304);
  EXPECT_EQ(vocab_size_with_padding(256, 1, 1), 256);
  EXPECT_EQ(vocab_size_with_padding(257, 64, 4), 512);
  EXPECT_THAT([] { vocab_size_with_padding(0, 128, 1); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("vocab_size must be positive")));
  EXPECT_THAT([] { vocab_size_with_padding(100, 0, 1); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("make_vocab_size_divisible_by")));
  EXPECT_THAT([] { vocab_size_with_padding(100, 128, 0); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("tensor_model_parallel_size")));
}

TEST(TensorParallelVocab, RangePerRank) {
  using Range = std::pair<int64_t, int64_t>;
  EXPECT_EQ(vocab_range_from_global_vocab_size(100, 0, 1), (Range{0, 100}));
  EXPECT_EQ(vocab_range_from_global_vocab_size(100, 1, 4), (Range{25, 50}));
  EXPECT_EQ(vocab_range_from_global_vocab_size(100, 3, 4), (Range{75, 100}));
  EXPECT_THAT([] { vocab_range_from_global_vocab_size(101, 0, 2); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("global_vocab_size 101")));
  EXPECT_THAT([] { vocab_range_from_global_vocab_size(100, 2, 2); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("rank 2")));
}

TEST_F(TensorParallel, MappingsAreThePlainTensorAtTp1) {
  const torch::Tensor x = torch::ones({2, 3, 4}, torch::requires_grad());
  for (const torch::Tensor& y :
       {copy_to_tensor_model_parallel_region(x), reduce_from_tensor_model_parallel_region(x),
        scatter_to_tensor_model_parallel_region(x), gather_from_tensor_model_parallel_region(x)}) {
    EXPECT_TRUE(y.is_same(x));  // no autograd node, no copy
  }
}

// Compares vocab_parallel_cross_entropy with torch's cross_entropy, forward and backward. Megatron's smoothing
// (1 - e on the target, e / (V - 1) on each other class) is torch's with e * V / (V - 1).
void check_cross_entropy(double label_smoothing, torch::Dtype dtype, double tolerance) {
  const int64_t vocab = 37;
  const torch::Tensor logits = (random({5, 3, vocab}, 1) * 4.0).to(dtype);
  const torch::Tensor target = torch::randint(vocab, {5, 3}, at::make_generator<at::CPUGeneratorImpl>(2));
  const torch::Tensor weights = random({5, 3}, 3, dtype);

  torch::Tensor x = logits.clone().requires_grad_();
  const torch::Tensor before = x.detach().clone();
  const torch::Tensor loss = vocab_parallel_cross_entropy(x, target, label_smoothing);
  (loss * weights).sum().backward();
  EXPECT_TRUE(x.detach().equal(before)) << "the caller's logits were modified";
  EXPECT_EQ(loss.sizes(), target.sizes());

  torch::Tensor x_ref = logits.clone().requires_grad_();
  const torch::Tensor ref = F::cross_entropy(
      x_ref.view({-1, vocab}), target.view({-1}),
      F::CrossEntropyFuncOptions().reduction(torch::kNone).label_smoothing(label_smoothing * vocab / (vocab - 1)));
  (ref.view({5, 3}) * weights).sum().backward();
  const double loss_diff = max_diff(loss, ref.view({5, 3}));
  const double grad_diff = max_diff(x.grad(), x_ref.grad());
  EXPECT_LE(loss_diff, tolerance) << "smoothing " << label_smoothing;
  EXPECT_LE(grad_diff, tolerance) << "smoothing " << label_smoothing;
  std::printf("cross entropy, smoothing %.2f, %s: max |diff| loss %.3g, grad %.3g\n", label_smoothing,
              std::string(c10::toString(dtype)).c_str(), loss_diff, grad_diff);
}

TEST_F(TensorParallel, CrossEntropyMatchesTorchForwardAndBackward) { check_cross_entropy(0.0, torch::kFloat32, 1e-6); }
TEST_F(TensorParallel, CrossEntropyWithLabelSmoothingMatchesTorch) { check_cross_entropy(0.1, torch::kFloat32, 1e-6); }
TEST_F(TensorParallel, CrossEntropyInFp64IsExactToRoundOff) {
  check_cross_entropy(0.0, torch::kFloat64, 1e-13);
  check_cross_entropy(0.2, torch::kFloat64, 1e-13);
}

// In place (what the GPT model asks for), the loss and the gradient are the copying path's to round-off, and the
// logits' own storage holds the softmax.
TEST_F(TensorParallel, CrossEntropyInPlaceGivesTheSameLossAndGradient) {
  for (const double smoothing : {0.0, 0.1}) {
    const int64_t vocab = 37;
    const torch::Tensor base = (random({5, 3, vocab}, 1) * 4.0).requires_grad_();
    const torch::Tensor target = torch::randint(vocab, {5, 3}, at::make_generator<at::CPUGeneratorImpl>(2));
    const torch::Tensor weights = random({5, 3}, 3);
    const torch::Tensor copied = vocab_parallel_cross_entropy(base * 1.0, target, smoothing);
    (copied * weights).sum().backward();
    const torch::Tensor copied_grad = base.grad().clone();
    base.mutable_grad().zero_();

    const torch::Tensor logits = base * 1.0;  // not a leaf, as the output layer's GEMM
    const torch::Tensor in_place = vocab_parallel_cross_entropy(logits, target, smoothing, /*inplace=*/true);
    EXPECT_TRUE(torch::allclose(logits.detach().sum(-1), torch::ones({5, 3}), 1e-5, 1e-5))
        << "the logits' storage holds the softmax";
    (in_place * weights).sum().backward();
    EXPECT_LE(max_diff(in_place, copied), 1e-6) << "smoothing " << smoothing;
    EXPECT_LE(max_diff(base.grad(), copied_grad), 1e-6) << "smoothing " << smoothing;
  }
}

TEST_F(TensorParallel, CrossEntropyUpcastsHalfPrecisionAndKeepsTheGradientDtype) {
  torch::Tensor logits = random({4, 2, 8}, 4).to(torch::kBFloat16).requires_grad_();
  const torch::Tensor target = torch::tensor({0, 1, 2, 3, 4, 5, 6, 7}).view({4, 2});
  const torch::Tensor loss = vocab_parallel_cross_entropy(logits, target);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
  loss.sum().backward();
  EXPECT_EQ(logits.grad().scalar_type(), torch::kBFloat16);
}

TEST_F(TensorParallel, CrossEntropyErrorsNameTheArgument) {
  const torch::Tensor logits = torch::zeros({4, 2, 8});
  EXPECT_THAT(
      [&] {
        vocab_parallel_cross_entropy(logits, torch::zeros({4, 3}, torch::kInt64));
      },
      ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("target [4, 3]"), HasSubstr("[4, 2, 8]"))));
  EXPECT_THAT(
      [&] {
        vocab_parallel_cross_entropy(logits, torch::zeros({4, 2}));
      },
      ThrowsMessage<std::invalid_argument>(HasSubstr("target must be an int64")));
  EXPECT_THAT(
      [&] {
        vocab_parallel_cross_entropy(logits, torch::zeros({4, 2}, torch::kInt64), 1.0);
      },
      ThrowsMessage<std::invalid_argument>(HasSubstr("label_smoothing")));
}

torch::Tensor master_weight(const InitMethod& init, int64_t rows, int64_t columns) {
  torch::Tensor weight = torch::empty({rows, columns});
  init(weight);
  return weight;
}

TEST_F(TensorParallel, ColumnParallelLinearIsLinearAtTp1) {
  ColumnParallelLinearOptions options(6, 9);
  options.init_method = init_method_normal(0.02, 7);
  options.gather_output = true;
  ColumnParallelLinear layer(options);
  const torch::Tensor master = master_weight(options.init_method, 9, 6);
  EXPECT_TRUE(layer->weight.equal(master));
  EXPECT_TRUE(layer->bias.equal(torch::zeros({9})));
  EXPECT_EQ(layer->named_parameters().size(), 2u);
  const torch::Tensor x = random({4, 2, 6}, 8);
  EXPECT_LE(max_diff(layer(x), F::linear(x, master, torch::zeros({9}))), 0.0);

  {
    torch::NoGradGuard no_grad;
    layer->bias.fill_(0.5);
  }
  layer->options.skip_bias_add = true;  // the caller adds the bias
  EXPECT_LE(max_diff(layer(x), F::linear(x, master)), 0.0);

  // A stride at tp = 1 keeps the whole master in order.
  options.stride = 3;
  EXPECT_TRUE(ColumnParallelLinear(options)->weight.equal(master));
}

TEST_F(TensorParallel, RowParallelLinearIsLinearAtTp1) {
  RowParallelLinearOptions options(6, 5);
  options.init_method = init_method_normal(0.02, 9);
  options.input_is_parallel = false;
  RowParallelLinear layer(options);
  const torch::Tensor master = master_weight(options.init_method, 5, 6);
  EXPECT_TRUE(layer->weight.equal(master));
  {
    torch::NoGradGuard no_grad;
    layer->bias.fill_(0.25);
  }
  const torch::Tensor x = random({4, 2, 6}, 10);
  EXPECT_LE(max_diff(layer(x), F::linear(x, master, torch::full({5}, 0.25))), 0.0);

  options.bias = false;
  RowParallelLinear no_bias(options);
  EXPECT_FALSE(no_bias->bias.defined());
  EXPECT_EQ(no_bias->named_parameters().size(), 1u);
  EXPECT_LE(max_diff(no_bias(x), F::linear(x, master)), 0.0);
}

TEST_F(TensorParallel, VocabParallelEmbeddingIsEmbeddingAtTp1) {
  VocabParallelEmbeddingOptions options(11, 4);
  options.init_method = init_method_normal(1.0, 12);
  VocabParallelEmbedding embedding(options);
  const torch::Tensor master = master_weight(options.init_method, 11, 4);
  EXPECT_EQ(embedding->vocab_start_index, 0);
  EXPECT_EQ(embedding->vocab_end_index, 11);
  const torch::Tensor ids = torch::tensor({{0, 3, 10}, {10, 5, 0}});
  EXPECT_TRUE(embedding(ids).equal(torch::embedding(master, ids)));
  EXPECT_THAT(
      [&] {
        embedding(torch::zeros({2, 2}));
      },
      ThrowsMessage<std::invalid_argument>(HasSubstr("input_ids must be int64")));
}

TEST_F(TensorParallel, Fp64ParametersHoldTheFp32MasterValues) {
  ColumnParallelLinearOptions options(3, 4);
  options.init_method = init_method_normal(0.02, 13);
  options.params_dtype = torch::kFloat64;
  ColumnParallelLinear layer(options);
  EXPECT_EQ(layer->weight.scalar_type(), torch::kFloat64);
  EXPECT_TRUE(layer->weight.equal(master_weight(options.init_method, 4, 3).to(torch::kFloat64)));
}

TEST_F(TensorParallel, LayerErrorsNameTheField) {
  EXPECT_THAT([] { ColumnParallelLinear layer(ColumnParallelLinearOptions(4, 8)); },
              ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("ColumnParallelLinear"), HasSubstr("init_method"))));
  EXPECT_THAT([] { RowParallelLinear layer(RowParallelLinearOptions(4, 8)); },
              ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("RowParallelLinear"), HasSubstr("init_method"))));
  EXPECT_THAT([] { VocabParallelEmbedding layer(VocabParallelEmbeddingOptions(4, 8)); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("init_method")));
  ColumnParallelLinearOptions strided(4, 8);
  strided.init_method = init_method_zeros();
  strided.stride = 3;
  EXPECT_THAT([&] { ColumnParallelLinear layer(strided); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("stride 3")));
  ColumnParallelLinearOptions empty(0, 8);
  empty.init_method = init_method_zeros();
  EXPECT_THAT([&] { ColumnParallelLinear layer(empty); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("input_size (0)")));
  EXPECT_THAT([] { init_method_normal(-1.0, 1); }, ThrowsMessage<std::invalid_argument>(HasSubstr("std")));
}

TEST_F(TensorParallel, InitMethodNormalIsIndependentOfTheGlobalRng) {
  const InitMethod init = init_method_normal(0.5, 99);
  torch::manual_seed(5);
  const torch::Tensor expected_next = torch::rand({3});
  torch::manual_seed(5);
  const torch::Tensor a = master_weight(init, 3, 4);
  EXPECT_TRUE(torch::rand({3}).equal(expected_next)) << "the global RNG advanced";
  torch::manual_seed(6);
  EXPECT_TRUE(master_weight(init, 3, 4).equal(a));
  EXPECT_NEAR(master_weight(init_method_normal(0.5, 1), 200, 200).std().item<double>(), 0.5, 0.01);
  EXPECT_TRUE(master_weight(init_method_zeros(), 2, 2).equal(torch::zeros({2, 2})));
}

TEST_F(TensorParallel, LayersRegisterParamAttributes) {
  ColumnParallelLinearOptions column_options(4, 6);
  column_options.init_method = init_method_zeros();
  column_options.stride = 3;
  ColumnParallelLinear column(column_options);
  RowParallelLinearOptions row_options(6, 4);
  row_options.init_method = init_method_zeros();
  RowParallelLinear row(row_options);
  VocabParallelEmbeddingOptions embedding_options(8, 4);
  embedding_options.init_method = init_method_zeros();
  VocabParallelEmbedding embedding(embedding_options);

  auto attributes_of = [](const torch::Tensor& param) {
    const ParamAttributes a = get_param_attributes(param);
    return std::make_tuple(a.tensor_model_parallel, a.partition_dim, a.partition_stride, a.shared_embedding);
  };
  EXPECT_EQ(attributes_of(column->weight), std::make_tuple(true, int64_t{0}, int64_t{3}, false));
  EXPECT_EQ(attributes_of(column->bias), std::make_tuple(true, int64_t{0}, int64_t{3}, false));
  EXPECT_EQ(attributes_of(row->weight), std::make_tuple(true, int64_t{1}, int64_t{1}, false));
  EXPECT_EQ(attributes_of(row->bias), std::make_tuple(false, int64_t{-1}, int64_t{1}, false));
  EXPECT_EQ(attributes_of(embedding->weight), std::make_tuple(true, int64_t{0}, int64_t{1}, false));
  // The module's parameter list holds the same tensors; a detached copy is a new tensor.
  EXPECT_TRUE(get_param_attributes(column->named_parameters()["weight"]).tensor_model_parallel);
  EXPECT_FALSE(get_param_attributes(column->weight.detach()).tensor_model_parallel);
  EXPECT_FALSE(param_is_tensor_parallel_duplicate(row->bias));  // tp rank 0 owns the replica that counts
  EXPECT_TRUE(param_is_not_shared(embedding->weight));
}

TEST_F(TensorParallel, ParamAttributesDefaultsSharedAndErrors) {
  const torch::Tensor param = torch::zeros({2, 3});
  EXPECT_FALSE(get_param_attributes(param).tensor_model_parallel);
  EXPECT_EQ(get_param_attributes(param).partition_dim, -1);
  ParamAttributes shared;
  shared.shared_embedding = true;
  set_param_attributes(param, shared);
  EXPECT_FALSE(param_is_not_shared(param));
  EXPECT_THAT(
      [&] {
        set_param_attributes(param, {true, 2, 1, false});
      },
      ThrowsMessage<std::invalid_argument>(HasSubstr("partition_dim 2")));
  EXPECT_THAT(
      [&] {
        set_param_attributes(param, {true, 0, 0, false});
      },
      ThrowsMessage<std::invalid_argument>(HasSubstr("partition_stride")));
  EXPECT_THAT([] { get_param_attributes(torch::Tensor()); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("undefined")));
}

TEST_F(TensorParallel, AFreedParametersAddressDoesNotPassItsAttributesOn) {
  // Each tensor gets attributes and dies; the registry prunes dead entries as it grows, their addresses go back to
  // the allocator, and later tensors land on them.
  std::unordered_set<const c10::TensorImpl*> had_attributes;
  int reused = 0;
  for (int i = 0; i < 1000; ++i) {
    const torch::Tensor tensor = torch::zeros({4});
    reused += had_attributes.count(tensor.unsafeGetTensorImpl()) != 0 ? 1 : 0;
    const ParamAttributes attributes = get_param_attributes(tensor);
    ASSERT_FALSE(attributes.tensor_model_parallel || attributes.shared_embedding) << "iteration " << i;
    set_param_attributes(tensor, {true, 0, 1, true});
    had_attributes.insert(tensor.unsafeGetTensorImpl());
  }
  std::printf("freed addresses reused: %d of 1000 tensors\n", reused);
  if (bridge::testing::kAddressSanitizer && reused == 0) {
    GTEST_SKIP() << "ASan's quarantine hands no freed address out again: the reuse this test is about cannot happen";
  }
  EXPECT_GT(reused, 0) << "the allocator never handed a freed address out again; the test proved nothing";
}

TEST_F(TensorParallel, RngForkRunsTheNamedStreamAndLeavesTheDefaultStreamAlone) {
  torch::manual_seed(1234);
  const torch::Tensor default_1 = torch::rand({5}), default_2 = torch::rand({5});
  torch::manual_seed(1234 + 2718);
  const torch::Tensor stream_1 = torch::rand({5}), stream_2 = torch::randn({5});

  model_parallel_manual_seed(1234);
  RngStatesTracker& tracker = get_rng_tracker();
  EXPECT_TRUE(tracker.has(kModelParallelRngTrackerName));
  EXPECT_TRUE(torch::rand({5}).equal(default_1));
  {
    auto guard = tracker.fork();
    EXPECT_TRUE(torch::rand({5}).equal(stream_1));
    EXPECT_THAT([&] { auto nested = tracker.fork(); }, ThrowsMessage<std::logic_error>(HasSubstr("already forked")));
  }
  EXPECT_TRUE(torch::rand({5}).equal(default_2)) << "the fork disturbed the default stream";
  const auto saved = tracker.get_states();
  {
    auto guard = tracker.fork(kModelParallelRngTrackerName);
    EXPECT_TRUE(torch::randn({5}).equal(stream_2)) << "the named stream did not advance";
  }
  tracker.set_states(saved);  // rewinds the named stream
  {
    auto guard = tracker.fork();
    EXPECT_TRUE(torch::randn({5}).equal(stream_2));
  }
}

TEST_F(TensorParallel, RngTrackerRejectsDuplicatesAndUnknownNames) {
  RngStatesTracker tracker;
  tracker.add("a", 1);
  EXPECT_THAT([&] { tracker.add("a", 2); }, ThrowsMessage<std::invalid_argument>(HasSubstr("named 'a' already")));
  EXPECT_THAT([&] { tracker.add("b", 1); }, ThrowsMessage<std::invalid_argument>(HasSubstr("seed 1 is already")));
  EXPECT_THAT([&] { auto guard = tracker.fork("c"); }, ThrowsMessage<std::invalid_argument>(HasSubstr("'c'")));
  EXPECT_FALSE(tracker.has("b"));
  tracker.reset();
  EXPECT_FALSE(tracker.has("a"));
  tracker.add("a", 1);  // reset frees names and seeds
  EXPECT_TRUE(tracker.has("a"));
}

}  // namespace
}  // namespace bridge::parallel::tensor_parallel
