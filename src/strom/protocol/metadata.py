"""Metadata requests read and responses written by hand (v0-v13), so that their cost follows
the response and not the codec's objects; DescribeTopicPartitions requests read the same way.

A Metadata request may name a million topics (the frame size is the only bound, as in Kafka).
Through the codec each name became an object, each answer a dict, then a codec object, then
bytes: four such requests took a broker to 2.65 GB. Here the request is checked once where it
lies, in the frame, and its names are decoded one at a time as the handler asks for them
(`MetadataRequest.topics`); the answer is written entry by entry into one buffer
(`MetadataResponseWriter`). Layout per Kafka's MetadataRequest/MetadataResponse schemas: flexible
from v9, topic ids from v10, nullable names from v12, a top-level error code from v13.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass

from strom.protocol.produce import MalformedRequest
from strom.protocol.varint import VarintError, read_uvarint, skip_tagged_fields, write_uvarint

MAX_VERSION = 13
FLEXIBLE_FROM, TOPIC_IDS_FROM = 9, 10
_I16, _I32 = struct.Struct(">h"), struct.Struct(">i")
_PARTITION_HEAD = struct.Struct(">hii")  # error code, index, leader
_NO_ID = bytes(16)
NOT_REQUESTED = -(2**31)  # authorized operations not asked for


@dataclass(slots=True)
class MetadataRequest:
    """A checked Metadata request whose topic names stay in the frame until iterated."""

    version: int
    topic_count: int  # -1: every topic (a null array; an empty one at v0)
    allow_auto_topic_creation: bool
    include_cluster_authorized_operations: bool
    include_topic_authorized_operations: bool
    _buf: Buffer
    _topics_at: int

    @property
    def all_topics(self) -> bool:
        return self.topic_count < 0

    def topics(self) -> Iterator[tuple[uuid.UUID | None, str | None]]:
        """(topic id or None, name or None) of each requested topic, in request order."""
        return _topics(self._buf, self._topics_at, max(self.topic_count, 0), self.version, decode=True)


Buffer = bytes | bytearray | memoryview  # anything indexable to ints and sliceable to bytes


def parse_metadata_request(buf: Buffer, start: int, version: int) -> MetadataRequest:
    """Check the body at `buf[start:]` (lengths, UTF-8, nulls where the schema allows none,
    tagged fields) without keeping what it decodes; raise MalformedRequest where the codec
    would fail. `buf` is the frame itself, read in place."""
    flexible = version >= FLEXIBLE_FROM
    try:
        count, pos = _read_length(buf, start, flexible)
        if count < 0 and version < 1:
            raise MalformedRequest("non-nullable field topics was null")
        topics_at = pos
        if count > 0:
            pos = run_to_end(_topics(buf, pos, count, version, decode=False))
        allow, include_cluster, include_topic = True, False, False
        if version >= 4:
            allow, pos = _read_bool(buf, pos)
        if 8 <= version <= 10:
            include_cluster, pos = _read_bool(buf, pos)
        if version >= 8:
            include_topic, pos = _read_bool(buf, pos)
        if flexible:
            pos = skip_tagged_fields(buf, pos)
    except (VarintError, UnicodeDecodeError, struct.error, IndexError) as e:
        raise MalformedRequest(str(e) or "a field runs past the end of the request") from None
    if count == 0 and version == 0:
        count = -1  # v0 asks for every topic with an empty array
    return MetadataRequest(version, count, allow, include_cluster, include_topic, buf, topics_at)


def run_to_end(walk: Generator[object, None, int]) -> int:
    """Run a request walker that yields its entries and returns where it stopped, for the
    checks it makes along the way; the end position."""
    while True:
        try:
            next(walk)
        except StopIteration as done:
            return done.value


def _read_length(buf: Buffer, pos: int, flexible: bool) -> tuple[int, int]:
    """An array's element count (-1 for null)."""
    if flexible:
        n, pos = read_uvarint(buf, pos)
        return n - 1, pos
    if pos + 4 > len(buf):
        raise MalformedRequest("a field runs past the end of the request")
    return _I32.unpack_from(buf, pos)[0], pos + 4


def _read_bool(buf: Buffer, pos: int) -> tuple[bool, int]:
    if pos >= len(buf):
        raise MalformedRequest("a field runs past the end of the request")
    return buf[pos] != 0, pos + 1


