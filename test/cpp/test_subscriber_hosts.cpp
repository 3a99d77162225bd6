// Unit tests of the subscriber-host helpers (subscriber_hosts.h: master URIs, ~peers, sockets).
#include "overlay_manager/subscriber_hosts.h"

#include <gtest/gtest.h>

TEST(SubscriberHosts, HostOfUri)
{
  EXPECT_EQ(overlay_manager::hostOfUri("http://robot1.fleet.internal:41234/"), "robot1.fleet.internal");
  EXPECT_EQ(overlay_manager::hostOfUri("http://100.64.0.2:1/"), "100.64.0.2");
  EXPECT_EQ(overlay_manager::hostOfUri("http://[fd7a:115c::1]:5/"), "fd7a:115c::1");
  EXPECT_EQ(overlay_manager::hostOfUri(""), "");
}

TEST(SubscriberHosts, PathOfHost)
{
  overlay_manager::PeerList peers;
  peers.self_peer.name = "robot1";
  peers.self_peer.dns_name = "robot1.fleet.internal";
  peers.self_peer.path = "self";
  overlay_manager::Peer laptop;
  laptop.name = "laptop";
  laptop.dns_name = "laptop.fleet.internal";
  laptop.addresses = {"100.64.0.3", "fd7a:115c:a1e0::3"};
  laptop.path = "derp";
  peers.peers.push_back(laptop);
  using overlay_manager::pathOfHost;
  EXPECT_EQ(pathOfHost("laptop.fleet.internal", "robot1.fleet.internal", &peers), "derp");
  EXPECT_EQ(pathOfHost("LAPTOP.fleet.internal.", "x", &peers), "derp");
  EXPECT_EQ(pathOfHost("100.64.0.3", "x", &peers), "derp");
  EXPECT_EQ(pathOfHost("laptop", "x", &peers), "derp");
  EXPECT_EQ(pathOfHost("robot1.fleet.internal", "robot1.fleet.internal", &peers), "self");
  EXPECT_EQ(pathOfHost("robot1.fleet.internal", "other", &peers), "self");  // ~peers' self
  EXPECT_EQ(pathOfHost("localhost", "x", nullptr), "self");
  EXPECT_EQ(pathOfHost("127.0.0.1", "x", nullptr), "self");
  EXPECT_EQ(pathOfHost("laptop.fleet.internal", "x", nullptr), "unknown");
  EXPECT_EQ(pathOfHost("laptop.other.domain", "x", &peers), "unknown");
  EXPECT_EQ(pathOfHost("", "x", &peers), "unknown");
  EXPECT_EQ(overlay_manager::shortName("100.64.0.3", "x", &peers), "laptop");
  EXPECT_EQ(overlay_manager::shortName("base.fleet.internal", "x", &peers), "base");
  EXPECT_EQ(overlay_manager::shortName("192.168.1.20", "x", &peers, {{"192.168.1.20", "laptop"}}), "laptop");
}

TEST(SubscriberHosts, SocketOfTransportInfo)
{
  using overlay_manager::socketOfTransportInfo;
  EXPECT_EQ(socketOfTransportInfo("TCPROS connection on port 40111 to [100.64.0.3:51234 on socket 17]"), 17);
  EXPECT_EQ(socketOfTransportInfo("INTRAPROCESS"), -1);
  EXPECT_EQ(socketOfTransportInfo("... on socket ]"), -1);
}

TEST(SubscriberHosts, PeerPortOfTransportInfo)
{
  using overlay_manager::peerPortOfTransportInfo;
  EXPECT_EQ(peerPortOfTransportInfo("TCPROS connection on port 40111 to [100.64.0.3:51234 on socket 17]"), 51234);
  EXPECT_EQ(peerPortOfTransportInfo("TCPROS connection on port 40111 to [fd7a:115c:a1e0::3:443 on socket 9]"), 443);
  EXPECT_EQ(peerPortOfTransportInfo("TCPROS connection on port 40111 to [TCPServer Socket on socket 9]"), -1);
  EXPECT_EQ(peerPortOfTransportInfo("TCPROS connection on port 1 to [host:99999 on socket 3]"), -1);
  EXPECT_EQ(peerPortOfTransportInfo("TCPROS connection on port 1 to [host:12a on socket 3]"), -1);
  EXPECT_EQ(peerPortOfTransportInfo("INTRAPROCESS"), -1);
  EXPECT_EQ(peerPortOfTransportInfo(" on socket  to [x:1"), -1);
}

int main(int argc, char** argv)
{
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
