// Megatron's DistributedOptimizer (ZeRO-1): each data-parallel rank keeps the optimizer state, and for bf16/fp16
// models the fp32 main parameters, of its own 1/dp of every gradient bucket only, steps that shard, and all-gathers
// the updated shards so that every rank holds the whole model again. Expert-parallel parameters' buckets are sharded
// over the expert data-parallel group instead (Megatron's separate expert optimizer, here the same object): 1/edp. Per
// parameter that is 8 + 8 / dp bytes in fp32 (16 without) and 6 + 12 / dp with bf16 parameters and fp32 gradients (18
// without).
//
// A shard is a range of a bucket of DistributedDataParallel's grad buffer: rank r of d owns elements
// [r c, (r + 1) c) of each bucket, c = numel / d (DDP pads its buckets and reduce-scatters them under
// use_distributed_optimizer, so only these elements hold reduced gradients), cut into pieces at parameter boundaries.
// Each piece's main parameter is a view of the model parameter's elements (fp32) or an fp32 copy of them (bf16), whose
// gradient is the view of the same elements of the grad buffer; the optimizer (build_optimizer's over the pieces,
// weight decay decided by the model parameter) sees only the pieces.
//
//   DistributedOptimizer shards({&ddp}, data_parallel_group);
//   auto optimizer = build_optimizer(config.optimizer, shards.decayed_params(), shards.not_decayed_params());
//   ...backward, finalize_model_grads...
//   if (shards.prepare_grads()) return;  // fp16: an inf/nan gradient on some rank skips the step on every rank
//   double norm = clip_grad_norm(shards.main_params(), 1.0, &world);  // pieces of every rank: the world's norm
//   optimizer->step();
//   shards.finish_step();  // main params -> model params, all-gather
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "parallel/distributed/distributed_data_parallel.h"
#include "parallel/process_group.h"
#include "training/optimizer/mixed_precision.h"

namespace bridge::training {

class DistributedOptimizer {
 public:
  /// `chunks`: the DistributedDataParallel of every model chunk on this rank; their grad buffers are sharded over
  /// `data_parallel_group` (nullptr = parallel_state's, with context parallel), which must outlive this object, and
  /// their expert buckets over each DistributedDataParallel's expert_data_parallel_group().
  /// `grad_scaler`: fp16's loss scaler (GradScaler::from_config), whose overflow check runs over the shards.
  explicit DistributedOptimizer(std::vector<parallel::distributed::DistributedDataParallel*> chunks,
                                parallel::ProcessGroup* data_parallel_group = nullptr,
                                std::optional<GradScaler> grad_scaler = std::nullopt);
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  /// The main params of pieces of matrices (weight decay) and of biases and norms (none), for build_optimizer.
  const std::vector<torch::Tensor>& decayed_params() const { return decayed_; }
  const std::vector<torch::Tensor>& not_decayed_params() const { return not_decayed_; }
  /// This rank's pieces' main params, with their grads after prepare_grads(): what the grad norm and clipping take
  /// (over every rank of the world; each element is on one data-parallel rank, an expert's on one expert
  /// data-parallel rank). They carry their model parameter's attributes (allreduce included).
  const std::vector<torch::Tensor>& main_params() const { return main_params_; }
  /// Megatron's _copy_model_grads_to_main_grads: each main param's grad becomes its elements of the grad buffer
  /// (a view, or an fp32 copy of a bf16/fp16 buffer). With fp16's scaler the grads are unscaled and checked: returns
  /// true when some rank of the world found an inf or nan (the scaler has taken it; skip the step), else false.
  bool prepare_grads();
  /// fp16's loss scaler; null without one.
  GradScaler* grad_scaler() { return grad_scaler_ ? &*grad_scaler_ : nullptr; }
  /// After the optimizer's step: the model params take the main params' values, and every data-parallel rank's
  /// updated shards are all-gathered into every rank's model (DistributedDataParallel::start_param_sync, collective
  /// over the data-parallel group; with ddp overlap_param_gather only started, the next forward waits per bucket).
  void finish_step();

  struct Piece {
    torch::Tensor model_param;  ///< the wrapped parameter
    int64_t offset = 0;         ///< where the piece starts among the parameter's elements (flattened)
    torch::Tensor model_view;   ///< its elements [offset, offset + numel), flattened
    torch::Tensor grad_view;    ///< the same elements of its main_grad
    torch::Tensor main_param;   ///< model_view itself (same dtype as the main grads) or an fp32 copy
  };

