// save_checkpoint: the directory layout, the tracker, the tensor index in common.pt, leftovers of killed runs and
// most_recent_k, synchronously or on a thread, then checkpoint.also_save_hf_checkpoint's hf/ on a thread
// (hf_checkpoint.h); and what save and load share (checkpointing_internal.h).
#include "training/checkpointing/checkpointing.h"

#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "parallel/distributed.h"
#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/parallel_state.h"
#include "training/callbacks/callback_state.h"
#include "training/checkpointing/checkpoint_state.h"
#include "training/checkpointing/checkpoint_strategy.h"
#include "training/checkpointing/checkpointing_internal.h"
#include "training/checkpointing/hf_checkpoint.h"
#include "utils/durable_file.h"
#include "utils/exception_message.h"
#include "utils/logging.h"
#include "utils/strings.h"
#include "utils/torch_pickle.h"

namespace bridge::training {
namespace fs = std::filesystem;

namespace detail {

using GenericDict = c10::impl::GenericDict;

std::string relative_rank_file() {
  std::string directory = model_parallel_directory_name(
      parallel::get_tensor_model_parallel_rank(), parallel::get_pipeline_model_parallel_rank(),
      parallel::get_pipeline_model_parallel_world_size(), parallel::get_expert_model_parallel_rank(),
      parallel::get_expert_model_parallel_world_size());
  // An expert tensor-parallel group larger than the dense one splits an expert over ranks that share a dense
  // tensor-parallel rank: their expert tensor-parallel rank tells their files apart (Megatron's name has no place for
  // it; it never writes this layout in its legacy format).
  if (parallel::get_expert_tensor_parallel_world_size() > parallel::get_tensor_model_parallel_world_size()) {
    char suffix[16];
    std::snprintf(suffix, sizeof(suffix), "_etp%02d", parallel::get_expert_tensor_parallel_rank());
    directory += suffix;
  }
  return directory + "/" + kRankFile;
}

void write_pickle(const fs::path& path, const c10::IValue& value) { bridge::utils::save_torch_pickle(path, value); }

void warn_skipped_user_state(const std::vector<std::string>& skipped) {
  if (skipped.empty() || parallel::get_rank() != 0) return;
  bridge::utils::logger().warn(
      "user_state entries not saved in the checkpoint (their types are not numbers, bool, string, tensor, or vectors "
      "or string-keyed maps of those): {}",
      bridge::utils::join(skipped, ", "));
}

GenericDict read_pickle(const fs::path& path) {
  const c10::IValue value = bridge::utils::load_torch_pickle(path);
  if (!value.isGenericDict())
    throw std::runtime_error(path.string() + " does not hold a dict; not a bridge checkpoint");
  return value.toGenericDict();
}

std::string in_context(const std::string& what, const std::string& message) {
  return message.rfind(what, 0) == 0 ? message : what + ": " + message;
}

std::map<int64_t, bool> checkpoint_iterations(const fs::path& root) {
  std::map<int64_t, bool> found;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(root, error)) {
    const std::optional<int64_t> iteration = iteration_of_directory_name(entry.path().filename().string());
    if (iteration && entry.is_directory()) found[*iteration] = complete_checkpoint(entry.path());
  }
  return found;
}

}  // namespace detail

namespace {

using GenericDict = c10::impl::GenericDict;
using GenericList = c10::impl::GenericList;
using detail::checkpoint_iterations;
using detail::in_context;
using detail::kTracker;
using detail::on_every_rank;

// checkpoint.most_recent_k: deletes complete checkpoints older than the newest k, and leftovers of interrupted
// saves older than the newest; only after the new one is complete and named by the tracker.
void delete_old_checkpoints(const fs::path& root, int64_t newest, int64_t keep) {
  if (keep < 1) return;
  const std::map<int64_t, bool> found = checkpoint_iterations(root);
  int64_t kept = 0;
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    const auto [iteration, complete] = *it;
    if (iteration > newest) continue;
    if (complete && kept < keep) {
      ++kept;
      continue;
    }
    std::error_code error;
    fs::remove_all(root / checkpoint_directory_name(iteration), error);
    if (error) {
      bridge::utils::logger().warn("checkpoint.most_recent_k: could not delete {}: {}",
                                   (root / checkpoint_directory_name(iteration)).string(), error.message());
    }
  }
}

// Removes `path` (a file or a directory tree), logging what and why; a failure is only logged (the save goes on).
void remove_leftover(const fs::path& path, const std::string& why) {
  std::error_code error;
  fs::remove_all(path, error);
  if (error) {
    bridge::utils::logger().warn("could not remove {} ({}): {}", path.string(), why, error.message());
  } else {
    bridge::utils::logger().warn("removed {}: {}", path.string(), why);
  }
}

