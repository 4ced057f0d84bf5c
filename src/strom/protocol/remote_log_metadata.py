"""The record values of `__remote_log_metadata` (KIP-405), byte-compatible with Kafka's
TopicBasedRemoteLogMetadataManager, so a cluster's tiered-storage metadata reads the same in
Strom and in Kafka's tools.

A value is a frame: frame version (unsigned varint, 1), api key (unsigned varint), message
version (unsigned varint, 0 for all four), then the message in flexible encoding (compact
strings, bytes and arrays; a UUID as 16 big-endian bytes; each struct, nested ones included,
ends with its tagged fields). The key of each record is null. Api keys:

0 RemoteLogSegmentMetadataRecord        a copy started (or any state, with the whole segment)
1 RemoteLogSegmentMetadataUpdateRecord  a segment's state changed
2 RemotePartitionDeleteMetadataRecord   a partition's remote data is being deleted
3 RemoteLogSegmentMetadataSnapshotRecord  a segment in a consumer's snapshot file (no partition)

Sans-I/O: plain dataclasses in, bytes out, and back. Unknown tagged fields are skipped.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass

from strom.protocol.record_schema import Reader, RecordFormatError, Writer

FRAME_VERSION = 1
SEGMENT_METADATA = 0
SEGMENT_METADATA_UPDATE = 1
PARTITION_DELETE_METADATA = 2
SEGMENT_METADATA_SNAPSHOT = 3
VERSION = 0  # the only version of each; flexible from 0

_STRING_MAX = 0x7FFF  # Kafka's strings are at most Short.MAX_VALUE bytes


class RemoteLogMetadataError(ValueError):
    """A value that is not a remote log metadata record Strom can read."""


@dataclass(frozen=True, slots=True)
class TopicIdPartition:
    topic_id: uuid.UUID
    name: str
    partition: int


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentIdEntry:
    topic_id_partition: TopicIdPartition
    id: uuid.UUID


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadataRecord:
    segment_id: RemoteLogSegmentIdEntry
    start_offset: int
    end_offset: int
    broker_id: int
    max_timestamp_ms: int
    event_timestamp_ms: int
    segment_leader_epochs: tuple[tuple[int, int], ...]  # (epoch, start offset), as listed
    segment_size_in_bytes: int
    custom_metadata: bytes | None
    state: int  # RemoteLogSegmentState id


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadataUpdateRecord:
    segment_id: RemoteLogSegmentIdEntry
    broker_id: int
    event_timestamp_ms: int
    custom_metadata: bytes | None
    state: int


@dataclass(frozen=True, slots=True)
class RemotePartitionDeleteMetadataRecord:
    topic_id_partition: TopicIdPartition
    broker_id: int
    event_timestamp_ms: int
    state: int  # RemotePartitionDeleteState id


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadataSnapshotRecord:
    segment_id: uuid.UUID
    start_offset: int
    end_offset: int
    broker_id: int
    max_timestamp_ms: int
    event_timestamp_ms: int
    segment_leader_epochs: tuple[tuple[int, int], ...]
    segment_size_in_bytes: int
    custom_metadata: bytes | None
    state: int


RemoteLogMetadataRecord = (RemoteLogSegmentMetadataRecord | RemoteLogSegmentMetadataUpdateRecord
                           | RemotePartitionDeleteMetadataRecord | RemoteLogSegmentMetadataSnapshotRecord)


# --- encoding ---


class _Writer(Writer):
    """The flexible encoding of record_schema, with this topic's structs."""

    def __init__(self) -> None:
        super().__init__(flexible=True)

    def header(self, api_key: int) -> None:
        self.uvarint(FRAME_VERSION).uvarint(api_key).uvarint(VERSION)

    def checked_string(self, s: str) -> None:
        if len(s.encode()) > _STRING_MAX:
            raise RemoteLogMetadataError(f"string of {len(s.encode())} bytes is longer than {_STRING_MAX}")
        self.string(s)

    def topic_id_partition(self, tp: TopicIdPartition) -> None:
        self.checked_string(tp.name)
        self.uuid(tp.topic_id).int32(tp.partition).tagged_fields()

    def segment_id(self, s: RemoteLogSegmentIdEntry) -> None:
        self.topic_id_partition(s.topic_id_partition)
        self.uuid(s.id).tagged_fields()

    def leader_epochs(self, epochs: tuple[tuple[int, int], ...]) -> None:
        self.array_length(len(epochs))
        for epoch, offset in epochs:
            self.int32(epoch).int64(offset).tagged_fields()

    def segment_fields(self, record: RemoteLogSegmentMetadataRecord | RemoteLogSegmentMetadataSnapshotRecord) -> None:
        """What follows the segment's id, the same in a metadata record and a snapshot's."""
        self.int64(record.start_offset).int64(record.end_offset).int32(record.broker_id)
        self.int64(record.max_timestamp_ms).int64(record.event_timestamp_ms)
        self.leader_epochs(record.segment_leader_epochs)
        self.int32(record.segment_size_in_bytes).bytes_(record.custom_metadata).int8(record.state)


