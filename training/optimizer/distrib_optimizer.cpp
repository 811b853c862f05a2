// DistributedOptimizer: the shard layout over each bucket, the pieces' main params, the step's two ends (grads in,
// updated shards out and all-gathered), and the state gathered whole for a checkpoint and handed back on a load. An
// expert bucket is sharded over the group DistributedDataParallel reduces it over, the expert data-parallel one.
#include "training/optimizer/distrib_optimizer.h"

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/param_attributes.h"
#include "training/optimizer/optimizer.h"

namespace bridge::training {
namespace {

namespace tp = parallel::tensor_parallel;
using parallel::distributed::DistributedDataParallel;

// Every live DistributedOptimizer's pieces by model parameter, as DistributedDataParallel's main_grad registry; a
// sharded parameter whose elements all sit on other ranks has an entry without pieces.
std::mutex& registry_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::unordered_map<const c10::TensorImpl*, std::vector<const DistributedOptimizer::Piece*>>& registry() {
  static auto* pieces = new std::unordered_map<const c10::TensorImpl*, std::vector<const DistributedOptimizer::Piece*>>;
  return *pieces;
}

}  // namespace

DistributedOptimizer::DistributedOptimizer(std::vector<DistributedDataParallel*> chunks,
                                           parallel::ProcessGroup* data_parallel_group,
                                           std::optional<GradScaler> grad_scaler)
    : group_(data_parallel_group != nullptr ? data_parallel_group
                                            : &parallel::get_data_parallel_group(/*with_context_parallel=*/true)),
      grad_scaler_(std::move(grad_scaler)),
      chunks_(std::move(chunks)) {
  torch::NoGradGuard no_grad;
  int64_t buffers_seen[2] = {0, 0};  // dense, expert: gbuf_idx counts each kind's buffers over the chunks
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    DistributedDataParallel* ddp = chunks_[c];
    if (ddp == nullptr) {
      throw std::invalid_argument("DistributedOptimizer: model chunk " + std::to_string(c) +
                                  " has no DistributedDataParallel; wrap every chunk before building the optimizer");
    }
    // Its buckets must be reduce-scattered over this optimizer's group and its parameters gathered back through it.
    if (!ddp->config().use_distributed_optimizer || &ddp->data_parallel_group() != group_) {
      throw std::invalid_argument(
          "DistributedOptimizer: model chunk " + std::to_string(c) + "'s DistributedDataParallel " +
          (ddp->config().use_distributed_optimizer ? "reduces over another group than the optimizer's"
                                                   : "was built without use_distributed_optimizer") +
          "; build it with DistributedDataParallelConfig.use_distributed_optimizer = true over the same "
          "data-parallel group");
    }
    // Each bucket's params in buffer order, at their offsets from the bucket's first element.
    std::vector<std::vector<std::pair<int64_t, torch::Tensor>>> members(static_cast<std::size_t>(ddp->num_buckets()));
    for (const torch::Tensor& param : ddp->params()) {
      if (!param.is_contiguous()) {
        throw std::invalid_argument("DistributedOptimizer: a parameter of shape " + c10::str(param.sizes()) +
                                    " is not contiguous; its elements could not be sharded as views");
      }
      // Where its gradient starts in the buffer's storage, which the bucket's other gradients share.
      members[static_cast<std::size_t>(ddp->bucket_of(param))].emplace_back(ddp->main_grad(param).storage_offset(),
                                                                            param);
    }
    if (parallel::ProcessGroup* experts = ddp->expert_data_parallel_group()) {
      if (std::find(expert_groups_.begin(), expert_groups_.end(), experts) == expert_groups_.end()) {
        expert_groups_.push_back(experts);
      }
    }
    const void* previous_buffer = nullptr;
    int64_t bucket_in_buffer = 0;
    for (std::size_t b = 0; b < members.size(); ++b) {
      auto& list = members[b];
      std::sort(list.begin(), list.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
      BucketShard bucket;
      // Megatron's expert optimizer: an expert bucket's state is sharded over the expert data-parallel group, whose
      // ranks hold the same experts, as DDP reduce-scatters it.
      bucket.group = &ddp->bucket_group(static_cast<int64_t>(b));
      const int64_t ranks = bucket.group->size();
      const int64_t rank = bucket.group->rank();
      bucket.numel = ddp->bucket_numel(static_cast<int64_t>(b));
      bucket.shard = (bucket.numel + ranks - 1) / ranks;
      const int64_t start = list.front().first;
      for (const auto& [offset, param] : list) {
        bucket.params.push_back(param);
        bucket.offsets.push_back(offset - start);
      }
      // A bucket's buffer is the storage its grads share; a chunk's buckets come buffer by buffer.
      const torch::Tensor first_grad = ddp->main_grad(bucket.params.front());
      const void* buffer = first_grad.storage().data();
      BucketLayout& layout = bucket.layout;
      layout.expert = ddp->is_expert_bucket(static_cast<int64_t>(b));
      if (buffer != previous_buffer) {
        bucket_in_buffer = 0;
        ++buffers_seen[layout.expert ? 1 : 0];
        previous_buffer = buffer;
      }
      layout.buffer = buffers_seen[layout.expert ? 1 : 0] - 1;
      layout.bucket = bucket_in_buffer++;
      layout.param_dtype = bucket.params.front().scalar_type();
      layout.grad_dtype = first_grad.scalar_type();
      layout.numel = bucket.numel;
      layout.numel_unpadded = bucket.offsets.back() + bucket.params.back().numel();
      layout.params = bucket.params;
      layout.offsets = bucket.offsets;
      layout.group = bucket.group;
      // This rank's elements [lo, hi) of the bucket, cut at parameter boundaries.
      const int64_t lo = std::min(rank * bucket.shard, bucket.numel);
      const int64_t hi = std::min(lo + bucket.shard, bucket.numel);
      layout.shard_begin = lo;
      layout.shard_end = hi;
      for (std::size_t i = 0; i < bucket.params.size(); ++i) {
        const torch::Tensor& param = bucket.params[i];
        const int64_t first = std::max(lo, bucket.offsets[i]);
        const int64_t last = std::min(hi, bucket.offsets[i] + param.numel());
        if (first >= last) continue;
        Piece piece;
        piece.model_param = param;
        piece.offset = first - bucket.offsets[i];
        piece.model_view = param.detach().view({-1}).narrow(0, piece.offset, last - first);
        piece.grad_view = ddp->main_grad(param).view({-1}).narrow(0, piece.offset, last - first);
        // fp32 parameters are stepped in place; bf16/fp16 ones through an fp32 copy, as Megatron's main params.
        piece.main_param =
            param.scalar_type() == torch::kFloat32 ? piece.model_view : piece.model_view.to(torch::kFloat32).clone();
        // The grad norm counts a tensor-parallel replica and the tied embedding's copy once, as for whole params.
        tp::ParamAttributes attributes = tp::get_param_attributes(param);
        attributes.partition_dim = attributes.tensor_model_parallel ? 0 : -1;
        attributes.partition_stride = 1;
        tp::set_param_attributes(piece.main_param, attributes);
        (param.dim() <= 1 ? not_decayed_ : decayed_).push_back(piece.main_param);
        main_params_.push_back(piece.main_param);
        pieces_.push_back(std::move(piece));
      }
      buckets_.push_back(std::move(bucket));
    }
  }
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (const BucketShard& bucket : buckets_) {
    for (const torch::Tensor& param : bucket.params) registry()[param.unsafeGetTensorImpl()];
  }
  for (const Piece& piece : pieces_) registry()[piece.model_param.unsafeGetTensorImpl()].push_back(&piece);
}

DistributedOptimizer::~DistributedOptimizer() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (const BucketShard& bucket : buckets_) {
    for (const torch::Tensor& param : bucket.params) registry().erase(param.unsafeGetTensorImpl());
  }
}

