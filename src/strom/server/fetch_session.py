"""Incremental fetch sessions (KIP-227), FetchManager in the seeds' start-up list.

A consumer of many partitions sends its whole partition list once; the broker keeps it in a
session, and later fetches name only the partitions whose position changed (plus the ones to
forget), while responses carry only partitions with something new: records, a moved high
watermark, last stable offset or log start offset, or an error. The cost of a fetch then
follows what changed, not how many partitions the consumer reads.

Request metadata, as the protocol defines it:
- session 0, epoch -1: a full fetch outside any session;
- session 0, epoch 0: a full fetch that opens a session (when a slot is free);
- session N, epoch -1: close N, then a full fetch outside any session;
- session N, epoch 0: close N, then a full fetch opening a new session;
- session N, epoch E > 0: an incremental fetch of session N, whose next epoch must be E.
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from strom.protocol.errors import ErrorCode

INVALID_SESSION, INITIAL_EPOCH, FINAL_EPOCH = 0, 0, -1
# A session unused this long may be evicted for a new one (Kafka's
# MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS).
EVICTION_MS = 120_000
# Strom's bound on what all sessions remember together (about 150 bytes each): beyond it,
# fetches go on without a session rather than the broker growing without end.
MAX_CACHED_PARTITIONS = 1_000_000


@dataclass(slots=True)
class CachedPartition:
    """What the session remembers of one partition: the last request's fetch state (the
    fields a request partition has) and the last values sent back."""
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1
    log_start_offset: int = -1
    sent_high_watermark: int = -1  # -1: never sent, so the first response includes it
    sent_last_stable_offset: int = -1
    sent_log_start_offset: int = -1

    @classmethod
    def of(cls, p: Any) -> CachedPartition:
        return cls(p.partition, p.fetch_offset, p.partition_max_bytes,
                   getattr(p, "current_leader_epoch", -1), getattr(p, "last_fetched_epoch", -1),
                   getattr(p, "log_start_offset", -1))

    def update(self, p: Any) -> None:
        self.fetch_offset, self.partition_max_bytes = p.fetch_offset, p.partition_max_bytes
        self.current_leader_epoch = getattr(p, "current_leader_epoch", -1)
        self.last_fetched_epoch = getattr(p, "last_fetched_epoch", -1)
        self.log_start_offset = getattr(p, "log_start_offset", -1)

    def must_respond(self, data: Any) -> bool:
        """Whether an incremental response includes this partition; remembers what it sent."""
        changed = (data.records is not None or data.error_code != ErrorCode.NONE
                   or data.diverging_epoch is not None
                   or data.high_watermark != self.sent_high_watermark
                   or data.last_stable_offset != self.sent_last_stable_offset
                   or data.log_start_offset != self.sent_log_start_offset)
        self.remember(data)
        return changed

    def remember(self, data: Any) -> None:
        # After an error the next answer is sent again, whatever it holds.
        failed = data.error_code != ErrorCode.NONE
        self.sent_high_watermark = -1 if failed else data.high_watermark
        self.sent_last_stable_offset = data.last_stable_offset
        self.sent_log_start_offset = data.log_start_offset


@dataclass
class FetchSession:
    id: int
    follower: bool
    partitions: dict[tuple[str, int], CachedPartition]  # in the order the client gave them
    epoch: int = 1  # the epoch the next incremental request must carry
    last_used: float = field(default_factory=time.monotonic)


class FetchSessionCache:
    """At most `slots` sessions (max.incremental.fetch.session.cache.slots). A new session
    takes a free slot, or the slot of the least recently used session when that one has been
    idle for EVICTION_MS and is a consumer's or the newcomer is a follower's (followers are
    privileged, as in Kafka); otherwise the fetch goes on without a session."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.sessions: OrderedDict[int, FetchSession] = OrderedDict()  # least recently used first
        self.evictions = 0

    def __len__(self) -> int:
        return len(self.sessions)

    @property
    def partitions_cached(self) -> int:
        return sum(len(s.partitions) for s in self.sessions.values())

    def has_room(self, partitions: int) -> bool:
        return self.partitions_cached + partitions <= MAX_CACHED_PARTITIONS

    def get(self, session_id: int) -> FetchSession | None:
        session = self.sessions.get(session_id)
        if session is not None:
            session.last_used = time.monotonic()
            self.sessions.move_to_end(session_id)
        return session

    def remove(self, session_id: int) -> None:
        self.sessions.pop(session_id, None)

    def create(self, follower: bool, partitions: dict[tuple[str, int], CachedPartition]) -> FetchSession | None:
        if self.slots <= 0 or not self.has_room(len(partitions)):
            return None
        if len(self.sessions) >= self.slots and not self._evict_one(follower):
            return None
        session_id = random.randrange(1, 2**31)
        while session_id in self.sessions:
            session_id = random.randrange(1, 2**31)
        session = FetchSession(session_id, follower, partitions)
        self.sessions[session_id] = session
        return session

    def _evict_one(self, follower: bool) -> bool:
        oldest = next(iter(self.sessions.values()))
        idle = (time.monotonic() - oldest.last_used) * 1000 >= EVICTION_MS
        if idle and (follower or not oldest.follower):
            self.remove(oldest.id)
            self.evictions += 1
            return True
        return False


