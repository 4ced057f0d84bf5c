"""GroupMetadataManager: the groups' durable state in `__consumer_offsets`.

Writes go through the partition leader's log with acks=-1, exactly as a producer's would, so
a committed offset or a stored assignment is as durable as produced data (in the page cache
before the response; it survives `kill -9`). Reads happen once per partition, when this broker
starts leading it (at start-up, or on election): its whole log is replayed in one pass, the
latest record per key wins and a tombstone deletes; offsets committed inside a transaction count
once its commit marker follows. The same pass collects the share groups' records (KIP-932) for
the share group coordinator to restore. The log is compacted by the log cleaner, not here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from strom.coordinator import GROUP_METADATA_TOPIC, log_store
from strom.coordinator.group import records as schema
from strom.coordinator.group.records import GroupMetadataValue, OffsetAndMetadata
from strom.protocol.errors import ErrorCode
from strom.protocol.record_schema import RecordFormatError

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
_TOO_LARGE = {ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE, ErrorCode.INVALID_FETCH_SIZE}
# Offsets committed inside transactions, not yet decided: producer id -> group -> offsets.
PendingTxnOffsets = dict[int, dict[str, dict[TopicPartition, OffsetAndMetadata]]]
# A share group's live records as replayed: raw key -> (parsed key, value).
ShareGroupRecords = dict[bytes, tuple[schema.ShareGroupKey, bytes]]


@dataclass(slots=True)
class LoadedState:
    """What replaying `__consumer_offsets` found: the last group record and the live offsets
    of every group, and the live records of every share group."""

    groups: dict[str, GroupMetadataValue] = field(default_factory=dict)
    offsets: dict[str, dict[TopicPartition, OffsetAndMetadata]] = field(default_factory=dict)
    pending_txn_offsets: PendingTxnOffsets = field(default_factory=dict)
    share_groups: dict[str, ShareGroupRecords] = field(default_factory=dict)
    records: int = 0


class GroupMetadataManager(log_store.InternalTopic):
    topic = GROUP_METADATA_TOPIC

    # --- writing ------------------------------------------------------------------------------
    def _append(self, group_id: str, entries: list[tuple[bytes, bytes | None]], offsets: bool,
                producer_id: int = -1, producer_epoch: int = -1) -> ErrorCode:
        if not entries:
            return ErrorCode.NONE
        tp = (GROUP_METADATA_TOPIC, self.partition_for(group_id))
        error = log_store.append(self.replica_manager, tp, entries, producer_id=producer_id,
                                 producer_epoch=producer_epoch)
        if error == ErrorCode.NONE:
            return error
        log.warning("appending %s of group %s to %s-%d failed: %s",
                    "offsets" if offsets else "metadata", group_id, tp[0], tp[1], error.name)
        if error in _TOO_LARGE:
            return ErrorCode.INVALID_COMMIT_OFFSET_SIZE if offsets else ErrorCode.UNKNOWN_SERVER_ERROR
        return log_store.STORE_ERRORS.get(error, error)

    def store_group(self, value: GroupMetadataValue, group_id: str) -> ErrorCode:
        return self._append(group_id, [(schema.group_metadata_key(group_id),
                                        schema.group_metadata_value(value))], offsets=False)

    def store_offsets(self, group_id: str, offsets: dict[TopicPartition, OffsetAndMetadata]) -> ErrorCode:
        entries = [(schema.offset_commit_key(group_id, t, p), schema.offset_commit_value(v))
                   for (t, p), v in offsets.items()]
        return self._append(group_id, entries, offsets=True)

    def store_txn_offsets(self, group_id: str, producer_id: int, producer_epoch: int,
                          offsets: dict[TopicPartition, OffsetAndMetadata]) -> ErrorCode:
        """Offsets committed inside a transaction: a transactional batch, applied only when the
        transaction's commit marker reaches this partition."""
        entries = [(schema.offset_commit_key(group_id, t, p), schema.offset_commit_value(v))
                   for (t, p), v in offsets.items()]
        return self._append(group_id, entries, offsets=True, producer_id=producer_id,
                            producer_epoch=producer_epoch)

    def store_tombstones(self, group_id: str, partitions: Iterable[TopicPartition],
                         group: bool) -> ErrorCode:
        """Delete offsets (and the group record itself when `group`) from the log."""
        entries: list[tuple[bytes, bytes | None]] = [
            (schema.offset_commit_key(group_id, t, p), None) for t, p in partitions]
        if group:
            entries.append((schema.group_metadata_key(group_id), None))
        return self._append(group_id, entries, offsets=True)

    # --- loading ------------------------------------------------------------------------------
    def new_state(self) -> LoadedState:
        return LoadedState()

    def replay_into(self, log_, state: LoadedState, start: int | None = None, end: int | None = None) -> None:
        for item in log_store.replay(log_, start, end):
            pid = item.header.producer_id
            if item.key is None:  # a transaction marker: its offsets become real, or vanish
                for group, offsets in state.pending_txn_offsets.pop(pid, {}).items():
                    if item.committed:
                        state.offsets.setdefault(group, {}).update(offsets)
                continue
            state.records += 1
            try:
                key = schema.read_key(item.key)
                if item.header.is_transactional and isinstance(key, schema.OffsetCommitKey):
                    if item.value is not None:
                        state.pending_txn_offsets.setdefault(pid, {}).setdefault(key.group, {})[
                            (key.topic, key.partition)] = schema.read_offset_commit_value(item.value)
                else:
                    self._apply(key, item.key, item.value, state)
            except (RecordFormatError, ValueError) as e:
                log.warning("skipping an unreadable record in %s: %s", log_.name, e)

    @staticmethod
    def _apply(key, raw_key: bytes, value: bytes | None, state: LoadedState) -> None:
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
        elif isinstance(key, schema.OtherKey) and key.version in schema.SHARE_GROUP_RECORD_TYPES:
            # Parsed when the group is restored; here only the latest value per key is kept.
            share_key = schema.read_share_group_key(raw_key)
            if share_key is None:
                return
            if value is None:
                state.share_groups.get(share_key.group, {}).pop(bytes(raw_key), None)
            else:
                state.share_groups.setdefault(share_key.group, {})[bytes(raw_key)] = (share_key, bytes(value))
