// plan_checkpoint_conversion and convert_checkpoint (checkpoint_convert.h): a conversion is a run set up as
// pretrain() sets one up (with_loaded_run), resumed from the source through load_checkpoint and saved once through
// save_checkpoint in the other format, so both formats' own code does all the reading, resharding and writing.
#include "training/checkpointing/checkpoint_convert.h"

#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "parallel/distributed.h"
#include "training/callbacks/callback.h"
#include "training/callbacks/callback_manager.h"
#include "training/checkpointing/checkpoint_strategy.h"
#include "training/checkpointing/checkpointing.h"
#include "training/checkpointing/torch_dist_optimizer.h"
#include "training/config/config_yaml.h"
#include "training/pretrain_setup.h"
#include "utils/exception_message.h"
#include "utils/logging.h"
#include "utils/strings.h"
#include "utils/zip_archive.h"

namespace bridge::training {
namespace fs = std::filesystem;
namespace {

// The checkpoint.* keys an override may set: how the destination is written. The others are the conversion's own
// (its command line says them) or would make it something else (finetune, no_load_optim).
const std::set<std::string>& format_keys() {
  static const std::set<std::string> keys = {"checkpoint.fully_parallel_save",
                                             "checkpoint.dist_ckpt_optim_fully_reshardable"};
  return keys;
}

// A stateful callback standing in for one the saved run had: the conversion builds none of the run's callbacks (a
// plugin may be absent here, and none should see a load or save that is not the run's), yet their state must reach the
// destination as saved, per rank.
class CarriedState : public Callback {
 public:
  explicit CarriedState(std::string key) : key_(std::move(key)) {}
  std::string name() const override { return "carried state of " + key_; }
  std::string state_key() const override { return key_; }
  StateDict state_dict() const override { return state_; }
  void load_state_dict(const StateDict& state) override { state_ = state; }

