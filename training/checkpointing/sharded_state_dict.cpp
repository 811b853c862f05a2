// Megatron-Core's torch_dist keys and chunks for bridge's parameters (see sharded_state_dict.h).
#include "training/checkpointing/sharded_state_dict.h"

#include <algorithm>
#include <array>
#include <stdexcept>

#include "bridge/models/moe/moe_config.h"
#include "utils/dcp.h"

namespace bridge::training {
namespace dc = parallel::dist_checkpointing;
namespace {

constexpr char kLayers[] = "decoder.layers.";
constexpr char kLocalExperts[] = "mlp.experts.local_experts.";
constexpr char kStackedExperts[] = "mlp.experts.experts.";

// The number at the start of `text` and what follows its dot: "12.mlp..." -> 12, "mlp...". Throws naming `name`.
int64_t leading_index(const std::string& text, std::string& rest, const std::string& name) {
  const std::size_t dot = text.find('.');
  try {
    std::size_t used = 0;
    const int64_t index = std::stoll(text.substr(0, dot), &used);
    if (dot != std::string::npos && used == dot && index >= 0) {
      rest = text.substr(dot + 1);
      return index;
    }
  } catch (const std::exception&) {
  }
  throw std::invalid_argument("sharded_key: " + name + " has no index where one was expected");
}

}  // namespace

ShardedKeyOptions ShardedKeyOptions::from(const models::GPTConfig& config) {
  ShardedKeyOptions options;
  options.num_layers = config.num_layers;
  options.num_experts = config.num_moe_experts.value_or(0);
  // Megatron-Core's TransformerBlock stacks its layers unless they differ: an MoE layer frequency given as a pattern,
  // or as an interval above 1, mixes dense and MoE layers (non_homogeneous_layers).
  options.homogeneous_layers =
      options.num_experts == 0 || (config.moe_layer_freq.pattern.empty() && config.moe_layer_freq.every == 1);
  return options;
}

std::string sharded_key(const std::string& name, const ShardedKeyOptions& options, int64_t* layer_out,
                        int64_t* expert_out) {
  int64_t layer = -1, expert = -1;
  std::string key = name;
  if (name.rfind(kLayers, 0) == 0) {
    std::string rest;
    layer = leading_index(name.substr(sizeof(kLayers) - 1), rest, name);
    if (rest.rfind(kLocalExperts, 0) == 0) {
      std::string after;
      expert = leading_index(rest.substr(sizeof(kLocalExperts) - 1), after, name);
      rest = kStackedExperts + after;
    }
    key = options.homogeneous_layers ? kLayers + rest : kLayers + std::to_string(layer) + "." + rest;
  }
  if (layer_out != nullptr) *layer_out = layer;
  if (expert_out != nullptr) *expert_out = expert;
  return key;
}

std::vector<ShardedChunk> sharded_chunks(const std::string& name, const dc::ShardedTensorLayout& layout,
                                         const ShardedKeyOptions& options) {
  int64_t layer = -1, expert = -1;
  ShardedChunk base;
  base.key = sharded_key(name, options, &layer, &expert);
  // A prepended axis: the index's place among `count` (the layers, the experts).
  const auto prepend = [&](int64_t index, int64_t count, const char* what) {
    if (index >= count) {
      throw std::invalid_argument(name + ": " + what + " " + std::to_string(index) + " of a model of " +
                                  std::to_string(count) + " " + what + "s");
    }
    base.global_shape.push_back(count);
    base.offsets.push_back(index);
    base.sizes.push_back(1);
  };
  if (layer >= 0 && options.homogeneous_layers) prepend(layer, options.num_layers, "layer");
  if (expert >= 0) prepend(expert, options.num_experts, "expert");
  base.prepended = static_cast<int64_t>(base.offsets.size());
  for (int64_t size : layout.global_shape) {
    base.global_shape.push_back(size);
    base.offsets.push_back(0);
    base.sizes.push_back(size);
  }
  if (layout.replicated()) return {base};
  std::vector<ShardedChunk> chunks;
  for (const dc::ShardedTensorLayout::Block& block : layout.blocks) {
    ShardedChunk chunk = base;
    const std::size_t dim = static_cast<std::size_t>(base.prepended + layout.partition_dim);
    chunk.offsets[dim] = block.global_start;
    chunk.sizes[dim] = block.length;
    chunk.local_dim = layout.partition_dim;
    chunk.local_start = block.local_start;
    chunk.local_length = block.length;
    chunks.push_back(std::move(chunk));
  }
  return chunks;
}

torch::Tensor chunk_data(const torch::Tensor& local, const ShardedChunk& chunk) {
  const torch::Tensor part =
      chunk.local_dim < 0 ? local : local.narrow(chunk.local_dim, chunk.local_start, chunk.local_length);
  return part.view(chunk.sizes);
}

std::vector<FlatBox> flat_range_boxes(const std::vector<ShardedChunk>& chunks, c10::IntArrayRef local_shape,
                                      int64_t begin, int64_t end) {
  if (local_shape.size() > 2) {
    throw std::invalid_argument("flat_range_boxes: a " + std::to_string(local_shape.size()) +
                                "-D parameter (only 1-D and 2-D ones are sharded by element ranges)");
  }
  // The range as boxes of a [rows, cols] view: a 1-D tensor is one row.
  const int64_t cols = local_shape.back();
  std::vector<std::array<int64_t, 4>> boxes;  // row, rows, col, cols
  int64_t at = begin;
  while (at < end) {
    const int64_t row = at / cols, col = at % cols;
    if (col != 0 || end - at < cols) {
      const int64_t width = std::min(cols - col, end - at);
      boxes.push_back({row, 1, col, width});
      at += width;
    } else {
      const int64_t rows = (end - at) / cols;
      boxes.push_back({row, rows, 0, cols});
      at += rows * cols;
    }
  }
  std::vector<FlatBox> out;
  const bool two_d = local_shape.size() == 2;
  for (const ShardedChunk& chunk : chunks) {
    for (const auto& [row, rows, col, width] : boxes) {
      // The box in the local tensor's dims, then its overlap with the chunk along the chunk's local dim.
      std::vector<int64_t> lo = two_d ? std::vector<int64_t>{row, col} : std::vector<int64_t>{col};
      std::vector<int64_t> len = two_d ? std::vector<int64_t>{rows, width} : std::vector<int64_t>{width};
      if (chunk.local_dim >= 0) {
        const auto d = static_cast<std::size_t>(chunk.local_dim);
        const int64_t start = std::max(lo[d], chunk.local_start);
        const int64_t stop = std::min(lo[d] + len[d], chunk.local_start + chunk.local_length);
        if (stop <= start) continue;
        lo[d] = start;
        len[d] = stop - start;
      }
      FlatBox box;
      box.chunk = chunk;
      box.local_offsets = lo;
      box.local_sizes = len;
      for (std::size_t d = 0; d < lo.size(); ++d) {
        const std::size_t global = static_cast<std::size_t>(chunk.prepended) + d;
        const int64_t chunk_local_start =
            chunk.local_dim == static_cast<int64_t>(d) ? chunk.local_start : 0;  // the chunk's first local index
        box.chunk.offsets[global] = chunk.offsets[global] + lo[d] - chunk_local_start;
        box.chunk.sizes[global] = len[d];
      }
      out.push_back(std::move(box));
    }
  }
  return out;
}

torch::Tensor flat_box_data(const torch::Tensor& flat, c10::IntArrayRef local_shape, int64_t begin,
                            const FlatBox& box) {
  const bool two_d = local_shape.size() == 2;
  const int64_t cols = local_shape.back();
  const int64_t row = two_d ? box.local_offsets[0] : 0, rows = two_d ? box.local_sizes[0] : 1;
  const int64_t col = box.local_offsets.back(), width = box.local_sizes.back();
  torch::Tensor part;
  if (rows == 1) {
    part = flat.narrow(0, row * cols + col - begin, width);
  } else {
    part = flat.narrow(0, row * cols - begin, rows * cols).view({rows, cols}).narrow(1, col, width);
  }
  return part.reshape(box.chunk.sizes);
}

std::vector<NamedPart> named_parts(const std::string& key, const std::vector<int64_t>& global_shape,
                                   const ShardedKeyOptions& options) {
  if (key.rfind(kLayers, 0) != 0) return {{key, {}}};
  std::string rest = key.substr(sizeof(kLayers) - 1);
  std::vector<NamedPart> layers;
  std::size_t axis = 0;
  if (options.homogeneous_layers) {
    if (global_shape.empty()) throw std::invalid_argument(key + " has no layer axis");
    for (int64_t layer = 0; layer < global_shape[0]; ++layer) {
      layers.push_back({kLayers + std::to_string(layer) + "." + rest, {layer}});
    }
    axis = 1;
  } else {
    layers.push_back({key, {}});
  }
  std::vector<NamedPart> out;
  for (const NamedPart& layer : layers) {
    const std::size_t experts_at = layer.name.find(kStackedExperts);
    if (experts_at == std::string::npos) {
      out.push_back(layer);
      continue;
    }
    if (global_shape.size() <= axis) throw std::invalid_argument(key + " has no expert axis");
    const std::string before = layer.name.substr(0, experts_at);
    const std::string after = layer.name.substr(experts_at + sizeof(kStackedExperts) - 1);
    for (int64_t expert = 0; expert < global_shape[axis]; ++expert) {
      NamedPart part{before + kLocalExperts + std::to_string(expert) + "." + after, layer.prefix};
      part.prefix.push_back(expert);
      out.push_back(std::move(part));
    }
  }
  return out;
}

std::string distributed_optimizer_domain_key(int64_t dp_group_idx, const std::string& name) {
  return "optimizer.distributed.dp_group_idx_" + std::to_string(dp_group_idx) + "." + name;
}

std::string distributed_optimizer_bucket_key(int64_t dp_group_idx, int64_t gbuf_idx, c10::ScalarType param_dtype,
                                             c10::ScalarType grad_dtype, int64_t bucket_idx) {
  // The dtype part is Python's repr of Megatron-Core's (param_dtype, grad_dtype) tuple.
  const std::string dtypes = "(torch." + bridge::utils::dcp::dtype_name(param_dtype) + ", torch." +
                             bridge::utils::dcp::dtype_name(grad_dtype) + ")";
  return distributed_optimizer_domain_key(dp_group_idx, "gbuf_idx_" + std::to_string(gbuf_idx) + ".dtype_" + dtypes +
                                                            ".bucket_idx_" + std::to_string(bucket_idx));
}

std::vector<BucketSlice> bucket_slices(const std::vector<int64_t>& offsets, const std::vector<int64_t>& numels,
                                       int64_t numel_unpadded, int64_t shard_begin, int64_t shard_end) {
  if (offsets.size() != numels.size()) throw std::invalid_argument("bucket_slices: offsets and numels differ in size");
  const int64_t end = std::min(shard_end, numel_unpadded);
  std::vector<BucketSlice> slices;
  int64_t at = shard_begin;  // the first element not covered yet
  for (std::size_t i = 0; i < offsets.size() && at < end; ++i) {
    const int64_t first = std::max(at, offsets[i]);
    const int64_t last = std::min(end, offsets[i] + numels[i]);
    if (first >= last) continue;
    if (first > at) slices.push_back({-1, at, 0, first - at});
    slices.push_back({static_cast<int64_t>(i), first, first - offsets[i], last - first});
    at = last;
  }
  if (at < end) slices.push_back({-1, at, 0, end - at});
  return slices;
}

bool is_vocab_padded(const std::string& name) {
  return name == "embedding.word_embeddings.weight" || name == "output_layer.weight";
}

}  // namespace bridge::training
