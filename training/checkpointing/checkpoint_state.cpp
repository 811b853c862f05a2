// A rank's checkpoint dict (save side) and loading it back into the model, the fp32 main params, the optimizer, the
// scheduler, the counters and the RNG streams, slice by slice through the shard metadata; which rank writes which
// tensors (dense ones on data-parallel rank 0, MoE experts on expert data-parallel rank 0).
#include "training/checkpointing/checkpoint_state.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/param_attributes.h"
#include "parallel/tensor_parallel/random.h"
#include "training/checkpointing/sharded_state_dict.h"
#include "training/config/config_yaml.h"
#include "training/optimizer/optimizer.h"

namespace bridge::training {
namespace dc = parallel::dist_checkpointing;
namespace {

using GenericDict = c10::impl::GenericDict;
using GenericList = c10::impl::GenericList;

constexpr char kWordEmbeddings[] = "embedding.word_embeddings.weight";

// The module buffers a checkpoint keeps, Megatron-Core's persistent ones: the router's aux-loss-free expert_bias, which
// training moves step by step (a resume without it would route differently). The router's token counts restart each
// step and are not saved (Megatron-Core's non-persistent local_tokens_per_expert).
constexpr char kPersistentBufferSuffix[] = ".mlp.router.expert_bias";

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A chunk's buffer "layers.<local index>.<rest>" under its global name "decoder.layers.<global index>.<rest>", as
// models::global_named_parameters names the parameters.
std::string global_buffer_name(const models::GPTModel& chunk, const std::string& local) {
  const std::string prefix = "layers.";
  if (local.rfind(prefix, 0) != 0) return local;
  const std::size_t dot = local.find('.', prefix.size());
  const int64_t layer = std::stoll(local.substr(prefix.size(), dot - prefix.size()));
  return "decoder.layers." + std::to_string(chunk->chunk_options().first_layer + layer) + local.substr(dot);
}

GenericList new_list() { return GenericList(c10::AnyType::get()); }

// A detached, contiguous CPU copy that owns its storage (a view would save its whole base storage).
torch::Tensor snapshot(const torch::Tensor& tensor) {
  return tensor.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
}

GenericDict tensor_map(const std::map<std::string, torch::Tensor>& tensors) {
  GenericDict dict = new_checkpoint_dict();
  for (const auto& [name, tensor] : tensors) dict.insert(name, snapshot(tensor));
  return dict;
}

// The vocabulary-padded tensors: their first dimension may differ between layouts (padding to a multiple of tp).

std::string shape_string(c10::IntArrayRef shape) { return c10::str(shape); }

}  // namespace

c10::impl::GenericDict new_checkpoint_dict() { return GenericDict(c10::AnyType::get(), c10::AnyType::get()); }

c10::IValue checkpoint_field(const c10::impl::GenericDict& dict, const std::string& key, const std::string& what) {
  auto it = dict.find(c10::IValue(key));
  if (it == dict.end()) {
    throw std::runtime_error(what + " has no '" + key +
                             "' entry: it is damaged or not a bridge checkpoint; point checkpoint.load at another one");
  }
  return it->value();
}

c10::impl::GenericDict checkpoint_dict(const c10::impl::GenericDict& dict, const std::string& key,
                                       const std::string& what) {
  c10::IValue value = checkpoint_field(dict, key, what);
  if (!value.isGenericDict()) throw std::runtime_error(what + ": '" + key + "' is not a dict; the file is damaged");
  return value.toGenericDict();
}

const std::string& CheckpointParam::source_name() const {
  static const std::string word_embeddings = kWordEmbeddings;
  return tied_copy ? word_embeddings : name;
}

std::string model_parallel_directory_name(int tp_rank, int pp_rank, int pp_size, int ep_rank, int ep_size) {
  // Megatron's get_checkpoint_name: the pipeline rank only with a pipeline, the expert-parallel rank only with
  // expert parallelism (so a dense checkpoint keeps the names it always had).
  char name[48];
  int used = std::snprintf(name, sizeof(name), "mp_rank_%02d", tp_rank);
  if (pp_size > 1) used += std::snprintf(name + used, sizeof(name) - used, "_%03d", pp_rank);
  if (ep_size > 1) std::snprintf(name + used, sizeof(name) - used, "_%03d", ep_rank);
  return name;
}

int data_parallel_rank_with_cp(const PretrainSetup& setup) {
  return parallel::model_parallel_is_initialized() ? parallel::get_data_parallel_rank(/*with_context_parallel=*/true)
                                                   : setup.data_parallel_rank;
}

int data_parallel_size_with_cp(const PretrainSetup& setup) {
  return parallel::model_parallel_is_initialized()
             ? parallel::get_data_parallel_world_size(/*with_context_parallel=*/true)
             : setup.data_parallel_size;
}

CheckpointWriter checkpoint_writer(const PretrainSetup& setup) {
  CheckpointWriter writer;
  writer.dense = data_parallel_rank_with_cp(setup) == 0;
  // Without expert-parallel groups the experts are dense parameters (attribute allreduce true), and the expert
  // data-parallel rank says nothing about which rank writes them.
  writer.experts =
      parallel::tensor_parallel::expert_parallel_groups_in_use() && parallel::get_expert_data_parallel_rank() == 0;
  return writer;
}

std::vector<CheckpointParam> checkpoint_params(const PretrainSetup& setup) {
  std::unordered_map<const c10::TensorImpl*, std::size_t> index;
  for (std::size_t i = 0; i < setup.params.size(); ++i) index.emplace(setup.params[i].unsafeGetTensorImpl(), i);
  std::vector<CheckpointParam> params(setup.params.size());
  for (const models::GPTModel& chunk : setup.model) {
    for (auto& [name, param] : models::global_named_parameters(chunk)) {
      auto found = index.find(param.unsafeGetTensorImpl());
      if (found == index.end()) continue;  // frozen
      CheckpointParam& entry = params[found->second];
      entry.name = name;
      entry.param = param;
      entry.main_param = setup.mixed_precision ? setup.mixed_precision->main_params()[found->second] : param;
      entry.layout = dc::sharded_tensor_layout(param);
      entry.tied_copy = !parallel::tensor_parallel::param_is_not_shared(param);
      entry.expert = parallel::tensor_parallel::is_expert_parallel_param(param);
    }
  }
  for (const CheckpointParam& entry : params) {
    if (entry.name.empty()) throw std::logic_error("checkpoint_params: a trainable parameter has no global name");
  }
  for (const models::GPTModel& chunk : setup.model) {
    for (const auto& item : chunk->named_buffers()) {
      if (!ends_with(item.key(), kPersistentBufferSuffix)) continue;
      CheckpointParam entry;
      entry.name = global_buffer_name(chunk, item.key());
      entry.param = entry.main_param = item.value();
      entry.layout.global_shape = item.value().sizes().vec();  // replicated: the same on every rank
      entry.buffer = true;
      params.push_back(std::move(entry));
    }
  }
  return params;
}

c10::impl::GenericDict shared_state_dict(PretrainSetup& setup, int64_t iteration) {
  GenericDict top = new_checkpoint_dict();
  top.insert("checkpoint_version", kCheckpointVersion);
  top.insert(kQkvLayoutKey, std::string(kQkvLayoutGrouped));
  top.insert("iteration", iteration);
  top.insert("config", to_yaml(setup.config));

  GenericDict layout = new_checkpoint_dict();
  layout.insert("tensor_model_parallel_size", static_cast<int64_t>(parallel::get_tensor_model_parallel_world_size()));
  layout.insert("pipeline_model_parallel_size",
                static_cast<int64_t>(parallel::get_pipeline_model_parallel_world_size()));
  layout.insert("virtual_pipeline_model_parallel_size", static_cast<int64_t>(setup.model.size()));
  layout.insert("data_parallel_size", static_cast<int64_t>(setup.data_parallel_size));
  layout.insert("context_parallel_size", static_cast<int64_t>(parallel::get_context_parallel_world_size()));
  layout.insert("tensor_model_parallel_rank", static_cast<int64_t>(parallel::get_tensor_model_parallel_rank()));
  layout.insert("pipeline_model_parallel_rank", static_cast<int64_t>(parallel::get_pipeline_model_parallel_rank()));
  // The expert layout: a load in the same one takes this file's RNG streams as its own (a file without these
  // entries was saved at expert_model_parallel_size 1 and the expert tensor-parallel size of the dense one).
  layout.insert("expert_model_parallel_size", static_cast<int64_t>(parallel::get_expert_model_parallel_world_size()));
  layout.insert("expert_tensor_parallel_size", static_cast<int64_t>(parallel::get_expert_tensor_parallel_world_size()));
  layout.insert("expert_model_parallel_rank", static_cast<int64_t>(parallel::get_expert_model_parallel_rank()));
  layout.insert("expert_tensor_parallel_rank", static_cast<int64_t>(parallel::get_expert_tensor_parallel_rank()));
  top.insert("parallel_layout", layout);

  const TrainState& train_state = setup.state.train_state;
  GenericDict progress = new_checkpoint_dict();
  progress.insert("step", train_state.step);
  progress.insert("consumed_train_samples", train_state.consumed_train_samples);
  progress.insert("skipped_train_samples", train_state.skipped_train_samples);
  progress.insert("consumed_valid_samples", train_state.consumed_valid_samples);
  progress.insert("floating_point_operations_so_far", train_state.floating_point_operations_so_far);
  top.insert("train_state", progress);

  GenericDict scheduler = new_checkpoint_dict();
  const OptimizerParamSchedulerOptions& options = setup.scheduler->options();
  scheduler.insert("num_steps", setup.scheduler->num_steps());
  scheduler.insert("max_lr", options.max_lr);
  scheduler.insert("min_lr", options.min_lr);
  scheduler.insert("lr_warmup_steps", options.lr_warmup_steps);
  scheduler.insert("lr_decay_steps", options.lr_decay_steps);
  scheduler.insert("lr_decay_style", setup.config.scheduler.lr_decay_style);
  top.insert("opt_param_scheduler", scheduler);
  return top;
}

c10::impl::GenericDict grad_scaler_state(const GradScaler& scaler) {
  GenericDict state = new_checkpoint_dict();
  state.insert("scale", scaler.scale());
  state.insert("growth_tracker", scaler.growth_tracker());
  state.insert("hysteresis_tracker", scaler.hysteresis_tracker());
  return state;
}

c10::impl::GenericList rng_state_list() {
  const parallel::tensor_parallel::RngStates rng = parallel::tensor_parallel::get_all_rng_states();
  GenericDict rng_state = new_checkpoint_dict();
  rng_state.insert("torch_rng_state", snapshot(rng.cpu));
  if (rng.cuda.defined()) rng_state.insert("cuda_rng_state", snapshot(rng.cuda));
  rng_state.insert("rng_tracker_states", tensor_map(rng.tracker));
  GenericList rng_list = new_list();
  rng_list.push_back(rng_state);
  return rng_list;
}

c10::impl::GenericDict rank_state_dict(PretrainSetup& setup, const std::vector<CheckpointParam>& params,
                                       int64_t iteration, const DistributedOptimizer::WholeState* whole) {
  GenericDict top = shared_state_dict(setup, iteration);

  // Model, fp32 main params and optimizer state under the global names; the tied copy is the embedding's.
  std::map<std::string, torch::Tensor> model, main_params;
  GenericDict metadata = new_checkpoint_dict();
  GenericDict state = new_checkpoint_dict();
  GenericList names = new_list();
  auto& optimizer_state = setup.optimizer->state();
  // The distributed optimizer's whole state of a parameter under `key` (none: not saved).
  const auto whole_tensor = [&](const CheckpointParam& entry, const std::string& key) -> std::optional<torch::Tensor> {
    auto of = whole->tensors.find(entry.param.unsafeGetTensorImpl());
    if (of == whole->tensors.end()) return std::nullopt;
    auto found = of->second.find(key);
    if (found == of->second.end()) return std::nullopt;
    return found->second;
  };
  bool fp32_main_params = setup.mixed_precision != nullptr;
  for (const CheckpointParam& entry : params) {
    if (entry.tied_copy) continue;
    model.emplace(entry.name, entry.param);
    metadata.insert(entry.name, dc::to_ivalue(entry.layout));
    names.push_back(entry.name);
    if (entry.buffer) continue;  // in its own dtype (the fp32 expert_bias of a bf16 model); no optimizer state
    GenericDict param_state = new_checkpoint_dict();
    if (whole != nullptr) {
      if (std::optional<torch::Tensor> main = whole_tensor(entry, "main_param")) {
        main_params.emplace(entry.name, *main);
        fp32_main_params = true;
      }
      if (!whole->stepped) continue;
      if (setup.config.optimizer.optimizer == "adam") param_state.insert("step", whole->step);
      for (const char* key : {"exp_avg", "exp_avg_sq", "momentum_buffer"}) {
        if (std::optional<torch::Tensor> value = whole_tensor(entry, key)) param_state.insert(key, *value);
      }
      state.insert(entry.name, param_state);
      continue;
    }
    if (setup.mixed_precision) main_params.emplace(entry.name, entry.main_param);
    auto found = optimizer_state.find(optimizer_state_key(entry.main_param));
    if (found == optimizer_state.end()) continue;  // no step yet
    if (auto* adam = dynamic_cast<torch::optim::AdamWParamState*>(found->second.get())) {
      param_state.insert("step", adam->step());
      param_state.insert("exp_avg", snapshot(adam->exp_avg()));
      param_state.insert("exp_avg_sq", snapshot(adam->exp_avg_sq()));
      if (adam->max_exp_avg_sq().defined()) param_state.insert("max_exp_avg_sq", snapshot(adam->max_exp_avg_sq()));
    } else if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(found->second.get())) {
      if (sgd->momentum_buffer().defined()) param_state.insert("momentum_buffer", snapshot(sgd->momentum_buffer()));
    }
    state.insert(entry.name, param_state);
  }
  top.insert("model", tensor_map(model));
  top.insert("shard_metadata", metadata);

