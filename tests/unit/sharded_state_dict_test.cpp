// Megatron-Core's torch_dist keys and chunks (training/checkpointing/sharded_state_dict.h) without a run: the stacked
// layer and expert keys and their way back (named_parts), the SwiGLU fc1's two blocks at tp2 reassembling into
// [gate of every rank; up of every rank], and a distributed optimizer's flat ranges of a [7, 5] tensor (and a 1-D one)
// as boxes that cover exactly the range's elements, once each, with their values: where an off-by-one would hide;
// the dp_reshardable bucket keys and the 1-D chunks of every data-parallel rank's shard of a bucket.
#include "training/checkpointing/sharded_state_dict.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/dist_checkpointing/sharded_tensor.h"

namespace bridge::training {
namespace {

namespace dc = parallel::dist_checkpointing;

ShardedKeyOptions options(int64_t layers, int64_t experts, bool homogeneous = true) {
  ShardedKeyOptions out;
  out.num_layers = layers;
  out.num_experts = experts;
  out.homogeneous_layers = homogeneous;
  return out;
}

dc::ShardedTensorLayout whole(std::vector<int64_t> shape) {
  dc::ShardedTensorLayout layout;
  layout.global_shape = std::move(shape);
  return layout;
}

// The part of `global` a chunk (or box) at `offsets` of `sizes` is.
torch::Tensor region(const torch::Tensor& global, const std::vector<int64_t>& offsets,
                     const std::vector<int64_t>& sizes) {
  torch::Tensor part = global;
  for (std::size_t d = 0; d < offsets.size(); ++d) part = part.narrow(static_cast<int64_t>(d), offsets[d], sizes[d]);
  return part;
}

// Whether `name` is among `parts` with `prefix`.
bool has_part(const std::vector<NamedPart>& parts, const std::string& name, const std::vector<int64_t>& prefix) {
  for (const NamedPart& part : parts) {
    if (part.name == name) return part.prefix == prefix;
  }
  return false;
}

TEST(ShardedStateDict, LayerAndExpertKeysStackAndMapBack) {
  int64_t layer = 0, expert = 0;
  const ShardedKeyOptions dense = options(4, 0);
  EXPECT_EQ(sharded_key("decoder.layers.2.input_layernorm.weight", dense, &layer, &expert),
            "decoder.layers.input_layernorm.weight");
  EXPECT_EQ(layer, 2);
  EXPECT_EQ(expert, -1);
  EXPECT_EQ(sharded_key("embedding.word_embeddings.weight", dense, &layer, &expert),
            "embedding.word_embeddings.weight");
  EXPECT_EQ(layer, -1);

  // A replicated layer norm of layer 2: one chunk, a leading layer axis.
  const std::vector<ShardedChunk> norm = sharded_chunks("decoder.layers.2.input_layernorm.weight", whole({32}), dense);
  ASSERT_EQ(norm.size(), 1U);
  EXPECT_EQ(norm[0].global_shape, (std::vector<int64_t>{4, 32}));
  EXPECT_EQ(norm[0].offsets, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(norm[0].sizes, (std::vector<int64_t>{1, 32}));
  EXPECT_EQ(norm[0].prepended, 1);
  EXPECT_EQ(norm[0].local_dim, -1);
  const std::vector<NamedPart> layers = named_parts(norm[0].key, norm[0].global_shape, dense);
  ASSERT_EQ(layers.size(), 4U);
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(has_part(layers, "decoder.layers." + std::to_string(i) + ".input_layernorm.weight", {i})) << i;
  }
  EXPECT_THROW(sharded_chunks("decoder.layers.4.input_layernorm.weight", whole({32}), dense), std::invalid_argument);

  // Global expert 5 of layer 3 of 8 experts: [layer, expert] axes.
  const ShardedKeyOptions moe = options(4, 8);
  const std::string name = "decoder.layers.3.mlp.experts.local_experts.5.linear_fc1.weight";
  EXPECT_EQ(sharded_key(name, moe, &layer, &expert), "decoder.layers.mlp.experts.experts.linear_fc1.weight");
  EXPECT_EQ(layer, 3);
  EXPECT_EQ(expert, 5);
  const std::vector<ShardedChunk> fc1 = sharded_chunks(name, whole({48, 32}), moe);
  ASSERT_EQ(fc1.size(), 1U);
  EXPECT_EQ(fc1[0].global_shape, (std::vector<int64_t>{4, 8, 48, 32}));
  EXPECT_EQ(fc1[0].offsets, (std::vector<int64_t>{3, 5, 0, 0}));
  EXPECT_EQ(fc1[0].sizes, (std::vector<int64_t>{1, 1, 48, 32}));
  EXPECT_EQ(fc1[0].prepended, 2);
  const std::vector<NamedPart> experts = named_parts(fc1[0].key, fc1[0].global_shape, moe);
  EXPECT_EQ(experts.size(), 32U);
  EXPECT_TRUE(has_part(experts, name, {3, 5}));
  EXPECT_TRUE(has_part(experts, "decoder.layers.0.mlp.experts.local_experts.7.linear_fc1.weight", {0, 7}));
  EXPECT_THROW(sharded_chunks("decoder.layers.3.mlp.experts.local_experts.8.linear_fc1.weight", whole({48, 32}), moe),
               std::invalid_argument);

  // Layers that differ (Megatron-Core's non_homogeneous_layers): per-layer keys, the expert axis alone.
  const ShardedKeyOptions mixed = options(4, 8, false);
  const std::vector<ShardedChunk> own = sharded_chunks(name, whole({48, 32}), mixed);
  ASSERT_EQ(own.size(), 1U);
  EXPECT_EQ(own[0].key, "decoder.layers.3.mlp.experts.experts.linear_fc1.weight");
  EXPECT_EQ(own[0].global_shape, (std::vector<int64_t>{8, 48, 32}));
  EXPECT_EQ(own[0].offsets, (std::vector<int64_t>{5, 0, 0}));
  const std::vector<NamedPart> back = named_parts(own[0].key, own[0].global_shape, mixed);
  EXPECT_EQ(back.size(), 8U);
  EXPECT_TRUE(has_part(back, name, {5}));
}

// SwiGLU's fc1 at tp2: each rank holds [its gate rows; its up rows], two blocks. The global tensor is [gate of every
// rank; up of every rank]: rank r's blocks lie at rows r*h and tp*h + r*h, and both ranks' chunks reassemble it.
TEST(ShardedStateDict, SwigluFc1AtTp2IsTwoChunksReassemblingGateThenUp) {
  constexpr int64_t tp = 2, h = 3, cols = 4, layers = 2, layer = 1;
  const torch::Tensor gate = torch::arange(tp * h * cols, torch::kFloat32).view({tp * h, cols});
  const torch::Tensor up = gate + 1000;
  const torch::Tensor expected = torch::cat({gate, up}, 0);
  torch::Tensor global = torch::full({layers, 2 * tp * h, cols}, -1.0);
  for (int64_t r = 0; r < tp; ++r) {
    SCOPED_TRACE("tp rank " + std::to_string(r));
    const torch::Tensor local = torch::cat({gate.narrow(0, r * h, h), up.narrow(0, r * h, h)}, 0);
    dc::ShardedTensorLayout layout = whole({2 * tp * h, cols});
    layout.partition_dim = 0;
    layout.blocks = {{0, r * h, h}, {h, tp * h + r * h, h}};  // as sharded_tensor_layout makes them (stride 2)
    const std::vector<ShardedChunk> chunks =
        sharded_chunks("decoder.layers.1.mlp.linear_fc1.weight", layout, options(layers, 0));
    ASSERT_EQ(chunks.size(), 2U);
    for (std::size_t j = 0; j < 2; ++j) {
      EXPECT_EQ(chunks[j].key, "decoder.layers.mlp.linear_fc1.weight");
      EXPECT_EQ(chunks[j].global_shape, (std::vector<int64_t>{layers, 2 * tp * h, cols}));
      EXPECT_EQ(chunks[j].sizes, (std::vector<int64_t>{1, h, cols}));
      EXPECT_EQ(chunks[j].local_dim, 0);
      EXPECT_EQ(chunks[j].local_start, static_cast<int64_t>(j) * h);
      EXPECT_EQ(chunks[j].local_length, h);
    }
    EXPECT_EQ(chunks[0].offsets, (std::vector<int64_t>{layer, r * h, 0}));
    EXPECT_EQ(chunks[1].offsets, (std::vector<int64_t>{layer, tp * h + r * h, 0}));
    for (const ShardedChunk& chunk : chunks) region(global, chunk.offsets, chunk.sizes).copy_(chunk_data(local, chunk));
  }
  EXPECT_TRUE(torch::equal(global[layer], expected)) << global[layer];
  EXPECT_TRUE(torch::equal(global[0], torch::full({2 * tp * h, cols}, -1.0))) << "another layer was written";
}

// A distributed optimizer's flat range [begin, end) of this rank's [7, 5] (or [35]) tensor, as the boxes
// flat_range_boxes makes of it and the values flat_box_data takes from the range's elements: placed in the global
// tensor, they must cover exactly the global positions of the range's elements, each once, with those elements.
void expect_flat_ranges_covered(const std::vector<int64_t>& local_shape, const dc::ShardedTensorLayout& layout,
                                const std::string& what) {
  SCOPED_TRACE(what);
  const ShardedKeyOptions keys = options(3, 0);
  const std::vector<ShardedChunk> chunks = sharded_chunks("decoder.layers.2.mlp.linear_fc2.weight", layout, keys);
  const torch::Tensor local = torch::arange(7 * 5, torch::kFloat64).view(local_shape);  // element i holds i
  // Each global position's local flat index (-1: not this rank's).
  torch::Tensor index = torch::full(chunks.front().global_shape, -1.0, torch::kFloat64);
  for (const ShardedChunk& chunk : chunks) region(index, chunk.offsets, chunk.sizes).copy_(chunk_data(local, chunk));
  ASSERT_EQ((index >= 0).sum().item<int64_t>(), 35) << "the chunks place every local element";

  std::mt19937 random(20240611);
  std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 35}, {0, 1}, {34, 35}, {4, 6}, {5, 10}, {3, 12}, {7, 33}};
  for (int i = 0; i < 300; ++i) {
    const int64_t a = static_cast<int64_t>(random() % 36), b = static_cast<int64_t>(random() % 36);
    if (a != b) ranges.emplace_back(std::min(a, b), std::max(a, b));
  }
  for (const auto& [begin, end] : ranges) {
    SCOPED_TRACE("range [" + std::to_string(begin) + ", " + std::to_string(end) + ")");
    const torch::Tensor flat = local.reshape({-1}).narrow(0, begin, end - begin).clone();
    torch::Tensor values = torch::full(index.sizes(), -1.0, torch::kFloat64);
    torch::Tensor covered = torch::zeros(index.sizes(), torch::kLong);
    const std::vector<FlatBox> boxes = flat_range_boxes(chunks, local_shape, begin, end);
    EXPECT_LE(boxes.size(), 3 * chunks.size()) << "at most three boxes a chunk";
    for (const FlatBox& box : boxes) {
      const torch::Tensor data = flat_box_data(flat, local_shape, begin, box);
      ASSERT_EQ(data.sizes().vec(), box.chunk.sizes);
      // The box's local place holds the same elements as its values.
      EXPECT_TRUE(torch::equal(region(local, box.local_offsets, box.local_sizes).reshape(box.chunk.sizes), data));
      region(values, box.chunk.offsets, box.chunk.sizes).copy_(data);
      region(covered, box.chunk.offsets, box.chunk.sizes).add_(1);
    }
    const torch::Tensor in_range = (index >= begin).logical_and(index < end);
    EXPECT_TRUE(torch::equal(covered, in_range.to(torch::kLong)))
        << "positions covered other than once, or outside the range:\n"
        << covered - in_range.to(torch::kLong);
    EXPECT_TRUE(torch::equal(values.masked_select(in_range), index.masked_select(in_range)))
        << "a box holds other elements than its place's";
  }
}