class FetchContext:
    """One Fetch request seen through the session cache: which partitions to read, and how to
    shape the response (`respond`)."""

    def __init__(self, error: ErrorCode = ErrorCode.NONE, session: FetchSession | None = None,
                 wanted: list[tuple[str, list[Any]]] | None = None, incremental: bool = False) -> None:
        self.error, self.session, self.incremental = error, session, incremental
        self.wanted = wanted or []

    @property
    def session_id(self) -> int:
        return self.session.id if self.session is not None else INVALID_SESSION

    def respond(self, topics: list[tuple[str, list[Any]]]) -> list[tuple[str, list[Any]]]:
        """The response's topics: everything for a full fetch (the session remembering what was
        sent), only what changed for an incremental one."""
        if self.session is None:
            return topics
        cached = self.session.partitions
        out = []
        for topic, partitions in topics:
            if self.incremental:
                kept = [p for p in partitions if cached[(topic, p.index)].must_respond(p)]
                for p in kept:  # partitions that got records go to the back, for fairness
                    if p.records is not None:  # under the response size limit (as Kafka)
                        cached[(topic, p.index)] = cached.pop((topic, p.index))
            else:
                for p in partitions:
                    cached[(topic, p.index)].remember(p)
                kept = list(partitions)
            if kept:
                out.append((topic, kept))
        return out


def _grouped(partitions: Iterable[tuple[tuple[str, int], Any]]) -> list[tuple[str, list[Any]]]:
    by_topic: dict[str, list[Any]] = {}
    for (topic, _), p in partitions:
        by_topic.setdefault(topic, []).append(p)
    return list(by_topic.items())


def new_context(cache: FetchSessionCache, requested: list[tuple[tuple[str, int], Any]],
                forgotten: list[tuple[str, int]], version: int, request: Any, follower: bool) -> FetchContext:
    """The FetchContext of a request (FetchManager.newContext): `requested` are its partitions
    as ((topic, partition), request partition), `forgotten` its forgotten partitions, topics by
    name whatever the version named them by."""
    session_id = getattr(request, "session_id", INVALID_SESSION) if version >= 7 else INVALID_SESSION
    epoch = getattr(request, "session_epoch", FINAL_EPOCH) if version >= 7 else FINAL_EPOCH
    if epoch in (INITIAL_EPOCH, FINAL_EPOCH):  # a full fetch
        if session_id != INVALID_SESSION:
            cache.remove(session_id)
        full = _grouped(requested)
        if epoch == FINAL_EPOCH:
            return FetchContext(wanted=full)
        session = cache.create(follower, {tp: CachedPartition.of(p) for tp, p in requested})
        return FetchContext(session=session, wanted=full)
    session = cache.get(session_id)
    if session is None:
        return FetchContext(ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
    if session.epoch != epoch:
        return FetchContext(ErrorCode.INVALID_FETCH_SESSION_EPOCH)
    session.epoch = epoch + 1 if epoch < 2**31 - 1 else 1  # the epoch wraps to 1, never 0
    cached = session.partitions
    if len(requested) > len(cached) and not cache.has_room(len(requested)):
        cache.remove(session_id)  # the client starts over with a full fetch, sessionless
        return FetchContext(ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
    for tp in forgotten:
        cached.pop(tp, None)
    for tp, p in requested:
        if tp in cached:
            cached[tp].update(p)
        else:
            cached[tp] = CachedPartition.of(p)
    return FetchContext(session=session, wanted=_grouped(cached.items()), incremental=True)
