"""The "consumer" embedded protocol: what consumers put in JoinGroup metadata and SyncGroup
assignments (ConsumerProtocolSubscription / ConsumerProtocolAssignment, versions 0-3).

The coordinator treats these bytes as opaque for the rebalance itself (clients assign), and
reads them only where Kafka does: the subscribed topics of a group (OffsetDelete refuses to
delete offsets of a topic the group consumes; offsets of subscribed topics do not expire) and
the assignments shown by DescribeGroups tools. A newer version is read with the fields known
here, as Kafka does, and bytes that do not parse give an empty result rather than an error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

PROTOCOL_TYPE = "consumer"


@dataclass(slots=True)
class Subscription:
    topics: list[str] = field(default_factory=list)
    user_data: bytes | None = None
    owned_partitions: dict[str, list[int]] = field(default_factory=dict)
    generation_id: int = -1
    rack_id: str | None = None


@dataclass(slots=True)
class Assignment:
    partitions: dict[str, list[int]] = field(default_factory=dict)
    user_data: bytes | None = None


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def unpack(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str | None:
        n = self.unpack(">h")
        if n < 0:
            return None
        end = self.pos + n
        if end > len(self.data):
            raise struct.error("string runs past the end")
        out = self.data[self.pos : end].decode("utf-8", "replace")
        self.pos = end
        return out

    def bytes_(self) -> bytes | None:
        n = self.unpack(">i")
        if n < 0:
            return None
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return bytes(out)

    def topic_partitions(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for _ in range(self.unpack(">i")):
            topic = self.string() or ""
            out.setdefault(topic, []).extend(self.unpack(">i") for _ in range(self.unpack(">i")))
        return out

    @property
    def at_end(self) -> bool:
        return self.pos >= len(self.data)


def decode_subscription(data: bytes | None) -> Subscription:
    sub = Subscription()
    if not data:
        return sub
    c = _Cursor(bytes(data))
    try:
        version = c.unpack(">h")
        sub.topics = [c.string() or "" for _ in range(c.unpack(">i"))]
        sub.user_data = c.bytes_()
        if version >= 1 and not c.at_end:
            sub.owned_partitions = c.topic_partitions()
        if version >= 2 and not c.at_end:
            sub.generation_id = c.unpack(">i")
        if version >= 3 and not c.at_end:
            sub.rack_id = c.string()
    except struct.error:
        pass  # keep what parsed; the coordinator never rejects a member for its metadata
    return sub


def decode_assignment(data: bytes | None) -> Assignment:
    out = Assignment()
    if not data:
        return out
    c = _Cursor(bytes(data))
    try:
        c.unpack(">h")
        out.partitions = c.topic_partitions()
        out.user_data = c.bytes_()
    except struct.error:
        pass
    return out


def encode_subscription(topics: list[str], version: int = 0) -> bytes:
    """A minimal subscription (tests and tools that join a group without a client library)."""
    body = struct.pack(">hi", version, len(topics))
    for t in topics:
        raw = t.encode()
        body += struct.pack(">h", len(raw)) + raw
    body += struct.pack(">i", -1)  # no user data
    if version >= 1:
        body += struct.pack(">i", 0)  # no owned partitions
    if version >= 2:
        body += struct.pack(">i", -1)
    if version >= 3:
        body += struct.pack(">h", -1)
    return body


def encode_assignment(partitions: dict[str, list[int]], version: int = 0) -> bytes:
    body = struct.pack(">hi", version, len(partitions))
    for topic, parts in partitions.items():
        raw = topic.encode()
        body += struct.pack(">h", len(raw)) + raw + struct.pack(f">i{len(parts)}i", len(parts), *parts)
    return body + struct.pack(">i", -1)
