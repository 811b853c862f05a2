// What the Hugging Face bridges share (internal to bridge/hf/): config.json read with the file named in errors, its
// values with defaults, the weights of a directory (model.safetensors, or the shards model.safetensors.index.json
// names, as checkpoints of large models come), and writing a directory back with its artifacts (hf_artifacts.h).
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "bridge/hf/hf_artifacts.h"

namespace bridge::hf::detail {

/// `directory`/config.json parsed; std::runtime_error naming the file when it is missing or not JSON.
nlohmann::json read_config(const std::filesystem::path& directory);

/// config[key], or `fallback` when the key is absent or null.
template <class T>
T value_or(const nlohmann::json& config, const char* key, T fallback) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  return it->get<T>();
}

/// Every tensor of the directory's model.safetensors, or of the files model.safetensors.index.json's weight_map
/// names; std::runtime_error naming what is missing. With `needed`, a sharded directory's shards holding no tensor it
/// accepts are not read (a rank of an expert-parallel run skips the shards of other ranks' experts).
std::map<std::string, torch::Tensor> read_weights(const std::filesystem::path& directory,
                                                  const std::function<bool(const std::string&)>& needed = {});

/// Writes config.json and the weights (creating the directory): one model.safetensors when they fit in
/// `max_shard_bytes`, else transformers' shards, model-00001-of-0000N.safetensors each at most that size (a larger
/// tensor alone), and model.safetensors.index.json; and generation_config.json and `artifacts`' files, config.json
/// keeping the source's token ids and context (hf_artifacts.h). Every file is written into a folder of its own in
/// the directory first and moved into place only when all are written, so a failure leaves the directory as it was
/// (a failed first export leaves none; a failed move, which the error says, leaves those moved so far); then an earlier
/// export's weight files that this one does not replace are removed, so that transformers does not read a stale one,
/// and, when this one writes tokenizer files, the earlier one's tokenizer files (tokenizer_config.json, vocab.json,
/// ...) that it does not write. Files of other names are left alone.
void write_directory(const std::filesystem::path& directory, const std::map<std::string, torch::Tensor>& tensors,
                     nlohmann::json config, int64_t max_shard_bytes, const HfArtifacts& artifacts);

/// "[3, 4]"
std::string shape_of(const torch::Tensor& tensor);

}  // namespace bridge::hf::detail
