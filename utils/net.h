// Small networking helpers for rendezvous set-up: a free TCP port, this host's addresses, the route to a peer, and a
// quiet check that a peer accepts connections.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace bridge::utils {

/// A TCP port that was free on `host` a moment ago (bound to port 0, read back, released).
int find_free_port(const std::string& host = "127.0.0.1");

/// The IPv4 address of this host's first interface that is up and not loopback (of GLOO_SOCKET_IFNAME when set),
/// or "127.0.0.1" if there is none.
std::string host_ipv4_address();

/// One address of one of this host's network interfaces.
struct InterfaceAddress {
  std::string interface;  ///< e.g. "eth0"
  std::string address;    ///< numeric, e.g. "10.0.0.2"
  bool loopback = false;
};

/// Every address of this host's interfaces that are up, IPv4 before IPv6 (IPv6 link-local ones left out).
std::vector<InterfaceAddress> interface_addresses();

/// Whether a numeric address is a loopback one (127.0.0.0/8, ::1, ::ffff:127.x.y.z).
bool is_loopback_address(const std::string& address);

/// The local address (and its interface) that traffic to `host` leaves from, as the kernel routes it: a UDP socket
/// connected to `host`, which sends nothing. The address a peer on that network reaches this host at. Throws
/// std::runtime_error naming `host` if it does not resolve or there is no route to it.
InterfaceAddress route_to(const std::string& host);

/// Opens plain TCP connections to host:port (closed at once, nothing sent) until one is accepted or `deadline`
/// passes, pausing between tries; logs nothing. nullopt once a connection was accepted, else the last failure, e.g.
/// "connection refused" or "no answer (timed out)".
std::optional<std::string> wait_until_accepting(const std::string& host, int port,
                                                std::chrono::steady_clock::time_point deadline);

}  // namespace bridge::utils
