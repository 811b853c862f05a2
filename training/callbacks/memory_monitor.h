// MemoryMonitor: memory use across the job at each log step (Composer's MemoryMonitor with its rank aggregation).
//
//   manager->add(std::make_shared<MemoryMonitor>());  // on every rank: it reduces over the world
//
// Each rank reads its memory as utils::report_memory does (the CUDA caching allocator's statistics on a GPU, the
// resident set on a CPU); one all-reduce over every rank gives the record "memory/<name>" (the largest rank, what
// capacity is planned by) and "memory/<name>/min" (the smallest), and the console line the peak in GB. The
// all-reduce is why it must be registered on every rank (RankFilter::kAll, the default): on_log fires on every
// rank at the same steps.
#pragma once

#include "training/callbacks/callback.h"

namespace bridge::training {
inline namespace callbacks {

class MemoryMonitor : public Callback {
 public:
  void on_log(CallbackContext& ctx) override;
};

}  // namespace callbacks
}  // namespace bridge::training
