// Checkpoints in Megatron's directory layout, loadable in any parallel layout:
//   <save>/iter_0000007/mp_rank_<tp>[_<pp>][_<ep>]/model_optim_rng.pt   one per model-parallel rank (its slices)
//   <save>/iter_0000007/common.pt                                  what every rank shares, and the tensor index
//   <save>/latest_checkpointed_iteration.txt                       the newest complete iteration
// Every file is PyTorch's pickle format (torch.load(path, weights_only=True) opens it; see checkpoint_state.h).
// Data-parallel rank 0 of each model-parallel rank writes its file, and with MoE expert parallelism (_<ep>, the
// expert-parallel rank, only at expert_model_parallel_size > 1) expert data-parallel rank 0 too, so every
// expert-parallel rank's experts are written (from a snapshot on a background thread with checkpoint.async_save);
// rank 0 writes common.pt once every rank file is on disk, then the tracker. Each file is fsynced and renamed into
// place, so a process killed at any moment leaves the tracker on a complete checkpoint.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "training/pretrain_setup.h"

namespace bridge::training {

/// "iter_0000007": Megatron's directory name for an iteration.
std::string checkpoint_directory_name(int64_t iteration);

/// 7 of "iter_0000007" (and 12345678 of "iter_12345678": past 10^7 iterations the name grows); nullopt for any other
/// name.
std::optional<int64_t> iteration_of_directory_name(const std::string& name);

/// The iteration latest_checkpointed_iteration.txt in `directory` names; nullopt when there is none. Throws when the
/// file exists but does not hold an iteration.
std::optional<int64_t> read_latest_checkpointed_iteration(const std::string& directory);

/// Saves the current iteration under config.checkpoint.save. Without checkpoint.async_save it waits for every rank,
/// then fires on_checkpoint_save; with it, it takes a snapshot, writes on a background thread and leaves the rest to
/// finalize_checkpoint_save (a previous pending save is finalised first). Returns the iteration's directory.
std::string save_checkpoint(PretrainSetup& setup);

/// Completes a pending asynchronous save once every rank has written its file: rank 0 writes the index and the
/// tracker, then on_checkpoint_save fires; then checkpoint.also_save_hf_checkpoint's hf/ write (hf_checkpoint.h),
/// whose failure throws here on every rank. Non-blocking (one small collective while a save or an hf/ write is
/// pending), it returns at once when some rank is still writing; blocking, it waits for both. Collective: every rank
/// calls it at the same point.
void finalize_checkpoint_save(PretrainSetup& setup, bool blocking);

/// What load_checkpoint did.
struct LoadedCheckpoint {
  std::string path;         ///< the iteration's directory
  int64_t iteration = 0;    ///< the iteration it holds
  bool rng_loaded = false;  ///< the RNG streams were restored (Megatron-Bridge then protects them around data init)
};

/// Loads what config.checkpoint asks for (checkpoint.load, an auto-resume from checkpoint.save, or the weights of
/// checkpoint.pretrained_checkpoint) into the setup, after checking on every rank that it fits; then fires
/// on_checkpoint_load. Returns nothing when there was nothing to load. Throws, before anything is modified, when the
/// checkpoint does not fit the config, or when the run would overwrite newer checkpoints in checkpoint.save.
std::optional<LoadedCheckpoint> load_checkpoint(PretrainSetup& setup);

}  // namespace bridge::training
