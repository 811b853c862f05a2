// save_checkpoint and load_checkpoint: the directory layout, the tracker, the tensor index in common.pt, the guard
// against overwriting newer checkpoints, and the collectives that make every rank succeed or fail together.
#include "training/checkpointing.h"

#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "bridge/hf/gpt2.h"
#include "parallel/dist_checkpointing/sharded_tensor.h"
#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "training/callbacks/callback_state.h"
#include "training/checkpoint_state.h"
#include "utils/durable_file.h"
#include "utils/exception_message.h"
#include "utils/logging.h"
#include "utils/strings.h"
#include "utils/torch_pickle.h"
#include "utils/zip_archive.h"

namespace bridge::training {
namespace fs = std::filesystem;
namespace {

using GenericDict = c10::impl::GenericDict;
using GenericList = c10::impl::GenericList;
using bridge::utils::DamagedFileError;

constexpr char kTracker[] = "latest_checkpointed_iteration.txt";
constexpr char kCommon[] = "common.pt";
constexpr char kRankFile[] = "model_optim_rng.pt";
// checkpoint.pretrained_checkpoint=hf:<dir> names a Hugging Face model directory.
constexpr char kHuggingFace[] = "hf:";

std::string relative_rank_file() {
  return model_parallel_directory_name(parallel::get_tensor_model_parallel_rank(),
                                       parallel::get_pipeline_model_parallel_rank(),
                                       parallel::get_pipeline_model_parallel_world_size()) +
         "/" + kRankFile;
}

void write_pickle(const fs::path& path, const c10::IValue& value) { bridge::utils::save_torch_pickle(path, value); }

GenericDict read_pickle(const fs::path& path) {
  const c10::IValue value = bridge::utils::load_torch_pickle(path);
  if (!value.isGenericDict())
    throw std::runtime_error(path.string() + " does not hold a dict; not a bridge checkpoint");
  return value.toGenericDict();
}

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
  } catch (const DamagedFileError&) {
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
  if (all_damaged) throw DamagedFileError(message);
  throw std::runtime_error(message);
}

// `message` with `what` in front, unless it already starts with it (another rank's failure, which names it).
std::string in_context(const std::string& what, const std::string& message) {
  return message.rfind(what, 0) == 0 ? message : what + ": " + message;
}

// The iterations of the complete (common.pt present) and incomplete iter_* directories under `root`.
std::map<int64_t, bool> checkpoint_iterations(const fs::path& root) {
  std::map<int64_t, bool> found;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(root, error)) {
    const std::string name = entry.path().filename().string();
    if (name.size() != 12 || name.rfind("iter_", 0) != 0 || !entry.is_directory()) continue;
    try {
      found[std::stoll(name.substr(5))] = fs::exists(entry.path() / kCommon);
    } catch (const std::exception&) {
    }
  }
  return found;
}

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

