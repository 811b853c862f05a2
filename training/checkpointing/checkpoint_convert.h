// Conversion of a checkpoint between the formats (torch <-> torch_dist) and parallel layouts, behind
// `bridge-checkpoint convert`: the saved run is rebuilt from the config the checkpoint carries (the parallel layout
// from the overrides instead, one rank by default), everything is loaded through the run's own load path (weights,
// optimizer state, scheduler, counters, RNG streams, callbacks' and user state) and saved through the other format's
// strategy at the same iteration. Nothing is trained and nothing advances; the source is only read.
//
//   ConvertRequest request{"ckpt", "ckpt_dist", "torch_dist"};
//   const ConversionPlan plan = plan_checkpoint_conversion(request, /*world_size=*/1);  // no world yet
//   convert_checkpoint(plan);  // collective over the launcher's world
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "training/config/config.h"

namespace bridge::training {

struct ConvertRequest {
  std::string source;       ///< a checkpoint.save directory, or one iteration directory (iter_XXXXXXX) in it
  std::string destination;  ///< where the converted iteration goes (created; iterations already there are kept)
  std::string format;       ///< the format to write: "torch" or "torch_dist"
  std::optional<int64_t> iteration;    ///< default: the one the source's tracker (or iteration directory) names
  std::vector<std::string> overrides;  ///< KEY=VALUE on the saved config, as bridge-pretrain takes them
};

/// A conversion resolved before any rank joins the world.
struct ConversionPlan {
  ConfigContainer config;    ///< the run that loads and saves: the saved config, the layout, checkpoint.* set here
  ConfigContainer recorded;  ///< the config the converted checkpoint records (the run's outputs as the source had them)
  std::filesystem::path source_directory;  ///< the iteration directory read
  std::filesystem::path destination_directory;
  int64_t iteration = 0;
  std::string source_format;
  std::vector<std::string> callback_keys;  ///< the callbacks whose state the checkpoint holds: carried over as saved
};

/// Reads the source's shared state (its config) and checks the request against the launcher's `world_size`,
/// modifying nothing. Throws std::invalid_argument for a request that cannot be done (not a checkpoint, a bad override
/// or layout, an iteration already in the destination), utils::DamagedFileError when the source iteration is
/// incomplete or its shared state damaged.
ConversionPlan plan_checkpoint_conversion(const ConvertRequest& request, int world_size);

/// Collective over the launcher's world (joined here, as pretrain() joins it): loads the planned iteration and saves
/// it in the destination, tracker included. A damaged source throws utils::DamagedFileError on every rank, another
/// failure std::runtime_error; either way the destination's tracker is unchanged.
void convert_checkpoint(const ConversionPlan& plan);

}  // namespace bridge::training
