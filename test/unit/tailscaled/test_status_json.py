"""StatusDecoder: the same result as json.loads on every body, and unchanged peers reused."""
import copy
import json
import os
import random

import pytest

from overlay_manager.tailscaled.status_json import StatusDecoder
from overlay_manager.testing.tsfake import recorded, status_body

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data")


def _fleet(n):
    """The recorded status with its one peer cloned into n (keys sorted as tailscaled writes them)."""
    st = recorded("status_direct.json")
    (_, proto), = st["Peer"].items()
    peers = {}
    for i in range(n):
        p = copy.deepcopy(proto)
        key = f"nodekey:{i + 2:064x}"
        p.update(ID=str(i + 2), PublicKey=key, HostName=f"robot-{i:03d}", RxBytes=i)
        peers[key] = p
    st["Peer"] = peers
    return st


def _text(st):
    return status_body(st).decode()


def _same_outcome(dec, text):
    """Decoder and json.loads agree: equal documents, or the same exception and message."""
    try:
        want = json.loads(text)
    except (ValueError, RecursionError) as exc:
        with pytest.raises(type(exc)) as got:
            dec.decode(text)
        assert str(got.value) == str(exc)
        return None
    got = dec.decode(text)
    assert got == want and list(got) == list(want)
    if isinstance(want, dict) and isinstance(want.get("Peer"), dict):
        assert list(got["Peer"]) == list(want["Peer"])
    return got


def test_recorded_bodies_decode_like_json_loads():
    for name in sorted(os.listdir(DATA)):
        if name.startswith("status") and name.endswith(".json"):
            with open(os.path.join(DATA, name), encoding="utf-8") as f:
                raw = f.read()
            dec = StatusDecoder()
            _same_outcome(dec, raw)
            _same_outcome(dec, raw)
            assert dec.reused == len(json.loads(raw).get("Peer") or {}), name


def test_unchanged_peers_are_the_same_objects_changed_ones_are_new():
    st = _fleet(50)
    dec = StatusDecoder()
    first = _same_outcome(dec, _text(st))
    keys = list(st["Peer"])
    st["Peer"][keys[3]]["RxBytes"] = 10 ** 9
    st["Peer"][keys[49]]["CurAddr"] = ""
    second = _same_outcome(dec, _text(st))
    assert dec.reused == 48
    assert second["Peer"][keys[0]] is first["Peer"][keys[0]]
    assert second["Peer"][keys[3]] is not first["Peer"][keys[3]] and second["Peer"][keys[3]]["RxBytes"] == 10 ** 9
    assert second["Self"] is not first["Self"]  # the rest of the document is always decoded


def test_peers_joining_leaving_and_the_map_emptying():
    st = _fleet(20)
    dec = StatusDecoder()
    _same_outcome(dec, _text(st))
    keys = list(st["Peer"])
    del st["Peer"][keys[5]]                           # one leaves: the ones after it move up
    _same_outcome(dec, _text(st))
    assert dec.reused == 5
    _same_outcome(dec, _text(st))
    assert dec.reused == 19
    st["Peer"]["nodekey:" + "f" * 64] = copy.deepcopy(st["Peer"][keys[0]])  # one joins, at the end
    _same_outcome(dec, _text(st))
    assert dec.reused == 18  # the one before it now ends with a comma
    last = _text(st)
    st["Peer"] = {}
    _same_outcome(dec, _text(st))
    st.pop("Peer")
    _same_outcome(dec, _text(st))
    _same_outcome(dec, last)                          # after a fallback: decoded whole, then reused
    _same_outcome(dec, last)
    assert dec.reused == 20


def test_other_layouts_and_odd_documents_fall_back_to_json():
    st = _fleet(3)
    dec = StatusDecoder()
    _same_outcome(dec, json.dumps(st))                            # compact
    _same_outcome(dec, json.dumps(st, indent=2))                  # other indentation
    text = _text(st)
    _same_outcome(dec, text.replace('"nodekey:', '"node\\u006bey:', 1))  # an escaped key
    _same_outcome(dec, text + text)                               # two documents
    _same_outcome(dec, text.replace('\n\t"User"', '\n\t"Peer": {},\n\t"User"'))  # "Peer" twice
    _same_outcome(dec, "[" + text + "]")
    _same_outcome(dec, json.dumps({"Peer": {"k": 1}}, indent="\t"))
    keys = list(st["Peer"])
    broken = text.replace(f'\n\t\t"{keys[1]}"', f'\n\t\t"{keys[1]}" ', 1)
    _same_outcome(dec, broken)


@pytest.mark.parametrize("cut", ["truncated", "comma", "garbage", "flip"])
def test_broken_bodies_raise_what_json_raises(cut):
    """Seeded mutations of an indented body: the decoder (warm, with every peer cached) agrees
    with json.loads on each, result or error message."""
    rng = random.Random(f"status-json-{cut}")
    base = _text(_fleet(8))
    for _ in range(150):
        dec = StatusDecoder()
        dec.decode(base)
        i = rng.randrange(len(base))
        if cut == "truncated":
            text = base[:i]
        elif cut == "comma":
            j = base.find(",\n\t\t\"", i)
            text = base[:j] + base[j + 1:] if j >= 0 else base.rstrip()[:-1] + ",}"
        elif cut == "garbage":
            text = base[:i] + rng.choice(["\x00", "}", "{", '"', ",", "\n\t\t\"", "\n\t}", "\\"]) + base[i:]
        else:
            text = base[:i] + chr(rng.randrange(32, 127)) + base[i + 1:]
        _same_outcome(dec, text)
        _same_outcome(dec, base)
