// DistributedDataParallel: grad buffers, buckets, and the grad-accumulator post hooks that start each bucket's
// all-reduce once its grads are final. LibTorch's AccumulateGrad adds a new gradient into a defined .grad in place
// when grad mode is off (every first-order backward), so a .grad that is a view into the buffer keeps receiving the
// gradients; a hook on the same accumulator then knows the parameter's gradient for this backward is complete (the
// approach of PyTorch's C++ Reducer). A bf16/fp16 parameter whose buffer is fp32 (grad_reduce_in_fp32) cannot have a
// grad of another dtype, so there the hook adds param.grad into the buffer and drops it, as Megatron's main_grad.
// Expert-parallel parameters (attribute allreduce false) get buffers of their own, reduced over the expert
// data-parallel group (Megatron's expert_parallel_buffers); their buckets start in order among themselves, apart from
// the dense ones, so neither kind waits for the other's gradients.
#include "parallel/distributed/distributed_data_parallel.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/param_attributes.h"
#include "utils/host_allocator.h"

namespace bridge::parallel::distributed {
namespace {

struct ParamSlot {
  torch::Tensor param;
  torch::Tensor grad;     // the view into the grad buffer: param.grad() itself, or its main_grad when `separate`
  bool separate = false;  // the buffer's dtype differs from the param's: grads are added in, param.grad dropped
  int64_t bucket = -1;
  bool reported = false;  // its grad is final in the current grad sync
  // Kept alive so the hook stays registered across graphs (a shared_ptr in LibTorch 1.x, an intrusive_ptr in 2.x).
  decltype(torch::autograd::impl::grad_accumulator(std::declval<torch::Tensor>())) accumulator;
  uintptr_t hook_key = 0;
};

struct Bucket {
  torch::Tensor data;         // a contiguous slice of one grad buffer
  int64_t hooked_params = 0;  // params of this bucket whose accumulator carries our hook
  int64_t pending = 0;        // hooked params not yet reported in the current grad sync
  bool started = false;
  Work work;
  torch::Tensor param_data;         // under the distributed optimizer: the same elements of the parameter buffer
  int64_t gather_windows_left = 0;  // windows of param_data's all-gather not yet complete
  bool expert = false;              // expert-parallel parameters' gradients
  ProcessGroup* group = nullptr;    // reduces it: the data-parallel group, or the expert data-parallel one
  bool reduce_scatter = false;      // use_distributed_optimizer over a group of more than one rank
};

// One window of a bucket's parameter all-gather: each rank's next kGatherWindow elements of its shard. Windows keep
// the collectives' staging (c10d gathers into a buffer of its own, then copies out) a few windows' size, not the
// model's.
struct GatherWindow {
  std::size_t bucket = 0;
  std::vector<torch::Tensor> outputs;  // every rank's elements of this window, views of the bucket
  Work work;
};
constexpr int64_t kGatherWindow = int64_t{1} << 22;  // elements per rank
constexpr std::size_t kGatherWindowsInFlight = 2;

// One window of a bucket's gradient reduce-scatter (distributed optimizer): each rank's next kScatterWindow elements
// of its chunk. c10d reduces from a copy of its inputs (Gloo clones them when the collective is issued), so a whole
// bucket at once staged a bucket's size (153 MiB for 40 M elements), during the backward, on top of the activations;
// windows keep it to kScatterWindowsInFlight x ranks x kScatterWindow elements (16 MiB in fp32 at dp 2). Smaller
// than the gather's windows: the reduce-scatters overlap the backward's activation peak, the gathers do not.
struct ScatterWindow {
  std::vector<torch::Tensor> inputs;  // every rank's elements of this window, views of the bucket
  torch::Tensor output;               // this rank's: inputs[rank], reduced in place
  ProcessGroup* group = nullptr;
  Work work;
};
constexpr int64_t kScatterWindow = int64_t{1} << 20;  // elements per rank
constexpr std::size_t kScatterWindowsInFlight = 2;

// Megatron's param.main_grad: C++ tensors have no attribute slots, so a registry keyed by the TensorImpl (as
// param_attributes) maps each wrapped parameter to its view into the grad buffer.
std::mutex& main_grad_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::unordered_map<const c10::TensorImpl*, torch::Tensor>& main_grads() {
  static std::unordered_map<const c10::TensorImpl*, torch::Tensor> registry;
  return registry;
}

// Which live DistributedDataParallel's bucket holds each parameter, for the forward pre-hooks of overlap_param_gather
// (a model's forward knows its modules, not the wrapper); the count of gathers in flight makes them free otherwise.
struct GatherOwner {
  DistributedDataParallel::Impl* impl = nullptr;
  std::size_t bucket = 0;
};
std::mutex& gather_registry_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::unordered_map<const c10::TensorImpl*, GatherOwner>& gather_owners() {
  static auto* owners = new std::unordered_map<const c10::TensorImpl*, GatherOwner>;
  return *owners;
}
std::atomic<int64_t>& gathers_in_flight() {
  static std::atomic<int64_t> count{0};
  return count;
}

std::string describe_param(std::size_t index, const torch::Tensor& param) {
  return "parameter #" + std::to_string(index) + " (shape " + c10::str(param.sizes()) + ")";
}

}  // namespace

struct DistributedDataParallel::Impl {
  Impl(std::shared_ptr<torch::nn::Module> wrapped, DistributedDataParallelConfig ddp_config, ProcessGroup* dp_group,
       const std::vector<torch::Tensor>& own_bucket_params, ProcessGroup* expert_dp_group);
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  void build_buffers(const std::vector<torch::Tensor>& own_bucket);
  void register_hooks();
  void on_grad_ready(std::size_t index);
  void reattach_grad(ParamSlot& slot);
  void absorb_grad(ParamSlot& slot);
  void start_ready_buckets();
  void start_bucket(Bucket& bucket, bool in_backward);
  void wait_started();
  // Under mutex: starts queued reduce-scatter windows while fewer than kScatterWindowsInFlight are in flight, after
  // retiring the completed ones; with `drain`, until every window is done.
  void pump_scatter_windows(bool drain);
  void reset_sync_state();
  void finish_bucket_gather(std::size_t index);
  void finish_gathers();
  // Under gather_mutex:
  void start_gather_windows();
  void complete_oldest_gather_window();
  ProcessGroup* group_of(bool expert) const { return expert ? expert_group : group; }
  bool reduce_scatters(bool expert) const { return config.use_distributed_optimizer && group_of(expert)->size() > 1; }
  // The buckets of one kind, [begin, end) of `buckets`: the dense ones first, then the experts'.
  std::size_t kind_begin(int kind) const { return kind == 0 ? 0 : first_expert_bucket; }
  std::size_t kind_end(int kind) const { return kind == 0 ? first_expert_bucket : buckets.size(); }

