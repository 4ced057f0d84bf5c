"""Fakes for the coordinator's unit tests: a manual clock with timers, an in-memory store, and a
replica manager over real logs.

The coordinator's callbacks make its state machine testable without sockets or an event loop:
a JoinGroup or SyncGroup "response" is simply the value its callback received, or None while
it is held back.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from types import SimpleNamespace

from strom.coordinator.group.config import GroupConfig
from strom.coordinator.group.coordinator import GroupCoordinator, JoinRequest
from strom.coordinator.group.member import JoinGroupResult, SyncGroupResult
from strom.protocol.errors import ErrorCode

T0 = 1_700_000_000_000


class LogPartition:
    def __init__(self, log) -> None:
        self.log = log
        self.is_leader = True


class LogReplicaManager:
    """The two calls a coordinator's store makes of the replica manager (get_partition,
    append_records), over real logs: partition index -> Log of `topic`, each led here."""

    def __init__(self, topic: str, logs: dict) -> None:
        self.partitions = {(topic, p): LogPartition(log) for p, log in logs.items()}

    def get_partition(self, topic: str, index: int):
        return self.partitions.get((topic, index))

    def append_records(self, acks, entries, from_client=True):
        out = {}
        for tp, batch in entries:
            self.partitions[tp].log.append(batch)
            out[tp] = SimpleNamespace(error=ErrorCode.NONE)
        return out


class FakeTimer:
    def __init__(self, deadline: int, callback) -> None:
        self.deadline = deadline
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeScheduler:
    """Time moves only when a test calls `advance`; due timers fire in deadline order."""

    def __init__(self, now: int = T0) -> None:
        self.now = now
        self._timers: list[tuple[int, int, FakeTimer]] = []
        self._seq = itertools.count()

    def now_ms(self) -> int:
        return self.now

    def call_later(self, delay_ms: float, callback) -> FakeTimer:
        timer = FakeTimer(self.now + int(delay_ms), callback)
        heapq.heappush(self._timers, (timer.deadline, next(self._seq), timer))
        return timer

    def advance(self, ms: int) -> None:
        target = self.now + ms
        while self._timers and self._timers[0][0] <= target:
            deadline, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                self.now = max(self.now, deadline)
                timer.callback()
        self.now = target

    def pending(self) -> int:
        return sum(1 for _, _, t in self._timers if not t.cancelled)


@dataclass
class FakeStore:
    """What the coordinator would have written to `__consumer_offsets`."""

    writes: list[tuple] = field(default_factory=list)
    error: ErrorCode = ErrorCode.NONE
    local: bool = True

    def is_local(self, group_id: str) -> bool:
        return self.local

    def store_group(self, value, group_id: str) -> ErrorCode:
        if self.error == ErrorCode.NONE:
            self.writes.append(("group", group_id, value))
        return self.error

    def store_offsets(self, group_id: str, offsets) -> ErrorCode:
        if self.error == ErrorCode.NONE:
            self.writes.append(("offsets", group_id, dict(offsets)))
        return self.error

    def store_tombstones(self, group_id: str, partitions, group: bool) -> ErrorCode:
        self.writes.append(("tombstones", group_id, sorted(partitions), group))
        return self.error


def make_coordinator(**config) -> tuple[GroupCoordinator, FakeScheduler, FakeStore]:
    scheduler, store = FakeScheduler(), FakeStore()
    coordinator = GroupCoordinator(GroupConfig(**{"initial_rebalance_delay_ms": 0, **config}), store,
                                   scheduler)
    coordinator.startup()
    return coordinator, scheduler, store


class Box:
    """Holds the response a callback delivered (None while held back)."""

    def __init__(self) -> None:
        self.value = None

    def __call__(self, value) -> None:
        assert self.value is None, "answered twice"
        self.value = value


def join(coordinator: GroupCoordinator, group: str, member_id: str = "", *,
         protocols=(("range", b"sub"),), instance_id: str | None = None, session_ms: int = 10000,
         rebalance_ms: int = 30000, require_known: bool = False, skip: bool = False) -> Box:
    box = Box()
    coordinator.handle_join_group(JoinRequest(
        group_id=group, member_id=member_id, group_instance_id=instance_id, protocol_type="consumer",
        protocols=list(protocols), session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms,
        client_id="client", client_host="/127.0.0.1", require_known_member_id=require_known,
        support_skip_assignment=skip), box)
    return box


def sync(coordinator: GroupCoordinator, group: str, member_id: str, generation: int,
         assignments: dict[str, bytes] | None = None, instance_id: str | None = None) -> Box:
    box = Box()
    coordinator.handle_sync_group(group, generation, member_id, None, None, instance_id,
                                  assignments or {}, box)
    return box


def joined(box: Box) -> JoinGroupResult:
    assert isinstance(box.value, JoinGroupResult), f"JoinGroup still held back: {box.value}"
    assert box.value.error == ErrorCode.NONE, box.value
    return box.value


def synced(box: Box) -> SyncGroupResult:
    assert isinstance(box.value, SyncGroupResult), f"SyncGroup still held back: {box.value}"
    return box.value
