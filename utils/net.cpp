// POSIX sockets, getaddrinfo and getifaddrs behind utils/net.h.
#include "utils/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace bridge::utils {

int find_free_port(const std::string& host) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("find_free_port: socket() failed: " + std::string(std::strerror(errno)));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = 0;
  if (::inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) {
    ::close(fd);
    throw std::invalid_argument("find_free_port: '" + host + "' is not an IPv4 address");
  }
  socklen_t length = sizeof(address);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  const int saved_errno = errno;
  ::close(fd);
  if (!ok) throw std::runtime_error("find_free_port: no free port on " + host + ": " + std::strerror(saved_errno));
  return ntohs(address.sin_port);
}

std::string host_ipv4_address() {
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) return "127.0.0.1";
  // The interface Gloo is told to use, if any, as PyTorch does.
  const char* wanted = std::getenv("GLOO_SOCKET_IFNAME");
  std::string result = "127.0.0.1";
  for (ifaddrs* it = interfaces; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if ((it->ifa_flags & IFF_UP) == 0 || (it->ifa_flags & IFF_LOOPBACK) != 0) continue;
    if (wanted != nullptr && std::string(wanted) != it->ifa_name) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* address = reinterpret_cast<const sockaddr_in*>(it->ifa_addr);
    ::inet_ntop(AF_INET, &address->sin_addr, text, sizeof(text));
    result = text;
    break;
  }
  ::freeifaddrs(interfaces);
  return result;
}

namespace {

// Closes a socket when it goes out of scope.
class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

// The numeric form of an address ("10.0.0.2", "fe80::1"), or "" if it has none.
std::string numeric(const sockaddr* address, socklen_t length) {
  char text[NI_MAXHOST] = {};
  if (::getnameinfo(address, length, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) != 0) return "";
  return text;
}

// "connection refused" rather than "Connection refused": it continues a sentence.
std::string error_text(int error) {
  std::string text = std::strerror(error);
  if (!text.empty()) text[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(text[0])));
  return text;
}

// The addresses `host` resolves to, IPv4 first (the family a cluster's MASTER_ADDR usually means). Empty with
// `error` set if it does not resolve.
struct Resolved {
  std::vector<sockaddr_storage> addresses;
  std::vector<socklen_t> lengths;
  std::string error;
};

Resolved resolve(const std::string& host, int port, int socket_type) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socket_type;
  addrinfo* found = nullptr;
  Resolved result;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    result.error = "'" + host + "' does not resolve: " + ::gai_strerror(rc);
    return result;
  }
  for (int family : {AF_INET, AF_INET6}) {
    for (addrinfo* it = found; it != nullptr; it = it->ai_next) {
      if (it->ai_family != family) continue;
      sockaddr_storage address{};
      std::memcpy(&address, it->ai_addr, it->ai_addrlen);
      result.addresses.push_back(address);
      result.lengths.push_back(it->ai_addrlen);
    }
  }
  ::freeaddrinfo(found);
  if (result.addresses.empty()) result.error = "'" + host + "' has no IPv4 or IPv6 address";
  return result;
}

// One non-blocking connect within `limit`: "" when accepted, else why not.
std::string try_connect(const sockaddr_storage& address, socklen_t length, std::chrono::milliseconds limit) {
  Socket socket(::socket(address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (socket.fd() < 0) return "socket() failed: " + error_text(errno);
  if (::connect(socket.fd(), reinterpret_cast<const sockaddr*>(&address), length) == 0) return "";
  if (errno != EINPROGRESS) return error_text(errno);
  pollfd waiting{socket.fd(), POLLOUT, 0};
  const int ready = ::poll(&waiting, 1, static_cast<int>(std::max<int64_t>(limit.count(), 1)));
  if (ready == 0) return "no answer (timed out)";
  if (ready < 0) return "poll() failed: " + error_text(errno);
  int error = 0;
  socklen_t size = sizeof(error);
  if (::getsockopt(socket.fd(), SOL_SOCKET, SO_ERROR, &error, &size) != 0) return error_text(errno);
  return error == 0 ? "" : error_text(error);
}

}  // namespace

std::vector<InterfaceAddress> interface_addresses() {
  std::vector<InterfaceAddress> result;
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) return result;
  for (int family : {AF_INET, AF_INET6}) {
    for (ifaddrs* it = interfaces; it != nullptr; it = it->ifa_next) {
      if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != family || (it->ifa_flags & IFF_UP) == 0) continue;
      const socklen_t length = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      if (family == AF_INET6 &&
          IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(it->ifa_addr)->sin6_addr)) {
        continue;  // needs a scope to be reached: never what a peer is told
      }
      const std::string address = numeric(it->ifa_addr, length);
      if (address.empty()) continue;
      result.push_back({it->ifa_name, address, (it->ifa_flags & IFF_LOOPBACK) != 0 || is_loopback_address(address)});
    }
  }
  ::freeifaddrs(interfaces);
  return result;
}

bool is_loopback_address(const std::string& address) {
  return address.rfind("127.", 0) == 0 || address == "::1" || address.rfind("::ffff:127.", 0) == 0;
}

InterfaceAddress route_to(const std::string& host) {
  const Resolved resolved = resolve(host, 9, SOCK_DGRAM);  // any port: nothing is sent
  if (resolved.addresses.empty()) throw std::runtime_error("no route to " + resolved.error);
  std::string failure;
  for (std::size_t i = 0; i < resolved.addresses.size(); ++i) {
    const sockaddr_storage& peer = resolved.addresses[i];
    Socket socket(::socket(peer.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (socket.fd() < 0 || ::connect(socket.fd(), reinterpret_cast<const sockaddr*>(&peer), resolved.lengths[i]) != 0) {
      failure = error_text(errno);
      continue;
    }
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    if (::getsockname(socket.fd(), reinterpret_cast<sockaddr*>(&local), &length) != 0) {
      failure = error_text(errno);
      continue;
    }
    InterfaceAddress result;
    result.address = numeric(reinterpret_cast<const sockaddr*>(&local), length);
    result.loopback = is_loopback_address(result.address);
    for (const InterfaceAddress& candidate : interface_addresses()) {
      if (candidate.address == result.address) {
        result.interface = candidate.interface;
        result.loopback = result.loopback || candidate.loopback;
        break;
      }
    }
    return result;
  }
  throw std::runtime_error("no route to '" + host + "': " + failure);
}

std::optional<std::string> wait_until_accepting(const std::string& host, int port,
                                                std::chrono::steady_clock::time_point deadline) {
  using namespace std::chrono;
  std::string last;
  milliseconds pause(100);
  for (;;) {
    const Resolved resolved = resolve(host, port, SOCK_STREAM);
    if (resolved.addresses.empty()) last = resolved.error;
    for (std::size_t i = 0; i < resolved.addresses.size(); ++i) {
      const auto left = duration_cast<milliseconds>(deadline - steady_clock::now());
      last = try_connect(resolved.addresses[i], resolved.lengths[i],
                         std::clamp<milliseconds>(left, milliseconds(100), seconds(3)));
      if (last.empty()) return std::nullopt;
    }
    const auto now = steady_clock::now();
    if (now >= deadline) return last;
    std::this_thread::sleep_for(std::min<steady_clock::duration>(pause, deadline - now));
    pause = std::min<milliseconds>(pause * 2, seconds(1));
  }
}

}  // namespace bridge::utils
