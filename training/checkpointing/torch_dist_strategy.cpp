// checkpoint.ckpt_format: torch_dist, Megatron-Core's distributed checkpoint (Megatron-Bridge's default): PyTorch
// Distributed Checkpoint files that every rank writes at once, each its own chunks, with Megatron-Core's keys
// (sharded_state_dict.h), so that torch.distributed.checkpoint and Megatron-Core's dist_checkpointing open them and any
// parallel layout reads back the boxes it needs. An iteration directory holds
//   __<rank>_0.distcp        each writing rank's chunks (utils/dcp.h)
//   bridge_checksums.json    bridge's CRC32 of every item, checked before use
//   .metadata                DCP's index, renamed into place: the data's commit point
//   metadata.json            {"sharded_backend": "torch_dist", ...}, written last: the checkpoint is complete
//   train_state.pt, run_config.yaml   Megatron-Bridge's (the counters as 0-d tensors, the resolved config)
// and <save>/latest_train_state.pt is a copy of the newest train_state.pt, as Megatron-Bridge keeps it.
//
// What is where: the model under its keys; the optimizer in one of Megatron-Core's layouts (torch_dist_optimizer.h:
// the distributed optimizer's buckets as dp_reshardable, or model space), each rank's shard saved where it lies, never
// gathered; common_state/shard_0_1 (rank 0) the counters, scheduler, config and
// the optimizer's non-tensor state; rng_state/shard_<pp>.<tp>_<PP>.<TP> (with expert parallelism .<dp> too) each
// rank's RNG streams and callbacks' state. A tensor replicated over ranks (data-parallel replicas, a layer norm over
// tensor-parallel ranks) is written once, by the holder with the fewest bytes so far (Megatron-Core's fully parallel
// save), so the writing is spread over every rank.
#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "training/callbacks/callback_state.h"
#include "training/checkpointing/checkpoint_state.h"
#include "training/checkpointing/checkpoint_strategy.h"
#include "training/checkpointing/checkpointing_internal.h"
#include "training/checkpointing/fully_parallel_save.h"
#include "training/checkpointing/sharded_state_dict.h"
#include "training/checkpointing/torch_dist_optimizer.h"
#include "training/config/config_yaml.h"
#include "training/optimizer/optimizer.h"
#include "utils/dcp.h"
#include "utils/durable_file.h"
#include "utils/exception_message.h"
#include "utils/logging.h"
#include "utils/strings.h"
#include "utils/torch_pickle.h"
#include "utils/zip_archive.h"

