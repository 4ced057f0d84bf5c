"""SharePartition: what a share group knows of one topic partition (KIP-932).

Members of a share group read the same partition together; each record is handed to one
member at a time. The partition keeps a window of in-flight records starting at the share
partition start offset (SPSO): every offset in [start_offset, end_offset) has a state, and
offsets from end_offset on were never delivered. A fetch acquires records (AVAILABLE ->
ACQUIRED, delivery count + 1) under an acquisition lock; the member then accepts
(ACKNOWLEDGED), rejects (ARCHIVED) or releases them (AVAILABLE again), or the lock expires and
they become AVAILABLE for someone else. A record whose delivery count reached the limit is
archived instead of made available again. The limit and the window's bound are set by the
caller before each change (KIP-1240's group configs are dynamic): as KIP-1240 says, the limit
is checked when a delivery completes, not when it starts, so a record AVAILABLE when the limit
was lowered below its count gets one final delivery and is archived when that one completes;
only a record restored at its limit (its last delivery cut short by a failover) is archived
without another. A bound lowered below what is in flight stops new acquisitions (redeliveries
of AVAILABLE records go on) until the window drains below it. The start offset moves past every record that is
done (acknowledged or archived), so the window only holds what is still in flight.

This module has no I/O and no clock of its own: times come in as arguments, and what must be
persisted comes out as a `ShareState` (ACQUIRED is stored as AVAILABLE with its delivery
count). As in Kafka, an acquisition alone does not make the partition `dirty`: what changes
it durably is an acknowledgement, a release, an archive, a lock expiry or a move of the start
offset; a record acquired since the last write is, after a crash, AVAILABLE with the delivery
count that write had (never delivered: 0).

Delayed delivery (a Strom extension): a record may carry a not-before time (the
`strom.not-before` header, read by the caller from the log and passed in with its LogBatch) and
a RELEASE may come with a delay (`release_delay_ms`). A record not yet due stays AVAILABLE with
its not-before; acquisition passes over it until then. The not-before of an AVAILABLE record is
persisted with the state (StateBatch.not_before, a Strom-only field of the state RPCs and
records), so a restored record waits exactly as long as it would have; a never-delivered one
restored without one has its header read from the log again.

Dead letters (KIP-1191's design, `strom.share.dead_letters` writes them): in a group with a
dead-letter topic, a record rejected (REJECT) or out of deliveries is not ARCHIVED at once but
becomes DEAD_LETTER_REJECTED or DEAD_LETTER_EXHAUSTED, Strom-only persisted states ("dead letter
pending", with the reason). Such a record holds the window like an in-flight one. It is handed
to the writer only once a state write holding it succeeded (`dead_letters_persisted`), and is
ARCHIVED when its dead letter is in the topic (`dead_letters_written`). A restored pending
record may have been written before the crash: it waits in `recovering` until the writer has
looked in the topic (`strom.share.dead_letters` says how that is bounded and why it is exact).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field

from strom.protocol.errors import ErrorCode

# Record states, with the ids Kafka's RecordState persists.
AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED = 0, 1, 2, 4
# Strom's own persisted states: a dead letter not yet in the group's dead-letter topic, and why.
DEAD_LETTER_REJECTED, DEAD_LETTER_EXHAUSTED = 16, 17
DEAD_LETTER_STATES = (DEAD_LETTER_REJECTED, DEAD_LETTER_EXHAUSTED)
# Acknowledge types of ShareFetch/ShareAcknowledge; RENEW (KIP-1222) from their v2 on.
GAP, ACCEPT, RELEASE, REJECT, RENEW = 0, 1, 2, 3, 4
ACKNOWLEDGE_TYPES = frozenset({GAP, ACCEPT, RELEASE, REJECT})
ACKNOWLEDGE_TYPES_V2 = ACKNOWLEDGE_TYPES | {RENEW}
_DONE = (ACKNOWLEDGED, ARCHIVED)
# A restored record never delivered whose header (a not-before) has not been read yet.
UNCHECKED = -1

# One acknowledgement batch of a request: first offset, last offset, acknowledge types.
AckBatch = tuple[int, int, list[int]]


def valid_acknowledgements(batches: Iterable[AckBatch], types: frozenset[int] = ACKNOWLEDGE_TYPES) -> bool:
    """Kafka's checks of one partition's acknowledgement batches, before any record is looked
    at: in offset order and not overlapping, lastOffset >= firstOffset, one acknowledge type
    for the whole batch or one per offset, each a known type. Costs one step per batch and
    type, whatever ranges the batches claim; a request that repeats or overlaps batches is
    refused here instead of making the broker walk the same offsets again and again."""
    previous_last = -1
    for first, last, kinds in batches:
        if first <= previous_last or last < first or not kinds:
            return False
        if len(kinds) != 1 and len(kinds) != last - first + 1:
            return False
        if any(kind not in types for kind in kinds):
            return False
        previous_last = last
    return True


@dataclass(frozen=True, slots=True)
class StateBatch:
    """A run of offsets sharing one persisted state and delivery count."""

    first_offset: int
    last_offset: int
    state: int
    delivery_count: int
    not_before: int = 0  # Strom's own: epoch ms before which an AVAILABLE record is not acquired


@dataclass(slots=True)
class ShareState:
    """What `__share_group_state` keeps of a share partition."""

    start_offset: int
    batches: list[StateBatch] = field(default_factory=list)
    state_epoch: int = 0
    # The newest leader epoch of the data partition that read or wrote this state: a leader
    # with an older one is fenced (the share coordinator keeps it; a SharePartition does not).
    leader_epoch: int = -1


def delivery_complete_count(state: ShareState) -> int:
    """KIP-1226: how many records at or after the start offset are done with (ACKNOWLEDGED or
    ARCHIVED), derived from the stored runs; a dead letter not yet written is not done. With the
    partition's end offset it gives the share-partition lag (end - start - this); -1: unknown."""
    start = state.start_offset
    if start < 0:
        return -1
    return sum(b.last_offset - max(b.first_offset, start) + 1
               for b in state.batches if b.state in _DONE and b.last_offset >= start)


