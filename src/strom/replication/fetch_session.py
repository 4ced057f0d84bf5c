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
from collections.abc import Callable, Iterable
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
                   or getattr(data, "preferred_read_replica", -1) >= 0  # KIP-392: the client must hear it
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


# A follower's session looks at every partition it holds at its first incremental fetch and
# then every FULL_SCAN_EVERY fetches; between those only at what changed (see `wake`). What
# changes without telling the session (a log start moved by retention) is seen that late.
FULL_SCAN_EVERY = 10


@dataclass
class FetchSession:
    id: int
    follower: bool
    partitions: dict[tuple[str, int], CachedPartition]  # in the order the client gave them
    epoch: int = 1  # the epoch the next incremental request must carry
    last_used: float = field(default_factory=time.monotonic)
    created: float = field(default_factory=time.monotonic)
    # A follower's session on its leader: the partitions to look at next fetch (in order), those
    # the follower is up to date on (their FollowerState: passed by until something changes),
    # the time of its last fetch, and the fetches left until all are looked at again.
    active: dict[tuple[str, int], None] = field(default_factory=dict)
    quiet: dict[tuple[str, int], Any] = field(default_factory=dict)
    fetched_ms: int = 0
    until_full_scan: int = 0

    def wake(self, tp: tuple[str, int]) -> None:
        """`tp` changed on the leader (or the follower named it): looked at next fetch."""
        state = self.quiet.pop(tp, None)
        if state is not None:
            state.caught_up_until(self.fetched_ms)
        self.active[tp] = None

    def make_quiet(self, tp: tuple[str, int], state: Any) -> None:
        if state.quiet_in is not self:
            if state.quiet_in is not None:
                state.quiet_in.wake(tp)
            state.quiet_in = self
            self.quiet[tp] = state
        self.active.pop(tp, None)

    def forget(self, tp: tuple[str, int]) -> None:
        self.partitions.pop(tp, None)
        self.active.pop(tp, None)
        state = self.quiet.pop(tp, None)
        if state is not None:  # no longer fetched here: caught up until the last fetch
            state.caught_up_until(self.fetched_ms)


class FetchSessionCache:
    """At most `slots` sessions (max.incremental.fetch.session.cache.slots). A new session
    takes a free slot, else one evicted as Kafka's FetchSessionCache evicts: the least recently
    used session if it has been idle for EVICTION_MS; otherwise the least valuable session
    the newcomer outranks (followers before consumers, then the larger before the smaller)
    among those older than EVICTION_MS and, for a follower, any consumer's (followers are
    privileged: replication never goes without a session for clients'). If none, the fetch
    goes on without a session."""

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
        if len(self.sessions) >= self.slots and not self._evict_one(follower, len(partitions)):
            return None
        session_id = random.randrange(1, 2**31)
        while session_id in self.sessions:
            session_id = random.randrange(1, 2**31)
        session = FetchSession(session_id, follower, partitions)
        self.sessions[session_id] = session
        return session

    def _evict_one(self, follower: bool, size: int) -> bool:
        now = time.monotonic()
        oldest = next(iter(self.sessions.values()))
        victim: FetchSession | None = oldest if (now - oldest.last_used) * 1000 >= EVICTION_MS else None
        if victim is None:
            evictable = [s for s in self.sessions.values()
                         if (now - s.created) * 1000 >= EVICTION_MS or (follower and not s.follower)]
            weakest = min(evictable, key=lambda s: (s.follower, len(s.partitions)), default=None)
            if weakest is not None and (follower, size) > (weakest.follower, len(weakest.partitions)):
                victim = weakest
        if victim is None:
            return False
        self.remove(victim.id)
        self.evictions += 1
        return True


