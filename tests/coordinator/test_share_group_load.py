"""Share groups come and go with the group coordinator's own load of a `__consumer_offsets`
partition: one replay (GroupMetadataManager's) restores them, an unload drops them, and looking
at the groups reads no log."""

from __future__ import annotations

import asyncio
import threading
import uuid
from types import SimpleNamespace

import pytest
from tests.coordinator.coordinator_support import FakeScheduler, LogReplicaManager

from strom.coordinator import partition_for
from strom.coordinator.group.config import GroupConfig
from strom.coordinator.group.coordinator import GroupCoordinator
from strom.coordinator.group.manager import GroupMetadataManager
from strom.coordinator.group.records import OffsetAndMetadata
from strom.coordinator.group.share_group import (
    ShareGroupCoordinator,
    ShareGroupSettings,
    ShareHeartbeat,
)
from strom.log import Log
from strom.log.config import LogConfig
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.records import build_marker_batch
from strom.server.coordinators import Coordinators

pytestmark = pytest.mark.timeout(10)

TOPIC_ID = uuid.UUID(int=7)
TOPICS = {"orders": SimpleNamespace(topic_id=TOPIC_ID, partitions=[0, 1, 2, 3])}


class _NoLog:
    """A replica manager that fails if anyone asks it anything."""

    def __getattr__(self, name: str):
        raise AssertionError(f"the replica manager was asked for {name}")


def _coordinator(replica_manager, partitions: int, scheduler: FakeScheduler) -> GroupCoordinator:
    coordinator = GroupCoordinator(GroupConfig(), GroupMetadataManager(replica_manager, lambda: partitions),
                                   scheduler)
    coordinator.share_groups = ShareGroupCoordinator(coordinator, lambda: TOPICS, ShareGroupSettings())
    return coordinator


def _ids(partitions: int, count: int = 2) -> list[str]:
    """`count` group ids on distinct partitions."""
    seen: dict[int, str] = {}
    for i in range(100):
        seen.setdefault(partition_for(f"sg-{i}", partitions), f"sg-{i}")
    return list(seen.values())[:count]


def test_looking_at_share_groups_reads_no_log():
    coordinator = _coordinator(_NoLog(), 50, FakeScheduler())
    coordinator.startup()
    share = coordinator.share_groups
    assert share.groups == {}
    assert not share.is_member("sg", "m")
    assert share.describe("sg")["error_code"] == ErrorCode.GROUP_ID_NOT_FOUND


def test_share_groups_are_restored_by_the_partitions_load_and_dropped_by_its_unload(tmp_path):
    logs = {p: Log.open(tmp_path / f"__consumer_offsets-{p}", LogConfig()) for p in range(2)}
    try:
        rm = LogReplicaManager("__consumer_offsets", logs)
        first = _coordinator(rm, 2, FakeScheduler())
        first.startup()
        kept, other = _ids(2)
        share = first.share_groups
        for group_id in (kept, other):
            for member_id in ("m1", "m2"):
                share.heartbeat(ShareHeartbeat(group_id, member_id, 0, None, ["orders"], "c", "/h"))
            assert share.store(group_id)
        answer = share.heartbeat(ShareHeartbeat(kept, "m1", 1))  # m1 catches up with m2's join
        assert answer.member_epoch == 2
        share.store(kept)
        # A classic group's offsets in the same partition, and an open transaction's.
        first.store.store_offsets(kept, {("orders", 0): OffsetAndMetadata(5, -1, "", 1)})
        first.store.store_txn_offsets(other, 11, 0, {("orders", 1): OffsetAndMetadata(9, -1, "", 1)})
        before = {m.member_id: (m.member_epoch, m.assigned) for m in share.groups[kept].members.values()}

        scheduler = FakeScheduler()
        successor = _coordinator(rm, 2, scheduler)
        successor.startup()
        assert successor.share_groups.groups == {}
        index = successor.store.partition_for(kept)
        successor.startup(successor.store.load(only=index))
        restored = successor.share_groups.groups
        assert set(restored) == {kept}  # the other partition's group is not led here yet
        group = restored[kept]
        assert {m.member_id: (m.member_epoch, m.assigned) for m in group.members.values()} == before
        assert {m.member_id: m.member_epoch for m in group.members.values()} == {"m1": 2, "m2": 2}
        assert sorted(p for m in group.members.values() for ps in m.assigned.values() for p in ps) == [0, 1, 2, 3]
        assert group.group_epoch == 2 and group.assignment_epoch == 2
        assert successor.groups[kept].offsets == {("orders", 0): OffsetAndMetadata(5, -1, "", 1)}
        assert scheduler.pending() == 2  # both members' sessions run again

        # The other partition arrives: its group and its open transaction join, the first stays.
        successor.startup(successor.store.load(only=1 - index))
        assert set(successor.share_groups.groups) == {kept, other}
        assert 11 in successor.pending_txn_offsets
        assert successor.share_groups.is_member(kept, "m1")

        # Leadership of the first partition leaves: its groups go, their session timers stop.
        successor.unload_partition(index)
        assert set(successor.share_groups.groups) == {other}
        assert kept not in successor.groups
        assert 11 in successor.pending_txn_offsets  # the other partition's transaction stays
        assert scheduler.pending() == 2  # only the other group's members
        successor.unload_partition(1 - index)
        assert successor.share_groups.groups == {} and successor.pending_txn_offsets == {}
        assert scheduler.pending() == 0
    finally:
        for log in logs.values():
            log.close()


