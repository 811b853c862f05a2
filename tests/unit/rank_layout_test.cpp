// Rank arithmetic against Megatron-Core: the world=8, tp=2, pp=2 groups from the reference exactly, the closed-form
// coordinate formula for many layouts, every rank's view in one process, the expert groups of Megatron-Core's
// expert rank generator (the table of moe_ep.md 2.1), the context-parallel groups and their combinations (with
// experts folded over dp x cp), and validation errors.
#include "parallel/rank_layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

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
  options.tensor_model_parallel_size = 2;
  EXPECT_THAT([&] { compute_rank_layout(6, 0, options); },
              ::testing::ThrowsMessage<std::invalid_argument>(
                  HasSubstr("world size 6 is not divisible by tensor_model_parallel_size (2) x "
                            "pipeline_model_parallel_size (1) x context_parallel_size (2); launch a multiple of 4")));
  options = {};
  options.context_parallel_size = 0;
  EXPECT_THAT([&] { compute_rank_layout(2, 0, options); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("context_parallel_size must be >= 1, got 0")));
  EXPECT_THAT([] { compute_rank_layout(4, 4, {}); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("rank 4 is outside the world of 4")));
}

// The group of `groups` that holds `rank`.
std::vector<int> holding(const RankGroups& groups, int rank) {
  for (const auto& group : groups) {
    if (std::find(group.begin(), group.end(), rank) != group.end()) return group;
  }
  return {};
}

// One row of Megatron-Core's groups for an expert-parallel layout (order tp-cp-ep-dp-pp), every group of each kind.
struct ExpertRow {
  std::string name;
  int world, tp, pp, ep, etp;  // etp 0: the default, = tp
  RankGroups tp_groups, dp, pp_groups, ep_groups, etp_groups, tp_ep, tp_ep_pp, edp;
};

// moe_ep.md 2.1's table (generated with Megatron-LM's generate_masked_orthogonal_rank_groups), less the cp row:
// dense tp / dp / pp and expert ep / etp / tp-ep / edp as listed there. The pp groups of rows without pp are
// singletons, and tp-ep-pp is tp-ep joined along pp (Megatron's "tp-ep-pp" token on the same generator).
const std::vector<ExpertRow>& expert_rows() {
  static const std::vector<ExpertRow> rows = {
      {"2: TP1 EP2",
       2,
       1,
       1,
       2,
       0,
       {{0}, {1}},
       {{0, 1}},
       {{0}, {1}},
       {{0, 1}},
       {{0}, {1}},
       {{0, 1}},
       {{0, 1}},
       {{0}, {1}}},
      {"2: TP2 EP2 ETP1",
       2,
       2,
       1,
       2,
       1,
       {{0, 1}},
       {{0}, {1}},
       {{0}, {1}},
       {{0, 1}},
       {{0}, {1}},
       {{0, 1}},
       {{0, 1}},
       {{0}, {1}}},
      {"4: TP2 EP2 ETP1",
       4,
       2,
       1,
       2,
       1,
       {{0, 1}, {2, 3}},
       {{0, 2}, {1, 3}},
       {{0}, {1}, {2}, {3}},
       {{0, 1}, {2, 3}},
       {{0}, {1}, {2}, {3}},
       {{0, 1}, {2, 3}},
       {{0, 1}, {2, 3}},
       {{0, 2}, {1, 3}}},
      {"4: TP2 EP2 ETP2",
       4,
       2,
       1,
       2,
       2,
       {{0, 1}, {2, 3}},
       {{0, 2}, {1, 3}},
       {{0}, {1}, {2}, {3}},
       {{0, 2}, {1, 3}},
       {{0, 1}, {2, 3}},
       {{0, 1, 2, 3}},
       {{0, 1, 2, 3}},
       {{0}, {1}, {2}, {3}}},
      {"4: TP1 EP2 DP4",
       4,
       1,
       1,
       2,
       0,
       {{0}, {1}, {2}, {3}},
       {{0, 1, 2, 3}},
       {{0}, {1}, {2}, {3}},
       {{0, 1}, {2, 3}},
       {{0}, {1}, {2}, {3}},
       {{0, 1}, {2, 3}},
       {{0, 1}, {2, 3}},
       {{0, 2}, {1, 3}}},
      {"4: PP2 EP2",
       4,
       1,
       2,
       2,
       0,
       {{0}, {1}, {2}, {3}},
       {{0, 1}, {2, 3}},
       {{0, 2}, {1, 3}},
       {{0, 1}, {2, 3}},
       {{0}, {1}, {2}, {3}},
       {{0, 1}, {2, 3}},
       {{0, 1, 2, 3}},
       {{0}, {1}, {2}, {3}}},
  };
  return rows;
}

