// The only file that includes c10d: TCPStore rendezvous, Gloo (and, with CUDA, NCCL) process groups. Differences
// between LibTorch versions are handled here.
#include "parallel/c10d_backend.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>
#include <stdexcept>
#include <type_traits>

namespace bridge::parallel::detail {

class Rendezvous {
 public:
  c10::intrusive_ptr<c10d::Store> store;
  std::string host;
};

namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return c10d::ReduceOp::SUM;
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
    case ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
  }
  throw std::invalid_argument("unknown ReduceOp");
}

bool is_loopback(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1"; }

// The network device Gloo listens on: GLOO_SOCKET_IFNAME if set (as in PyTorch), loopback when the whole job is on
// this host, else the address this host's name resolves to.
std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& master_host) {
  if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME")) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(interface);
  }
  if (is_loopback(master_host)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// Starts c10d work with `start` and waits for it within the timeout. c10d reports failures and timeouts as
// c10::Error, whose what() carries a C++ backtrace: keep only the message.
template <class Start>
void run_to_completion(Start&& start, std::chrono::milliseconds timeout) {
  try {
    if (!start()->wait(timeout)) throw std::runtime_error("timed out");
  } catch (const c10::Error& error) {
    throw std::runtime_error(error.what_without_backtrace());
  }
}

// A started c10d operation. wait() converts c10d's errors like run_to_completion.
class C10dWork final : public PendingWork {
 public:
  C10dWork(c10::intrusive_ptr<c10d::Work> work, std::chrono::milliseconds timeout)
      : work_(std::move(work)), timeout_(timeout) {}
  void wait() override {
    run_to_completion([&] { return work_; }, timeout_);
  }
  bool is_completed() override { return work_->isCompleted(); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::chrono::milliseconds timeout_;
};

// A receive into a device tensor through a host buffer (Gloo's point-to-point is host-only): the received bytes are
// copied to the device tensor when wait() returns.
class HostStagedRecv final : public PendingWork {
 public:
  HostStagedRecv(std::unique_ptr<PendingWork> receive, torch::Tensor host, torch::Tensor target)
      : receive_(std::move(receive)), host_(std::move(host)), target_(std::move(target)) {}
  void wait() override {
    receive_->wait();
    target_.copy_(host_);
  }
  bool is_completed() override { return receive_->is_completed(); }

 private:
  std::unique_ptr<PendingWork> receive_;
  torch::Tensor host_, target_;
};

// Holds the concrete c10d class: its base is c10d::ProcessGroup in LibTorch 1.x but c10d::Backend in 2.x, while the
// collective methods used here have the same signatures in both.
template <class C10dProcessGroup>
class C10dGroup final : public GroupBackend {
 public:
  C10dGroup(c10::intrusive_ptr<C10dProcessGroup> group, std::chrono::milliseconds timeout)
      : group_(std::move(group)), timeout_(timeout) {}

  void all_reduce(torch::Tensor& tensor, ReduceOp op) override {
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = to_c10d(op);
    options.timeout = timeout_;
    run_to_completion([&] { return group_->allreduce(tensors, options); }, timeout_);
  }

  void all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input) override {
    std::vector<std::vector<at::Tensor>> output_lists{outputs};
    std::vector<at::Tensor> inputs{input.contiguous()};
    c10d::AllgatherOptions options;
    options.timeout = timeout_;
    run_to_completion([&] { return group_->allgather(output_lists, inputs, options); }, timeout_);
  }

  void reduce_scatter(torch::Tensor& output, std::vector<torch::Tensor>& inputs, ReduceOp op) override {
    // LibTorch 1.13's Gloo has no reduce_scatter: reduce everything, keep this rank's chunk.
    torch::Tensor all = torch::cat(inputs);
    all_reduce(all, op);
    output.copy_(all.chunk(static_cast<int64_t>(inputs.size()))[static_cast<std::size_t>(group_->getRank())]);
  }

  void broadcast(torch::Tensor& tensor, int root) override {
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    options.timeout = timeout_;
    run_to_completion([&] { return group_->broadcast(tensors, options); }, timeout_);
  }

  void send(torch::Tensor& tensor, int dst, int tag) override { isend(tensor, dst, tag)->wait(); }

  void recv(torch::Tensor& tensor, int src, int tag) override { irecv(tensor, src, tag)->wait(); }

  std::unique_ptr<PendingWork> all_reduce_async(torch::Tensor& tensor, ReduceOp op) override {
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = to_c10d(op);
    options.timeout = timeout_;
    return start([&] { return group_->allreduce(tensors, options); });
  }

  std::unique_ptr<PendingWork> isend(torch::Tensor& tensor, int dst, int tag) override {
    // The host copy is complete when to() returns (a synchronising copy), and the c10d work keeps it alive.
    std::vector<at::Tensor> tensors{stages_on_host(tensor) ? tensor.to(torch::kCPU) : tensor};
    return start([&] { return group_->send(tensors, dst, tag); });
  }

  std::unique_ptr<PendingWork> irecv(torch::Tensor& tensor, int src, int tag) override {
    if (!stages_on_host(tensor)) {
      std::vector<at::Tensor> tensors{tensor};
      return start([&] { return group_->recv(tensors, src, tag); });
    }
    torch::Tensor host = torch::empty(tensor.sizes(), tensor.options().device(torch::kCPU));
    std::vector<at::Tensor> tensors{host};
    return std::make_unique<HostStagedRecv>(start([&] { return group_->recv(tensors, src, tag); }), host, tensor);
  }

  std::vector<std::unique_ptr<PendingWork>> batch_isend_irecv(std::vector<P2POp>& ops) override {
    std::vector<std::unique_ptr<PendingWork>> works;
    if constexpr (kIsGloo) {
      // Gloo has no coalescing and needs none: its sends and receives never wait on each other to start.
      for (P2POp& op : ops) {
        works.push_back(op.kind == P2POp::Kind::kSend ? isend(op.tensor, op.peer, op.tag)
                                                      : irecv(op.tensor, op.peer, op.tag));
      }
    } else {
      // NCCL (torch.distributed.batch_isend_irecv): the ops between startCoalescing and endCoalescing become one
      // ncclGroupStart/End launch, and the work endCoalescing returns covers all of them (the per-op works are null).
      try {
        group_->startCoalescing();
        try {
          for (P2POp& op : ops) {
            std::vector<at::Tensor> tensors{op.tensor};
            if (op.kind == P2POp::Kind::kSend) {
              group_->send(tensors, op.peer, op.tag);
            } else {
              group_->recv(tensors, op.peer, op.tag);
            }
          }
        } catch (...) {
          group_->endCoalescing();  // leave the group out of coalescing mode before reporting the failure
          throw;
        }
        works.push_back(std::make_unique<C10dWork>(group_->endCoalescing(), timeout_));
      } catch (const c10::Error& error) {
        throw std::runtime_error(error.what_without_backtrace());
      }
    }
    return works;
  }

  void barrier() override {
    c10d::BarrierOptions options;
    options.timeout = timeout_;
    run_to_completion([&] { return group_->barrier(options); }, timeout_);
  }

 private:
  template <class Start>
  std::unique_ptr<PendingWork> start(Start&& begin) {
    try {
      return std::make_unique<C10dWork>(begin(), timeout_);
    } catch (const c10::Error& error) {
      throw std::runtime_error(error.what_without_backtrace());
    }
  }

  static constexpr bool kIsGloo = std::is_same_v<C10dProcessGroup, c10d::ProcessGroupGloo>;

  // Gloo's send and recv hand the tensor's memory to its transport as it is, so it must be host memory (its
  // collectives copy CUDA tensors themselves). NCCL takes CUDA tensors directly.
  static bool stages_on_host(const torch::Tensor& tensor) { return kIsGloo && !tensor.device().is_cpu(); }

  c10::intrusive_ptr<C10dProcessGroup> group_;
  std::chrono::milliseconds timeout_;
};

// An NCCL group's backend: NCCL for CUDA tensors, and a Gloo group over the same ranks for CPU tensors (statistics,
// flags, strings), as torch.distributed's "cpu:gloo,cuda:nccl". Every member issues the same operations in the same
// order, so each of the two sees a consistent sequence.
class DeviceDispatchGroup final : public GroupBackend {
 public:
  DeviceDispatchGroup(std::unique_ptr<GroupBackend> gloo, std::unique_ptr<GroupBackend> nccl)
      : gloo_(std::move(gloo)), nccl_(std::move(nccl)) {}

  void all_reduce(torch::Tensor& tensor, ReduceOp op) override { for_tensor(tensor).all_reduce(tensor, op); }
  void all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input) override {
    for_tensor(input).all_gather(outputs, input);
  }
  void reduce_scatter(torch::Tensor& output, std::vector<torch::Tensor>& inputs, ReduceOp op) override {
    for_tensor(output).reduce_scatter(output, inputs, op);
  }
  void broadcast(torch::Tensor& tensor, int root) override { for_tensor(tensor).broadcast(tensor, root); }
  void send(torch::Tensor& tensor, int dst, int tag) override { for_tensor(tensor).send(tensor, dst, tag); }
  void recv(torch::Tensor& tensor, int src, int tag) override { for_tensor(tensor).recv(tensor, src, tag); }
  std::unique_ptr<PendingWork> all_reduce_async(torch::Tensor& tensor, ReduceOp op) override {
    return for_tensor(tensor).all_reduce_async(tensor, op);
  }
  std::unique_ptr<PendingWork> isend(torch::Tensor& tensor, int dst, int tag) override {
    return for_tensor(tensor).isend(tensor, dst, tag);
  }
  std::unique_ptr<PendingWork> irecv(torch::Tensor& tensor, int src, int tag) override {
    return for_tensor(tensor).irecv(tensor, src, tag);
  }
  // Gloo's barrier blocks the host until every member arrives; NCCL's only orders the device's streams.
  void barrier() override { gloo_->barrier(); }
  std::vector<std::unique_ptr<PendingWork>> batch_isend_irecv(std::vector<P2POp>& ops) override {
    if (ops.empty()) return {};
    GroupBackend& backend = for_tensor(ops.front().tensor);
    for (const P2POp& op : ops) {
      if (&for_tensor(op.tensor) != &backend) {
        throw std::invalid_argument("batch_isend_irecv: the ops mix CPU and CUDA tensors; batch each device apart");
      }
    }
    return backend.batch_isend_irecv(ops);
  }

 private:
  GroupBackend& for_tensor(const torch::Tensor& tensor) { return tensor.is_cuda() ? *nccl_ : *gloo_; }

  std::unique_ptr<GroupBackend> gloo_, nccl_;
};

