"""Leader epochs through crashes and compaction: a follower copies compacted batches (fewer
records than their offset range, gaps between them), and a log recovered after a crash ends
with a leader epoch cache that matches its batches."""

from __future__ import annotations

import os

import pytest
from logtest_support import batch, read_records

from strom.log import Log, LogConfig, leader_epoch
from strom.log.cleaner import rebuild_batch
from strom.log.leader_epoch import EpochEntry
from strom.protocol.errors import CorruptRecordError, InvalidRecordError, RecordTooLargeError
from strom.protocol.records import iter_records, read_header, scan_valid_prefix


def _with_offset(data: bytearray, base_offset: int, epoch: int) -> bytearray:
    """A copy of one batch as a leader stored it: base offset and leader epoch set (neither is
    covered by the CRC)."""
    out = bytearray(data)
    out[0:8] = base_offset.to_bytes(8, "big")
    out[12:16] = epoch.to_bytes(4, "big", signed=True)
    return out


def _compacted(base_offset: int, epoch: int, keep: slice) -> bytearray:
    """A 5-record batch at `base_offset` re-encoded by the cleaner with only records[keep]."""
    full = _with_offset(batch(5), base_offset, epoch)
    records = list(iter_records(full))
    return bytearray(rebuild_batch(read_header(full), records[keep], None))


def test_follower_copies_compacted_batches_with_gaps(open_log):
    # offsets 0-4 keep records 3 and 4; 5-9 is an empty filler; 10-14 was dropped by the
    # cleaner entirely (a gap); 15-19 keeps record 15 only, at a new epoch.
    data = _compacted(0, 1, slice(3, 5)) + _compacted(5, 1, slice(0, 0)) + _compacted(15, 2, slice(0, 1))
    follower = open_log(LogConfig(index_interval_bytes=1))
    info = follower.append_as_follower(data)
    assert (info.first_offset, info.last_offset, follower.log_end_offset) == (0, 19, 20)
    assert follower.read(0, 1 << 20).read_bytes() == bytes(data)
    assert [r.offset for r in read_records(follower)] == [3, 4, 15]
    # a fetch inside the gap starts at the next batch, located through the offset index
    assert read_header(follower.read(12, 1 << 20).read_bytes()).base_offset == 15
    assert follower.leader_epoch_cache.entries == [EpochEntry(1, 0), EpochEntry(2, 15)]
    # the fetch after the gap continues where the leader's log continues
    follower.append_as_follower(_with_offset(batch(2), 30, 2))
    assert follower.log_end_offset == 32


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: _with_offset(batch(3), 0, 0)[:-4], CorruptRecordError),
        (lambda: _with_offset(batch(3), 5, 0) + _with_offset(batch(3), 6, 0), InvalidRecordError),
        (lambda: _with_offset(batch(3, value_size=3000), 0, 0), RecordTooLargeError),
        (lambda: bytearray(), InvalidRecordError),
    ],
)
def test_follower_refuses_bad_record_sets(open_log, make, error):
    log = open_log(LogConfig(max_message_bytes=2000))
    with pytest.raises(error):
        log.append_as_follower(make())
    assert log.log_end_offset == 0 and log.active_segment.size == 0


def test_crash_recovery_adds_epochs_the_checkpoint_missed(open_log, tmp_path):
    log = open_log()
    log.append(batch(3), leader_epoch=0)
    log.append(batch(2), leader_epoch=3)
    log.append(batch(2), leader_epoch=3)
    log.close()
    # killed after the epoch 3 batch was written but before its checkpoint write
    (tmp_path / "topic-0" / "leader-epoch-checkpoint").write_text("0\n1\n0 0\n")
    reopened = open_log(recovery_point=0, clean_shutdown=False)
    assert reopened.leader_epoch_cache.entries == [EpochEntry(0, 0), EpochEntry(3, 3)]
    # The file catches up before the recovery point passes the epoch 3 batches (not at once:
    # recovery writes no epoch file of its own, see Log.open).
    reopened.flush()
    assert reopened.recovery_point == 7
    assert (tmp_path / "topic-0" / "leader-epoch-checkpoint").read_text() == "0\n2\n0 0\n3 3\n"


def test_torn_tail_recovery_drops_the_epoch_it_cut(open_log, tmp_path):
    log = open_log()
    log.append(batch(3), leader_epoch=0)
    log.append(batch(2), leader_epoch=2)
    log.append(batch(4), leader_epoch=5)
    path = log.active_segment.log_path
    log.close()
    with open(path, "r+b") as f:  # a kill -9 in the middle of the last write
        f.truncate(os.path.getsize(path) - 7)
    reopened = open_log(recovery_point=0, clean_shutdown=False)
    assert reopened.log_end_offset == 5
    assert reopened.leader_epoch_cache.entries == [EpochEntry(0, 0), EpochEntry(2, 3)]
    data = reopened.read(0, 1 << 20).read_bytes()
    epochs = [(h.partition_leader_epoch, h.base_offset) for _, h in scan_valid_prefix(data)[0]]
    assert epochs == [(0, 0), (2, 3)]
    assert reopened.end_offset_for_epoch(0) == (0, 3)