TEST(RankLayout, ExpertGroupsOfEveryRankMatchMegatronCore) {
  for (const ExpertRow& row : expert_rows()) {
    ParallelOptions options;
    options.tensor_model_parallel_size = row.tp;
    options.pipeline_model_parallel_size = row.pp;
    options.expert_model_parallel_size = row.ep;
    options.expert_tensor_parallel_size = row.etp;
    for (int rank = 0; rank < row.world; ++rank) {
      SCOPED_TRACE(row.name + ", rank " + std::to_string(rank));
      const RankLayout layout = compute_rank_layout(row.world, rank, options);
      EXPECT_EQ(layout.tensor_model_parallel, holding(row.tp_groups, rank));
      EXPECT_EQ(layout.data_parallel, holding(row.dp, rank));
      EXPECT_EQ(layout.data_parallel_with_cp, holding(row.dp, rank));  // cp 1: dp-cp is dp, tp-cp is tp
      EXPECT_EQ(layout.tensor_and_context_parallel, holding(row.tp_groups, rank));
      EXPECT_EQ(layout.pipeline_model_parallel, holding(row.pp_groups, rank));
      EXPECT_EQ(layout.expert_model_parallel, holding(row.ep_groups, rank));
      EXPECT_EQ(layout.expert_tensor_parallel, holding(row.etp_groups, rank));
      EXPECT_EQ(layout.expert_tensor_and_model_parallel, holding(row.tp_ep, rank));
      EXPECT_EQ(layout.expert_tensor_model_pipeline_parallel, holding(row.tp_ep_pp, rank));
      EXPECT_EQ(layout.expert_data_parallel, holding(row.edp, rank));
      EXPECT_EQ(layout.expert_data_parallel_size, static_cast<int>(row.edp.front().size()));
      EXPECT_EQ(layout.data_parallel_size, static_cast<int>(row.dp.front().size()));
      EXPECT_EQ(layout.expert_model_parallel_rank(), layout.rank_in(holding(row.ep_groups, rank)));
      EXPECT_EQ(layout.expert_tensor_parallel_rank(), layout.rank_in(holding(row.etp_groups, rank)));
      EXPECT_EQ(layout.expert_data_parallel_rank(), layout.rank_in(holding(row.edp, rank)));
    }
  }
}

// Experts take their ranks from the dense ones: per pipeline stage, expert tp x ep x dp covers the same ranks as
// tp x dp, and each rank is in exactly one group of each expert kind.
TEST(RankLayout, ExpertGroupsPartitionTheWorld) {
  struct Case {
    int world, tp, pp, ep, etp;
  };
  for (const Case& c : std::vector<Case>{{16, 2, 2, 2, 1}, {16, 2, 2, 4, 1}, {16, 4, 1, 2, 2}, {24, 2, 3, 2, 2}}) {
    SCOPED_TRACE("world " + std::to_string(c.world) + " tp" + std::to_string(c.tp) + " pp" + std::to_string(c.pp) +
                 " ep" + std::to_string(c.ep) + " etp" + std::to_string(c.etp));
    ParallelOptions options;
    options.tensor_model_parallel_size = c.tp;
    options.pipeline_model_parallel_size = c.pp;
    options.expert_model_parallel_size = c.ep;
    options.expert_tensor_parallel_size = c.etp;
    for (int rank = 0; rank < c.world; ++rank) {
      const RankLayout layout = compute_rank_layout(c.world, rank, options);
      EXPECT_EQ(static_cast<int>(layout.expert_model_parallel.size()), c.ep);
      EXPECT_EQ(static_cast<int>(layout.expert_tensor_parallel.size()), c.etp);
      EXPECT_EQ(static_cast<int>(layout.expert_data_parallel.size()), c.world / (c.etp * c.ep * c.pp));
      EXPECT_EQ(static_cast<int>(layout.expert_tensor_and_model_parallel.size()), c.etp * c.ep);
      EXPECT_EQ(static_cast<int>(layout.expert_tensor_model_pipeline_parallel.size()), c.etp * c.ep * c.pp);
      // Every expert group but tp-ep-pp lies within this rank's pipeline stage, i.e. within its dense tp-dp group.
      for (const auto* group : {&layout.expert_model_parallel, &layout.expert_tensor_parallel,
                                &layout.expert_tensor_and_model_parallel, &layout.expert_data_parallel}) {
        for (int member : *group) {
          EXPECT_THAT(layout.tensor_and_data_parallel, ::testing::Contains(member));
        }
      }
      // The coordinates (etp rank, ep rank, edp rank) name the rank within its stage uniquely.
      EXPECT_EQ(layout.expert_tensor_parallel_rank() +
                    c.etp * (layout.expert_model_parallel_rank() + c.ep * layout.expert_data_parallel_rank()),
                layout.rank_in(layout.tensor_and_data_parallel));
    }
  }
}