def _topics(buf: Buffer, pos: int, count: int, version: int, decode: bool
            ) -> Generator[tuple[uuid.UUID | None, str | None], None, int]:
    """The topics array from `pos`: (topic id, name) per topic, decoded or (`decode` False)
    only checked; returns the position after the array. One loop with the common cases inline
    (one-byte lengths, no tagged fields): a million topics are read in about a second."""
    flexible, ids, size = version >= FLEXIBLE_FROM, version >= TOPIC_IDS_FROM, len(buf)
    topic_id = None
    for _ in range(count):
        if ids:
            if pos + 16 > size:
                raise MalformedRequest("a field runs past the end of the request")
            if decode:
                raw = bytes(buf[pos : pos + 16])
                topic_id = None if raw == _NO_ID else uuid.UUID(bytes=raw)
            pos += 16
        if flexible:
            n = buf[pos]
            if n < 0x80:
                pos += 1
            else:
                n, pos = read_uvarint(buf, pos)
            n -= 1
        else:
            if pos + 2 > size:
                raise MalformedRequest("a field runs past the end of the request")
            n = _I16.unpack_from(buf, pos)[0]
            pos += 2
        if n < 0:
            if not ids:
                raise MalformedRequest("non-nullable field topics.name was null")
            name = None
        else:
            if pos + n > size:
                raise MalformedRequest(f"a field runs {pos + n - size} bytes past the end of the request")
            name = str(buf[pos : pos + n], "utf-8")
            pos += n
        if flexible:
            if buf[pos] == 0:
                pos += 1
            else:
                pos = skip_tagged_fields(buf, pos)
        yield topic_id, name
    return pos


@dataclass(slots=True)
class DescribeTopicPartitionsRequest:
    """A checked DescribeTopicPartitions (v0) request; its names stay in the frame."""

    topic_count: int
    response_partition_limit: int
    cursor: tuple[str, int] | None  # (topic name, partition index)
    _buf: Buffer
    _topics_at: int

    def names(self) -> Iterator[str]:
        return (name for _, name in _topics(self._buf, self._topics_at, self.topic_count, FLEXIBLE_FROM, True))


def parse_describe_topic_partitions_request(buf: Buffer, start: int, version: int) -> DescribeTopicPartitionsRequest:
    """Topics as Metadata v9 names them (compact strings, tagged fields), a partition limit,
    a nullable cursor; MalformedRequest where the codec would fail."""
    try:
        count, pos = _read_length(buf, start, True)
        if count < 0:
            raise MalformedRequest("non-nullable field topics was null")
        topics_at = pos
        pos = run_to_end(_topics(buf, pos, count, FLEXIBLE_FROM, decode=False))
        (limit,), pos = _I32.unpack_from(buf, pos), pos + 4
        cursor = None
        if buf[pos] == 0xFF:
            pos += 1
        else:
            n, pos = read_uvarint(buf, pos + 1)
            if n == 0:
                raise MalformedRequest("non-nullable field cursor.topic_name was null")
            if pos + n - 1 > len(buf):
                raise MalformedRequest("a field runs past the end of the request")
            name = str(buf[pos : pos + n - 1], "utf-8")
            (index,) = _I32.unpack_from(buf, pos + n - 1)
            pos = skip_tagged_fields(buf, pos + n + 3)
            cursor = (name, index)
        skip_tagged_fields(buf, pos)
    except (VarintError, UnicodeDecodeError, struct.error, IndexError) as e:
        raise MalformedRequest(str(e) or "a field runs past the end of the request") from None
    return DescribeTopicPartitionsRequest(count, limit, cursor, buf, topics_at)


@dataclass(frozen=True, slots=True)
class PartitionEntry:
    error_code: int
    index: int
    leader: int
    leader_epoch: int
    replicas: Sequence[int]
    isr: Sequence[int]
    offline: Sequence[int]