  // The groups by name. The distributed optimizer's groups hold pieces, some of them other ranks': its groups are
  // saved as build_optimizer splits whole parameters (matrices decayed, first; an empty group left out).
  GenericList groups = new_list();
  const auto add_group = [&](double lr, GenericList group_names) {
    if (group_names.empty()) return;
    GenericDict g = new_checkpoint_dict();
    g.insert("lr", lr);
    g.insert("params", std::move(group_names));
    groups.push_back(g);
  };
  if (whole != nullptr) {
    const double lr = setup.optimizer->param_groups().front().options().get_lr();
    for (const bool decayed : {true, false}) {
      GenericList group_names = new_list();
      for (const CheckpointParam& entry : params) {
        if (!entry.tied_copy && !entry.buffer && (entry.param.dim() > 1) == decayed) {
          group_names.push_back(entry.name);
        }
      }
      add_group(lr, group_names);
    }
  } else {
    for (const auto& group : setup.optimizer->param_groups()) {
      GenericList group_names = new_list();
      for (const torch::Tensor& p : group.params()) {
        for (const CheckpointParam& entry : params) {
          if (!entry.tied_copy && !entry.buffer && entry.main_param.unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) {
            group_names.push_back(entry.name);
          }
        }
      }
      add_group(group.options().get_lr(), group_names);
    }
  }
  GenericDict inner = new_checkpoint_dict();
  inner.insert("state", state);
  inner.insert("param_groups", groups);
  GenericDict optimizer = new_checkpoint_dict();
  optimizer.insert("optimizer", inner);
  optimizer.insert("optimizer_type", setup.config.optimizer.optimizer);
  if (fp32_main_params) optimizer.insert("fp32_from_fp16_params", tensor_map(main_params));
  if (const GradScaler* scaler = setup.grad_scaler()) optimizer.insert("grad_scaler", grad_scaler_state(*scaler));
  top.insert("optimizer", optimizer);

