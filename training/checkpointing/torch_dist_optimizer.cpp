// The optimizer's layouts in torch_dist checkpoints: model space and Megatron-Core's dp_reshardable buckets (see
// torch_dist_optimizer.h).
#include "training/checkpointing/torch_dist_optimizer.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>

#include "parallel/parallel_state.h"
#include "training/checkpointing/checkpointing_internal.h"
#include "training/optimizer/optimizer.h"
#include "utils/torch_pickle.h"

namespace bridge::training {
namespace {

using GenericDict = c10::impl::GenericDict;
using GenericList = c10::impl::GenericList;

constexpr char kParamRanges[] = "param_ranges";
constexpr char kObjectShard[] = "/shard_0_1";  // a ShardedObject of shape (1,) at (0,)

// Megatron-Core's dp_group_idx: the rank in the model-parallel group, tp fastest then pp (its default order), for
// the dense buckets; the expert buckets (Megatron-Core's second optimizer) follow, one per (pp, ep, expert tp).
int64_t dp_group_idx(bool expert) {
  const int64_t tp = parallel::get_tensor_model_parallel_world_size();
  const int64_t pp_rank = parallel::get_pipeline_model_parallel_rank();
  if (!expert) return pp_rank * tp + parallel::get_tensor_model_parallel_rank();
  const int64_t pp = parallel::get_pipeline_model_parallel_world_size();
  const int64_t ep = parallel::get_expert_model_parallel_world_size();
  const int64_t etp = parallel::get_expert_tensor_parallel_world_size();
  return tp * pp + (pp_rank * ep + parallel::get_expert_model_parallel_rank()) * etp +
         parallel::get_expert_tensor_parallel_rank();
}

std::string bucket_key(const DistributedOptimizer::BucketLayout& bucket) {
  return distributed_optimizer_bucket_key(dp_group_idx(bucket.expert), bucket.buffer, bucket.param_dtype,
                                          bucket.grad_dtype, bucket.bucket);
}

// The optimizer's state tensors of one main param (empty before its first step).
std::map<std::string, torch::Tensor> state_tensors(const PretrainSetup& setup, const torch::Tensor& main_param) {
  std::map<std::string, torch::Tensor> out;
  auto& state = setup.optimizer->state();
  auto found = state.find(optimizer_state_key(main_param));
  if (found == state.end()) return out;
  if (auto* adam = dynamic_cast<torch::optim::AdamWParamState*>(found->second.get())) {
    out.emplace("exp_avg", adam->exp_avg());
    out.emplace("exp_avg_sq", adam->exp_avg_sq());
  } else if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(found->second.get())) {
    if (sgd->momentum_buffer().defined()) out.emplace("momentum_buffer", sgd->momentum_buffer());
  }
  return out;
}

int64_t layout_size(const GenericDict& layout, const char* field, int64_t otherwise) {
  const auto it = layout.find(c10::IValue(std::string(field)));
  return it == layout.end() ? otherwise : it->value().toInt();
}

}  // namespace

std::string optimizer_sharding_type(const PretrainSetup& setup) {
  return setup.distributed_optimizer && !setup.config.checkpoint.dist_ckpt_optim_fully_reshardable ? kDpReshardable
                                                                                                   : kFullyReshardable;
}

int64_t local_optimizer_step(const PretrainSetup& setup) {
  int64_t step = -1;
  for (const auto& [key, state] : setup.optimizer->state()) {
    if (auto* adam = dynamic_cast<torch::optim::AdamWParamState*>(state.get())) step = std::max(step, adam->step());
  }
  return step;
}