TEST(ShardedStateDict, FlatRangeBoxesCoverExactlyTheRangesElements) {
  // Replicated: the whole [7, 5] tensor is one chunk.
  expect_flat_ranges_covered({7, 5}, whole({7, 5}), "[7, 5] replicated");
  // Split on dim 0 in two blocks (as SwiGLU's fc1): local rows 0-2 at global 3, rows 3-6 at global 13.
  dc::ShardedTensorLayout rows = whole({20, 5});
  rows.partition_dim = 0;
  rows.blocks = {{0, 3, 3}, {3, 13, 4}};
  expect_flat_ranges_covered({7, 5}, rows, "[7, 5] in two row blocks");
  // Split on dim 1 (a row-parallel weight) in two blocks: the boxes are cut along the columns too.
  dc::ShardedTensorLayout columns = whole({7, 12});
  columns.partition_dim = 1;
  columns.blocks = {{0, 5, 2}, {2, 9, 3}};
  expect_flat_ranges_covered({7, 5}, columns, "[7, 5] in two column blocks");
  // 1-D: one row.
  expect_flat_ranges_covered({35}, whole({35}), "[35] replicated");
  dc::ShardedTensorLayout halves = whole({70});
  halves.partition_dim = 0;
  halves.blocks = {{0, 35, 35}};
  expect_flat_ranges_covered({35}, halves, "[35] rank 1 of 2");
}