  top.insert("rng_state", rng_state_list());
  return top;
}

namespace {

// One saved slice of a tensor: the file, the tensor and where it sits.
struct Slice {
  const LoadedFile* file;
  torch::Tensor tensor;
  dc::ShardedTensorLayout layout;
};

// The optimizer state `file` holds for the parameter saved as `name` ({"step", "exp_avg", ...}); none before the
// first step.
std::optional<GenericDict> param_optimizer_state(const LoadedFile& file, const std::string& name) {
  const GenericDict optimizer =
      checkpoint_dict(checkpoint_dict(file.dict, "optimizer", file.path), "optimizer", file.path);
  const GenericDict state = checkpoint_dict(optimizer, "state", file.path);
  auto it = state.find(c10::IValue(name));
  if (it == state.end()) return std::nullopt;
  return it->value().toGenericDict();
}

// The dict of `file` that holds the tensors of `section` ("model", "fp32_from_fp16_params" or an optimizer-state
// key such as "exp_avg") under their names, with `name`'s optimizer state as the dict for an optimizer-state key;
// none when the file lacks the section.
std::optional<GenericDict> section_of(const LoadedFile& file, const std::string& name, const std::string& section) {
  if (section == "model") return checkpoint_dict(file.dict, "model", file.path);
  if (section == "fp32_from_fp16_params") {
    const GenericDict optimizer = checkpoint_dict(file.dict, "optimizer", file.path);
    auto it = optimizer.find(c10::IValue(section));
    if (it == optimizer.end()) return std::nullopt;
    return it->value().toGenericDict();
  }
  return param_optimizer_state(file, name);
}

// The slices of `name` under `section` in `files_of`'s files; empty when the section lacks it in every file.
std::vector<Slice> slices_of(const std::string& name, const std::map<std::string, LoadedFile>& files,
                             const std::map<std::string, std::vector<std::string>>& files_of,
                             const std::string& section) {
  std::vector<Slice> slices;
  auto holders = files_of.find(name);
  if (holders == files_of.end()) return slices;
  // Optimizer-state dicts are per parameter: the tensor sits under the state key, not under the name.
  const bool per_parameter = section != "model" && section != "fp32_from_fp16_params";
  for (const std::string& path : holders->second) {
    const LoadedFile& file = files.at(path);
    const std::optional<GenericDict> container = section_of(file, name, section);
    if (!container) continue;
    auto it = container->find(c10::IValue(per_parameter ? section : name));
    if (it == container->end()) continue;
    if (!it->value().isTensor()) throw std::runtime_error(file.path + ": " + section + "/" + name + " is not a tensor");
    const GenericDict metadata = checkpoint_dict(file.dict, "shard_metadata", file.path);
    slices.push_back({&file, it->value().toTensor(),
                      dc::layout_from_ivalue(checkpoint_field(metadata, name, file.path), name + " in " + file.path)});
  }
  return slices;
}

// Checks that `slices` fill `entry`'s part of the tensor: same global shape (the vocabulary's padding aside), the
// saved slice's shape matching its metadata, and every position covered once.
void check_slices(const CheckpointParam& entry, const std::vector<Slice>& slices, const std::string& what) {
  const std::string& name = entry.source_name();
  if (slices.empty()) throw std::runtime_error("the checkpoint has no " + what + " for " + name);
  const std::vector<int64_t>& want = entry.layout.global_shape;
  int64_t covered = 0;
  for (const Slice& slice : slices) {
    const std::vector<int64_t>& have = slice.layout.global_shape;
    bool compatible = have.size() == want.size();
    for (std::size_t d = 0; compatible && d < want.size(); ++d) {
      const bool padded_dim = is_vocab_padded(name) && static_cast<int64_t>(d) == entry.layout.partition_dim;
      compatible = have[d] == want[d] || padded_dim;
    }
    if (!compatible) {
      throw ModelMismatchError(what + " " + name + " in " + slice.file->path + " has the global shape " +
                               shape_string(have) + " in the checkpoint, " + shape_string(want) +
                               " in this run's model: the checkpoint is of another model");
    }
    std::vector<int64_t> local = have;
    if (!slice.layout.replicated()) {
      int64_t rows = 0;
      for (const auto& block : slice.layout.blocks) rows += block.length;
      local[static_cast<std::size_t>(slice.layout.partition_dim)] = rows;
    }
    if (slice.tensor.sizes().vec() != local) {
      throw std::runtime_error(what + " " + name + " in " + slice.file->path + " has the shape " +
                               shape_string(slice.tensor.sizes()) + " but its metadata says " + shape_string(local) +
                               "; the file is damaged");
    }
    covered += dc::count_overlap(entry.layout, slice.layout);
    if (slice.layout.replicated()) break;  // a whole tensor: one file gives all of it
  }
  const int64_t needed = dc::positions_needed(entry.layout, slices.front().layout);
  if (covered != needed) {
    throw std::runtime_error("the checkpoint's slices of " + what + " " + name + " cover " + std::to_string(covered) +
                             " of the " + std::to_string(needed) + " positions this rank needs (" +
                             entry.layout.describe() + "); a rank's file is missing or damaged");
  }
}

void copy_slices(torch::Tensor target, const CheckpointParam& entry, const std::vector<Slice>& slices) {
  for (const Slice& slice : slices) {
    dc::copy_overlap(target, entry.layout, slice.tensor, slice.layout);
    if (slice.layout.replicated()) break;
  }
}

// The state tensors each parameter of optimizer.optimizer `type` has.
std::vector<std::string> optimizer_keys(const std::string& type) {
  if (type == "adam") return {"exp_avg", "exp_avg_sq"};
  return {"momentum_buffer"};
}

// The optimizer state of `name` in the first file that holds any (every slice stepped together); none before the
// first step.
std::optional<GenericDict> first_optimizer_state(const std::string& name,
                                                 const std::map<std::string, LoadedFile>& files,
                                                 const std::map<std::string, std::vector<std::string>>& files_of) {
  auto holders = files_of.find(name);
  if (holders == files_of.end()) return std::nullopt;
  for (const std::string& path : holders->second) {
    if (std::optional<GenericDict> state = param_optimizer_state(files.at(path), name)) return state;
  }
  return std::nullopt;
}

// The distributed optimizer's pieces of `entry` take their elements of the saved whole tensors (any data-parallel
// size, with or without the distributed optimizer): a bf16 model's fp32 main params, and the optimizer state.
void load_distributed_optimizer_state(PretrainSetup& setup, const CheckpointParam& entry,
                                      const std::map<std::string, LoadedFile>& files,
                                      const std::map<std::string, std::vector<std::string>>& files_of,
                                      const LoadOptions& options, const std::vector<Slice>& model) {
  const std::string& name = entry.source_name();
  const auto whole_of = [&](const std::vector<Slice>& slices) {
    torch::Tensor whole = torch::zeros(entry.param.sizes(), torch::kFloat32);
    copy_slices(whole, entry, slices);
    return whole;
  };
  std::map<std::string, torch::Tensor> whole;
  if (entry.param.scalar_type() != torch::kFloat32) {
    // The fp32 main values where the checkpoint has them (saved under mixed precision), else the model's.
    std::vector<Slice> main = slices_of(name, files, files_of, "fp32_from_fp16_params");
    whole.emplace("main_param", whole_of(main.empty() ? model : main));
  }
  const std::optional<GenericDict> saved_state =
      options.optimizer ? first_optimizer_state(name, files, files_of) : std::nullopt;
  std::optional<int64_t> step;
  if (saved_state) {
    const auto found = saved_state->find(c10::IValue(std::string("step")));
    step = found != saved_state->end() ? found->value().toInt() : 0;
    for (const std::string& key : optimizer_keys(options.optimizer_type)) {
      std::vector<Slice> slices = slices_of(name, files, files_of, key);
      if (!slices.empty()) whole.emplace(key, whole_of(slices));
    }
  }
  setup.distributed_optimizer->load_state(*setup.optimizer, entry.param, whole, step);
}

}  // namespace