void add_model_space_optimizer_items(PretrainSetup& setup, const CheckpointParam& entry,
                                     const std::vector<ShardedChunk>& chunks, std::vector<SaveItem>& items) {
  const std::string& key = chunks.front().key;
  if (setup.distributed_optimizer) {
    // Each piece (a flat range of the parameter) as the boxes it covers: saved where it lies, never gathered.
    for (const DistributedOptimizer::Piece& piece : distributed_optimizer_pieces(entry.param)) {
      const int64_t begin = piece.offset, end = piece.offset + piece.model_view.numel();
      const std::vector<FlatBox> boxes = flat_range_boxes(chunks, entry.param.sizes(), begin, end);
      const auto add = [&](const std::string& name, const torch::Tensor& piece_values) {
        const torch::Tensor flat = piece_values.detach().reshape({-1});
        for (const FlatBox& box : boxes) {
          ShardedChunk chunk = box.chunk;
          chunk.key = std::string(kOptimizerState) + name + "." + key;
          items.push_back({chunk, flat_box_data(flat, entry.param.sizes(), begin, box)});
        }
      };
      if (entry.param.scalar_type() != torch::kFloat32) add("param", piece.main_param);
      for (const auto& [name, values] : state_tensors(setup, piece.main_param)) add(name, values);
    }
    return;
  }
  const auto add = [&](const std::string& name, const torch::Tensor& whole) {
    for (const ShardedChunk& chunk : chunks) {
      ShardedChunk renamed = chunk;
      renamed.key = std::string(kOptimizerState) + name + "." + key;
      items.push_back({renamed, chunk_data(whole.detach(), chunk)});
    }
  };
  if (setup.mixed_precision) add("fp32_param", entry.main_param);
  for (const auto& [name, values] : state_tensors(setup, entry.main_param)) add(name, values);
}

void add_dp_reshardable_items(PretrainSetup& setup, int64_t step, std::vector<SaveItem>& items) {
  // This rank's pieces by (parameter, offset within it): the slices bucket_slices finds are exactly these.
  std::map<std::pair<const c10::TensorImpl*, int64_t>, const DistributedOptimizer::Piece*> pieces;
  for (const DistributedOptimizer::Piece& piece : setup.distributed_optimizer->pieces())
    pieces.emplace(std::make_pair(piece.model_param.unsafeGetTensorImpl(), piece.offset), &piece);
  const bool adam = dynamic_cast<torch::optim::AdamW*>(setup.optimizer.get()) != nullptr;
  for (const DistributedOptimizer::BucketLayout& bucket : setup.distributed_optimizer->bucket_layouts()) {
    std::vector<int64_t> numels;
    for (const torch::Tensor& param : bucket.params) numels.push_back(param.numel());
    const std::string key = bucket_key(bucket);
    const auto add = [&](const std::string& name, const BucketSlice& slice, torch::Tensor data) {
      ShardedChunk chunk;
      chunk.key = key + "." + name;
      chunk.global_shape = {bucket.numel_unpadded};
      chunk.offsets = {slice.bucket_offset};
      chunk.sizes = {slice.length};
      items.push_back({std::move(chunk), data.detach().reshape({slice.length})});
    };
    for (const BucketSlice& slice :
         bucket_slices(bucket.offsets, numels, bucket.numel_unpadded, bucket.shard_begin, bucket.shard_end)) {
      if (slice.param < 0) {  // a gap between parameters: zeros, so the chunks cover the bucket
        const torch::Tensor zeros = torch::zeros({slice.length}, torch::kFloat32);
        add("param", slice, zeros);
        if (adam && step >= 0) {
          add("exp_avg", slice, zeros);
          add("exp_avg_sq", slice, zeros);
        }
        continue;
      }
      const torch::Tensor& param = bucket.params[static_cast<std::size_t>(slice.param)];
      auto found = pieces.find({param.unsafeGetTensorImpl(), slice.param_offset});
      if (found == pieces.end() || found->second->model_view.numel() != slice.length) {
        throw std::logic_error("the dp_reshardable save found no piece of the distributed optimizer at element " +
                               std::to_string(slice.bucket_offset) + " of " + key +
                               "; report it with the ddp.* and "
                               "parallelism.* settings");
      }
      const DistributedOptimizer::Piece& piece = *found->second;
      add("param", slice, piece.main_param);
      const std::map<std::string, torch::Tensor> state = state_tensors(setup, piece.main_param);
      if (adam && step >= 0 && state.size() != 2) {
        throw std::logic_error("the dp_reshardable save found a piece without AdamW state after step " +
                               std::to_string(step) + " in " + key);
      }
      for (const auto& [name, values] : state) add(name, slice, values);
    }
  }
}

