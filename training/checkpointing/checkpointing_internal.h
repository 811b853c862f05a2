// What save_checkpoint (checkpointing.cpp) and load_checkpoint (checkpoint_loading.cpp) share: the file names of
// the layout, the pickle files, the iteration directories found in checkpoint.save, and on_every_rank, the agreement
// that makes every rank succeed or fail together. Internal to those two files.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/distributed.h"
#include "training/pretrain_setup.h"
#include "utils/exception_message.h"
#include "utils/strings.h"
#include "utils/zip_archive.h"

namespace bridge::training::detail {

inline constexpr char kTracker[] = "latest_checkpointed_iteration.txt";
inline constexpr char kCommon[] = "common.pt";
inline constexpr char kRankFile[] = "model_optim_rng.pt";

/// This rank's file, relative to the iteration directory: "mp_rank_01_000/model_optim_rng.pt".
std::string relative_rank_file();

void write_pickle(const std::filesystem::path& path, const c10::IValue& value);
/// Logs (rank 0) the user_state entries a save left out.
void warn_skipped_user_state(const std::vector<std::string>& skipped);

/// A checkpoint file's dict; throws when the file does not hold one (DamagedFileError when it is damaged).
c10::impl::GenericDict read_pickle(const std::filesystem::path& path);

/// `message` with `what` in front, unless it already starts with it (another rank's failure, which names it).
std::string in_context(const std::string& what, const std::string& message);

/// The iterations of the complete (committed in some format) and incomplete iter_* directories under `root`.
std::map<int64_t, bool> checkpoint_iterations(const std::filesystem::path& root);

// Runs `work` on this rank and makes every rank learn whether it failed anywhere: a failure throws on every rank
// (this rank's own exception, or one naming the failing ranks), so no rank waits at a collective the others left.
// Every rank throws the same kind: DamagedFileError when each failure was one (a load may then fall back to an
// older checkpoint, a decision all ranks must take together), std::runtime_error otherwise.
template <class Work>
void on_every_rank(const std::string& what, Work&& work) {
  enum : int64_t { kFine = 0, kFailed = 1, kDamaged = 2 };
  std::exception_ptr error;
  int64_t kind = kFine;
  try {
    work();
  } catch (const bridge::utils::DamagedFileError&) {
    error = std::current_exception();
    kind = kDamaged;
  } catch (...) {
    error = std::current_exception();
    kind = kFailed;
  }
  parallel::ProcessGroup& world = parallel::get_world_group();
  torch::Tensor failed = torch::zeros({world.size()}, torch::kLong);
  failed[world.rank()] = kind;
  world.all_reduce(failed);
  if (failed.sum().item<int64_t>() == 0) return;
  note_agreed_failure();
  std::vector<int> ranks;
  bool all_damaged = true;
  for (int r = 0; r < world.size(); ++r) {
    const int64_t theirs = failed[r].item<int64_t>();
    if (theirs != kFine) ranks.push_back(r);
    all_damaged = all_damaged && theirs != kFailed;
  }
  if (error && (all_damaged || kind == kFailed)) std::rethrow_exception(error);
  if (error) throw std::runtime_error(bridge::utils::exception_message(error));  // drop the type: others failed
  const std::string message = what + " failed on rank(s) " + bridge::utils::join(ranks, ", ") + "; see their errors";
  if (all_damaged) throw bridge::utils::DamagedFileError(message);
  throw std::runtime_error(message);
}

}  // namespace bridge::training::detail