  std::shared_ptr<torch::nn::Module> module;
  DistributedDataParallelConfig config;
  ProcessGroup* group;
  ProcessGroup* expert_group = nullptr;  // set iff some wrapped parameter is expert-parallel
  std::vector<torch::Tensor> params;
  std::vector<ParamSlot> slots;
  std::vector<torch::Tensor> buffers;
  std::vector<Bucket> buckets;
  std::unordered_map<const c10::TensorImpl*, std::size_t> index_of;
  std::size_t first_expert_bucket = 0;  // the number of dense buckets
  bool grad_sync = true;
  // Per kind (dense, expert), the next bucket to start: each kind's buckets start strictly in order, the same on every
  // rank of the group reducing them.
  std::size_t next_to_start[2] = {0, 0};
  int64_t started = 0;
  int64_t started_in_backward = 0;
  int64_t last_started_in_backward = 0;
  std::mutex mutex;
  std::mutex gather_mutex;                     // the parameter all-gathers' state (the forward's thread, or a reader's)
  std::deque<GatherWindow> gathers_queued;     // in forward order, not started
  std::deque<GatherWindow> gathers_started;    // in flight, oldest first
  std::deque<ScatterWindow> scatters_queued;   // under mutex: in bucket start order, not started
  std::deque<ScatterWindow> scatters_started;  // under mutex: in flight, oldest first
};

namespace {

class GradReadyHook final : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(DistributedDataParallel::Impl* impl, std::size_t index) : impl_(impl), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    impl_->on_grad_ready(index_);
    return outputs;
  }

 private:
  DistributedDataParallel::Impl* impl_;
  std::size_t index_;
};

}  // namespace

