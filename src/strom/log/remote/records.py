"""The log's side of `__remote_log_metadata` records: what each record says, in the shapes of
Kafka's storage API (RemoteLogSegmentMetadata, RemoteLogSegmentMetadataUpdate,
RemotePartitionDeleteMetadata), and the mapping to and from the wire codec in
strom.protocol.remote_log_metadata (as Kafka's RemoteLogMetadataSerde and its transforms)."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass

from strom.log.remote.metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
)
from strom.protocol import remote_log_metadata as wire
from strom.protocol.remote_log_metadata import RemoteLogMetadataError


class RemotePartitionDeleteState(enum.IntEnum):
    """A partition's remote data being deleted, with Kafka's ids: MARKED by the controller's
    deletion of the topic, STARTED and FINISHED by the partition's leader."""

    DELETE_PARTITION_MARKED = 0
    DELETE_PARTITION_STARTED = 1
    DELETE_PARTITION_FINISHED = 2


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadataUpdate:
    """A segment's move to another state; custom metadata is what a store returned from its
    copy (opaque to the broker, handed back to the store on reads)."""

    segment_id: RemoteLogSegmentId
    event_timestamp_ms: int
    state: RemoteLogSegmentState
    broker_id: int
    custom_metadata: bytes | None = None


@dataclass(frozen=True, slots=True)
class RemotePartitionDeleteMetadata:
    topic_id: uuid.UUID
    topic: str
    partition: int
    state: RemotePartitionDeleteState
    event_timestamp_ms: int
    broker_id: int


RemoteLogMetadata = RemoteLogSegmentMetadata | RemoteLogSegmentMetadataUpdate | RemotePartitionDeleteMetadata


def serialize(metadata: RemoteLogMetadata, custom_metadata: bytes | None = None) -> bytes:
    """A `__remote_log_metadata` record value (its key is null). `custom_metadata` goes with a
    whole segment's metadata, which has no field of its own for it."""
    return wire.encode(to_record(metadata, custom_metadata))


def deserialize(data: bytes | bytearray | memoryview) -> RemoteLogMetadata:
    """What a record value says; RemoteLogMetadataError for one that is not a segment, update
    or partition-delete record (a snapshot record belongs to a snapshot file, not the topic)."""
    return from_record(wire.decode(data))


def to_record(metadata: RemoteLogMetadata, custom_metadata: bytes | None = None) -> wire.RemoteLogMetadataRecord:
    if isinstance(metadata, RemoteLogSegmentMetadata):
        return wire.RemoteLogSegmentMetadataRecord(
            segment_id=_segment_id_entry(metadata.segment_id), start_offset=metadata.start_offset,
            end_offset=metadata.end_offset, broker_id=metadata.broker_id,
            max_timestamp_ms=metadata.max_timestamp_ms, event_timestamp_ms=metadata.event_timestamp_ms,
            segment_leader_epochs=tuple(metadata.segment_leader_epochs),
            segment_size_in_bytes=metadata.size_bytes, custom_metadata=custom_metadata,
            state=int(metadata.state))
    if isinstance(metadata, RemoteLogSegmentMetadataUpdate):
        return wire.RemoteLogSegmentMetadataUpdateRecord(
            segment_id=_segment_id_entry(metadata.segment_id), broker_id=metadata.broker_id,
            event_timestamp_ms=metadata.event_timestamp_ms, custom_metadata=metadata.custom_metadata,
            state=int(metadata.state))
    if isinstance(metadata, RemotePartitionDeleteMetadata):
        return wire.RemotePartitionDeleteMetadataRecord(
            topic_id_partition=wire.TopicIdPartition(metadata.topic_id, metadata.topic, metadata.partition),
            broker_id=metadata.broker_id, event_timestamp_ms=metadata.event_timestamp_ms,
            state=int(metadata.state))
    raise TypeError(f"not remote log metadata: {type(metadata).__name__}")


def from_record(record: wire.RemoteLogMetadataRecord) -> RemoteLogMetadata:
    if isinstance(record, wire.RemoteLogSegmentMetadataRecord):
        if not record.segment_leader_epochs:
            raise RemoteLogMetadataError("segment metadata without leader epochs")
        return RemoteLogSegmentMetadata(
            segment_id=_segment_id(record.segment_id), start_offset=record.start_offset,
            end_offset=record.end_offset, max_timestamp_ms=record.max_timestamp_ms,
            broker_id=record.broker_id, event_timestamp_ms=record.event_timestamp_ms,
            # Kafka keeps them in a map by epoch: ascending, one start offset per epoch
            segment_leader_epochs=tuple(sorted(dict(record.segment_leader_epochs).items())),
            size_bytes=record.segment_size_in_bytes, state=_segment_state(record.state))
    if isinstance(record, wire.RemoteLogSegmentMetadataUpdateRecord):
        return RemoteLogSegmentMetadataUpdate(
            segment_id=_segment_id(record.segment_id), event_timestamp_ms=record.event_timestamp_ms,
            state=_segment_state(record.state), broker_id=record.broker_id,
            custom_metadata=record.custom_metadata)
    if isinstance(record, wire.RemotePartitionDeleteMetadataRecord):
        tp = record.topic_id_partition
        try:
            state = RemotePartitionDeleteState(record.state)
        except ValueError:
            raise RemoteLogMetadataError(f"unknown partition delete state {record.state}") from None
        return RemotePartitionDeleteMetadata(tp.topic_id, tp.name, tp.partition, state,
                                             record.event_timestamp_ms, record.broker_id)
    raise RemoteLogMetadataError(f"not a record of the metadata topic: {type(record).__name__}")


def _segment_state(state: int) -> RemoteLogSegmentState:
    try:
        return RemoteLogSegmentState(state)
    except ValueError:
        raise RemoteLogMetadataError(f"unknown remote log segment state {state}") from None


def _segment_id_entry(segment_id: RemoteLogSegmentId) -> wire.RemoteLogSegmentIdEntry:
    return wire.RemoteLogSegmentIdEntry(
        wire.TopicIdPartition(segment_id.topic_id, segment_id.topic, segment_id.partition), segment_id.id)


def _segment_id(entry: wire.RemoteLogSegmentIdEntry) -> RemoteLogSegmentId:
    tp = entry.topic_id_partition
    return RemoteLogSegmentId(tp.topic_id, tp.name, tp.partition, entry.id)
