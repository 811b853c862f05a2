// config.json and the safetensors weights of a Hugging Face model directory, single-file or sharded, and the artifacts
// an export writes beside them.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <stdexcept>
#include <vector>

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

std::map<std::string, torch::Tensor> read_weights(const fs::path& directory,
                                                  const std::function<bool(const std::string&)>& needed) {
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
  for (const auto& [name, file] : map->items()) {
    if (!needed || needed(name)) shards.insert(file.get<std::string>());
  }
  std::map<std::string, torch::Tensor> tensors;
  for (const std::string& shard : shards) {
    if (shard.find('/') != std::string::npos) {
      throw std::runtime_error(index_path.string() + ": shard '" + shard + "' is not a file of the directory");
    }
    for (auto& [name, tensor] : utils::read_safetensors(directory / shard).tensors) tensors[name] = std::move(tensor);
  }
  for (const auto& [name, file] : map->items()) {
    if (shards.count(file.get<std::string>()) > 0 && tensors.count(name) == 0) {
      throw std::runtime_error(index_path.string() + " places " + name + " in " + file.get<std::string>() +
                               ", which does not hold it");
    }
  }
  return tensors;
}

namespace {

bool is_weight_file(const std::string& name) {
  const bool shard = name.rfind("model-", 0) == 0 && name.find("-of-") != std::string::npos &&
                     fs::path(name).extension() == ".safetensors";
  return shard || name == "model.safetensors" || name == "model.safetensors.index.json";
}

// The files save_pretrained writes for a tokenizer: an export that writes some removes an earlier export's others, or
// AutoTokenizer would read them with the new ones (an old tokenizer_config.json's eos_token past the new vocabulary).
bool is_tokenizer_file(const std::string& name) {
  static const std::set<std::string> names = {"tokenizer.json",    "tokenizer_config.json", "special_tokens_map.json",
                                              "added_tokens.json", "tokenizer.model",       "vocab.json",
                                              "merges.txt",        "chat_template.jinja",   "chat_template.json"};
  return names.count(name) > 0;
}

// config.json as the source had it where the export cannot know better: its token ids (a tokenizer of the run's own
// replaces them) and its context, which an import does not change (the training seq_length when that is longer).
void keep_source_fields(json& config, const json& source, const HfArtifacts& artifacts) {
  // Ids of another tokenizer replace all of the source's: its pad id names a token of its own vocabulary.
  const bool new_ids = artifacts.bos_token_id || artifacts.eos_token_id;
  if (!new_ids) {
    // An explicit null too: a family whose class defaults are other ids (OLMoE's eos 50279) would read those.
    for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
      if (const auto it = source.find(key); it != source.end()) config[key] = *it;
    }
  }
  if (artifacts.bos_token_id) config["bos_token_id"] = *artifacts.bos_token_id;
  if (artifacts.eos_token_id) config["eos_token_id"] = *artifacts.eos_token_id;
  const auto context = config.find("max_position_embeddings");
  if (context != config.end()) {
    const auto theirs = value_or<int64_t>(source, "max_position_embeddings", 0);
    if (theirs > context->get<int64_t>()) *context = theirs;
  }
}

// generation_config.json: the source's as it is, unless a tokenizer of the run's own changes its ids; else what
// transformers' save_pretrained writes for a model without one (GenerationConfig.from_model_config).
std::string generation_config(const json& config, const HfArtifacts& artifacts) {
  const fs::path theirs = artifacts.source / "generation_config.json";
  const bool new_ids = artifacts.bos_token_id || artifacts.eos_token_id;
  if (!artifacts.source.empty() && fs::exists(theirs)) {
    if (!new_ids) return utils::read_file(theirs);
    json generation = parse_file(theirs, "");
    generation.erase("pad_token_id");  // the source tokenizer's
    for (const char* key : {"bos_token_id", "eos_token_id"}) {
      if (config.contains(key)) {
        generation[key] = config[key];
      } else {
        generation.erase(key);
      }
    }
    return generation.dump(2) + "\n";
  }
  json generation = {{"_from_model_config", true}};
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (config.contains(key)) generation[key] = config[key];
  }
  return generation.dump(2) + "\n";
}

}  // namespace

