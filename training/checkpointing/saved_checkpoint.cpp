// load_saved_weights and verify_checkpoint: the iteration directory, read by the strategy of the format that wrote it
// (checkpoint_strategy.h).
#include "training/checkpointing/saved_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "parallel/dist_checkpointing/sharded_tensor.h"
#include "training/checkpointing/checkpoint_state.h"
#include "training/checkpointing/checkpoint_strategy.h"
#include "training/checkpointing/checkpointing.h"
#include "training/config/config_yaml.h"
#include "utils/exception_message.h"
#include "utils/torch_pickle.h"

namespace bridge::training {
namespace fs = std::filesystem;

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
  strategy_of(root).read_weights(root, saved);
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
  return strategy_of(root).verify(root);
}

}  // namespace bridge::training