DistributedDataParallel::Impl::Impl(std::shared_ptr<torch::nn::Module> wrapped,
                                    DistributedDataParallelConfig ddp_config, ProcessGroup* dp_group,
                                    const std::vector<torch::Tensor>& own_bucket_params, ProcessGroup* expert_dp_group)
    : module(std::move(wrapped)), config(ddp_config), group(dp_group) {
  if (!module) throw std::invalid_argument("DistributedDataParallel: the module is null; pass the model chunk to wrap");
  if (config.bucket_size < 0) {
    throw std::invalid_argument(
        "DistributedDataParallelConfig.bucket_size must be >= 0 (0 = Megatron's default), got " +
        std::to_string(config.bucket_size));
  }
  if (config.overlap_param_gather && !config.use_distributed_optimizer) {
    throw std::invalid_argument(
        "DistributedDataParallelConfig.overlap_param_gather needs use_distributed_optimizer: only the distributed "
        "optimizer all-gathers parameters after its step; turn both on, or overlap_param_gather off");
  }
  if (group == nullptr) group = &get_data_parallel_group(/*with_context_parallel=*/true);
  for (const torch::Tensor& param : module->parameters()) {
    if (!param.requires_grad() || index_of.count(param.unsafeGetTensorImpl()) != 0) continue;  // frozen or shared
    index_of.emplace(param.unsafeGetTensorImpl(), params.size());
    params.push_back(param);
    // The expert data-parallel group is looked up only for a model that has experts: a dense one needs none.
    if (expert_group == nullptr && tensor_parallel::is_expert_parallel_param(param)) {
      expert_group = expert_dp_group != nullptr ? expert_dp_group : &get_expert_data_parallel_group();
    }
  }
  build_buffers(own_bucket_params);
  register_hooks();
  reset_sync_state();
}

DistributedDataParallel::Impl::~Impl() {
  for (ParamSlot& slot : slots) {
    if (slot.accumulator) slot.accumulator->del_post_hook(slot.hook_key);
  }
  {
    std::lock_guard<std::mutex> lock(main_grad_mutex());
    for (ParamSlot& slot : slots) {
      auto found = main_grads().find(slot.param.unsafeGetTensorImpl());
      if (found != main_grads().end() && found->second.is_same(slot.grad)) main_grads().erase(found);
    }
  }
  {
    std::lock_guard<std::mutex> lock(gather_registry_mutex());
    for (ParamSlot& slot : slots) {
      auto found = gather_owners().find(slot.param.unsafeGetTensorImpl());
      if (found != gather_owners().end() && found->second.impl == this) gather_owners().erase(found);
    }
  }
  // A destructor must not throw; a failure was or will be reported by the peers' errors.
  for (Bucket& bucket : buckets) {
    try {
      bucket.work.wait();
    } catch (...) {
    }
    if (bucket.gather_windows_left > 0) --gathers_in_flight();
  }
  for (GatherWindow& window : gathers_started) {
    try {
      window.work.wait();
    } catch (...) {
    }
  }
  for (ScatterWindow& window : scatters_started) {
    try {
      window.work.wait();
    } catch (...) {
    }
  }
}