std::string model_differences(const std::string& saved_config_yaml, const ConfigContainer& config) {
  // The model.* keys that decide which tensors exist and their shapes; the others (dropout, initialisation, epsilon,
  // RoPE settings, recomputation) load into any value, so naming them would send a user to change what does not
  // matter. seq_length sizes only learned absolute positions' table.
  static constexpr const char* kShapeKeys[] = {"num_layers",
                                               "hidden_size",
                                               "ffn_hidden_size",
                                               "num_attention_heads",
                                               "num_query_groups",
                                               "kv_channels",
                                               "vocab_size",
                                               "make_vocab_size_divisible_by",
                                               "gated_linear_unit",
                                               "normalization",
                                               "qk_layernorm",
                                               "add_bias_linear",
                                               "add_qkv_bias",
                                               "share_embeddings_and_output_weights",
                                               "position_embedding_type",
                                               "num_moe_experts",
                                               "moe_layer_freq",
                                               "moe_ffn_hidden_size",
                                               "moe_shared_expert_intermediate_size",
                                               "moe_shared_expert_gate",
                                               "moe_router_enable_expert_bias",
                                               "seq_length"};
  constexpr int kListed = 6;
  std::vector<std::string> differing, overrides;
  try {
    const YAML::Node saved = YAML::Load(saved_config_yaml)["model"];
    const YAML::Node run = YAML::Load(to_yaml(config))["model"];
    if (!saved.IsMap() || !run.IsMap()) return "";
    const auto learned_positions = [](const YAML::Node& model) {
      const YAML::Node type = model["position_embedding_type"];
      return type && type.IsScalar() && type.as<std::string>() == "learned_absolute";
    };
    const bool positions_table = learned_positions(saved) || learned_positions(run);
    for (const std::string key : kShapeKeys) {
      if (key == "seq_length" && !positions_table) continue;
      const YAML::Node theirs = saved[key];
      const YAML::Node mine = run[key];
      if (!theirs || !mine) continue;
      YAML::Emitter theirs_text, mine_text;
      theirs_text << YAML::Flow << theirs;
      mine_text << YAML::Flow << mine;
      if (std::string(theirs_text.c_str()) == mine_text.c_str()) continue;
      differing.push_back("model." + key + " " + theirs_text.c_str() + " (this run: " + mine_text.c_str() + ")");
      overrides.push_back("model." + key + "=" + theirs_text.c_str());
    }
  } catch (const std::exception&) {  // a config of another version: the shapes alone must do
    return "";
  }
  if (differing.empty()) return "";
  std::string listed, fix;
  for (std::size_t i = 0; i < differing.size() && i < kListed; ++i) {
    listed += (i ? "; " : "") + differing[i];
    fix += (i ? " " : "") + overrides[i];
  }
  if (differing.size() > kListed) listed += "; and " + std::to_string(differing.size() - kListed) + " more";
  return ". The checkpoint's model.* differ from this run's: " + listed + ". Load it with its sizes (" + fix +
         "), or start a new run in another checkpoint.save";
}

