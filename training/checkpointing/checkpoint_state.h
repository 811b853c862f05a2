// What a checkpoint holds and how it goes back: this rank's model, optimizer, scheduler, counters and RNG streams as
// a dict in PyTorch's pickle format (Megatron-LM's top-level keys, Megatron-Core's parameter names), every tensor
// with its place in the global tensor, so that a load in another parallel layout takes the slices it needs.
//
// File layout of one rank's model_optim_rng.pt (torch.load(path, weights_only=True) opens it):
//   checkpoint_version, iteration, config (the resolved YAML), parallel_layout, train_state,
//   model:               {"decoder.layers.0.self_attention.linear_qkv.weight": tensor, ...}   this rank's slices
//   optimizer:           {"optimizer": {"state": {name: {"step", "exp_avg", "exp_avg_sq"}}, "param_groups": [...]},
//                         "fp32_from_fp16_params": {name: tensor}, "grad_scaler": {...}}
//   opt_param_scheduler: {"num_steps", "max_lr", ...}
//   rng_state:           [{"torch_rng_state", "cuda_rng_state", "rng_tracker_states": {...}}]
//   shard_metadata:      {name: {"global_shape", "partition_dim", "blocks"}}
//   callbacks, user_state
//
// Context-parallel ranks hold the same weights and optimizer state as data-parallel replicas do, so the writers are
// elected over data x context parallel: without experts, the rank with data-parallel (with cp) rank 0 of each
// (tp, pp) shard writes.
//
// With MoE expert parallelism, data-parallel rank 0 and expert data-parallel rank 0 write (see CheckpointWriter), each
// all of its rank's state: the dense tensors and the experts of its expert-parallel rank, under their global names
// (decoder.layers.N.mlp.experts.local_experts.G..., G the global expert index), split over the expert tensor-parallel
// group as their shard metadata says. common.pt's index names one file for each slice.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/dist_checkpointing/sharded_tensor.h"
#include "training/pretrain_setup.h"

