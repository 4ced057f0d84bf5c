"""One partition's remote segments as `__remote_log_metadata` records, applied in order, leave
them (Kafka's RemoteLogMetadataCache and RemoteLogLeaderEpochState): which segment serves an
offset, what each leader epoch holds, and what is left for cleaning.

Per leader epoch, the COPY_SEGMENT_FINISHED segments are mapped by the offset at which the
epoch starts in them; every other segment of the epoch (a copy STARTED and never finished, one
being deleted, one replaced by a later copy of the same offsets) is unreferenced: listed, so it
can be deleted, but never served. A segment leaves the cache at DELETE_SEGMENT_FINISHED.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Sequence

from strom.log.remote import records
from strom.log.remote.metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
)

_S = RemoteLogSegmentState
# Kafka's RemoteLogSegmentState.isValidTransition; None: the segment is not known yet. A copy
# STARTED may go straight to DELETE_SEGMENT_STARTED: that is how an orphan is cleaned.
_SEGMENT_NEXT: dict[RemoteLogSegmentState | None, frozenset[RemoteLogSegmentState]] = {
    None: frozenset({_S.COPY_SEGMENT_STARTED}),
    _S.COPY_SEGMENT_STARTED: frozenset({_S.COPY_SEGMENT_FINISHED, _S.DELETE_SEGMENT_STARTED}),
    _S.COPY_SEGMENT_FINISHED: frozenset({_S.DELETE_SEGMENT_STARTED}),
    _S.DELETE_SEGMENT_STARTED: frozenset({_S.DELETE_SEGMENT_FINISHED}),
    _S.DELETE_SEGMENT_FINISHED: frozenset(),
}
_P = records.RemotePartitionDeleteState
_PARTITION_NEXT: dict[_P | None, frozenset[_P]] = {
    None: frozenset({_P.DELETE_PARTITION_MARKED}),
    _P.DELETE_PARTITION_MARKED: frozenset({_P.DELETE_PARTITION_STARTED}),
    _P.DELETE_PARTITION_STARTED: frozenset({_P.DELETE_PARTITION_FINISHED}),
    _P.DELETE_PARTITION_FINISHED: frozenset(),
}


class RemoteLogMetadataStateError(ValueError):
    """A record the partition's remote log metadata does not allow: a state transition Kafka's
    states forbid, or an update of a segment that was never started (or is gone)."""


def is_valid_transition(source: RemoteLogSegmentState | None, target: RemoteLogSegmentState) -> bool:
    """Whether a segment in `source` (None: unknown) may move to `target`; the same state again
    is allowed, as a retried or failed-over writer repeats its last record."""
    return source == target or target in _SEGMENT_NEXT[source]


class _EpochState:
    """The segments of one leader epoch (Kafka's RemoteLogLeaderEpochState)."""

    __slots__ = ("starts", "by_start", "unreferenced", "highest_offset")

    def __init__(self) -> None:
        self.starts: list[int] = []  # ascending: the keys of by_start
        self.by_start: dict[int, RemoteLogSegmentId] = {}  # COPY_SEGMENT_FINISHED only
        self.unreferenced: set[RemoteLogSegmentId] = set()
        self.highest_offset: int | None = None  # of the segments that reached FINISHED

    def copy_started(self, segment_id: RemoteLogSegmentId) -> None:
        self.unreferenced.add(segment_id)

    def copy_finished(self, start: int, segment_id: RemoteLogSegmentId, epoch_end: int) -> None:
        # A new leader may copy again what its predecessor had copied (or part of it) for this
        # epoch: a segment reaching at least as far replaces those starting at or after its start.
        while self.starts and self.starts[-1] >= start and self.highest_offset <= epoch_end:
            self.unreferenced.add(self.by_start.pop(self.starts.pop()))
        replaced = self.by_start.get(start)
        if replaced is None:
            bisect.insort(self.starts, start)
        elif replaced != segment_id:
            self.unreferenced.add(replaced)
        self.by_start[start] = segment_id
        self.unreferenced.discard(segment_id)
        if self.highest_offset is None or epoch_end > self.highest_offset:
            self.highest_offset = epoch_end

    def delete_started(self, start: int, segment_id: RemoteLogSegmentId) -> None:
        if self.by_start.get(start) == segment_id:
            del self.by_start[start]
            self.starts.pop(bisect.bisect_left(self.starts, start))
        self.unreferenced.add(segment_id)  # listed until deleted, so a deletion can be retried

    def delete_finished(self, segment_id: RemoteLogSegmentId) -> None:
        self.unreferenced.discard(segment_id)

    def floor(self, offset: int) -> RemoteLogSegmentId | None:
        i = bisect.bisect_right(self.starts, offset)
        return self.by_start[self.starts[i - 1]] if i else None


def epoch_end_offset(metadata: RemoteLogSegmentMetadata, epoch: int) -> int:
    """The last offset of `epoch` within the segment: where the next epoch of the segment starts,
    less one, or the segment's end."""
    for e, start in metadata.segment_leader_epochs:
        if e > epoch:
            return start - 1
    return metadata.end_offset


def _with_data(epochs: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (epoch, start offset) entries without the epochs that hold no record (those starting
    where the next one starts), as Kafka's buildFilteredLeaderEpochMap."""
    entries = list(epochs)
    return [e for e, nxt in zip(entries, [*entries[1:], None], strict=True) if nxt is None or nxt[1] != e[1]]


def is_within_lineage(metadata: RemoteLogSegmentMetadata, lineage: Sequence[tuple[int, int]],
                      log_end_offset: int | None = None) -> bool:
    """Whether the segment belongs to the leader's epoch lineage (its epoch cache entries,
    (epoch, start offset) ascending), as Kafka's isRemoteSegmentWithinLeaderEpochs: past its first
    epoch the lineage knows, each of the segment's epochs starts where the lineage says and the
    segment ends before the lineage's next epoch. A segment of epochs that an unclean election
    truncated away fails this, and must not be served."""
    segment = _with_data(metadata.segment_leader_epochs)
    leader = _with_data(lineage)
    if not segment or not leader:
        return False
    first_leader_epoch, last_leader_epoch = leader[0][0], leader[-1][0]
    segment_last = segment[-1][0]
    if not first_leader_epoch <= segment_last <= last_leader_epoch:
        return False
    # The lineage may have lost its oldest epochs to retention: judge from its first one on.
    first = next(i for i, (epoch, _) in enumerate(segment) if epoch >= first_leader_epoch)
    index = {epoch: i for i, (epoch, _) in enumerate(leader)}
    for i in range(first, len(segment)):
        epoch, start = segment[i]
        at = index.get(epoch)
        if at is None:
            return False
        following = leader[at + 1] if at + 1 < len(leader) else None
        if i == first and at > 0 and start < leader[at][1]:
            return False  # the segment starts this epoch before the leader did
        if epoch == segment_last:
            if following is not None and metadata.end_offset > following[1] - 1:
                return False  # it runs into an epoch the leader does not have it in
        elif following != segment[i + 1]:
            return False
    return log_end_offset is None or metadata.end_offset < log_end_offset


class RemoteLogMetadataCache:
    """The remote segments of one partition. Records go in through `apply` (or the methods it
    calls) in the order of the metadata topic; a record the states do not allow raises
    RemoteLogMetadataStateError and changes nothing."""

    def __init__(self) -> None:
        self._segments: dict[RemoteLogSegmentId, RemoteLogSegmentMetadata] = {}
        self._epochs: dict[int, _EpochState] = {}
        self._custom: dict[RemoteLogSegmentId, bytes] = {}
        self.partition_delete_state: records.RemotePartitionDeleteState | None = None

    def apply(self, record: records.RemoteLogMetadata) -> None:
        if isinstance(record, RemoteLogSegmentMetadata):
            self.add_copy_in_progress(record)
        elif isinstance(record, records.RemoteLogSegmentMetadataUpdate):
            self.update(record)
        elif isinstance(record, records.RemotePartitionDeleteMetadata):
            self.mark_partition_delete(record)
        else:
            raise TypeError(f"not remote log metadata: {type(record).__name__}")

    def add_copy_in_progress(self, metadata: RemoteLogSegmentMetadata) -> None:
        """A copy has started: the segment is known, listed under each of its epochs, not served."""
        if metadata.state is not _S.COPY_SEGMENT_STARTED:
            raise RemoteLogMetadataStateError(
                f"segment {metadata.segment_id.id} arrives in {metadata.state.name}, not COPY_SEGMENT_STARTED")
        if not metadata.segment_leader_epochs:
            raise RemoteLogMetadataStateError(f"segment {metadata.segment_id.id} has no leader epochs")
        existing = self._segments.get(metadata.segment_id)
        self._check(metadata.segment_id, existing.state if existing else None, metadata.state)
        for epoch, _ in metadata.segment_leader_epochs:
            self._epochs.setdefault(epoch, _EpochState()).copy_started(metadata.segment_id)
        self._segments[metadata.segment_id] = metadata

    def update(self, update: records.RemoteLogSegmentMetadataUpdate) -> None:
        existing = self._segments.get(update.segment_id)
        if existing is None:
            raise RemoteLogMetadataStateError(
                f"{update.state.name} for segment {update.segment_id.id}, which was never started or is deleted")
        self._check(update.segment_id, existing.state, update.state)
        if update.state is _S.COPY_SEGMENT_STARTED:
            raise RemoteLogMetadataStateError("a copy starts with the segment's metadata, not an update")
        metadata = dataclasses.replace(existing, state=update.state, broker_id=update.broker_id,
                                       event_timestamp_ms=update.event_timestamp_ms)
        segment_id = metadata.segment_id
        for epoch, start in metadata.segment_leader_epochs:
            state = self._epochs.setdefault(epoch, _EpochState())
            if update.state is _S.COPY_SEGMENT_FINISHED:
                state.copy_finished(start, segment_id, epoch_end_offset(metadata, epoch))
            elif update.state is _S.DELETE_SEGMENT_STARTED:
                state.delete_started(start, segment_id)
            else:
                state.delete_finished(segment_id)
        if update.state is _S.DELETE_SEGMENT_FINISHED:
            del self._segments[segment_id]
            self._custom.pop(segment_id, None)
            return
        self._segments[segment_id] = metadata
        # an update carries the segment's whole custom metadata, as Kafka's createWithUpdates
        if update.custom_metadata is None:
            self._custom.pop(segment_id, None)
        else:
            self._custom[segment_id] = update.custom_metadata

    def mark_partition_delete(self, record: records.RemotePartitionDeleteMetadata) -> None:
        source, target = self.partition_delete_state, record.state
        if source != target and target not in _PARTITION_NEXT[source]:
            raise RemoteLogMetadataStateError(
                f"partition deletion cannot go from {source.name if source else 'none'} to {target.name}")
        self.partition_delete_state = target

    @staticmethod
    def _check(segment_id: RemoteLogSegmentId, source: RemoteLogSegmentState | None,
               target: RemoteLogSegmentState) -> None:
        if not is_valid_transition(source, target):
            raise RemoteLogMetadataStateError(
                f"segment {segment_id.id} cannot go from {source.name if source else 'unknown'} to {target.name}")

    # --- reading ---

    def segment(self, segment_id: RemoteLogSegmentId) -> RemoteLogSegmentMetadata | None:
        return self._segments.get(segment_id)

    def custom_metadata(self, segment_id: RemoteLogSegmentId) -> bytes | None:
        """What the store returned from the segment's copy, to hand back to it on reads."""
        return self._custom.get(segment_id)

    def segment_for(self, leader_epoch: int, offset: int, lineage: Sequence[tuple[int, int]] | None = None,
                    log_end_offset: int | None = None) -> RemoteLogSegmentMetadata | None:
        """The COPY_SEGMENT_FINISHED segment holding `offset` in `leader_epoch` (the epoch the
        leader's cache gives the offset), or None. Given the leader's epoch cache entries as
        `lineage`, a segment outside that lineage is not returned (see is_within_lineage)."""
        state = self._epochs.get(leader_epoch)
        segment_id = state.floor(offset) if state else None
        if segment_id is None:
            return None
        metadata = self._segments[segment_id]
        if offset > epoch_end_offset(metadata, leader_epoch):
            return None
        if lineage is not None and not is_within_lineage(metadata, lineage, log_end_offset):
            return None
        return metadata

    def segments_for_epoch(self, leader_epoch: int) -> list[RemoteLogSegmentMetadata]:
        """Every segment of the epoch not yet deleted, served or not, by start offset."""
        state = self._epochs.get(leader_epoch)
        if state is None:
            return []
        ids = [*state.by_start.values(), *state.unreferenced]
        return sorted((self._segments[i] for i in ids), key=_start_offset)

    def all_segments(self) -> list[RemoteLogSegmentMetadata]:
        """Every segment not yet deleted, by start offset."""
        return sorted(self._segments.values(), key=_start_offset)

    def highest_offset_for_epoch(self, leader_epoch: int) -> int | None:
        """The last offset of the epoch copied so far (by a segment that reached
        COPY_SEGMENT_FINISHED, deleted since or not): where the next copy of the epoch starts."""
        state = self._epochs.get(leader_epoch)
        return state.highest_offset if state else None

    def unreferenced_segments(self) -> list[RemoteLogSegmentMetadata]:
        """Segments no epoch serves: copies left COPY_SEGMENT_STARTED (orphans of an interrupted
        copy, or one still running: the caller knows which), segments being deleted, and those
        a later copy of the same offsets replaced. What cleaning deletes."""
        served = {i for state in self._epochs.values() for i in state.by_start.values()}
        return sorted((m for i, m in self._segments.items() if i not in served), key=_start_offset)


def _start_offset(metadata: RemoteLogSegmentMetadata) -> int:
    return metadata.start_offset
