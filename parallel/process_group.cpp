// ProcessGroup: argument checks, the local path for groups of one, and errors that name group, operation and ranks.
#include "parallel/process_group.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "utils/exception_message.h"
#include "utils/strings.h"

namespace bridge::parallel {

std::string_view to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "unknown";
}

std::string_view to_string(Backend backend) { return backend == Backend::kGloo ? "gloo" : "nccl"; }

CommunicationError::CommunicationError(std::string group, std::string operation, const std::string& message)
    : std::runtime_error(message), group_(std::move(group)), operation_(std::move(operation)) {}

ProcessGroup::ProcessGroup(std::string name, std::vector<int> global_ranks, int rank, Backend backend,
                           std::chrono::milliseconds timeout, std::unique_ptr<detail::GroupBackend> backend_impl)
    : name_(std::move(name)),
      global_ranks_(std::move(global_ranks)),
      rank_(rank),
      backend_(backend),
      timeout_(timeout),
      impl_(std::move(backend_impl)) {
  if (rank_ < 0 || rank_ >= size()) {
    throw std::invalid_argument("ProcessGroup '" + name_ + "': rank " + std::to_string(rank_) + " is not in [0, " +
                                std::to_string(size()) + ")");
  }
  if (size() > 1 && !impl_)
    throw std::invalid_argument("ProcessGroup '" + name_ + "': a multi-rank group needs a backend");
}

ProcessGroup::~ProcessGroup() = default;

template <class Op>
void ProcessGroup::run(std::string_view operation, Op&& op) {
  ++operation_count_;
  checked(operation, std::forward<Op>(op));
}

template <class Op>
void ProcessGroup::checked(std::string_view operation, Op&& op) {
  const auto start = std::chrono::steady_clock::now();
  try {
    op();
  } catch (const std::exception& error) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    throw CommunicationError(name_, std::string(operation),
                             std::string(operation) + " on group '" + name_ + "' (global ranks [" +
                                 utils::join(global_ranks_, ", ") + "], this is group rank " + std::to_string(rank_) +
                                 ") failed after " + std::to_string(seconds) + " s (timeout " +
                                 std::to_string(timeout_.count()) + " ms): " + bridge::utils::describe(error) +
                                 ". A peer may have died or fallen out of step; check the other ranks' logs.");
  }
}

void ProcessGroup::check_peer(std::string_view operation, int peer) const {
  if (peer < 0 || peer >= size() || peer == rank_) {
    throw std::invalid_argument(std::string(operation) + " on group '" + name_ + "': peer " + std::to_string(peer) +
                                " must be another group rank in [0, " + std::to_string(size()) + ")");
  }
}

void ProcessGroup::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  if (impl_) run("all_reduce", [&] { impl_->all_reduce(tensor, op); });
}

std::vector<torch::Tensor> ProcessGroup::all_gather(const torch::Tensor& tensor) {
  std::vector<torch::Tensor> outputs;
  for (int i = 0; i < size(); ++i) outputs.push_back(torch::empty_like(tensor));
  if (!impl_) {
    outputs[0].copy_(tensor);
    return outputs;
  }
  run("all_gather", [&] { impl_->all_gather(outputs, tensor); });
  return outputs;
}

namespace {

void check_scatter_input(const torch::Tensor& input, int size, const std::string& what) {
  if (input.dim() == 0 || input.size(0) % size != 0) {
    throw std::invalid_argument(what + ": dim 0 of the input (" +
                                (input.dim() == 0 ? std::string("a scalar") : std::to_string(input.size(0))) +
                                ") must split into " + std::to_string(size) + " equal chunks");
  }
}

}  // namespace

torch::Tensor ProcessGroup::reduce_scatter(const torch::Tensor& input, ReduceOp op) {
  check_scatter_input(input, size(), "reduce_scatter on group '" + name_ + "'");
  std::vector<torch::Tensor> chunks;
  for (const torch::Tensor& chunk : input.chunk(size())) chunks.push_back(chunk.contiguous());
  torch::Tensor output = torch::empty_like(chunks[static_cast<std::size_t>(rank_)]);
  if (!impl_) return output.copy_(chunks[0]);
  run("reduce_scatter", [&] { impl_->reduce_scatter(output, chunks, op); });
  return output;
}

void ProcessGroup::broadcast(torch::Tensor& tensor, int root) {
  if (root < 0 || root >= size()) {
    throw std::invalid_argument("broadcast on group '" + name_ + "': root " + std::to_string(root) +
                                " is not a group rank in [0, " + std::to_string(size()) + ")");
  }
  if (impl_) run("broadcast", [&] { impl_->broadcast(tensor, root); });
}

void ProcessGroup::send(const torch::Tensor& tensor, int peer, int tag) {
  check_peer("send", peer);
  torch::Tensor contiguous = tensor.contiguous();
  run("send", [&] { impl_->send(contiguous, peer, tag); });
}