std::vector<DistributedOptimizer::BucketLayout> DistributedOptimizer::bucket_layouts() const {
  std::vector<BucketLayout> layouts;
  for (const BucketShard& bucket : buckets_) layouts.push_back(bucket.layout);
  return layouts;
}

bool sharded_by_distributed_optimizer(const torch::Tensor& model_param) {
  if (!model_param.defined()) return false;
  std::lock_guard<std::mutex> lock(registry_mutex());
  return registry().count(model_param.unsafeGetTensorImpl()) != 0;
}

std::vector<DistributedOptimizer::Piece> distributed_optimizer_pieces(const torch::Tensor& model_param) {
  std::vector<DistributedOptimizer::Piece> pieces;
  if (!model_param.defined()) return pieces;
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto found = registry().find(model_param.unsafeGetTensorImpl());
  if (found != registry().end()) {
    for (const DistributedOptimizer::Piece* piece : found->second) pieces.push_back(*piece);
  }
  return pieces;
}

bool DistributedOptimizer::prepare_grads() {
  torch::NoGradGuard no_grad;
  for (Piece& piece : pieces_) {
    piece.main_param.mutable_grad() =
        piece.grad_view.scalar_type() == torch::kFloat32 ? piece.grad_view : piece.grad_view.to(torch::kFloat32);
  }
  if (!grad_scaler_) return false;
  // Megatron's _unscale_main_grads_and_check_for_nan over the shards: the flag is agreed over the whole world, since
  // each rank sees only its own pieces (a rank may hold none).
  const double inv_scale = grad_scaler_->inv_scale();
  const torch::Device device = buckets_.empty() ? torch::Device(torch::kCPU) : buckets_.front().params.front().device();
  torch::Tensor finite = torch::ones({1}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  for (Piece& piece : pieces_) {
    const torch::Tensor& grad = piece.main_param.grad();
    grad.mul_(inv_scale);
    finite.mul_(torch::isfinite(grad).all().to(torch::kFloat32));
  }
  torch::Tensor found_inf = 1.0 - finite;
  parallel::ProcessGroup& world = parallel::get_world_group();
  if (world.size() > 1) world.all_reduce(found_inf, parallel::ReduceOp::kMax);
  const bool overflow = found_inf.item<float>() > 0.0f;
  grad_scaler_->update(overflow);
  return overflow;
}

void DistributedOptimizer::finish_step() {
  torch::NoGradGuard no_grad;
  for (Piece& piece : pieces_) {
    if (!piece.main_param.is_same(piece.model_view)) piece.model_view.copy_(piece.main_param);
  }
  // In place in DDP's parameter buffers, started in forward order; under overlap_param_gather the next forward waits
  // for each bucket just before using it.
  for (DistributedDataParallel* chunk : chunks_) chunk->start_param_sync();
}

std::unordered_map<const c10::TensorImpl*, torch::Tensor> DistributedOptimizer::gather_whole(
    const std::function<torch::Tensor(const Piece&)>& piece_value, bool keep) const {
  torch::NoGradGuard no_grad;
  std::unordered_map<const c10::TensorImpl*, torch::Tensor> whole;
  for (const BucketShard& bucket : buckets_) {
    // One bucket at a time in fp32 on the device, laid out as the bucket: the staging stays one bucket's size.
    const torch::Tensor staged =
        torch::zeros({bucket.shard * bucket.group->size()},
                     bucket.params.front().options().dtype(torch::kFloat32).requires_grad(false));
    const auto flat = [&](std::size_t i) { return staged.narrow(0, bucket.offsets[i], bucket.params[i].numel()); };
    std::unordered_map<const c10::TensorImpl*, std::size_t> index;
    for (std::size_t i = 0; i < bucket.params.size(); ++i) index.emplace(bucket.params[i].unsafeGetTensorImpl(), i);
    for (const Piece& piece : pieces_) {
      auto found = index.find(piece.model_param.unsafeGetTensorImpl());
      if (found == index.end()) continue;  // another bucket's
      flat(found->second).narrow(0, piece.offset, piece.model_view.numel()).copy_(piece_value(piece));
    }
    gather_shards(bucket, staged);
    if (!keep) continue;
    for (std::size_t i = 0; i < bucket.params.size(); ++i) {
      whole.emplace(bucket.params[i].unsafeGetTensorImpl(),
                    flat(i).view(bucket.params[i].sizes()).to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true));
    }
  }
  return whole;
}

