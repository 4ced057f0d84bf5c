"""ShareCoordinator: what the share coordinator decides for the share partitions whose state
partition of `__share_group_state` this broker leads (KIP-932's Initialize, Read, Write,
Delete and ReadSummary of share-group state), over the ShareStateStore.

Its answers follow Kafka 4.1's share coordinator: a key whose state partition is not led here
is NOT_COORDINATOR (COORDINATOR_LOAD_IN_PROGRESS while it is being replayed); a write from a
leader of an older leader epoch is FENCED_LEADER_EPOCH, one carrying an older state epoch
FENCED_STATE_EPOCH (a state epoch moves when the state starts over: AlterShareGroupOffsets);
a write to a share partition without state is UNKNOWN_TOPIC_OR_PARTITION (state starts with
InitializeShareGroupState); a read from a newer leader epoch records that epoch, which fences
the leader before it. A write's batches replace what the stored state had for their offsets,
so a partial update and a whole window alike give the new state. A summary read (v1, KIP-1226)
answers the delivery-complete count, derived from the stored runs (a v1 write's own count is
not needed: the runs are the whole window).

No I/O of its own: the store appends through the replica manager; each operation returns the
state-topic partitions it wrote, whose replication (acks=all) its caller awaits.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from strom.coordinator.share.share_partition import ShareState, StateBatch, delivery_complete_count
from strom.coordinator.share.state_store import SharePartitionKey, ShareStateStore
from strom.protocol.errors import ErrorCode

UNINITIALIZED = -1  # the start offset a read answers for a share partition without state


@dataclass(slots=True)
class StateResult:
    """One share partition's answer: its error, and for reads its state (None: no state)."""

    error: ErrorCode = ErrorCode.NONE
    state: ShareState | None = None
    message: str | None = None
    # A summary read's KIP-1226 delivery-complete count (-1: unknown or not a summary).
    delivery_complete_count: int = -1


@dataclass(frozen=True, slots=True)
class WriteState:
    """WriteShareGroupState's data for one share partition (-1: keep what is stored)."""

    state_epoch: int
    leader_epoch: int
    start_offset: int
    batches: list[StateBatch] = field(default_factory=list)


Results = dict[SharePartitionKey, StateResult]