// What a killed run left in checkpoint.save: iteration directories never completed (a save cut short), complete
// ones newer than the tracker (killed between the commit and the tracker, so never named by it), and stray *.tmp files
// (a write cut short). The tracked checkpoint and every complete one up to it are kept.
void remove_interrupted_saves(const fs::path& root) {
  std::error_code error;
  if (!fs::is_directory(root, error)) return;
  const std::optional<int64_t> tracked = read_latest_checkpointed_iteration(root.string());
  for (const auto& [iteration, complete] : checkpoint_iterations(root)) {
    const fs::path directory = root / checkpoint_directory_name(iteration);
    if (!complete && iteration != tracked) {
      remove_leftover(directory, "an interrupted save (never completed)");
    } else if (complete && tracked && iteration > *tracked) {
      remove_leftover(directory, "a save interrupted before " + std::string(kTracker) + " named it");
    } else {
      // A kept checkpoint: only its temporary files go (nothing else under checkpoint.save is bridge's to remove).
      remove_interrupted_hf_write(directory);
      error.clear();
      for (auto it = fs::recursive_directory_iterator(directory, error);
           !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
        if (it->is_regular_file() && it->path().extension() == ".tmp") remove_leftover(it->path(), "a write cut short");
      }
    }
  }
  const fs::path tracker_tmp = root / (std::string(kTracker) + ".tmp");
  if (fs::exists(fs::symlink_status(tracker_tmp, error))) remove_leftover(tracker_tmp, "a write cut short");
}

}  // namespace

std::string checkpoint_directory_name(int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof(name), "iter_%07lld", static_cast<long long>(iteration));
  return name;
}

std::optional<int64_t> iteration_of_directory_name(const std::string& name) {
  constexpr std::size_t kPrefix = 5;  // "iter_"
  if (name.size() < kPrefix + 7 || name.size() > kPrefix + 18 || name.rfind("iter_", 0) != 0 ||
      name.find_first_not_of("0123456789", kPrefix) != std::string::npos) {
    return std::nullopt;
  }
  return std::stoll(name.substr(kPrefix));
}

std::optional<int64_t> read_latest_checkpointed_iteration(const std::string& directory) {
  if (directory.empty()) return std::nullopt;
  const fs::path tracker = fs::path(directory) / kTracker;
  if (!fs::exists(tracker)) return std::nullopt;
  std::string text = bridge::utils::read_file(tracker);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  try {
    std::size_t used = 0;
    const int64_t iteration = std::stoll(text, &used);
    if (used == text.size() && iteration >= 0) return iteration;
  } catch (const std::exception&) {
  }
  throw std::runtime_error(tracker.string() + " holds '" + text +
                           "', not an iteration number; fix or delete it (the iter_* directories name the "
                           "checkpoints)");
}

// A save between its snapshot and its finalisation.
struct PendingCheckpoint {
  int64_t iteration = 0;
  fs::path root;
  fs::path directory;
  std::string what;  // "saving checkpoint iteration 7 under <dir>", for errors
  std::chrono::steady_clock::time_point started;
  std::unique_ptr<PendingSave> save;      // the format's snapshot and commit
  std::future<std::string> written;       // this rank's files: deferred (sync) or on a thread (async_save)
  bool committed = false;                 // the tracker names it; only `hf` may be left
  std::unique_ptr<HfCheckpointWrite> hf;  // checkpoint.also_save_hf_checkpoint's hf/, after the commit
};

