// checkpoint.ckpt_format: torch, Megatron's legacy layout: one model_optim_rng.pt per (tp, pp, ep) rank, written by
// data-parallel rank 0 (and expert data-parallel rank 0), the distributed optimizer's state gathered to it first, and
// common.pt (the shared state and the index of which file holds which slice), written last by rank 0.
#include <filesystem>
#include <future>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "training/callbacks/callback_state.h"
#include "training/checkpointing/checkpoint_state.h"
#include "training/checkpointing/checkpoint_strategy.h"
#include "training/checkpointing/checkpointing_internal.h"
#include "training/config/config_yaml.h"
#include "utils/exception_message.h"
#include "utils/logging.h"
#include "utils/strings.h"
#include "utils/torch_pickle.h"

namespace bridge::training {
namespace fs = std::filesystem;
namespace {

using GenericDict = c10::impl::GenericDict;
using GenericList = c10::impl::GenericList;
using bridge::utils::DamagedFileError;
using detail::in_context;
using detail::kCommon;
using detail::read_pickle;
using detail::relative_rank_file;
using detail::write_pickle;

// The parallel layout's size `key` in a checkpoint's parallel_layout, or `otherwise` for a checkpoint saved before it
// was recorded (the expert sizes: such a checkpoint had no expert parallelism).
int64_t layout_size(const GenericDict& layout, const std::string& key, int64_t otherwise) {
  auto it = layout.find(c10::IValue(key));
  return it == layout.end() ? otherwise : it->value().toInt();
}

GenericDict read_saved_dict(const fs::path& path) {
  if (!fs::exists(path)) throw std::runtime_error(path.string() + " is missing: not a complete bridge checkpoint");
  const c10::IValue value = bridge::utils::load_torch_pickle(path);
  if (!value.isGenericDict())
    throw std::runtime_error(path.string() + " does not hold a dict; not a bridge checkpoint");
  return value.toGenericDict();
}

class TorchSave : public PendingSave {
 public:
  fs::path directory;
  std::string rank_file;                       // this rank's file, relative to the directory; "" when not a writer
  std::optional<GenericDict> own;              // what it writes
  GenericDict shared = new_checkpoint_dict();  // rank 0: what common.pt copies from its own file
  std::string index;                           // this rank's tensor-index lines

  std::string write() override {
    if (own) write_pickle(directory / rank_file, *own);
    return rank_file + "\n" + index;
  }

  // Rank 0's common.pt: the shared state, every file, and the tensor index (which file holds which slices of every
  // global tensor, for loads in other layouts).
  void commit(const std::vector<std::string>& written) override {
    GenericDict tensors = new_checkpoint_dict();
    std::set<std::string> files;
    for (const std::string& text : written) {
      std::istringstream in(text);
      std::string line;
      std::getline(in, line);
      if (!line.empty()) files.insert(line);
      while (std::getline(in, line)) {
        std::vector<std::string> fields;
        std::istringstream parts(line);
        for (std::string field; std::getline(parts, field, '\t');) fields.push_back(field);
        GenericDict entry = new_checkpoint_dict();
        auto existing = tensors.find(c10::IValue(fields[0]));
        if (existing != tensors.end()) entry = existing->value().toGenericDict();
        GenericList holders(c10::AnyType::get());
        if (entry.contains(c10::IValue(std::string("files")))) {
          holders = entry.at(c10::IValue(std::string("files"))).toList();
        }
        holders.push_back(fields[1]);
        GenericList shape(c10::AnyType::get());
        std::istringstream sizes(fields[2]);
        for (std::string size; std::getline(sizes, size, ',');) shape.push_back(static_cast<int64_t>(std::stoll(size)));
        entry.insert_or_assign("global_shape", shape);
        entry.insert_or_assign("dtype", fields[3]);
        entry.insert_or_assign("files", holders);
        tensors.insert_or_assign(fields[0], entry);
      }
    }
    GenericDict common = new_checkpoint_dict();
    for (const auto& item : shared) common.insert(item.key(), item.value());
    // Every file, also one holding no tensor (an expert writer on a pipeline stage without MoE layers keeps its RNG
    // streams there): a load checks they are all present, and bridge-checkpoint verify that none is missing.
    GenericList file_list(c10::AnyType::get());
    for (const std::string& file : files) file_list.push_back(file);
    common.insert("files", file_list);
    common.insert("tensors", tensors);
    write_pickle(directory / kCommon, common);
  }
};

class TorchStrategy : public CheckpointStrategy {
 public:
  std::string_view name() const override { return "torch"; }
  bool recognises(const fs::path& directory) const override {
    std::error_code ignored;
    return fs::exists(directory / kCommon, ignored) || !checkpoint_strategy("torch_dist").recognises(directory);
  }
  bool complete(const fs::path& directory) const override {
    std::error_code ignored;
    return fs::exists(directory / kCommon, ignored);
  }

