"""What a hosted partition is made of is freed by reference counting when the partition goes:
none of it is cyclic garbage, which is what lets the broker freeze it out of the garbage
collector's scans (strom/heap.py)."""

from __future__ import annotations

import asyncio
import gc
import uuid

from strom import heap
from strom.log import LogConfig, LogManager
from strom.protocol.records import build_batch
from strom.replication.replica_manager import ReplicaManager


def test_deleted_partitions_leave_no_cyclic_garbage(tmp_path):
    async def lifecycle() -> tuple[LogManager, ReplicaManager]:
        manager = LogManager([tmp_path], LogConfig(segment_bytes=4096))
        manager.startup(0, None)
        replicas = ReplicaManager(0, manager)
        for i in range(20):
            partition = replicas.become_leader_or_follower("t", i, uuid.uuid4(), 0, i, [0], [0], LogConfig())
            for _ in range(30):  # a few segments, indexes and epochs each
                partition.log.append(bytearray(build_batch([(b"k", b"v" * 100)])), leader_epoch=i)
        await manager.write_pending_epochs()
        for i in range(20):
            replicas.stop_replica("t", i, True)
        await asyncio.sleep(0.1)
        return manager, replicas  # they live as long as the broker; the partitions did not

    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # unreachable objects go to gc.garbage instead of away
    try:
        alive = asyncio.run(lifecycle())
        gc.collect()
        strom_garbage = {type(o).__qualname__ for o in gc.garbage
                         if getattr(type(o), "__module__", "").startswith("strom.")}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert strom_garbage == set()
    assert not alive[1].partitions and not list(alive[0].logs())


def test_only_bulk_changes_freeze(monkeypatch):
    frozen: list[int] = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(1))
    monkeypatch.setattr(heap, "_unsettled", [0])
    for _ in range(50):
        heap.settle_after_bulk_change(20)  # ISR changes here and there
    assert frozen == []
    for _ in range(3):
        heap.settle_after_bulk_change(256)  # a background load's batches
    assert frozen == []
    heap.settle_after_bulk_change(256)
    assert frozen == [1]
    heap.settle_after_bulk_change(2000)  # one LeaderAndIsr chunk
    assert frozen == [1, 1]


def test_collections_paused_nests_across_threads_and_restores_what_was():
    import threading

    assert gc.isenabled()
    inner_entered, release = threading.Event(), threading.Event()

    def other_thread():
        with heap.collections_paused():
            inner_entered.set()
            release.wait(10)

    with heap.collections_paused():
        assert not gc.isenabled()
        worker = threading.Thread(target=other_thread)
        worker.start()
        inner_entered.wait(10)
    assert not gc.isenabled()  # the other thread's block still runs
    release.set()
    worker.join(10)
    assert gc.isenabled()

    gc.disable()  # paused by someone else (a command's start-up): left as it was
    try:
        with heap.collections_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
