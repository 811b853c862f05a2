// The rendezvous's address choice, announcements and errors (see rendezvous_checks.h).
#include "parallel/rendezvous_checks.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "utils/net.h"
#include "utils/strings.h"

namespace bridge::parallel::detail {
namespace {

std::string this_host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

// "1", "1, 3", "1-4, 7": ranks in order, runs collapsed.
std::string rank_list(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(j == i ? std::to_string(ranks[i]) : std::to_string(ranks[i]) + "-" + std::to_string(ranks[j]));
    i = j + 1;
  }
  return utils::join(parts, ", ");
}

std::string where(const RankAnnouncement& rank) {
  return rank.address + (rank.interface.empty() ? "" : " (" + rank.interface + ")");
}

}  // namespace

std::string encode_announcement(const RankAnnouncement& announcement) {
  std::ostringstream out;
  out << "address=" << announcement.address
      << "\ninterface=" << announcement.interface << "\nchosen_by=" << announcement.chosen_by
      << "\nmaster=" << announcement.master << "\nhost_name=" << announcement.host_name
      << "\nnetwork_id=" << announcement.network_id << "\nloopback=" << (announcement.loopback ? 1 : 0) << "\n";
  for (const std::string& candidate : announcement.candidates) out << "candidate=" << candidate << "\n";
  return out.str();
}

RankAnnouncement decode_announcement(int rank, const std::string& text) {
  RankAnnouncement result;
  result.rank = rank;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const std::size_t equals = line.find('=');
    if (equals == std::string::npos) continue;
    const std::string key = line.substr(0, equals), value = line.substr(equals + 1);
    if (key == "address") result.address = value;
    if (key == "interface") result.interface = value;
    if (key == "chosen_by") result.chosen_by = value;
    if (key == "master") result.master = value;
    if (key == "host_name") result.host_name = value;
    if (key == "network_id") result.network_id = value;
    if (key == "loopback") result.loopback = value == "1";
    if (key == "candidate") result.candidates.push_back(value);
  }
  return result;
}

std::string network_id() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  struct stat namespace_info {};
  if (std::getline(boot, boot_id) && ::stat("/proc/self/ns/net", &namespace_info) == 0) {
    return std::string(utils::trim(boot_id)) + "/net:" + std::to_string(namespace_info.st_ino);
  }
  return "host:" + this_host_name();
}

RankAnnouncement choose_gloo_address(int rank, const std::string& master_addr,
                                     const std::optional<std::string>& gloo_socket_ifname) {
  RankAnnouncement result;
  result.rank = rank;
  result.master = master_addr;
  result.host_name = this_host_name();
  result.network_id = network_id();
  const std::vector<utils::InterfaceAddress> interfaces = utils::interface_addresses();
  for (const utils::InterfaceAddress& candidate : interfaces) {
    if (!candidate.loopback) result.candidates.push_back(candidate.interface + " " + candidate.address);
  }
  if (gloo_socket_ifname) {
    result.chosen_by = "GLOO_SOCKET_IFNAME";
    result.interface = *gloo_socket_ifname;
    const auto named = std::find_if(interfaces.begin(), interfaces.end(), [&](const utils::InterfaceAddress& it) {
      return it.interface == *gloo_socket_ifname;
    });
    if (named == interfaces.end()) {
      std::vector<std::string> all;
      for (const utils::InterfaceAddress& it : interfaces) all.push_back(it.interface + " " + it.address);
      throw std::invalid_argument(
          "GLOO_SOCKET_IFNAME=" + *gloo_socket_ifname + ": host '" + result.host_name +
          "' has no interface of that name that is up with an address; its interfaces: " + utils::join(all, ", ") +
          ". Name one of them, or unset it to use the route to " + "MASTER_ADDR");
    }
    result.address = named->address;
    result.loopback = named->loopback;
    return result;
  }
  const utils::InterfaceAddress route = utils::route_to(master_addr);
  result.chosen_by = "the route to MASTER_ADDR";
  result.address = route.address;
  result.interface = route.interface;
  result.loopback = route.loopback;
  return result;
}