  std::unique_ptr<PendingSave> begin_save(PretrainSetup& setup, const fs::path& directory, int64_t iteration,
                                          const std::string& what) const override {
    auto save = std::make_unique<TorchSave>();
    save->directory = directory;
    // Megatron's writers, data-parallel rank 0 and expert data-parallel rank 0, each to the file of its (tp, pp, ep)
    // rank: every slice is written at least once. Each file holds all of its rank's state, as Megatron's do, but the
    // index in common.pt names one file per slice (the dense tensors of data-parallel rank 0's file, the experts of
    // expert data-parallel rank 0's), so every load and export reads the same copy and no two can disagree.
    const CheckpointWriter writer = checkpoint_writer(setup);
    const std::vector<CheckpointParam> params = checkpoint_params(setup);
    const std::string rank_file = relative_rank_file();
    // Two writers of one file would overwrite each other's slices: a layout the file names cannot tell apart is
    // refused before anything is written (the same gathered names on every rank, so every rank throws alike).
    std::set<std::string> files;
    for (const std::string& file :
         parallel::all_gather_strings(parallel::get_world_group(), writer.any() ? rank_file : std::string())) {
      if (file.empty()) continue;
      if (!files.insert(file).second) {
        throw std::logic_error(in_context(what, "two ranks would write " + file +
                                                    ": this parallel layout's rank files are not told apart by their "
                                                    "names; report it with the parallelism.* settings"));
      }
    }
    // The snapshot: CPU copies of this rank's state as of this step, so the write may happen while training goes on.
    // The distributed optimizer's state is gathered to the writers first (Megatron's gather to data-parallel rank 0),
    // so that the files hold the same per-parameter state as without it and load into any layout.
    std::optional<DistributedOptimizer::WholeState> whole;
    if (setup.distributed_optimizer) whole = setup.distributed_optimizer->gather_state(*setup.optimizer, writer.any());
    std::vector<std::string> skipped_user_state;
    detail::on_every_rank(what, [&] {
      if (!writer.any()) return;
      GenericDict own = rank_state_dict(setup, params, iteration, whole ? &*whole : nullptr);
      if (setup.callbacks) {
        own.insert("callbacks", save_callback_states(*setup.callbacks));
        own.insert("user_state", save_user_state(setup.callbacks->user_state(), skipped_user_state));
      }
      if (parallel::get_rank() == 0) {
        for (const char* key : {"checkpoint_version", "iteration", "config", "parallel_layout", "train_state",
                                "opt_param_scheduler", "callbacks", "user_state"}) {
          auto it = own.find(c10::IValue(std::string(key)));
          if (it != own.end()) save->shared.insert(key, it->value());
        }
      }
      save->own = std::move(own);
      save->rank_file = rank_file;
    });
    detail::warn_skipped_user_state(skipped_user_state);
    std::ostringstream lines;
    if (writer.any()) {
      for (const CheckpointParam& entry : params) {
        if (entry.tied_copy || !writer.owns(entry)) continue;
        lines << entry.name << '\t' << rank_file << '\t';
        for (int64_t size : entry.layout.global_shape) lines << size << ',';
        lines << '\t' << c10::toString(entry.param.scalar_type()) << '\n';
      }
    }
    save->index = lines.str();
    return save;
  }