class FetchContext:
    """One Fetch request seen through the session cache: which partitions to read, and how to
    shape the response (`respond`)."""

    def __init__(self, error: ErrorCode = ErrorCode.NONE, session: FetchSession | None = None,
                 wanted: list[tuple[str, list[Any]]] | None = None, incremental: bool = False,
                 named: set[tuple[str, int]] | None = None) -> None:
        self.error, self.session, self.incremental = error, session, incremental
        self._wanted = wanted
        self.named = named or set()  # the partitions an incremental request named

    @property
    def session_id(self) -> int:
        return self.session.id if self.session is not None else INVALID_SESSION

    @property
    def wanted(self) -> list[tuple[str, list[Any]]]:
        """Every partition to read, by topic: the request's, or all its session holds."""
        if self._wanted is None:
            self._wanted = _grouped(self.session.partitions.items()) if self.session is not None else []
        return self._wanted

    def to_read(self, news: Callable[[FetchSession, set[tuple[str, int]]],
                                     list[tuple[tuple[str, int], CachedPartition]]] | None,
                ) -> list[tuple[str, list[Any]]]:
        """What to read now: `wanted`, or for an incremental fetch what `news` picks of the
        session's partitions given the ones the request named (a follower's, which skips
        those with nothing to read or tell)."""
        if news is None or not self.incremental:
            return self.wanted
        return _grouped(news(self.session, self.named))

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
                active = self.session.active
                for p in kept:  # partitions that got records go to the back, for fairness
                    if p.records is not None:  # under the response size limit (as Kafka)
                        tp = (topic, p.index)
                        cached[tp] = cached.pop(tp)
                        if tp in active:
                            active[tp] = active.pop(tp)
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
    session.until_full_scan -= 1
    cached = session.partitions
    if len(requested) > len(cached) and not cache.has_room(len(requested)):
        cache.remove(session_id)  # the client starts over with a full fetch, sessionless
        return FetchContext(ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
    for tp in forgotten:
        session.forget(tp)
    for tp, p in requested:
        if tp in cached:
            cached[tp].update(p)
        else:
            cached[tp] = CachedPartition.of(p)
    return FetchContext(session=session, incremental=True, named={tp for tp, _ in requested})


# -- the fetching end (a follower's; Kafka's FetchSessionHandler) ------------------------------

# What a request says of one partition, in the order the fetcher builds it: fetch offset,
# current leader epoch, last fetched epoch, log start offset, partition max bytes.
FetchState = tuple[int, int, int, int, int]


@dataclass(slots=True)
class SessionRequest:
    """One request of a session: its metadata, the partitions it names (added, or whose fetch
    state changed) and the ones it forgets."""
    session_id: int
    epoch: int
    named: list[tuple[tuple[str, int], FetchState]]
    forgotten: list[tuple[str, int]]
    sent: dict[tuple[str, int], FetchState]  # what the leader holds once this is answered

    @property
    def full(self) -> bool:
        return self.epoch == INITIAL_EPOCH

    def fields(self) -> dict[str, Any]:
        """The Fetch request fields this request fills in: session, topics and forgotten."""
        topics: dict[str, list[dict]] = {}
        for (topic, index), (offset, leader_epoch, last_epoch, log_start, limit) in self.named:
            topics.setdefault(topic, []).append({
                "partition": index, "current_leader_epoch": leader_epoch, "fetch_offset": offset,
                "last_fetched_epoch": last_epoch, "log_start_offset": log_start, "partition_max_bytes": limit})
        forgotten: dict[str, list[int]] = {}
        for topic, index in self.forgotten:
            forgotten.setdefault(topic, []).append(index)
        return {"session_id": self.session_id, "session_epoch": self.epoch,
                "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
                "forgotten_topics_data": [{"topic": t, "partitions": ps} for t, ps in forgotten.items()]}


class FetchSessionHandler:
    """The fetching end of an incremental session with one leader. The first request opens a
    session naming every partition; later ones carry the session id and the next epoch and
    name only partitions that were added or whose fetch state changed, and forget the ones
    left out (Kafka does the same: a partition not fetched this round, being delayed or
    throttled, is forgotten and added back whole when it is fetched again). The leader's
    session then reads on its own what each partition had in the last request that named it.

    `sent` mirrors the leader's session once a response confirms it; an answer for a
    partition is usable only if the fetch state the leader used is still the partition's."""

    def __init__(self) -> None:
        self.session_id = INVALID_SESSION
        self.epoch = INITIAL_EPOCH
        self.sent: dict[tuple[str, int], FetchState] = {}

    def build(self, wanted: dict[tuple[str, int], FetchState]) -> SessionRequest:
        if self.epoch == INITIAL_EPOCH:  # a full request: opens a session (closing ours, if any)
            return SessionRequest(self.session_id, INITIAL_EPOCH, list(wanted.items()), [], wanted)
        sent = self.sent
        if wanted is sent:  # the very states the leader holds (the fetcher reused them)
            return SessionRequest(self.session_id, self.epoch, [], [], wanted)
        named = [(tp, state) for tp, state in wanted.items() if sent.get(tp) != state]
        added = sum(1 for tp, _ in named if tp not in sent)
        # Partitions the session holds and this request leaves out exist only if the session
        # holds more than what both have in common.
        forgotten = [tp for tp in sent if tp not in wanted] if len(sent) > len(wanted) - added else []
        return SessionRequest(self.session_id, self.epoch, named, forgotten, wanted)

    def handle_response(self, request: SessionRequest, error: ErrorCode, session_id: int) -> bool:
        """Take a response in; True if its partitions may be used. A session the leader no
        longer knows or whose epoch it refused is started again with a full request."""
        if error == ErrorCode.FETCH_SESSION_ID_NOT_FOUND:
            self.reset(close_existing=False)
            return False
        if error != ErrorCode.NONE:
            self.reset()
            return False
        if session_id == INVALID_SESSION:  # no session (none granted, or the leader closed it)
            self.reset(close_existing=False)
            return True
        self.session_id = session_id
        self.epoch = 1 if request.full or self.epoch >= 2**31 - 1 else self.epoch + 1
        self.sent = request.sent
        return True

    def reset(self, close_existing: bool = True) -> None:
        """The next request is a full one; it closes the current session on the leader (a
        reconnect, an error) unless the leader said it has none."""
        if not close_existing:
            self.session_id = INVALID_SESSION
        self.epoch = INITIAL_EPOCH
        self.sent = {}