std::unique_ptr<GroupBackend> create_gloo_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                const std::string& master_host, const std::string& prefix, int rank,
                                                int size, std::chrono::milliseconds timeout) {
  auto fail = [&](const std::string& what) {
    return std::runtime_error("creating process group '" + prefix + "' (rank " + std::to_string(rank) + " of " +
                              std::to_string(size) + ") failed: " + what);
  };
  try {
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(gloo_device(master_host));
    auto group = std::make_unique<C10dGroup<c10d::ProcessGroupGloo>>(
        c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options), timeout);
    // Gloo's connect returns on a rank before its peers have finished their side of the handshake; a rank that
    // then destroyed the group at once would break a slower peer's connect. The barrier returns only once every
    // member is connected.
    group->barrier();
    return group;
  } catch (const c10::Error& error) {
    throw fail(error.what_without_backtrace());
  } catch (const std::exception& error) {  // Gloo's own IoException, and our run_to_completion's errors
    throw fail(error.what());
  }
}

}  // namespace

std::shared_ptr<Rendezvous> connect_rendezvous(const LaunchEnv& env, std::chrono::milliseconds timeout) {
  if (!env.master_addr || !env.master_port) {
    throw std::invalid_argument("connect_rendezvous: MASTER_ADDR and MASTER_PORT are needed for a world of " +
                                std::to_string(env.world_size));
  }
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(*env.master_port);
  options.isServer = env.is_store_server();
  options.numWorkers = env.world_size;
  options.waitWorkers = false;  // the first group's rendezvous waits for everyone anyway
  options.timeout = timeout;
  auto rendezvous = std::make_shared<Rendezvous>();
  rendezvous->host = *env.master_addr;
  try {
    try {
      rendezvous->store = c10::make_intrusive<c10d::TCPStore>(*env.master_addr, options);
    } catch (const c10::Error& error) {
      throw std::runtime_error(error.what_without_backtrace());
    }
  } catch (const std::exception& error) {
    throw std::runtime_error("could not " + std::string(options.isServer ? "start" : "reach") +
                             " the rendezvous store at " + *env.master_addr + ":" + std::to_string(*env.master_port) +
                             " within " + std::to_string(timeout.count()) + " ms: " + error.what() +
                             (options.isServer ? ". Is the port in use? Pick another MASTER_PORT."
                                               : ". Is rank 0 running and MASTER_ADDR reachable from this host?") +
                             (timeout < std::chrono::seconds(5)
                                  ? " Or the timeout is too short for a rendezvous: give it seconds, not milliseconds."
                                  : ""));
  }
  if (env.use_agent_store) {
    rendezvous->store = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + std::to_string(env.restart_count),
                                                               rendezvous->store);
  }
  return rendezvous;
}