class ShareCoordinator:
    def __init__(self, store: ShareStateStore) -> None:
        self.store = store

    def status(self, key: SharePartitionKey) -> ErrorCode:
        """Whether this broker answers for `key` now."""
        if key.partition < 0 or not key.group_id or not key.topic_id.int:
            return ErrorCode.INVALID_REQUEST
        if not self.store.is_local(key.coordinator_key):
            return ErrorCode.NOT_COORDINATOR
        if self.store.partition_for(key.coordinator_key) not in self.store.loaded:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return ErrorCode.NONE

    def read(self, items: Iterable[tuple[SharePartitionKey, int]], *, summary: bool = False
             ) -> tuple[Results, set[int]]:
        """ReadShareGroupState (or, `summary`, ReadShareGroupStateSummary: no fencing, no
        batches) for (key, leader epoch) pairs."""
        results: Results = {}
        raised: list[tuple[SharePartitionKey, ShareState]] = []
        for key, leader_epoch in items:
            error = self.status(key)
            state = self.store.get(key) if error == ErrorCode.NONE else None
            if error != ErrorCode.NONE or state is None:
                results[key] = StateResult(error)
                continue
            if summary:
                results[key] = StateResult(state=ShareState(state.start_offset, [], state.state_epoch,
                                                            state.leader_epoch),
                                           delivery_complete_count=delivery_complete_count(state))
                continue
            if state.leader_epoch > leader_epoch:
                results[key] = StateResult(ErrorCode.FENCED_LEADER_EPOCH)
                continue
            if leader_epoch > state.leader_epoch:  # a new leader: recorded, so that the old one is fenced
                state = ShareState(state.start_offset, list(state.batches), state.state_epoch, leader_epoch)
                raised.append((key, state))
            results[key] = StateResult(state=state)
        errors, written = self.store.write(raised) if raised else ({}, set())
        for key, error in errors.items():
            if error != ErrorCode.NONE:
                results[key] = StateResult(error)
        return results, written

    def initialize(self, items: Iterable[tuple[SharePartitionKey, int, int]]) -> tuple[Results, set[int]]:
        """InitializeShareGroupState for (key, state epoch, start offset): the share partition
        starts over at the offset with nothing in flight, unless its state has that epoch or a
        newer one already (FENCED_STATE_EPOCH)."""
        results: Results = {}
        entries: list[tuple[SharePartitionKey, ShareState]] = []
        for key, state_epoch, start in items:
            error = self.status(key)
            if error == ErrorCode.NONE and start < 0:
                error = ErrorCode.INVALID_REQUEST
            old = self.store.get(key) if error == ErrorCode.NONE else None
            if old is not None and old.state_epoch >= state_epoch:
                error = ErrorCode.FENCED_STATE_EPOCH
            if error != ErrorCode.NONE:
                results[key] = StateResult(error)
                continue
            entries.append((key, ShareState(start, [], state_epoch, -1 if old is None else old.leader_epoch)))
        return self._store(entries, results)

    def write(self, items: Iterable[tuple[SharePartitionKey, WriteState]]) -> tuple[Results, set[int]]:
        results: Results = {}
        entries: list[tuple[SharePartitionKey, ShareState]] = []
        for key, data in items:
            error = self.status(key)
            old = self.store.get(key) if error == ErrorCode.NONE else None
            if error == ErrorCode.NONE:
                if any(b.first_offset < 0 or b.last_offset < b.first_offset for b in data.batches):
                    error = ErrorCode.INVALID_REQUEST
                elif old is None:
                    error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION  # not initialized
                elif old.leader_epoch > data.leader_epoch:
                    error = ErrorCode.FENCED_LEADER_EPOCH
                elif old.state_epoch > data.state_epoch:
                    error = ErrorCode.FENCED_STATE_EPOCH
            if error != ErrorCode.NONE or old is None:
                results[key] = StateResult(error)
                continue
            start = old.start_offset if data.start_offset < 0 else data.start_offset
            entries.append((key, ShareState(
                start, merge_batches(old.batches, data.batches, start),
                old.state_epoch if data.state_epoch < 0 else data.state_epoch,
                old.leader_epoch if data.leader_epoch < 0 else data.leader_epoch)))
        return self._store(entries, results)

    def delete(self, keys: Iterable[SharePartitionKey]) -> tuple[Results, set[int]]:
        results: Results = {}
        entries: list[tuple[SharePartitionKey, ShareState | None]] = []
        for key in keys:
            error = self.status(key)
            if error != ErrorCode.NONE:
                results[key] = StateResult(error)
            elif self.store.get(key) is None:
                results[key] = StateResult()  # nothing to delete
            else:
                entries.append((key, None))
        return self._store(entries, results)

    def _store(self, entries, results: Results) -> tuple[Results, set[int]]:
        if not entries:
            return results, set()
        errors, written = self.store.write(entries)
        for key, _ in entries:
            results[key] = StateResult(errors[key])
        return results, written


def merge_batches(old: list[StateBatch], new: list[StateBatch], start: int) -> list[StateBatch]:
    """The stored batches with `new` in place of what they had for its offsets, from `start` on.
    Runs, not records: O((old + new) log new)."""
    fresh = sorted((b for b in new if b.last_offset >= start), key=lambda b: b.first_offset)
    firsts = [b.first_offset for b in fresh]
    out = list(fresh)
    for b in old:
        first = max(b.first_offset, start)
        i = max(bisect.bisect_right(firsts, first) - 1, 0)
        # Cut the parts of `b` that `fresh` covers; what is left stays.
        while first <= b.last_offset:
            while i < len(fresh) and fresh[i].last_offset < first:
                i += 1
            if i == len(fresh) or fresh[i].first_offset > b.last_offset:
                out.append(replace(b, first_offset=first))
                break
            if fresh[i].first_offset > first:
                out.append(replace(b, first_offset=first, last_offset=fresh[i].first_offset - 1))
            first = fresh[i].last_offset + 1
    out.sort(key=lambda b: b.first_offset)
    return [b if b.first_offset >= start else replace(b, first_offset=start) for b in out]
