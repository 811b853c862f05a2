// utils/net.h: loopback addresses, the route to a peer (the address Gloo advertises) and the quiet probe of a port.
#include "utils/net.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>
#include <thread>

namespace bridge::utils {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using Clock = std::chrono::steady_clock;

TEST(Net, LoopbackAddresses) {
  for (const char* address : {"127.0.0.1", "127.0.1.1", "::1", "::ffff:127.0.0.1"}) {
    EXPECT_TRUE(is_loopback_address(address)) << address;
  }
  for (const char* address : {"10.0.0.1", "128.0.0.1", "::", "192.168.1.127", "::ffff:10.0.0.1"}) {
    EXPECT_FALSE(is_loopback_address(address)) << address;
  }
}

TEST(Net, TheRouteToLoopbackLeavesFromLoopback) {
  for (const char* host : {"127.0.0.1", "localhost"}) {
    const InterfaceAddress route = route_to(host);
    EXPECT_TRUE(route.loopback) << host << " -> " << route.address;
    EXPECT_TRUE(is_loopback_address(route.address)) << host << " -> " << route.address;
    EXPECT_FALSE(route.interface.empty()) << host << ": the loopback interface has a name";
  }
}

// A peer at one of this host's own addresses is reached from that address (the kernel routes it over loopback, but
// the source is the address itself): rank 0 given MASTER_ADDR = its own address advertises that address, not 127.x.
TEST(Net, TheRouteToAnOwnAddressLeavesFromIt) {
  int checked = 0;
  for (const InterfaceAddress& own : interface_addresses()) {
    if (own.loopback || own.address.find(':') != std::string::npos) continue;
    const InterfaceAddress route = route_to(own.address);
    EXPECT_EQ(route.address, own.address);
    EXPECT_EQ(route.interface, own.interface);
    EXPECT_FALSE(route.loopback) << own.address;
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "this host has no IPv4 address besides loopback";
}

TEST(Net, AHostThatDoesNotResolveIsNamed) {
  EXPECT_THAT([] { route_to("no-such-host.invalid"); },
              ThrowsMessage<std::runtime_error>(HasSubstr("'no-such-host.invalid' does not resolve")));
  const auto why = wait_until_accepting("no-such-host.invalid", 29500, Clock::now());
  ASSERT_TRUE(why.has_value());
  EXPECT_THAT(*why, HasSubstr("'no-such-host.invalid' does not resolve"));
}

TEST(Net, WaitUntilAcceptingGivesTheLastFailureAtTheDeadline) {
  const int port = find_free_port();  // nothing listens there
  const auto start = Clock::now();
  const auto why = wait_until_accepting("127.0.0.1", port, start + std::chrono::milliseconds(700));
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(*why, "connection refused");
  EXPECT_GE(seconds, 0.7);
  EXPECT_LT(seconds, 3.0);
}

TEST(Net, WaitUntilAcceptingReturnsOnceTheListenerStarts) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int port = ntohs(address.sin_port);
  // Bound but not listening: refused until the listener starts, as a store that is still coming up.
  std::thread listener([fd] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ::listen(fd, 4);
  });
  const auto start = Clock::now();
  const auto why = wait_until_accepting("127.0.0.1", port, start + std::chrono::seconds(20));
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  listener.join();
  ::close(fd);
  EXPECT_FALSE(why.has_value()) << *why;
  EXPECT_GE(seconds, 0.4);
  EXPECT_LT(seconds, 5.0);
}

}  // namespace
}  // namespace bridge::utils