namespace bridge::training {

/// Megatron-LM's checkpoint_version; this layout (global names, shard metadata) is bridge's 1 of it.
inline constexpr double kCheckpointVersion = 3.0;

/// The fused QKV weight's layout, saved as the files' "qkv_layout" entry: Megatron-Core's, rows grouped by key/value
/// head ([q..q k v] per group). A file without the entry is of bridge's older [Q; K; V] layout (multi-head only).
inline constexpr const char* kQkvLayoutKey = "qkv_layout";
inline constexpr const char* kQkvLayoutGrouped = "megatron_core";

/// One trainable parameter of this rank as checkpoints see it.
struct CheckpointParam {
  std::string name;          ///< the global (Megatron-Core) name
  torch::Tensor param;       ///< the model's
  torch::Tensor main_param;  ///< what the optimizer steps on: the fp32 main param under mixed precision, else param
  parallel::dist_checkpointing::ShardedTensorLayout layout;
  /// The last pipeline stage's copy of the tied word embedding: not saved, loaded from the embedding's entries.
  bool tied_copy = false;
  /// An expert-parallel parameter (attribute allreduce false): saved by expert data-parallel rank 0, not by
  /// data-parallel rank 0, and split over the expert tensor-parallel group.
  bool expert = false;
  /// A module buffer saved with the model (the router's fp32 expert_bias): no optimizer state, no main param, and it
  /// keeps its own dtype.
  bool buffer = false;
  /// The name its values are saved under: the embedding's for the tied copy, else `name`.
  const std::string& source_name() const;
};

/// This rank's trainable parameters, in setup.params order, then its persistent buffers (Megatron-Core's
/// router.expert_bias), under their global names.
std::vector<CheckpointParam> checkpoint_params(const PretrainSetup& setup);

/// This rank's position among the ranks that hold the same dense model shard, and their number: data x context
/// parallel (Megatron's get_data_parallel_rank(with_context_parallel=True)), whose cp ranks hold the same weights but
/// other tokens. Without the parallel state (a single-process setup), setup's data-parallel rank and size.
int data_parallel_rank_with_cp(const PretrainSetup& setup);
int data_parallel_size_with_cp(const PretrainSetup& setup);

/// Whether a rank writes a file and for which of its tensors the index names that file: Megatron's writers are
/// data-parallel (with cp) rank 0 and expert data-parallel rank 0 (their union covers every (tp, pp, ep) shard).
/// Data-parallel rank 0's file is the one for the dense tensors, expert data-parallel rank 0's for the experts, so
/// each slice has one indexed copy, which every load and export reads (the other copies are the same values: the
/// ranks are data- or context-parallel replicas). Electing over dp alone would make every cp rank a writer of the same
/// file.
struct CheckpointWriter {
  bool dense = false;    ///< data-parallel rank 0 over data x context parallel
  bool experts = false;  ///< expert data-parallel rank 0, where expert-parallel groups are in use
  bool any() const { return dense || experts; }
  /// This rank's file is the indexed one for `entry` (and this rank names it when a load checks the names).
  bool owns(const CheckpointParam& entry) const { return entry.expert ? experts : dense; }
};
CheckpointWriter checkpoint_writer(const PretrainSetup& setup);

/// Megatron's folder of one model-parallel rank: "mp_rank_01"; with a pipeline "mp_rank_01_002"; with expert
/// parallelism (ep_size > 1) the expert-parallel rank last, "mp_rank_01_003" or "mp_rank_01_002_003".
std::string model_parallel_directory_name(int tp_rank, int pp_rank, int pp_size, int ep_rank = 0, int ep_size = 1);

/// What every format saves once for the whole job: checkpoint_version, qkv_layout, iteration, config (the resolved
/// YAML), parallel_layout (this rank's), train_state and opt_param_scheduler.
c10::impl::GenericDict shared_state_dict(PretrainSetup& setup, int64_t iteration);

/// fp16's loss scaler as the files keep it: {"scale", "growth_tracker", "hysteresis_tracker"}.
c10::impl::GenericDict grad_scaler_state(const GradScaler& scaler);

/// This rank's RNG streams as Megatron saves them: [{"torch_rng_state", "cuda_rng_state", "rng_tracker_states"}].
c10::impl::GenericList rng_state_list();

/// The dict this rank saves for `iteration` (see the top of this file). Tensors are detached CPU copies, so the result
/// stays valid while training goes on (an asynchronous save writes it later). With the distributed optimizer, `whole`
/// is its state gathered on this rank (DistributedOptimizer::gather_state), saved in the same per-parameter layout as
/// an optimizer without sharding.
c10::impl::GenericDict rank_state_dict(PretrainSetup& setup, const std::vector<CheckpointParam>& params,
                                       int64_t iteration, const DistributedOptimizer::WholeState* whole = nullptr);

/// A loaded file's dict, with the path it came from for error messages.
struct LoadedFile {
  std::string path;
  c10::impl::GenericDict dict{c10::AnyType::get(), c10::AnyType::get()};
};

/// What to take from a checkpoint (CheckpointConfig's switches, resolved).
struct LoadOptions {
  bool optimizer = true;  ///< optimizer state and grad scaler
  bool rng = true;        ///< RNG streams (only where the tensor- and pipeline-parallel sizes are unchanged)
  bool progress = true;   ///< iteration, counters and scheduler (off: a fine-tuning start)
  std::string optimizer_type = "adam";  ///< optimizer.optimizer of this run, checked against the checkpoint's
};

/// A checkpoint that does not fit the model: a tensor one has and the other lacks, or a global shape that differs.
/// The loader adds which model.* keys of the checkpoint's config differ from the run's (model_differences).
class ModelMismatchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The model.* keys that change a tensor's shape (seq_length only for learned absolute positions) whose values in
/// `saved_config_yaml` (a checkpoint's "config") differ from `config`'s, as
/// " The checkpoint's model.* differ from this run's: model.hidden_size 64 (this run: 128); ..." with the fix, or
/// "" when none differ or the saved config cannot be read.
std::string model_differences(const std::string& saved_config_yaml, const ConfigContainer& config);

/// Checks that `files` hold every slice of every parameter in `params` (model and, with options.optimizer, the
/// optimizer state) with compatible shapes, without changing anything. Throws std::runtime_error naming the
/// tensor and the file.
void check_loadable(const std::vector<CheckpointParam>& params, const std::map<std::string, LoadedFile>& files,
                    const std::map<std::string, std::vector<std::string>>& files_of, const LoadOptions& options);

/// Copies the slices into the model, the fp32 main params and the optimizer state (after check_loadable passed).
/// `files_of` maps a global name to the files holding its slices.
void load_parameters(PretrainSetup& setup, const std::vector<CheckpointParam>& params,
                     const std::map<std::string, LoadedFile>& files,
                     const std::map<std::string, std::vector<std::string>>& files_of, const LoadOptions& options);

/// Restores the counters and scheduler position from `common` (rank 0's common.pt or any rank file).
void load_progress(PretrainSetup& setup, const c10::impl::GenericDict& common);

/// Restores this rank's RNG streams (CPU, CUDA, tensor-parallel tracker) from its own rank file's dict.
void load_rng_state(const c10::impl::GenericDict& rank_file, const std::string& path);

/// Dict helpers shared by the checkpoint code: the value under `key`, or a std::runtime_error naming `what`.
/// For a rank file of the older [Q; K; V] layout (no "qkv_layout" entry), rewrites the shard metadata of its
/// linear_qkv weights and biases to say where their rows lie in Megatron-Core's grouped layout, so that every load
/// (the checkpoint loader's copies, bridge-export) converts them; the tensors are untouched. The number of heads comes
/// from the file's config. Files of the current layout are left as they are.
void upgrade_qkv_layout(c10::impl::GenericDict& file, const std::string& path);

c10::IValue checkpoint_field(const c10::impl::GenericDict& dict, const std::string& key, const std::string& what);
c10::impl::GenericDict checkpoint_dict(const c10::impl::GenericDict& dict, const std::string& key,
                                       const std::string& what);
c10::impl::GenericDict new_checkpoint_dict();

}  // namespace bridge::training
