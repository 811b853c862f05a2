// Preflight: what ConfigContainer::validate() cannot tell from the config alone, checked on every rank after the
// process groups exist and before anything is allocated or trained: the output paths can be written, the checkpoint
// disk holds a checkpoint, the model and its training state fit in the memory of the rank, and train.num_threads does
// not oversubscribe the cores. A failure on any rank fails every rank, with that rank's message, so no rank trains
// toward a save that cannot happen.
#pragma once

#include <torch/torch.h>

#include <stdexcept>
#include <string>

#include "training/config/config.h"

namespace bridge::training {

/// A config that cannot run here, found before training (bridge-pretrain exits 2 on it). Thrown on every rank with
/// the message of the lowest rank that found it; source_rank() is that rank (it prints, the others need not).
class PreflightError : public std::invalid_argument {
 public:
  PreflightError(const std::string& message, int source_rank)
      : std::invalid_argument(message), source_rank_(source_rank) {}
  int source_rank() const { return source_rank_; }

 private:
  int source_rank_;
};

/// Runs the checks on this rank (a collective over the world: every rank calls it) and returns the intra-op threads
/// to use: train.num_threads, capped at this rank's share of the cores with a warning, or that share when it is 0.
/// Throws PreflightError on every rank when a check fails on any.
int preflight(const ConfigContainer& config, const torch::Device& device);

}  // namespace bridge::training
