"""IdentityMemo: values reused for the same source object and extra, built again otherwise."""
from overlay_manager.core.memo import IdentityMemo


class Src:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):  # equal values must still count as different sources
        return isinstance(other, Src) and other.v == self.v

    __hash__ = object.__hash__


def test_same_object_reused_equal_copy_and_changed_extra_rebuilt():
    built = []

    def build(s):
        built.append(s.v)
        return f"value {s.v}"

    memo = IdentityMemo()
    a, b = Src(1), Src(2)
    assert memo.map([a, b], build) == ["value 1", "value 2"] and built == [1, 2]
    assert memo.map([a, b], build) == ["value 1", "value 2"] and built == [1, 2]
    assert memo.map([Src(1), b], build) == ["value 1", "value 2"] and built == [1, 2, 1]  # equal, not same
    extra = {"k": 0}
    memo.map([b], build, extra=lambda s: extra["k"])
    assert built == [1, 2, 1, 2]                       # extra None -> 0: rebuilt
    memo.map([b], build, extra=lambda s: extra["k"])
    assert built == [1, 2, 1, 2]
    extra["k"] = 1
    memo.map([b], build, extra=lambda s: extra["k"])
    assert built == [1, 2, 1, 2, 2]


def test_sources_not_given_again_are_forgotten():
    built = []
    memo = IdentityMemo()
    a, b = Src(1), Src(2)
    memo.map([a, b], lambda s: built.append(s.v) or s.v)
    memo.map([b], lambda s: built.append(s.v) or s.v)
    memo.map([a, b], lambda s: built.append(s.v) or s.v)
    assert built == [1, 2, 1]
