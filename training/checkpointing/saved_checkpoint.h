// A saved checkpoint read outside a run, by tools: the config it was trained with and each model weight reassembled
// into its global tensor from the rank files of whatever layout saved it (bridge-export), and the verification of
// every file of an iteration (bridge-checkpoint verify).
//
//   SavedWeights saved = load_saved_weights("ckpt");  // the tracker's iteration
//   hf::save_hf("hf-out", saved.tensors, saved.config.model);
//   for (const VerifiedFile& file : verify_checkpoint("ckpt/iter_0000020")) if (!file.intact()) ...
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "training/config/config.h"

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

/// One file of a checkpoint iteration, as verify_checkpoint found it.
struct VerifiedFile {
  std::string path;     ///< relative to the iteration's directory
  std::string problem;  ///< what is wrong with it (damaged, missing, unreadable); empty when intact
  std::string checked;  ///< which checksums held: "whole-file CRC32" or "CRC32 of every entry"
  bool intact() const { return problem.empty(); }
};

/// Verifies every file of one iteration directory (<checkpoint.save>/iter_XXXXXXX) without training: common.pt and
/// each file it lists are present, and every *.pt file in it has the checksums it was written with and reads as a
/// PyTorch file. Throws std::runtime_error when `iteration_directory` is not a directory.
std::vector<VerifiedFile> verify_checkpoint(const std::string& iteration_directory);

}  // namespace bridge::training