def test_log_start_moves_trim_the_cache(open_log):
    log = open_log(LogConfig(segment_bytes=200))
    for epoch in (0, 0, 1, 1, 4, 4):
        log.append(batch(2), leader_epoch=epoch)
    assert log.leader_epoch_cache.entries == [EpochEntry(0, 0), EpochEntry(1, 4), EpochEntry(4, 8)]
    log.increment_log_start_offset(6)
    assert log.leader_epoch_cache.entries == [EpochEntry(1, 6), EpochEntry(4, 8)]
    log.truncate_fully_and_start_at(20)
    assert log.leader_epoch_cache.entries == []
    assert log.end_offset_for_epoch(4) == (-1, -1)


def test_a_leader_epoch_assigned_before_the_file_is_read_waits_for_it(open_log, tmp_path, monkeypatch):
    """A restarted broker becomes leader of a lazily opened log without reading its epoch file
    (100,000 partitions: 100,000 reads); the assignment applies when the file is read."""
    log = open_log()
    log.assign_leader_epoch(0, 0)
    log.append(batch(3), leader_epoch=0)
    log.close()
    lazy = Log.lazy(tmp_path / "topic-0", LogConfig(), log_start_offset=0, log_end_offset=3)
    reads: list[str] = []
    real_read = leader_epoch._read
    monkeypatch.setattr(leader_epoch, "_read", lambda path: reads.append(path.name) or real_read(path))
    lazy.assign_leader_epoch(2, 3)
    lazy.assign_leader_epoch(1, 3)  # older than one already assigned: ignored, as by the cache
    assert reads == [] and not lazy.fully_loaded
    assert lazy.end_offset_for_epoch(0) == (0, 3)  # the first use reads the file ...
    assert reads == ["leader-epoch-checkpoint"]
    assert lazy.leader_epoch_cache.entries == [EpochEntry(0, 0), EpochEntry(2, 3)]  # ... and applies it
    lazy.close()
    assert (tmp_path / "topic-0" / "leader-epoch-checkpoint").read_text() == "0\n2\n0 0\n2 3\n"


def test_closing_an_unread_epoch_cache_reads_nothing_and_drops_waiting_epochs(open_log, tmp_path, monkeypatch):
    log = open_log()
    log.assign_leader_epoch(0, 0)
    log.append(batch(1), leader_epoch=0)
    log.close()
    lazy = Log.lazy(tmp_path / "topic-0", LogConfig(), log_start_offset=0, log_end_offset=1)
    monkeypatch.setattr(leader_epoch, "_read", lambda path: pytest.fail(f"{path} was read"))
    lazy.assign_leader_epoch(4, 1)
    lazy.close_epoch_cache()  # the log is being deleted
    lazy.leader_epoch_cache.assign(5, 1)  # a late change writes nothing
    lazy.close()
    assert (tmp_path / "topic-0" / "leader-epoch-checkpoint").read_text() == "0\n1\n0 0\n"


@pytest.mark.parametrize("records", [0, 3])
@pytest.mark.parametrize("file_read", ["by the load", "after the assignment", "before the assignment"])
def test_a_leader_epoch_assigned_before_the_log_is_read_survives_the_load(open_log, tmp_path, records,
                                                                       file_read):
    """A restarted broker becomes leader before its logs are read; the load's checks drop
    entries at the log's end, which is where the new epoch starts: it is assigned again after
    them, as Kafka assigns a new leader's epoch once the log is loaded."""
    log = open_log()
    if records:
        log.append(batch(records), leader_epoch=1)
    log.close()
    lazy = Log.lazy(tmp_path / "topic-0", LogConfig(), log_start_offset=0, log_end_offset=records)
    if file_read == "before the assignment":
        lazy.read_epoch_file()  # a follower's epoch file is read before it fetches
    lazy.assign_leader_epoch(4, records)
    if file_read == "after the assignment":
        lazy.read_epoch_file()
    lazy.load()
    assert lazy.end_offset_for_epoch(4) == (4, records)
    assert lazy.leader_epoch_cache.entries[-1] == EpochEntry(4, records)
    if records:
        assert lazy.end_offset_for_epoch(1) == (1, records)
    lazy.close()
