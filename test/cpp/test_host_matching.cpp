// The shared host -> machine -> path table (test/data/host_matching_cases.yaml) against the C++
// encoder's subscriber_hosts; test/unit/core/test_identity.py runs the same table against the Python
// side (core/topic_links.py MachineMap), so both answer every case the same way.
#include "overlay_manager/subscriber_hosts.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <map>
#include <memory>
#include <string>

#ifndef HOST_MATCHING_CASES
#error "HOST_MATCHING_CASES (path of test/data/host_matching_cases.yaml) is set by CMakeLists.txt"
#endif

namespace
{
overlay_manager::Peer peerOf(const YAML::Node& n, const std::string& default_path)
{
  overlay_manager::Peer p;
  p.name = n["name"].as<std::string>();
  p.dns_name = n["dns_name"] ? n["dns_name"].as<std::string>() : "";
  if (n["addresses"])
    for (const YAML::Node& a : n["addresses"])
      p.addresses.push_back(a.as<std::string>());
  p.path = n["path"] ? n["path"].as<std::string>() : default_path;
  return p;
}

/// Peer set name -> ~peers (nullptr for a set that is null: no ~peers received yet).
std::map<std::string, std::shared_ptr<overlay_manager::PeerList>> peerSets(const YAML::Node& sets)
{
  std::map<std::string, std::shared_ptr<overlay_manager::PeerList>> out;
  for (const auto& kv : sets)
  {
    const std::string key = kv.first.as<std::string>();
    if (kv.second.IsNull())
    {
      out[key] = nullptr;
      continue;
    }
    auto list = std::make_shared<overlay_manager::PeerList>();
    list->self_peer = peerOf(kv.second["self"], overlay_manager::Peer::PATH_SELF);
    for (const YAML::Node& p : kv.second["peers"])
      list->peers.push_back(peerOf(p, ""));
    out[key] = list;
  }
  return out;
}
}  // namespace

TEST(HostMatching, SharedTable)
{
  const YAML::Node table = YAML::LoadFile(HOST_MATCHING_CASES);
  const auto sets = peerSets(table["peer_sets"]);
  const std::string own_host = table["own_host"].as<std::string>();
  overlay_manager::HostAliases aliases;
  for (const auto& kv : table["aliases"])
    aliases[kv.first.as<std::string>()] = kv.second.as<std::string>();
  const YAML::Node cases = table["cases"];
  ASSERT_GE(cases.size(), 30u);
  for (const YAML::Node& c : cases)
  {
    const std::string host = c["host"].as<std::string>();
    const std::string set = c["peers"].as<std::string>();
    ASSERT_TRUE(sets.count(set)) << "case " << host << ": no peer set " << set;
    const overlay_manager::PeerList* peers = sets.at(set).get();
    EXPECT_EQ(overlay_manager::machineOf(host, own_host, peers, aliases), c["machine"].as<std::string>())
        << "host '" << host << "' with peers " << set;
    EXPECT_EQ(overlay_manager::pathOfHost(host, own_host, peers, aliases), c["path"].as<std::string>())
        << "host '" << host << "' with peers " << set;
  }
}

TEST(HostMatching, Normalisation)
{
  using overlay_manager::normaliseHost;
  EXPECT_EQ(normaliseHost(" Robot1.Fleet.Internal. "), "robot1.fleet.internal");
  EXPECT_EQ(normaliseHost("[FD7A:115C:A1E0:0:0:0:0:2]"), "fd7a:115c:a1e0::2");
  EXPECT_EQ(normaliseHost("1.2.3"), "1.2.3");
  EXPECT_TRUE(overlay_manager::isLoopback("127.1.2.3"));
  EXPECT_TRUE(overlay_manager::isLoopback("ip6-loopback"));
  EXPECT_FALSE(overlay_manager::isLoopback("128.0.0.1"));
  EXPECT_FALSE(overlay_manager::isAddress("alpha-robot1"));
}

// C++-only: what the link-aware stream does with ~peers it cannot trust (its budget follows the word)
namespace
{
overlay_manager::Peer namedPeer(const std::string& name, const std::string& path)
{
  overlay_manager::Peer p;
  p.name = name;
  p.dns_name = name + ".fleet.internal";
  p.path = path;
  return p;
}
}  // namespace

TEST(HostMatching, UnrecognisedPathWordIsUnknownNotUnbudgeted)
{
  overlay_manager::PeerList peers;
  peers.self_peer = namedPeer("robot1", "self");
  for (const std::string& word : { std::string("DERP"), std::string(""), std::string(10000, 'x'),
                                   std::string("direct "), std::string("peer_relay") })
  {
    peers.peers = { namedPeer("laptop", word) };
    EXPECT_EQ(overlay_manager::pathOfHost("laptop", "robot1", &peers), "unknown") << "word '" << word.substr(0, 20) << "'";
  }
  for (const std::string& word : { "direct", "peer-relay", "derp", "idle", "offline" })
  {
    peers.peers = { namedPeer("laptop", word) };
    EXPECT_EQ(overlay_manager::pathOfHost("laptop", "robot1", &peers), word);
  }
}

TEST(HostMatching, DuplicatePeerNamesThatDisagreeAreUnknown)
{
  overlay_manager::PeerList peers;
  peers.self_peer = namedPeer("robot1", "self");
  peers.peers = { namedPeer("laptop", "direct"), namedPeer("laptop", "derp") };
  EXPECT_EQ(overlay_manager::pathOfHost("laptop", "robot1", &peers), "unknown");
  peers.peers = { namedPeer("laptop", "derp"), namedPeer("laptop", "direct") };
  EXPECT_EQ(overlay_manager::pathOfHost("laptop", "robot1", &peers), "unknown");
  peers.peers = { namedPeer("laptop", "derp"), namedPeer("Laptop", "derp") };
  EXPECT_EQ(overlay_manager::pathOfHost("laptop", "robot1", &peers), "derp");
}

TEST(HostMatching, StalePeerListGivesUnknownPaths)
{
  overlay_manager::PeerList peers;
  peers.self_peer = namedPeer("robot1", "self");
  peers.peers = { namedPeer("laptop", "direct") };
  EXPECT_EQ(overlay_manager::pathOfHost("laptop", "robot1", &peers), "direct");
  peers.stale = true;
  EXPECT_EQ(overlay_manager::pathOfHost("laptop", "robot1", &peers), "unknown");
  EXPECT_EQ(overlay_manager::pathOfHost("robot1", "robot1", &peers), "self") << "this machine is still itself";
}

int main(int argc, char** argv)
{
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
