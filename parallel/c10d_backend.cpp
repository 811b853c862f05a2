// The only file that includes c10d: TCPStore rendezvous, Gloo (and, with CUDA, NCCL) process groups. Differences
// between LibTorch versions are handled here.
#include "parallel/c10d_backend.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <dlfcn.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <type_traits>

#include "utils/exception_message.h"
#include "utils/logging.h"
#include "utils/net.h"

namespace bridge::parallel::detail {

class Rendezvous {
 public:
  c10::intrusive_ptr<c10d::Store> store;
  std::string host;
  std::string address;    // "host:port", for errors
  RankAnnouncement gloo;  // the address this process's Gloo groups advertise
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

// The network device Gloo listens on, as connect_rendezvous chose it: GLOO_SOCKET_IFNAME's interface if set (as in
// PyTorch), else the address of the route to MASTER_ADDR. Not c10d's default, the address this host's name resolves
// to, which is 127.0.0.1 on many containers and cluster nodes and which a peer on another host cannot reach.
std::shared_ptr<::gloo::transport::Device> gloo_device(const Rendezvous& rendezvous) {
  if (rendezvous.gloo.chosen_by == "GLOO_SOCKET_IFNAME") {
    return c10d::ProcessGroupGloo::createDeviceForInterface(rendezvous.gloo.interface);
  }
  return c10d::ProcessGroupGloo::createDeviceForHostname(rendezvous.gloo.address);
}

// Keeps c10d's own log lines out while it lives: its TCPStore client logs a warning with a backtrace for every
// failed try of its handshake, and an error when it gives up. The caller reports the failure, once.
class QuietC10dLog {
 public:
  QuietC10dLog() : saved_(FLAGS_caffe2_log_level) { FLAGS_caffe2_log_level = std::max<decltype(saved_)>(saved_, 3); }
  ~QuietC10dLog() { FLAGS_caffe2_log_level = saved_; }
  QuietC10dLog(const QuietC10dLog&) = delete;
  QuietC10dLog& operator=(const QuietC10dLog&) = delete;

 private:
  std::remove_reference_t<decltype(FLAGS_caffe2_log_level)> saved_;  // c10's level: 3 = fatal only
};

// The torchrun of this LibTorch when it is a wheel's (<env>/lib/pythonX.Y/site-packages/torch/lib/libc10.so ->
// <env>/bin/torchrun), else "".
std::string matching_torchrun() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&FLAGS_caffe2_log_level), &info) == 0 || info.dli_fname == nullptr) return "";
  const std::filesystem::path library = std::filesystem::absolute(info.dli_fname).lexically_normal();
  if (library.string().find("/site-packages/torch/lib/") == std::string::npos) return "";
  std::filesystem::path env = library;
  for (int level = 0; level < 6; ++level) env = env.parent_path();
  const std::filesystem::path torchrun = env / "bin" / "torchrun";
  std::error_code error;
  return std::filesystem::exists(torchrun, error) ? torchrun.string() : "";
}