void write_directory(const fs::path& directory, const std::map<std::string, torch::Tensor>& tensors, json config,
                     int64_t max_shard_bytes, const HfArtifacts& artifacts) {
  if (max_shard_bytes <= 0) {
    throw std::invalid_argument("the largest shard must be a positive number of bytes, got " +
                                std::to_string(max_shard_bytes));
  }
  // Everything read before anything is written: a missing source fails with the directory untouched.
  const json source = artifacts.source.empty() ? json::object() : read_config(artifacts.source);
  keep_source_fields(config, source, artifacts);
  std::map<std::string, std::string> texts = artifacts.texts;
  for (const auto& [name, file] : artifacts.files) texts[name] = utils::read_file(file);
  texts["generation_config.json"] = generation_config(config, artifacts);
  // The outermost folder this export makes, removed again when it fails: a failed first export leaves nothing.
  fs::path made;
  for (fs::path p = fs::absolute(directory).lexically_normal(); !fs::exists(p); p = p.parent_path()) made = p;
  const fs::path staging = directory / (".bridge-export-" + std::to_string(::getpid()));
  std::vector<std::string> written;  // in the order they move into place: weights first, config.json last
  try {
    fs::create_directories(directory);
    fs::remove_all(staging);
    fs::create_directories(staging);
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
      utils::write_safetensors(staging / "model.safetensors", tensors);
      written.push_back("model.safetensors");
    } else {
      json weight_map = json::object();
      for (std::size_t i = 0; i < shards.size(); ++i) {
        char file[64];
        std::snprintf(file, sizeof(file), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
        utils::write_safetensors(staging / file, shards[i]);
        written.push_back(file);
        for (const auto& entry : shards[i]) weight_map[entry.first] = file;
      }
      const json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
      texts["model.safetensors.index.json"] = index.dump(2) + "\n";
    }
    texts["config.json"] = config.dump(2) + "\n";
    for (const auto& [name, text] : texts) {
      if (name == "config.json") continue;
      utils::write_file_durably(staging / name, text);
      written.push_back(name);
    }
    utils::write_file_durably(staging / "config.json", texts["config.json"]);
    written.push_back("config.json");
    // Each rename is atomic, so a crash (or a failed rename) from here on leaves every file whole: those moved so far
    // beside the earlier export's others (config.json, moved last, still the earlier one's), and, after a crash, the
    // staging folder with the rest, which the next export does not remove (another pid's name): delete it.
    std::size_t moved = 0;
    try {
      for (; moved < written.size(); ++moved) fs::rename(staging / written[moved], directory / written[moved]);
    } catch (const std::exception& e) {
      throw std::runtime_error("moving the export into " + directory.string() + " failed with " +
                               std::to_string(moved) + " of its " + std::to_string(written.size()) +
                               " files moved, which replaced the earlier export's (" + e.what() +
                               "): fix the cause and export again");
    }
    const std::set<std::string> kept(written.begin(), written.end());
    const bool writes_tokenizer = std::any_of(written.begin(), written.end(), is_tokenizer_file);
    for (const fs::directory_entry& entry : fs::directory_iterator(directory)) {
      const std::string name = entry.path().filename().string();
      const bool stale = is_weight_file(name) || (writes_tokenizer && is_tokenizer_file(name));
      if (stale && kept.count(name) == 0) fs::remove(entry.path());
    }
    utils::fsync_directory(directory);
    fs::remove_all(staging);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(staging, ignored);
    if (!made.empty()) fs::remove_all(made, ignored);
    throw;
  }
}

std::string shape_of(const torch::Tensor& tensor) {
  std::string text = "[";
  for (int64_t d = 0; d < tensor.dim(); ++d) text += (d ? ", " : "") + std::to_string(tensor.size(d));
  return text + "]";
}

}  // namespace bridge::hf::detail
