"""Serialize big arrays of messages once per element, not once per publish.

At 500 peers the node publishes ``~peers`` (500 ``Peer``) and ``/diagnostics`` (500
``DiagnosticStatus``) every second, and genpy serializes each element field by field in Python:
about 3 ms for each array at 500 elements, every publish, although only the few peers that carry
traffic changed. Here each element is serialized once, when it is built, and kept as bytes while
it is unchanged (with its peer: core.peers.PeerState.derived, ros/messages.py); the message written
on the wire is the same byte for byte.

ROS 1 writes a nested message as the plain concatenation of its fields (no alignment, no tags),
and an array of messages as a little-endian uint32 count followed by the elements. So a message
whose *last* field is an array of messages serializes as: every other field as genpy writes it,
the count, then the elements' bytes. :func:`cached_tail_class` makes a subclass of a generated
message class that does exactly that from bytes given to it; it has the same ``_type`` and
``_md5sum``, so rospy publishers and every subscriber treat it as the original type.
"""

from __future__ import annotations

import io
import struct
from typing import Any, Optional, Tuple, Type

_COUNT = struct.Struct("<I")


def to_bytes(msg: Any) -> bytes:
    """msg serialized as genpy writes it (no length prefix)."""
    buf = io.BytesIO()
    msg.serialize(buf)
    return buf.getvalue()


def cached_tail_class(msg_cls: Type[Any], field: str) -> Type[Any]:
    """A subclass of the genpy message class msg_cls that serializes its last field (an array of
    messages named field) from bytes set with ``set_tail`` instead of from the element objects.

    The element objects stay in the field (readers of the message see them); the bytes must be
    their serialization, in order (ros/messages.py takes both from the same peers). Without
    ``set_tail`` it serializes like msg_cls.

    Raises:
        ValueError: field is not the last field of msg_cls, or not an array of messages.
    """
    slots = list(msg_cls.__slots__)
    types = list(msg_cls._slot_types)
    if not slots or slots[-1] != field or not types[-1].endswith("[]") or "/" not in types[-1]:
        raise ValueError(f"{msg_cls._type}: {field!r} is not its last field as an array of messages "
                         f"(fields: {', '.join(f'{t} {s}' for s, t in zip(slots, types))})")

    class Cached(msg_cls):  # type: ignore[misc, valid-type]
        # no __slots__ of its own: genpy's constructor and accessors read self.__slots__, which
        # must stay the message's fields; _tail lives in the instance __dict__

        def __init__(self, *args: Any, **kwds: Any) -> None:
            super().__init__(*args, **kwds)
            self._tail: Optional[Tuple[int, bytes]] = None

        def set_tail(self, count: int, data: bytes) -> None:
            """The serialized elements of the array field (count of them, concatenated)."""
            self._tail = (count, data)

        def serialize(self, buff: Any) -> None:
            tail = self._tail
            if tail is None:
                super().serialize(buff)
                return
            items = getattr(self, field)
            setattr(self, field, [])
            try:
                super().serialize(buff)  # ends with the empty array's count: uint32 0
            finally:
                setattr(self, field, items)
            buff.seek(buff.tell() - _COUNT.size)
            buff.write(_COUNT.pack(tail[0]))
            buff.write(tail[1])

    Cached.__name__ = Cached.__qualname__ = f"Cached{msg_cls.__name__}"
    return Cached
