// Rank arithmetic against Megatron-Core: the world=8, tp=2, pp=2 groups from the reference exactly, the closed-form
// coordinate formula for many layouts, every rank's view in one process, and validation errors.
#include "parallel/rank_layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>

#include "parallel/rank_generator.h"

namespace bridge::parallel {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(RankGenerator, ReferenceLayoutWorld8Tp2Pp2) {
  const RankGenerator generator(/*tp=*/2, /*ep=*/1, /*dp=*/2, /*pp=*/2, /*cp=*/1);
  EXPECT_EQ(generator.world_size(), 8);
  EXPECT_EQ(generator.get_ranks("tp"), (RankGroups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(generator.get_ranks("dp"), (RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(generator.get_ranks("pp"), (RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(generator.get_ranks("tp-pp"), (RankGroups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(generator.get_ranks("tp-dp"), (RankGroups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(generator.get_ranks("cp"), (RankGroups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
}

// The coordinate of `rank` along each axis of `order` with `sizes`, computed directly from the formula
// rank = c0 + s0 * (c1 + s1 * (c2 + ...)).
std::vector<int> coordinates(int rank, const std::vector<int>& sizes) {
  std::vector<int> result;
  for (int size : sizes) {
    result.push_back(rank % size);
    rank /= size;
  }
  return result;
}

TEST(RankGenerator, GroupsVaryExactlyAlongTheirAxes) {
  struct Case {
    int tp, ep, dp, pp, cp;
    std::string order;
    std::vector<std::string> axes;  // the order with every axis
  };
  const std::vector<Case> cases = {
      {2, 1, 2, 2, 1, "tp-cp-ep-dp-pp", {"tp", "cp", "ep", "dp", "pp"}},
      {4, 1, 3, 2, 1, "tp-cp-ep-dp-pp", {"tp", "cp", "ep", "dp", "pp"}},
      {2, 1, 2, 2, 2, "tp-cp-ep-dp-pp", {"tp", "cp", "ep", "dp", "pp"}},
      {2, 2, 2, 3, 1, "tp-cp-ep-dp-pp", {"tp", "cp", "ep", "dp", "pp"}},
      {2, 1, 3, 2, 1, "tp-pp-dp", {"tp", "pp", "dp", "ep", "cp"}},
      {1, 1, 4, 2, 1, "tp-cp-pp-ep-dp", {"tp", "cp", "pp", "ep", "dp"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.order + " tp" + std::to_string(c.tp) + " dp" + std::to_string(c.dp) + " pp" + std::to_string(c.pp));
    const RankGenerator generator(c.tp, c.ep, c.dp, c.pp, c.cp, c.order);
    std::vector<int> sizes;
    for (const auto& axis : c.axes) {
      sizes.push_back(axis == "tp" ? c.tp : axis == "ep" ? c.ep : axis == "dp" ? c.dp : axis == "pp" ? c.pp : c.cp);
    }
    for (std::size_t varying = 0; varying < c.axes.size(); ++varying) {
      const RankGroups groups = generator.get_ranks(c.axes[varying]);
      std::set<int> seen;
      for (const auto& group : groups) {
        ASSERT_EQ(static_cast<int>(group.size()), sizes[varying]);
        for (std::size_t i = 0; i < group.size(); ++i) {
          const auto coords = coordinates(group[i], sizes);
          const auto first = coordinates(group[0], sizes);
          EXPECT_EQ(coords[varying], static_cast<int>(i));  // ascending along the group's own axis
          for (std::size_t other = 0; other < c.axes.size(); ++other) {
            if (other != varying) {
              EXPECT_EQ(coords[other], first[other]);  // fixed along every other axis
            }
          }
          EXPECT_TRUE(seen.insert(group[i]).second) << "rank " << group[i] << " in two groups";
        }
      }
      EXPECT_EQ(static_cast<int>(seen.size()), generator.world_size());  // the groups partition the world
    }
  }
}

TEST(RankGenerator, RejectsBadArgumentsNamingThem) {
  EXPECT_THAT([] { RankGenerator(0, 1, 1, 1, 1); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("tp size must be >= 1")));
  EXPECT_THAT([] { RankGenerator(1, 2, 1, 1, 2); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("cannot both exceed 1")));
  EXPECT_THAT(
      [] { RankGenerator(2, 1, 1, 2, 1, "tp-dp"); },
      ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("pp size is 2 but order 'tp-dp' does not name it")));
  EXPECT_THAT([] { RankGenerator(1, 1, 1, 1, 1, "tp-xx"); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("unknown or repeated axis 'xx'")));
  EXPECT_THAT([] { RankGenerator(1, 1, 1, 1, 1).get_ranks("tp-zz"); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("unknown axis 'zz'")));
}

TEST(RankLayout, EveryRankOfWorld8Tp2Pp2) {
  ParallelOptions options;
  options.tensor_model_parallel_size = 2;
  options.pipeline_model_parallel_size = 2;
  for (int rank = 0; rank < 8; ++rank) {
    SCOPED_TRACE(rank);
    const RankLayout layout = compute_rank_layout(8, rank, options);
    EXPECT_EQ(layout.data_parallel_size, 2);
    const int tp_base = rank / 2 * 2;
    EXPECT_EQ(layout.tensor_model_parallel, (std::vector<int>{tp_base, tp_base + 1}));
    EXPECT_EQ(layout.pipeline_model_parallel, (std::vector<int>{rank % 4, rank % 4 + 4}));
    const int dp_first = rank % 2 + (rank / 4) * 4;
    EXPECT_EQ(layout.data_parallel, (std::vector<int>{dp_first, dp_first + 2}));
    const std::vector<int> model_parallel =
        (rank / 2) % 2 == 0 ? std::vector<int>{0, 1, 4, 5} : std::vector<int>{2, 3, 6, 7};
    EXPECT_EQ(layout.model_parallel, model_parallel);
    EXPECT_EQ(layout.embedding, layout.pipeline_model_parallel);  // two stages: both are first or last
    EXPECT_EQ(layout.position_embedding, rank < 4 ? std::vector<int>{rank} : std::vector<int>{});
    EXPECT_EQ(layout.tensor_model_parallel_rank(), rank % 2);
    EXPECT_EQ(layout.pipeline_model_parallel_rank(), rank / 4);
    EXPECT_EQ(layout.data_parallel_rank(), (rank / 2) % 2);
  }
}

TEST(RankLayout, EmbeddingGroupsSkipMiddleStages) {
  ParallelOptions options;
  options.tensor_model_parallel_size = 2;
  options.pipeline_model_parallel_size = 4;
  options.virtual_pipeline_model_parallel_size = 2;
  EXPECT_EQ(compute_rank_layout(8, 0, options).pipeline_model_parallel, (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(compute_rank_layout(8, 0, options).embedding, (std::vector<int>{0, 6}));
  EXPECT_EQ(compute_rank_layout(8, 7, options).embedding, (std::vector<int>{1, 7}));
  EXPECT_THAT(compute_rank_layout(8, 2, options).embedding, IsEmpty());
  EXPECT_THAT(compute_rank_layout(8, 4, options).position_embedding, IsEmpty());
  EXPECT_EQ(compute_rank_layout(8, 1, options).position_embedding, (std::vector<int>{1}));
}

TEST(RankLayout, SingleProcess) {
  const RankLayout layout = compute_rank_layout(1, 0, {});
  EXPECT_THAT(layout.tensor_model_parallel, ElementsAre(0));
  EXPECT_THAT(layout.embedding, ElementsAre(0));
  EXPECT_THAT(layout.position_embedding, ElementsAre(0));
  EXPECT_EQ(layout.data_parallel_size, 1);
}

TEST(RankLayout, ValidationNamesTheFieldAndTheFix) {
  ParallelOptions options;
  options.tensor_model_parallel_size = 4;
  EXPECT_THAT([&] { compute_rank_layout(6, 0, options); },
              ::testing::ThrowsMessage<std::invalid_argument>(
                  HasSubstr("world size 6 is not divisible by tensor_model_parallel_size (4)")));
  options = {};
  options.virtual_pipeline_model_parallel_size = 2;
  EXPECT_THAT([&] { compute_rank_layout(2, 0, options); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("needs pipeline_model_parallel_size > 1")));
  options = {};
  options.context_parallel_size = 2;
  EXPECT_THAT([&] { compute_rank_layout(2, 0, options); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("context_parallel_size must be 1 for now")));
  EXPECT_THAT([] { compute_rank_layout(4, 4, {}); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("rank 4 is outside the world of 4")));
}

}  // namespace
}  // namespace bridge::parallel