// With ep 1 and expert tp = tp the expert generator is the dense one: parallel_state then shares the dense groups.
TEST(RankLayout, WithoutExpertParallelismTheExpertGroupsAreTheDenseOnes) {
  ParallelOptions options;
  options.tensor_model_parallel_size = 2;
  options.pipeline_model_parallel_size = 2;
  for (int rank = 0; rank < 8; ++rank) {
    SCOPED_TRACE(rank);
    const RankLayout layout = compute_rank_layout(8, rank, options);
    EXPECT_EQ(layout.expert_data_parallel_size, layout.data_parallel_size);
    EXPECT_EQ(layout.expert_model_parallel, std::vector<int>{rank});
    EXPECT_EQ(layout.expert_tensor_parallel, layout.tensor_model_parallel);
    EXPECT_EQ(layout.expert_tensor_and_model_parallel, layout.tensor_model_parallel);
    EXPECT_EQ(layout.expert_tensor_model_pipeline_parallel, layout.model_parallel);
    EXPECT_EQ(layout.expert_data_parallel, layout.data_parallel);
  }
}

TEST(RankLayout, ExpertTensorParallelSizeDefaultsToTensorParallel) {
  ParallelOptions options;
  options.tensor_model_parallel_size = 2;
  EXPECT_EQ(expert_tensor_parallel_size(options), 2);
  options.expert_tensor_parallel_size = 1;
  EXPECT_EQ(expert_tensor_parallel_size(options), 1);
}

TEST(RankLayout, ExpertValidationNamesTheFieldAndTheFix) {
  ParallelOptions options;
  options.tensor_model_parallel_size = 2;
  options.expert_model_parallel_size = 2;
  // moe_ep.md's note: with TP2 on 2 ranks the default expert tp of 2 needs 4 ranks.
  EXPECT_THAT([&] { compute_rank_layout(2, 0, options); },
              ::testing::ThrowsMessage<std::invalid_argument>(
                  HasSubstr("world size 2 is not divisible by expert_tensor_parallel_size (2) x "
                            "expert_model_parallel_size (2) x pipeline_model_parallel_size (1); set "
                            "expert_tensor_parallel_size 1 (it defaults to tensor_model_parallel_size) or launch a "
                            "multiple of 4 ranks")));
  options.expert_tensor_parallel_size = 1;
  EXPECT_NO_THROW(compute_rank_layout(2, 0, options));
  options = {};
  options.expert_model_parallel_size = 3;
  EXPECT_THAT([&] { compute_rank_layout(4, 0, options); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr(
                  "world size 4 is not divisible by expert_tensor_parallel_size (1) x "
                  "expert_model_parallel_size (3) x pipeline_model_parallel_size (1); launch a multiple of 3")));
  options = {};
  options.expert_model_parallel_size = 0;
  EXPECT_THAT([&] { compute_rank_layout(2, 0, options); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("expert_model_parallel_size must be >= 1")));
  options = {};
  options.expert_tensor_parallel_size = -1;
  EXPECT_THAT([&] { compute_rank_layout(2, 0, options); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("expert_tensor_parallel_size must be >= 1")));
  options = {};
  options.expert_model_parallel_size = 4;
  options.context_parallel_size = 2;  // ep may fold over dp x cp but not exceed it: 2 ranks hold 4 expert slices
  EXPECT_THAT([&] { compute_rank_layout(2, 0, options); },
              ::testing::ThrowsMessage<std::invalid_argument>(
                  HasSubstr("world size 2 is not divisible by expert_tensor_parallel_size (1) x "
                            "expert_model_parallel_size (4) x pipeline_model_parallel_size (1)")));
}

