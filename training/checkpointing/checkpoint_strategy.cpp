// The formats by name and by what a directory holds (see checkpoint_strategy.h).
#include "training/checkpointing/checkpoint_strategy.h"

#include <sstream>
#include <stdexcept>

namespace bridge::training {

// Each format's one instance, in its own file.
const CheckpointStrategy& torch_checkpoint_strategy();
const CheckpointStrategy& torch_dist_checkpoint_strategy();

const CheckpointStrategy& checkpoint_strategy(std::string_view format) {
  if (format == "torch") return torch_checkpoint_strategy();
  if (format == "torch_dist") return torch_dist_checkpoint_strategy();
  throw std::invalid_argument("checkpoint.ckpt_format '" + std::string(format) +
                              "' is not a format bridge writes; use torch_dist (Megatron-Core's distributed "
                              "checkpoint, the default) or torch (Megatron's legacy files)");
}

const CheckpointStrategy& strategy_of(const std::filesystem::path& directory) {
  const CheckpointStrategy& dist = torch_dist_checkpoint_strategy();
  return dist.recognises(directory) ? dist : torch_checkpoint_strategy();
}

bool complete_checkpoint(const std::filesystem::path& directory) {
  return torch_dist_checkpoint_strategy().complete(directory) || torch_checkpoint_strategy().complete(directory);
}

std::set<std::string> gathered_name_set(const std::vector<std::string>& gathered_names) {
  std::set<std::string> names;
  for (const std::string& text : gathered_names) {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) names.insert(line);
  }
  return names;
}

}  // namespace bridge::training