namespace {

// This rank's optimizer state of a piece's main param, or nullptr before its first step.
torch::optim::OptimizerParamState* piece_state(torch::optim::Optimizer& optimizer, const torch::Tensor& main_param) {
  auto found = optimizer.state().find(optimizer_state_key(main_param));
  return found == optimizer.state().end() ? nullptr : found->second.get();
}

}  // namespace

DistributedOptimizer::WholeState DistributedOptimizer::gather_state(torch::optim::Optimizer& optimizer,
                                                                    bool keep) const {
  const bool adam = dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr;
  // Whether any rank has stepped, AdamW's step and whether SGD keeps momentum: a rank may hold no piece at all.
  int64_t stepped = 0, step = 0, momentum = 0;
  for (const Piece& piece : pieces_) {
    torch::optim::OptimizerParamState* state = piece_state(optimizer, piece.main_param);
    if (state == nullptr) continue;
    stepped = 1;
    if (auto* adam_state = dynamic_cast<torch::optim::AdamWParamState*>(state)) {
      step = std::max(step, adam_state->step());
    } else if (static_cast<torch::optim::SGDParamState*>(state)->momentum_buffer().defined()) {
      momentum = 1;
    }
  }
  torch::Tensor flags = torch::tensor({stepped, step, momentum}, torch::kInt64);
  if (!buckets_.empty()) flags = flags.to(buckets_.front().params.front().device());  // NCCL's device
  group_->all_reduce(flags, parallel::ReduceOp::kMax);
  // A rank may hold pieces of expert buckets only: its expert data-parallel peers agree too.
  for (parallel::ProcessGroup* experts : expert_groups_) {
    if (experts->size() > 1) experts->all_reduce(flags, parallel::ReduceOp::kMax);
  }
  flags = flags.cpu();
  WholeState whole;
  whole.stepped = flags[0].item<int64_t>() != 0;
  whole.step = flags[1].item<int64_t>();

  std::vector<std::string> keys;
  if (whole.stepped && adam) keys = {"exp_avg", "exp_avg_sq"};
  if (whole.stepped && !adam && flags[2].item<int64_t>() != 0) keys = {"momentum_buffer"};
  for (const std::string& key : keys) {
    auto values = gather_whole(
        [&](const Piece& piece) {
          torch::optim::OptimizerParamState* state = piece_state(optimizer, piece.main_param);
          if (state == nullptr) {
            throw std::logic_error("DistributedOptimizer::gather_state: a piece has no optimizer state after a step");
          }
          if (auto* a = dynamic_cast<torch::optim::AdamWParamState*>(state)) {
            return key == "exp_avg" ? a->exp_avg() : a->exp_avg_sq();
          }
          return static_cast<torch::optim::SGDParamState*>(state)->momentum_buffer();
        },
        keep);
    for (auto& [param, value] : values) whole.tensors[param].emplace(key, std::move(value));
  }
  // A bf16 model's fp32 main params (an fp32 model's are its own params).
  const bool fp32 = std::all_of(buckets_.begin(), buckets_.end(), [](const BucketShard& bucket) {
    return bucket.params.front().scalar_type() == torch::kFloat32;
  });
  if (!fp32) {
    auto values = gather_whole([](const Piece& piece) { return piece.main_param; }, keep);
    for (auto& [param, value] : values) whole.tensors[param].emplace("main_param", std::move(value));
  }
  return whole;
}

