// load_saved_weights: common.pt's index names the files holding each tensor; each file's shard metadata places its
// slice in the global tensor. verify_checkpoint: every file of an iteration, read through the verifying loader.
#include "training/checkpointing/saved_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "parallel/dist_checkpointing/sharded_tensor.h"
#include "training/checkpointing/checkpoint_state.h"
#include "training/checkpointing/checkpointing.h"
#include "training/config/config_yaml.h"
#include "utils/exception_message.h"
#include "utils/torch_pickle.h"

namespace bridge::training {
namespace {

namespace fs = std::filesystem;
using GenericDict = c10::impl::GenericDict;

GenericDict read_dict(const fs::path& path) {
  if (!fs::exists(path)) throw std::runtime_error(path.string() + " is missing: not a complete bridge checkpoint");
  const c10::IValue value = bridge::utils::load_torch_pickle(path);
  if (!value.isGenericDict())
    throw std::runtime_error(path.string() + " does not hold a dict; not a bridge checkpoint");
  return value.toGenericDict();
}

}  // namespace

SavedWeights load_saved_weights(const std::string& directory, std::optional<int64_t> iteration) {
  if (!iteration) iteration = read_latest_checkpointed_iteration(directory);
  if (!iteration) {
    throw std::runtime_error(directory +
                             " has no latest_checkpointed_iteration.txt: not a checkpoint directory that "
                             "checkpoint.save wrote (or name the iteration)");
  }
  SavedWeights saved;
  saved.iteration = *iteration;
  const fs::path root = fs::path(directory) / checkpoint_directory_name(*iteration);
  saved.path = root.string();
  const std::string common_path = (root / "common.pt").string();
  const GenericDict common = read_dict(common_path);
  saved.config = load_config_yaml_string(checkpoint_field(common, "config", common_path).toStringRef(),
                                         common_path + " (its config)");
  std::map<std::string, GenericDict> files;
  const auto file = [&](const std::string& relative) -> const GenericDict& {
    auto it = files.find(relative);
    if (it == files.end()) {
      it = files.emplace(relative, read_dict(root / relative)).first;
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
      const parallel::dist_checkpointing::ShardedTensorLayout layout = parallel::dist_checkpointing::layout_from_ivalue(
          checkpoint_field(checkpoint_dict(rank_file, "shard_metadata", where), name, where), name + " in " + where);
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
  return saved;
}

std::vector<VerifiedFile> verify_checkpoint(const std::string& iteration_directory) {
  const fs::path root = iteration_directory;
  std::error_code error;
  if (!fs::is_directory(root, error)) {
    throw std::runtime_error(iteration_directory +
                             " is not a directory; give a checkpoint iteration directory "
                             "(<checkpoint.save>/iter_XXXXXXX) or a checkpoint.save directory");
  }
  std::set<std::string> paths{"common.pt"};
  for (auto it = fs::recursive_directory_iterator(root, error); !error && it != fs::recursive_directory_iterator();
       it.increment(error)) {
    if (it->is_regular_file() && it->path().extension() == ".pt") paths.insert(fs::relative(it->path(), root));
  }
  if (error) throw std::runtime_error("cannot list " + iteration_directory + ": " + error.message());
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

}  // namespace bridge::training
