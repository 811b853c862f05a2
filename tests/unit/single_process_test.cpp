// A world of one: no store, no network; every group has one member and every operation is local.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "parallel/distributed.h"
#include "parallel/parallel_state.h"

namespace bridge::parallel {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(SingleProcess, GroupsOfOneWorkLocally) {
  init_distributed(LaunchEnv{}, {});
  initialize_model_parallel(1, 1);
  EXPECT_EQ(get_world_size(), 1);
  EXPECT_EQ(get_tensor_model_parallel_world_size(), 1);
  EXPECT_TRUE(is_pipeline_first_stage());
  EXPECT_TRUE(is_pipeline_last_stage());
  EXPECT_FALSE(get_virtual_pipeline_model_parallel_rank().has_value());
  ASSERT_NE(get_embedding_group(), nullptr);
  EXPECT_EQ(&get_data_parallel_group(/*with_context_parallel=*/true), &get_data_parallel_group());

  ProcessGroup& world = get_world_group();
  torch::Tensor t = torch::tensor({1.0, 2.0});
  world.all_reduce(t, ReduceOp::kMax);
  EXPECT_TRUE(t.equal(torch::tensor({1.0, 2.0})));
  const auto gathered = world.all_gather(t);
  ASSERT_EQ(gathered.size(), 1u);
  EXPECT_TRUE(gathered[0].equal(t));
  EXPECT_TRUE(world.reduce_scatter(torch::arange(4.0)).equal(torch::arange(4.0)));
  world.broadcast(t, 0);
  world.barrier();

  EXPECT_THAT([&] { world.send(t, 0); }, ThrowsMessage<std::invalid_argument>(HasSubstr("must be another group rank")));
  EXPECT_THAT([&] { world.broadcast(t, 1); }, ThrowsMessage<std::invalid_argument>(HasSubstr("root 1 is not")));
  EXPECT_THAT([&] { world.reduce_scatter(torch::tensor(3.0)); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("must split into 1 equal chunks")));
  EXPECT_THAT([] { initialize_model_parallel(1, 1); }, ThrowsMessage<std::logic_error>(HasSubstr("already")));
  EXPECT_THAT([] { set_virtual_pipeline_model_parallel_rank(0); },
              ThrowsMessage<std::logic_error>(HasSubstr("there is no virtual pipeline")));

  destroy_distributed();
  EXPECT_FALSE(model_parallel_is_initialized());
  EXPECT_FALSE(is_distributed_initialized());
  EXPECT_THAT([] { get_world_group(); }, ThrowsMessage<std::logic_error>(HasSubstr("call bridge::parallel::init")));
}

// Without a CUDA LibTorch, or with one but a CPU device (the default), NCCL is refused before anything starts.
TEST(SingleProcess, NcclWithoutCudaIsAClearError) {
  EXPECT_THAT(
      [] {
        init_distributed(LaunchEnv{}, {Backend::kNccl, std::chrono::seconds(1)});
      },
      ThrowsMessage<std::invalid_argument>(HasSubstr("backend 'nccl' needs")));
  EXPECT_FALSE(is_distributed_initialized());
}

}  // namespace
}  // namespace bridge::parallel
