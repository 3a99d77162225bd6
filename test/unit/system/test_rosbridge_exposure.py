"""Who can reach rosbridge's port: /proc/net/tcp parsing, the nftables rules and listing, and
the "rosbridge" diagnostic entry (pure logic; the rules are applied for real in
test/system/test_rosbridge_firewall.py)."""
from __future__ import annotations

import socket

import pytest

from overlay_manager.core.commands import overlay_env_as_root
from overlay_manager.monitor.diagnose import beyond_overlay, rosbridge_diagnostic
from overlay_manager.monitor.readings import OK, WARN, PortReading
from overlay_manager.system import firewall
from overlay_manager.system.sockets import Listener, on_port, parse_proc_net_tcp, read_listeners

# Lines as this kernel prints them (x86, little-endian host order), with listeners bound to
# 0.0.0.0:9090, 127.0.0.1:9091, 100.64.0.2:9090, 10.231.0.10:9094 and an established connection.
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:2382 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 30272 1 000000003581c55d 100 0 0 10 0
   1: 0100007F:2383 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 30273 1 00000000cf506cfd 100 0 0 10 0
   2: 02004064:2382 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 30276 1 00000000cf506cfd 100 0 0 10 0
   3: 0A00E70A:2386 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 30277 1 00000000cf506cfd 100 0 0 10 0
   4: 020200C0:CBB6 507100CB:01BB 01 00000000:00000000 02:0000053E 00000000     0        0 26663 2 000000004dbb73ed 21 4 1 118 146
   5: garbage
"""  # noqa: E501
# [::]:9092, [::1]:9093, [fd7a:115c:a1e0::2]:9090, [::ffff:127.0.0.1]:9095
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:2384 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 30274 1 0000000099651322 100 0 0 10 0
   1: 00000000000000000000000001000000:2385 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 30275 1 0000000059db7017 100 0 0 10 0
   2: 5C117AFD0000E0A10000000002000000:2382 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 30278 1 0000000059db7017 100 0 0 10 0
   3: 0000000000000000FFFF00000100007F:2387 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 30279 1 0000000059db7017 100 0 0 10 0
"""  # noqa: E501

little_endian = pytest.mark.skipif(
    socket.htonl(1) == 1, reason="the recorded lines are from a little-endian kernel")


@little_endian
def test_parse_ipv4_listeners_only():
    got = parse_proc_net_tcp(TCP)
    assert got == [Listener("0.0.0.0", 9090), Listener("127.0.0.1", 9091), Listener("100.64.0.2", 9090),
                   Listener("10.231.0.10", 9094)]


@little_endian
def test_parse_ipv6():
    got = parse_proc_net_tcp(TCP6)
    assert got == [Listener("::", 9092), Listener("::1", 9093), Listener("fd7a:115c:a1e0::2", 9090),
                   Listener("::ffff:127.0.0.1", 9095)]
    assert [x.loopback for x in got] == [False, True, False, True]
    assert [x.wildcard for x in got] == [True, False, False, False]


def test_header_only_and_empty():
    assert parse_proc_net_tcp("") == []
    assert parse_proc_net_tcp(TCP.splitlines()[0]) == []