std::optional<std::string> unreachable_loopback_error(const std::vector<RankAnnouncement>& ranks) {
  for (const RankAnnouncement& local : ranks) {
    if (!local.loopback) continue;
    const auto remote = std::find_if(ranks.begin(), ranks.end(),
                                     [&](const RankAnnouncement& it) { return it.network_id != local.network_id; });
    if (remote == ranks.end()) continue;
    const std::string others = local.candidates.empty()
                                   ? std::string("an interface the other hosts reach")
                                   : "one the other hosts reach: " + utils::join(local.candidates, ", ");
    std::string fix;
    if (local.chosen_by == "GLOO_SOCKET_IFNAME") {
      fix = "GLOO_SOCKET_IFNAME=" + local.interface + " names a loopback interface there: set it to " + others;
    } else {
      const std::string example =
          local.candidates.empty() ? "<iface>" : local.candidates.front().substr(0, local.candidates.front().find(' '));
      fix = "MASTER_ADDR '" + local.master + "' resolves to loopback there: set GLOO_SOCKET_IFNAME=" + example +
            " on that host (" + others + "), or fix /etc/hosts there so that '" + local.master +
            "' resolves to that interface's address, or set MASTER_ADDR to that address";
    }
    return "rank " + std::to_string(local.rank) + " on host '" + local.host_name +
           "' advertises the loopback address " + where(local) + ", chosen by " + local.chosen_by +
           ", for its Gloo connections, which rank " + std::to_string(remote->rank) + " on host '" + remote->host_name +
           "' (" + remote->address + ", another network) cannot reach: " + fix;
  }
  return std::nullopt;
}

std::string describe(const RendezvousLimit& limit) {
  const int64_t ms = limit.timeout.count();
  const std::string amount = ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
  return amount + (limit.source.empty() ? "" : " (" + limit.source + ")");
}

std::string never_joined_error(const std::vector<int>& missing, int world_size, const std::string& store,
                               const RendezvousLimit& limit) {
  const bool one = missing.size() == 1;
  return std::string(one ? "rank " : "ranks ") + rank_list(missing) + " of " + std::to_string(world_size) +
         " never joined the rendezvous at " + store + " within " + describe(limit) + ": check " +
         (one ? "it was" : "they were") + " started, and that " + (one ? "its" : "their") +
         " MASTER_ADDR/MASTER_PORT are " + store;
}

std::string unreachable_store_error(int rank, int world_size, const std::string& store, const RendezvousLimit& limit,
                                    const std::string& why) {
  return "rank " + std::to_string(rank) + " of " + std::to_string(world_size) +
         " could not reach the rendezvous store at " + store + " within " + describe(limit) + " (" + why +
         "): check that MASTER_ADDR/MASTER_PORT are rank 0's address and port, that rank 0 (or the launcher "
         "hosting the store) was started, and that this host reaches it";
}

bool store_closed_connection(const std::string& c10d_error) {
  std::string text = c10d_error;
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* sign : {"reset by peer", "closed by peer", "broken pipe", "got 0 bytes", "connection closed"}) {
    if (text.find(sign) != std::string::npos) return true;
  }
  return false;
}

std::string launcher_version_error(const std::string& store, const std::string& torch_version,
                                   const std::string& torchrun) {
  return "the rendezvous store at " + store +
         " closed the connection during c10d's handshake, as a store of another PyTorch version does: the launcher "
         "(torchrun) is not from bridge's PyTorch " +
         torch_version + ". Launch with the torchrun of PyTorch " + torch_version +
         (torchrun.empty() ? std::string(" (python -m torch.distributed.run of that installation)") : ": " + torchrun);
}

}  // namespace bridge::parallel::detail
