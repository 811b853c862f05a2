// save_checkpoint: per-rank torch archives in Megatron's layout, atomic renames, then the tracker file.
#include "training/checkpointing.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/random.h"
#include "utils/logging.h"
#include "utils/strings.h"

namespace bridge::training {
namespace fs = std::filesystem;

namespace {

std::string model_parallel_directory_name() {
  char name[32];
  const int tp = parallel::get_tensor_model_parallel_rank();
  if (parallel::get_pipeline_model_parallel_world_size() == 1) {
    std::snprintf(name, sizeof(name), "mp_rank_%02d", tp);
  } else {
    std::snprintf(name, sizeof(name), "mp_rank_%02d_%03d", tp, parallel::get_pipeline_model_parallel_rank());
  }
  return name;
}

// Writes with `write(temporary_path)`, then renames over `path`: readers see the old file or the whole new one.
template <class Write>
void write_atomically(const fs::path& path, Write&& write) {
  const fs::path temporary = path.string() + ".tmp";
  try {
    write(temporary);
    fs::rename(temporary, path);
  } catch (const std::exception& error) {
    std::error_code ignored;
    fs::remove(temporary, ignored);
    throw std::runtime_error("saving checkpoint file " + path.string() + " failed: " + error.what() +
                             ". Check that checkpoint.save is writable and has space.");
  }
}

// The model chunks, optimizer, scheduler position, progress counters and RNG streams: what a resume needs.
void write_rank_state(const PretrainSetup& setup, int64_t iteration, const fs::path& path) {
  torch::serialize::OutputArchive archive;
  for (std::size_t i = 0; i < setup.model.size(); ++i) {
    torch::serialize::OutputArchive chunk;
    setup.model[i]->save(chunk);
    archive.write("model" + std::to_string(i), chunk);
  }
  torch::serialize::OutputArchive optimizer;
  setup.optimizer->save(optimizer);
  if (setup.mixed_precision) {
    // Megatron's fp32_from_fp16_params: the fp32 main params, which the bf16/fp16 model only rounds.
    const std::vector<torch::Tensor>& main_params = setup.mixed_precision->main_params();
    for (std::size_t i = 0; i < main_params.size(); ++i) {
      optimizer.write("fp32_from_fp16_params/" + std::to_string(i), main_params[i].detach());
    }
  }
  archive.write("optimizer", optimizer);
  const TrainState& train_state = setup.state.train_state;
  archive.write("iteration", torch::tensor(iteration, torch::kLong));
  archive.write("consumed_train_samples", torch::tensor(train_state.consumed_train_samples, torch::kLong));
  archive.write("consumed_valid_samples", torch::tensor(train_state.consumed_valid_samples, torch::kLong));
  archive.write("scheduler_num_steps", torch::tensor(setup.scheduler->num_steps(), torch::kLong));
  archive.write("rng_default", at::detail::getDefaultCPUGenerator().get_state());
  for (const auto& [name, state] : parallel::tensor_parallel::get_rng_tracker().get_states()) {
    archive.write("rng_tracker/" + name, state);
  }
  archive.save_to(path.string());
}

}  // namespace

std::string checkpoint_directory_name(int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof(name), "iter_%07lld", static_cast<long long>(iteration));
  return name;
}

std::string save_checkpoint(PretrainSetup& setup) {
  const int64_t iteration = setup.state.train_state.step;
  const fs::path root(setup.config.checkpoint.save);
  const fs::path directory = root / checkpoint_directory_name(iteration);
  parallel::ProcessGroup& world = parallel::get_world_group();
  std::string error;
  if (setup.data_parallel_rank == 0) {
    try {
      const fs::path rank_directory = directory / model_parallel_directory_name();
      fs::create_directories(rank_directory);
      write_atomically(rank_directory / "model_optim_rng.pt",
                       [&](const fs::path& path) { write_rank_state(setup, iteration, path); });
    } catch (const std::exception& failure) {
      error = failure.what();
      bridge::utils::logger().error("saving checkpoint iteration {} under {} failed: {}", iteration, directory.string(),
                                    error);
    }
  }
  // Every rank learns whether every write succeeded (instead of some waiting at a barrier for a rank that failed).
  torch::Tensor failed = torch::zeros({world.size()}, torch::kLong);
  failed[world.rank()] = error.empty() ? 0 : 1;
  world.all_reduce(failed);
  if (failed.sum().item<int64_t>() > 0) {
    std::vector<int> ranks;
    for (int r = 0; r < world.size(); ++r) {
      if (failed[r].item<int64_t>() != 0) ranks.push_back(r);
    }
    throw std::runtime_error("saving checkpoint iteration " + std::to_string(iteration) + " under " +
                             directory.string() + " failed on rank(s) " + bridge::utils::join(ranks, ", ") +
                             (error.empty() ? std::string("; see their logs") : ": " + error) +
                             ". latest_checkpointed_iteration.txt still names the previous complete checkpoint.");
  }
  if (parallel::get_rank() == 0) {
    write_atomically(root / "latest_checkpointed_iteration.txt", [&](const fs::path& path) {
      std::ofstream out(path);
      out << iteration << "\n";
      if (!out.flush()) throw std::runtime_error("write failed");
    });
  }
  world.barrier();
  setup.last_saved_step = iteration;
  setup.fire(Event::kCheckpointSave, [&](CallbackContext& ctx) {
    ctx.optimizer = setup.optimizer.get();  // no scheduler here, as in Megatron-Bridge
    ctx.checkpoint = CheckpointInfo{directory.string(), iteration};
  });
  return directory.string();
}

}  // namespace bridge::training