void DistributedOptimizer::load_state(torch::optim::Optimizer& optimizer, const torch::Tensor& model_param,
                                      const std::map<std::string, torch::Tensor>& whole,
                                      std::optional<int64_t> step) const {
  torch::NoGradGuard no_grad;
  const auto part = [&](const Piece& piece, const std::string& key) -> std::optional<torch::Tensor> {
    auto found = whole.find(key);
    if (found == whole.end()) return std::nullopt;
    return found->second.reshape({-1}).narrow(0, piece.offset, piece.model_view.numel());
  };
  const auto required = [&](const Piece& piece, const std::string& key) {
    std::optional<torch::Tensor> values = part(piece, key);
    if (!values) throw std::logic_error("DistributedOptimizer::load_state: no '" + key + "' for a parameter");
    return *values;
  };
  const bool adam = dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr;
  for (const Piece& piece : pieces_) {
    if (!piece.model_param.is_same(model_param)) continue;
    if (!piece.main_param.is_same(piece.model_view)) {
      if (std::optional<torch::Tensor> main = part(piece, "main_param")) piece.main_param.copy_(*main);
    }
    if (!step) continue;
    // Fresh tensors of the piece's dtype and device, as the optimizer's first step would make them.
    const auto fresh = [&](const torch::Tensor& values) { return values.to(piece.main_param.options(), false, true); };
    const auto key = optimizer_state_key(piece.main_param);
    if (adam) {
      auto state = std::make_unique<torch::optim::AdamWParamState>();
      state->step(*step);
      state->exp_avg(fresh(required(piece, "exp_avg")));
      state->exp_avg_sq(fresh(required(piece, "exp_avg_sq")));
      optimizer.state()[key] = std::move(state);
    } else {
      auto state = std::make_unique<torch::optim::SGDParamState>();
      if (std::optional<torch::Tensor> momentum = part(piece, "momentum_buffer")) {
        state->momentum_buffer(fresh(*momentum));
      }
      optimizer.state()[key] = std::move(state);
    }
  }
}

// In windows of at most kGatherWindow elements a rank, each gathered straight into `staged` (c10d stages a window, so
// its staging stays small next to the model), as DistributedDataParallel gathers the parameters.
void DistributedOptimizer::gather_shards(const BucketShard& bucket, const torch::Tensor& staged) const {
  constexpr int64_t kGatherWindow = int64_t{1} << 22;
  parallel::ProcessGroup& group = *bucket.group;
  if (group.size() == 1) return;
  for (int64_t at = 0; at < bucket.shard; at += kGatherWindow) {
    const int64_t width = std::min(kGatherWindow, bucket.shard - at);
    std::vector<torch::Tensor> outputs;
    for (int64_t rank = 0; rank < group.size(); ++rank) {
      outputs.push_back(staged.narrow(0, rank * bucket.shard + at, width));
    }
    const torch::Tensor own = outputs[static_cast<std::size_t>(group.rank())];
    group.all_gather_async(std::move(outputs), own).wait();
  }
}

}  // namespace bridge::training
