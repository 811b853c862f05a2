// checkpoint.also_save_hf_checkpoint: the Hugging Face directory of a committed checkpoint, written on a background
// thread of one rank (hf_checkpoint.h).
#include "training/checkpointing/hf_checkpoint.h"

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "bridge/hf/auto_bridge.h"
#include "training/checkpointing/checkpoint_strategy.h"
#include "training/checkpointing/checkpointing.h"
#include "training/checkpointing/hf_run_artifacts.h"
#include "training/checkpointing/saved_checkpoint.h"
#include "utils/durable_file.h"
#include "utils/exception_message.h"
#include "utils/logging.h"

namespace bridge::training {
namespace fs = std::filesystem;

namespace {

// "20" of .../iter_0000020, for the bridge-export command an error suggests.
std::string iteration_of(const fs::path& iteration_directory) {
  const std::optional<int64_t> iteration = iteration_of_directory_name(iteration_directory.filename().string());
  return iteration ? std::to_string(*iteration) : "<N>";
}

}  // namespace

void write_hf_checkpoint(const fs::path& iteration_directory) {
  const auto started = std::chrono::steady_clock::now();
  const fs::path target = iteration_directory / kHfCheckpointDirectory;
  const fs::path staging = iteration_directory / kHfCheckpointStaging;
  try {
    // From the committed files rather than the live model: the training thread goes on changing it, and the files
    // are whole over every parallel layout (read_weights reassembles each tensor from its shards).
    SavedWeights saved;
    saved.path = iteration_directory.string();
    strategy_of(iteration_directory).read_weights(iteration_directory, saved);
    const std::string type = hf::hf_model_type_for(saved.config.model);
    const auto warn = [&](const std::string& message) {
      bridge::utils::logger().warn("checkpoint.also_save_hf_checkpoint, {}: {} (bridge-export's flags)",
                                   target.string(), message);
    };
    const auto note = [&](const std::string& message) {
      bridge::utils::logger().info("checkpoint.also_save_hf_checkpoint, {}: {}", target.string(), message);
    };
    const hf::HfArtifacts artifacts = hf_artifacts_of_run(saved.config, "", "", warn, note);
    fs::remove_all(staging);
    hf::save_hf(staging, saved.tensors, saved.config.model, type, hf::kMaxShardBytes, artifacts);
    // One rename makes hf/ appear whole; an earlier one (a save of this iteration by an earlier run) goes first.
    fs::remove_all(target);
    fs::rename(staging, target);
    bridge::utils::fsync_directory(iteration_directory);
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - started;
    bridge::utils::logger().info("saved the Hugging Face checkpoint {} (a {} model) in {:.2f} s", target.string(), type,
                                 took.count());
  } catch (const std::exception& error) {
    std::error_code ignored;
    fs::remove_all(staging, ignored);
    throw std::runtime_error("checkpoint.also_save_hf_checkpoint: writing " + target.string() + " failed: " +
                             bridge::utils::describe(error) + ". The checkpoint " + iteration_directory.string() +
                             " itself is complete; after fixing the cause, bridge-export --checkpoint " +
                             iteration_directory.parent_path().string() + " --iteration " +
                             iteration_of(iteration_directory) + " --hf-dir " + target.string() +
                             " writes it, and checkpoint.also_save_hf_checkpoint=false trains on without it");
  }
}

int hf_checkpoint_writer_rank(int world_size) { return world_size - 1; }

HfCheckpointWrite::HfCheckpointWrite(fs::path iteration_directory, bool writer)
    : iteration_directory_(std::move(iteration_directory)) {
  if (writer)
    written_ = std::async(std::launch::async, [directory = iteration_directory_] { write_hf_checkpoint(directory); });
}

HfCheckpointWrite::~HfCheckpointWrite() {
  if (!written_.valid()) return;
  try {
    written_.get();
  } catch (const std::exception& error) {  // nobody is left to hear it: say it
    bridge::utils::logger().error("{}", bridge::utils::describe(error));
  } catch (...) {  // a destructor must not throw
    bridge::utils::logger().error("the Hugging Face write failed with a non-standard exception");
  }
}

bool HfCheckpointWrite::done() const {
  return !written_.valid() || written_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

void HfCheckpointWrite::wait() {
  if (written_.valid()) written_.get();
}

bool remove_interrupted_hf_write(const fs::path& iteration_directory) {
  std::error_code error;
  const fs::path staging = iteration_directory / kHfCheckpointStaging;
  if (!fs::exists(fs::symlink_status(staging, error))) return false;
  fs::remove_all(staging, error);
  if (error) {
    bridge::utils::logger().warn("could not remove {} (a Hugging Face write cut short): {}", staging.string(),
                                 error.message());
  } else {
    bridge::utils::logger().warn("removed {}: a Hugging Face write cut short", staging.string());
  }
  return true;
}

}  // namespace bridge::training