void DistributedDataParallel::Impl::build_buffers(const std::vector<torch::Tensor>& own_bucket) {
  // One buffer per (dtype, device), params in reverse order: the order backward produces their grads.
  struct Group {
    torch::TensorOptions options;
    caffe2::TypeMeta param_dtype;
    bool expert = false;
    std::vector<std::size_t> members;
  };
  std::vector<Group> groups;
  for (std::size_t i = params.size(); i-- > 0;) {
    const torch::Tensor& param = params[i];
    const bool low_precision = param.scalar_type() == torch::kBFloat16 || param.scalar_type() == torch::kHalf;
    const caffe2::TypeMeta dtype =
        config.grad_reduce_in_fp32 && low_precision ? caffe2::TypeMeta::Make<float>() : param.dtype();
    const bool expert = tensor_parallel::is_expert_parallel_param(param);
    // Under the distributed optimizer the parameters also share a buffer, so a group holds one parameter dtype too.
    auto found = std::find_if(groups.begin(), groups.end(), [&](const Group& g) {
      return g.options.dtype() == dtype && g.options.device() == param.device() && g.expert == expert &&
             (!reduce_scatters(expert) || g.param_dtype == param.dtype());
    });
    if (found == groups.end()) {
      groups.push_back({torch::TensorOptions().dtype(dtype).device(param.device()), param.dtype(), expert, {}});
      found = std::prev(groups.end());
    }
    found->members.push_back(i);
  }
  // The dense buffers first, so a dense model's buckets are numbered as without experts.
  std::stable_partition(groups.begin(), groups.end(), [](const Group& g) { return !g.expert; });

  std::unordered_map<const c10::TensorImpl*, bool> alone;
  for (const torch::Tensor& param : own_bucket) {
    if (param.defined()) alone.emplace(param.unsafeGetTensorImpl(), true);
  }
  slots.resize(params.size());
  torch::NoGradGuard no_grad;
  for (const Group& g : groups) {
    ProcessGroup* reducer = group_of(g.expert);
    const bool scatter = reduce_scatters(g.expert);
    const int64_t bucket_size = config.bucket_size > 0
                                    ? config.bucket_size
                                    : std::max<int64_t>(40'000'000, int64_t{1'000'000} * reducer->size());
    // Under the distributed optimizer each bucket ends padded to a multiple of lcm(dp, 128), as Megatron's (dp: the
    // size of the group reducing it), so that it splits into dp equal, aligned shards; the own_bucket params sit
    // alone.
    const int64_t pad_to = scatter ? std::lcm<int64_t>(reducer->size(), 128) : 1;
    // The layout first (each member's offset, the buckets' padded ends), then the buffer with the padding included.
    std::vector<int64_t> offsets(g.members.size()), bucket_of_member(g.members.size());
    std::vector<std::pair<int64_t, int64_t>> ranges;  // [start, end) of each bucket in the buffer
    int64_t offset = 0;
    int64_t bucket_start = 0;
    auto close_bucket = [&] {
      offset = (offset + pad_to - 1) / pad_to * pad_to;
      ranges.emplace_back(bucket_start, offset);
      bucket_start = offset;
    };
    for (std::size_t member = 0; member < g.members.size(); ++member) {
      const torch::Tensor& param = params[g.members[member]];
      const bool own = scatter && alone.count(param.unsafeGetTensorImpl()) != 0;
      if (own && offset > bucket_start) close_bucket();
      offsets[member] = offset;
      bucket_of_member[member] = static_cast<int64_t>(ranges.size());
      offset += param.numel();
      // As Megatron: a param is never split; a bucket closes once it reaches bucket_size. Without overlap one bucket.
      const bool last = member + 1 == g.members.size();
      if (own || last || (config.overlap_grad_reduce && offset - bucket_start >= bucket_size)) close_bucket();
    }
    // Both buffers live as long as the model: outside malloc's heap, where they would pin the step's transients
    // around them (utils/host_allocator.h).
    torch::Tensor buffer = utils::zeros_outside_heap(offset, g.options);
    // Megatron's param buffer: the parameters become views of one buffer with the grad buffer's layout, so that each
    // bucket's updated shards are all-gathered straight into the parameters.
    torch::Tensor param_buffer;
    if (scatter) param_buffer = utils::zeros_outside_heap(offset, g.options.dtype(g.param_dtype));
    const auto first_bucket = static_cast<int64_t>(buckets.size());
    for (const auto& [start, end] : ranges) {
      Bucket bucket;
      bucket.data = buffer.narrow(0, start, end - start);
      if (param_buffer.defined()) bucket.param_data = param_buffer.narrow(0, start, end - start);
      bucket.expert = g.expert;
      bucket.group = reducer;
      bucket.reduce_scatter = scatter;
      buckets.push_back(std::move(bucket));
    }
    if (!g.expert) first_expert_bucket = buckets.size();
    for (std::size_t member = 0; member < g.members.size(); ++member) {
      const std::size_t i = g.members[member];
      ParamSlot& slot = slots[i];
      slot.param = params[i];
      slot.grad = buffer.narrow(0, offsets[member], params[i].numel()).view(params[i].sizes());
      slot.bucket = first_bucket + bucket_of_member[member];
      slot.separate = slot.grad.dtype() != params[i].dtype();
      if (params[i].grad().defined()) slot.grad.copy_(params[i].grad());  // keep what was accumulated before wrapping
      params[i].mutable_grad() = slot.separate ? torch::Tensor() : slot.grad;
      if (param_buffer.defined()) {
        torch::Tensor storage = param_buffer.narrow(0, offsets[member], params[i].numel()).view(params[i].sizes());
        storage.copy_(params[i].detach());
        params[i].set_data(storage);  // the same parameter (every module holding it sees the move), new storage
        std::lock_guard<std::mutex> lock(gather_registry_mutex());
        gather_owners()[params[i].unsafeGetTensorImpl()] = {this, static_cast<std::size_t>(slot.bucket)};
      }
      std::lock_guard<std::mutex> lock(main_grad_mutex());
      main_grads()[params[i].unsafeGetTensorImpl()] = slot.grad;
    }
    buffers.push_back(std::move(buffer));
  }
}