// What a killed run left in checkpoint.save: iteration directories without common.pt (a save cut short), complete
// ones newer than the tracker (killed between common.pt and the tracker, so never named by it), and stray *.tmp files
// (a write cut short). The tracked checkpoint and every complete one up to it are kept.
void remove_interrupted_saves(const fs::path& root) {
  std::error_code error;
  if (!fs::is_directory(root, error)) return;
  const std::optional<int64_t> tracked = read_latest_checkpointed_iteration(root.string());
  for (const auto& [iteration, complete] : checkpoint_iterations(root)) {
    const fs::path directory = root / checkpoint_directory_name(iteration);
    if (!complete && iteration != tracked) {
      remove_leftover(directory, "an interrupted save (no " + std::string(kCommon) + ")");
    } else if (complete && tracked && iteration > *tracked) {
      remove_leftover(directory, "a save interrupted before " + std::string(kTracker) + " named it");
    } else {
      // A kept checkpoint: only its temporary files go (nothing else under checkpoint.save is bridge's to remove).
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
  GenericDict shared = new_checkpoint_dict();  // rank 0: what common.pt copies from its own file
  std::vector<std::string> index;              // rank 0: every rank's tensor-index lines
  std::future<void> written;                   // this rank's file: deferred (sync) or on a thread (async_save)
};

namespace {

// The tracker's error hint when a save fails.
std::string failed_save(const std::string& what, const std::exception& error) {
  return in_context(what, bridge::utils::describe(error)) + ". " + kTracker +
         " still names the previous complete checkpoint; check that checkpoint.save is writable and has space.";
}

// Rank 0's common.pt: the shared state and the tensor index (which file holds which slices of every global tensor,
// for loads in other layouts).
GenericDict common_state(const PendingCheckpoint& pending) {
  GenericDict tensors = new_checkpoint_dict();
  std::set<std::string> files;
  for (const std::string& text : pending.index) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      std::vector<std::string> fields;
      std::istringstream parts(line);
      for (std::string field; std::getline(parts, field, '\t');) fields.push_back(field);
      GenericDict entry = new_checkpoint_dict();
      auto existing = tensors.find(c10::IValue(fields[0]));
      if (existing != tensors.end()) entry = existing->value().toGenericDict();
      GenericList holders(c10::AnyType::get());
      if (entry.contains(c10::IValue(std::string("files")))) {
        holders = entry.at(c10::IValue(std::string("files"))).toList();
      }
      holders.push_back(fields[1]);
      GenericList shape(c10::AnyType::get());
      std::istringstream sizes(fields[2]);
      for (std::string size; std::getline(sizes, size, ',');) shape.push_back(static_cast<int64_t>(std::stoll(size)));
      entry.insert_or_assign("global_shape", shape);
      entry.insert_or_assign("dtype", fields[3]);
      entry.insert_or_assign("files", holders);
      tensors.insert_or_assign(fields[0], entry);
      files.insert(fields[1]);
    }
  }
  GenericDict common = new_checkpoint_dict();
  for (const auto& item : pending.shared) common.insert(item.key(), item.value());
  GenericList file_list(c10::AnyType::get());
  for (const std::string& file : files) file_list.push_back(file);
  common.insert("files", file_list);
  common.insert("tensors", tensors);
  return common;
}

}  // namespace

std::string save_checkpoint(PretrainSetup& setup) {
  finalize_checkpoint_save(setup, /*blocking=*/true);  // the previous asynchronous save completes first
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
  const bool writer = setup.data_parallel_rank == 0;
  const std::vector<CheckpointParam> params = checkpoint_params(setup);
  const std::string rank_file = relative_rank_file();
  std::vector<std::string> skipped_user_state;

  // The snapshot: CPU copies of this rank's state as of this step, so the write may happen while training goes on.
  // Starting the write (a thread, with async_save) is inside the shared failure check too: it can fail on one rank.
  const bool async = setup.config.checkpoint.async_save;
  try {
    on_every_rank(pending->what, [&] {
      if (!writer) return;
      GenericDict own = rank_state_dict(setup, params, pending->iteration);
      if (setup.callbacks) {
        own.insert("callbacks", save_callback_states(*setup.callbacks));
        own.insert("user_state", save_user_state(setup.callbacks->user_state(), skipped_user_state));
      }
      if (parallel::get_rank() == 0) {
        for (const char* key : {"checkpoint_version", "iteration", "config", "parallel_layout", "train_state",
                                "opt_param_scheduler", "callbacks", "user_state"}) {
          auto it = own.find(c10::IValue(std::string(key)));
          if (it != own.end()) pending->shared.insert(key, it->value());
        }
      }
      pending->written = std::async(async ? std::launch::async : std::launch::deferred,
                                    [own, path = pending->directory / rank_file] { write_pickle(path, own); });
    });
  } catch (const std::exception& error) {
    throw std::runtime_error(failed_save(pending->what, error));
  }
  if (!skipped_user_state.empty() && parallel::get_rank() == 0) {
    bridge::utils::logger().warn(
        "user_state entries not saved in the checkpoint (their types are not numbers, bool, string, tensor, or "
        "vectors or string-keyed maps of those): {}",
        bridge::utils::join(skipped_user_state, ", "));
  }

  std::ostringstream lines;
  if (writer) {
    for (const CheckpointParam& entry : params) {
      if (entry.tied_copy) continue;
      lines << entry.name << '\t' << rank_file << '\t';
      for (int64_t size : entry.layout.global_shape) lines << size << ',';
      lines << '\t' << c10::toString(entry.param.scalar_type()) << '\n';
    }
  }
  pending->index = parallel::all_gather_strings(parallel::get_world_group(), lines.str());
  if (!pending->written.valid()) pending->written = std::async(std::launch::deferred, [] {});  // not a writer
  const std::string directory = pending->directory.string();
  setup.last_saved_step = pending->iteration;
  setup.pending_checkpoint = std::move(pending);
  if (!async) finalize_checkpoint_save(setup, /*blocking=*/true);
  return directory;
}

