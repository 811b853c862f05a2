// ProcessGroup: bridge's small interface over LibTorch's c10d collectives, Gloo for CPU tensors and NCCL for CUDA
// tensors (when LibTorch has CUDA). Every call blocks until the operation is done on this rank. A failure, a dead
// peer or a timeout throws CommunicationError naming the group, the operation and its ranks, so no rank waits
// forever. All c10d calls live in c10d_backend.cpp, the one file that tracks LibTorch version differences.
//
//   ProcessGroup& tp = parallel_state::get_tensor_model_parallel_group();
//   tp.all_reduce(partial_sum);                  // in place, sum by default
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace bridge::parallel {

enum class ReduceOp : std::uint8_t { kSum, kMax, kMin };
enum class Backend : std::uint8_t { kGloo, kNccl };

std::string_view to_string(ReduceOp op);
std::string_view to_string(Backend backend);

/// One send or receive of a batch (Megatron's torch.distributed.P2POp), for ProcessGroup::batch_isend_irecv.
struct P2POp {
  enum class Kind : std::uint8_t { kSend, kRecv };
  Kind kind;
  torch::Tensor tensor;  ///< sent, or received into (contiguous, preallocated)
  int peer;              ///< group rank
  int tag = 0;
};

/// A collective or point-to-point operation failed (a peer died, a timeout passed, a transport error).
class CommunicationError : public std::runtime_error {
 public:
  CommunicationError(std::string group, std::string operation, const std::string& message);
  const std::string& group() const noexcept { return group_; }
  const std::string& operation() const noexcept { return operation_; }

 private:
  std::string group_;
  std::string operation_;
};

namespace detail {
/// An operation a backend has started; wait() blocks until it is done and throws on failure or timeout.
class PendingWork {
 public:
  virtual ~PendingWork() = default;
  virtual void wait() = 0;
  virtual bool is_completed() = 0;
};

/// What a backend implements; the only implementation wraps c10d (c10d_backend.cpp).
class GroupBackend {
 public:
  virtual ~GroupBackend() = default;
  virtual std::unique_ptr<PendingWork> all_reduce_async(torch::Tensor& tensor, ReduceOp op) = 0;
  virtual std::unique_ptr<PendingWork> reduce_scatter_async(torch::Tensor& output, std::vector<torch::Tensor>& inputs,
                                                            ReduceOp op) = 0;
  virtual std::unique_ptr<PendingWork> all_gather_async(std::vector<torch::Tensor>& outputs, torch::Tensor& input) = 0;
  virtual std::unique_ptr<PendingWork> isend(torch::Tensor& tensor, int dst, int tag) = 0;
  virtual std::unique_ptr<PendingWork> irecv(torch::Tensor& tensor, int src, int tag) = 0;
  virtual void all_reduce(torch::Tensor& tensor, ReduceOp op) = 0;
  virtual void all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input) = 0;
  virtual void reduce_scatter(torch::Tensor& output, std::vector<torch::Tensor>& inputs, ReduceOp op) = 0;
  virtual void broadcast(torch::Tensor& tensor, int root) = 0;
  virtual void send(torch::Tensor& tensor, int dst, int tag) = 0;
  virtual void recv(torch::Tensor& tensor, int src, int tag) = 0;
  virtual void barrier() = 0;
  /// All-to-all over rows of dim 0 (c10d's alltoall_base): rows [sum(input_split_sizes[:j]), + input_split_sizes[j])
  /// of contiguous `input` go to member j, and member i's rows land in contiguous, preallocated `output` at row
  /// sum(output_split_sizes[:i]). An empty split vector means size() equal splits. Blocks until done.
  virtual void all_to_all(torch::Tensor& output, const torch::Tensor& input,
                          const std::vector<int64_t>& output_split_sizes,
                          const std::vector<int64_t>& input_split_sizes) = 0;
  /// Starts every op of `ops` as one batch: NCCL groups them (ncclGroupStart/End through c10d's coalescing) and
  /// returns one work for all; Gloo starts them one by one and returns one work each. Never null entries.
  virtual std::vector<std::unique_ptr<PendingWork>> batch_isend_irecv(std::vector<P2POp>& ops) = 0;
};
}  // namespace detail

class ProcessGroup;

/// An operation started by ProcessGroup::all_reduce_async, reduce_scatter_async, all_gather_async, isend or irecv. Its
/// tensor must not be read or written until wait() returns; wait() throws CommunicationError like the blocking calls.
/// Dropping a Work without waiting is safe (the backend keeps the tensor alive) but leaves the result unspecified. The
/// group must outlive the Work.
class Work {
 public:
  Work() = default;  ///< Already complete (what groups of one return).
  Work(Work&&) noexcept = default;
  Work& operator=(Work&&) noexcept = default;
  ~Work();

  /// Blocks until the operation is done; a no-op once it has returned.
  void wait();
  /// Whether wait() would return at once (it may still throw).
  bool is_completed();

 private:
  friend class ProcessGroup;
  Work(ProcessGroup* group, std::string_view operation, std::unique_ptr<detail::PendingWork> impl);

  ProcessGroup* group_ = nullptr;
  std::string_view operation_;
  std::unique_ptr<detail::PendingWork> impl_;
};

/// Waits for every operation in `works`, in order (Megatron's batch_isend_irecv followed by wait).
void wait_all(std::vector<Work>& works);