void DistributedDataParallel::Impl::register_hooks() {
  for (std::size_t i = 0; i < slots.size(); ++i) {
    ParamSlot& slot = slots[i];
    // A leaf that requires grad always has an accumulator; without one (not a leaf) the bucket waits for
    // finish_grad_sync instead of the hook.
    slot.accumulator = torch::autograd::impl::grad_accumulator(slot.param);
    if (!slot.accumulator) continue;
    slot.hook_key = slot.accumulator->add_post_hook(std::make_unique<GradReadyHook>(this, i));
    ++buckets[static_cast<std::size_t>(slot.bucket)].hooked_params;
  }
}

void DistributedDataParallel::Impl::on_grad_ready(std::size_t index) {
  std::lock_guard<std::mutex> lock(mutex);
  ParamSlot& slot = slots[index];
  absorb_grad(slot);
  // The backward's hooks move the reduce-scatter windows along: each ready parameter starts the next ones.
  if (!scatters_started.empty()) pump_scatter_windows(/*drain=*/false);
  // Without overlap nothing starts before finish_grad_sync, so extra backward passes only accumulate (as Megatron).
  if (!grad_sync || !config.overlap_grad_reduce) return;
  if (slot.reported) {
    throw std::logic_error("DistributedDataParallel: the grad of " + describe_param(index, slot.param) +
                           " was completed twice in one grad sync, after its bucket may have been reduced. Call "
                           "set_grad_sync(false) before every micro-batch's backward but the last one's, and "
                           "finish_grad_sync() before the next step");
  }
  slot.reported = true;
  Bucket& bucket = buckets[static_cast<std::size_t>(slot.bucket)];
  if (--bucket.pending == 0) start_ready_buckets();
}

void DistributedDataParallel::Impl::reattach_grad(ParamSlot& slot) {
  torch::Tensor& grad = slot.param.mutable_grad();
  if (grad.is_same(slot.grad)) return;
  // The grad was replaced (zero_grad(set_to_none), a double-backward graph, an assignment): it holds the whole
  // accumulated value (none means zero), so move it into the buffer and re-attach the view.
  torch::NoGradGuard no_grad;
  if (grad.defined()) {
    slot.grad.copy_(grad);
  } else {
    slot.grad.zero_();
  }
  grad = slot.grad;
}

void DistributedDataParallel::Impl::absorb_grad(ParamSlot& slot) {
  if (!slot.separate) {
    reattach_grad(slot);
    return;
  }
  // Megatron's main_grad hook: this backward's gradient (in the param's dtype) is added into the buffer and dropped,
  // so the next backward starts from an undefined grad again.
  torch::Tensor& grad = slot.param.mutable_grad();
  if (!grad.defined()) return;
  torch::NoGradGuard no_grad;
  slot.grad.add_(grad);
  grad = torch::Tensor();
}

void DistributedDataParallel::Impl::start_ready_buckets() {
  for (int kind = 0; kind < 2; ++kind) {
    std::size_t& next = next_to_start[kind];
    while (next < kind_end(kind) && buckets[next].pending == 0) {
      start_bucket(buckets[next], /*in_backward=*/true);
      ++next;
    }
  }
}

void DistributedDataParallel::Impl::start_bucket(Bucket& bucket, bool in_backward) {
  ProcessGroup& reducer = *bucket.group;
  // Megatron's gradient_scaling_factor: the loss is a mean over this data-parallel replica's samples, so the
  // replicas' sum is divided by |dp x cp|, for experts too: an expert's gradient on one rank already sums the
  // contributions of every expert-parallel rank's tokens, so its sum over the expert data-parallel group is divided by
  // the dense |dp x cp|, not by |edp|. Averaging in the collective divides by the group's size afterwards
  // (finish_grad_sync), so an expert bucket is first scaled by |edp| / |dp x cp|.
  const int64_t data_parallel_size = group->size();
  {
    torch::NoGradGuard no_grad;
    if (!config.average_in_collective) {
      if (data_parallel_size > 1) bucket.data.mul_(1.0 / static_cast<double>(data_parallel_size));
    } else if (reducer.size() != data_parallel_size) {
      bucket.data.mul_(static_cast<double>(reducer.size()) / static_cast<double>(data_parallel_size));
    }
  }
  if (reducer.size() > 1) {
    torch::NoGradGuard no_grad;
    if (bucket.reduce_scatter) {
      // In place, as Megatron's: each window's output is this rank's elements of the bucket, in windows so that
      // c10d's copy of the inputs stays a few windows' size (ScatterWindow).
      const int64_t ranks = reducer.size();
      const int64_t chunk = bucket.data.numel() / ranks;
      for (int64_t at = 0; at < chunk; at += kScatterWindow) {
        const int64_t width = std::min(kScatterWindow, chunk - at);
        ScatterWindow window;
        for (int64_t rank = 0; rank < ranks; ++rank)
          window.inputs.push_back(bucket.data.narrow(0, rank * chunk + at, width));
        window.output = window.inputs[static_cast<std::size_t>(reducer.rank())];
        window.group = &reducer;
        scatters_queued.push_back(std::move(window));
      }
      pump_scatter_windows(/*drain=*/false);
    } else {
      bucket.work = reducer.all_reduce_async(bucket.data, ReduceOp::kSum);
    }
  }
  bucket.started = true;
  ++started;
  if (in_backward) ++started_in_backward;
}

