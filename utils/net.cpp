// POSIX sockets and getifaddrs behind utils/net.h.
#include "utils/net.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>

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

}  // namespace bridge::utils
