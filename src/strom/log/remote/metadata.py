"""The metadata of a segment copied to remote storage, in the shapes of Kafka's storage API
(org.apache.kafka.server.log.remote.storage), so that `__remote_log_metadata` records and the
stores speak of segments as Kafka's do."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field
from pathlib import Path


class RemoteLogSegmentState(enum.IntEnum):
    """A remote segment's life, with Kafka's ids (the metadata records carry them). Only a
    COPY_SEGMENT_FINISHED segment is read; one left STARTED by a crash is an orphan to delete."""

    COPY_SEGMENT_STARTED = 0
    COPY_SEGMENT_FINISHED = 1
    DELETE_SEGMENT_STARTED = 2
    DELETE_SEGMENT_FINISHED = 3


class IndexType(enum.Enum):
    """What a store keeps beside each segment's records, with the file suffix Kafka gives it."""

    OFFSET = ".index"
    TIMESTAMP = ".timeindex"
    PRODUCER_SNAPSHOT = ".snapshot"
    TRANSACTION = ".txnindex"
    LEADER_EPOCH = ".leader-epoch-checkpoint"


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentId:
    """One copy of one segment: a new id for every copy attempt, so that a retried copy never
    overwrites objects another attempt may still be writing."""

    topic_id: uuid.UUID
    topic: str
    partition: int
    id: uuid.UUID = field(default_factory=uuid.uuid4)


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadata:
    segment_id: RemoteLogSegmentId
    start_offset: int
    end_offset: int  # the segment's last offset (inclusive), as Kafka's
    max_timestamp_ms: int
    broker_id: int  # the leader that copied it
    event_timestamp_ms: int
    segment_leader_epochs: tuple[tuple[int, int], ...]  # (epoch, start offset), ascending
    size_bytes: int
    state: RemoteLogSegmentState = RemoteLogSegmentState.COPY_SEGMENT_STARTED

    def with_state(self, state: RemoteLogSegmentState, event_timestamp_ms: int) -> RemoteLogSegmentMetadata:
        return RemoteLogSegmentMetadata(self.segment_id, self.start_offset, self.end_offset,
                                        self.max_timestamp_ms, self.broker_id, event_timestamp_ms,
                                        self.segment_leader_epochs, self.size_bytes, state)


@dataclass(frozen=True, slots=True)
class LogSegmentData:
    """What a copy hands a store: a rolled segment's files on local disk, or the bytes of what
    lives in memory (its indexes, the producer snapshot at its end, its leader epoch slice)."""

    log_segment: Path
    offset_index: Path | bytes
    time_index: Path | bytes
    transaction_index: Path | bytes | None  # absent when the segment holds no aborted transaction
    producer_snapshot: Path | bytes
    leader_epoch_index: bytes