std::unique_ptr<GroupBackend> create_group_backend(const std::shared_ptr<Rendezvous>& rendezvous,
                                                   const std::string& prefix, int rank, int size, Backend backend,
                                                   std::chrono::milliseconds timeout, const torch::Device& device) {
  auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, rendezvous->store);
  if (backend == Backend::kNccl) {
#if defined(USE_C10D_NCCL)
    // Without blocking wait, NCCL's wait() only orders streams and a dead peer hangs the next synchronisation.
    setenv("NCCL_BLOCKING_WAIT", "1", /*overwrite=*/0);
    setenv("TORCH_NCCL_BLOCKING_WAIT", "1", /*overwrite=*/0);
    if (!device.is_cuda() || !device.has_index()) {
      throw std::invalid_argument("creating NCCL process group '" + prefix + "': NCCL needs a CUDA device, got " +
                                  device.str() + "; set parallelism.device to cuda (or use backend gloo)");
    }
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    try {
      auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
      // Without a bound device, NCCL's barrier guesses the device as rank % device count, which is wrong for a
      // group whose ranks are not the node's ranks in order.
      group->setBoundDeviceId(device);
      auto nccl = std::make_unique<C10dGroup<c10d::ProcessGroupNCCL>>(std::move(group), timeout);
      auto gloo = create_gloo_group(c10::make_intrusive<c10d::PrefixStore>("gloo", store), rendezvous->host,
                                    prefix + " (gloo, for CPU tensors)", rank, size, timeout);
      return std::make_unique<DeviceDispatchGroup>(std::move(gloo), std::move(nccl));
    } catch (const c10::Error& error) {
      throw std::runtime_error("creating NCCL process group '" + prefix + "' (rank " + std::to_string(rank) + " of " +
                               std::to_string(size) + ") failed: " + error.what_without_backtrace());
    }
#else
    static_cast<void>(device);
    throw std::invalid_argument(
        "backend 'nccl' needs LibTorch built with CUDA and NCCL; this one has neither. Use "
        "'gloo' for CPU tensors.");
#endif
  }
  return create_gloo_group(store, rendezvous->host, prefix, rank, size, timeout);
}

bool nccl_available() {
#if defined(USE_C10D_NCCL)
  return true;
#else
  return false;
#endif
}

}  // namespace bridge::parallel::detail