void DistributedDataParallel::Impl::wait_started() {
  pump_scatter_windows(/*drain=*/true);
  for (Bucket& bucket : buckets) {
    if (bucket.started) bucket.work.wait();
  }
}

void DistributedDataParallel::Impl::pump_scatter_windows(bool drain) {
  for (;;) {
    while (!scatters_started.empty() && (drain || scatters_started.front().work.is_completed())) {
      ScatterWindow window = std::move(scatters_started.front());
      scatters_started.pop_front();
      window.work.wait();  // returns at once unless draining; surfaces the collective's error
    }
    while (scatters_started.size() < kScatterWindowsInFlight && !scatters_queued.empty()) {
      ScatterWindow& window = scatters_queued.front();
      window.work = window.group->reduce_scatter_async(window.output, window.inputs, ReduceOp::kSum);
      scatters_started.push_back(std::move(window));
      scatters_queued.pop_front();
    }
    if (!drain || scatters_started.empty()) return;
  }
}

void DistributedDataParallel::Impl::reset_sync_state() {
  scatters_queued.clear();  // left only by a failed sync: the next one starts afresh
  for (ParamSlot& slot : slots) slot.reported = false;
  for (Bucket& bucket : buckets) {
    bucket.pending = bucket.hooked_params;
    bucket.started = false;
  }
  next_to_start[0] = kind_begin(0);
  next_to_start[1] = kind_begin(1);
  started = 0;
  started_in_backward = 0;
}

void DistributedDataParallel::Impl::start_gather_windows() {
  while (gathers_started.size() < kGatherWindowsInFlight && !gathers_queued.empty()) {
    GatherWindow& window = gathers_queued.front();
    ProcessGroup& gatherer = *buckets[window.bucket].group;
    const torch::Tensor own = window.outputs[static_cast<std::size_t>(gatherer.rank())];
    window.work = gatherer.all_gather_async(window.outputs, own);
    gathers_started.push_back(std::move(window));
    gathers_queued.pop_front();
  }
}

void DistributedDataParallel::Impl::complete_oldest_gather_window() {
  GatherWindow window = std::move(gathers_started.front());
  gathers_started.pop_front();
  if (--buckets[window.bucket].gather_windows_left == 0) --gathers_in_flight();
  window.work.wait();
}

void DistributedDataParallel::Impl::finish_bucket_gather(std::size_t index) {
  std::lock_guard<std::mutex> lock(gather_mutex);
  // Windows done meanwhile make room for the next ones, so the gathers keep moving while the forward computes.
  while (!gathers_started.empty() && gathers_started.front().work.is_completed()) complete_oldest_gather_window();
  while (buckets[index].gather_windows_left > 0) {
    start_gather_windows();
    complete_oldest_gather_window();
  }
  start_gather_windows();
}

void DistributedDataParallel::Impl::finish_gathers() {
  std::lock_guard<std::mutex> lock(gather_mutex);
  while (!gathers_started.empty() || !gathers_queued.empty()) {
    start_gather_windows();
    complete_oldest_gather_window();
  }
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 DistributedDataParallelConfig config,
                                                 ProcessGroup* data_parallel_group,
                                                 const std::vector<torch::Tensor>& own_bucket,
                                                 ProcessGroup* expert_data_parallel_group)
    : impl_(std::make_unique<Impl>(std::move(module), config, data_parallel_group, own_bucket,
                                   expert_data_parallel_group)) {}

DistributedDataParallel::~DistributedDataParallel() = default;
DistributedDataParallel::DistributedDataParallel(DistributedDataParallel&&) noexcept = default;
DistributedDataParallel& DistributedDataParallel::operator=(DistributedDataParallel&&) noexcept = default;

