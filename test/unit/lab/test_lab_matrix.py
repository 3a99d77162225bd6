"""The NAT-matrix model (RFC 4787 reasoning) gives the outcomes eduP2P's published table expects."""
import pytest

from overlay_manager.lab.matrix.model import expected, rule_of_thumb, why_not_rule_of_thumb


@pytest.mark.parametrize("a,b,path", [
    ("eim-adpf", "eim-adpf", "direct"),     # both endpoint-independent mapping
    ("eim-eif", "adpm-adpf", "direct"),     # the full-cone side lets the first packet in
    ("eim-adpf", "adpm-adpf", "derp"),      # port-restricted vs symmetric
    ("adpm-adpf", "adpm-adpf", "derp"),     # symmetric on both sides
    ("udp-blocked", "eim-eif", "derp"),
    ("tcp-only", "eim-adpf", "derp"),
    ("eim-adf", "adpm-adpf", "direct"),     # ADF does not check the peer's (changed) port
])
def test_expected_paths(a, b, path):
    assert expected(a, b)[0] == path
    assert expected(b, a)[0] == path  # symmetric


def test_rule_of_thumb_disagreement_is_explained():
    assert rule_of_thumb("eim-adf", "adpm-adpf") == "derp"
    note = why_not_rule_of_thumb("eim-adf", "adpm-adpf", "direct")
    assert "address-dependent filtering does not check the peer's port" in note
    assert why_not_rule_of_thumb("eim-adpf", "eim-adpf", "direct") == ""
    assert "not explained" in why_not_rule_of_thumb("adpm-adpf", "adpm-adpf", "direct")
