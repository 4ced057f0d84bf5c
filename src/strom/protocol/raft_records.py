"""The record formats of KRaft's `__cluster_metadata` log and its snapshots, byte-compatible with
Kafka's: RecordBatch v2 batches whose partitionLeaderEpoch is the Raft epoch, data records with
a null key, and control batches (attributes bit 5) holding one or more control records whose key
is version i16 (0) + type i16 and whose value is a flexible "data" message
(LeaderChangeMessage, SnapshotHeaderRecord, SnapshotFooterRecord, KRaftVersionRecord,
VotersRecord) written without a version prefix, as Kafka's MessageUtil.toByteBuffer does.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from strom.protocol.raft_messages import (
    KRaftVersionRecord,
    LeaderChangeMessage,
    SnapshotFooterRecord,
    SnapshotHeaderRecord,
    VotersRecord,
)
from strom.protocol.records import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    Record,
    build_batch,
    build_value_batch,
    iter_records,
    iter_values,
    peek_offset_and_size,
    read_header,
)

# Kafka's ControlRecordType ids.
LEADER_CHANGE = 2
SNAPSHOT_HEADER = 3
SNAPSHOT_FOOTER = 4
KRAFT_VERSION = 5
KRAFT_VOTERS = 6

_CONTROL_KEY = struct.Struct(">hh")
_LEADER_EPOCH_AT = 12  # partitionLeaderEpoch follows baseOffset and batchLength; not in the CRC
_EPOCH = struct.Struct(">i")
_VALUE_CLASSES = {
    LEADER_CHANGE: LeaderChangeMessage,
    SNAPSHOT_HEADER: SnapshotHeaderRecord,
    SNAPSHOT_FOOTER: SnapshotFooterRecord,
    KRAFT_VERSION: KRaftVersionRecord,
    KRAFT_VOTERS: VotersRecord,
}


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class VoterEntry:
    """One voter of a KIP-853 voter set: id, directory id and its controller listeners."""

    voter_id: int
    directory_id: uuid.UUID | None = None
    endpoints: tuple[Endpoint, ...] = ()
    min_kraft_version: int = 0
    max_kraft_version: int = 1


@dataclass(frozen=True, slots=True)
class ControlRecord:
    kind: int
    value: object  # the decoded data message


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """Where one batch sits in a buffer, and the fields Raft reasons about."""

    pos: int
    size: int
    base_offset: int
    last_offset: int
    epoch: int
    is_control: bool
    timestamp: int


def _with_epoch(batch: bytes, epoch: int) -> bytes:
    out = bytearray(batch)
    _EPOCH.pack_into(out, _LEADER_EPOCH_AT, epoch)
    return bytes(out)


def data_batch(values: list[bytes], base_offset: int, epoch: int, timestamp: int) -> bytes:
    """A batch of metadata records (null keys), stamped with the Raft epoch."""
    return _with_epoch(build_value_batch(values, base_offset=base_offset, timestamp=timestamp), epoch)


def control_batch(records: list[tuple[int, bytes]], base_offset: int, epoch: int, timestamp: int) -> bytes:
    """A control batch of (type, value) records."""
    pairs = [(_CONTROL_KEY.pack(0, kind), value) for kind, value in records]
    return _with_epoch(build_batch(pairs, base_offset=base_offset, timestamp=timestamp, control=True), epoch)


def leader_change_value(leader_id: int, voters: list[int], granting: list[int]) -> bytes:
    cls = LeaderChangeMessage
    msg = cls(version=0, record_version=0, leader_id=leader_id,
              voters=[cls.Voter(version=0, voter_id=v) for v in voters],
              granting_voters=[cls.Voter(version=0, voter_id=v) for v in granting])
    return bytes(msg.encode(version=0, header=False))


def kraft_version_value(kraft_version: int) -> bytes:
    return bytes(KRaftVersionRecord(version=0, record_version=0, k_raft_version=kraft_version).encode(version=0, header=False))


def voters_value(voters: list[VoterEntry]) -> bytes:
    cls = VotersRecord
    entries = []
    for v in voters:
        entries.append(cls.Voter(
            version=0, voter_id=v.voter_id, voter_directory_id=v.directory_id,
            endpoints=[cls.Voter.Endpoint(version=0, name=e.name, host=e.host, port=e.port) for e in v.endpoints],
            k_raft_version_feature=cls.Voter.KRaftVersionFeature(
                version=0, min_supported_version=v.min_kraft_version, max_supported_version=v.max_kraft_version),
        ))
    return bytes(cls(version=0, record_version=0, voters=entries).encode(version=0, header=False))


def snapshot_header_value(last_contained_log_timestamp: int) -> bytes:
    msg = SnapshotHeaderRecord(version=0, record_version=0, last_contained_log_timestamp=last_contained_log_timestamp)
    return bytes(msg.encode(version=0, header=False))


def snapshot_footer_value() -> bytes:
    return bytes(SnapshotFooterRecord(version=0, record_version=0).encode(version=0, header=False))


def decode_voters(value: VotersRecord) -> list[VoterEntry]:
    out = []
    for v in value.voters:
        feature = v.k_raft_version_feature
        out.append(VoterEntry(
            v.voter_id, v.voter_directory_id,
            tuple(Endpoint(e.name, e.host, e.port) for e in v.endpoints),
            feature.min_supported_version, feature.max_supported_version))
    return out


def parse_control(record: Record) -> ControlRecord | None:
    """The control record's type and decoded value; None for a type Raft does not know (Kafka
    skips those too, e.g. transaction markers never appear in the metadata log)."""
    if record.key is None or len(record.key) < _CONTROL_KEY.size:
        raise ValueError("control record without a valid key")
    _version, kind = _CONTROL_KEY.unpack_from(record.key)
    cls = _VALUE_CLASSES.get(kind)
    if cls is None:
        return None
    return ControlRecord(kind, cls.decode(record.value or b"", version=0, header=False))


def iter_batches(buf, pos: int = 0) -> Iterator[BatchInfo]:
    """Whole batches in `buf` from `pos`; a truncated trailing batch is left out."""
    end = len(buf)
    while pos + LOG_OVERHEAD <= end:
        _base, size = peek_offset_and_size(buf, pos)
        if size < HEADER_SIZE or pos + size > end:
            return
        h = read_header(buf, pos)
        yield BatchInfo(pos, size, h.base_offset, h.last_offset, h.partition_leader_epoch,
                        h.is_control, h.max_timestamp)
        pos += size


def control_records(batch, pos: int = 0) -> list[ControlRecord]:
    return [c for r in iter_records(batch, pos) if (c := parse_control(r)) is not None]


def data_values(batch, pos: int = 0) -> list[bytes]:
    return [v or b"" for v in iter_values(batch, pos)]
