"""The leader epoch cache and the follower's append (KIP-101): file format, lookups,
truncation, and a log that keeps its epochs across reopening, rebuilding and truncation."""

from __future__ import annotations

import pytest
from logtest_support import batch

from strom.log.leader_epoch import EpochEntry, LeaderEpochCache
from strom.protocol.errors import OffsetOutOfRangeError
from strom.protocol.records import read_header


def test_file_is_kafkas_text_format(tmp_path):
    cache = LeaderEpochCache(tmp_path)
    cache.assign(0, 0)
    cache.assign(2, 10)
    assert (tmp_path / "leader-epoch-checkpoint").read_text() == "0\n2\n0 0\n2 10\n"
    assert LeaderEpochCache(tmp_path).entries == [EpochEntry(0, 0), EpochEntry(2, 10)]


def test_assign_keeps_epochs_and_offsets_increasing(tmp_path):
    cache = LeaderEpochCache(tmp_path)
    cache.assign(1, 5)
    cache.assign(1, 9)  # same epoch: its start does not move
    cache.assign(0, 20)  # older epoch: ignored
    cache.assign(-1, 30)
    assert cache.entries == [EpochEntry(1, 5)]
    cache.assign(3, 4)  # a newer epoch starting earlier replaces what it overlaps
    assert cache.entries == [EpochEntry(3, 4)]


def test_end_offset_for(tmp_path):
    cache = LeaderEpochCache(tmp_path)
    assert cache.end_offset_for(0, 10) == (-1, -1)
    for epoch, start in ((1, 0), (3, 10), (4, 25)):
        cache.assign(epoch, start)
    assert cache.end_offset_for(4, 40) == (4, 40)  # the latest epoch ends at the log end
    assert cache.end_offset_for(3, 40) == (3, 25)
    assert cache.end_offset_for(2, 40) == (1, 10)  # unknown epoch: the largest below it
    assert cache.end_offset_for(0, 40) == (0, 0)  # older than all: ends where the first starts
    assert cache.end_offset_for(5, 40) == (-1, -1)
    assert cache.epoch_for(12) == 3 and cache.epoch_for(0) == 1


def test_truncation_from_both_ends(tmp_path):
    cache = LeaderEpochCache(tmp_path)
    for epoch, start in ((1, 0), (3, 10), (4, 25)):
        cache.assign(epoch, start)
    cache.truncate_from_end(25)
    assert cache.entries == [EpochEntry(1, 0), EpochEntry(3, 10)]
    cache.truncate_from_start(12)
    assert cache.entries == [EpochEntry(3, 12)]
    assert LeaderEpochCache(tmp_path).entries == [EpochEntry(3, 12)]


def test_a_log_without_batches_writes_no_epoch_file_until_its_first_batch(tmp_path):
    """A new partition's first epoch is kept in memory only: its file is made with the first
    batch (a CreateTopics of 100,000 partitions makes no epoch files), neither a flush nor a
    close writes it before, and a restart rebuilds nothing wrong from its absence."""
    import asyncio

    from strom.log import Log, LogConfig, LogManager

    async def run() -> None:
        manager = LogManager([tmp_path / "d"], LogConfig())
        manager.startup(0)
        logs = await manager.get_or_create_logs([(("t", p), LogConfig()) for p in range(3)])
        for lg in logs.values():
            lg.assign_leader_epoch(2, 0)
        await manager.write_pending_epochs()
        manager.flush_dirty(every=True)
        assert not any(lg.dir.exists() for lg in logs.values())  # a new log has no files at all
        assert logs[("t", 0)].end_offset_for_epoch(2) == (2, 0)  # known all the same
        logs[("t", 0)].append(batch(2), leader_epoch=2)  # the epoch was assigned before it
        follower = logs[("t", 1)]
        follower.append_as_follower(bytes(logs[("t", 0)].read(0, 1 << 20).read_bytes()))
        await manager.write_pending_epochs()
        for p in (0, 1):
            assert LeaderEpochCache(logs[("t", p)].dir).entries == [EpochEntry(2, 0)]
        assert not (logs[("t", 2)].dir / LeaderEpochCache.FILE).exists()
        manager.shutdown()

    asyncio.run(run())
    reopened = Log.open(tmp_path / "d" / "t-2", LogConfig(), clean_shutdown=True)
    assert reopened.leader_epoch_cache.entries == [] and reopened.log_end_offset == 0
    reopened.close()