def encode(record: RemoteLogMetadataRecord) -> bytes:
    """The record value as Kafka's RemoteLogMetadataSerde writes it."""
    w = _Writer()
    try:
        if isinstance(record, RemoteLogSegmentMetadataRecord):
            w.header(SEGMENT_METADATA)
            w.segment_id(record.segment_id)
            w.segment_fields(record)
        elif isinstance(record, RemoteLogSegmentMetadataUpdateRecord):
            w.header(SEGMENT_METADATA_UPDATE)
            w.segment_id(record.segment_id)
            w.int32(record.broker_id).int64(record.event_timestamp_ms)
            w.bytes_(record.custom_metadata).int8(record.state)
        elif isinstance(record, RemotePartitionDeleteMetadataRecord):
            w.header(PARTITION_DELETE_METADATA)
            w.topic_id_partition(record.topic_id_partition)
            w.int32(record.broker_id).int64(record.event_timestamp_ms).int8(record.state)
        elif isinstance(record, RemoteLogSegmentMetadataSnapshotRecord):
            w.header(SEGMENT_METADATA_SNAPSHOT)
            w.uuid(record.segment_id)
            w.segment_fields(record)
        else:
            raise TypeError(f"not a remote log metadata record: {type(record).__name__}")
    except struct.error as e:  # a field out of its type's range
        raise RemoteLogMetadataError(f"{type(record).__name__}: {e}") from None
    w.tagged_fields()  # the message's own
    return bytes(w.buf)


# --- decoding ---


class _Reader(Reader):
    """The flexible decoding of record_schema, with this topic's structs and its stricter
    strings (never null, UTF-8 or refused)."""

    def __init__(self, buf: bytes | bytearray | memoryview) -> None:
        super().__init__(buf, flexible=True)

    def strict_string(self, what: str) -> str:
        n = self.uvarint() - 1
        if n < 0:
            raise RemoteLogMetadataError(f"null {what}, which the schema does not allow")
        try:
            return str(self._take(n), "utf-8")
        except UnicodeDecodeError as e:
            raise RemoteLogMetadataError(f"{what} is not UTF-8: {e}") from None

    def topic_id_partition(self) -> TopicIdPartition:
        name = self.strict_string("topic name")
        topic_id = self.uuid()
        partition = self.int32()
        self.tagged_fields()
        return TopicIdPartition(topic_id, name, partition)

    def segment_id(self) -> RemoteLogSegmentIdEntry:
        tp = self.topic_id_partition()
        segment = self.uuid()
        self.tagged_fields()
        return RemoteLogSegmentIdEntry(tp, segment)

    def leader_epochs(self) -> tuple[tuple[int, int], ...]:
        n = self.array_length()
        if n < 0:
            raise RemoteLogMetadataError("null SegmentLeaderEpochs, which the schema does not allow")
        if n * 13 > len(self.buf) - self.pos:  # each entry takes 13 bytes at least
            raise RemoteLogMetadataError(f"record truncated: {n} leader epochs cannot fit")
        epochs = []
        for _ in range(n):
            epoch = self.int32()
            offset = self.int64()
            self.tagged_fields()
            epochs.append((epoch, offset))
        return tuple(epochs)


def decode(data: bytes | bytearray | memoryview) -> RemoteLogMetadataRecord:
    """The record a `__remote_log_metadata` value holds. Raises RemoteLogMetadataError for an
    unknown frame version, api key or version, a truncated value, or bytes left over."""
    r = _Reader(data)
    try:
        frame = r.uvarint()
        if frame != FRAME_VERSION:
            raise RemoteLogMetadataError(f"unknown frame version {frame} (only {FRAME_VERSION} is defined)")
        api_key = r.uvarint()
        version = r.uvarint()
        if api_key not in _DECODERS:
            raise RemoteLogMetadataError(f"unknown remote log metadata api key {api_key}")
        if version != VERSION:
            raise RemoteLogMetadataError(f"unsupported version {version} of api key {api_key}")
        record = _DECODERS[api_key](r)
        r.tagged_fields()
    except RecordFormatError as e:
        raise RemoteLogMetadataError(f"record truncated or malformed at byte {r.pos}: {e}") from None
    if r.pos != len(r.buf):
        raise RemoteLogMetadataError(f"{len(r.buf) - r.pos} byte(s) after the record of api key {api_key}")
    return record


def _segment_fields(r: _Reader) -> dict:
    """What follows the segment's id, the same in a metadata record and a snapshot's (in the
    order they are read)."""
    return {"start_offset": r.int64(), "end_offset": r.int64(), "broker_id": r.int32(),
            "max_timestamp_ms": r.int64(), "event_timestamp_ms": r.int64(),
            "segment_leader_epochs": r.leader_epochs(), "segment_size_in_bytes": r.int32(),
            "custom_metadata": r.bytes_(), "state": r.int8()}


def _segment_metadata(r: _Reader) -> RemoteLogSegmentMetadataRecord:
    return RemoteLogSegmentMetadataRecord(segment_id=r.segment_id(), **_segment_fields(r))


def _segment_update(r: _Reader) -> RemoteLogSegmentMetadataUpdateRecord:
    return RemoteLogSegmentMetadataUpdateRecord(
        segment_id=r.segment_id(), broker_id=r.int32(), event_timestamp_ms=r.int64(),
        custom_metadata=r.bytes_(), state=r.int8())


def _partition_delete(r: _Reader) -> RemotePartitionDeleteMetadataRecord:
    return RemotePartitionDeleteMetadataRecord(
        topic_id_partition=r.topic_id_partition(), broker_id=r.int32(),
        event_timestamp_ms=r.int64(), state=r.int8())


def _segment_snapshot(r: _Reader) -> RemoteLogSegmentMetadataSnapshotRecord:
    return RemoteLogSegmentMetadataSnapshotRecord(segment_id=r.uuid(), **_segment_fields(r))


_DECODERS = {
    SEGMENT_METADATA: _segment_metadata,
    SEGMENT_METADATA_UPDATE: _segment_update,
    PARTITION_DELETE_METADATA: _partition_delete,
    SEGMENT_METADATA_SNAPSHOT: _segment_snapshot,
}