  /// Megatron's get_parameter_state_dp_zero: the state `optimizer` (built over main_params()) keeps for the pieces,
  /// and a bf16 model's fp32 main params, whole per model parameter as an optimizer without sharding keeps them:
  /// tensors[param] maps "exp_avg", "exp_avg_sq" (AdamW), "momentum_buffer" (SGD with momentum) and "main_param"
  /// (bf16) to fp32 CPU tensors of the parameter's shape. What a checkpoint saves, so that it loads into any
  /// data-parallel size and with the distributed optimizer on or off. Collective over the data-parallel group (and the
  /// expert data-parallel group when there are experts; their whole values are complete on every rank of it); with
  /// `keep` false (a rank that does not write) this rank only contributes.
  struct WholeState {
    bool stepped = false;  ///< the optimizer has state: it stepped at least once
    int64_t step = 0;      ///< AdamW's step count (every piece's is the same)
    std::unordered_map<const c10::TensorImpl*, std::map<std::string, torch::Tensor>> tensors;
  };
  WholeState gather_state(torch::optim::Optimizer& optimizer, bool keep) const;

  /// The way back (Megatron's load_parameter_state_from_dp_zero), one parameter at a time: this rank's pieces of
  /// `model_param` take their elements of `whole` (tensors of its shape under the keys above): the main params from
  /// "main_param", and with `step` (the checkpoint has optimizer state) new optimizer state from the rest.
  void load_state(torch::optim::Optimizer& optimizer, const torch::Tensor& model_param,
                  const std::map<std::string, torch::Tensor>& whole, std::optional<int64_t> step) const;

  /// One bucket as Megatron-Core's dp_reshardable checkpoint layout names it: its buffer's index among this rank's
  /// dense (or expert) buffers over every model chunk in order (gbuf_idx), its index within that buffer (bucket_idx),
  /// the buffer's dtypes, its parameters at their offsets and where this rank's shard lies.
  struct BucketLayout {
    bool expert = false;
    int64_t buffer = 0;
    int64_t bucket = 0;
    c10::ScalarType param_dtype = c10::ScalarType::Float;
    c10::ScalarType grad_dtype = c10::ScalarType::Float;
    int64_t numel = 0;           ///< with the padding
    int64_t numel_unpadded = 0;  ///< up to the last parameter's end
    std::vector<torch::Tensor> params;
    std::vector<int64_t> offsets;            ///< each param's first element within the bucket
    int64_t shard_begin = 0, shard_end = 0;  ///< this rank's elements of the bucket (padding included)
    parallel::ProcessGroup* group = nullptr;
  };
  std::vector<BucketLayout> bucket_layouts() const;
  /// This rank's pieces, in bucket order.
  const std::vector<Piece>& pieces() const { return pieces_; }

  /// Every wrapped parameter's whole value of something the pieces hold (an optimizer state, the fp32 main param),
  /// put together from the data-parallel ranks' pieces: `piece_value(piece)` gives this rank's fp32 values of one of
  /// its pieces ([numel]); the result maps each model parameter to an fp32 CPU tensor of its shape. Collective over
  /// the data-parallel group (an expert bucket over the expert data-parallel group), one bucket at a time; with `keep`
  /// false this rank only contributes (an empty map).
  std::unordered_map<const c10::TensorImpl*, torch::Tensor> gather_whole(
      const std::function<torch::Tensor(const Piece&)>& piece_value, bool keep) const;

 private:
  // A bucket's parameters and where this rank's shard of it lies.
  struct BucketShard {
    std::vector<torch::Tensor> params;        // in buffer order
    std::vector<int64_t> offsets;             // each param's first element within the bucket
    int64_t numel = 0;                        // elements of the bucket
    int64_t shard = 0;                        // elements per rank, ceil(numel / dp)
    parallel::ProcessGroup* group = nullptr;  // sharded over: the data-parallel or the expert data-parallel group
    BucketLayout layout;                      // its place in the buffers, for checkpoints
  };
  // Every rank's shard of `staged` (a bucket's elements, this rank's own filled in) into every rank's copy.
  void gather_shards(const BucketShard& bucket, const torch::Tensor& staged) const;

  parallel::ProcessGroup* group_;
  std::vector<parallel::ProcessGroup*> expert_groups_;  // the chunks' expert data-parallel groups, each once
  std::optional<GradScaler> grad_scaler_;
  std::vector<parallel::distributed::DistributedDataParallel*> chunks_;
  std::vector<Piece> pieces_;
  std::vector<BucketShard> buckets_;
  std::vector<torch::Tensor> main_params_, decayed_, not_decayed_;
};

/// Whether a live DistributedOptimizer shards `model_param`, with pieces on this rank or not: its reduced gradient is
/// then only in the pieces' elements of the grad buffer, spread over the data-parallel ranks.
bool sharded_by_distributed_optimizer(const torch::Tensor& model_param);

/// This rank's pieces of `model_param` in the live DistributedOptimizer that shards it (none when none does): what a
/// test or a statistic reads to see the clipped gradients and the updates a rank is responsible for.
std::vector<DistributedOptimizer::Piece> distributed_optimizer_pieces(const torch::Tensor& model_param);

}  // namespace bridge::training
