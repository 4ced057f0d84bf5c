"""GroupMetadataManager: the groups' durable state in `__consumer_offsets`.

Writes go through the partition leader's log with acks=-1, exactly as a producer's would, so
a committed offset or a stored assignment is as durable as produced data (in the page cache
before the response; it survives `kill -9`). Reads happen once, at start-up: the whole log of
each partition is replayed, the latest record per key wins and a tombstone deletes. The log is
compacted by the log cleaner, not here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from strom.coordinator import GROUP_METADATA_TOPIC, partition_for
from strom.coordinator.group import records as schema
from strom.coordinator.group.records import GroupMetadataValue, OffsetAndMetadata
from strom.protocol.errors import ErrorCode
from strom.protocol.records import HEADER_SIZE, build_batch, iter_records, read_header

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
_READ_CHUNK = 4 << 20

# How Kafka reports a failed append of group metadata or offsets to the client.
_STORE_ERRORS = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
}
_TOO_LARGE = {ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE, ErrorCode.INVALID_FETCH_SIZE}


@dataclass(slots=True)
class LoadedState:
    """What replaying `__consumer_offsets` found: the last group record and the live offsets
    of every group."""

    groups: dict[str, GroupMetadataValue] = field(default_factory=dict)
    offsets: dict[str, dict[TopicPartition, OffsetAndMetadata]] = field(default_factory=dict)
    records: int = 0


class GroupMetadataManager:
    def __init__(self, replica_manager, num_partitions: Callable[[], int]) -> None:
        self.replica_manager = replica_manager
        # The partition count of `__consumer_offsets` if it exists, else the configured one.
        self.num_partitions = num_partitions

    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.num_partitions())

    def is_local(self, group_id: str) -> bool:
        """True when this broker leads the group's `__consumer_offsets` partition."""
        partition = self.replica_manager.get_partition(GROUP_METADATA_TOPIC, self.partition_for(group_id))
        return partition is not None and partition.is_leader

    # --- writing ------------------------------------------------------------------------------
    def _append(self, group_id: str, entries: list[tuple[bytes, bytes | None]], offsets: bool) -> ErrorCode:
        if not entries:
            return ErrorCode.NONE
        tp = (GROUP_METADATA_TOPIC, self.partition_for(group_id))
        batch = bytearray(build_batch(entries, timestamp=int(time.time() * 1000)))
        error = self.replica_manager.append_records(-1, [(tp, batch)])[tp].error
        if error == ErrorCode.NONE:
            return error
        log.warning("appending %s of group %s to %s-%d failed: %s",
                    "offsets" if offsets else "metadata", group_id, tp[0], tp[1], error.name)
        if error in _TOO_LARGE:
            return ErrorCode.INVALID_COMMIT_OFFSET_SIZE if offsets else ErrorCode.UNKNOWN_SERVER_ERROR
        return _STORE_ERRORS.get(error, error)

    def store_group(self, value: GroupMetadataValue, group_id: str) -> ErrorCode:
        return self._append(group_id, [(schema.group_metadata_key(group_id),
                                        schema.group_metadata_value(value))], offsets=False)

    def store_offsets(self, group_id: str, offsets: dict[TopicPartition, OffsetAndMetadata]) -> ErrorCode:
        entries = [(schema.offset_commit_key(group_id, t, p), schema.offset_commit_value(v))
                   for (t, p), v in offsets.items()]
        return self._append(group_id, entries, offsets=True)

    def store_tombstones(self, group_id: str, partitions: Iterable[TopicPartition],
                         group: bool) -> ErrorCode:
        """Delete offsets (and the group record itself when `group`) from the log."""
        entries: list[tuple[bytes, bytes | None]] = [
            (schema.offset_commit_key(group_id, t, p), None) for t, p in partitions]
        if group:
            entries.append((schema.group_metadata_key(group_id), None))
        return self._append(group_id, entries, offsets=True)

    # --- loading ------------------------------------------------------------------------------
    def load(self) -> LoadedState:
        """Replay every local `__consumer_offsets` partition."""
        state = LoadedState()
        for p in range(self.num_partitions()):
            partition = self.replica_manager.get_partition(GROUP_METADATA_TOPIC, p)
            if partition is not None and partition.is_leader:
                self._replay(partition.log, state)
        return state

    def _replay(self, log_, state: LoadedState) -> None:
        for key, value in _records(log_):
            state.records += 1
            try:
                self._apply(schema.read_key(key), value, state)
            except (schema.RecordFormatError, ValueError) as e:
                log.warning("skipping an unreadable record in %s: %s", log_.name, e)

    @staticmethod
    def _apply(key, value: bytes | None, state: LoadedState) -> None:
        if isinstance(key, schema.OffsetCommitKey):
            offsets = state.offsets.setdefault(key.group, {})
            tp = (key.topic, key.partition)
            if value is None:
                offsets.pop(tp, None)
            else:
                offsets[tp] = schema.read_offset_commit_value(value)
        elif isinstance(key, schema.GroupMetadataKey):
            if value is None:
                state.groups.pop(key.group, None)
            else:
                state.groups[key.group] = schema.read_group_metadata_value(value)


def _records(log_) -> Iterator[tuple[bytes, bytes | None]]:
    """(key, value) of every data record of a log, in offset order."""
    offset, end = log_.log_start_offset, log_.log_end_offset
    while offset < end:
        data = log_.read(offset, _READ_CHUNK, min_one_message=True).read_bytes()
        if not data:
            return
        pos = 0
        while pos + HEADER_SIZE <= len(data):
            header = read_header(data, pos)
            if pos + header.size > len(data):
                break
            if not header.is_control:
                for record in iter_records(data, pos):
                    if record.key is not None and record.offset >= offset:
                        yield record.key, record.value
            offset = header.base_offset + header.last_offset_delta + 1
            pos += header.size
        if pos == 0:
            return  # a batch larger than the chunk would need min_one_message; never loop forever
