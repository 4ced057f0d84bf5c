"""RemoteStorageManager: where copied segments live (Kafka's interface of that name). A store
is called from worker threads, never on the event loop: each call may wait on a network."""

from __future__ import annotations

import abc

from strom.log.remote.metadata import IndexType, LogSegmentData, RemoteLogSegmentMetadata


class RemoteStorageError(Exception):
    """The store could not do what was asked (Kafka's RemoteStorageException): retried later."""


class RemoteResourceNotFound(RemoteStorageError):
    """What was asked for is not in the store (Kafka's RemoteResourceNotFoundException)."""


class RemoteStorageManager(abc.ABC):
    @abc.abstractmethod
    def copy_log_segment_data(self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData) -> None:
        """Store the segment's records, its indexes, producer snapshot and epoch slice. A copy
        that fails may have stored some of them: the caller deletes the attempt's objects."""

    @abc.abstractmethod
    def fetch_log_segment(self, metadata: RemoteLogSegmentMetadata, start: int, end: int | None = None) -> bytes:
        """The segment's bytes from position `start` up to `end` (exclusive; None: its end)."""

    @abc.abstractmethod
    def fetch_index(self, metadata: RemoteLogSegmentMetadata, index: IndexType) -> bytes:
        """One of the segment's indexes whole (RemoteResourceNotFound for a transaction index
        the segment did not have)."""

    @abc.abstractmethod
    def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Remove every object of the segment; what is already gone is no error, so a deletion
        interrupted by a crash can be done again."""

    def close(self) -> None:  # noqa: B027 - most stores hold nothing to release
        """Release connections and threads."""