// Megatron-Core's two assertions on orders that do not end in pp: equal data-parallel sizes, equal pipeline groups.
TEST(RankLayout, ExpertAndDenseLayersShareThePipelineGroups) {
  ParallelOptions options;
  options.tensor_model_parallel_size = 2;
  options.pipeline_model_parallel_size = 2;
  options.expert_tensor_parallel_size = 1;
  options.order = "tp-pp-ep-dp";
  EXPECT_THAT([&] { compute_rank_layout(4, 0, options); },
              ::testing::ThrowsMessage<std::invalid_argument>(
                  HasSubstr("the expert data-parallel size (2) must equal the data-parallel size (1)")));
  options.expert_model_parallel_size = 2;  // now both data-parallel sizes are 2, but tp 2 vs expert tp 1 moves pp
  EXPECT_THAT([&] { compute_rank_layout(8, 0, options); },
              ::testing::ThrowsMessage<std::logic_error>(
                  HasSubstr("the pipeline groups of the dense layers and of the experts differ")));
  options.order = "tp-ep-pp-dp";  // expert tp x ep = tp: the pipeline strides agree
  EXPECT_EQ(compute_rank_layout(8, 0, options).pipeline_model_parallel, (std::vector<int>{0, 2}));
  EXPECT_EQ(compute_rank_layout(8, 0, options).expert_model_parallel, (std::vector<int>{0, 1}));
}

// Megatron-Core's groups with context parallelism (order tp-cp-ep-dp-pp, so rank = tp_rank + tp * (cp_rank + cp *
// (dp_rank + dp * pp_rank)) in the dense generator and rank = etp_rank + etp * (ep_rank + ep * (edp_rank + edp *
// pp_rank)) in the expert one), every group of each kind, worked out by hand from those formulas.
struct ContextRow {
  std::string name;
  int world, tp, pp, cp, ep, etp;  // etp 0: the default, = tp
  RankGroups tp_groups, cp_groups, dp, dp_cp, pp_groups, tp_cp, tp_dp, tp_dp_cp, model, ep_groups, edp;
};

const std::vector<ContextRow>& context_rows() {
  static const std::vector<ContextRow> rows = {
      // dp 2; the expert generator (etp 2, ep 1, edp 4) folds its data-parallel axis over cp x dp.
      {"8: TP2 CP2 DP2",
       8,
       2,
       1,
       2,
       1,
       0,
       {{0, 1}, {2, 3}, {4, 5}, {6, 7}},
       {{0, 2}, {1, 3}, {4, 6}, {5, 7}},
       {{0, 4}, {1, 5}, {2, 6}, {3, 7}},
       {{0, 2, 4, 6}, {1, 3, 5, 7}},
       {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}},
       {{0, 1, 2, 3}, {4, 5, 6, 7}},
       {{0, 1, 4, 5}, {2, 3, 6, 7}},
       {{0, 1, 2, 3, 4, 5, 6, 7}},
       {{0, 1}, {2, 3}, {4, 5}, {6, 7}},
       {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}},
       {{0, 2, 4, 6}, {1, 3, 5, 7}}},
      // dp 1: dp-cp is cp, tp-dp is tp and tp-dp-cp is tp-cp; expert dp (etp 2, edp 2) is cp.
      {"8: TP2 CP2 PP2",
       8,
       2,
       2,
       2,
       1,
       0,
       {{0, 1}, {2, 3}, {4, 5}, {6, 7}},
       {{0, 2}, {1, 3}, {4, 6}, {5, 7}},
       {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}},
       {{0, 2}, {1, 3}, {4, 6}, {5, 7}},
       {{0, 4}, {1, 5}, {2, 6}, {3, 7}},
       {{0, 1, 2, 3}, {4, 5, 6, 7}},
       {{0, 1}, {2, 3}, {4, 5}, {6, 7}},
       {{0, 1, 2, 3}, {4, 5, 6, 7}},
       {{0, 1, 4, 5}, {2, 3, 6, 7}},
       {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}},
       {{0, 2}, {1, 3}, {4, 6}, {5, 7}}},
      // moe_ep.md 2.1's cp row: the ep pairs are the cp pairs, expert dp is dense dp.
      {"4: CP2 EP2",
       4,
       1,
       1,
       2,
       2,
       0,
       {{0}, {1}, {2}, {3}},
       {{0, 1}, {2, 3}},
       {{0, 2}, {1, 3}},
       {{0, 1, 2, 3}},
       {{0}, {1}, {2}, {3}},
       {{0, 1}, {2, 3}},
       {{0, 2}, {1, 3}},
       {{0, 1, 2, 3}},
       {{0}, {1}, {2}, {3}},
       {{0, 1}, {2, 3}},
       {{0, 2}, {1, 3}}},
      // ep 2 with expert tp 1 over tp 2: the ep pairs are the tp pairs, expert dp spans cp x dp.
      {"8: TP2 CP2 DP2 EP2 ETP1",
       8,
       2,
       1,
       2,
       2,
       1,
       {{0, 1}, {2, 3}, {4, 5}, {6, 7}},
       {{0, 2}, {1, 3}, {4, 6}, {5, 7}},
       {{0, 4}, {1, 5}, {2, 6}, {3, 7}},
       {{0, 2, 4, 6}, {1, 3, 5, 7}},
       {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}},
       {{0, 1, 2, 3}, {4, 5, 6, 7}},
       {{0, 1, 4, 5}, {2, 3, 6, 7}},
       {{0, 1, 2, 3, 4, 5, 6, 7}},
       {{0, 1}, {2, 3}, {4, 5}, {6, 7}},
       {{0, 1}, {2, 3}, {4, 5}, {6, 7}},
       {{0, 2, 4, 6}, {1, 3, 5, 7}}},
  };
  return rows;
}