torch::nn::Module& DistributedDataParallel::module() { return *impl_->module; }
const std::shared_ptr<torch::nn::Module>& DistributedDataParallel::module_ptr() const { return impl_->module; }
const DistributedDataParallelConfig& DistributedDataParallel::config() const { return impl_->config; }
ProcessGroup& DistributedDataParallel::data_parallel_group() const { return *impl_->group; }
ProcessGroup* DistributedDataParallel::expert_data_parallel_group() const { return impl_->expert_group; }

void DistributedDataParallel::zero_grad_buffer() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->wait_started();  // a reduction still writing into the buffer would overwrite the zeros
  impl_->reset_sync_state();
  torch::NoGradGuard no_grad;
  for (torch::Tensor& buffer : impl_->buffers) buffer.zero_();
  for (ParamSlot& slot : impl_->slots) {
    if (slot.separate) {
      slot.param.mutable_grad() = torch::Tensor();  // the zeroed main_grad holds the value
    } else if (!slot.param.grad().is_same(slot.grad)) {
      slot.param.mutable_grad() = slot.grad;  // zero, whatever it held
    }
  }
}

void DistributedDataParallel::set_grad_sync(bool enabled) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->grad_sync = enabled;
}

bool DistributedDataParallel::grad_sync_enabled() const { return impl_->grad_sync; }

void DistributedDataParallel::finish_grad_sync() {
  Impl& impl = *impl_;
  impl.finish_gathers();  // a bucket whose parameters no forward read: the optimizer is about to update them
  std::lock_guard<std::mutex> lock(impl.mutex);
  // Params the backward did not reach still need their grad in the buffer before it is reduced.
  for (ParamSlot& slot : impl.slots) impl.absorb_grad(slot);
  try {
    for (int kind = 0; kind < 2; ++kind) {
      for (std::size_t& next = impl.next_to_start[kind]; next < impl.kind_end(kind); ++next) {
        impl.start_bucket(impl.buckets[next], /*in_backward=*/false);
      }
    }
    impl.wait_started();
  } catch (...) {
    impl.reset_sync_state();
    throw;
  }
  if (impl.config.average_in_collective) {
    // Gloo has no AVG: the sum is divided by the size of the group that summed it.
    torch::NoGradGuard no_grad;
    for (Bucket& bucket : impl.buckets) {
      if (bucket.group->size() > 1) bucket.data.div_(bucket.group->size());
    }
  }
  impl.last_started_in_backward = impl.started_in_backward;
  impl.reset_sync_state();
}

void DistributedDataParallel::broadcast_params() {
  torch::NoGradGuard no_grad;
  for (const ParamSlot& slot : impl_->slots) {
    // An expert's replicas are the ranks of its expert data-parallel group; the other ranks hold other experts.
    ProcessGroup& replicas = *impl_->buckets[static_cast<std::size_t>(slot.bucket)].group;
    if (replicas.size() == 1) continue;
    torch::Tensor data = slot.param.detach();  // shares storage; the collective writes it in place
    if (data.is_contiguous()) {
      replicas.broadcast(data, 0);
    } else {
      torch::Tensor contiguous = data.contiguous();
      replicas.broadcast(contiguous, 0);
      data.copy_(contiguous);
    }
  }
}

void DistributedDataParallel::start_param_sync() {
  Impl& impl = *impl_;
  if (std::none_of(impl.buckets.begin(), impl.buckets.end(), [](const Bucket& b) { return b.reduce_scatter; })) return;
  impl.finish_gathers();
  {
    std::lock_guard<std::mutex> lock(impl.gather_mutex);
    // Forward order (the buckets are laid out in backward order), so the first layers' parameters arrive first; the
    // same order on every rank, so each group's gathers are issued alike on its members.
    for (std::size_t index = impl.buckets.size(); index-- > 0;) {
      Bucket& bucket = impl.buckets[index];
      if (!bucket.reduce_scatter) continue;
      const int64_t ranks = bucket.group->size();
      const int64_t shard = bucket.param_data.numel() / ranks;
      for (int64_t at = 0; at < shard; at += kGatherWindow) {
        const int64_t width = std::min(kGatherWindow, shard - at);
        GatherWindow window;
        window.bucket = index;
        for (int64_t rank = 0; rank < ranks; ++rank) {
          window.outputs.push_back(bucket.param_data.narrow(0, rank * shard + at, width));
        }
        impl.gathers_queued.push_back(std::move(window));
        ++bucket.gather_windows_left;
      }
      if (bucket.gather_windows_left > 0) ++gathers_in_flight();
    }
    impl.start_gather_windows();
  }
  if (!impl.config.overlap_param_gather) impl.finish_gathers();
}

