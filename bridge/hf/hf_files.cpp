// config.json and the safetensors weights of a Hugging Face model directory, single-file or sharded.
#include <cstdio>
#include <fstream>
#include <set>
#include <stdexcept>

#include "bridge/hf/hf_files_internal.h"
#include "utils/durable_file.h"
#include "utils/safetensors.h"

namespace bridge::hf::detail {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json parse_file(const fs::path& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path.string() + ": " + what);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw std::runtime_error(path.string() + " is not JSON: " + e.what());
  }
}

}  // namespace

json read_config(const fs::path& directory) {
  return parse_file(directory / "config.json",
                    "a Hugging Face model directory holds config.json and model.safetensors (save_pretrained writes "
                    "them)");
}

std::map<std::string, torch::Tensor> read_weights(const fs::path& directory) {
  const fs::path single = directory / "model.safetensors";
  if (fs::exists(single)) return utils::read_safetensors(single).tensors;
  const fs::path index_path = directory / "model.safetensors.index.json";
  if (!fs::exists(index_path)) {
    throw std::runtime_error(single.string() +
                             " is missing, and so is model.safetensors.index.json: bridge reads safetensors weights "
                             "(save_pretrained writes them; a pytorch_model.bin is not read)");
  }
  const json index = parse_file(index_path, "");
  const auto map = index.find("weight_map");
  if (map == index.end() || !map->is_object()) {
    throw std::runtime_error(index_path.string() + " has no weight_map object: not a sharded safetensors index");
  }
  std::set<std::string> shards;
  for (const auto& [name, file] : map->items()) shards.insert(file.get<std::string>());
  std::map<std::string, torch::Tensor> tensors;
  for (const std::string& shard : shards) {
    if (shard.find('/') != std::string::npos) {
      throw std::runtime_error(index_path.string() + ": shard '" + shard + "' is not a file of the directory");
    }
    for (auto& [name, tensor] : utils::read_safetensors(directory / shard).tensors) tensors[name] = std::move(tensor);
  }
  for (const auto& [name, file] : map->items()) {
    if (tensors.count(name) == 0) {
      throw std::runtime_error(index_path.string() + " places " + name + " in " + file.get<std::string>() +
                               ", which does not hold it");
    }
  }
  return tensors;
}

void write_directory(const fs::path& directory, const std::map<std::string, torch::Tensor>& tensors, const json& config,
                     int64_t max_shard_bytes) {
  if (max_shard_bytes <= 0) {
    throw std::invalid_argument("the largest shard must be a positive number of bytes, got " +
                                std::to_string(max_shard_bytes));
  }
  fs::create_directories(directory);
  for (const fs::directory_entry& entry : fs::directory_iterator(directory)) {
    const std::string name = entry.path().filename().string();
    const bool shard = name.rfind("model-", 0) == 0 && name.find("-of-") != std::string::npos &&
                       entry.path().extension() == ".safetensors";
    if (shard || name == "model.safetensors" || name == "model.safetensors.index.json") fs::remove(entry.path());
  }
  // transformers' rule (its split_torch_state_dict_into_shards): in order, a tensor that would take the shard past
  // the limit starts the next one.
  std::vector<std::map<std::string, torch::Tensor>> shards(1);
  int64_t shard_bytes = 0, total_bytes = 0;
  for (const auto& [name, tensor] : tensors) {
    const auto bytes = static_cast<int64_t>(tensor.nbytes());
    if (!shards.back().empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().emplace(name, tensor);
    shard_bytes += bytes;
    total_bytes += bytes;
  }
  if (shards.size() == 1) {
    utils::write_safetensors(directory / "model.safetensors", tensors);
  } else {
    json weight_map = json::object();
    for (std::size_t i = 0; i < shards.size(); ++i) {
      char file[64];
      std::snprintf(file, sizeof(file), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      utils::write_safetensors(directory / file, shards[i]);
      for (const auto& entry : shards[i]) weight_map[entry.first] = file;
    }
    const json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
    utils::write_file_durably(directory / "model.safetensors.index.json", index.dump(2) + "\n");
  }
  utils::write_file_durably(directory / "config.json", config.dump(2) + "\n");
}

std::string shape_of(const torch::Tensor& tensor) {
  std::string text = "[";
  for (int64_t d = 0; d < tensor.dim(); ++d) text += (d ? ", " : "") + std::to_string(tensor.size(d));
  return text + "]";
}

}  // namespace bridge::hf::detail
