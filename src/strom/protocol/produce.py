"""Produce requests parsed by hand, so record sets stay views into the request frame.

The codec tables would copy each record set into new `bytes`, and the log needs a writable
buffer to assign offsets in place, which meant a second copy: two extra copies of every
produced byte. Here each partition's `records` is a writable memoryview of the frame itself.
Field names follow the schema (and the codec's objects), so handlers read either alike.
Layout per Kafka's ProduceRequest v3-v13 (flexible from v9; from v13 a topic is named by
its id, KIP-516, and `name` is left empty for the handler to fill in).
"""

from __future__ import annotations

import functools
import struct
import uuid
from dataclasses import dataclass

from strom.protocol.varint import VarintError, read_uvarint, skip_tagged_fields, write_uvarint

FLEXIBLE_FROM = 9
TOPIC_IDS_FROM = 13
MAX_VERSION = 13

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")


class MalformedRequest(ValueError):
    pass


@dataclass(slots=True)
class PartitionProduceData:
    index: int
    records: memoryview | None


@dataclass(slots=True)
class TopicProduceData:
    name: str
    partition_data: list[PartitionProduceData]
    topic_id: uuid.UUID | None = None  # v13+


@dataclass(slots=True)
class ProduceRequest:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: list[TopicProduceData]


def parse_produce_request(body: memoryview, version: int) -> ProduceRequest:
    """Parse a Produce request body (after the request header). Raises MalformedRequest."""
    try:
        return _parse(body, version >= FLEXIBLE_FROM, version >= TOPIC_IDS_FROM)
    except VarintError as e:
        raise MalformedRequest(str(e)) from None


def _truncated(pos: int) -> MalformedRequest:
    return MalformedRequest(f"produce request truncated at byte {pos}")


def _read_length(body: memoryview, pos: int, end: int, flexible: bool) -> tuple[int, int]:
    """(length of a string, bytes or array, -1 for null; next position)."""
    if flexible:
        if pos + 1 < end:  # one or two bytes in line: names, counts, a small record set's size
            b = body[pos]
            if b < 0x80:
                return b - 1, pos + 1
            c = body[pos + 1]
            if c < 0x80:
                return (b & 0x7F | c << 7) - 1, pos + 2
        n, pos = read_uvarint(body, pos)
        return n - 1, pos
    if pos + 4 > end:
        raise _truncated(pos)
    return _I32.unpack_from(body, pos)[0], pos + 4


def _read_string(body: memoryview, pos: int, end: int, flexible: bool) -> tuple[str | None, int]:
    if flexible:
        n, pos = _read_length(body, pos, end, True)
    else:
        if pos + 2 > end:
            raise _truncated(pos)
        n, pos = _I16.unpack_from(body, pos)[0], pos + 2
    if n < 0:
        return None, pos
    if pos + n > end:
        raise _truncated(pos)
    return str(body[pos : pos + n], "utf-8"), pos + n


def _skip_tags(body: memoryview, pos: int, end: int) -> int:
    """Past a (flexible version's) tag section; the usual empty one is one zero byte."""
    if pos < end and body[pos] == 0:
        return pos + 1
    return skip_tagged_fields(body, pos)


def _parse(body: memoryview, flexible: bool, by_id: bool) -> ProduceRequest:
    # Module-level helpers over local positions (no closures made per request), the usual
    # one-byte lengths and empty tag sections read in line: a single-record request is mostly
    # this framing, and every call showed in profiles.
    end = len(body)
    if flexible and end and body[0] == 0:  # the usual null transactional id
        transactional_id, pos = None, 1
    else:
        transactional_id, pos = _read_string(body, 0, end, flexible)
    if pos + _ACKS_TIMEOUT.size > end:
        raise _truncated(pos)
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(body, pos)
    pos += _ACKS_TIMEOUT.size
    topics = []
    count, pos = _read_length(body, pos, end, flexible)
    for _ in range(count):
        topic_id = None
        if by_id:
            if pos + 16 > end:
                raise _truncated(pos)
            name, topic_id = "", uuid.UUID(bytes=bytes(body[pos : pos + 16]))
            pos += 16
        else:
            name, pos = _read_string(body, pos, end, flexible)
            if name is None:
                raise MalformedRequest("null topic name")
        partitions = []
        partition_count, pos = _read_length(body, pos, end, flexible)
        for _ in range(partition_count):
            if pos + 4 > end:
                raise _truncated(pos)
            index = _I32.unpack_from(body, pos)[0]
            size, pos = _read_length(body, pos + 4, end, flexible)
            records = None
            if size >= 0:
                if pos + size > end:
                    raise _truncated(pos)
                records = body[pos : pos + size]
                pos += size
            partitions.append(PartitionProduceData(index, records))
            if flexible:
                pos = pos + 1 if pos < end and body[pos] == 0 else _skip_tags(body, pos, end)
        if flexible:
            pos = pos + 1 if pos < end and body[pos] == 0 else _skip_tags(body, pos, end)
        topics.append(TopicProduceData(name, partitions, topic_id))
    if flexible:
        pos = _skip_tags(body, pos, end)
    if pos != end:
        raise MalformedRequest(f"{end - pos} bytes left after the produce request")
    return ProduceRequest(transactional_id, acks, timeout_ms, topics)