void check_loadable(const std::vector<CheckpointParam>& params, const std::map<std::string, LoadedFile>& files,
                    const std::map<std::string, std::vector<std::string>>& files_of, const LoadOptions& options) {
  for (const CheckpointParam& entry : params) {
    const std::string& name = entry.source_name();
    check_slices(entry, slices_of(name, files, files_of, "model"), entry.buffer ? "the buffer" : "the parameter");
    if (entry.buffer || !options.optimizer || !first_optimizer_state(name, files, files_of)) continue;
    const LoadedFile& first = files.at(files_of.at(name).front());
    const std::string saved =
        checkpoint_field(checkpoint_dict(first.dict, "optimizer", first.path), "optimizer_type", first.path)
            .toStringRef();
    if (saved != options.optimizer_type) {
      throw std::runtime_error("the checkpoint's optimizer state (" + first.path + ") is of optimizer '" + saved +
                               "' but optimizer.optimizer is '" + options.optimizer_type +
                               "'; set optimizer.optimizer=" + saved +
                               ", or checkpoint.no_load_optim=true to start a fresh optimizer");
    }
    for (const std::string& key : optimizer_keys(saved)) {
      std::vector<Slice> slices = slices_of(name, files, files_of, key);
      if (key == "momentum_buffer" && slices.empty()) continue;  // SGD without momentum keeps none
      check_slices(entry, slices, "the optimizer state '" + key + "' of");
    }
  }
}