TEST(RankLayout, ContextParallelGroupsOfEveryRankMatchMegatronCore) {
  for (const ContextRow& row : context_rows()) {
    ParallelOptions options;
    options.tensor_model_parallel_size = row.tp;
    options.pipeline_model_parallel_size = row.pp;
    options.context_parallel_size = row.cp;
    options.expert_model_parallel_size = row.ep;
    options.expert_tensor_parallel_size = row.etp;
    for (int rank = 0; rank < row.world; ++rank) {
      SCOPED_TRACE(row.name + ", rank " + std::to_string(rank));
      const RankLayout layout = compute_rank_layout(row.world, rank, options);
      EXPECT_EQ(layout.data_parallel_size, static_cast<int>(row.dp.front().size()));
      EXPECT_EQ(layout.tensor_model_parallel, holding(row.tp_groups, rank));
      EXPECT_EQ(layout.context_parallel, holding(row.cp_groups, rank));
      EXPECT_EQ(layout.data_parallel, holding(row.dp, rank));
      EXPECT_EQ(layout.data_parallel_with_cp, holding(row.dp_cp, rank));
      EXPECT_EQ(layout.pipeline_model_parallel, holding(row.pp_groups, rank));
      EXPECT_EQ(layout.tensor_and_context_parallel, holding(row.tp_cp, rank));
      EXPECT_EQ(layout.tensor_and_data_parallel, holding(row.tp_dp, rank));
      EXPECT_EQ(layout.tensor_and_data_parallel_with_cp, holding(row.tp_dp_cp, rank));
      EXPECT_EQ(layout.model_parallel, holding(row.model, rank));
      EXPECT_EQ(layout.expert_model_parallel, holding(row.ep_groups, rank));
      EXPECT_EQ(layout.expert_data_parallel, holding(row.edp, rank));
      EXPECT_EQ(layout.expert_data_parallel_size, static_cast<int>(row.edp.front().size()));
      // Dense and expert layers put a rank on the same stage: the expert generator's pp groups are the dense ones.
      EXPECT_EQ(layout.expert_tensor_model_pipeline_parallel.size(),
                static_cast<std::size_t>(expert_tensor_parallel_size(options) * row.ep * row.pp));
      EXPECT_EQ(layout.context_parallel_rank(), layout.rank_in(holding(row.cp_groups, rank)));
      EXPECT_EQ(layout.data_parallel_rank(), layout.rank_in(holding(row.dp, rank)));
      EXPECT_EQ(layout.data_parallel_rank(/*with_context_parallel=*/true), layout.rank_in(holding(row.dp_cp, rank)));
    }
  }
}