  // Reads common.pt, the files holding this rank's parameters' slices, and its own (tp, pp, ep) file when the layout
  // is unchanged.
  void read(PretrainSetup& /*setup*/, const fs::path& directory, const std::vector<std::string>& gathered_names,
            const std::vector<CheckpointParam>& params, const LoadOptions& options,
            CheckpointRead& out) const override {
    const fs::path common_path = directory / kCommon;
    if (!fs::exists(common_path)) {
      throw DamagedFileError(common_path.string() +
                             " is missing: the save of this iteration did not complete (or it is not a bridge "
                             "checkpoint). Choose a complete one with checkpoint.ckpt_step");
    }
    out.common = read_pickle(common_path);
    const GenericDict index = checkpoint_dict(out.common, "tensors", common_path.string());
    std::set<std::string> listed;
    for (const c10::IValue& file : checkpoint_field(out.common, "files", common_path.string()).toListRef()) {
      listed.insert(file.toStringRef());
      if (!fs::exists(directory / file.toStringRef())) {
        throw DamagedFileError("the checkpoint's file " + (directory / file.toStringRef()).string() +
                               " is missing; copy the whole iteration directory, or choose another with "
                               "checkpoint.ckpt_step");
      }
    }
    const std::set<std::string> model_names = gathered_name_set(gathered_names);
    for (const std::string& name : model_names) {
      if (!index.contains(c10::IValue(name))) {
        throw ModelMismatchError("the checkpoint has no tensor " + name +
                                 ", which this run's model has: the checkpoint is of another model");
      }
    }
    for (const auto& item : index) {
      const std::string& name = item.key().toStringRef();
      if (model_names.count(name) == 0) {
        throw ModelMismatchError("the checkpoint holds " + name +
                                 ", which this run's model does not have: the checkpoint is of another model");
      }
      GenericList holders = item.value().toGenericDict().at(c10::IValue(std::string("files"))).toList();
      for (const c10::IValue& holder : holders) {
        out.files_of[name].push_back((directory / holder.toStringRef()).string());
      }
    }
    const GenericDict layout = checkpoint_dict(out.common, "parallel_layout", common_path.string());
    const int64_t saved_tp = checkpoint_field(layout, "tensor_model_parallel_size", "parallel_layout").toInt();
    out.same_layout =
        saved_tp == parallel::get_tensor_model_parallel_world_size() &&
        checkpoint_field(layout, "pipeline_model_parallel_size", "parallel_layout").toInt() ==
            parallel::get_pipeline_model_parallel_world_size() &&
        layout_size(layout, "expert_model_parallel_size", 1) == parallel::get_expert_model_parallel_world_size() &&
        layout_size(layout, "expert_tensor_parallel_size", saved_tp) ==
            parallel::get_expert_tensor_parallel_world_size();
    // The file of this rank's (tp, pp, ep) rank, where one was written (some layouts leave a rank without a writer of
    // its own ranks: it then keeps its RNG streams).
    if (out.same_layout && listed.count(relative_rank_file()) > 0) {
      out.own_file = (directory / relative_rank_file()).string();
    }
    std::set<std::string> needed;
    for (const CheckpointParam& entry : params) {
      for (const std::string& path : out.files_of.at(entry.source_name())) needed.insert(path);
    }
    if (!out.own_file.empty()) needed.insert(out.own_file);
    for (const std::string& path : needed) {
      LoadedFile& file = out.files.emplace(path, LoadedFile{path, read_pickle(path)}).first->second;
      upgrade_qkv_layout(file.dict, path);
    }
    check_loadable(params, out.files, out.files_of, options);
  }

  // common.pt: the counters, scheduler, config and the index of every tensor's files.
  GenericDict read_common(const fs::path& root) const override {
    const fs::path path = root / detail::kCommon;
    if (!fs::exists(path)) {
      throw DamagedFileError(path.string() +
                             " is missing: the save of this iteration did not complete, or the copy "
                             "is partial");
    }
    return read_saved_dict(path);
  }

