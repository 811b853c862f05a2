// The rendezvous's checks without a job: the Gloo address choice, the announcements ranks exchange, a loopback
// address that another host would have to reach, and the one-line errors of a rendezvous that cannot complete.
#include "parallel/rendezvous_checks.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>

#include "utils/net.h"

namespace bridge::parallel::detail {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::ThrowsMessage;

const RendezvousLimit kLimit{std::chrono::seconds(120), "parallelism.rendezvous_timeout"};

RankAnnouncement rank_at(int rank, const std::string& address, bool loopback, const std::string& network,
                         const std::string& host) {
  RankAnnouncement result;
  result.rank = rank;
  result.address = address;
  result.interface = loopback ? "lo" : "eth0";
  result.loopback = loopback;
  result.chosen_by = "the route to MASTER_ADDR";
  result.master = "node0";
  result.network_id = network;
  result.host_name = host;
  result.candidates = {"eth0 10.0.0.1", "ib0 192.168.0.1"};
  return result;
}

TEST(RendezvousChecks, AnAnnouncementRoundTrips) {
  const RankAnnouncement sent = rank_at(3, "10.0.0.4", false, "boot/net:42", "node3");
  const RankAnnouncement received = decode_announcement(3, encode_announcement(sent));
  EXPECT_EQ(received.rank, 3);
  EXPECT_EQ(received.address, "10.0.0.4");
  EXPECT_EQ(received.interface, "eth0");
  EXPECT_EQ(received.chosen_by, sent.chosen_by);
  EXPECT_EQ(received.master, "node0");
  EXPECT_EQ(received.network_id, "boot/net:42");
  EXPECT_EQ(received.host_name, "node3");
  EXPECT_EQ(received.candidates, sent.candidates);
  EXPECT_FALSE(received.loopback);
  EXPECT_TRUE(decode_announcement(0, encode_announcement(rank_at(0, "127.0.0.1", true, "n", "h"))).loopback);
}

TEST(RendezvousChecks, NeverJoinedNamesTheRanksTheAddressAndTheLimit) {
  EXPECT_EQ(never_joined_error({1}, 2, "10.0.0.1:29500", kLimit),
            "rank 1 of 2 never joined the rendezvous at 10.0.0.1:29500 within 120 s "
            "(parallelism.rendezvous_timeout): check it was started, and that its MASTER_ADDR/MASTER_PORT are "
            "10.0.0.1:29500");
  EXPECT_THAT(never_joined_error({7, 2, 1, 3, 5}, 8, "n0:1234", {std::chrono::milliseconds(2500), "limit"}),
              AllOf(HasSubstr("ranks 1-3, 5, 7 of 8 never joined the rendezvous at n0:1234 within 2500 ms (limit)"),
                    HasSubstr("check they were started, and that their MASTER_ADDR/MASTER_PORT are n0:1234")));
}

TEST(RendezvousChecks, AnUnreachableStoreNamesTheAddressTried) {
  EXPECT_THAT(unreachable_store_error(1, 2, "10.0.0.99:29500", kLimit, "no route to host"),
              AllOf(HasSubstr("rank 1 of 2 could not reach the rendezvous store at 10.0.0.99:29500 within 120 s "
                              "(parallelism.rendezvous_timeout) (no route to host)"),
                    HasSubstr("MASTER_ADDR/MASTER_PORT are rank 0's address and port")));
}

TEST(RendezvousChecks, LoopbackIsFineWithinOneNetwork) {
  EXPECT_FALSE(
      unreachable_loopback_error({rank_at(0, "127.0.0.1", true, "a", "h"), rank_at(1, "127.0.0.1", true, "a", "h")}));
  // A mix on one host (GLOO_SOCKET_IFNAME on some ranks only) still reaches its own loopback.
  EXPECT_FALSE(
      unreachable_loopback_error({rank_at(0, "127.0.0.1", true, "a", "h"), rank_at(1, "10.0.0.1", false, "a", "h")}));
  EXPECT_FALSE(unreachable_loopback_error(
      {rank_at(0, "10.0.0.1", false, "a", "node0"), rank_at(1, "10.0.0.2", false, "b", "node1")}));
}

TEST(RendezvousChecks, ALoopbackAddressAnotherHostMustReachIsRefusedWithTheFix) {
  const std::optional<std::string> error = unreachable_loopback_error(
      {rank_at(0, "127.0.0.1", true, "a", "node0"), rank_at(1, "10.0.0.2", false, "b", "node1")});
  ASSERT_TRUE(error.has_value());
  EXPECT_THAT(*error, AllOf(HasSubstr("rank 0 on host 'node0' advertises the loopback address 127.0.0.1 (lo)"),
                            HasSubstr("rank 1 on host 'node1' (10.0.0.2, another network) cannot reach"),
                            HasSubstr("MASTER_ADDR 'node0' resolves to loopback there"),
                            HasSubstr("set GLOO_SOCKET_IFNAME=eth0 on that host"),
                            HasSubstr("eth0 10.0.0.1, ib0 192.168.0.1"), HasSubstr("fix /etc/hosts there")));

  RankAnnouncement named = rank_at(1, "127.0.0.1", true, "b", "node1");
  named.chosen_by = "GLOO_SOCKET_IFNAME";
  const std::optional<std::string> interface_error =
      unreachable_loopback_error({rank_at(0, "10.0.0.1", false, "a", "node0"), named});
  ASSERT_TRUE(interface_error.has_value());
  EXPECT_THAT(*interface_error,
              AllOf(HasSubstr("rank 1 on host 'node1'"),
                    HasSubstr("GLOO_SOCKET_IFNAME=lo names a loopback interface there"), Not(HasSubstr("/etc/hosts"))));
}

TEST(RendezvousChecks, GlooFollowsTheRouteToTheMasterOrTheNamedInterface) {
  const RankAnnouncement local = choose_gloo_address(2, "127.0.0.1", std::nullopt);
  EXPECT_EQ(local.rank, 2);
  EXPECT_EQ(local.address, "127.0.0.1");
  EXPECT_TRUE(local.loopback);
  EXPECT_EQ(local.chosen_by, "the route to MASTER_ADDR");
  EXPECT_EQ(local.master, "127.0.0.1");
  EXPECT_EQ(local.network_id, network_id());
  EXPECT_FALSE(local.host_name.empty());

  for (const utils::InterfaceAddress& own : utils::interface_addresses()) {
    const RankAnnouncement named = choose_gloo_address(0, "127.0.0.1", own.interface);
    EXPECT_EQ(named.chosen_by, "GLOO_SOCKET_IFNAME");
    EXPECT_EQ(named.interface, own.interface);
    EXPECT_FALSE(named.address.empty());
  }
  EXPECT_THAT([] { choose_gloo_address(0, "127.0.0.1", std::string("nosuchif0")); },
              ThrowsMessage<std::invalid_argument>(
                  AllOf(HasSubstr("GLOO_SOCKET_IFNAME=nosuchif0"), HasSubstr("no interface of that name"))));
}

TEST(RendezvousChecks, AStoreThatClosesTheConnectionIsAnotherPyTorch) {
  EXPECT_TRUE(store_closed_connection(
      "recvValue failed on SocketImpl(fd=3, addr=[::ffff:127.0.0.1]:34626, remote=[::ffff:127.0.0.1]:29611): "
      "Connection reset by peer"));
  EXPECT_FALSE(store_closed_connection(
      "The client socket has timed out after 3000ms while trying to connect to (127.0.0.1, 29500)."));
  EXPECT_THAT(launcher_version_error("127.0.0.1:29500", "2.15.0", "/opt/env/bin/torchrun"),
              AllOf(HasSubstr("the rendezvous store at 127.0.0.1:29500 closed the connection"),
                    HasSubstr("not from bridge's PyTorch 2.15.0"),
                    HasSubstr("Launch with the torchrun of PyTorch 2.15.0: /opt/env/bin/torchrun")));
  EXPECT_THAT(launcher_version_error("h:1", "2.15.0", ""), HasSubstr("python -m torch.distributed.run"));
}

}  // namespace
}  // namespace bridge::parallel::detail
