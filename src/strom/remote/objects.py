"""A remote segment as objects: the records, each index, the producer snapshot and the epoch
slice, one object each, under

    <key prefix><topic>-<topic id>/<partition>/<start offset, 20 digits>-<segment id><suffix>

(the layout of Kafka's own stores), so that one partition's objects list together and in
offset order, and a retried copy (a new segment id) never touches another attempt's objects."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from pathlib import Path

from strom.log.remote import (
    IndexType,
    LogSegmentData,
    RemoteLogSegmentMetadata,
    RemoteResourceNotFound,
    RemoteStorageError,
    RemoteStorageManager,
)
from strom.metadata.storage import kafka_uuid

SEGMENT_SUFFIX = ".log"


def object_key(prefix: str, metadata: RemoteLogSegmentMetadata, suffix: str) -> str:
    sid = metadata.segment_id
    return (f"{prefix}{sid.topic}-{kafka_uuid(sid.topic_id)}/{sid.partition}/"
            f"{metadata.start_offset:020d}-{kafka_uuid(sid.id)}{suffix}")


def segment_parts(data: LogSegmentData) -> Iterator[tuple[str, Path | bytes]]:
    """(suffix, content) of each object a copy writes, the records last: a store that lists
    a segment's records has the rest of it too."""
    yield IndexType.OFFSET.value, data.offset_index
    yield IndexType.TIMESTAMP.value, data.time_index
    if data.transaction_index is not None:
        yield IndexType.TRANSACTION.value, data.transaction_index
    yield IndexType.PRODUCER_SNAPSHOT.value, data.producer_snapshot
    yield IndexType.LEADER_EPOCH.value, data.leader_epoch_index
    yield SEGMENT_SUFFIX, data.log_segment


class ObjectStorage(RemoteStorageManager):
    """The RemoteStorageManager over a store of named objects: what a store provides is put,
    a ranged get and delete."""

    def __init__(self, key_prefix: str = "") -> None:
        self.key_prefix = key_prefix

    @abc.abstractmethod
    def put(self, key: str, content: Path | bytes) -> None:
        """Store `content` (a local file's bytes, or bytes) under `key`, whole or not at all."""

    @abc.abstractmethod
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [start, end) of an object (end None: to its end); RemoteResourceNotFound if
        there is no such object."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object; one that is not there is no error."""

    def key(self, metadata: RemoteLogSegmentMetadata, suffix: str) -> str:
        return object_key(self.key_prefix, metadata, suffix)

    def copy_log_segment_data(self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData) -> None:
        for suffix, content in segment_parts(data):
            self.put(self.key(metadata, suffix), content)

    def fetch_log_segment(self, metadata: RemoteLogSegmentMetadata, start: int, end: int | None = None) -> bytes:
        if start < 0 or (end is not None and end < start):
            raise ValueError(f"no byte range [{start}, {end})")
        return self.get(self.key(metadata, SEGMENT_SUFFIX), start, end)

    def fetch_index(self, metadata: RemoteLogSegmentMetadata, index: IndexType) -> bytes:
        return self.get(self.key(metadata, index.value))

    def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        # The records first: a segment whose records are gone is no longer listed as readable.
        for suffix in (SEGMENT_SUFFIX, *(i.value for i in IndexType)):
            self.delete(self.key(metadata, suffix))


__all__ = ["ObjectStorage", "RemoteResourceNotFound", "RemoteStorageError", "object_key", "segment_parts"]
