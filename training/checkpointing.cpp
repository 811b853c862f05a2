// save_checkpoint: per-rank torch archives in Megatron's layout, atomic renames, then the tracker file.
#include "training/checkpointing.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "parallel/distributed.h"
#include "parallel/parallel_state.h"

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
  if (setup.data_parallel_rank == 0) {
    const fs::path rank_directory = directory / model_parallel_directory_name();
    fs::create_directories(rank_directory);
    write_atomically(rank_directory / "model_optim_rng.pt", [&](const fs::path& path) {
      torch::serialize::OutputArchive archive;
      for (std::size_t i = 0; i < setup.model.size(); ++i) {
        torch::serialize::OutputArchive chunk;
        setup.model[i]->save(chunk);
        archive.write("model" + std::to_string(i), chunk);
      }
      torch::serialize::OutputArchive optimizer;
      setup.optimizer->save(optimizer);
      archive.write("optimizer", optimizer);
      archive.write("iteration", torch::tensor(iteration, torch::kLong));
      archive.save_to(path.string());
    });
  }
  parallel::ProcessGroup& world = parallel::get_world_group();
  world.barrier();  // every rank's file is complete before the tracker names the iteration
  if (parallel::get_rank() == 0) {
    write_atomically(root / "latest_checkpointed_iteration.txt", [&](const fs::path& path) {
      std::ofstream out(path);
      out << iteration << "\n";
      if (!out.flush()) throw std::runtime_error("write failed");
    });
  }
  world.barrier();
  setup.fire(Event::kCheckpointSave, [&](CallbackContext& ctx) {
    ctx.optimizer = setup.optimizer.get();  // no scheduler here, as in Megatron-Bridge
    ctx.checkpoint = CheckpointInfo{directory.string(), iteration};
  });
  return directory.string();
}

}  // namespace bridge::training
