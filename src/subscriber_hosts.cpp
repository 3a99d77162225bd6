// Subscriber machine and path helpers (see subscriber_hosts.h).
#include "overlay_manager/subscriber_hosts.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace overlay_manager
{
namespace
{
std::string normalise(std::string s)
{
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  while (!s.empty() && s.back() == '.')
    s.pop_back();
  return s;
}

bool isAddress(const std::string& host)
{
  if (host.find(':') != std::string::npos)
    return true;  // IPv6
  return !host.empty() && std::all_of(host.begin(), host.end(), [](char c) { return std::isdigit(c) || c == '.'; });
}

bool isLoopback(const std::string& h)
{
  return h == "localhost" || h.rfind("127.", 0) == 0 || h == "::1";
}

bool names(const Peer& p, const std::string& h)
{
  if (h.empty())
    return false;
  if (normalise(p.dns_name) == h || normalise(p.name) == h)
    return true;
  if (!isAddress(h) && !p.name.empty() && h.substr(0, h.find('.')) == normalise(p.name) &&
      (p.dns_name.empty() || h.find('.') == std::string::npos))
    return true;
  for (const std::string& a : p.addresses)
    if (normalise(a) == h)
      return true;
  return false;
}
}  // namespace

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
  const std::string h = normalise(host);
  for (const Peer& p : peers->peers)
    if (names(p, h))
      return &p;
  return nullptr;
}

std::string pathOfHost(const std::string& host, const std::string& own_host, const PeerList* peers)
{
  const std::string h = normalise(host);
  if (h.empty())
    return "unknown";
  if (peers && names(peers->self_peer, h))
    return "local";
  // a peer that names the host wins over the loopback rule (tests give peers 127.0.0.x addresses)
  const Peer* p = findPeer(h, peers);
  if (p && !p->path.empty())
    return p->path == Peer::PATH_SELF ? "local" : p->path;
  if (isLoopback(h) || h == normalise(own_host))
    return "local";
  return "unknown";
}

std::string shortName(const std::string& host, const PeerList* peers)
{
  const Peer* p = findPeer(host, peers);
  if (p && !p->name.empty())
    return p->name;
  if (peers && names(peers->self_peer, normalise(host)) && !peers->self_peer.name.empty())
    return peers->self_peer.name;
  if (isAddress(host))
    return host;
  return host.substr(0, host.find('.'));
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

}  // namespace overlay_manager