void ProcessGroup::recv(torch::Tensor& tensor, int peer, int tag) {
  check_peer("recv", peer);
  if (!tensor.is_contiguous()) {
    throw std::invalid_argument("recv on group '" + name_ + "': the receive buffer must be contiguous");
  }
  run("recv", [&] { impl_->recv(tensor, peer, tag); });
}

void ProcessGroup::barrier() {
  if (impl_) run("barrier", [&] { impl_->barrier(); });
}

namespace {

// Checks `splits` (one per member of a group of `size`; `name` in errors) and returns their sum. `rows`, when given,
// is the number of rows they must cover.
int64_t checked_split_sum(const std::vector<int64_t>& splits, int size, std::optional<int64_t> rows,
                          const std::string& what, const std::string& name) {
  if (static_cast<int>(splits.size()) != size) {
    throw std::invalid_argument(what + ": " + name + " has " + std::to_string(splits.size()) +
                                " entries; give one per member (" + std::to_string(size) +
                                "), or none for equal splits");
  }
  int64_t sum = 0;
  for (std::size_t i = 0; i < splits.size(); ++i) {
    if (splits[i] < 0) {
      throw std::invalid_argument(what + ": " + name + "[" + std::to_string(i) + "] is " + std::to_string(splits[i]) +
                                  "; split sizes count rows of dim 0 and must not be negative");
    }
    sum += splits[i];
  }
  if (rows && sum != *rows) {
    throw std::invalid_argument(what + ": " + name + " [" + utils::join(splits, ", ") + "] sum to " +
                                std::to_string(sum) + " rows but dim 0 of the input has " + std::to_string(*rows) +
                                "; the input splits must cover the input's rows exactly");
  }
  return sum;
}

}  // namespace

torch::Tensor ProcessGroup::all_to_all(const torch::Tensor& input, const std::vector<int64_t>& output_split_sizes,
                                       const std::vector<int64_t>& input_split_sizes) {
  const std::string what = "all_to_all on group '" + name_ + "'";
  if (input.dim() == 0) throw std::invalid_argument(what + ": the input is a scalar; splits count rows of dim 0");
  const int64_t rows = input.size(0);
  if (!input_split_sizes.empty()) checked_split_sum(input_split_sizes, size(), rows, what, "input_split_sizes");
  const int64_t output_rows = output_split_sizes.empty() ? rows
                                                         : checked_split_sum(output_split_sizes, size(), std::nullopt,
                                                                             what, "output_split_sizes");
  if ((input_split_sizes.empty() || output_split_sizes.empty()) && rows % size() != 0) {
    throw std::invalid_argument(what + ": dim 0 of the input (" + std::to_string(rows) + ") must split into " +
                                std::to_string(size()) +
                                " equal chunks when a split vector is empty; give both split vectors for uneven "
                                "splits");
  }
  if (!impl_ && output_rows != rows) {
    throw std::invalid_argument(what + ": a group of one receives its own " + std::to_string(rows) +
                                " rows, but output_split_sizes asks for " + std::to_string(output_rows));
  }
  std::vector<int64_t> sizes = input.sizes().vec();
  sizes[0] = output_rows;
  torch::Tensor output = torch::empty(sizes, input.options());
  if (!impl_) return output.copy_(input);
  const torch::Tensor contiguous = input.contiguous();
  run("all_to_all", [&] { impl_->all_to_all(output, contiguous, output_split_sizes, input_split_sizes); });
  return output;
}

Work ProcessGroup::reduce_scatter_async(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) {
  const std::string what = "reduce_scatter_async on group '" + name_ + "'";
  check_scatter_input(input, size(), what);
  if (!input.is_contiguous() || !output.is_contiguous() || output.sizes() != input.chunk(size())[0].sizes()) {
    throw std::invalid_argument(what + ": the input and output must be contiguous and the output one chunk's shape");
  }
  if (!impl_) {
    output.copy_(input);
    return Work();
  }
  std::vector<torch::Tensor> chunks = input.chunk(size());  // views of the contiguous input, each contiguous
  std::unique_ptr<detail::PendingWork> pending;
  run("reduce_scatter_async", [&] { pending = impl_->reduce_scatter_async(output, chunks, op); });
  return Work(this, "reduce_scatter_async", std::move(pending));
}

Work ProcessGroup::reduce_scatter_async(torch::Tensor& output, std::vector<torch::Tensor> inputs, ReduceOp op) {
  const std::string what = "reduce_scatter_async on group '" + name_ + "'";
  if (static_cast<int>(inputs.size()) != size() || !output.is_contiguous()) {
    throw std::invalid_argument(what + ": give one input per member (" + std::to_string(size()) + ", got " +
                                std::to_string(inputs.size()) + ") and a contiguous output");
  }
  for (const torch::Tensor& input : inputs) {
    if (!input.is_contiguous() || input.sizes() != output.sizes() || input.dtype() != output.dtype()) {
      throw std::invalid_argument(what + ": every input must be contiguous with the output's shape " +
                                  c10::str(output.sizes()) + " and dtype");
    }
  }
  if (!impl_) {
    if (!output.is_same(inputs[0])) output.copy_(inputs[0]);
    return Work();
  }
  std::unique_ptr<detail::PendingWork> pending;
  run("reduce_scatter_async", [&] { pending = impl_->reduce_scatter_async(output, inputs, op); });
  return Work(this, "reduce_scatter_async", std::move(pending));
}

