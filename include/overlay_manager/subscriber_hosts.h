// Which machine a ROS subscriber runs on and which overlay path leads there (pure helpers).
//
// ROS_HOSTNAME is an overlay name on every fleet machine, so the URI the master gives for a node
// (lookupNode) names its machine; this machine's overlay node lists every machine and its path in
// ~peers (overlay_manager/PeerList).
//
// The rules are the Python side's (overlay_manager/core/identity.py, core/topic_links.py
// MachineMap): case and a trailing dot do not matter, IPv6 in any spelling; a host names a peer by
// its overlay name, short name or an overlay address (an FQDN by its first label only when the
// peer has no overlay name); lookup order ~host_aliases, this machine, peers, loopback
// (localhost, localhost.localdomain, ip6-localhost, ip6-loopback, 127.0.0.0/8, ::1).
// test/data/host_matching_cases.yaml holds both implementations to the same answers.
#ifndef OVERLAY_MANAGER_SUBSCRIBER_HOSTS_H
#define OVERLAY_MANAGER_SUBSCRIBER_HOSTS_H

#include <overlay_manager/PeerList.h>

#include <map>
#include <string>

namespace overlay_manager
{

/// ~host_aliases: host as nodes advertise it (e.g. a LAN address set as ROS_IP) -> the short
/// name of its machine on the overlay.
typedef std::map<std::string, std::string> HostAliases;

/// "http://robot1.fleet.internal:41234/" -> "robot1.fleet.internal"; "http://[fd7a::1]:1/" ->
/// "fd7a::1"; "" when the URI has no host.
std::string hostOfUri(const std::string& uri);

/// A host in the form every comparison uses: trimmed, lower case, no trailing dot, no URI
/// brackets, an address in its canonical (compressed) form.
std::string normaliseHost(const std::string& host);

/// True for an IPv4 or IPv6 address.
bool isAddress(const std::string& host);

/// True for the loopback names, 127.0.0.0/8 and ::1.
bool isLoopback(const std::string& host);

/// Whether `host` names `peer` (overlay name, short name or overlay address).
bool refersTo(const std::string& host, const Peer& peer);

/// The peer `host` names; nullptr when none does. `peers` may be null.
const Peer* findPeer(const std::string& host, const PeerList* peers);

/// Short name of the machine `host` refers to ("" = not an overlay machine): ~host_aliases, then
/// this machine (~peers' self, `own_host`), then a peer, then loopback (this machine).
std::string machineOf(const std::string& host, const std::string& own_host, const PeerList* peers,
                      const HostAliases& aliases = HostAliases());

/// Path to the machine `host` refers to: Peer::PATH_SELF for this machine; the peer's Peer.path
/// (PATH_UNKNOWN when it is not one of Peer.msg's words, when peers of that name disagree, or when
/// the PeerList is stale); PATH_UNKNOWN for other hosts (also for "").
/// `word` when it is one of Peer.msg's path words (exactly), else Peer::PATH_UNKNOWN.
std::string knownPathWord(const std::string& word);

std::string pathOfHost(const std::string& host, const std::string& own_host, const PeerList* peers,
                       const HostAliases& aliases = HostAliases());

/// Short name for display: machineOf when known, else the address as given, else the first
/// label of a host name.
std::string shortName(const std::string& host, const std::string& own_host, const PeerList* peers,
                      const HostAliases& aliases = HostAliases());

/// The socket descriptor in roscpp's TCPROS transport info ("TCPROS connection on port 1 to
/// [host:2 on socket 17]" -> 17); -1 when there is none (e.g. intraprocess).
int socketOfTransportInfo(const std::string& info);

/// The peer's port in roscpp's TCPROS transport info ("TCPROS connection on port 1 to
/// [host:2 on socket 17]" -> 2; an IPv6 host's last colon-separated field); -1 when there is none.
int peerPortOfTransportInfo(const std::string& info);

}  // namespace overlay_manager

#endif  // OVERLAY_MANAGER_SUBSCRIBER_HOSTS_H
