"""A new partition's log (Log.create) has no files until its first write."""

from __future__ import annotations

import threading

import pytest
from logtest_support import batch, read_all

import strom.log.log as log_module
from strom.log import Log, LogConfig, LogManager
from strom.protocol.errors import StorageError


@pytest.fixture
def fsynced(monkeypatch) -> list:
    """Every path the log fsyncs as a directory or file name (log.fsync_path)."""
    calls: list = []
    real = log_module.fsync_path

    def spy(path):
        calls.append(path)
        real(path)

    monkeypatch.setattr(log_module, "fsync_path", spy)
    return calls


def test_reads_flushes_and_closes_of_a_new_log_make_no_files(tmp_path, clock):
    lg = Log.create(tmp_path / "t-0", LogConfig(), now_ms=clock)
    assert not lg.dir_made and lg.log_end_offset == 0
    assert lg.read(0, 1000).size == 0
    assert lg.fetch_offset_by_timestamp(0) is None and lg.offset_of_max_timestamp() is None
    assert not lg.truncate_to(0)
    lg.assign_leader_epoch(3, 0)
    lg.flush()
    lg.close()
    assert list(tmp_path.iterdir()) == []


def test_the_first_write_makes_the_directory_and_a_flush_makes_its_name_durable(tmp_path, clock, fsynced):
    """The directory's name (an fsync of the log dir) and the segment's (of the directory
    itself) must survive a power cut once the first batch is flushed."""
    lg = Log.create(tmp_path / "t-0", LogConfig(), now_ms=clock)
    lg.assign_leader_epoch(1, 0)
    lg.append(batch(3), leader_epoch=1)
    assert "00000000000000000000.log" in {p.name for p in lg.dir.iterdir()}
    lg.flush()
    assert lg.dir in fsynced and tmp_path in fsynced
    lg.close()
    reopened = Log.open(tmp_path / "t-0", LogConfig(), clean_shutdown=True)
    assert [r[0] for r in read_all(reopened)] == [0, 1, 2]
    assert reopened.end_offset_for_epoch(1) == (1, 3)
    reopened.close()


def test_a_follower_restarting_a_new_log_elsewhere_keeps_that_start(tmp_path, clock):
    """A new follower of a leader whose log starts at 500 starts its own there: the segment
    file that says so is made at once, so a restart does not forget it."""
    lg = Log.create(tmp_path / "t-0", LogConfig(), now_ms=clock)
    lg.truncate_fully_and_start_at(500)
    assert lg.dir_made
    lg.close()
    reopened = Log.open(tmp_path / "t-0", LogConfig(), log_start_offset=500)
    assert reopened.log_end_offset == 500 and reopened.log_start_offset == 500
    reopened.close()


def test_make_files_prepares_the_write_and_makes_nothing_for_a_deleted_log(tmp_path, clock):
    lg = Log.create(tmp_path / "t-0", LogConfig(), now_ms=clock)
    lg.make_files()
    assert sorted(p.name for p in lg.dir.iterdir()) == ["00000000000000000000.log"]
    info = lg.append(batch(2))
    assert info.first_offset == 0 and [r[0] for r in read_all(lg)] == [0, 1]
    lg.close()
    gone = Log.create(tmp_path / "t-1", LogConfig(), now_ms=clock)
    assert gone.close_unmade()
    gone.make_files()  # a worker thread late for a log deleted meanwhile
    assert not gone.dir.exists()
    with pytest.raises(StorageError):
        gone.append(batch(1))