@dataclass(slots=True)
class InFlight:
    state: int
    delivery_count: int = 0
    member_id: str | None = None
    deadline_ms: int = 0
    not_before: int = 0  # epoch ms before which it is not acquired; UNCHECKED: header not read yet


@dataclass(frozen=True, slots=True)
class LogBatch:
    """The offsets a record batch of the log covers, as the fetch found them."""

    base_offset: int
    last_offset: int
    skip: bool = False  # a control batch, or aborted data a read_committed group never sees
    # offset -> not-before (epoch ms) of its records that carry one; None: none does
    not_before: dict[int, int] | None = None


@dataclass(frozen=True, slots=True)
class Acquired:
    first_offset: int
    last_offset: int
    delivery_count: int


class SharePartition:
    def __init__(self, start_offset: int, *, delivery_limit: int, max_in_flight: int,
                 state: ShareState | None = None) -> None:
        self.delivery_limit = delivery_limit
        self.max_in_flight = max_in_flight
        self.start_offset = start_offset
        self.end_offset = start_offset
        self.records: dict[int, InFlight] = {}
        self.state_epoch = 0
        # (deadline, offset) of each acquisition, earliest first; stale entries are skipped.
        self._locks: list[tuple[int, int]] = []
        # (not-before, offset) of each record made to wait, earliest first; stale entries skipped.
        self._due: list[tuple[int, int]] = []
        self._unchecked_to = 0  # restored records below it may still have headers to read
        # Restored AVAILABLE records already delivered, not acquired since: one at the limit is
        # archived at its next acquisition (its last delivery was cut short by a failover).
        self._restored: set[int] = set()
        self.dirty = False  # changed since the last persisted ShareState
        self.leader_epoch = -1  # of the partition's leader that loaded it: its writes carry it
        # Dead letters: whether the group has a dead-letter topic now (set by the caller), the
        # pending ones no state write has carried yet, those persisted and ready to be written,
        # and those restored that may have been written before (looked for in the topic first).
        self.dead_letters = False
        self._unpersisted: set[int] = set()
        self.ready: set[int] = set()
        self.recovering: set[int] = set()
        if state is not None:
            self._restore(state)

    def _restore(self, state: ShareState) -> None:
        self.start_offset = self.end_offset = state.start_offset
        self.state_epoch = state.state_epoch
        for b in state.batches:
            for offset in range(max(b.first_offset, self.start_offset), b.last_offset + 1):
                self.records[offset] = InFlight(b.state, b.delivery_count)
                if b.not_before > 0 and b.state == AVAILABLE:
                    self._delay(self.records[offset], offset, b.not_before)
                if b.state == AVAILABLE and b.delivery_count > 0:
                    self._restored.add(offset)
            self.end_offset = max(self.end_offset, b.last_offset + 1)
        for offset in range(self.start_offset, self.end_offset):  # holes: never delivered
            self.records.setdefault(offset, InFlight(AVAILABLE))
        self.recovering = {o for o, r in self.records.items() if r.state in DEAD_LETTER_STATES}
        self._advance_start()
        for record in self.records.values():
            if record.state == AVAILABLE and record.delivery_count == 0 and record.not_before == 0:
                record.not_before = UNCHECKED
        self._unchecked_to = self.end_offset

    def _delay(self, record: InFlight, offset: int, not_before: int) -> None:
        record.not_before = max(record.not_before, not_before)
        heapq.heappush(self._due, (record.not_before, offset))

    def next_due(self, now_ms: int) -> int | None:
        """The earliest not-before after `now_ms` of a record still waiting for it, if any."""
        due, records = self._due, self.records
        while due:
            at, offset = due[0]
            record = records.get(offset)
            if at > now_ms and record is not None and record.state == AVAILABLE and record.not_before == at:
                return at
            heapq.heappop(due)
        return None

    def needs_headers(self, base_offset: int, last_offset: int) -> bool:
        """Whether the records of a log batch need their not-before read: it holds records
        never seen, or restored ones whose headers were not read yet."""
        if last_offset >= self.end_offset:
            return True
        if base_offset >= self._unchecked_to:
            return False
        records = self.records
        return any(records[o].not_before == UNCHECKED
                   for o in range(max(base_offset, self.start_offset), min(last_offset + 1, self._unchecked_to)))

    # --- what a fetch may take -----------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return self.end_offset - self.start_offset

    def fetch_offset(self, now_ms: int = 0) -> int | None:
        """Where the next fetch should read from: the first AVAILABLE record due at `now_ms`,
        else the end of the window; None when nothing is available and the window is full."""
        for offset in range(self.start_offset, self.end_offset):
            record = self.records[offset]
            if record.state == AVAILABLE and record.not_before <= now_ms:
                return offset
        return self.end_offset if self.in_flight < self.max_in_flight else None

    def acquire(self, member_id: str, batches: Iterable[LogBatch], max_records: int, now_ms: int,
                lock_ms: int, record_limit: bool = False) -> list[Acquired]:
        """Acquire for `member_id` the available records among `batches` (read from the log in
        offset order) and records never delivered, at most `max_records` of the former and new
        batches whole (Kafka's batch alignment) while the window has room. With `record_limit`
        (KIP-1206's record_limit acquire mode) never more than `max_records` in all: a new
        batch is taken in part, the rest of it stays never delivered."""
        deadline = now_ms + lock_ms
        taken: list[tuple[int, int]] = []  # (offset, delivery count)
        for batch in batches:
            if len(taken) >= max_records:
                break
            not_before = batch.not_before
            for offset in range(max(batch.base_offset, self.start_offset), min(batch.last_offset + 1, self.end_offset)):
                if len(taken) >= max_records:
                    break
                record = self.records[offset]
                if record.state != AVAILABLE:
                    continue
                if record.not_before == UNCHECKED:
                    record.not_before = 0
                    if not_before and not_before.get(offset, 0) > now_ms:
                        self._delay(record, offset, not_before[offset])
                if record.not_before > now_ms:
                    continue
                if batch.skip:
                    record.state, record.member_id = ARCHIVED, None
                    self.dirty = True
                    continue
                if self._restored and offset in self._restored:
                    self._restored.discard(offset)
                    if record.delivery_count >= self.delivery_limit:  # restored after a crash
                        record.member_id = None
                        self._archive(record, offset, DEAD_LETTER_EXHAUSTED)
                        continue
                taken.append((offset, self._take(record, member_id, deadline, offset)))
            if batch.last_offset < self.end_offset:
                continue
            if self.in_flight >= self.max_in_flight or (record_limit and len(taken) >= max_records):
                break
            # A batch not delivered yet: the offsets before it that the log no longer has
            # (compacted away) are done; the batch is taken whole.
            for offset in range(self.end_offset, batch.base_offset):
                self.records[offset] = InFlight(ARCHIVED)
            first = max(batch.base_offset, self.end_offset)
            last = batch.last_offset
            if record_limit and not batch.skip:
                last = min(last, first + max_records - len(taken) - 1)
            records = self.records
            if batch.skip:
                for offset in range(first, last + 1):
                    records[offset] = InFlight(ARCHIVED)
            elif not_before:  # records with a not-before: those not due yet wait
                for offset in range(first, last + 1):
                    at = not_before.get(offset, 0)
                    if at > now_ms:
                        records[offset] = InFlight(AVAILABLE)
                        self._delay(records[offset], offset, at)
                    else:
                        records[offset] = InFlight(ACQUIRED, 1, member_id, deadline)
                        taken.append((offset, 1))
            else:  # the common path: a new batch, every record acquired once
                for offset in range(first, last + 1):
                    records[offset] = InFlight(ACQUIRED, 1, member_id, deadline)
                    taken.append((offset, 1))
            if batch.skip or first > self.end_offset:
                self.dirty = True  # records archived
            self.end_offset = last + 1
        if taken:
            heapq.heappush(self._locks, (deadline, taken[0][0]))
        self._advance_start()
        return _ranges(taken)

    def _take(self, record: InFlight, member_id: str, deadline: int, offset: int) -> int:
        record.state, record.member_id, record.deadline_ms = ACQUIRED, member_id, deadline
        record.delivery_count += 1
        return record.delivery_count

    # --- acknowledgements ----------------------------------------------------------------------
    def acknowledge(self, member_id: str, batches: list[AckBatch], now_ms: int = 0, lock_ms: int = 0,
                    types: frozenset[int] = ACKNOWLEDGE_TYPES, release_delay_ms: int = 0) -> ErrorCode:
        """Apply one request's acknowledgements for this partition, all or none: the batches
        must pass `valid_acknowledgements` and every offset be ACQUIRED by `member_id`. The
        batches being ordered and apart, the walk stops at the first offset the member does
        not hold: its cost is bounded by what the member holds, not by what the batches claim.
        RENEW keeps a record acquired under a new lock of `lock_ms` from `now_ms`; nothing
        about it is persisted (a lock is not). A released record is not acquired again before
        `release_delay_ms` from `now_ms`."""
        if not valid_acknowledgements(batches, types):
            return ErrorCode.INVALID_REQUEST
        checked: list[AckBatch] = []
        get = self.records.get
        for first, last, kinds in batches:
            for offset in range(first, last + 1):
                record = get(offset)
                if record is None or record.state != ACQUIRED or record.member_id != member_id:
                    return ErrorCode.INVALID_RECORD_STATE
            checked.append((first, last, kinds))
        records = self.records
        changed = False
        for first, last, kinds in checked:
            renewed_from = None
            for offset in range(first, last + 1):
                kind = kinds[0] if len(kinds) == 1 else kinds[offset - first]
                record = records[offset]
                if kind == RENEW:
                    record.deadline_ms = now_ms + lock_ms
                    if renewed_from is None:
                        renewed_from = offset
                    continue
                changed = True
                if kind == ACCEPT:
                    record.state = ACKNOWLEDGED
                elif kind == RELEASE:
                    self._make_available(record, offset)
                    if release_delay_ms > 0 and record.state == AVAILABLE:
                        self._delay(record, offset, now_ms + release_delay_ms)
                elif kind == REJECT:  # never delivered again; a dead letter where the group has a topic
                    self._archive(record, offset, DEAD_LETTER_REJECTED)
                else:  # GAP: not a record
                    record.state = ARCHIVED
                record.member_id = None
            if renewed_from is not None:
                heapq.heappush(self._locks, (now_ms + lock_ms, renewed_from))
        if changed:
            self.dirty = True
            self._advance_start()
        return ErrorCode.NONE

    def release_member(self, member_id: str) -> bool:
        """The member left or its session ended: what it holds goes back. True if anything did."""
        released = False
        for offset, record in self.records.items():
            if record.state == ACQUIRED and record.member_id == member_id:
                self._make_available(record, offset)
                released = True
        if released:
            self.dirty = True
            self._advance_start()
        return released

    def expire_locks(self, now_ms: int) -> bool:
        """Acquisition locks past their deadline release their records. True if any did."""
        expired = False
        while self._locks and self._locks[0][0] <= now_ms:
            _, first = heapq.heappop(self._locks)
            for offset in range(max(first, self.start_offset), self.end_offset):
                record = self.records[offset]
                if record.state == ACQUIRED and record.deadline_ms <= now_ms:
                    self._make_available(record, offset)
                    expired = True
        if expired:
            self.dirty = True
            self._advance_start()
        return expired

    def next_lock_deadline(self) -> int | None:
        return self._locks[0][0] if self._locks else None

    def _make_available(self, record: InFlight, offset: int) -> None:
        record.member_id = None
        if record.delivery_count >= self.delivery_limit:
            self._archive(record, offset, DEAD_LETTER_EXHAUSTED)
        else:
            record.state = AVAILABLE

    def _archive(self, record: InFlight, offset: int, reason: int) -> None:
        """A record no member gets again: ARCHIVED, or, in a group with a dead-letter topic, a
        dead letter pending for `reason`."""
        self.dirty = True
        if self.dead_letters:
            record.state = reason
            self._unpersisted.add(offset)
        else:
            record.state = ARCHIVED

    # --- dead letters --------------------------------------------------------------------------
    @property
    def dead_letters_to_persist(self) -> bool:
        """Pending dead letters no state write has carried yet (one must, before they go)."""
        return bool(self._unpersisted)

    def snapshot_dead_letters(self) -> frozenset[int]:
        """Taken with a state snapshot about to be written: the pending dead letters it is the
        first to carry."""
        taken, self._unpersisted = frozenset(self._unpersisted), set()
        return taken

    def dead_letters_persisted(self, offsets: Iterable[int], ok: bool) -> None:
        """The write of a snapshot that carried `offsets` ended: if it succeeded they may be
        written to the topic; if not, the next write carries them."""
        records = self.records
        pending = {o for o in offsets if (r := records.get(o)) is not None and r.state in DEAD_LETTER_STATES}
        if ok:
            self.ready |= pending
        else:
            self._unpersisted |= pending

    def dead_letter(self, offset: int) -> InFlight | None:
        """The pending dead letter at `offset`, if it still is one."""
        record = self.records.get(offset)
        return record if record is not None and record.state in DEAD_LETTER_STATES else None

    def dead_letters_written(self, offsets: Iterable[int]) -> bool:
        """These dead letters are in the topic (or will never be: the group's topic is gone or
        refuses them): ARCHIVED. True if any was still pending."""
        changed = False
        for offset in offsets:
            self.ready.discard(offset)
            self.recovering.discard(offset)
            if self.dead_letter(offset) is not None:
                self.records[offset].state = ARCHIVED
                changed = True
        if changed:
            self.dirty = True
            self._advance_start()
        return changed

    # --- the window ----------------------------------------------------------------------------
    def _advance_start(self) -> None:
        records, start, end = self.records, self.start_offset, self.end_offset
        while start < end and records[start].state in _DONE:
            del records[start]
            start += 1
        if start != self.start_offset:
            self.start_offset = start
            self.dirty = True

    def move_start(self, offset: int) -> None:
        """The log no longer has records below `offset` (retention, DeleteRecords)."""
        if offset <= self.start_offset:
            return
        for o in range(self.start_offset, min(offset, self.end_offset)):
            del self.records[o]
        for pending in (self._unpersisted, self.ready, self.recovering, self._restored):
            pending.difference_update([o for o in pending if o < offset])
        self.start_offset = offset
        self.end_offset = max(self.end_offset, offset)
        self.dirty = True

    def reset(self, offset: int) -> None:
        """AlterShareGroupOffsets: start over at `offset` (only while no member consumes)."""
        self.records.clear()
        self._locks.clear()
        self._due.clear()
        self._unpersisted.clear()
        self.ready.clear()
        self.recovering.clear()
        self._restored.clear()
        self._unchecked_to = 0
        self.start_offset = self.end_offset = offset
        self.state_epoch += 1
        self.dirty = True

    def acquired_count(self) -> int:
        return sum(1 for r in self.records.values() if r.state == ACQUIRED)

    def state(self) -> ShareState:
        """The persisted form: runs of (state, delivery count, not-before) over the window,
        ACQUIRED kept as AVAILABLE (after a crash its lock is gone, its delivery count is not);
        a not-before only for a record AVAILABLE now."""
        runs: list[list[int]] = []  # [first, last, state, count, not-before]
        run: list[int] | None = None
        records = self.records
        for offset in range(self.start_offset, self.end_offset):
            record = records[offset]
            state = AVAILABLE if record.state == ACQUIRED else record.state
            not_before = record.not_before if record.state == AVAILABLE and record.not_before > 0 else 0
            if run is not None and run[2] == state and run[3] == record.delivery_count and run[4] == not_before:
                run[1] = offset
            else:
                run = [offset, offset, state, record.delivery_count, not_before]
                runs.append(run)
        return ShareState(self.start_offset, [StateBatch(*r) for r in runs], self.state_epoch)


def _ranges(taken: list[tuple[int, int]]) -> list[Acquired]:
    """Contiguous offsets with one delivery count, as ShareFetch's AcquiredRecords."""
    runs: list[list[int]] = []
    run: list[int] | None = None
    for offset, count in taken:
        if run is not None and run[1] == offset - 1 and run[2] == count:
            run[1] = offset
        else:
            run = [offset, offset, count]
            runs.append(run)
    return [Acquired(*r) for r in runs]