def test_an_emptied_logs_epoch_file_goes_and_is_made_again_by_its_next_batch(tmp_path):
    """A log without batches keeps no epoch file (one an older Strom wrote for each new log is
    removed when its entries go), so later epochs wait for the first batch again."""
    (tmp_path / LeaderEpochCache.FILE).write_text("0\n1\n0 0\n")
    has_batches = False
    cache = LeaderEpochCache(tmp_path, holds_data=lambda: has_batches)
    assert cache.entries == [EpochEntry(0, 0)]
    cache.truncate_from_end(0)  # what loading an empty log does
    assert not (tmp_path / LeaderEpochCache.FILE).exists()
    cache.assign(1, 0)
    assert not (tmp_path / LeaderEpochCache.FILE).exists() and cache.dirty
    has_batches = True
    cache.data_arrived()
    assert LeaderEpochCache(tmp_path).entries == [EpochEntry(1, 0)] and not cache.dirty


def test_a_change_undone_before_the_write_rewrites_nothing(tmp_path, monkeypatch):
    """Loading a log drops the leader's epoch at its end and the leader assigns it again: the
    file already says that, so the batched writer does not rewrite it (100,000 files per
    restart), and a later change is written as usual."""
    from strom.log import leader_epoch

    (tmp_path / LeaderEpochCache.FILE).write_text("0\n1\n0 0\n")
    writes: list[str] = []
    real = leader_epoch.write_atomically
    monkeypatch.setattr(leader_epoch, "write_atomically", lambda path, text, **kw: writes.append(text) or real(path, text, **kw))
    handed: list[LeaderEpochCache] = []
    cache = LeaderEpochCache(tmp_path, defer=handed.append, holds_data=lambda: True)
    cache.truncate_from_end(0)
    cache.assign(0, 0)
    assert handed and cache.dirty
    assert not cache.write() and not cache.sync() and not cache.dirty
    assert writes == []
    cache.assign(2, 5)
    assert cache.write() and writes == ["0\n2\n0 0\n2 5\n"]


def test_unreadable_file_is_rebuilt_by_the_log(open_log, tmp_path):
    log = open_log()
    log.append(batch(3), leader_epoch=0)
    log.append(batch(2), leader_epoch=5)
    log.close()
    (tmp_path / "topic-0" / "leader-epoch-checkpoint").write_bytes(b"\xff\xfe garbage")
    reopened = open_log()
    assert reopened.leader_epoch_cache.entries == [EpochEntry(0, 0), EpochEntry(5, 3)]
    (tmp_path / "topic-0" / "leader-epoch-checkpoint").unlink()
    reopened.close()
    assert open_log().leader_epoch_cache.entries == [EpochEntry(0, 0), EpochEntry(5, 3)]


def test_leader_appends_record_their_epochs(open_log):
    log = open_log()
    log.append(batch(3), leader_epoch=0)
    log.append(batch(1), leader_epoch=0)
    log.append(batch(2), leader_epoch=2)
    assert log.leader_epoch_cache.entries == [EpochEntry(0, 0), EpochEntry(2, 4)]
    assert log.end_offset_for_epoch(0) == (0, 4)
    log.truncate_to(4)
    assert log.leader_epoch_cache.entries == [EpochEntry(0, 0)]


def test_a_truncation_to_the_log_end_drops_an_epoch_that_starts_there(open_log):
    """A replica that led in epoch 1 and wrote nothing in it has (1, 4) at its log end; the
    next leader never heard of epoch 1. Truncating to the end removes no record but must drop
    that entry, or the follower's last fetched epoch stays 1 and every fetch diverges."""
    log = open_log()
    log.append(batch(4), leader_epoch=0)
    log.assign_leader_epoch(1, 4)
    assert log.leader_epoch_cache.entries == [EpochEntry(0, 0), EpochEntry(1, 4)]
    assert log.truncate_to(4) is False
    assert (log.leader_epoch_cache.entries, log.log_end_offset) == ([EpochEntry(0, 0)], 4)
    assert log.truncate_to(9) is False  # past the end: nothing to drop either
    assert log.leader_epoch_cache.entries == [EpochEntry(0, 0)]