void load_parameters(PretrainSetup& setup, const std::vector<CheckpointParam>& params,
                     const std::map<std::string, LoadedFile>& files,
                     const std::map<std::string, std::vector<std::string>>& files_of, const LoadOptions& options) {
  torch::NoGradGuard no_grad;
  auto& optimizer_state = setup.optimizer->state();
  const bool adam = dynamic_cast<torch::optim::AdamW*>(setup.optimizer.get()) != nullptr;
  for (const CheckpointParam& entry : params) {
    const std::string& name = entry.source_name();
    const std::vector<Slice> model = slices_of(name, files, files_of, "model");
    copy_slices(entry.param, entry, model);  // in place: a buffer keeps its dtype (the fp32 expert_bias)
    if (entry.buffer) continue;
    if (setup.distributed_optimizer) {
      load_distributed_optimizer_state(setup, entry, files, files_of, options, model);
      continue;
    }
    if (setup.mixed_precision) {
      // The fp32 main values where the checkpoint has them (saved under mixed precision), else the model's.
      std::vector<Slice> main = slices_of(name, files, files_of, "fp32_from_fp16_params");
      copy_slices(entry.main_param, entry, main.empty() ? model : main);
    }
    const std::optional<GenericDict> saved_state =
        options.optimizer ? first_optimizer_state(name, files, files_of) : std::nullopt;
    if (!saved_state) continue;
    const auto key = optimizer_state_key(entry.main_param);
    if (adam) {
      auto state = std::make_unique<torch::optim::AdamWParamState>();
      state->step(checkpoint_field(*saved_state, "step", name).toInt());
      state->exp_avg(torch::zeros_like(entry.main_param, torch::MemoryFormat::Preserve));
      state->exp_avg_sq(torch::zeros_like(entry.main_param, torch::MemoryFormat::Preserve));
      copy_slices(state->exp_avg(), entry, slices_of(name, files, files_of, "exp_avg"));
      copy_slices(state->exp_avg_sq(), entry, slices_of(name, files, files_of, "exp_avg_sq"));
      optimizer_state[key] = std::move(state);
    } else {
      auto state = std::make_unique<torch::optim::SGDParamState>();
      std::vector<Slice> momentum = slices_of(name, files, files_of, "momentum_buffer");
      if (!momentum.empty()) {
        state->momentum_buffer(torch::zeros_like(entry.main_param, torch::MemoryFormat::Preserve));
        copy_slices(state->momentum_buffer(), entry, momentum);
      }
      optimizer_state[key] = std::move(state);
    }
  }
}