// Megatron-Core's dp_reshardable keys, and a bucket's 1-D chunks: every data-parallel rank's slices (a parameter's
// elements, or padding in a gap) tile [0, numel_unpadded) exactly once, each slice pointing at its parameter's
// elements, whatever the data-parallel size (the padded tail beyond the last parameter is never a chunk).
TEST(ShardedStateDict, DistributedOptimizerBucketKeysAndSlicesTileTheBucket) {
  EXPECT_EQ(distributed_optimizer_bucket_key(3, 1, torch::kBFloat16, torch::kFloat32, 2),
            "optimizer.distributed.dp_group_idx_3.gbuf_idx_1.dtype_(torch.bfloat16, torch.float32).bucket_idx_2");
  EXPECT_EQ(distributed_optimizer_domain_key(0, "per_bucket_numel"),
            "optimizer.distributed.dp_group_idx_0.per_bucket_numel");
  // Three parameters with a gap of 3 between the second and third (Megatron's alignment; bridge packs them).
  const std::vector<int64_t> offsets = {0, 10, 28}, numels = {10, 15, 7};
  const int64_t unpadded = 35;
  for (const int64_t dp : {1, 2, 3, 4, 8}) {
    const int64_t padded = (unpadded + dp - 1) / dp * dp, shard = padded / dp;
    std::vector<int> covered(static_cast<std::size_t>(unpadded), 0);
    for (int64_t rank = 0; rank < dp; ++rank) {
      int64_t expected_start = rank * shard;
      for (const BucketSlice& slice : bucket_slices(offsets, numels, unpadded, rank * shard, (rank + 1) * shard)) {
        const std::string where =
            "dp " + std::to_string(dp) + " rank " + std::to_string(rank) + " at " + std::to_string(slice.bucket_offset);
        EXPECT_EQ(slice.bucket_offset, expected_start) << where << ": the slices are contiguous";
        ASSERT_GT(slice.length, 0) << where;
        expected_start = slice.bucket_offset + slice.length;
        if (slice.param >= 0) {
          const auto p = static_cast<std::size_t>(slice.param);
          EXPECT_EQ(slice.bucket_offset, offsets[p] + slice.param_offset) << where;
          EXPECT_LE(slice.param_offset + slice.length, numels[p]) << where << ": within its parameter";
        } else {
          EXPECT_GE(slice.bucket_offset, offsets[1] + numels[1]) << where << ": padding only in the gap";
          EXPECT_LE(slice.bucket_offset + slice.length, offsets[2]) << where;
        }
        for (int64_t i = slice.bucket_offset; i < slice.bucket_offset + slice.length; ++i)
          ++covered[static_cast<std::size_t>(i)];
      }
      EXPECT_LE(expected_start, unpadded) << "dp " << dp << ": a chunk beyond the unpadded size";
    }
    for (int64_t i = 0; i < unpadded; ++i)
      EXPECT_EQ(covered[static_cast<std::size_t>(i)], 1) << "dp " << dp << " element " << i;
  }
  // Two ranks of a 4-element bucket padded to 8: rank 1 holds padding only and writes nothing.
  EXPECT_TRUE(bucket_slices({0}, {4}, 4, 4, 8).empty());
  EXPECT_THROW(bucket_slices({0, 4}, {4}, 8, 0, 8), std::invalid_argument);
}

}  // namespace
}  // namespace bridge::training
