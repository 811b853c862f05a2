// Context parallelism in one process: the load-balanced (zigzag) split and its inverse checked position by position,
// and context_parallel_attention over a group of one (plain causal attention, every cp_comm_type) against the fp64
// definition. The ranks' side is tests/dist/tensor_parallel_worker's cp_attention scenario.
#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "parallel/context_parallel/attention.h"
#include "parallel/context_parallel/utils.h"
#include "tests/causal_attention_reference.h"

namespace bridge::parallel::context_parallel {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

std::vector<int64_t> as_vector(const torch::Tensor& t) {
  const torch::Tensor contiguous = t.contiguous();
  return {contiguous.data_ptr<int64_t>(), contiguous.data_ptr<int64_t>() + contiguous.numel()};
}

TEST(ContextParallelSplit, PositionsAreChunkRThenItsMirror) {
  EXPECT_EQ(as_vector(positions_on_this_cp_rank(8, 2, 0)), (std::vector<int64_t>{0, 1, 6, 7}));
  EXPECT_EQ(as_vector(positions_on_this_cp_rank(8, 2, 1)), (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_EQ(as_vector(positions_on_this_cp_rank(16, 4, 1)), (std::vector<int64_t>{2, 3, 12, 13}));
  EXPECT_EQ(as_vector(positions_on_this_cp_rank(16, 4, 3)), (std::vector<int64_t>{6, 7, 8, 9}));
  EXPECT_EQ(as_vector(positions_on_this_cp_rank(6, 1, 0)), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  // Every position is kept by exactly one rank.
  for (int cp : {2, 3, 4}) {
    std::vector<int64_t> all;
    for (int r = 0; r < cp; ++r) {
      const auto mine = as_vector(positions_on_this_cp_rank(12 * cp, cp, r));
      all.insert(all.end(), mine.begin(), mine.end());
    }
    std::sort(all.begin(), all.end());
    std::vector<int64_t> expected(static_cast<std::size_t>(12 * cp));
    std::iota(expected.begin(), expected.end(), 0);
    EXPECT_EQ(all, expected) << "cp " << cp;
  }
}

TEST(ContextParallelSplit, GetTensorKeepsThisRanksPositionsAlongAnyDim) {
  // Each element holds its sequence position, so the kept elements name the positions kept.
  const torch::Tensor positions = torch::arange(24, torch::kLong);
  const torch::Tensor along_dim1 = positions.view({1, 24, 1}).expand({2, 24, 3}).contiguous();
  for (int cp : {1, 2, 3}) {
    for (int r = 0; r < cp; ++r) {
      const torch::Tensor expected = positions_on_this_cp_rank(24, cp, r);
      const torch::Tensor mine = get_tensor_on_this_cp_rank(along_dim1, 1, cp, r);
      ASSERT_EQ(mine.sizes(), (std::vector<int64_t>{2, 24 / cp, 3}));
      EXPECT_TRUE(mine.equal(expected.view({1, -1, 1}).expand({2, -1, 3}))) << "cp " << cp << " rank " << r;
      EXPECT_TRUE(get_tensor_on_this_cp_rank(along_dim1, -2, cp, r).equal(mine)) << "negative seq_dim";
    }
  }
  EXPECT_TRUE(get_tensor_on_this_cp_rank(along_dim1, 1, 1, 0).is_same(along_dim1)) << "cp 1 is the tensor itself";
}

TEST(ContextParallelSplit, RestoreInvertsTheSplit) {
  const torch::Tensor whole = torch::randn({3, 16, 2});
  for (int cp : {1, 2, 4, 8}) {
    for (int64_t dim : {1, -2}) {
      std::vector<torch::Tensor> locals;
      for (int r = 0; r < cp; ++r) locals.push_back(get_tensor_on_this_cp_rank(whole, dim, cp, r));
      EXPECT_TRUE(restore_from_cp_ranks(locals, dim).equal(whole)) << "cp " << cp << " dim " << dim;
    }
  }
  // Restoring puts each rank's first chunk at chunk r and its second at 2cp-1-r (not rank after rank).
  const std::vector<torch::Tensor> ranks = {torch::tensor({0, 1, 6, 7}), torch::tensor({2, 3, 4, 5})};
  EXPECT_EQ(as_vector(restore_from_cp_ranks(ranks, 0).to(torch::kLong)),
            (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(ContextParallelSplit, LengthNotAMultipleOfTwoCpIsRefused) {
  EXPECT_THAT([] { positions_on_this_cp_rank(10, 3, 0); },
              ThrowsMessage<std::invalid_argument>(
                  AllOf(HasSubstr("10"), HasSubstr("2 x context_parallel_size = 6"), HasSubstr("seq_length"))));
  EXPECT_THAT(
      [] {
        get_tensor_on_this_cp_rank(torch::zeros({2, 6}), 1, 2, 1);
      },
      ThrowsMessage<std::invalid_argument>(HasSubstr("2 x context_parallel_size = 4")));
  EXPECT_THAT([] { positions_on_this_cp_rank(8, 2, 2); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("outside a group of 2")));
  EXPECT_THAT(
      [] {
        restore_from_cp_ranks({torch::zeros({4}), torch::zeros({2})}, 0);
      },
      ThrowsMessage<std::invalid_argument>(HasSubstr("rank 1 holds 2 positions")));
  EXPECT_THAT([] { restore_from_cp_ranks({}, 0); }, ThrowsMessage<std::invalid_argument>(HasSubstr("no ranks")));
}

torch::Tensor seeded(at::IntArrayRef sizes, uint64_t seed) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randn(sizes, generator);
}

double relative_error(const torch::Tensor& actual, const torch::Tensor& expected) {
  const torch::Tensor e = expected.to(torch::kFloat64);
  return (actual.to(torch::kFloat64) - e).abs().max().item<double>() / e.abs().max().item<double>();
}

// A group of one: the causal attention of the whole sequence, its output and its q, k, v gradients, for every comm
// type, multi-head and grouped-query, fp32 and bf16, the default scale and a given one.
TEST(ContextParallelAttention, GroupOfOneIsPlainCausalAttention) {
  ProcessGroup alone("cp", {0}, 0, Backend::kGloo, std::chrono::seconds(10), nullptr);
  for (const auto& [type, name] : kCpCommTypeNames) {
    for (int64_t groups : {4, 2, 1}) {
      for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
        for (double scale : {0.0, 0.3}) {
          const std::string what = std::string(name) + " groups " + std::to_string(groups) + " " +
                                   c10::toString(dtype) + " scale " + std::to_string(scale);
          const torch::Tensor q = seeded({2, 4, 12, 8}, 1).to(dtype).requires_grad_();
          const torch::Tensor k = seeded({2, groups, 12, 8}, 2).to(dtype).requires_grad_();
          const torch::Tensor v = seeded({2, groups, 12, 8}, 3).to(dtype).requires_grad_();
          const torch::Tensor dout = seeded({2, 4, 12, 8}, 4).to(dtype);
          const torch::Tensor out = context_parallel_attention(q, k, v, type, alone, scale);
          ASSERT_EQ(out.scalar_type(), dtype) << what;
          out.backward(dout);

          const torch::Tensor q64 = q.detach().to(torch::kFloat64).requires_grad_();
          const torch::Tensor k64 = k.detach().to(torch::kFloat64).requires_grad_();
          const torch::Tensor v64 = v.detach().to(torch::kFloat64).requires_grad_();
          const torch::Tensor ref =
              testing::reference_causal_attention(q64, k64, v64, scale == 0.0 ? 1 / std::sqrt(8.0) : scale);
          ref.backward(dout.to(torch::kFloat64));
          const double tolerance = dtype == torch::kFloat32 ? 1e-5 : 2e-2;
          EXPECT_LT(relative_error(out, ref), tolerance) << what;
          EXPECT_LT(relative_error(q.grad(), q64.grad()), tolerance) << what << " dq";
          EXPECT_LT(relative_error(k.grad(), k64.grad()), tolerance) << what << " dk";
          EXPECT_LT(relative_error(v.grad(), v64.grad()), tolerance) << what << " dv";
        }
      }
    }
  }
}

TEST(ContextParallelAttention, MismatchedShapesAreRefusedWithTheShapes) {
  ProcessGroup alone("cp", {0}, 0, Backend::kGloo, std::chrono::seconds(10), nullptr);
  const torch::Tensor q = torch::zeros({1, 4, 6, 8});
  EXPECT_THAT(
      [&] {
        context_parallel_attention(q, torch::zeros({1, 3, 6, 8}), torch::zeros({1, 3, 6, 8}), CpCommType::kP2P, alone);
      },
      ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("multiple of the key/value groups"),
                                                 HasSubstr("num_query_groups"), HasSubstr("[1, 3, 6, 8]"))));
  EXPECT_THAT(
      [&] {
        context_parallel_attention(q, torch::zeros({1, 4, 5, 8}), torch::zeros({1, 4, 5, 8}), CpCommType::kA2A, alone);
      },
      ThrowsMessage<std::invalid_argument>(HasSubstr("agree in batch, sequence and head_dim")));
  EXPECT_THAT(
      [&] {
        context_parallel_attention(q.view({4, 6, 8}), q, q, CpCommType::kAllGather, alone);
      },
      ThrowsMessage<std::invalid_argument>(HasSubstr("[b, heads, s_local, head_dim]")));
  EXPECT_THAT([&] { context_parallel_attention(q, q.to(torch::kBFloat16), q, CpCommType::kP2P, alone); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("one dtype")));
}

}  // namespace
}  // namespace bridge::parallel::context_parallel