def test_threads_making_the_files_of_one_log_race_harmlessly(tmp_path, clock):
    lg = Log.create(tmp_path / "t-0", LogConfig(), now_ms=clock)
    threads = [threading.Thread(target=lg.make_files) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lg.append(batch(1))
    assert [r[0] for r in read_all(lg)] == [0]
    lg.close()


def test_the_log_manager_makes_new_logs_without_files_and_a_restart_makes_them_again(tmp_path, clock):
    """Creating and deleting never-written partitions touches no directory; a restart finds
    only the written ones on disk and makes the others again, empty as they were."""
    import asyncio

    d = tmp_path / "d"

    async def run() -> None:
        m = LogManager([d], LogConfig(), now_ms=clock)
        m.startup(0)
        logs = await m.get_or_create_logs([(("t", p), LogConfig()) for p in range(100)])
        assert all(isinstance(lg, Log) and not lg.dir_made for lg in logs.values())
        assert sorted(p.name for p in d.iterdir() if p.is_dir()) == []
        logs[("t", 7)].append(batch(2))
        for p in range(50, 100):
            assert m.delete_log("t", p)
        await m.wait_for_deletions()
        m.shutdown()

    asyncio.run(run())
    assert sorted(p.name for p in d.iterdir() if p.is_dir()) == ["t-7"]
    m = LogManager([d], LogConfig(), now_ms=clock)
    m.startup(0)
    assert [m.get_log("t", p) is not None for p in (6, 7)] == [False, True]
    assert m.get_or_create_log("t", 6).log_end_offset == 0
    assert [r[0] for r in read_all(m.get_log("t", 7))] == [0, 1]
    m.shutdown()


def test_the_log_manager_makes_many_logs_files_with_one_fsync_of_their_log_dir(tmp_path, clock, monkeypatch):
    """A first write makes many new logs' files together (LogManager.make_files): the log dir
    is fsynced once for all their directories' names, and their flushes do not do it again."""
    import strom.log.manager as manager_module

    calls: list = []
    for module in (log_module, manager_module):
        real = module.fsync_path
        monkeypatch.setattr(module, "fsync_path", lambda path, real=real: (calls.append(path), real(path)))
    d = tmp_path / "d"
    m = LogManager([d], LogConfig(), now_ms=clock)
    m.startup(0)
    logs = [m.get_or_create_log("t", p) for p in range(20)]
    alongside = m.unmade_alongside(logs[:1], 8)  # the one asked for, and more of its topic's
    assert alongside[0] is logs[0] and len({id(lg) for lg in alongside}) == 8
    assert all(lg in logs for lg in alongside)
    calls.clear()
    m.make_files(logs)
    assert all(lg.dir_made and lg.dir.is_dir() for lg in logs) and calls == [d]
    for lg in logs:
        lg.append(batch(1))
        lg.flush()
    assert calls.count(d) == 1 and all(lg.dir in calls for lg in logs)
    m.shutdown()


def test_a_never_written_log_counts_as_intact_after_a_clean_stop_only(tmp_path, clock):
    """Its leader keeps its epoch after a clean stop (nothing can have been lost: the stop's
    checkpoint names it at 0 and there is no directory); after a crash nothing vouches for it."""
    d = tmp_path / "d"
    m = LogManager([d], LogConfig(), now_ms=clock)
    m.startup(0)
    m.get_or_create_log("t", 0)
    m.get_or_create_log("t", 1).append(batch(1))
    m.shutdown()
    m = LogManager([d], LogConfig(), now_ms=clock)
    m.startup(0)
    assert m.found_intact("t", 0) and m.found_intact("t", 1) and not m.found_intact("t", 2)
    m.get_or_create_log("t", 0)
    m.checkpoint()
    crashed = LogManager([d], LogConfig(), now_ms=clock)  # no shutdown: as after kill -9
    crashed.startup(0)
    assert not crashed.found_intact("t", 0)
    crashed.shutdown()
    m.get_log("t", 1).close()


def test_a_directory_made_after_the_batch_fsync_is_synced_by_its_own_flush(tmp_path, clock, fsynced, monkeypatch):
    """A log whose files the batch failed to make, then made by its write after the batch's
    fsync of the log dir: that fsync does not cover its name, so its flush syncs the dir."""
    import strom.log.manager as manager_module

    d = tmp_path / "d"
    m = LogManager([d], LogConfig(), now_ms=clock)
    m.startup(0)
    ok, failing = m.get_or_create_log("t", 0), m.get_or_create_log("t", 1)

    def no_descriptors() -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(failing, "make_files", no_descriptors)
    real = manager_module.fsync_path

    def fsync_then_write(path) -> None:
        real(path)
        failing.append(batch(1))  # its write makes the directory, after the fsync

    monkeypatch.setattr(manager_module, "fsync_path", fsync_then_write)
    m.make_files([ok, failing])
    assert ok.dir_made and failing.dir_made
    fsynced.clear()
    ok.append(batch(1))
    ok.flush()
    failing.flush()
    assert fsynced.count(d) == 1 and ok.dir in fsynced and failing.dir in fsynced
    m.shutdown()
