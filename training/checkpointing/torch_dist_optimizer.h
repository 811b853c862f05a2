// The optimizer's tensors in a torch_dist checkpoint, in Megatron-Core's layouts (dist_checkpoint.md, "Distributed
// optimizer state"):
//   model space  optimizer.state.{exp_avg,exp_avg_sq,param|fp32_param}.<key>, sharded as the parameter: an optimizer
//                without sharding, and the distributed optimizer under checkpoint.dist_ckpt_optim_fully_reshardable
//                (Megatron-Core's fully_reshardable). Loads in any layout.
//   dp_reshardable  the distributed optimizer's default: per gradient bucket the 1-D tensors
//                optimizer.distributed.dp_group_idx_<g>.gbuf_idx_<i>.dtype_(<param>, <grad>).bucket_idx_<b>.
//                {param,exp_avg,exp_avg_sq} of the bucket's unpadded size, each data-parallel rank writing the slices
//                of its own shard where they lie (no gather, no copy). Loads at the saved tensor-, pipeline- and
//                expert-parallel layout with any data-parallel size and with the distributed optimizer on or off:
//                each rank reads the ranges of its own pieces (or, without the distributed optimizer, its parameters'
//                whole ranges) from whatever chunks overlap them.
// Bridge's buckets against Megatron-Core's: the parameters of a bucket are packed without Megatron's per-parameter
// alignment, so a bucket's unpadded size and every parameter's range depend only on the bucket settings, never on the
// data-parallel size (its padded size does: a multiple of lcm(dp, 128)). The expert buckets, which Megatron-Core keeps
// in a second optimizer, are bridge's own domains (dp_group_idx after the dense ones). Beside Megatron-Core's
// per-domain objects (per_bucket_numel, per_bucket_numel_unpadded, optimizer, grad_scaler) bridge writes
// optimizer.distributed.dp_group_idx_<g>.param_ranges: each parameter's global name, bucket key, offset and size, so a
// load finds a parameter's range whatever its own buckets are, and refuses a checkpoint whose ranges do not fit.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "training/checkpointing/checkpoint_state.h"
#include "training/checkpointing/sharded_state_dict.h"
#include "training/pretrain_setup.h"
#include "utils/dcp.h"

namespace bridge::training {

inline constexpr char kDpReshardable[] = "dp_reshardable";
inline constexpr char kFullyReshardable[] = "fully_reshardable";
inline constexpr char kOptimizerState[] = "optimizer.state.";

/// content_metadata.distrib_optim_sharding_type of this run's saves: dp_reshardable under the distributed optimizer
/// unless checkpoint.dist_ckpt_optim_fully_reshardable, else fully_reshardable (the model-space names).
std::string optimizer_sharding_type(const PretrainSetup& setup);

/// AdamW's step count of this rank's optimizer state, -1 when it has none (before the first step, or SGD).
int64_t local_optimizer_step(const PretrainSetup& setup);

/// Model space: `entry`'s optimizer state (and fp32 main param) as the boxes of `chunks` this rank holds: the whole
/// parameter without the distributed optimizer, its pieces' boxes with it.
void add_model_space_optimizer_items(PretrainSetup& setup, const CheckpointParam& entry,
                                     const std::vector<ShardedChunk>& chunks, std::vector<SaveItem>& items);

/// dp_reshardable: this rank's slices of every bucket of the distributed optimizer (`step`: the agreed AdamW step,
/// -1 before the first; the moments are written only from then on).
void add_dp_reshardable_items(PretrainSetup& setup, int64_t step, std::vector<SaveItem>& items);
/// dp_reshardable: the per-domain objects, from data-parallel rank 0 of each domain this rank is in.
void add_dp_reshardable_objects(PretrainSetup& setup, int64_t step,
                                std::vector<std::pair<std::string, std::string>>& objects);

/// The tensor-, pipeline- and expert-parallel sizes a dp_reshardable checkpoint's buckets belong to.
struct ModelParallelSizes {
  int64_t tp = 1, pp = 1, vpp = 1, ep = 1, etp = 1;
  bool experts = false;  ///< an MoE model: the expert sizes matter
};
/// How `run` differs from the layout the checkpoint's common state records ("tensor_model_parallel_size 2 (<run>:
/// 1), ..."; empty when it may load the buckets). Shared by the load and bridge-checkpoint convert's plan.
std::string dp_reshardable_layout_differences(const c10::impl::GenericDict& common, const ModelParallelSizes& run,
                                              const std::string& run_name = "this run");

/// Loading a dp_reshardable checkpoint: checks on construction that this run's layout can read it (throws
/// std::runtime_error naming what differs and the fix), then gives each parameter's state as a tensor of its local
/// shape whose elements this rank needs are filled (its pieces', or all without the distributed optimizer).
class DpReshardableReader {
 public:
  DpReshardableReader(const PretrainSetup& setup, const bridge::utils::dcp::Reader& reader,
                      const c10::impl::GenericDict& common);
  /// `state`: "param" (the fp32 main values), "exp_avg", "exp_avg_sq", "momentum_buffer"; none when the checkpoint
  /// lacks it.
  std::optional<torch::Tensor> read(const CheckpointParam& entry, const std::string& state) const;

 private:
  struct Range {
    std::string bucket_key;
    int64_t offset = 0;
    int64_t numel = 0;
  };
  const bridge::utils::dcp::Reader& reader_;
  std::map<std::pair<bool, std::string>, Range> ranges_;  // (expert, global name) -> where it lies
};

}  // namespace bridge::training