// One line of a c10d message (some span several).
std::string one_line(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

// Connects a TCPStore client to a store that accepts connections, within `deadline`. c10d retries its handshake
// itself; tries of a few seconds let a store that closes every connection (a 1.x store given the 2.x validation
// query) be told apart in seconds rather than at the deadline.
c10::intrusive_ptr<c10d::Store> connect_client(const std::string& host, c10d::TCPStoreOptions options,
                                               const LaunchEnv& env, const std::string& address,
                                               const RendezvousLimit& limit,
                                               std::chrono::steady_clock::time_point deadline) {
  using namespace std::chrono;
  for (;;) {
    const auto left = duration_cast<milliseconds>(deadline - steady_clock::now());
    options.timeout = std::clamp<milliseconds>(left, seconds(1), seconds(3));
    try {
      QuietC10dLog quiet;
      return c10::make_intrusive<c10d::TCPStore>(host, options);
    } catch (const std::exception& error) {  // c10::Error in LibTorch 2.x; 1.13's socket code may throw others
      const std::string message = one_line(utils::describe(error));
      if (store_closed_connection(message)) {
        throw std::runtime_error(launcher_version_error(address, TORCH_VERSION, matching_torchrun()));
      }
      if (steady_clock::now() >= deadline) {
        throw std::runtime_error(unreachable_store_error(env.rank, env.world_size, address, limit, message));
      }
    }
  }
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

// A reduce-scatter done as an all-reduce of the inputs laid end to end (1.13's Gloo has no reduce-scatter): this
// rank's chunk is copied into the output when wait() returns.
class ChunkOfAllReduce final : public PendingWork {
 public:
  ChunkOfAllReduce(std::unique_ptr<PendingWork> all_reduce, torch::Tensor all, torch::Tensor output, int64_t chunks,
                   int64_t rank)
      : all_reduce_(std::move(all_reduce)),
        all_(std::move(all)),
        output_(std::move(output)),
        chunks_(chunks),
        rank_(rank) {}
  void wait() override {
    all_reduce_->wait();
    output_.copy_(all_.chunk(chunks_)[static_cast<std::size_t>(rank_)]);
  }
  bool is_completed() override { return all_reduce_->is_completed(); }

 private:
  std::unique_ptr<PendingWork> all_reduce_;
  torch::Tensor all_, output_;
  int64_t chunks_, rank_;
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
    reduce_scatter_async(output, inputs, op)->wait();
  }

  void broadcast(torch::Tensor& tensor, int root) override {
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    options.timeout = timeout_;
    run_to_completion([&] { return group_->broadcast(tensors, options); }, timeout_);
  }

  // alltoall_base has the same signature in 1.13 and 2.x (where it forwards to all_to_all_single). Gloo takes CUDA
  // tensors here as in its other collectives (it copies them through host memory itself); NCCL takes them directly.
  void all_to_all(torch::Tensor& output, const torch::Tensor& input, const std::vector<int64_t>& output_split_sizes,
                  const std::vector<int64_t>& input_split_sizes) override {
    at::Tensor source = input.contiguous();
    std::vector<int64_t> output_splits = output_split_sizes, input_splits = input_split_sizes;
    c10d::AllToAllOptions options;
    options.timeout = timeout_;
    run_to_completion([&] { return group_->alltoall_base(output, source, output_splits, input_splits, options); },
                      timeout_);
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

  std::unique_ptr<PendingWork> reduce_scatter_async(torch::Tensor& output, std::vector<torch::Tensor>& inputs,
                                                    ReduceOp op) override {
    if (native_reduce_scatter(output)) {
      std::vector<at::Tensor> outputs{output};
      std::vector<std::vector<at::Tensor>> input_lists{inputs};
      c10d::ReduceScatterOptions options;
      options.reduceOp = to_c10d(op);
      options.timeout = timeout_;
      return start([&] { return group_->reduce_scatter(outputs, input_lists, options); });
    }
    torch::Tensor all = torch::cat(inputs);
    return std::make_unique<ChunkOfAllReduce>(all_reduce_async(all, op), all, output,
                                              static_cast<int64_t>(inputs.size()), group_->getRank());
  }

  std::unique_ptr<PendingWork> all_gather_async(std::vector<torch::Tensor>& outputs, torch::Tensor& input) override {
    // c10d gathers into its own flat staging and copies each member's part into the outputs when it is done, so an
    // input that is one of them is read before anything overwrites it.
    std::vector<std::vector<at::Tensor>> output_lists{outputs};
    std::vector<at::Tensor> inputs{input};
    c10d::AllgatherOptions options;
    options.timeout = timeout_;
    return start([&] { return group_->allgather(output_lists, inputs, options); });
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

  // NCCL, and Gloo from LibTorch 2 on (host tensors), reduce-scatter: each rank sends and receives 1/n of the data an
  // all-reduce moves. LibTorch 1.13's Gloo has none: reduce everything, keep this rank's chunk.
  static bool native_reduce_scatter(const torch::Tensor& output) {
    return !kIsGloo || (TORCH_VERSION_MAJOR >= 2 && output.device().is_cpu());
  }

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
  void all_to_all(torch::Tensor& output, const torch::Tensor& input, const std::vector<int64_t>& output_split_sizes,
                  const std::vector<int64_t>& input_split_sizes) override {
    for_tensor(input).all_to_all(output, input, output_split_sizes, input_split_sizes);
  }
  void send(torch::Tensor& tensor, int dst, int tag) override { for_tensor(tensor).send(tensor, dst, tag); }
  void recv(torch::Tensor& tensor, int src, int tag) override { for_tensor(tensor).recv(tensor, src, tag); }
  std::unique_ptr<PendingWork> all_reduce_async(torch::Tensor& tensor, ReduceOp op) override {
    return for_tensor(tensor).all_reduce_async(tensor, op);
  }
  std::unique_ptr<PendingWork> reduce_scatter_async(torch::Tensor& output, std::vector<torch::Tensor>& inputs,
                                                    ReduceOp op) override {
    return for_tensor(output).reduce_scatter_async(output, inputs, op);
  }
  std::unique_ptr<PendingWork> all_gather_async(std::vector<torch::Tensor>& outputs, torch::Tensor& input) override {
    return for_tensor(input).all_gather_async(outputs, input);
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
                                                const Rendezvous& rendezvous, const std::string& prefix, int rank,
                                                int size, std::chrono::milliseconds timeout) {
  auto fail = [&](const std::string& what) {
    return std::runtime_error("creating process group '" + prefix + "' (rank " + std::to_string(rank) + " of " +
                              std::to_string(size) + ") failed: " + what);
  };
  try {
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(gloo_device(rendezvous));
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

std::shared_ptr<Rendezvous> connect_rendezvous(const LaunchEnv& env, std::chrono::milliseconds timeout,
                                               const RendezvousLimit& limit) {
  if (!env.master_addr || !env.master_port) {
    throw std::invalid_argument("connect_rendezvous: MASTER_ADDR and MASTER_PORT are needed for a world of " +
                                std::to_string(env.world_size));
  }
  const auto deadline = std::chrono::steady_clock::now() + limit.timeout;
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(*env.master_port);
  options.isServer = env.is_store_server();
  options.numWorkers = env.world_size;
  options.waitWorkers = false;  // join_world waits for everyone, and names who is missing
  options.timeout = timeout;
  auto rendezvous = std::make_shared<Rendezvous>();
  rendezvous->host = *env.master_addr;
  rendezvous->address = *env.master_addr + ":" + std::to_string(*env.master_port);
  if (options.isServer) {
    try {
      rendezvous->store = c10::make_intrusive<c10d::TCPStore>(*env.master_addr, options);
    } catch (const std::exception& error) {
      throw std::runtime_error("could not start the rendezvous store at " + rendezvous->address + ": " +
                               one_line(utils::describe(error)) + ". Is the port in use? Pick another MASTER_PORT." +
                               (timeout < std::chrono::seconds(5) ? " Or the timeout is too short for a rendezvous: "
                                                                    "give it seconds, not milliseconds."
                                                                  : ""));
    }
  } else {
    // A quiet probe first: c10d's client would log a warning with a backtrace for each of its tries.
    if (const std::optional<std::string> why =
            utils::wait_until_accepting(*env.master_addr, *env.master_port, deadline)) {
      throw std::runtime_error(unreachable_store_error(env.rank, env.world_size, rendezvous->address, limit, *why));
    }
    rendezvous->store = connect_client(*env.master_addr, options, env, rendezvous->address, limit, deadline);
    rendezvous->store->setTimeout(timeout);
  }
  if (env.use_agent_store) {
    rendezvous->store = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + std::to_string(env.restart_count),
                                                               rendezvous->store);
  }
  const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
  rendezvous->gloo = choose_gloo_address(env.rank, *env.master_addr,
                                         interface != nullptr ? std::optional<std::string>(interface) : std::nullopt);
  const RankAnnouncement& gloo = rendezvous->gloo;
  utils::logger().info(
      "rank {}: Gloo advertises {}{} ({})", env.rank, gloo.address,
      gloo.interface.empty() ? "" : " on " + gloo.interface,
      gloo.chosen_by == "GLOO_SOCKET_IFNAME" ? "GLOO_SOCKET_IFNAME" : "the route to MASTER_ADDR " + *env.master_addr);
  return rendezvous;
}

// Rank 0 judges the rendezvous: it waits for every rank's announcement, checks them, and writes its verdict ("" or
// the error) for the others, who wait for it rather than read every announcement (O(world size) store operations in
// all). A rank that gets no verdict in time judges from the announcements it sees. Every store operation is quiet:
// c10d logs a warning with a backtrace for each failed one, and the one-line error says what failed.
void join_world(const std::shared_ptr<Rendezvous>& rendezvous, const std::string& prefix, int rank, int world_size,
                const RendezvousLimit& limit) {
  constexpr std::chrono::seconds kGrace(5);  // for the verdict to reach the others after rank 0's limit
  auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, rendezvous->store);
  const auto key = [](int r) { return std::to_string(r); };
  const auto wait_for = [&](const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
    try {
      store->wait(keys, timeout);
      return true;
    } catch (const std::exception&) {  // the limit passed, or the store went away: the next operation tells which
      return false;
    }
  };
  const auto text = [](const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); };
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(key(r));
  std::string verdict;
  try {
    QuietC10dLog quiet;
    const std::string mine = encode_announcement(rendezvous->gloo);
    store->set(key(rank), std::vector<uint8_t>(mine.begin(), mine.end()));
    if (rank != 0 && wait_for({"verdict"}, limit.timeout + kGrace)) {
      verdict = text(store->get("verdict"));
      store->set("read/" + key(rank), std::vector<uint8_t>{});
    } else {
      const bool everyone = rank == 0 ? wait_for(keys, limit.timeout) : store->check(keys);
      std::vector<int> missing;
      for (int r = 0; r < world_size && !everyone; ++r) {
        if (!store->check({key(r)})) missing.push_back(r);
      }
      if (!missing.empty()) {
        verdict = never_joined_error(missing, world_size, rendezvous->address, limit);
      } else {
        std::vector<RankAnnouncement> ranks;
        for (int r = 0; r < world_size; ++r) ranks.push_back(decode_announcement(r, text(store->get(key(r)))));
        verdict = unreachable_loopback_error(ranks).value_or("");
      }
      if (rank == 0) {
        store->set("verdict", std::vector<uint8_t>(verdict.begin(), verdict.end()));
        // Rank 0 may host the store: on an error, keep it until the ranks that joined have read why.
        std::vector<std::string> reads;
        for (int r = 1; r < world_size && !verdict.empty(); ++r) {
          if (std::find(missing.begin(), missing.end(), r) == missing.end()) reads.push_back("read/" + key(r));
        }
        if (!reads.empty()) wait_for(reads, kGrace);
      }
    }
  } catch (const std::exception& error) {
    throw std::runtime_error("rank " + std::to_string(rank) + " lost the rendezvous store at " + rendezvous->address +
                             " while the ranks joined (did rank 0 stop?): " + one_line(utils::describe(error)));
  }
  if (!verdict.empty()) throw std::runtime_error(verdict);
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
      auto gloo = create_gloo_group(c10::make_intrusive<c10d::PrefixStore>("gloo", store), *rendezvous,
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
  return create_gloo_group(store, *rendezvous, prefix, rank, size, timeout);
}

bool nccl_available() {
#if defined(USE_C10D_NCCL)
  return true;
#else
  return false;
#endif
}

}  // namespace bridge::parallel::detail