void load_progress(PretrainSetup& setup, const c10::impl::GenericDict& common) {
  const GenericDict progress = checkpoint_dict(common, "train_state", "common.pt");
  TrainState& train_state = setup.state.train_state;
  train_state.step = checkpoint_field(progress, "step", "train_state").toInt();
  train_state.consumed_train_samples = checkpoint_field(progress, "consumed_train_samples", "train_state").toInt();
  train_state.skipped_train_samples = checkpoint_field(progress, "skipped_train_samples", "train_state").toInt();
  train_state.consumed_valid_samples = checkpoint_field(progress, "consumed_valid_samples", "train_state").toInt();
  train_state.floating_point_operations_so_far =
      checkpoint_field(progress, "floating_point_operations_so_far", "train_state").toDouble();
  const GenericDict scheduler = checkpoint_dict(common, "opt_param_scheduler", "common.pt");
  setup.scheduler->set_num_steps(checkpoint_field(scheduler, "num_steps", "opt_param_scheduler").toInt());
}

void load_rng_state(const c10::impl::GenericDict& rank_file, const std::string& path) {
  const c10::IValue list = checkpoint_field(rank_file, "rng_state", path);
  if (!list.isList() || list.toListRef().empty() || !list.toListRef()[0].isGenericDict()) {
    throw std::runtime_error(path + ": rng_state is not a list of dicts; the file is damaged");
  }
  const GenericDict rng = list.toListRef()[0].toGenericDict();
  parallel::tensor_parallel::RngStates states;
  states.cpu = checkpoint_field(rng, "torch_rng_state", path).toTensor();
  auto cuda = rng.find(c10::IValue(std::string("cuda_rng_state")));
  if (cuda != rng.end()) states.cuda = cuda->value().toTensor();
  for (const auto& item : checkpoint_dict(rng, "rng_tracker_states", path)) {
    states.tracker.emplace(item.key().toStringRef(), item.value().toTensor());
  }
  parallel::tensor_parallel::set_all_rng_states(states);
}