class MetadataResponseWriter:
    """A Metadata response written as it is built: `topic` appends one entry's bytes, `parts`
    gives the whole body as a few buffers (no copy of the entries)."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.flexible = version >= FLEXIBLE_FROM
        self._topics = bytearray()
        self.topic_count = 0
        self._error_tail: bytes | None = None

    # --- pieces --------------------------------------------------------------------------
    def _length(self, n: int) -> bytes:
        return write_uvarint(n + 1) if self.flexible else _I32.pack(n)

    def _string(self, s: str | None) -> bytes:
        if s is None:
            return b"\x00" if self.flexible else b"\xff\xff"
        raw = s.encode()
        return (write_uvarint(len(raw) + 1) if self.flexible else _I16.pack(len(raw))) + raw

    def _ints(self, values: Sequence[int]) -> bytes:
        return self._length(len(values)) + struct.pack(f">{len(values)}i", *values)

    # --- the body ------------------------------------------------------------------------
    def error(self, error_code: int, name: str | None) -> None:
        """The entry of a topic that is not described (unknown, refused): its error and name,
        every other field its default. The common entry of a hostile request, so one append
        of precomputed bytes each."""
        if self._error_tail is None:
            self._error_tail = bytes(self._entry_tail())
        raw = None if name is None else name.encode()
        out = self._topics
        out += _I16.pack(error_code)
        if raw is None:
            out += b"\x00" if self.flexible else b"\xff\xff"
        else:
            n = len(raw)
            out += (bytes((n + 1,)) if n < 127 else write_uvarint(n + 1)) if self.flexible else _I16.pack(n)
            out += raw
        out += self._error_tail
        self.topic_count += 1

    def _entry_tail(self) -> bytearray:
        """What follows the name in an undescribed topic's entry."""
        v, tail = self.version, bytearray()
        if v >= TOPIC_IDS_FROM:
            tail += _NO_ID
        if v >= 1:
            tail.append(0)  # is_internal
        tail += self._length(0)  # no partitions
        if v >= 8:
            tail += _I32.pack(NOT_REQUESTED)
        if self.flexible:
            tail.append(0)
        return tail

    def topic(self, error_code: int, name: str | None, topic_id: uuid.UUID | None = None,
              is_internal: bool = False, partitions: Iterable[PartitionEntry] = (),
              authorized_operations: int = NOT_REQUESTED, partition_count: int = 0) -> None:
        """One topic's entry; `partition_count` is how many `partitions` yields."""
        v, out = self.version, self._topics
        out += _I16.pack(error_code)
        out += self._string(name)  # null for an unknown topic id (the codec does so before v12 too)
        if v >= TOPIC_IDS_FROM:
            out += topic_id.bytes if topic_id is not None else _NO_ID
        if v >= 1:
            out.append(1 if is_internal else 0)
        out += self._length(partition_count)
        for p in partitions:
            out += _PARTITION_HEAD.pack(p.error_code, p.index, p.leader)
            if v >= 7:
                out += _I32.pack(p.leader_epoch)
            out += self._ints(p.replicas)
            out += self._ints(p.isr)
            if v >= 5:
                out += self._ints(p.offline)
            if self.flexible:
                out.append(0)
        if v >= 8:
            out += _I32.pack(authorized_operations)
        if self.flexible:
            out.append(0)
        self.topic_count += 1

    def parts(self, brokers: Sequence[tuple[int, str, int, str | None]], cluster_id: str | None,
              controller_id: int, cluster_authorized_operations: int = NOT_REQUESTED,
              error_code: int = 0, throttle_time_ms: int = 0) -> list[bytes | bytearray]:
        """The response body: (node id, host, port, rack) of each broker, then the topics
        written so far. The first four bytes are throttle_time_ms from v3."""
        v = self.version
        head = bytearray()
        if v >= 3:
            head += _I32.pack(throttle_time_ms)
        head += self._length(len(brokers))
        for node_id, host, port, rack in brokers:
            head += _I32.pack(node_id) + self._string(host) + _I32.pack(port)
            if v >= 1:
                head += self._string(rack)
            if self.flexible:
                head.append(0)
        if v >= 2:
            head += self._string(cluster_id)
        if v >= 1:
            head += _I32.pack(controller_id)
        head += self._length(self.topic_count)
        tail = bytearray()
        if 8 <= v <= 10:
            tail += _I32.pack(cluster_authorized_operations)
        if v >= 13:
            tail += _I16.pack(error_code)
        if self.flexible:
            tail.append(0)
        return [bytes(head), self._topics, bytes(tail)]


def undescribed_topic_entry(error_code: int, name: str | None) -> bytes:
    """A DescribeTopicPartitions (v0) entry for a topic that is not described (unknown,
    refused): every field but the error and the name at its default. The same bytes as a
    Metadata v10 entry of that kind, whose fields and order these are."""
    writer = MetadataResponseWriter(TOPIC_IDS_FROM)
    writer.error(error_code, name)
    return bytes(writer._topics)