class _SlowManager(GroupMetadataManager):
    """Holds the executor's replay until the test has appended `tail` on the event loop, so
    that the log grows while the partition is read."""

    def __init__(self, *args, tail: bytes, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(*args)
        self.tail, self.loop, self.appended = tail, loop, threading.Event()

    def replay_into(self, log_, state, start=None, end=None) -> None:
        if threading.current_thread() is not threading.main_thread() and not self.appended.is_set():
            self.loop.call_soon_threadsafe(self._append, log_)
            assert self.appended.wait(5)
        super().replay_into(log_, state, start, end)

    def _append(self, log_) -> None:
        log_.append(bytearray(self.tail))
        self.appended.set()


def test_a_partition_loads_off_the_loop_answering_load_in_progress_meanwhile(tmp_path):
    """On election the partition is replayed in the executor: its groups are answered
    COORDINATOR_LOAD_IN_PROGRESS until the result is applied, and a transaction marker that
    reaches the log during the replay counts."""
    log_ = Log.open(tmp_path / "__consumer_offsets-0", LogConfig())

    async def main() -> None:
        rm = LogReplicaManager("__consumer_offsets", {0: log_})
        writer = _coordinator(rm, 1, FakeScheduler())
        writer.startup()
        writer.share_groups.heartbeat(ShareHeartbeat("sg", "m1", 0, None, ["orders"], "c", "/h"))
        writer.share_groups.store("sg")
        writer.store.store_offsets("g", {("orders", 0): OffsetAndMetadata(5, -1, "", 1)})
        writer.store.store_txn_offsets("g", 11, 0, {("orders", 1): OffsetAndMetadata(9, -1, "", 1)})

        scheduler = FakeScheduler()
        manager = _SlowManager(rm, lambda: 1, tail=build_marker_batch(11, 0, True, 0, 2),
                               loop=asyncio.get_running_loop())
        successor = GroupCoordinator(GroupConfig(), manager, scheduler)
        successor.share_groups = ShareGroupCoordinator(successor, lambda: TOPICS, ShareGroupSettings())
        successor.startup()
        coordinators = Coordinators(SimpleNamespace(group_coordinator=successor, txn_coordinator=None))
        coordinators.load("__consumer_offsets", 0)
        assert successor.fetch_offsets("g", None) == (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, {})
        with pytest.raises(KafkaError) as e:
            successor.share_groups.heartbeat(ShareHeartbeat("sg", "m1", 1))
        assert e.value.code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        assert successor.share_groups.describe("sg")["error_code"] == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        for _ in range(500):
            if not successor.loading:
                break
            await asyncio.sleep(0.01)
        assert manager.appended.is_set()
        assert successor.fetch_offsets("g", None) == (ErrorCode.NONE, {
            ("orders", 0): OffsetAndMetadata(5, -1, "", 1), ("orders", 1): OffsetAndMetadata(9, -1, "", 1)})
        assert successor.pending_txn_offsets == {}
        assert successor.share_groups.heartbeat(ShareHeartbeat("sg", "m1", 1)).member_epoch == 1

        # Leadership leaves while a load runs: its result is dropped.
        successor.unload_partition(0)
        coordinators.load("__consumer_offsets", 0)
        successor.unload_partition(0)
        await asyncio.gather(*coordinators._loads)
        assert successor.groups == {} and successor.share_groups.groups == {} and not successor.loading

    try:
        asyncio.run(main())
    finally:
        log_.close()


def test_list_transactions_answers_load_in_progress_while_a_partition_loads():
    """As Kafka's listTransactionStates: while any `__transaction_state` partition loads, the
    list would be partial, so none is given."""
    from strom.server.apis.transactions import handle_list_transactions

    request = SimpleNamespace(duration_filter=-1, transactional_id_pattern=None, state_filters=[],
                              producer_id_filters=[])
    ctx = SimpleNamespace(header=SimpleNamespace(api_version=2))
    coordinator = SimpleNamespace(loading={3: object()}, list=lambda *_: pytest.fail("listed while loading"))
    answer = asyncio.run(handle_list_transactions(SimpleNamespace(txn_coordinator=coordinator), ctx, request))
    assert answer["error_code"] == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS and answer["transaction_states"] == []
