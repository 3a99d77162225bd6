// Subscriber machine and path helpers (see subscriber_hosts.h).
#include "overlay_manager/subscriber_hosts.h"

#include "overlay_manager/stream_policy.h"  // paths::k*

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>

namespace overlay_manager
{
namespace
{
std::string lower(std::string s)
{
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string firstLabel(const std::string& h)
{
  return h.substr(0, h.find('.'));
}

/// The canonical text of an address ("" when `h` is not one).
std::string canonicalAddress(const std::string& h)
{
  unsigned char buf[16];
  char out[INET6_ADDRSTRLEN];
  if (h.find(':') != std::string::npos)
  {
    if (inet_pton(AF_INET6, h.c_str(), buf) == 1 && inet_ntop(AF_INET6, buf, out, sizeof(out)))
      return out;
    return "";
  }
  if (inet_pton(AF_INET, h.c_str(), buf) == 1 && inet_ntop(AF_INET, buf, out, sizeof(out)))
    return out;
  return "";
}

std::string selfName(const std::string& own_host, const PeerList* peers)
{
  if (peers && !peers->self_peer.name.empty())
    return peers->self_peer.name;
  const std::string h = normaliseHost(own_host);
  return isAddress(h) ? h : firstLabel(h);
}

}  // namespace

std::string normaliseHost(const std::string& host)
{
  const size_t b = host.find_first_not_of(" \t\r\n");
  if (b == std::string::npos)
    return "";
  std::string h = lower(host.substr(b, host.find_last_not_of(" \t\r\n") - b + 1));
  while (!h.empty() && h.back() == '.')
    h.pop_back();
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']')
    h = h.substr(1, h.size() - 2);
  const std::string addr = canonicalAddress(h);
  return addr.empty() ? h : addr;
}

bool isAddress(const std::string& host)
{
  return !canonicalAddress(normaliseHost(host)).empty();
}

bool isLoopback(const std::string& host)
{
  static const std::set<std::string> names = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"};
  const std::string h = normaliseHost(host);
  if (names.count(h))
    return true;
  if (h == "::1")
    return true;
  return isAddress(h) && h.find(':') == std::string::npos && h.rfind("127.", 0) == 0;
}

bool refersTo(const std::string& host, const Peer& peer)
{
  const std::string h = normaliseHost(host);
  if (h.empty())
    return false;
  if (isAddress(h))
  {
    for (const std::string& a : peer.addresses)
      if (normaliseHost(a) == h)
        return true;
    return false;
  }
  const std::string name = normaliseHost(peer.name);
  if (h == name || h == normaliseHost(peer.dns_name))
    return true;
  return h.find('.') != std::string::npos && peer.dns_name.empty() && !name.empty() && firstLabel(h) == name;
}

std::string hostOfUri(const std::string& uri)
{
  std::string rest = uri;
  const size_t scheme = rest.find("://");
  if (scheme != std::string::npos)
    rest = rest.substr(scheme + 3);
  rest = rest.substr(0, rest.find('/'));
  if (!rest.empty() && rest[0] == '[')
  {
    const size_t close = rest.find(']');
    return close == std::string::npos ? "" : rest.substr(1, close - 1);
  }
  return rest.substr(0, rest.find(':'));
}

const Peer* findPeer(const std::string& host, const PeerList* peers)
{
  if (!peers)
    return nullptr;
  for (const Peer& p : peers->peers)
    if (refersTo(host, p))
      return &p;
  return nullptr;
}

std::string machineOf(const std::string& host, const std::string& own_host, const PeerList* peers,
                      const HostAliases& aliases)
{
  const std::string h = normaliseHost(host);
  if (h.empty())
    return "";
  for (const auto& kv : aliases)
    if (normaliseHost(kv.first) == h)
    {
      const std::string m = normaliseHost(kv.second);
      return isAddress(m) ? m : firstLabel(m);
    }
  const std::string me = selfName(own_host, peers);
  if ((!own_host.empty() && h == normaliseHost(own_host)) || (peers && refersTo(h, peers->self_peer)))
    return me;
  if (const Peer* p = findPeer(h, peers))
    return p->name;
  return isLoopback(h) ? me : "";
}

std::string pathOfHost(const std::string& host, const std::string& own_host, const PeerList* peers,
                       const HostAliases& aliases)
{
  const std::string m = machineOf(host, own_host, peers, aliases);
  if (m.empty())
    return isLoopback(host) ? Peer::PATH_SELF : Peer::PATH_UNKNOWN;
  if (m == selfName(own_host, peers))
    return Peer::PATH_SELF;
  // no ~peers yet, or ~peers that tailscaled could not refresh: nothing known about the paths now
  if (!peers || peers->stale)
    return Peer::PATH_UNKNOWN;
  // one path word per machine: peers of the same name that disagree (two nodes enrolled with one
  // host name) are unknown, never the first one's path
  std::string path;
  const std::string name = normaliseHost(m);
  for (const Peer& p : peers->peers)
    if (normaliseHost(p.name) == name)
    {
      const std::string word = knownPathWord(p.path);
      if (!path.empty() && word != path)
        return Peer::PATH_UNKNOWN;
      path = word;
    }
  return path.empty() ? Peer::PATH_UNKNOWN : path;
}

std::string knownPathWord(const std::string& word)
{
  static const char* const words[] = { paths::kDirect, paths::kPeerRelay, paths::kDerp, paths::kIdle,
                                       paths::kOffline, paths::kUnknown, paths::kSelf };
  for (const char* w : words)
    if (word == w)
      return word;
  return Peer::PATH_UNKNOWN;  // "DERP", "", 10 kB of anything: not a word of Peer.msg
}

std::string shortName(const std::string& host, const std::string& own_host, const PeerList* peers,
                      const HostAliases& aliases)
{
  const std::string m = machineOf(host, own_host, peers, aliases);
  if (!m.empty())
    return m;
  if (isAddress(host))
    return host;
  return firstLabel(host);
}

int socketOfTransportInfo(const std::string& info)
{
  const std::string key = " on socket ";
  const size_t at = info.rfind(key);
  if (at == std::string::npos)
    return -1;
  const char* start = info.c_str() + at + key.size();
  char* end = nullptr;
  const long fd = std::strtol(start, &end, 10);
  if (end == start || fd < 0)
    return -1;
  return static_cast<int>(fd);
}

int peerPortOfTransportInfo(const std::string& info)
{
  const std::string to = " to [", on = " on socket ";
  const size_t start = info.rfind(to);
  const size_t end = info.rfind(on);
  if (start == std::string::npos || end == std::string::npos || end <= start + to.size())
    return -1;
  const std::string host_port = info.substr(start + to.size(), end - start - to.size());
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos || colon + 1 >= host_port.size() || host_port.size() - colon > 6)
    return -1;
  long port = 0;
  for (size_t i = colon + 1; i < host_port.size(); ++i)
  {
    if (host_port[i] < '0' || host_port[i] > '9')
      return -1;
    port = port * 10 + (host_port[i] - '0');
  }
  return port <= 65535 ? static_cast<int>(port) : -1;
}

}  // namespace overlay_manager
