"""iperf3 / ping output parsing."""
import pytest

from overlay_manager.system import iperf as L


def test_iperf_tcp_and_udp():
    assert L.parse_iperf_tcp({"end": {"sum_received": {"bits_per_second": 1.7e9}}}) == 1700.0
    assert L.parse_iperf_udp({"end": {"sum": {"jitter_ms": 0.05, "lost_percent": 1.5}}}) == (0.05, 1.5)


def test_iperf_error_mentions_server_param():
    with pytest.raises(L.LinkError, match="iperf_server"):
        L.parse_iperf_tcp({"error": "unable to connect to server: Connection refused"})
    with pytest.raises(L.LinkError, match="sum_received"):
        L.parse_iperf_tcp({"end": {}})


def test_ping_summary():
    out = ("5 packets transmitted, 5 received, 0% packet loss, time 804ms\n"
           "rtt min/avg/max/mdev = 0.512/0.845/1.302/0.270 ms\n")
    assert L.parse_ping(out) == (0.512, 0.845, 1.302)
    with pytest.raises(L.LinkError, match="no replies"):
        L.parse_ping("5 packets transmitted, 0 received, 100% packet loss")


def test_iperf_server_binds_overlay_address_only():
    assert L.iperf_server_argv("100.64.0.1", 5201) == ["iperf3", "-s", "-B", "100.64.0.1", "-p", "5201"]