Work ProcessGroup::all_gather_async(std::vector<torch::Tensor> outputs, const torch::Tensor& input) {
  const std::string what = "all_gather_async on group '" + name_ + "'";
  if (static_cast<int>(outputs.size()) != size() || !input.is_contiguous()) {
    throw std::invalid_argument(what + ": give one output per member (" + std::to_string(size()) + ", got " +
                                std::to_string(outputs.size()) + ") and a contiguous input");
  }
  for (const torch::Tensor& output : outputs) {
    if (output.sizes() != input.sizes() || output.dtype() != input.dtype()) {
      throw std::invalid_argument(what + ": every output must have the input's shape " + c10::str(input.sizes()) +
                                  " and dtype");
    }
  }
  if (!impl_) {
    if (!outputs[0].is_same(input)) outputs[0].copy_(input);
    return Work();
  }
  torch::Tensor source = input;
  std::unique_ptr<detail::PendingWork> pending;
  run("all_gather_async", [&] { pending = impl_->all_gather_async(outputs, source); });
  return Work(this, "all_gather_async", std::move(pending));
}

Work ProcessGroup::all_reduce_async(torch::Tensor& tensor, ReduceOp op) {
  if (!impl_) return Work();
  if (!tensor.is_contiguous()) {
    throw std::invalid_argument("all_reduce_async on group '" + name_ + "': the tensor must be contiguous");
  }
  std::unique_ptr<detail::PendingWork> pending;
  run("all_reduce_async", [&] { pending = impl_->all_reduce_async(tensor, op); });
  return Work(this, "all_reduce_async", std::move(pending));
}

Work ProcessGroup::isend(const torch::Tensor& tensor, int peer, int tag) {
  check_peer("isend", peer);
  torch::Tensor contiguous = tensor.contiguous();
  std::unique_ptr<detail::PendingWork> pending;
  run("isend", [&] { pending = impl_->isend(contiguous, peer, tag); });
  return Work(this, "isend", std::move(pending));
}

Work ProcessGroup::irecv(torch::Tensor& tensor, int peer, int tag) {
  check_peer("irecv", peer);
  if (!tensor.is_contiguous()) {
    throw std::invalid_argument("irecv on group '" + name_ + "': the receive buffer must be contiguous");
  }
  std::unique_ptr<detail::PendingWork> pending;
  run("irecv", [&] { pending = impl_->irecv(tensor, peer, tag); });
  return Work(this, "irecv", std::move(pending));
}

std::vector<Work> ProcessGroup::batch_isend_irecv(std::vector<P2POp> ops) {
  std::vector<Work> works;
  if (ops.empty()) return works;
  for (P2POp& op : ops) {
    const bool send = op.kind == P2POp::Kind::kSend;
    check_peer(send ? "batch_isend_irecv (send)" : "batch_isend_irecv (recv)", op.peer);
    if (send) {
      op.tensor = op.tensor.contiguous();
    } else if (!op.tensor.is_contiguous()) {
      throw std::invalid_argument("batch_isend_irecv on group '" + name_ + "': a receive buffer must be contiguous");
    }
  }
  // Counted per op, as the same sends and receives started one by one would be.
  operation_count_ += ops.size() - 1;
  std::vector<std::unique_ptr<detail::PendingWork>> pending;
  run("batch_isend_irecv", [&] { pending = impl_->batch_isend_irecv(ops); });
  for (auto& work : pending) works.push_back(Work(this, "batch_isend_irecv", std::move(work)));
  return works;
}

Work::Work(ProcessGroup* group, std::string_view operation, std::unique_ptr<detail::PendingWork> impl)
    : group_(group), operation_(operation), impl_(std::move(impl)) {}

Work::~Work() = default;

void Work::wait() {
  if (!impl_) return;
  group_->checked(operation_, [&] { impl_->wait(); });
  impl_.reset();
}

bool Work::is_completed() { return !impl_ || impl_->is_completed(); }

void wait_all(std::vector<Work>& works) {
  for (Work& work : works) work.wait();
}

std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& text) {
  torch::Tensor length = torch::tensor({static_cast<int64_t>(text.size())}, torch::kLong);
  group.all_reduce(length, ReduceOp::kMax);
  torch::Tensor bytes = torch::zeros({std::max<int64_t>(1, length.item<int64_t>())}, torch::kUInt8);
  std::memcpy(bytes.data_ptr<uint8_t>(), text.data(), text.size());
  std::vector<std::string> texts;
  for (const torch::Tensor& member : group.all_gather(bytes)) {
    const char* data = reinterpret_cast<const char*>(member.data_ptr<uint8_t>());
    texts.emplace_back(data, strnlen(data, static_cast<std::size_t>(member.numel())));
  }
  return texts;
}

}  // namespace bridge::parallel
