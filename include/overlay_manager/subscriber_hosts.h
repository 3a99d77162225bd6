// Which machine a ROS subscriber runs on and which overlay path leads there (pure helpers).
//
// ROS_HOSTNAME is an overlay name on every fleet machine, so the URI the master gives for a node
// (lookupNode) names its machine; this machine's overlay node lists every machine and its path in
// ~peers (overlay_manager/PeerList).
#ifndef OVERLAY_MANAGER_SUBSCRIBER_HOSTS_H
#define OVERLAY_MANAGER_SUBSCRIBER_HOSTS_H

#include <overlay_manager/PeerList.h>

#include <string>

namespace overlay_manager
{

/// "http://robot1.fleet.internal:41234/" -> "robot1.fleet.internal"; "http://[fd7a::1]:1/" ->
/// "fd7a::1"; "" when the URI has no host.
std::string hostOfUri(const std::string& uri);

/// The peer `host` names (its overlay name, short name or one of its overlay addresses;
/// case-insensitive, trailing dot ignored); nullptr when none does. `peers` may be null.
const Peer* findPeer(const std::string& host, const PeerList* peers);

/// Path to the machine `host`: "local" for ~peers' self; the peer's Peer.path when a peer names
/// the host; else "local" for loopback or `own_host`; "unknown" otherwise (also for "").
std::string pathOfHost(const std::string& host, const std::string& own_host, const PeerList* peers);

/// Short name for display: the peer's name when known, else the first label of a host name, else
/// the address as given.
std::string shortName(const std::string& host, const PeerList* peers);

/// The socket descriptor in roscpp's TCPROS transport info ("TCPROS connection on port 1 to
/// [host:2 on socket 17]" -> 17); -1 when there is none (e.g. intraprocess).
int socketOfTransportInfo(const std::string& info);

}  // namespace overlay_manager

#endif  // OVERLAY_MANAGER_SUBSCRIBER_HOSTS_H