void upgrade_qkv_layout(GenericDict& file, const std::string& path) {
  if (file.contains(c10::IValue(std::string(kQkvLayoutKey)))) return;
  const ConfigContainer saved = load_config_yaml_string(checkpoint_field(file, "config", path).toStringRef(), path);
  const int64_t head_dim = saved.model.head_dim();
  const int64_t hidden = saved.model.num_attention_heads * head_dim;
  // Row r of [Q; K; V] is channel d of head i of part p (q, k or v); Megatron-Core's layout puts it at row
  // i * 3 * head_dim + p * head_dim + d. Blocks are cut at head boundaries, where the mapping stays contiguous.
  const auto grouped_row = [&](int64_t row) {
    const int64_t part = row / hidden, head = row % hidden / head_dim, channel = row % head_dim;
    return head * 3 * head_dim + part * head_dim + channel;
  };
  GenericDict metadata = checkpoint_dict(file, "shard_metadata", path);
  std::vector<std::pair<c10::IValue, c10::IValue>> upgraded;
  for (const auto& item : metadata) {
    const std::string& name = item.key().toStringRef();
    if (name.find("self_attention.linear_qkv.") == std::string::npos) continue;
    dc::ShardedTensorLayout layout = dc::layout_from_ivalue(item.value(), name + " in " + path);
    if (layout.global_shape.empty() || layout.global_shape[0] != 3 * hidden) {
      throw std::runtime_error(path + ": " + name + " has " + shape_string(layout.global_shape) +
                               " rows, not 3 x hidden_size as an older checkpoint's [Q; K; V]: the file is damaged");
    }
    if (layout.replicated()) {  // one whole block along the rows
      layout.partition_dim = 0;
      layout.blocks = {{0, 0, layout.global_shape[0]}};
    }
    std::vector<dc::ShardedTensorLayout::Block> blocks;
    for (const auto& block : layout.blocks) {
      for (int64_t row = block.global_start; row < block.global_start + block.length;) {
        const int64_t end = std::min(block.global_start + block.length, (row / head_dim + 1) * head_dim);
        blocks.push_back({block.local_start + row - block.global_start, grouped_row(row), end - row});
        row = end;
      }
    }
    layout.blocks = std::move(blocks);
    upgraded.emplace_back(item.key(), dc::to_ivalue(layout));
  }
  for (const auto& [name, layout] : upgraded) metadata.insert_or_assign(name, layout);
  file.insert_or_assign(std::string(kQkvLayoutKey), std::string(kQkvLayoutGrouped));
}

}  // namespace bridge::training
