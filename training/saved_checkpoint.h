// A saved checkpoint read outside a run, by tools that convert it (bridge-export): the config it was trained with
// and each model weight reassembled into its global tensor from the rank files of whatever layout saved it.
//
//   SavedWeights saved = load_saved_weights("ckpt");  // the tracker's iteration
//   hf::save_gpt2("gpt2-out", saved.tensors, saved.config.model);
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "training/config.h"

namespace bridge::training {

struct SavedWeights {
  ConfigContainer config;  ///< as the checkpoint recorded it (its resolved YAML)
  int64_t iteration = 0;
  std::string path;  ///< the iteration's directory
  /// Global tensors by name (models::global_named_parameters' names): the fp32 main values where the checkpoint was
  /// saved under mixed precision, else the model's, as float.
  std::map<std::string, torch::Tensor> tensors;
};

/// Reads iteration `iteration` of the checkpoint directory `directory` (checkpoint.save; null: its tracker's
/// iteration). Throws std::runtime_error naming the file when something is missing or does not fit together.
SavedWeights load_saved_weights(const std::string& directory, std::optional<int64_t> iteration = std::nullopt);

}  // namespace bridge::training