def test_follower_append_keeps_offsets_and_epochs(open_log):
    leader = open_log(name="leader-0")
    leader.append(batch(3), leader_epoch=1)
    leader.append(batch(2), leader_epoch=4)
    data = leader.read(0, 1 << 20).read_bytes()
    follower = open_log(name="follower-0")
    info = follower.append_as_follower(bytearray(data))
    assert (info.first_offset, info.last_offset, follower.log_end_offset) == (0, 4, 5)
    assert follower.read(0, 1 << 20).read_bytes() == data  # byte for byte
    assert follower.leader_epoch_cache.entries == [EpochEntry(1, 0), EpochEntry(4, 3)]
    assert read_header(data, 0).partition_leader_epoch == 1
    with pytest.raises(OffsetOutOfRangeError):
        follower.append_as_follower(bytearray(data))  # below its log end: refused


def test_deferred_writes_are_batched_and_a_flush_makes_them_durable(tmp_path, monkeypatch):
    """With a defer hook (a broker's log manager), a change only marks the cache; the hook's
    batch writes the file without an fsync, and Log.flush fsyncs it before the recovery point
    moves past the epoch's batches."""
    import asyncio
    import os

    from strom.log import LogConfig, LogManager

    fsynced: list[str] = []  # the paths of what was fsynced
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: fsynced.append(os.readlink(f"/proc/self/fd/{fd}")) or real_fsync(fd))

    async def run() -> None:
        manager = LogManager([tmp_path / "d"], LogConfig())
        manager.startup(0)
        logs = await manager.get_or_create_logs([(("t", p), LogConfig()) for p in range(20)])
        for lg in logs.values():
            lg.leader_epoch_cache.assign(3, 0)
            lg.append(batch(2), leader_epoch=3)
            assert lg.leader_epoch_cache.dirty  # nothing written yet: the loop has not turned
        fsynced.clear()
        await manager.write_pending_epochs()
        assert not fsynced  # written as a batch, no fsync per file
        for lg in logs.values():
            assert LeaderEpochCache(lg.dir).entries == [EpochEntry(3, 0)]
        lg = logs[("t", 0)]
        lg.flush()
        # The flush made the epoch file durable (fsynced as it was written, not written again),
        # and the directory holding its new name, besides the segment.
        assert any(f.endswith("leader-epoch-checkpoint") for f in fsynced), fsynced
        assert str(lg.dir) in fsynced and any(f.endswith(".log") for f in fsynced)
        manager.shutdown()

    asyncio.run(run())


def test_after_a_crash_the_first_flush_makes_the_epoch_file_durable(tmp_path, monkeypatch):
    """The batched writer writes epoch files without an fsync; after a crash the file read back
    may be such a write, so the flush that moves the recovery point past its epochs fsyncs it
    even though the recovered cache did not change."""
    import os

    from strom.log import Log, LogConfig

    handed: list[LeaderEpochCache] = []
    before = Log.open(tmp_path / "t-0", LogConfig())
    before.defer_epoch_writes(handed.append)
    before.append(batch(2), leader_epoch=3)
    assert before.leader_epoch_cache.write()  # the batched writer's write: no fsync
    # kill -9 here: nothing flushed, nothing closed
    fsynced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: fsynced.append(os.readlink(f"/proc/self/fd/{fd}")) or real_fsync(fd))
    after = Log.open(tmp_path / "t-0", LogConfig(), recovery_point=0)
    assert after.leader_epoch_cache.entries == [EpochEntry(3, 0)] and not after.leader_epoch_cache.dirty
    after.flush()
    assert any(f.endswith(LeaderEpochCache.FILE) for f in fsynced), fsynced
    fsynced.clear()
    after.flush()
    assert not any(f.endswith(LeaderEpochCache.FILE) for f in fsynced)
    after.close()
    before.close()
