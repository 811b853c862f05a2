// Saving checkpoints in Megatron's directory layout:
//   <save>/iter_0000007/mp_rank_<tp>[_<pp>]/model_optim_rng.pt   (one file per model-parallel rank)
//   <save>/latest_checkpointed_iteration.txt                      (the newest complete iteration)
// Data-parallel rank 0 of each model-parallel rank writes its chunks and optimizer state (the other replicas hold the
// same). Each file is written under a temporary name and renamed, and the tracker file changes only after every rank
// finished, so an interrupted save never leaves a damaged checkpoint under a final name.
#pragma once

#include <cstdint>
#include <string>

#include "training/pretrain_setup.h"

namespace bridge::training {

/// "iter_0000007": Megatron's directory name for an iteration.
std::string checkpoint_directory_name(int64_t iteration);

/// Saves the current iteration under config.checkpoint.save, waits for every rank, then fires on_checkpoint_save.
/// Returns the iteration's directory.
std::string save_checkpoint(PretrainSetup& setup);

}  // namespace bridge::training
