// The rendezvous's own checks, apart from c10d so they are unit-tested without a job: the address this rank's Gloo
// transport advertises, what each rank announces when it joins the world, and the one-line errors for a rank that
// never joins, a store that cannot be reached, a store of another PyTorch, and a loopback address that ranks on
// other hosts would have to reach.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace bridge::parallel::detail {

/// Where a rank's Gloo transport listens and where the rank runs, as it tells the others when it joins.
struct RankAnnouncement {
  int rank = 0;
  std::string address;    ///< the address Gloo advertises to its peers, e.g. "10.0.0.2"
  std::string interface;  ///< the interface holding it ("" if none does)
  std::string chosen_by;  ///< "GLOO_SOCKET_IFNAME" or "the route to MASTER_ADDR"
  std::string master;     ///< MASTER_ADDR as this rank was given it
  std::string host_name;
  std::string network_id;               ///< equal on ranks that share a loopback interface (see network_id())
  std::vector<std::string> candidates;  ///< this host's other interfaces, "eth0 10.0.0.2", for the fix of an error
  bool loopback = false;
};

/// One line per field, for a store value; decode_announcement reads it back.
std::string encode_announcement(const RankAnnouncement& announcement);
RankAnnouncement decode_announcement(int rank, const std::string& text);

/// Equal for two processes exactly when they share a network namespace, and so a loopback interface: this boot's
/// id and the namespace's inode (the host name where /proc does not tell).
std::string network_id();

/// The address Gloo advertises: the interface GLOO_SOCKET_IFNAME names, as in PyTorch, else the one the kernel
/// routes MASTER_ADDR through (the network the store is reached over, so the peers reach it too) rather than what
/// this host's name resolves to, which is often 127.0.0.1 in containers and on cluster nodes.
RankAnnouncement choose_gloo_address(int rank, const std::string& master_addr,
                                     const std::optional<std::string>& gloo_socket_ifname);

/// An error naming a rank that advertises a loopback address to a rank in another network namespace (which could
/// only fail to connect, or wait out its timeout), and the fix; nullopt when every rank can reach every other.
std::optional<std::string> unreachable_loopback_error(const std::vector<RankAnnouncement>& ranks);

/// How long the rendezvous may take and where that limit is set, for errors: "5 s (parallelism.rendezvous_timeout)".
struct RendezvousLimit {
  std::chrono::milliseconds timeout;
  std::string source;
};
std::string describe(const RendezvousLimit& limit);

/// "rank 1 of 2 never joined the rendezvous at 10.0.0.1:29500 within 120 s (...)", with what to check.
std::string never_joined_error(const std::vector<int>& missing, int world_size, const std::string& store,
                               const RendezvousLimit& limit);
/// This rank found nothing accepting connections at `store` within the limit; `why` is the last failure.
std::string unreachable_store_error(int rank, int world_size, const std::string& store, const RendezvousLimit& limit,
                                    const std::string& why);

/// Whether c10d's handshake failed because the store closed the connection: what a store of another PyTorch
/// version does with a query it does not know (the validation query of 2.x clients, for 1.x stores).
bool store_closed_connection(const std::string& c10d_error);
/// The error for that case, naming this build's PyTorch and the launcher to use (`torchrun`, "" if unknown).
std::string launcher_version_error(const std::string& store, const std::string& torch_version,
                                   const std::string& torchrun);

}  // namespace bridge::parallel::detail
