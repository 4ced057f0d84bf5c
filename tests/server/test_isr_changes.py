"""ISR changes as a leader asks for them, in process: a ReplicaManager leading one partition over
a real log, its AlterPartitionManager, and a controller that answers as the test says."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

import pytest

from strom.log import Log, LogConfig
from strom.protocol.errors import ErrorCode
from strom.protocol.records import build_batch
from strom.replication.alter_partition import AlterPartitionManager
from strom.replication.partition import Partition
from strom.replication.replica_manager import ProduceResult, ReplicaManager

LEADER, SHUTTING_DOWN, IN_SYNC = 0, 1, 2
TP = ("t", 0)


class Controller:
    """Answers every AlterPartition with `error` per partition, and counts the requests."""

    def __init__(self, error: ErrorCode) -> None:
        self.error = error
        self.requests: list[dict] = []

    async def call(self, _api_key, _version, fields, timeout_s=None):
        self.requests.append(fields)
        topics = [SimpleNamespace(topic_name=t["topic_name"], partitions=[
            SimpleNamespace(partition_index=p["partition_index"], error_code=self.error,
                            leader_epoch=p["leader_epoch"], isr=p["new_isr"], partition_epoch=p["partition_epoch"] + 1)
            for p in t["partitions"]]) for t in fields["topics"]]
        return SimpleNamespace(error_code=ErrorCode.NONE, topics=topics)


@pytest.fixture
def leader(tmp_path):
    """Leader of TP with replicas [0, 1, 2] and ISR [0, 2]: replica 1 has just left it."""
    log = Log.open(tmp_path / "t-0", LogConfig())
    rm = ReplicaManager(LEADER, log_manager=None)
    partition = Partition("t", 0, uuid.uuid4(), LEADER, log)
    partition.make_leader(5, [LEADER, SHUTTING_DOWN, IN_SYNC], [LEADER, IN_SYNC])
    rm._host(partition)
    yield rm, partition
    log.close()


def _manager(rm: ReplicaManager, controller: Controller) -> AlterPartitionManager:
    broker = SimpleNamespace(broker_id=LEADER, broker_epoch=1, replica_manager=rm, controller_channel=controller)
    manager = AlterPartitionManager(broker)
    rm.alter_isr = manager.submit
    return manager


def _write(partition: Partition) -> int:
    """Append two records; returns the log end offset after them."""
    return partition.append_records_to_leader(bytearray(build_batch([(b"k", b"v")] * 2)), -1, 1).last_offset + 1


def _fetch(rm: ReplicaManager, replica: int, offset: int) -> None:
    rm.read(TP, offset, 1 << 20, True, replica_id=replica)


async def _replicated(rm: ReplicaManager, end: int) -> ErrorCode:
    """What an acks=all write ending at `end` is answered (with a 30 s request timeout)."""
    result = ProduceResult(end_offset=end)
    await rm.await_replication({TP: result}, -1, 30)
    return result.error


def test_a_refused_expansion_releases_the_writes_it_held(leader):
    """The replica the leader asked to add back is shutting down and the controller says
    INELIGIBLE_REPLICA. Meanwhile the expansion counted it for the high watermark; once refused,
    the writes the ISR [0, 2] holds are answered at once, not at their 30 s timeout (a stalled
    acks=all producer, seen in a controlled shutdown)."""
    rm, partition = leader

    async def scenario():
        controller = Controller(ErrorCode.INELIGIBLE_REPLICA)
        _manager(rm, controller)
        first = _write(partition)
        _fetch(rm, IN_SYNC, 0)
        _fetch(rm, IN_SYNC, first)
        assert partition.high_watermark == first
        end = _write(partition)
        _fetch(rm, SHUTTING_DOWN, first)  # caught up to the high watermark: asks to rejoin
        assert partition.pending_isr == [LEADER, IN_SYNC, SHUTTING_DOWN]
        _fetch(rm, IN_SYNC, end)  # the ISR has it all; the pending expansion holds it back
        assert partition.high_watermark == first
        assert await asyncio.wait_for(_replicated(rm, end), 5) == ErrorCode.NONE
        assert len(controller.requests) == 1
        assert (partition.isr, partition.pending_isr, partition.high_watermark) == ([LEADER, IN_SYNC], None, end)

    asyncio.run(scenario())


def test_a_replica_the_metadata_counts_ineligible_is_not_proposed(leader):
    """KIP-841: a caught-up follower that is fenced or shutting down is not asked for, so it
    never holds the high watermark; once eligible, its next fetch brings it back."""
    rm, partition = leader

    async def scenario():
        controller = Controller(ErrorCode.NONE)
        _manager(rm, controller)
        eligible = {LEADER, IN_SYNC}
        rm.isr_eligible = eligible.__contains__
        end = _write(partition)
        _fetch(rm, SHUTTING_DOWN, end)
        assert partition.pending_isr is None and controller.requests == []
        _fetch(rm, IN_SYNC, end)
        assert partition.high_watermark == end
        eligible.add(SHUTTING_DOWN)
        _fetch(rm, SHUTTING_DOWN, end)
        for _ in range(100):
            if partition.isr == [LEADER, IN_SYNC, SHUTTING_DOWN]:
                break
            await asyncio.sleep(0.01)
        assert partition.isr == [LEADER, IN_SYNC, SHUTTING_DOWN] and len(controller.requests) == 1

    asyncio.run(scenario())