TEST(RankGenerator, ContextParallelLayoutWorld8Tp2Cp2Pp2) {
  const RankGenerator dense(/*tp=*/2, /*ep=*/1, /*dp=*/1, /*pp=*/2, /*cp=*/2);
  const RankGenerator expert(/*tp=*/2, /*ep=*/1, /*dp=*/2, /*pp=*/2, /*cp=*/1);
  EXPECT_EQ(dense.get_ranks("pp"), expert.get_ranks("pp"));  // Megatron-Core's assertion
  EXPECT_EQ(dense.get_ranks("dp-cp"), expert.get_ranks("dp"));
  EXPECT_EQ(dense.get_ranks("tp-cp"), (RankGroups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
}

// Per stage tp x cp x dp = etp x ep x edp, with cp > 1 too: every expert group but tp-ep-pp lies within the stage's
// tp-dp-cp group, the expert coordinates name the rank within it uniquely, and one rank per tp x pp shard has dp-cp
// rank 0 (the checkpoint writer and the optimizer's shard 0).
TEST(RankLayout, ExpertsFoldOverDataAndContextParallelRanks) {
  struct Case {
    int world, tp, pp, cp, ep, etp;
  };
  for (const Case& c : std::vector<Case>{{8, 1, 1, 2, 2, 1},
                                         {8, 1, 1, 2, 4, 1},
                                         {8, 2, 1, 2, 2, 1},
                                         {16, 2, 2, 2, 2, 1},
                                         {16, 1, 2, 4, 2, 1},
                                         {16, 2, 1, 2, 2, 2},
                                         {24, 2, 3, 2, 2, 1},
                                         {8, 1, 1, 4, 8, 1}}) {
    SCOPED_TRACE("world " + std::to_string(c.world) + " tp" + std::to_string(c.tp) + " pp" + std::to_string(c.pp) +
                 " cp" + std::to_string(c.cp) + " ep" + std::to_string(c.ep) + " etp" + std::to_string(c.etp));
    ParallelOptions options;
    options.tensor_model_parallel_size = c.tp;
    options.pipeline_model_parallel_size = c.pp;
    options.context_parallel_size = c.cp;
    options.expert_model_parallel_size = c.ep;
    options.expert_tensor_parallel_size = c.etp;
    std::set<std::vector<int>> writers_per_model_shard;
    int writers = 0;
    for (int rank = 0; rank < c.world; ++rank) {
      const RankLayout layout = compute_rank_layout(c.world, rank, options);
      EXPECT_EQ(static_cast<int>(layout.context_parallel.size()), c.cp);
      EXPECT_EQ(static_cast<int>(layout.data_parallel_with_cp.size()), c.cp * layout.data_parallel_size);
      EXPECT_EQ(static_cast<int>(layout.tensor_and_data_parallel_with_cp.size()), c.world / c.pp);
      EXPECT_EQ(layout.expert_data_parallel_size, c.world / (c.etp * c.ep * c.pp));
      for (const auto* group :
           {&layout.expert_model_parallel, &layout.expert_tensor_parallel, &layout.expert_tensor_and_model_parallel,
            &layout.expert_data_parallel, &layout.context_parallel, &layout.data_parallel_with_cp,
            &layout.tensor_and_context_parallel}) {
        for (int member : *group) {
          EXPECT_THAT(layout.tensor_and_data_parallel_with_cp, ::testing::Contains(member));
        }
      }
      EXPECT_EQ(layout.expert_tensor_parallel_rank() +
                    c.etp * (layout.expert_model_parallel_rank() + c.ep * layout.expert_data_parallel_rank()),
                layout.rank_in(layout.tensor_and_data_parallel_with_cp));
      if (layout.data_parallel_rank(/*with_context_parallel=*/true) == 0) {
        ++writers;
        writers_per_model_shard.insert(layout.model_parallel);
      }
    }
    EXPECT_EQ(writers, c.tp * c.pp);
    EXPECT_EQ(static_cast<int>(writers_per_model_shard.size()), 1);  // all in the model-parallel group of rank 0
  }
}

}  // namespace
}  // namespace bridge::parallel
