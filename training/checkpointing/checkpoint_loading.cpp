// load_checkpoint: which checkpoint a run takes (checkpoint.load, auto-resume, pretrained weights, a Hugging Face
// directory), the guard against overwriting newer checkpoints, every rank's reading and checking before anything is
// applied, auto-resume's fall-back from a damaged checkpoint, and the application itself.
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bridge/hf/auto_bridge.h"
#include "parallel/dist_checkpointing/sharded_tensor.h"
#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "training/callbacks/callback_state.h"
#include "training/checkpointing/checkpoint_state.h"
#include "training/checkpointing/checkpoint_strategy.h"
#include "training/checkpointing/checkpointing.h"
#include "training/checkpointing/checkpointing_internal.h"
#include "utils/durable_file.h"
#include "utils/exception_message.h"
#include "utils/logging.h"
#include "utils/zip_archive.h"

namespace bridge::training {
namespace fs = std::filesystem;
namespace {

using GenericDict = c10::impl::GenericDict;
using GenericList = c10::impl::GenericList;
using bridge::utils::DamagedFileError;
using detail::checkpoint_iterations;
using detail::in_context;
using detail::kTracker;
using detail::on_every_rank;

// checkpoint.pretrained_checkpoint=hf:<dir> names a Hugging Face model directory.
constexpr char kHuggingFace[] = "hf:";

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

// The weights of a Hugging Face directory (GPT-2 or the Llama family), as a checkpoint of one file holding every tensor
// whole: the checkpoint loader's checks and copies then place each rank's slice in any layout (the vocabulary padding
// keeps its initial values, as a checkpoint saved with less padding leaves it).
LoadedCheckpoint load_hugging_face(PretrainSetup& setup, const fs::path& directory) {
  const std::vector<CheckpointParam> params = checkpoint_params(setup);
  const std::string path = (directory / "model.safetensors").string();
  std::map<std::string, LoadedFile> files;
  std::map<std::string, std::vector<std::string>> files_of;
  LoadOptions options;
  options.progress = options.optimizer = options.rng = false;
  const std::string what = "loading the Hugging Face model " + directory.string();
  if (parallel::get_rank() == 0) {
    bridge::utils::logger().info("loading the weights of the Hugging Face model {} (checkpoint.pretrained_checkpoint)",
                                 directory.string());
  }
  try {
    on_every_rank(what, [&] {
      // Only this rank's tensors: at expert parallelism > 1 another rank's experts are not even built.
      std::set<std::string> names;
      for (const CheckpointParam& entry : params) names.insert(entry.source_name());
      const std::map<std::string, torch::Tensor> weights = hf::load_hf_weights(
          directory, setup.config.model, [&names](const std::string& name) { return names.count(name) > 0; });
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

// What a checkpoint's saved config says of its sequence: model.seq_length and whether the positions are a learned
// table. Read softly: a config of another version (or none, as in a Megatron-Bridge checkpoint without bridge's
// config) gives nothing, and the load goes on without the notes that use it.
struct SavedSequence {
  int64_t seq_length = 0;
  bool learned_positions = false;
};
std::optional<SavedSequence> saved_sequence(const GenericDict& common) {
  const auto entry = common.find(c10::IValue(std::string("config")));
  if (entry == common.end() || !entry->value().isString()) return std::nullopt;
  try {
    const YAML::Node model = YAML::Load(entry->value().toStringRef())["model"];
    if (!model.IsMap() || !model["seq_length"]) return std::nullopt;
    const YAML::Node type = model["position_embedding_type"];
    // learned_absolute is the default, which a saved config of an older version may leave out.
    return SavedSequence{model["seq_length"].as<int64_t>(), !type || type.as<std::string>() == "learned_absolute"};
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// A learned absolute position table has one row per position, model.seq_length of them (as Megatron-Bridge builds
// GPTModel with max_sequence_length = seq_length): such a checkpoint goes on only at its own seq_length. Said after
// the mismatch when that is the case, because the generic fix (load it with its sizes) does not tell a user who meant
// to extend the context that this model cannot be extended.
std::string learned_positions_note(const GenericDict& common, const models::GPTConfig& run) {
  const std::optional<SavedSequence> saved = saved_sequence(common);
  if (!saved || !saved->learned_positions ||
      run.position_embedding_type != models::PositionEmbeddingType::kLearnedAbsolute ||
      saved->seq_length == run.seq_length) {
    return "";
  }
  return ". Learned absolute position embeddings (model.position_embedding_type learned_absolute) have one trained "
         "row per position, model.seq_length of them (" +
         std::to_string(saved->seq_length) + " in the checkpoint): the model goes on at model.seq_length " +
         std::to_string(saved->seq_length) + " only, and a phase at " + std::to_string(run.seq_length) +
         " tokens needs a model with rotary positions (model.position_embedding_type rope or yarn), whose resume takes "
         "any model.seq_length";
}

// A resume at another model.seq_length (a long-context phase: Llama 3 went on from 8k to 128k tokens): said once, with
// what goes on and what starts afresh, as Megatron-LM, whose check_checkpoint_args leaves seq_length out. The
// weights, the optimizer, the scheduler (which counts samples, not tokens) and the counters continue; the data is
// built again at the new length and the sampler starts at consumed_train_samples, so the first global batch is
// samples [consumed, consumed + global_batch_size) of that new dataset.
void note_sequence_change(const PretrainSetup& setup, const GenericDict& common, int64_t iteration) {
  const std::optional<SavedSequence> saved = saved_sequence(common);
  const int64_t seq_length = setup.config.model.seq_length;
  if (!saved || saved->seq_length == seq_length || parallel::get_rank() != 0) return;
  const int64_t consumed = setup.state.train_state.consumed_train_samples;
  bridge::utils::logger().info(
      "model.seq_length {} (this run) differs from the checkpoint's {}: the weights, the optimizer state, the "
      "learning-rate schedule (in samples) and the counters go on from iteration {}; the datasets are built at {} "
      "tokens per sample and training reads them from sample {} (consumed_train_samples) on",
      seq_length, saved->seq_length, iteration, seq_length, consumed);
}

}  // namespace

std::optional<LoadedCheckpoint> load_checkpoint(PretrainSetup& setup) {
  const auto started = std::chrono::steady_clock::now();
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
  CheckpointRead read;

  // Every model name of the job, to compare with the checkpoint's index on every rank alike (shapes are checked
  // slice by slice on the ranks that load them): the ranks that would write a tensor name it, so every expert of every
  // expert-parallel rank is named once.
  std::ostringstream names;
  const CheckpointWriter writer = checkpoint_writer(setup);
  for (const CheckpointParam& entry : params) {
    if (!entry.tied_copy && writer.owns(entry)) names << entry.name << '\n';
  }
  const std::vector<std::string> gathered = parallel::all_gather_strings(world, names.str());

  fs::path directory;
  for (;;) {  // once, or again after an auto-resume fell back from a damaged checkpoint
    directory = source->directory / checkpoint_directory_name(source->iteration);
    if (parallel::get_rank() == 0) {
      bridge::utils::logger().info("{} checkpoint {} (chosen by {})",
                                   source->weights_only ? "loading the weights of" : "resuming from",
                                   directory.string(), source->origin);
    }
    read = CheckpointRead();
    const std::string what = "loading checkpoint " + directory.string();
    std::string own_damage;
    try {
      on_every_rank(what, [&] {
        try {
          strategy_of(directory).read(setup, directory, gathered, params, options, read);
        } catch (const DamagedFileError& error) {
          own_damage = in_context(what, bridge::utils::describe(error));
          throw;
        } catch (const ModelMismatchError& error) {  // which sizes differ, from the config the checkpoint saved
          // Looked up softly: a checkpoint without a readable config is still one of another model, not a damaged
          // one, and keeps the mismatch's own message.
          const auto saved_config = read.common.find(c10::IValue(std::string("config")));
          const std::string differences = saved_config != read.common.end() && saved_config->value().isString()
                                              ? model_differences(saved_config->value().toStringRef(), setup.config)
                                              : std::string();
          throw ModelMismatchError(
              error.what() + (differences.empty() ? "; make model.* match the checkpoint's config" : differences) +
              learned_positions_note(read.common, setup.config.model));
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
  const GenericDict& common = read.common;
  const std::map<std::string, LoadedFile>& files = read.files;
  const std::string& own_file = read.own_file;
  load_parameters(setup, params, files, read.files_of, options);
  LoadedCheckpoint loaded{directory.string(), source->iteration};
  if (options.progress) {
    load_progress(setup, common);
    setup.last_saved_step = setup.state.train_state.step;
    note_sequence_change(setup, common, source->iteration);
  }
  if (options.optimizer && setup.grad_scaler() != nullptr && !files.empty()) {
    const LoadedFile& file = !own_file.empty() ? files.at(own_file) : files.begin()->second;
    const GenericDict optimizer = checkpoint_dict(file.dict, "optimizer", file.path);
    auto scaler = optimizer.find(c10::IValue(std::string("grad_scaler")));
    if (scaler != optimizer.end()) {
      const GenericDict state = scaler->value().toGenericDict();
      setup.grad_scaler()->load_state(checkpoint_field(state, "scale", file.path).toDouble(),
                                      checkpoint_field(state, "growth_tracker", file.path).toInt(),
                                      checkpoint_field(state, "hysteresis_tracker", file.path).toInt());
    }
  }
  if (options.rng && !own_file.empty()) {
    load_rng_state(files.at(own_file).dict, own_file);
    loaded.rng_loaded = true;
  } else if (options.rng && !read.same_layout && parallel::get_rank() == 0) {
    bridge::utils::logger().warn(
        "the checkpoint's RNG streams do not map to this run (saved with another tensor-, pipeline- or "
        "expert-parallel size, or by Megatron-Bridge, whose streams are Python's and NumPy's), so they start from "
        "rng.seed");
  }
  if (options.progress && setup.callbacks) {
    // Callback state of this rank's own (tp, pp, ep) file when the layout is unchanged, else rank 0's.
    const GenericDict& holder = !own_file.empty() ? files.at(own_file).dict : common;
    const std::string path = !own_file.empty() ? own_file : directory.string();
    auto callbacks = holder.find(c10::IValue(std::string("callbacks")));
    if (callbacks != holder.end()) load_callback_states(*setup.callbacks, callbacks->value(), path);
    auto user_state = holder.find(c10::IValue(std::string("user_state")));
    if (user_state != holder.end()) load_user_state(setup.callbacks->user_state(), user_state->value(), path);
  }
  if (parallel::get_rank() == 0) {
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - started;
    bridge::utils::logger().info("loaded checkpoint {} at iteration {} ({:.2f} s)", directory.string(),
                                 source->iteration, took.count());
  }
  setup.fire_training(Event::kCheckpointLoad, [&](CallbackContext& ctx) {
    ctx.checkpoint = CheckpointInfo{directory.string(), source->iteration};
  });
  return loaded;
}

}  // namespace bridge::training
