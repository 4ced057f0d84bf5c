"""ListOffsets requests read and responses written by hand (v1-v11), for the same reason as
metadata.py: a request may name a million partitions, and through the codec each became an
object, then a dict, then an object again (600 MB for a 17 MB request). Here the request is
checked where it lies in the frame and read one partition at a time; the answer is written
as it is made. Layout per Kafka's ListOffsetsRequest/Response schemas: flexible from v6.
"""

from __future__ import annotations

import struct
from collections.abc import Generator, Iterator
from dataclasses import dataclass

from strom.protocol.metadata import Buffer, run_to_end
from strom.protocol.produce import MalformedRequest
from strom.protocol.varint import VarintError, read_uvarint, skip_tagged_fields, write_uvarint

MIN_VERSION, MAX_VERSION, FLEXIBLE_FROM = 1, 11, 6
_I16, _I32 = struct.Struct(">h"), struct.Struct(">i")
_HEAD = struct.Struct(">ib")  # replica id, isolation level (v2+)
_PARTITION_V1 = struct.Struct(">iq")  # index, timestamp
_PARTITION_V4 = struct.Struct(">iiq")  # index, current leader epoch, timestamp
_ANSWER_V1 = struct.Struct(">ihqq")  # index, error, timestamp, offset
_ANSWER_V4 = struct.Struct(">ihqqi")  # ... leader epoch


@dataclass(frozen=True, slots=True)
class PartitionRequest:
    partition_index: int
    current_leader_epoch: int
    timestamp: int


@dataclass(slots=True)
class ListOffsetsRequest:
    """A checked ListOffsets request whose topics stay in the frame until iterated."""

    version: int
    replica_id: int
    isolation_level: int
    topic_count: int
    timeout_ms: int
    _buf: Buffer
    _topics_at: int

    def topics(self) -> Iterator[tuple[str, int, Iterator[PartitionRequest]]]:
        """(name, how many partitions, its partitions) per topic in request order."""
        return _walk(self._buf, self._topics_at, self.topic_count, self.version, decode=True)


def parse_list_offsets_request(buf: Buffer, start: int, version: int) -> ListOffsetsRequest:
    """Check the body at `buf[start:]` without keeping what it decodes; MalformedRequest where
    the codec would fail."""
    flexible = version >= FLEXIBLE_FROM
    try:
        if version >= 2:
            replica_id, isolation = _HEAD.unpack_from(buf, start)
            pos = start + 5
        else:
            replica_id, isolation, pos = _I32.unpack_from(buf, start)[0], 0, start + 4
        count, pos = _length(buf, pos, flexible)
        if count < 0:
            raise MalformedRequest("non-nullable field topics was null")
        topics_at = pos
        pos = run_to_end(_walk(buf, pos, count, version, decode=False))
        timeout_ms = 0
        if version >= 10:
            timeout_ms, pos = _I32.unpack_from(buf, pos)[0], pos + 4
        if flexible:
            skip_tagged_fields(buf, pos)
    except (VarintError, UnicodeDecodeError, struct.error, IndexError) as e:
        raise MalformedRequest(str(e) or "a field runs past the end of the request") from None
    return ListOffsetsRequest(version, replica_id, isolation, count, timeout_ms, buf, topics_at)


def _length(buf: Buffer, pos: int, flexible: bool) -> tuple[int, int]:
    if flexible:
        n, pos = read_uvarint(buf, pos)
        return n - 1, pos
    return _I32.unpack_from(buf, pos)[0], pos + 4


def _walk(buf: Buffer, pos: int, count: int, version: int, decode: bool) -> Generator:
    """Each topic: (name, partition count, partitions) when decoding, nothing but checks
    otherwise; returns the position after the array."""
    flexible = version >= FLEXIBLE_FROM
    partition = _PARTITION_V4 if version >= 4 else _PARTITION_V1
    size = len(buf)
    for _ in range(count):
        if flexible:
            n, pos = read_uvarint(buf, pos)
            n -= 1
        else:
            n, pos = _I16.unpack_from(buf, pos)[0], pos + 2
        if n < 0:
            raise MalformedRequest("non-nullable field topics.name was null")
        if pos + n > size:
            raise MalformedRequest(f"a field runs {pos + n - size} bytes past the end of the request")
        name = str(buf[pos : pos + n], "utf-8")
        pos += n
        partitions, pos = _length(buf, pos, flexible)
        if partitions < 0:
            raise MalformedRequest("non-nullable field topics.partitions was null")
        first = pos
        for _ in range(partitions):  # checked (and skipped) here, read when asked for
            if pos + partition.size > size:
                raise MalformedRequest("a field runs past the end of the request")
            pos += partition.size
            if flexible:
                pos = pos + 1 if buf[pos] == 0 else skip_tagged_fields(buf, pos)
        if flexible:
            pos = pos + 1 if buf[pos] == 0 else skip_tagged_fields(buf, pos)
        if decode:
            yield name, partitions, _partitions(buf, first, partitions, version)
        else:
            yield None
    return pos


def _partitions(buf: Buffer, pos: int, count: int, version: int) -> Iterator[PartitionRequest]:
    flexible = version >= FLEXIBLE_FROM
    for _ in range(count):
        if version >= 4:
            index, epoch, timestamp = _PARTITION_V4.unpack_from(buf, pos)
            pos += _PARTITION_V4.size
        else:
            (index, timestamp), epoch = _PARTITION_V1.unpack_from(buf, pos), -1
            pos += _PARTITION_V1.size
        if flexible:
            pos = pos + 1 if buf[pos] == 0 else skip_tagged_fields(buf, pos)
        yield PartitionRequest(index, epoch, timestamp)


class ListOffsetsResponseWriter:
    """The answer written as it is made: `topic(name, count)` then that many `partition`s."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.flexible = version >= FLEXIBLE_FROM
        self._body = bytearray()
        self._topics = 0
        self._open = 0  # partitions still due in the topic being written

    def _length(self, n: int) -> bytes:
        return write_uvarint(n + 1) if self.flexible else _I32.pack(n)

    def topic(self, name: str, partitions: int) -> None:
        raw = name.encode()
        self._body += (write_uvarint(len(raw) + 1) if self.flexible else _I16.pack(len(raw))) + raw
        self._body += self._length(partitions)
        self._topics += 1
        self._open = partitions
        if not partitions and self.flexible:
            self._body.append(0)

    def partition(self, index: int, error_code: int, timestamp: int = -1, offset: int = -1,
                  leader_epoch: int = -1) -> None:
        if self.version >= 4:
            self._body += _ANSWER_V4.pack(index, error_code, timestamp, offset, leader_epoch)
        else:
            self._body += _ANSWER_V1.pack(index, error_code, timestamp, offset)
        if self.flexible:
            self._body.append(0)
        self._open -= 1
        if not self._open and self.flexible:
            self._body.append(0)  # the topic's tagged fields

    def parts(self, throttle_time_ms: int = 0) -> list[bytes | bytearray]:
        head = _I32.pack(throttle_time_ms) if self.version >= 2 else b""
        return [head + self._length(self._topics), self._body, b"\x00" if self.flexible else b""]
