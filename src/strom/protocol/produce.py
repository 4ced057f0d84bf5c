"""Produce requests parsed by hand, so record sets stay views into the request frame.

The codec tables would copy each record set into new `bytes`, and the log needs a writable
buffer to assign offsets in place, which meant a second copy: two extra copies of every
produced byte. Here each partition's `records` is a writable memoryview of the frame itself.
Field names follow the schema (and the codec's objects), so handlers read either alike.
Layout per Kafka's ProduceRequest v3-v13 (flexible from v9; from v13 a topic is named by
its id, KIP-516, and `name` is left empty for the handler to fill in).
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass

from strom.protocol.varint import VarintError, read_uvarint, skip_tagged_fields

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


class _Reader:
    __slots__ = ("buf", "pos", "flexible", "by_id")

    def __init__(self, buf: memoryview, flexible: bool, by_id: bool) -> None:
        self.buf = buf
        self.pos = 0
        self.flexible = flexible
        self.by_id = by_id

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise MalformedRequest(f"produce request truncated at byte {self.pos}")

    def uvarint(self) -> int:
        value, self.pos = read_uvarint(self.buf, self.pos)
        return value

    def int32(self) -> int:
        self.need(4)
        (v,) = _I32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def length(self) -> int:
        """Length of a string, bytes or array; -1 for null."""
        return self.uvarint() - 1 if self.flexible else self.int32()

    def string(self) -> str | None:
        if self.flexible:
            n = self.uvarint() - 1
        else:
            self.need(2)
            (n,) = _I16.unpack_from(self.buf, self.pos)
            self.pos += 2
        if n < 0:
            return None
        self.need(n)
        s = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8")
        self.pos += n
        return s

    def uuid(self) -> uuid.UUID:
        self.need(16)
        value = uuid.UUID(bytes=bytes(self.buf[self.pos : self.pos + 16]))
        self.pos += 16
        return value

    def skip_tags(self) -> None:
        if self.flexible:
            self.pos = skip_tagged_fields(self.buf, self.pos)


def parse_produce_request(body: memoryview, version: int) -> ProduceRequest:
    """Parse a Produce request body (after the request header). Raises MalformedRequest."""
    try:
        return _parse(_Reader(body, version >= FLEXIBLE_FROM, version >= TOPIC_IDS_FROM), body)
    except VarintError as e:
        raise MalformedRequest(str(e)) from None


def _parse(r: _Reader, body: memoryview) -> ProduceRequest:
    transactional_id = r.string()
    r.need(_ACKS_TIMEOUT.size)
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(body, r.pos)
    r.pos += _ACKS_TIMEOUT.size
    topics = []
    for _ in range(max(0, r.length())):
        topic_id = None
        if r.by_id:
            name, topic_id = "", r.uuid()
        else:
            name = r.string()
            if name is None:
                raise MalformedRequest("null topic name")
        partitions = []
        for _ in range(max(0, r.length())):
            index = r.int32()
            size = r.length()
            records = None
            if size >= 0:
                r.need(size)
                records = body[r.pos : r.pos + size]
                r.pos += size
            r.skip_tags()
            partitions.append(PartitionProduceData(index, records))
        r.skip_tags()
        topics.append(TopicProduceData(name, partitions, topic_id))
    r.skip_tags()
    if r.pos != len(body):
        raise MalformedRequest(f"{len(body) - r.pos} bytes left after the produce request")
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


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length(n: int, flexible: bool) -> bytes:
    """Length of an array, or of a nullable string (n = -1: null)."""
    return _uvarint(n + 1) if flexible else _I32.pack(n)


def _nullable_string(s: str | None, flexible: bool) -> bytes:
    if s is None:
        return b"\x00" if flexible else b"\xff\xff"
    data = s.encode("utf-8")
    return (_uvarint(len(data) + 1) if flexible else _I16.pack(len(data))) + data


def encode_produce_response(topics: list[tuple[str | uuid.UUID, list[PartitionProduceResponse]]],
                            version: int, throttle_time_ms: int = 0) -> tuple[bytes, int]:
    """A ProduceResponse body (v3-v13) and the position of its throttle_time_ms. Topics are
    named (v3-v12) or given by id (v13+, KIP-516). The tagged fields (current leader, node
    endpoints) are left out: Strom does not send them."""
    flexible = version >= FLEXIBLE_FROM
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