class ProcessGroup {
 public:
  /// A group of `global_ranks` in which this process is `rank`. A group of one needs no backend: every operation is
  /// then local. Groups are made by init_distributed/new_group, not by hand.
  ProcessGroup(std::string name, std::vector<int> global_ranks, int rank, Backend backend,
               std::chrono::milliseconds timeout, std::unique_ptr<detail::GroupBackend> backend_impl);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  const std::string& name() const noexcept { return name_; }
  /// This process's rank within the group.
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return static_cast<int>(global_ranks_.size()); }
  /// The members' global ranks, in group-rank order.
  const std::vector<int>& global_ranks() const noexcept { return global_ranks_; }
  Backend backend() const noexcept { return backend_; }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }

  /// Reduces `tensor` over the group, in place.
  void all_reduce(torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  /// Every member's `tensor`, in group-rank order.
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor);
  /// Reduces `input` (dim 0 = size() equal chunks) over the group and returns this rank's chunk.
  torch::Tensor reduce_scatter(const torch::Tensor& input, ReduceOp op = ReduceOp::kSum);
  /// Copies group rank `root`'s `tensor` into every member's `tensor`.
  void broadcast(torch::Tensor& tensor, int root = 0);
  /// Sends to / receives from group rank `peer`; `tensor` must be contiguous, and for recv, preallocated.
  void send(const torch::Tensor& tensor, int peer, int tag = 0);
  void recv(torch::Tensor& tensor, int peer, int tag = 0);
  void barrier();
  /// Megatron's all_to_all (torch.distributed.all_to_all_single), for MoE token dispatch: this rank's `input` rows
  /// [sum(input_split_sizes[:j]), + input_split_sizes[j]) go to group rank j, and the result holds, in group-rank
  /// order, output_split_sizes[i] rows from each rank i. Splits count rows of dim 0; an empty vector means size()
  /// equal splits (dim 0 must then divide by size()). Returns a new contiguous tensor: dim 0 is the sum of
  /// output_split_sizes (input.size(0) when empty), the other dims the input's. Each vector must have size() entries,
  /// none negative, and the input splits must sum to input.size(0) (else std::invalid_argument). That
  /// output_split_sizes[i] here equals input_split_sizes[rank()] on rank i is the caller's to ensure, as in torch: a
  /// mismatch fails with CommunicationError (at the latest once the timeout passes) or leaves the result unspecified.
  /// A group of one returns a copy.
  torch::Tensor all_to_all(const torch::Tensor& input, const std::vector<int64_t>& output_split_sizes = {},
                           const std::vector<int64_t>& input_split_sizes = {});

  /// Starts an in-place all-reduce of contiguous `tensor` and returns at once; wait() on the result.
  Work all_reduce_async(torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  /// Starts a reduce-scatter of contiguous `input` (dim 0 = size() equal chunks) into `output` (one chunk's shape) and
  /// returns at once; neither may be touched until wait() returns. `output` may be this rank's chunk of `input` (in
  /// place, as the distributed optimizer's gradient buckets use it).
  Work reduce_scatter_async(torch::Tensor& output, const torch::Tensor& input, ReduceOp op = ReduceOp::kSum);
  /// The same with the chunks given apart: `inputs` holds one contiguous tensor of the output's shape per member, in
  /// group-rank order, anywhere in memory (windows of a gradient bucket). `output` may be inputs[rank()]: the
  /// backends reduce from a copy of the inputs (so their staging is the inputs' size).
  Work reduce_scatter_async(torch::Tensor& output, std::vector<torch::Tensor> inputs, ReduceOp op = ReduceOp::kSum);
  /// Starts gathering every member's contiguous `input` into `outputs` (one tensor of the input's shape per member,
  /// in group-rank order) and returns at once; none may be touched until wait() returns. The backends gather into
  /// staging of their own and copy each member's part out when done, so `input` may be one of `outputs` (or share
  /// memory with it) and the outputs may be views anywhere, as the distributed optimizer's parameter windows are.
  Work all_gather_async(std::vector<torch::Tensor> outputs, const torch::Tensor& input);
  /// Start a send to / receive from group rank `peer` and return at once. Sends and receives between two ranks match
  /// in the order they are started (per tag), so a pipeline may start both directions before waiting on either.
  Work isend(const torch::Tensor& tensor, int peer, int tag = 0);
  Work irecv(torch::Tensor& tensor, int peer, int tag = 0);

  /// Starts the sends and receives of `ops` together and returns at once (Megatron's batch_isend_irecv); wait_all on
  /// the result. NCCL needs the send and receive of one exchange started as a group, or neighbours that both send first
  /// wait on each other. On NCCL, tags are ignored and a peer's sends match its receives in the order they appear in
  /// `ops`, so callers must order ops the same way on both sides (p2p_communication orders by tag). On NCCL the
  /// returned vector holds one Work for the whole batch; on Gloo one per op.
  std::vector<Work> batch_isend_irecv(std::vector<P2POp> ops);

  /// Operations started on this group so far (collectives and point-to-point; for tests and statistics).
  std::uint64_t operation_count() const noexcept { return operation_count_; }

 private:
  friend class Work;
  // run() counts the operation, then runs it through checked(), which turns failures into CommunicationError.
  template <class Op>
  void run(std::string_view operation, Op&& op);
  template <class Op>
  void checked(std::string_view operation, Op&& op);
  void check_peer(std::string_view operation, int peer) const;

  std::string name_;
  std::vector<int> global_ranks_;
  int rank_;
  Backend backend_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<detail::GroupBackend> impl_;  // null for a group of one
  std::uint64_t operation_count_ = 0;
};

/// Every member's `text`, in group-rank order (two collectives: the longest length, then the padded bytes). Texts
/// must not contain NUL characters.
std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& text);

}  // namespace bridge::parallel