namespace bridge::training {
namespace fs = std::filesystem;
namespace dcp = bridge::utils::dcp;
namespace dc = parallel::dist_checkpointing;
namespace {

using GenericDict = c10::impl::GenericDict;
using GenericList = c10::impl::GenericList;
using bridge::utils::DamagedFileError;

constexpr char kCommonState[] = "common_state/shard_0_1";
constexpr char kLegacyCommon[] = "common.pt";  // Megatron-Core <= 0.18 kept the common state there
constexpr char kMetadataJson[] = "metadata.json";
constexpr char kTrainState[] = "train_state.pt";
constexpr char kLatestTrainState[] = "latest_train_state.pt";
constexpr char kRunConfig[] = "run_config.yaml";
// The optimizer's tensors per parameter, in model space, and the names bridge's loader gives them.
constexpr std::pair<const char*, const char*> kStateKeys[] = {
    {"exp_avg", "exp_avg"}, {"exp_avg_sq", "exp_avg_sq"}, {"momentum_buffer", "momentum_buffer"}};
// The fp32 main params: Megatron-Core's distributed optimizer (fully_reshardable) calls them "param", its other
// optimizers "fp32_param"; either is read.
constexpr const char* kMainParamKeys[] = {"param", "fp32_param"};

// Megatron-Bridge's default models use Transformer Engine's layers, which fuse the layer norm before QKV and before
// fc1 into those linears: the same tensors under other keys. bridge writes Megatron-Core's local names and reads
// either.
constexpr std::pair<const char*, const char*> kTransformerEngineNames[] = {
    {".input_layernorm.weight", ".self_attention.linear_qkv.layer_norm_weight"},
    {".input_layernorm.bias", ".self_attention.linear_qkv.layer_norm_bias"},
    {".pre_mlp_layernorm.weight", ".mlp.linear_fc1.layer_norm_weight"},
    {".pre_mlp_layernorm.bias", ".mlp.linear_fc1.layer_norm_bias"},
};

// The key under which the checkpoint holds the tensor bridge calls `key`: the key itself, or Transformer Engine's.
std::string saved_key(const dcp::Reader& reader, const std::string& key) {
  if (reader.tensors().count(key) > 0) return key;
  for (const auto& [local, fused] : kTransformerEngineNames) {
    const std::string_view suffix(local);
    if (key.size() < suffix.size() || key.compare(key.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const std::string alias = key.substr(0, key.size() - suffix.size()) + fused;
    if (reader.tensors().count(alias) > 0) return alias;
  }
  return key;
}

// torch.save's bytes of `value` (Megatron-Core's ShardedObject payload) and back.
std::string pickle_bytes(const c10::IValue& value) { return bridge::utils::torch_pickle_bytes(value); }
c10::IValue unpickle_bytes(const std::string& bytes, const std::string& what) {
  return bridge::utils::load_torch_pickle_bytes(bytes, what);
}

// Megatron-Bridge's RNG object of this rank: one per (pp, tp) rank, written by data-parallel (with cp) rank 0; with
// expert parallelism the data-parallel rank is part of it (its ranks' RNG streams differ), over data x context
// parallel as Megatron's (pp, tp, dp) rng_state object counts it: cp ranks hold other expert-parallel ranks too.
std::string rng_key(int data_parallel_rank, int data_parallel_size) {
  const int pp = parallel::get_pipeline_model_parallel_rank(), tp = parallel::get_tensor_model_parallel_rank();
  const int pps = parallel::get_pipeline_model_parallel_world_size();
  const int tps = parallel::get_tensor_model_parallel_world_size();
  std::string key = "rng_state/shard_" + std::to_string(pp) + "." + std::to_string(tp);
  std::string shape = std::to_string(pps) + "." + std::to_string(tps);
  if (parallel::get_expert_model_parallel_world_size() > 1) {
    key += "." + std::to_string(data_parallel_rank);
    shape += "." + std::to_string(data_parallel_size);
  }
  return key + "_" + shape;
}

// This rank's model chunks and its optimizer's, under Megatron-Core's keys; `step` is the agreed AdamW step.
std::vector<SaveItem> tensor_items(PretrainSetup& setup, const std::vector<CheckpointParam>& params,
                                   const ShardedKeyOptions& options, int64_t step) {
  std::vector<SaveItem> items;
  const bool dp_reshardable = optimizer_sharding_type(setup) == kDpReshardable;
  for (const CheckpointParam& entry : params) {
    if (entry.tied_copy) continue;
    const std::vector<ShardedChunk> chunks = sharded_chunks(entry.name, entry.layout, options);
    const torch::Tensor param = entry.param.detach();
    for (const ShardedChunk& chunk : chunks) items.push_back({chunk, chunk_data(param, chunk)});
    if (!entry.buffer && !dp_reshardable) add_model_space_optimizer_items(setup, entry, chunks, items);
  }
  if (dp_reshardable) add_dp_reshardable_items(setup, step, items);
  return items;
}

class TorchDistSave : public PendingSave {
 public:
  fs::path directory;
  fs::path root;
  std::vector<SaveItem> items;                               // the chunks this rank writes
  std::vector<std::pair<std::string, std::string>> objects;  // its byte items
  std::string run_config;                                    // rank 0: the resolved YAML
  std::string train_state;                                   // rank 0: train_state.pt's bytes

  std::string write() override {
    if (items.empty() && objects.empty()) return "";
    fs::create_directories(directory);
    dcp::DataFileWriter writer(directory, "__" + std::to_string(parallel::get_rank()) + "_0.distcp");
    for (auto& [key, bytes] : objects) writer.add_bytes(key, std::move(bytes));
    for (const SaveItem& item : items)
      writer.add_tensor(item.chunk.key, item.data, item.chunk.offsets, item.chunk.global_shape);
    const std::string records = dcp::encode_records(writer.finish());
    items.clear();  // the snapshot's memory goes with the write
    return records;
  }

  // Megatron-Bridge's order, with the DCP index before the files that say the checkpoint is complete.
  void commit(const std::vector<std::string>& written) override {
    std::vector<dcp::WriteRecord> records;
    for (const std::string& text : written) {
      if (text.empty()) continue;
      std::vector<dcp::WriteRecord> theirs = dcp::decode_records(text);
      records.insert(records.end(), theirs.begin(), theirs.end());
    }
    bridge::utils::write_file_durably(directory / kTrainState, train_state);
    bridge::utils::write_file_durably(directory / kRunConfig, run_config);
    dcp::write_metadata(directory, records);
    bridge::utils::write_file_durably(directory / kMetadataJson,
                                      "{\"sharded_backend\": \"torch_dist\", \"sharded_backend_version\": 1, "
                                      "\"common_backend\": \"torch\", \"common_backend_version\": 1}");
    bridge::utils::write_file_durably(root / kLatestTrainState, train_state);
  }
};

// Megatron-Bridge's train_state.pt: the counters as 0-d tensors.
std::string train_state_bytes(const TrainState& state) {
  GenericDict out = new_checkpoint_dict();
  out.insert("step", torch::tensor(state.step, torch::kLong));
  out.insert("consumed_train_samples", torch::tensor(state.consumed_train_samples, torch::kLong));
  out.insert("skipped_train_samples", torch::tensor(state.skipped_train_samples, torch::kLong));
  out.insert("consumed_valid_samples", torch::tensor(state.consumed_valid_samples, torch::kLong));
  out.insert("floating_point_operations_so_far",
             torch::tensor(static_cast<float>(state.floating_point_operations_so_far), torch::kFloat32));
  out.insert("do_train", torch::tensor(true));
  out.insert("do_valid", torch::tensor(false));
  out.insert("do_test", torch::tensor(false));
  return pickle_bytes(out);
}

// The reader's view of this rank's part of one saved tensor: the boxes of `chunks` read into one local tensor laid
// out as `layout`, except that along a vocabulary-padded dim only the rows the checkpoint has are taken (the layout's
// global shape and blocks then say so, as the loader's copy expects).
struct LocalRead {
  torch::Tensor tensor;
  dc::ShardedTensorLayout layout;
};

class TorchDistStrategy : public CheckpointStrategy {
 public:
  std::string_view name() const override { return "torch_dist"; }
  bool recognises(const fs::path& directory) const override {
    std::error_code ignored;
    return fs::exists(directory / kMetadataJson, ignored) || fs::exists(directory / dcp::kMetadataFile, ignored) ||
           fs::exists(directory / "__0_0.distcp", ignored);
  }
  bool complete(const fs::path& directory) const override {
    std::error_code ignored;
    return fs::exists(directory / kMetadataJson, ignored) && fs::exists(directory / dcp::kMetadataFile, ignored);
  }

  std::unique_ptr<PendingSave> begin_save(PretrainSetup& setup, const fs::path& directory, int64_t iteration,
                                          const std::string& what) const override {
    auto save = std::make_unique<TorchDistSave>();
    save->directory = directory;
    save->root = setup.config.checkpoint.save;
    const ShardedKeyOptions options = ShardedKeyOptions::from(setup.config.model);
    const std::vector<CheckpointParam> params = checkpoint_params(setup);
    // AdamW's step count (a rank without optimizer state of its own has none).
    torch::Tensor agreed = torch::tensor({local_optimizer_step(setup)}, torch::kLong);
    parallel::get_world_group().all_reduce(agreed, parallel::ReduceOp::kMax);
    const int64_t step = agreed.item<int64_t>();
    std::vector<SaveItem> items;  // a rank's failure here fails every rank before the collectives below
    detail::on_every_rank(what, [&] { items = tensor_items(setup, params, options, step); });
    const std::vector<bool> writes = assign_writers(items, setup.config.checkpoint.fully_parallel_save);
    // The snapshot: under async_save a copy of what this rank writes (training changes the originals); a synchronous
    // save writes before training goes on and copies nothing.
    const bool async = setup.config.checkpoint.async_save;
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (!writes[i]) continue;
      SaveItem item = std::move(items[i]);
      if (async || !item.data.device().is_cpu())
        item.data = item.data.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
      save->items.push_back(std::move(item));
    }
    std::vector<std::string> skipped_user_state;
    detail::on_every_rank(what, [&] {
      if (optimizer_sharding_type(setup) == kDpReshardable) add_dp_reshardable_objects(setup, step, save->objects);
      // Each rank's RNG streams and callbacks' state, where its (pp, tp[, dp]) object is this rank's to write (rank 0
      // always writes one: data-parallel rank 0). Context-parallel ranks are replicas here, as data-parallel ones.
      const bool expert_parallel = parallel::get_expert_model_parallel_world_size() > 1;
      if (!expert_parallel && data_parallel_rank_with_cp(setup) != 0) return;
      GenericDict common = shared_state_dict(setup, iteration);
      GenericDict own = new_checkpoint_dict();
      own.insert("rng_state", rng_state_list());
      own.insert("parallel_layout", checkpoint_field(common, "parallel_layout", what));
      if (setup.callbacks) {
        own.insert("callbacks", save_callback_states(*setup.callbacks));
        own.insert("user_state", save_user_state(setup.callbacks->user_state(), skipped_user_state));
      }
      GenericList own_payload(c10::AnyType::get());
      own_payload.push_back(own);
      save->objects.emplace_back(rng_key(data_parallel_rank_with_cp(setup), data_parallel_size_with_cp(setup)),
                                 pickle_bytes(own_payload));
      if (parallel::get_rank() != 0) return;
      GenericDict content = new_checkpoint_dict();
      content.insert("distrib_optim_sharding_type", optimizer_sharding_type(setup));
      content.insert("singleton_local_shards", false);
      common.insert("content_metadata", content);
      GenericDict optimizer = new_checkpoint_dict();
      optimizer.insert("optimizer_type", setup.config.optimizer.optimizer);
      optimizer.insert("step", step);
      if (const GradScaler* scaler = setup.grad_scaler()) optimizer.insert("grad_scaler", grad_scaler_state(*scaler));
      common.insert("optimizer", optimizer);
      for (const char* key : {"callbacks", "user_state"}) {  // rank 0's, for a load in another layout
        const auto it = own.find(c10::IValue(std::string(key)));
        if (it != own.end()) common.insert(key, it->value());
      }
      GenericList payload(c10::AnyType::get());
      payload.push_back(common);
      save->objects.emplace_back(kCommonState, pickle_bytes(payload));
      save->run_config = to_yaml(setup.config);
      save->train_state = train_state_bytes(setup.state.train_state);
    });
    detail::warn_skipped_user_state(skipped_user_state);
    return save;
  }

  void read(PretrainSetup& setup, const fs::path& directory, const std::vector<std::string>& gathered_names,
            const std::vector<CheckpointParam>& params, const LoadOptions& options,
            CheckpointRead& out) const override {
    if (!fs::exists(directory / dcp::kMetadataFile)) {
      throw DamagedFileError((directory / dcp::kMetadataFile).string() +
                             " is missing: the save of this iteration did not complete. Choose a complete one with "
                             "checkpoint.ckpt_step");
    }
    const dcp::Reader reader(directory);
    const std::string path = directory.string();
    out.common = read_common(reader);
    const ShardedKeyOptions key_options = ShardedKeyOptions::from(setup.config.model);

    // The model's keys against the checkpoint's, both ways (the optimizer's keys aside).
    std::map<std::string, std::string> model_keys;  // saved key -> a global name it stands for
    for (const std::string& name : gathered_name_set(gathered_names)) {
      const std::string key = sharded_key(name, key_options);
      const std::string saved = saved_key(reader, key);
      if (reader.tensors().count(saved) == 0) {
        throw ModelMismatchError("the checkpoint has no tensor " + key + " (" + name +
                                 "), which this run's model has: the checkpoint is of another model");
      }
      model_keys.emplace(saved, name);
    }
    // Tensors only the checkpoint has, as checkpoint.dist_ckpt_strictness says (Megatron-Core's StrictHandling).
    const std::string& strictness = setup.config.checkpoint.dist_ckpt_strictness;
    std::vector<std::string> unexpected;
    for (const auto& [key, info] : reader.tensors()) {
      if (key.rfind("optimizer.", 0) != 0 && model_keys.count(key) == 0) unexpected.push_back(key);
    }
    if (!unexpected.empty() && strictness.rfind("raise_", 0) == 0) {
      throw ModelMismatchError("the checkpoint holds " + bridge::utils::join(unexpected, ", ") +
                               ", which this run's model does not have (checkpoint.dist_ckpt_strictness " + strictness +
                               "): the checkpoint is of another model");
    }
    if (!unexpected.empty() && strictness.rfind("log_", 0) == 0 && parallel::get_rank() == 0) {
      bridge::utils::logger().warn("the checkpoint {} holds tensors this run's model does not have, left unread: {}",
                                   path, bridge::utils::join(unexpected, ", "));
    }

    LoadedFile file{path, new_checkpoint_dict()};
    GenericDict model = new_checkpoint_dict(), metadata = new_checkpoint_dict(), main_params = new_checkpoint_dict();
    GenericDict state = new_checkpoint_dict();
    const GenericDict saved_optimizer = optional_dict(out.common, "optimizer");
    const bool has_state = options.optimizer && saved_optimizer.contains(c10::IValue(std::string("step"))) &&
                           saved_optimizer.at(c10::IValue(std::string("step"))).toInt() >= 0;
    if (options.optimizer && !saved_optimizer.contains(c10::IValue(std::string("step")))) {
      // Moments without a step count would restart Adam's bias correction: refused rather than guessed.
      for (const auto& [key, info] : reader.tensors()) {  // model space's exp_avg.<key> or a bucket's .exp_avg
        if (key.rfind("optimizer.", 0) != 0 || key.find("exp_avg") == std::string::npos) continue;
        throw std::runtime_error(path + " holds the optimizer's moments (" + key +
                                 ") but no step count (common_state's optimizer.step, or Megatron-Core's "
                                 "optimizer.param_groups[].step): set checkpoint.no_load_optim=true to start the "
                                 "optimizer afresh from its weights");
      }
    }
    // The distributed optimizer's buckets (dp_reshardable), read where this run's layout allows; under
    // checkpoint.no_load_optim not at all (the main params then come from the weights).
    const GenericDict content = optional_dict(out.common, "content_metadata");
    const auto sharding = content.find(c10::IValue(std::string("distrib_optim_sharding_type")));
    std::optional<DpReshardableReader> buckets;
    if (options.optimizer && sharding != content.end() && sharding->value().toStringRef() == kDpReshardable)
      buckets.emplace(setup, reader, out.common);
    std::set<std::string> done;
    for (const CheckpointParam& entry : params) {
      const std::string& name = entry.source_name();
      if (!done.insert(name).second) continue;
      const std::vector<ShardedChunk> chunks = sharded_chunks(name, entry.layout, key_options);
      const std::string key = saved_key(reader, chunks.front().key);
      const LocalRead weights = read_local(reader, name, key, chunks, entry);
      model.insert(name, weights.tensor);
      metadata.insert(name, dc::to_ivalue(weights.layout));
      out.files_of[name] = {path};
      if (entry.buffer) continue;
      if (buckets) {
        if (entry.param.scalar_type() != torch::kFloat32) {
          if (std::optional<torch::Tensor> main = buckets->read(entry, "param")) main_params.insert(name, *main);
        }
        if (!has_state) continue;
        GenericDict param_state = new_checkpoint_dict();
        param_state.insert("step", saved_optimizer.at(c10::IValue(std::string("step"))).toInt());
        for (const auto& [saved_name, loader_name] : kStateKeys) {
          if (std::optional<torch::Tensor> values = buckets->read(entry, saved_name))
            param_state.insert(loader_name, *values);
        }
        state.insert(name, param_state);
        continue;
      }
      for (const char* main_key : kMainParamKeys) {
        const std::string saved = std::string(kOptimizerState) + main_key + "." + key;
        if (reader.tensors().count(saved) == 0) continue;
        main_params.insert(name, read_local(reader, name, saved, chunks, entry).tensor);
        break;
      }
      if (!has_state) continue;
      GenericDict param_state = new_checkpoint_dict();
      param_state.insert("step", saved_optimizer.at(c10::IValue(std::string("step"))).toInt());
      for (const auto& [saved_name, loader_name] : kStateKeys) {
        const std::string saved = std::string(kOptimizerState) + saved_name + "." + key;
        if (reader.tensors().count(saved) == 0) continue;
        param_state.insert(loader_name, read_local(reader, name, saved, chunks, entry).tensor);
      }
      state.insert(name, param_state);
    }
    file.dict.insert("model", model);
    file.dict.insert("shard_metadata", metadata);
    GenericDict inner = new_checkpoint_dict();
    inner.insert("state", state);
    inner.insert("param_groups", GenericList(c10::AnyType::get()));
    GenericDict optimizer = new_checkpoint_dict();
    optimizer.insert("optimizer", inner);
    const auto type = saved_optimizer.find(c10::IValue(std::string("optimizer_type")));
    optimizer.insert("optimizer_type",
                     type != saved_optimizer.end() ? type->value() : c10::IValue(std::string("adam")));
    if (main_params.size() > 0) optimizer.insert("fp32_from_fp16_params", main_params);
    const auto scaler = saved_optimizer.find(c10::IValue(std::string("grad_scaler")));
    if (scaler != saved_optimizer.end()) optimizer.insert("grad_scaler", scaler->value());
    file.dict.insert("optimizer", optimizer);

    // This rank's own RNG streams and callbacks' state when the layout is the saved one.
    const GenericDict layout = optional_dict(out.common, "parallel_layout");
    const auto size = [&](const char* field, int64_t otherwise) {
      const auto it = layout.find(c10::IValue(std::string(field)));
      return it == layout.end() ? otherwise : it->value().toInt();
    };
    const int64_t saved_tp = size("tensor_model_parallel_size", -1);
    out.same_layout =
        saved_tp == parallel::get_tensor_model_parallel_world_size() &&
        size("pipeline_model_parallel_size", -1) == parallel::get_pipeline_model_parallel_world_size() &&
        size("expert_model_parallel_size", 1) == parallel::get_expert_model_parallel_world_size() &&
        size("expert_tensor_parallel_size", saved_tp) == parallel::get_expert_tensor_parallel_world_size() &&
        (parallel::get_expert_model_parallel_world_size() == 1 ||
         (size("data_parallel_size", -1) == setup.data_parallel_size &&
          size("context_parallel_size", 1) == parallel::get_context_parallel_world_size()));
    const std::string own_key = rng_key(data_parallel_rank_with_cp(setup), data_parallel_size_with_cp(setup));
    const std::vector<std::string> objects = reader.byte_items();
    if (out.same_layout && std::find(objects.begin(), objects.end(), own_key) != objects.end()) {
      const c10::IValue payload = unpickle_bytes(reader.read_bytes(own_key), path + " " + own_key);
      if (!payload.isList() || payload.toListRef().empty() || !payload.toListRef()[0].isGenericDict()) {
        throw DamagedFileError(path + ": " + own_key + " does not hold [dict]; the checkpoint is damaged");
      }
      for (const auto& item : payload.toListRef()[0].toGenericDict()) file.dict.insert(item.key(), item.value());
      out.own_file = path;
    }
    out.files.emplace(path, std::move(file));
    check_loadable(params, out.files, out.files_of, options);
  }

  // The common_state item: counters, scheduler, config, content_metadata.
  GenericDict read_common(const fs::path& directory) const override {
    if (!fs::exists(directory / dcp::kMetadataFile)) {
      throw DamagedFileError((directory / dcp::kMetadataFile).string() +
                             " is missing: not a complete torch_dist checkpoint");
    }
    return read_common(dcp::Reader(directory));
  }

  // Each saved tensor whole, split back into bridge's per-layer and per-expert names; the fp32 main values where the
  // checkpoint has them (mixed precision), else the model's.
  void read_weights(const fs::path& directory, SavedWeights& saved) const override {
    if (!fs::exists(directory / dcp::kMetadataFile)) {
      throw std::runtime_error((directory / dcp::kMetadataFile).string() +
                               " is missing: not a complete torch_dist checkpoint");
    }
    const dcp::Reader reader(directory);
    const GenericDict common = read_common(reader);
    const std::string where = directory.string() + " " + kCommonState;
    saved.config =
        load_config_yaml_string(checkpoint_field(common, "config", where).toStringRef(), where + " (its config)");
    const ShardedKeyOptions options = ShardedKeyOptions::from(saved.config.model);
    for (const auto& [key, info] : reader.tensors()) {
      if (key.rfind("optimizer.", 0) == 0) continue;
      std::string source = key;
      for (const char* main_key : kMainParamKeys) {
        const std::string main = std::string(kOptimizerState) + main_key + "." + key;
        if (reader.tensors().count(main) > 0) {
          source = main;
          break;
        }
      }
      const torch::Tensor whole = reader.read_whole(source).to(torch::kFloat32);
      for (const NamedPart& part : named_parts(key, info.global_shape, options)) {
        torch::Tensor tensor = whole;
        for (int64_t index : part.prefix) tensor = tensor.select(0, index);
        saved.tensors.emplace(part.name, tensor.contiguous());
      }
    }
  }

  // .metadata and metadata.json present and readable, and every item of every data file against bridge's checksums
  // (each file reported on its own).
  std::vector<VerifiedFile> verify(const fs::path& directory) const override {
    std::vector<VerifiedFile> verified;
    for (const char* name : {dcp::kMetadataFile, kMetadataJson}) {
      if (!fs::exists(directory / name)) {
        verified.push_back({name, "missing: the save of this iteration did not complete, or the copy is partial", ""});
      }
    }
    if (!verified.empty()) return verified;
    std::optional<dcp::Reader> reader;
    try {
      reader.emplace(directory);
    } catch (const std::exception& error) {
      return {{dcp::kMetadataFile, bridge::utils::describe(error), ""}};
    }
    verified.push_back({dcp::kMetadataFile, "", "parsed"});
    std::map<std::string, VerifiedFile> files;
    const std::string checked = reader->has_checksums() ? "CRC32 of every item" : "CRC32 of every tensor's entries";
    const auto check = [&](const std::string& fqn, const std::vector<int64_t>& offsets, bool bytes) {
      const dcp::StorageLocation& location = reader->location(fqn, offsets);
      VerifiedFile& file =
          files.emplace(location.relative_path, VerifiedFile{location.relative_path, "", checked}).first->second;
      if (!file.intact()) return;
      if (!fs::exists(directory / location.relative_path)) {
        file.problem = "missing: .metadata names it; copy the whole iteration directory";
        return;
      }
      try {
        if (bytes) {
          reader->read_bytes(fqn);
        } else {
          std::vector<int64_t> sizes;
          for (const auto& [chunk_offsets, chunk_sizes] : reader->tensors().at(fqn).chunks) {
            if (chunk_offsets == offsets) sizes = chunk_sizes;
          }
          reader->read(fqn, offsets, sizes);
        }
      } catch (const std::exception& error) {
        file.problem = bridge::utils::describe(error);
      }
    };
    for (const std::string& fqn : reader->byte_items()) check(fqn, {}, true);
    for (const auto& [fqn, info] : reader->tensors()) {
      for (const auto& [offsets, sizes] : info.chunks) check(fqn, offsets, false);
    }
    for (auto& [path, file] : files) verified.push_back(std::move(file));
    return verified;
  }

 private:
  // The common state: Megatron-Core 0.19's common_state object, or an older one's common.pt.
  static GenericDict read_common(const dcp::Reader& reader) {
    const std::string path = reader.directory().string();
    const std::vector<std::string> objects = reader.byte_items();
    if (std::find(objects.begin(), objects.end(), kCommonState) != objects.end()) {
      const c10::IValue payload = unpickle_bytes(reader.read_bytes(kCommonState), path + " " + kCommonState);
      if (payload.isList() && !payload.toListRef().empty() && payload.toListRef()[0].isGenericDict()) {
        return adopt_megatron_bridge_state(reader.directory(), payload.toListRef()[0].toGenericDict());
      }
      if (payload.isGenericDict()) return adopt_megatron_bridge_state(reader.directory(), payload.toGenericDict());
      throw DamagedFileError(path + ": " + kCommonState + " does not hold the common state dict; it is damaged");
    }
    if (fs::exists(reader.directory() / kLegacyCommon)) {
      return adopt_megatron_bridge_state(reader.directory(), detail::read_pickle(reader.directory() / kLegacyCommon));
    }
    throw DamagedFileError(path + " holds neither " + kCommonState + " nor " + kLegacyCommon +
                           ": not a complete Megatron-Core checkpoint");
  }

  // A checkpoint Megatron-Bridge wrote keeps the counters in train_state.pt (0-d tensors) and AdamW's step in the
  // optimizer's param_groups ({"optimizer": {"param_groups": [{"step": N, ...}]}}), not where bridge keeps them
  // (common_state's train_state and optimizer.step): they are copied there, so that the loader reads one shape.
  static GenericDict adopt_megatron_bridge_state(const fs::path& directory, GenericDict common) {
    const fs::path train_state = directory / kTrainState;
    if (!common.contains(c10::IValue(std::string("train_state"))) && fs::exists(train_state)) {
      const GenericDict saved = detail::read_pickle(train_state);
      const std::string where = train_state.string();
      const auto number = [&](const char* key) {
        const c10::IValue value = checkpoint_field(saved, key, where);
        return value.isTensor() ? value.toTensor().item<double>() : value.toScalar().toDouble();
      };
      GenericDict progress = new_checkpoint_dict();
      for (const char* key : {"step", "consumed_train_samples", "skipped_train_samples", "consumed_valid_samples"})
        progress.insert(key, static_cast<int64_t>(number(key)));
      progress.insert("floating_point_operations_so_far", number("floating_point_operations_so_far"));
      common.insert("train_state", progress);
    }
    GenericDict optimizer = optional_dict(common, "optimizer");
    const GenericDict inner = optional_dict(optimizer, "optimizer");
    const auto groups = inner.find(c10::IValue(std::string("param_groups")));
    if (!optimizer.contains(c10::IValue(std::string("step"))) && groups != inner.end() && groups->value().isList()) {
      std::optional<int64_t> step;
      for (const c10::IValue& group : groups->value().toListRef()) {
        if (!group.isGenericDict()) continue;
        const auto found = group.toGenericDict().find(c10::IValue(std::string("step")));
        if (found == group.toGenericDict().end()) continue;
        const c10::IValue& value = found->value();
        const int64_t here = value.isTensor() ? value.toTensor().item<int64_t>() : value.toInt();
        step = std::max(step.value_or(here), here);
      }
      if (step) optimizer.insert("step", *step);
    }
    return common;
  }

  static GenericDict optional_dict(const GenericDict& dict, const std::string& key) {
    const auto it = dict.find(c10::IValue(key));
    return it != dict.end() && it->value().isGenericDict() ? it->value().toGenericDict() : new_checkpoint_dict();
  }

  // This rank's part of the saved tensor `key` (standing for `name`), as `chunks` place it; see LocalRead.
  static LocalRead read_local(const dcp::Reader& reader, const std::string& name, const std::string& key,
                              const std::vector<ShardedChunk>& chunks, const CheckpointParam& entry) {
    const dcp::TensorInfo& info = reader.tensors().at(key);
    const ShardedChunk& first = chunks.front();
    const std::size_t prepended = static_cast<std::size_t>(first.prepended);
    // The saved global shape, less the prepended axes, against the model's.
    std::vector<int64_t> saved(info.global_shape.begin() + std::min(prepended, info.global_shape.size()),
                               info.global_shape.end());
    const std::vector<int64_t>& want = entry.layout.global_shape;
    bool compatible = info.global_shape.size() == first.global_shape.size();
    for (std::size_t d = 0; compatible && d < prepended; ++d)
      compatible = info.global_shape[d] == first.global_shape[d];
    for (std::size_t d = 0; compatible && d < want.size(); ++d) {
      compatible = saved[d] == want[d] || (d == 0 && is_vocab_padded(name));
    }
    if (!compatible) {
      throw ModelMismatchError(key + " has the global shape " + c10::str(c10::IntArrayRef(info.global_shape)) +
                               " in the checkpoint " + reader.directory().string() + ", " +
                               c10::str(c10::IntArrayRef(first.global_shape)) +
                               " in this run's model: the checkpoint is of another model");
    }
    LocalRead out;
    out.layout = entry.layout;
    out.layout.global_shape = saved;
    const int64_t dim = entry.layout.replicated() ? 0 : entry.layout.partition_dim;
    const int64_t limit = saved.empty() ? 0 : saved[static_cast<std::size_t>(dim)];
    if (entry.layout.replicated()) {
      std::vector<int64_t> offsets(first.offsets), sizes(first.sizes);
      for (std::size_t d = 0; d < saved.size(); ++d) sizes[prepended + d] = saved[d];
      out.tensor = reader.read(key, offsets, sizes).view(saved);
      return out;
    }
    out.layout.blocks.clear();
    std::vector<torch::Tensor> parts;
    int64_t local = 0;
    for (const ShardedChunk& chunk : chunks) {
      const std::size_t global_dim = prepended + static_cast<std::size_t>(dim);
      const int64_t start = chunk.offsets[global_dim];
      const int64_t length = std::min(chunk.sizes[global_dim], limit - start);
      if (length <= 0) continue;  // rows beyond the saved vocabulary keep this run's values
      std::vector<int64_t> sizes(chunk.sizes);
      sizes[global_dim] = length;
      std::vector<int64_t> shape(sizes.begin() + static_cast<std::ptrdiff_t>(prepended), sizes.end());
      parts.push_back(reader.read(key, chunk.offsets, sizes).view(shape));
      out.layout.blocks.push_back({local, start, length});
      local += length;
    }
    out.tensor = parts.empty() ? torch::empty({0}) : torch::cat(parts, dim);
    return out;
  }
};

}  // namespace

const CheckpointStrategy& torch_dist_checkpoint_strategy() {
  static const TorchDistStrategy strategy;
  return strategy;
}

}  // namespace bridge::training