def test_read_listeners_finds_a_real_socket(tmp_path):
    """A real listening socket on loopback shows up in this namespace's /proc/net/tcp."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        listeners, error = read_listeners()
        assert error == ""
        assert on_port(listeners, port) == [Listener("127.0.0.1", port)]
    missing = tmp_path / "tcp"
    listeners, error = read_listeners([str(missing), str(tmp_path / "tcp6")])
    assert listeners == [] and error == f"{missing} does not exist"  # a missing tcp6 is fine


def test_on_port_sorted_and_unique():
    xs = [Listener("::", 1), Listener("0.0.0.0", 1), Listener("0.0.0.0", 1), Listener("1.2.3.4", 2)]
    assert on_port(xs, 1) == [Listener("0.0.0.0", 1), Listener("::", 1)]


# ----- nftables rules ------------------------------------------------------------------------
def test_ruleset_accepts_lo_and_overlay_then_drops():
    text = firewall.ruleset(9090, "tailscale0")
    lines = [x.strip() for x in text.splitlines()]
    assert lines[1:3] == ["table inet overlay_manager", "delete table inet overlay_manager"]
    rules = [x for x in lines if x.startswith("tcp dport")]
    assert rules == ['tcp dport 9090 iifname "lo" accept', 'tcp dport 9090 iifname "tailscale0" accept',
                     "tcp dport 9090 counter drop"]
    assert "policy accept;" in text  # everything else is left to the machine's own firewall


@pytest.mark.parametrize("port,iface,word", [
    (0, "tailscale0", "not a TCP port"), (70000, "tailscale0", "not a TCP port"),
    (9090, 'x" accept', "not an interface name"), (9090, "a" * 16, "not an interface name"),
    (9090, "", "not an interface name"),
])
def test_ruleset_refuses_bad_args(port, iface, word):
    with pytest.raises(firewall.FirewallError, match=word):
        firewall.ruleset(port, iface)


@pytest.mark.parametrize("value,port", [("9090", 9090), ("0", 0), (" 8080", 8080)])
def test_optional_port(value, port):
    assert firewall.optional_port(value) == port


@pytest.mark.parametrize("value", ["x", "-1", "65536", ""])
def test_optional_port_refuses(value):
    with pytest.raises(firewall.FirewallError, match="--rosbridge-firewall"):
        firewall.optional_port(value)


# `nft list table inet overlay_manager` as nft 1.0.6 prints the ruleset above
LISTING = """\
table inet overlay_manager {
\tchain rosbridge_input {
\t\ttype filter hook input priority filter - 10; policy accept;
\t\ttcp dport 9090 iifname "lo" accept
\t\ttcp dport 9090 iifname "tailscale0" accept
\t\ttcp dport 9090 counter packets 3 bytes 180 drop
\t}
}
"""


def test_parse_listing():
    assert firewall.parse_listing(LISTING, 9090) == (True, ("lo", "tailscale0"))
    assert firewall.parse_listing(LISTING, 9091) == (False, ())
    only_accepts = "\n".join(x for x in LISTING.splitlines() if "drop" not in x)
    assert firewall.parse_listing(only_accepts, 9090) == (False, ("lo", "tailscale0"))


def test_read_restriction_without_nft():
    r = firewall.read_restriction(9090, nft="/nonexistent/nft")
    assert r.state == firewall.UNKNOWN and "not installed" in r.detail


# ----- the "rosbridge" diagnostic ------------------------------------------------------------
OWN = ("100.64.0.2", "fd7a:115c:a1e0::2")


def reading(*addrs: str, restriction=None, error="") -> PortReading:
    return PortReading(9090, tuple(Listener(a, 9090) for a in addrs), error, restriction)


def test_not_checked():
    assert rosbridge_diagnostic(None, OWN) is None
    assert rosbridge_diagnostic(PortReading(0), OWN) is None


def test_overlay_and_loopback_only_is_ok():
    d = rosbridge_diagnostic(reading("127.0.0.1", "100.64.0.2", "::1"), OWN)
    assert d.level == OK and d.name == "rosbridge" and "loopback/overlay addresses only" in d.message
    assert beyond_overlay(reading("100.64.0.9"), OWN) == []  # another overlay address: still the overlay


def test_every_interface_without_table_warns_with_fix():
    missing = firewall.Restriction(firewall.MISSING, "no nftables table inet overlay_manager")
    d = rosbridge_diagnostic(reading("0.0.0.0", restriction=missing), OWN)
    assert d.level == WARN
    assert "reachable beyond the overlay" in d.message and "0.0.0.0" in d.message
    assert "overlay_env --rosbridge-firewall 9090" in d.message
    assert ("nftables", "missing: no nftables table inet overlay_manager") in d.values


def test_lan_address_is_beyond_the_overlay():
    assert beyond_overlay(reading("10.231.0.10", "::", "::ffff:127.0.0.1"), OWN) == ["10.231.0.10", "::"]


def test_every_interface_restricted_is_ok():
    ok = firewall.Restriction(firewall.RESTRICTED, "nftables table inet overlay_manager accepts TCP port "
                                                   "9090 only on lo, tailscale0")
    d = rosbridge_diagnostic(reading("0.0.0.0", "::", restriction=ok), OWN)
    assert d.level == OK and "restricted" in d.message and "tailscale0" in d.message


def test_cannot_tell_says_so_with_fix():
    unknown = firewall.Restriction(firewall.UNKNOWN, "cannot tell whether nftables restricts it: reading "
                                                     "nftables needs root (the node is not running as root)")
    d = rosbridge_diagnostic(reading("0.0.0.0", restriction=unknown), OWN)
    assert d.level == WARN and "cannot tell" in d.message and "needs root" in d.message
    assert f"fix if not done: `{overlay_env_as_root('--rosbridge-firewall 9090')}`" in d.message


def test_nothing_listening_warns():
    d = rosbridge_diagnostic(reading(), OWN)
    assert d.level == WARN and "nothing listens on TCP port 9090" in d.message
    d = rosbridge_diagnostic(reading(error="cannot read /proc/net/tcp: Permission denied"), OWN)
    assert d.level == WARN and "cannot read the listening sockets" in d.message


# ----- overlay_env --rosbridge-firewall: argument errors (no root needed) ----------------------
def test_overlay_env_rejects_bad_firewall_args(capsys):
    from overlay_manager.cli.overlay_env import main
    assert main(["--rosbridge-firewall", "http"]) == 1
    assert "give a TCP port" in capsys.readouterr().err
    assert main(["--rosbridge-firewall", "9090", "--overlay-interface", "a b"]) == 1
    assert "not an interface name" in capsys.readouterr().err
