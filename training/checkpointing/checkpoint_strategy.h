// The on-disk formats of checkpoints, each one strategy behind one interface (as Megatron-Core's
// dist_checkpointing/strategies), so that save_checkpoint and load_checkpoint (the tracker, keep-N, async saves,
// auto-resume's fall-back, the agreement of every rank, callbacks) never ask which format they handle:
//   torch       Megatron's legacy files, mp_rank_<tp>[_<pp>][_<ep>]/model_optim_rng.pt from data-parallel rank 0 and
//               common.pt (torch_strategy.cpp)
//   torch_dist  PyTorch Distributed Checkpoint files in Megatron-Core's layout, every rank writing its own shards
//               (torch_dist_strategy.cpp)
// A save is a PendingSave: built collectively at the save step (a snapshot), written by every rank (on a background
// thread under checkpoint.async_save), then committed by rank 0 once every rank has written; the tracker comes last.
// A load asks the format for this rank's slices as LoadedFile dicts (checkpoint_state.h), which the loader checks and
// applies the same way whatever the format.
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "training/checkpointing/checkpoint_state.h"
#include "training/checkpointing/saved_checkpoint.h"
#include "training/pretrain_setup.h"

namespace bridge::training {

/// What a format's reader found for this rank: the shared state, the files holding its slices and, where the parallel
/// layout is unchanged, its own file (RNG streams, callbacks' state).
struct CheckpointRead {
  c10::impl::GenericDict common = new_checkpoint_dict();
  std::map<std::string, LoadedFile> files;
  std::map<std::string, std::vector<std::string>> files_of;  ///< global name -> the files holding its slices
  bool same_layout = false;
  std::string own_file;
};

/// One save between its snapshot and its commit.
class PendingSave {
 public:
  virtual ~PendingSave() = default;
  /// Writes this rank's files (nothing when it writes none); returns what commit() needs from this rank.
  virtual std::string write() = 0;
  /// On rank 0 once every rank's write() returned (`written[r]` is rank r's result): the files that make the
  /// checkpoint complete, the tracker excepted.
  virtual void commit(const std::vector<std::string>& written) = 0;
};

class CheckpointStrategy {
 public:
  virtual ~CheckpointStrategy() = default;
  /// checkpoint.ckpt_format's value for it.
  virtual std::string_view name() const = 0;
  /// Whether `directory` (an iteration's) was written in this format, complete or not.
  virtual bool recognises(const std::filesystem::path& directory) const = 0;
  /// Whether `directory` holds a complete checkpoint of this format (the file its commit writes last is there).
  virtual bool complete(const std::filesystem::path& directory) const = 0;
  /// Collective: this rank's snapshot of `iteration` for `directory`; `what` names the save in errors.
  virtual std::unique_ptr<PendingSave> begin_save(PretrainSetup& setup, const std::filesystem::path& directory,
                                                  int64_t iteration, const std::string& what) const = 0;
  /// Reads and checks, on this rank, what it needs of the checkpoint in `directory`; modifies nothing of the run.
  /// `gathered_names` is every rank's list of the global names it owns (newline-separated), to check the checkpoint
  /// holds the whole model and nothing else. Missing and damaged files throw utils::DamagedFileError; a checkpoint of
  /// another model ModelMismatchError; anything else std::runtime_error.
  virtual void read(PretrainSetup& setup, const std::filesystem::path& directory,
                    const std::vector<std::string>& gathered_names, const std::vector<CheckpointParam>& params,
                    const LoadOptions& options, CheckpointRead& out) const = 0;

  /// Outside a run (bridge-checkpoint convert): the state rank 0 saved for every layout, checked against its checksums:
  /// the config as YAML ("config"), the counters, the callbacks' state ("callbacks") and user_state. Missing or
  /// damaged: utils::DamagedFileError.
  virtual c10::impl::GenericDict read_common(const std::filesystem::path& directory) const = 0;
  /// Outside a run (bridge-export, bridge-checkpoint): the config and every model weight of the checkpoint in the
  /// iteration directory `directory`, whole (saved.iteration and saved.path are the caller's).
  virtual void read_weights(const std::filesystem::path& directory, SavedWeights& saved) const = 0;
  /// Every file of the iteration directory `directory`, checked against the checksums it was written with.
  virtual std::vector<VerifiedFile> verify(const std::filesystem::path& directory) const = 0;
};

/// The strategy of checkpoint.ckpt_format `format` ("torch", "torch_dist"); std::invalid_argument for another.
const CheckpointStrategy& checkpoint_strategy(std::string_view format);
/// The strategy of the checkpoint in the iteration directory `directory`, whichever format wrote it.
const CheckpointStrategy& strategy_of(const std::filesystem::path& directory);
/// Whether `directory` holds a complete checkpoint in some format.
bool complete_checkpoint(const std::filesystem::path& directory);

/// Every rank's global names, as `gathered_names` holds them, in one set.
std::set<std::string> gathered_name_set(const std::vector<std::string>& gathered_names);

}  // namespace bridge::training