void finalize_checkpoint_save(PretrainSetup& setup, bool blocking) {
  if (!setup.pending_checkpoint) return;
  parallel::ProcessGroup& world = parallel::get_world_group();
  if (!blocking) {
    // common.pt may only name files that every rank has finished writing.
    const bool done =
        setup.pending_checkpoint->written.wait_for(std::chrono::seconds(0)) != std::future_status::timeout;
    torch::Tensor unfinished = torch::tensor({done ? 0L : 1L}, torch::kLong);
    world.all_reduce(unfinished);
    if (unfinished.item<int64_t>() > 0) return;
  }
  const std::shared_ptr<PendingCheckpoint> pending = std::move(setup.pending_checkpoint);
  try {
    on_every_rank(pending->what, [&] { pending->written.get(); });
  } catch (const std::exception& error) {
    throw std::runtime_error(failed_save(pending->what, error));
  }
  on_every_rank(pending->what, [&] {
    if (parallel::get_rank() != 0) return;
    write_pickle(pending->directory / kCommon, common_state(*pending));
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
}

namespace {

// Where a run takes its checkpoint from, as config.checkpoint resolves.
struct Source {
  fs::path directory;
  int64_t iteration = 0;
  bool weights_only = false;
  std::string origin;         // for the log: which setting chose it
  bool hugging_face = false;  // a transformers directory (config.json + model.safetensors), not a bridge checkpoint
};

std::optional<Source> resolve_source(const CheckpointConfig& config) {
  std::optional<Source> source;
  if (!config.load.empty()) {
    std::optional<int64_t> iteration = config.ckpt_step;
    if (!iteration) iteration = read_latest_checkpointed_iteration(config.load);
    if (iteration) {
      source = Source{config.load, *iteration, config.finetune, "checkpoint.load"};
    } else if (parallel::get_rank() == 0) {
      bridge::utils::logger().warn("checkpoint.load {} holds no checkpoint ({} is absent): nothing to resume",
                                   config.load, kTracker);
    }
  }
  if (!source && config.auto_resume) {
    if (std::optional<int64_t> latest = read_latest_checkpointed_iteration(config.save)) {
      source = Source{config.save, *latest, false, "checkpoint.auto_resume (checkpoint.save holds checkpoints)"};
    }
  }
  const std::string& pretrained = config.pretrained_checkpoint;
  if (!source && pretrained.rfind(kHuggingFace, 0) == 0) {
    source = Source{pretrained.substr(sizeof(kHuggingFace) - 1), 0, true, "checkpoint.pretrained_checkpoint", true};
  }
  if (!source && !pretrained.empty()) {
    std::optional<int64_t> iteration = read_latest_checkpointed_iteration(config.pretrained_checkpoint);
    if (!iteration) {
      throw std::invalid_argument("checkpoint.pretrained_checkpoint " + config.pretrained_checkpoint + " has no " +
                                  kTracker + "; point it at a directory that checkpoint.save wrote");
    }
    source = Source{config.pretrained_checkpoint, *iteration, true, "checkpoint.pretrained_checkpoint"};
  }
  // Never write over newer checkpoints without being told: the tracker would move back and orphan them.
  if (std::optional<int64_t> latest = read_latest_checkpointed_iteration(config.save)) {
    const int64_t start = source && !source->weights_only ? source->iteration : 0;
    std::error_code ignored;
    const bool rollback = source && config.ckpt_step && fs::equivalent(source->directory, config.save, ignored);
    if (*latest > start && !rollback) {
      throw std::invalid_argument(
          "checkpoint.save " + config.save + " already holds iteration " + std::to_string(*latest) + " (" + kTracker +
          "), but this run starts at iteration " + std::to_string(start) +
          (source ? " (from " + source->origin + " " + source->directory.string() + ")" : std::string()) +
          " and would overwrite its checkpoints. Resume from it (checkpoint.load=" + config.save +
          " or checkpoint.auto_resume=true), or set checkpoint.save to a new directory");
    }
    if (*latest > start && parallel::get_rank() == 0) {
      bridge::utils::logger().warn(
          "rolling back to iteration {} (checkpoint.ckpt_step) in checkpoint.save {}, which holds up to iteration {}: "
          "later checkpoints will be overwritten",
          start, config.save, *latest);
    }
  }
  return source;
}

// The weights of a Hugging Face GPT-2 directory, as a checkpoint of one file holding every tensor whole: the
// checkpoint loader's checks and copies then place each rank's slice in any layout (the vocabulary padding keeps
// its initial values, as a checkpoint saved with less padding leaves it).
LoadedCheckpoint load_hugging_face(PretrainSetup& setup, const fs::path& directory) {
  const std::vector<CheckpointParam> params = checkpoint_params(setup);
  const std::string path = (directory / "model.safetensors").string();
  std::map<std::string, LoadedFile> files;
  std::map<std::string, std::vector<std::string>> files_of;
  LoadOptions options;
  options.progress = options.optimizer = options.rng = false;
  const std::string what = "loading the Hugging Face GPT-2 " + directory.string();
  if (parallel::get_rank() == 0) {
    bridge::utils::logger().warn("loading the weights of the Hugging Face GPT-2 {} (checkpoint.pretrained_checkpoint)",
                                 directory.string());
  }
  try {
    on_every_rank(what, [&] {
      const std::map<std::string, torch::Tensor> weights = hf::load_gpt2_weights(directory, setup.config.model);
      GenericDict model = new_checkpoint_dict(), metadata = new_checkpoint_dict();
      for (const auto& [name, tensor] : weights) {
        model.insert(name, tensor);
        parallel::dist_checkpointing::ShardedTensorLayout whole;
        whole.global_shape = tensor.sizes().vec();
        metadata.insert(name, parallel::dist_checkpointing::to_ivalue(whole));
      }
      LoadedFile file{path, new_checkpoint_dict()};
      file.dict.insert("model", model);
      file.dict.insert("shard_metadata", metadata);
      file.dict.insert("optimizer", new_checkpoint_dict());
      files.emplace(path, std::move(file));
      for (const CheckpointParam& entry : params) files_of[entry.source_name()] = {path};
      check_loadable(params, files, files_of, options);
    });
  } catch (const std::exception& error) {
    throw std::runtime_error(in_context(what, bridge::utils::describe(error)));
  }
  load_parameters(setup, params, files, files_of, options);
  setup.fire_training(Event::kCheckpointLoad, [&](CallbackContext& ctx) {
    ctx.checkpoint = CheckpointInfo{directory.string(), 0};
  });
  return LoadedCheckpoint{directory.string(), 0};
}

// Reads and checks, on this rank, what it needs of the checkpoint in `directory`: common.pt, the files holding its
// parameters' slices, its own (tp, pp) file when the layout is unchanged. Modifies nothing of the run. Missing and
// damaged files throw DamagedFileError; a checkpoint that does not fit the model, std::runtime_error.
void read_checkpoint_files(const fs::path& directory, const std::vector<std::string>& gathered_names,
                           const std::vector<CheckpointParam>& params, const LoadOptions& options, int tp, int pp,
                           GenericDict& common, std::map<std::string, LoadedFile>& files,
                           std::map<std::string, std::vector<std::string>>& files_of, bool& same_layout,
                           std::string& own_file) {
  const fs::path common_path = directory / kCommon;
  if (!fs::exists(common_path)) {
    throw DamagedFileError(common_path.string() +
                           " is missing: the save of this iteration did not complete (or it is not a bridge "
                           "checkpoint). Choose a complete one with checkpoint.ckpt_step");
  }
  common = read_pickle(common_path);
  const GenericDict index = checkpoint_dict(common, "tensors", common_path.string());
  for (const c10::IValue& file : checkpoint_field(common, "files", common_path.string()).toListRef()) {
    if (!fs::exists(directory / file.toStringRef())) {
      throw DamagedFileError("the checkpoint's file " + (directory / file.toStringRef()).string() +
                             " is missing; copy the whole iteration directory, or choose another with "
                             "checkpoint.ckpt_step");
    }
  }
  std::set<std::string> model_names;
  for (const std::string& text : gathered_names) {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) model_names.insert(line);
  }
  for (const std::string& name : model_names) {
    if (!index.contains(c10::IValue(name))) {
      throw std::runtime_error("the checkpoint has no tensor " + name +
                               ", which the model has: it is of another model; make model.* match its config");
    }
  }
  for (const auto& item : index) {
    const std::string& name = item.key().toStringRef();
    if (model_names.count(name) == 0) {
      throw std::runtime_error("the checkpoint holds " + name +
                               ", which the model does not have: it is of another model; make model.* match its "
                               "config");
    }
    GenericList holders = item.value().toGenericDict().at(c10::IValue(std::string("files"))).toList();
    for (const c10::IValue& holder : holders) files_of[name].push_back((directory / holder.toStringRef()).string());
  }
  const GenericDict layout = checkpoint_dict(common, "parallel_layout", common_path.string());
  same_layout = checkpoint_field(layout, "tensor_model_parallel_size", "parallel_layout").toInt() == tp &&
                checkpoint_field(layout, "pipeline_model_parallel_size", "parallel_layout").toInt() == pp;
  if (same_layout) own_file = (directory / relative_rank_file()).string();
  std::set<std::string> needed;
  for (const CheckpointParam& entry : params) {
    for (const std::string& path : files_of.at(entry.source_name())) needed.insert(path);
  }
  if (!own_file.empty()) needed.insert(own_file);
  for (const std::string& path : needed) files.emplace(path, LoadedFile{path, read_pickle(path)});
  check_loadable(params, files, files_of, options);
}

// checkpoint.auto_resume's answer to a damaged latest checkpoint in checkpoint.save: the newest complete older one.
// Rank 0 first sets the damaged iteration aside (renamed <iter>.damaged, kept for inspection) and points the tracker
// at the older one, loudly: the tracker never moves back silently, and the next save's clean-up cannot take the
// damaged iteration for a leftover. Collective. Returns nullopt on every rank when the run may not fall back (the
// checkpoint was not auto-resume's choice); throws when there is nothing to fall back to.
// `own_damage` is this rank's own finding ("" when another rank found the damage).
std::optional<int64_t> fall_back_from_damaged(const CheckpointConfig& config, const Source& source,
                                              const std::string& own_damage) {
  // Only a checkpoint auto-resume chose: one that checkpoint.load or checkpoint.ckpt_step names was asked for.
  std::error_code ignored;
  const bool allowed = config.auto_resume && config.load.empty() && !config.ckpt_step && !source.weights_only &&
                       !config.save.empty() && fs::equivalent(source.directory, config.save, ignored);
  if (!allowed) return std::nullopt;
  if (!own_damage.empty()) bridge::utils::logger().error("{}", own_damage);
  const fs::path root = config.save;
  int64_t older = -1;
  if (parallel::get_rank() == 0) {
    for (const auto& [iteration, complete] : checkpoint_iterations(root)) {
      if (complete && iteration < source.iteration) older = iteration;  // ascending: the last one is the newest
    }
  }
  torch::Tensor agreed = torch::tensor({older}, torch::kLong);
  parallel::get_world_group().all_reduce(agreed, parallel::ReduceOp::kMax);
  older = agreed.item<int64_t>();
  const fs::path damaged = root / checkpoint_directory_name(source.iteration);
  if (older < 0) {
    throw DamagedFileError("checkpoint iteration " + std::to_string(source.iteration) + " in " + root.string() +
                           " is damaged (see the errors above) and checkpoint.save holds no complete older "
                           "checkpoint to fall back to; restore " +
                           damaged.string() + " from a copy, or start afresh with a new checkpoint.save");
  }
  on_every_rank("setting the damaged checkpoint " + damaged.string() + " aside", [&] {
    if (parallel::get_rank() != 0) return;
    fs::path aside = damaged.string() + ".damaged";
    for (int n = 2; fs::exists(fs::symlink_status(aside)); ++n)
      aside = damaged.string() + ".damaged." + std::to_string(n);
    fs::rename(damaged, aside);
    bridge::utils::fsync_directory(root);
    bridge::utils::write_file_durably(root / kTracker, std::to_string(older) + "\n");
    bridge::utils::logger().error(
        "checkpoint.auto_resume: checkpoint iteration {} is damaged; it is kept as {} for inspection, {} now names "
        "iteration {} (the newest complete checkpoint before it), and training resumes from there",
        source.iteration, aside.string(), kTracker, older);
  });
  return older;
}

}  // namespace

std::optional<LoadedCheckpoint> load_checkpoint(PretrainSetup& setup) {
  const CheckpointConfig& config = setup.config.checkpoint;
  std::optional<Source> source;
  on_every_rank("choosing the checkpoint to load", [&] { source = resolve_source(config); });
  // Every rank must load the same iteration (a file system not shared by every node would differ).
  parallel::ProcessGroup& world = parallel::get_world_group();
  const double mine = source ? static_cast<double>(source->iteration) : -1.0;
  torch::Tensor agreed = torch::tensor({mine, -mine}, torch::kDouble);
  world.all_reduce(agreed, parallel::ReduceOp::kMax);
  if (agreed[0].item<double>() != -agreed[1].item<double>()) {
    throw std::runtime_error("ranks found different checkpoints to load (this rank: " +
                             (source ? source->directory.string() + " iteration " + std::to_string(source->iteration)
                                     : std::string("none")) +
                             "); every node must see the same checkpoint directories");
  }
  if (!source) return std::nullopt;
  if (source->hugging_face) return load_hugging_face(setup, source->directory);

  LoadOptions options;
  options.progress = !source->weights_only;
  options.optimizer = options.progress && !config.no_load_optim;
  options.rng = options.progress && !config.no_load_rng;
  options.optimizer_type = setup.config.optimizer.optimizer;

  const std::vector<CheckpointParam> params = checkpoint_params(setup);
  GenericDict common = new_checkpoint_dict();
  std::map<std::string, LoadedFile> files;
  std::map<std::string, std::vector<std::string>> files_of;
  const int tp = parallel::get_tensor_model_parallel_world_size();
  const int pp = parallel::get_pipeline_model_parallel_world_size();
  bool same_layout = false;
  std::string own_file;  // this rank's (tp, pp) file when the layout is unchanged

  // Every model name of the job, to compare with the checkpoint's index on every rank alike (shapes are checked
  // slice by slice on the ranks that load them).
  std::ostringstream names;
  if (setup.data_parallel_rank == 0) {
    for (const CheckpointParam& entry : params) {
      if (!entry.tied_copy) names << entry.name << '\n';
    }
  }
  const std::vector<std::string> gathered = parallel::all_gather_strings(world, names.str());

  fs::path directory;
  for (;;) {  // once, or again after an auto-resume fell back from a damaged checkpoint
    directory = source->directory / checkpoint_directory_name(source->iteration);
    if (parallel::get_rank() == 0) {
      bridge::utils::logger().warn("{} checkpoint {} (chosen by {})",
                                   source->weights_only ? "loading the weights of" : "resuming from",
                                   directory.string(), source->origin);
    }
    common = new_checkpoint_dict();
    files.clear();
    files_of.clear();
    own_file.clear();
    const std::string what = "loading checkpoint " + directory.string();
    std::string own_damage;
    try {
      on_every_rank(what, [&] {
        try {
          read_checkpoint_files(directory, gathered, params, options, tp, pp, common, files, files_of, same_layout,
                                own_file);
        } catch (const DamagedFileError& error) {
          own_damage = in_context(what, bridge::utils::describe(error));
          throw;
        }
      });
      break;
    } catch (const DamagedFileError& error) {
      const std::optional<int64_t> older = fall_back_from_damaged(config, *source, own_damage);
      if (!older) throw DamagedFileError(in_context(what, bridge::utils::describe(error)));
      source->iteration = *older;
    } catch (const std::exception& error) {
      throw std::runtime_error(in_context(what, bridge::utils::describe(error)));
    }
  }

  // Nothing was modified so far; every rank's check passed.
  load_parameters(setup, params, files, files_of, options);
  LoadedCheckpoint loaded{directory.string(), source->iteration};
  if (options.progress) {
    load_progress(setup, common);
    setup.last_saved_step = setup.state.train_state.step;
  }
  if (options.optimizer && setup.mixed_precision && setup.mixed_precision->grad_scaler() != nullptr && !files.empty()) {
    const LoadedFile& file = same_layout ? files.at(own_file) : files.begin()->second;
    const GenericDict optimizer = checkpoint_dict(file.dict, "optimizer", file.path);
    auto scaler = optimizer.find(c10::IValue(std::string("grad_scaler")));
    if (scaler != optimizer.end()) {
      const GenericDict state = scaler->value().toGenericDict();
      setup.mixed_precision->grad_scaler()->load_state(
          checkpoint_field(state, "scale", file.path).toDouble(),
          checkpoint_field(state, "growth_tracker", file.path).toInt(),
          checkpoint_field(state, "hysteresis_tracker", file.path).toInt());
    }
  }
  if (options.rng && same_layout) {
    load_rng_state(files.at(own_file).dict, own_file);
    loaded.rng_loaded = true;
  } else if (options.rng && parallel::get_rank() == 0) {
    bridge::utils::logger().warn(
        "the checkpoint was saved with another tensor- or pipeline-parallel size: its RNG streams do not map to "
        "this layout, so they start from rng.seed");
  }
  if (options.progress && setup.callbacks) {
    // Callback state of this rank's own (tp, pp) file when the layout is unchanged, else rank 0's.
    const GenericDict& holder = same_layout ? files.at(own_file).dict : common;
    const std::string path = same_layout ? own_file : (directory / kCommon).string();
    auto callbacks = holder.find(c10::IValue(std::string("callbacks")));
    if (callbacks != holder.end()) load_callback_states(*setup.callbacks, callbacks->value(), path);
    auto user_state = holder.find(c10::IValue(std::string("user_state")));
    if (user_state != holder.end()) load_user_state(setup.callbacks->user_state(), user_state->value(), path);
  }
  if (parallel::get_rank() == 0) {
    bridge::utils::logger().info("loaded checkpoint {} at iteration {}", directory.string(), source->iteration);
  }
  setup.fire_training(Event::kCheckpointLoad, [&](CallbackContext& ctx) {
    ctx.checkpoint = CheckpointInfo{directory.string(), source->iteration};
  });
  return loaded;
}

}  // namespace bridge::training