void add_dp_reshardable_objects(PretrainSetup& setup, int64_t step,
                                std::vector<std::pair<std::string, std::string>>& objects) {
  // The global name of each parameter this rank holds (the tied copy under the embedding's).
  std::unordered_map<const c10::TensorImpl*, std::string> names;
  for (const CheckpointParam& entry : checkpoint_params(setup)) {
    if (!entry.buffer) names.emplace(entry.param.unsafeGetTensorImpl(), entry.source_name());
  }
  struct Domain {
    GenericList numel{c10::AnyType::get()}, unpadded{c10::AnyType::get()};  // per buffer: {dtypes: [per bucket]}
    GenericDict ranges = new_checkpoint_dict();
  };
  std::map<bool, Domain> domains;  // by expert: only those whose data-parallel rank 0 this rank is
  for (const DistributedOptimizer::BucketLayout& bucket : setup.distributed_optimizer->bucket_layouts()) {
    if (bucket.group->rank() != 0) continue;
    Domain& domain = domains[bucket.expert];
    const std::string dtypes = "(torch." + bridge::utils::dcp::dtype_name(bucket.param_dtype) + ", torch." +
                               bridge::utils::dcp::dtype_name(bucket.grad_dtype) + ")";
    for (GenericList* list : {&domain.numel, &domain.unpadded}) {
      if (static_cast<int64_t>(list->size()) <= bucket.buffer) {
        GenericDict per_dtype = new_checkpoint_dict();
        per_dtype.insert(dtypes, GenericList(c10::AnyType::get()));
        list->push_back(per_dtype);
      }
    }
    const auto append = [&](GenericList& list, int64_t value) {
      list.get(static_cast<std::size_t>(bucket.buffer)).toGenericDict().at(dtypes).toList().push_back(value);
    };
    append(domain.numel, bucket.numel);
    append(domain.unpadded, bucket.numel_unpadded);
    const std::string key = bucket_key(bucket);
    for (std::size_t i = 0; i < bucket.params.size(); ++i) {
      GenericList range(c10::AnyType::get());
      range.push_back(key);
      range.push_back(bucket.offsets[i]);
      range.push_back(bucket.params[i].numel());
      domain.ranges.insert(names.at(bucket.params[i].unsafeGetTensorImpl()), range);
    }
  }
  for (auto& [expert, domain] : domains) {
    const int64_t g = dp_group_idx(expert);
    const auto add = [&](const std::string& name, const c10::IValue& value) {
      objects.emplace_back(distributed_optimizer_domain_key(g, name) + kObjectShard,
                           bridge::utils::torch_pickle_bytes(value));
    };
    add("per_bucket_numel", domain.numel);
    add("per_bucket_numel_unpadded", domain.unpadded);
    add(kParamRanges, domain.ranges);
    GenericDict optimizer = new_checkpoint_dict();  // bridge's optimizer dict (the common state's), not param_groups
    optimizer.insert("optimizer_type", setup.config.optimizer.optimizer);
    optimizer.insert("step", step);
    add("optimizer", optimizer);
    if (const GradScaler* scaler = setup.grad_scaler()) add("grad_scaler", grad_scaler_state(*scaler));
  }
}

std::string dp_reshardable_layout_differences(const GenericDict& common, const ModelParallelSizes& run,
                                              const std::string& run_name) {
  const auto found = common.find(c10::IValue(std::string("parallel_layout")));
  const GenericDict layout =
      found != common.end() && found->value().isGenericDict() ? found->value().toGenericDict() : new_checkpoint_dict();
  const int64_t saved_tp = layout_size(layout, "tensor_model_parallel_size", -1);
  const std::pair<const char*, std::pair<int64_t, int64_t>> sizes[] = {
      {"tensor_model_parallel_size", {saved_tp, run.tp}},
      {"pipeline_model_parallel_size", {layout_size(layout, "pipeline_model_parallel_size", -1), run.pp}},
      {"virtual_pipeline_model_parallel_size",
       {layout_size(layout, "virtual_pipeline_model_parallel_size", 1), run.vpp}},
      {"expert_model_parallel_size", {layout_size(layout, "expert_model_parallel_size", 1), run.ep}},
      {"expert_tensor_parallel_size", {layout_size(layout, "expert_tensor_parallel_size", saved_tp), run.etp}},
  };
  std::string differs;
  for (const auto& [field, values] : sizes) {
    if (values.first == values.second) continue;
    if (!run.experts && std::string_view(field).rfind("expert_", 0) == 0)
      continue;  // a dense model has no expert buckets
    differs += std::string(differs.empty() ? "" : ", ") + field + " " + std::to_string(values.first) + " (" + run_name +
               ": " + std::to_string(values.second) + ")";
  }
  return differs;
}

