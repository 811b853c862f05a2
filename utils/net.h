// Small networking helpers for rendezvous set-up: a free TCP port and this host's address.
#pragma once

#include <string>

namespace bridge::utils {

/// A TCP port that was free on `host` a moment ago (bound to port 0, read back, released).
int find_free_port(const std::string& host = "127.0.0.1");

/// The IPv4 address of this host's first interface that is up and not loopback (of GLOO_SOCKET_IFNAME when set),
/// or "127.0.0.1" if there is none.
std::string host_ipv4_address();

}  // namespace bridge::utils