 private:
  std::string key_;
  StateDict state_;
};

std::string layout_text(const ParallelismConfig& parallelism) {
  std::string text = "tp" + std::to_string(parallelism.tensor_model_parallel_size) + " pp" +
                     std::to_string(parallelism.pipeline_model_parallel_size);
  if (parallelism.virtual_pipeline_model_parallel_size) {
    text += " vpp" + std::to_string(*parallelism.virtual_pipeline_model_parallel_size);
  }
  if (parallelism.expert_model_parallel_size > 1)
    text += " ep" + std::to_string(parallelism.expert_model_parallel_size);
  return text;
}

// The iteration directory a request names, and its iteration.
std::pair<fs::path, int64_t> source_iteration(const ConvertRequest& request) {
  std::error_code error;
  // Absolute and without a trailing '/': an iteration directory's parent is the checkpoint.save directory.
  fs::path source = fs::absolute(request.source, error).lexically_normal();
  if (source.filename().empty()) source = source.parent_path();
  if (!fs::is_directory(source, error)) {
    throw std::invalid_argument("no checkpoint directory at '" + request.source +
                                "'; give a checkpoint.save directory or an iteration directory in it");
  }
  if (const std::optional<int64_t> named = iteration_of_directory_name(source.filename().string())) {
    const int64_t iteration = *named;
    if (request.iteration && *request.iteration != iteration) {
      throw std::invalid_argument(request.source + " is iteration " + std::to_string(iteration) + ", not --iteration " +
                                  std::to_string(*request.iteration));
    }
    return {source.parent_path(), iteration};
  }
  std::optional<int64_t> iteration = request.iteration;
  if (!iteration) iteration = read_latest_checkpointed_iteration(request.source);
  if (!iteration) {
    throw std::invalid_argument(request.source +
                                " has no latest_checkpointed_iteration.txt: not a checkpoint.save directory; give "
                                "--iteration N or an iteration directory");
  }
  const fs::path directory = source / checkpoint_directory_name(*iteration);
  if (!fs::is_directory(directory, error)) {
    throw std::invalid_argument(request.source + " holds no iteration " + std::to_string(*iteration) + " (no " +
                                directory.string() + ")");
  }
  return {source, *iteration};
}

// A distributed optimizer's state saved as Megatron-Core's dp_reshardable buckets loads only in its own tensor-,
// pipeline- and expert-parallel layout: refuse another one here (exit 2, before any rank starts) with the two-step
// route, rather than in the load once the world is up.
void check_dp_reshardable_layout(const c10::impl::GenericDict& common, const ConfigContainer& config,
                                 const fs::path& directory) {
  const auto content = common.find(c10::IValue(std::string("content_metadata")));
  if (content == common.end() || !content->value().isGenericDict()) return;
  const c10::impl::GenericDict metadata = content->value().toGenericDict();
  const auto type = metadata.find(c10::IValue(std::string("distrib_optim_sharding_type")));
  if (type == metadata.end() || !type->value().isString() || type->value().toStringRef() != kDpReshardable) return;
  const ParallelismConfig& parallelism = config.parallelism;
  const std::string differs = dp_reshardable_layout_differences(
      common,
      {parallelism.tensor_model_parallel_size, parallelism.pipeline_model_parallel_size,
       parallelism.virtual_pipeline_model_parallel_size.value_or(1), parallelism.expert_model_parallel_size,
       parallelism.expert_tensor_parallel_size.value_or(parallelism.tensor_model_parallel_size),
       config.model.num_moe_experts.has_value()},
      "here");
  if (differs.empty()) return;
  throw std::invalid_argument(
      directory.string() +
      " holds the distributed optimizer's state in Megatron-Core's dp_reshardable layout, which converts only into "
      "the tensor-, pipeline- and expert-parallel layout it was saved in: " +
      differs +
      ". Convert it in that layout (under a launcher with its ranks, those parallelism.* sizes as overrides), adding "
      "checkpoint.dist_ckpt_optim_fully_reshardable=true to make the result loadable in any layout");
}

// The destination must take the iteration without overwriting anything or moving its tracker back.
void check_destination(const fs::path& root, const fs::path& source_root, int64_t iteration) {
  std::error_code error;
  if (fs::exists(root, error) && !fs::is_directory(root, error)) {
    throw std::invalid_argument("the destination " + root.string() + " is a file, not a directory");
  }
  if (fs::exists(root, error) && fs::equivalent(root, source_root, error)) {
    throw std::invalid_argument("the destination " + root.string() +
                                " is the source directory; convert into another directory (the source is only read)");
  }
  const fs::path directory = root / checkpoint_directory_name(iteration);
  if (fs::exists(fs::symlink_status(directory, error))) {
    throw std::invalid_argument("the destination already holds " + directory.string() +
                                "; convert into another directory, or remove that iteration first");
  }
  if (const std::optional<int64_t> latest = read_latest_checkpointed_iteration(root.string());
      latest && *latest > iteration) {
    throw std::invalid_argument("the destination " + root.string() + " already holds iteration " +
                                std::to_string(*latest) + " (latest_checkpointed_iteration.txt), newer than " +
                                std::to_string(iteration) +
                                ": its tracker would move back; convert older iterations first, or into another "
                                "directory");
  }
}

}  // namespace

ConversionPlan plan_checkpoint_conversion(const ConvertRequest& request, int world_size) {
  const CheckpointStrategy& target = checkpoint_strategy(request.format);  // invalid_argument naming the formats
  if (request.destination.empty()) throw std::invalid_argument("convert needs a destination directory");
  ConversionPlan plan;
  const auto [source_root, iteration] = source_iteration(request);
  plan.iteration = iteration;
  plan.source_directory = source_root / checkpoint_directory_name(iteration);
  plan.destination_directory = fs::path(request.destination) / checkpoint_directory_name(iteration);
  if (!complete_checkpoint(plan.source_directory)) {
    throw bridge::utils::DamagedFileError(
        plan.source_directory.string() +
        " is incomplete (its save never finished, or the copy is partial); bridge-checkpoint verify " +
        plan.source_directory.string() + " names what is missing");
  }
  check_destination(request.destination, source_root, iteration);

  const CheckpointStrategy& source = strategy_of(plan.source_directory);
  plan.source_format = std::string(source.name());
  const c10::impl::GenericDict common = source.read_common(plan.source_directory);
  const auto config_entry = common.find(c10::IValue(std::string("config")));
  if (config_entry == common.end() || !config_entry->value().isString()) {
    throw std::invalid_argument(plan.source_directory.string() +
                                " records no bridge config (a checkpoint another program wrote): convert needs the "
                                "config the run saved");
  }
  ConfigContainer config =
      load_config_yaml_string(config_entry->value().toStringRef(), plan.source_directory.string() + " (its config)");
  const auto callbacks = common.find(c10::IValue(std::string("callbacks")));
  if (callbacks != common.end() && callbacks->value().isGenericDict()) {
    for (const auto& item : callbacks->value().toGenericDict()) plan.callback_keys.push_back(item.key().toStringRef());
  }

  // The layout is the overrides' alone, one rank by default: the saved one needs a world of its size, and a
  // checkpoint loads in any layout. The device likewise: the saved run's GPU need not be here.
  ParallelismConfig& parallelism = config.parallelism;
  parallelism.tensor_model_parallel_size = parallelism.pipeline_model_parallel_size = 1;
  parallelism.virtual_pipeline_model_parallel_size.reset();
  parallelism.microbatch_group_size_per_vp_stage.reset();
  parallelism.expert_model_parallel_size = 1;
  parallelism.expert_tensor_parallel_size.reset();
  const std::string saved_device = parallelism.device;
  const std::optional<parallel::Backend> saved_backend = parallelism.backend;
  parallelism.backend.reset();
  parallelism.device = "cpu";
  for (const std::string& key : apply_overrides(config, request.overrides)) {
    if (key.rfind("checkpoint.", 0) == 0 && format_keys().count(key) == 0) {
      throw std::invalid_argument(
          key +
          " is the conversion's own: give the source, the destination, --to and --iteration instead; an "
          "override may set " +
          bridge::utils::join(std::vector<std::string>(format_keys().begin(), format_keys().end()), ", "));
    }
  }
  CheckpointConfig& checkpoint = config.checkpoint;
  checkpoint.load = source_root.string();
  checkpoint.ckpt_step = iteration;
  checkpoint.save = request.destination;
  checkpoint.ckpt_format = std::string(target.name());
  checkpoint.auto_resume = checkpoint.finetune = checkpoint.no_load_optim = checkpoint.no_load_rng = false;
  checkpoint.pretrained_checkpoint.clear();
  checkpoint.async_save = false;
  checkpoint.most_recent_k = -1;  // never delete a destination's other iterations
  checkpoint.also_save_hf_checkpoint = false;
  plan.recorded = config;
  plan.recorded.parallelism.device = saved_device;  // the run's own, which a resume from DST uses again
  plan.recorded.parallelism.backend = saved_backend;
  // What the conversion does not need and must not touch: the tokenizer's files (model.vocab_size and the EOD id are
  // already resolved in the saved config), the run's metric outputs and its callbacks (CarriedState stands in).
  config.tokenizer = {};
  config.logging = {};
  config.callbacks.clear();
  config.validate(world_size);  // a layout that does not fit the launcher's world: exit 2 before any rank starts
  check_dp_reshardable_layout(common, config, plan.source_directory);
  plan.config = std::move(config);
  return plan;
}

void convert_checkpoint(const ConversionPlan& plan) {
  auto callbacks = std::make_shared<CallbackManager>();  // also carries user_state
  for (const std::string& key : plan.callback_keys) callbacks->add(std::make_shared<CarriedState>(key));
  with_loaded_run(plan.config, callbacks, [&plan](PretrainSetup& setup) {
    if (setup.state.train_state.step != plan.iteration) {
      throw std::runtime_error(plan.source_directory.string() + " holds step " +
                               std::to_string(setup.state.train_state.step) + ", not the iteration its name says (" +
                               std::to_string(plan.iteration) + "); the checkpoint is damaged or renamed");
    }
    setup.config.tokenizer = plan.recorded.tokenizer;
    setup.config.logging = plan.recorded.logging;
    setup.config.callbacks = plan.recorded.callbacks;
    setup.config.parallelism.device = plan.recorded.parallelism.device;  // recorded only: nothing here moves
    setup.config.parallelism.backend = plan.recorded.parallelism.backend;
    save_checkpoint(setup);
    if (parallel::get_rank() == 0) {
      bridge::utils::logger().info("converted {} ({}) to {} ({}, {}, dp{})", plan.source_directory.string(),
                                   plan.source_format, plan.destination_directory.string(),
                                   plan.config.checkpoint.ckpt_format, layout_text(plan.config.parallelism),
                                   setup.data_parallel_size);
    }
  });
}

}  // namespace bridge::training