DpReshardableReader::DpReshardableReader(const PretrainSetup& setup, const bridge::utils::dcp::Reader& reader,
                                         const GenericDict& common)
    : reader_(reader) {
  const std::string path = reader.directory().string();
  const std::string fix =
      ". Save it with checkpoint.dist_ckpt_optim_fully_reshardable=true or load it in the saved layout (or set "
      "checkpoint.no_load_optim=true to take the weights alone)";
  // Its buckets belong to one tensor-, pipeline- and expert-parallel layout; the data-parallel size may change.
  const std::string differs = dp_reshardable_layout_differences(
      common, {parallel::get_tensor_model_parallel_world_size(), parallel::get_pipeline_model_parallel_world_size(),
               static_cast<int64_t>(setup.model.size()), parallel::get_expert_model_parallel_world_size(),
               parallel::get_expert_tensor_parallel_world_size(), setup.config.model.num_moe_experts.has_value()});
  if (!differs.empty()) {
    throw std::runtime_error("the checkpoint " + path +
                             " holds the distributed optimizer's state in Megatron-Core's dp_reshardable layout, "
                             "which loads only in the tensor-, pipeline- and expert-parallel layout it was saved in "
                             "(any data-parallel size): " +
                             differs + fix);
  }
  const std::vector<std::string> objects = reader.byte_items();
  for (const bool expert : {false, true}) {
    const std::string key = distributed_optimizer_domain_key(dp_group_idx(expert), kParamRanges) + kObjectShard;
    if (std::find(objects.begin(), objects.end(), key) == objects.end()) {
      if (expert) continue;  // a dense model has no expert domain
      throw std::runtime_error("the checkpoint " + path +
                               " holds the distributed optimizer's dp_reshardable state without " + key +
                               " (bridge's parameter ranges; Megatron-Core does not write them), so its buckets "
                               "cannot be matched to this run's parameters" +
                               fix);
    }
    const c10::IValue ranges = bridge::utils::load_torch_pickle_bytes(reader.read_bytes(key), path + " " + key);
    if (!ranges.isGenericDict())
      throw bridge::utils::DamagedFileError(path + ": " + key + " is not a dict; it is damaged");
    for (const auto& item : ranges.toGenericDict()) {
      const auto& range = item.value().toListRef();
      ranges_[{expert, item.key().toStringRef()}] = {range.at(0).toStringRef(), range.at(1).toInt(),
                                                     range.at(2).toInt()};
    }
  }
}

std::optional<torch::Tensor> DpReshardableReader::read(const CheckpointParam& entry, const std::string& state) const {
  const std::string& name = entry.source_name();
  const auto found = ranges_.find({entry.expert, name});
  if (found == ranges_.end() || found->second.numel != entry.param.numel()) {
    const std::string what = found == ranges_.end()
                                 ? "has no range for " + name
                                 : "has " + std::to_string(found->second.numel) + " elements of " + name +
                                       " where this run's rank holds " + std::to_string(entry.param.numel());
    throw std::runtime_error("the checkpoint " + reader_.directory().string() + "'s dp_reshardable optimizer state " +
                             what +
                             ": it was saved in another layout. Save it with "
                             "checkpoint.dist_ckpt_optim_fully_reshardable=true or load it in the saved layout");
  }
  const Range& range = found->second;
  const std::string key = range.bucket_key + "." + state;
  if (reader_.tensors().count(key) == 0) return std::nullopt;
  // The ranges this rank needs: its pieces' under the distributed optimizer, else the whole parameter.
  std::vector<std::pair<int64_t, int64_t>> needed;
  if (sharded_by_distributed_optimizer(entry.param)) {
    for (const DistributedOptimizer::Piece& piece : distributed_optimizer_pieces(entry.param))
      needed.emplace_back(piece.offset, piece.model_view.numel());
  } else {
    needed.emplace_back(0, entry.param.numel());
  }
  torch::Tensor local = torch::zeros({entry.param.numel()}, torch::kFloat32);
  for (const auto& [offset, length] : needed) {
    local.narrow(0, offset, length).copy_(reader_.read(key, {range.offset + offset}, {length}));
  }
  return local.view(entry.param.sizes());
}

}  // namespace bridge::training