void DistributedDataParallel::finish_param_sync() { impl_->finish_gathers(); }

void wait_for_param_gather(const torch::Tensor& param) {
  if (gathers_in_flight().load() == 0 || !param.defined()) return;
  GatherOwner owner;
  {
    std::lock_guard<std::mutex> lock(gather_registry_mutex());
    const auto found = gather_owners().find(param.unsafeGetTensorImpl());
    if (found == gather_owners().end()) return;
    owner = found->second;
  }
  owner.impl->finish_bucket_gather(owner.bucket);
}

void wait_for_param_gather(const torch::nn::Module& module) {
  if (gathers_in_flight().load() == 0) return;
  for (const torch::Tensor& param : module.parameters()) wait_for_param_gather(param);
}

void finish_param_gathers() {
  if (gathers_in_flight().load() == 0) return;
  std::vector<DistributedDataParallel::Impl*> owners;
  {
    std::lock_guard<std::mutex> lock(gather_registry_mutex());
    for (const auto& entry : gather_owners()) {
      if (std::find(owners.begin(), owners.end(), entry.second.impl) == owners.end())
        owners.push_back(entry.second.impl);
    }
  }
  for (DistributedDataParallel::Impl* impl : owners) impl->finish_gathers();
}

int64_t param_gathers_in_flight() { return gathers_in_flight().load(); }

const std::vector<torch::Tensor>& DistributedDataParallel::params() const { return impl_->params; }
std::vector<torch::Tensor> DistributedDataParallel::grad_buffers() const { return impl_->buffers; }
int64_t DistributedDataParallel::num_buckets() const { return static_cast<int64_t>(impl_->buckets.size()); }

int64_t DistributedDataParallel::bucket_of(const torch::Tensor& param) const {
  if (!param.defined()) return -1;
  const auto found = impl_->index_of.find(param.unsafeGetTensorImpl());
  return found == impl_->index_of.end() ? -1 : impl_->slots[found->second].bucket;
}

namespace {

void check_bucket_index(int64_t index, int64_t count, const char* caller) {
  if (index < 0 || index >= count) {
    throw std::out_of_range(std::string("DistributedDataParallel::") + caller + ": bucket " + std::to_string(index) +
                            " does not exist; there are " + std::to_string(count));
  }
}

}  // namespace

int64_t DistributedDataParallel::bucket_numel(int64_t index) const {
  check_bucket_index(index, num_buckets(), "bucket_numel");
  return impl_->buckets[static_cast<std::size_t>(index)].data.numel();
}

bool DistributedDataParallel::is_expert_bucket(int64_t index) const {
  check_bucket_index(index, num_buckets(), "is_expert_bucket");
  return impl_->buckets[static_cast<std::size_t>(index)].expert;
}

ProcessGroup& DistributedDataParallel::bucket_group(int64_t index) const {
  check_bucket_index(index, num_buckets(), "bucket_group");
  return *impl_->buckets[static_cast<std::size_t>(index)].group;
}

torch::Tensor DistributedDataParallel::main_grad(const torch::Tensor& param) const {
  const auto found = param.defined() ? impl_->index_of.find(param.unsafeGetTensorImpl()) : impl_->index_of.end();
  if (found == impl_->index_of.end()) {
    throw std::invalid_argument("DistributedDataParallel::main_grad: the parameter (shape " +
                                (param.defined() ? c10::str(param.sizes()) : std::string("undefined")) +
                                ") is not wrapped by this DistributedDataParallel; ask the one of its model chunk");
  }
  return impl_->slots[found->second].grad;
}

torch::Tensor wrapped_main_grad(const torch::Tensor& param) {
  if (!param.defined()) return {};
  std::lock_guard<std::mutex> lock(main_grad_mutex());
  const auto found = main_grads().find(param.unsafeGetTensorImpl());
  return found != main_grads().end() ? found->second : torch::Tensor();
}

torch::Tensor main_grad(const torch::Tensor& param) {
  torch::Tensor wrapped = wrapped_main_grad(param);
  return wrapped.defined() || !param.defined() ? wrapped : param.grad();
}

int64_t DistributedDataParallel::buckets_started() const { return impl_->started; }
int64_t DistributedDataParallel::buckets_started_in_backward() const { return impl_->last_started_in_backward; }

}  // namespace bridge::parallel::distributed