# --- the response ---------------------------------------------------------------------------
# One Produce answer per request: at ten thousand single-record requests a second the generic
# codec (building objects from dicts, then encoding them) cost more than the append itself.

_PARTITION_V3 = struct.Struct(">ihqq")  # index, error_code, base_offset, log_append_time_ms
_I64 = struct.Struct(">q")


@dataclass(slots=True)
class PartitionProduceResponse:
    index: int
    error_code: int
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    record_errors: list[tuple[int, str | None]] | None = None  # (batch_index, message), v8+
    error_message: str | None = None  # v8+


def _length(n: int, flexible: bool) -> bytes:
    """Length of an array, or of a nullable string (n = -1: null)."""
    return write_uvarint(n + 1) if flexible else _I32.pack(n)


def _nullable_string(s: str | None, flexible: bool) -> bytes:
    if s is None:
        return b"\x00" if flexible else b"\xff\xff"
    data = s.encode("utf-8")
    return (write_uvarint(len(data) + 1) if flexible else _I16.pack(len(data))) + data


_PARTITION_V5 = struct.Struct(">ihqqq")  # and log_start_offset
# After a plain partition's fields (no record errors, no message): v8's empty array and null
# string, from v9 compact, then the partition's and the topic's empty tag sections.
_PLAIN_PARTITION_TAIL = {v: (b"\x01\x00\x00\x00" if v >= FLEXIBLE_FROM else b"\x00\x00\x00\x00\xff\xff"
                             if v >= 8 else b"") for v in range(3, MAX_VERSION + 1)}


@functools.lru_cache(maxsize=4096)
def _one_partition_head(topic: str | uuid.UUID, version: int) -> bytes:
    """A one-topic, one-partition answer up to the partition's fields: made once per topic."""
    flexible = version >= FLEXIBLE_FROM
    name = topic.bytes if version >= TOPIC_IDS_FROM else _nullable_string(topic, flexible)  # type: ignore
    return _length(1, flexible) + name + _length(1, flexible)


def encode_produce_response(topics: list[tuple[str | uuid.UUID, list[PartitionProduceResponse]]],
                            version: int, throttle_time_ms: int = 0) -> tuple[bytes, int]:
    """A ProduceResponse body (v3-v13) and the position of its throttle_time_ms. Topics are
    named (v3-v12) or given by id (v13+, KIP-516). The tagged fields (current leader, node
    endpoints) are left out: Strom does not send them."""
    flexible = version >= FLEXIBLE_FROM
    if len(topics) == 1 and len(topics[0][1]) == 1:
        p = topics[0][1][0]
        if not p.record_errors and p.error_message is None:  # one partition, answered plainly
            head = _one_partition_head(topics[0][0], version)
            body = head + _PARTITION_V5.pack(p.index, p.error_code, p.base_offset, p.log_append_time_ms,
                                             p.log_start_offset)[:_PARTITION_V5.size if version >= 5 else -8]
            body += _PLAIN_PARTITION_TAIL[version]
            return body + _I32.pack(throttle_time_ms) + (b"\x00" if flexible else b""), len(body)
    out = [_length(len(topics), flexible)]
    for topic, partitions in topics:
        if version >= TOPIC_IDS_FROM:
            out.append(topic.bytes)  # type: ignore[union-attr]
        else:
            out.append(_nullable_string(topic, flexible))  # type: ignore[arg-type]
        out.append(_length(len(partitions), flexible))
        for p in partitions:
            out.append(_PARTITION_V3.pack(p.index, p.error_code, p.base_offset, p.log_append_time_ms))
            if version >= 5:
                out.append(_I64.pack(p.log_start_offset))
            if version >= 8:
                errors = p.record_errors or ()
                out.append(_length(len(errors), flexible))
                for batch_index, message in errors:
                    out.append(_I32.pack(batch_index))
                    out.append(_nullable_string(message, flexible))
                    if flexible:
                        out.append(b"\x00")
                out.append(_nullable_string(p.error_message, flexible))
            if flexible:
                out.append(b"\x00")
        if flexible:
            out.append(b"\x00")
    body = b"".join(out)
    tail = _I32.pack(throttle_time_ms) + (b"\x00" if flexible else b"")
    return body + tail, len(body)