namespace {

// The tracker's error hint when a save fails.
std::string failed_save(const std::string& what, const std::exception& error) {
  return in_context(what, bridge::utils::describe(error)) + ". " + kTracker +
         " still names the previous complete checkpoint; check that checkpoint.save is writable and has space.";
}

// Whether every rank's `done` holds (one small collective).
bool done_everywhere(bool done) {
  torch::Tensor unfinished = torch::tensor({done ? 0L : 1L}, torch::kLong);
  parallel::get_world_group().all_reduce(unfinished);
  return unfinished.item<int64_t>() == 0;
}

void finish_hf_checkpoint(PretrainSetup& setup, bool blocking) {
  PendingCheckpoint& pending = *setup.pending_checkpoint;
  if (!blocking && !done_everywhere(pending.hf->done())) return;
  const std::shared_ptr<PendingCheckpoint> finished = std::move(setup.pending_checkpoint);
  // The writer's failure fails the run here, on every rank at once (the checkpoint itself stays complete).
  on_every_rank(
      "checkpoint.also_save_hf_checkpoint: writing " + (finished->directory / kHfCheckpointDirectory).string(),
      [&] { finished->hf->wait(); });
}

void commit_checkpoint(PretrainSetup& setup, bool blocking) {
  parallel::ProcessGroup& world = parallel::get_world_group();
  // common.pt may only name files that every rank has finished writing.
  if (!blocking && !done_everywhere(setup.pending_checkpoint->written.wait_for(std::chrono::seconds(0)) !=
                                    std::future_status::timeout)) {
    return;
  }
  const std::shared_ptr<PendingCheckpoint> pending = std::move(setup.pending_checkpoint);
  std::string written;
  try {
    on_every_rank(pending->what, [&] { written = pending->written.get(); });
  } catch (const std::exception& error) {
    throw std::runtime_error(failed_save(pending->what, error));
  }
  const std::vector<std::string> every_rank = parallel::all_gather_strings(world, written);
  on_every_rank(pending->what, [&] {
    if (parallel::get_rank() != 0) return;
    try {
      pending->save->commit(every_rank);
    } catch (const std::exception& error) {
      throw std::runtime_error(failed_save(pending->what, error));
    }
    bridge::utils::write_file_durably(pending->root / kTracker, std::to_string(pending->iteration) + "\n");
    delete_old_checkpoints(pending->root, pending->iteration, setup.config.checkpoint.most_recent_k);
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - pending->started;
    bridge::utils::logger().info("saved checkpoint iteration {} to {} ({:.2f} s)", pending->iteration,
                                 pending->directory.string(), took.count());
  });
  setup.fire(Event::kCheckpointSave, [&](CallbackContext& ctx) {
    ctx.optimizer = setup.optimizer.get();  // no scheduler here, as in Megatron-Bridge
    ctx.checkpoint = CheckpointInfo{pending->directory.string(), pending->iteration};
  });
  if (setup.config.checkpoint.also_save_hf_checkpoint) {
    // From the committed files, which every rank now knows are complete; the pending save stays until it is written.
    pending->committed = true;
    // Starting the writer's thread may fail on that rank alone: every rank learns of it.
    on_every_rank(pending->what, [&] {
      pending->hf = std::make_unique<HfCheckpointWrite>(
          pending->directory, parallel::get_rank() == hf_checkpoint_writer_rank(world.size()));
    });
    setup.pending_checkpoint = pending;
  }
}

}  // namespace

std::string save_checkpoint(PretrainSetup& setup) {
  finalize_checkpoint_save(setup, /*blocking=*/true);  // the previous asynchronous save completes first
  parallel::distributed::finish_param_gathers();       // ddp.overlap_param_gather: the step's updates, whole
  auto pending = std::make_shared<PendingCheckpoint>();
  pending->iteration = setup.state.train_state.step;
  pending->root = setup.config.checkpoint.save;
  pending->directory = pending->root / checkpoint_directory_name(pending->iteration);
  pending->what =
      "saving checkpoint iteration " + std::to_string(pending->iteration) + " under " + pending->directory.string();
  pending->started = std::chrono::steady_clock::now();
  // Before any rank writes into the directory (the agreement is the barrier): nothing is in flight now.
  on_every_rank(pending->what, [&] {
    if (parallel::get_rank() == 0) remove_interrupted_saves(pending->root);
  });
  // The snapshot (collective; a failure on one rank fails it on all), then this rank's write: deferred, or on a thread
  // with async_save, so that training goes on while it writes. Starting the thread can fail on one rank too.
  const bool async = setup.config.checkpoint.async_save;
  try {
    const CheckpointStrategy& strategy = checkpoint_strategy(setup.config.checkpoint.ckpt_format);
    pending->save = strategy.begin_save(setup, pending->directory, pending->iteration, pending->what);
    on_every_rank(pending->what, [&] {
      pending->written = std::async(async ? std::launch::async : std::launch::deferred,
                                    [save = pending->save.get()] { return save->write(); });
    });
  } catch (const std::exception& error) {
    throw std::runtime_error(failed_save(pending->what, error));
  }
  const std::string directory = pending->directory.string();
  setup.last_saved_step = pending->iteration;
  setup.pending_checkpoint = std::move(pending);
  if (!async) commit_checkpoint(setup, /*blocking=*/true);  // the hf/ write (if any) goes on
  return directory;
}

void finalize_checkpoint_save(PretrainSetup& setup, bool blocking) {
  if (setup.pending_checkpoint && !setup.pending_checkpoint->committed) commit_checkpoint(setup, blocking);
  if (setup.pending_checkpoint && setup.pending_checkpoint->committed) finish_hf_checkpoint(setup, blocking);
}

}  // namespace bridge::training
