"""Partition, in process: leader epochs, the last stable offset and markers over a real log."""

from __future__ import annotations

import uuid

import pytest

from strom.log import Log, LogConfig
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.records import build_batch
from strom.replication.partition import Partition
from strom.replication.replica_manager import ReplicaManager


@pytest.fixture
def partition(tmp_path):
    log = Log.open(tmp_path / "t-0", LogConfig())
    p = Partition("t", 0, uuid.uuid4(), 0, log)
    p.make_leader(2, [0], [0])
    yield p
    log.close()


def test_leader_epoch_checks(partition):
    assert partition.check_leader_epoch(-1) == ErrorCode.NONE
    assert partition.check_leader_epoch(2) == ErrorCode.NONE
    assert partition.check_leader_epoch(1) == ErrorCode.FENCED_LEADER_EPOCH
    assert partition.check_leader_epoch(3) == ErrorCode.UNKNOWN_LEADER_EPOCH


def test_last_stable_offset_and_markers(partition):
    def txn(pid: int, seq: int) -> bytearray:
        return bytearray(build_batch([(b"k", b"v")] * 2, producer_id=pid, producer_epoch=0,
                                     base_sequence=seq, transactional=True))

    partition.append_records_to_leader(bytearray(build_batch([(b"k", b"plain")])), -1, 1)
    partition.append_records_to_leader(txn(7, 0), -1, 1)  # offsets 1-2, open
    partition.append_records_to_leader(txn(7, 2), -1, 1)  # 3-4, same transaction
    assert (partition.high_watermark, partition.last_stable_offset) == (5, 1)
    info = partition.append_txn_marker(7, 0, 0, committed=False)
    assert info.first_offset == 5 and partition.last_stable_offset == partition.high_watermark == 6
    assert [(t.first_offset, t.last_offset) for t in partition.log.collect_aborted_txns(0, 6)] == [(1, 5)]
    with pytest.raises(KafkaError) as e:  # a client may not write markers itself
        partition.append_records_to_leader(bytearray(build_batch(
            [(b"\x00\x00\x00\x01", b"")], producer_id=7, producer_epoch=0, transactional=True,
            control=True)), -1, 1)
    assert e.value.code == ErrorCode.INVALID_RECORD


def test_high_watermark_moves_tick_the_replica_managers_clock(tmp_path):
    """What lets an idle broker skip rebuilding its high-watermark checkpoint: every move of a
    hosted partition's high watermark (and hosting or stopping one) ticks the shared clock."""
    rm = ReplicaManager(0, log_manager=None)
    log = Log.open(tmp_path / "u-0", LogConfig())
    p = Partition("u", 0, uuid.uuid4(), 0, log)
    rm._host(p)
    p.make_leader(1, [0], [0])
    before = rm.hw_clock[0]
    p.high_watermark = p.high_watermark  # no move: no tick
    assert rm.hw_clock[0] == before
    p.append_records_to_leader(bytearray(build_batch([(b"k", b"v")])), -1, 1)
    assert p.high_watermark == 1 and rm.hw_clock[0] == before + 1
    rm.stop_replica("u", 0, delete=False)
    assert rm.hw_clock[0] == before + 2
    log.close()