  // common.pt's index names the files holding each tensor; each file's shard metadata places its slice in the
  // global tensor.
  void read_weights(const fs::path& root, SavedWeights& saved) const override {
    const std::string common_path = (root / detail::kCommon).string();
    const GenericDict common = read_common(root);
    saved.config = load_config_yaml_string(checkpoint_field(common, "config", common_path).toStringRef(),
                                           common_path + " (its config)");
    std::map<std::string, GenericDict> files;
    const auto file = [&](const std::string& relative) -> const GenericDict& {
      auto it = files.find(relative);
      if (it == files.end()) {
        it = files.emplace(relative, read_saved_dict(root / relative)).first;
        upgrade_qkv_layout(it->second, (root / relative).string());
      }
      return it->second;
    };
    for (const auto& item : checkpoint_dict(common, "tensors", common_path)) {
      const std::string& name = item.key().toStringRef();
      const GenericDict entry = item.value().toGenericDict();
      std::vector<int64_t> shape;
      for (const c10::IValue& size : checkpoint_field(entry, "global_shape", name).toListRef()) {
        shape.push_back(size.toInt());
      }
      torch::Tensor global = torch::zeros(shape, torch::kFloat32);
      for (const c10::IValue& holder : checkpoint_field(entry, "files", name).toListRef()) {
        const std::string& relative = holder.toStringRef();
        const GenericDict& rank_file = file(relative);
        const std::string where = (root / relative).string();
        // The fp32 main values where they were saved (mixed precision), else the model's.
        torch::Tensor slice;
        const GenericDict optimizer = checkpoint_dict(rank_file, "optimizer", where);
        auto main = optimizer.find(c10::IValue(std::string("fp32_from_fp16_params")));
        if (main != optimizer.end()) {
          const GenericDict values = main->value().toGenericDict();
          auto it = values.find(c10::IValue(name));
          if (it != values.end()) slice = it->value().toTensor();
        }
        if (!slice.defined())
          slice = checkpoint_field(checkpoint_dict(rank_file, "model", where), name, where).toTensor();
        const parallel::dist_checkpointing::ShardedTensorLayout layout =
            parallel::dist_checkpointing::layout_from_ivalue(
                checkpoint_field(checkpoint_dict(rank_file, "shard_metadata", where), name, where),
                name + " in " + where);
        if (layout.global_shape != shape) {
          throw std::runtime_error(where + ": " + name +
                                   "'s global shape differs from common.pt's: a damaged checkpoint");
        }
        parallel::dist_checkpointing::ShardedTensorLayout whole;
        whole.global_shape = shape;
        parallel::dist_checkpointing::copy_overlap(global, whole, slice.to(torch::kFloat32), layout);
      }
      saved.tensors.emplace(name, std::move(global));
    }
  }

  // Every *.pt file of the iteration, read through the verifying loader, and every file common.pt lists present.
  std::vector<VerifiedFile> verify(const fs::path& root) const override {
    std::error_code error;
    std::set<std::string> paths{"common.pt"};
    for (auto it = fs::recursive_directory_iterator(root, error); !error && it != fs::recursive_directory_iterator();
         it.increment(error)) {
      if (it->is_regular_file() && it->path().extension() == ".pt") paths.insert(fs::relative(it->path(), root));
    }
    if (error) throw std::runtime_error("cannot list " + root.string() + ": " + error.message());
    std::vector<VerifiedFile> verified;
    std::set<std::string> listed;
    for (const std::string& path : paths) {
      VerifiedFile file{path, "", ""};
      if (!fs::exists(root / path)) {
        file.problem = "missing: the save of this iteration did not complete, or the copy is partial";
        verified.push_back(file);
        continue;
      }
      try {
        bridge::utils::ZipCheck check = bridge::utils::ZipCheck::kEntries;
        const c10::IValue value = bridge::utils::load_torch_pickle(root / path, &check);
        file.checked = check == bridge::utils::ZipCheck::kWholeFile ? "whole-file CRC32" : "CRC32 of every entry";
        if (path == "common.pt" && value.isGenericDict()) {
          const GenericDict common = value.toGenericDict();
          auto files = common.find(c10::IValue(std::string("files")));
          if (files != common.end() && files->value().isList()) {
            for (const c10::IValue& name : files->value().toListRef()) {
              if (name.isString()) listed.insert(name.toStringRef());
            }
          }
        }
      } catch (const std::exception& e) {
        file.problem = bridge::utils::describe(e);
      }
      verified.push_back(file);
    }
    for (const std::string& path : listed) {
      if (paths.count(path) == 0) {
        verified.push_back(VerifiedFile{path, "missing: common.pt lists it; copy the whole iteration directory", ""});
      }
    }
    return verified;
  }
};

}  // namespace

const CheckpointStrategy& torch_checkpoint_strategy() {
  static const TorchStrategy strategy;
  return strategy;
}

}  // namespace bridge::training
