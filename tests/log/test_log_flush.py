"""The flush policy: fsync after a roll, after flush.messages records, when flush.ms passes; the
recovery point follows, so a crash re-scans only what was not flushed."""

from __future__ import annotations

import asyncio
import os
import threading

from logtest_support import batch, read_all

from strom.log import Log, LogConfig, LogManager, LogSegment
from strom.log.flusher import LogFlusher

SMALL = LogConfig(segment_bytes=400, index_interval_bytes=100)


def test_roll_asks_for_a_flush_up_to_the_new_segment(open_log):
    log = open_log(SMALL)
    calls = []
    log.flush_hook = lambda lg, up_to: calls.append((lg, up_to))
    while len(log.segments) < 3:
        log.append(batch(2))
    bases = [s.base_offset for s in log.segments[1:]]
    assert [up_to for _, up_to in calls] == bases
    assert all(lg is log for lg, _ in calls)
    assert log.recovery_point == 0  # asked for, not done: the flusher does it off the loop


def test_flush_messages_asks_once_enough_records_are_unflushed(open_log):
    log = open_log(LogConfig(flush_messages=5))
    calls = []
    log.flush_hook = lambda lg, up_to: calls.append(up_to)
    log.append(batch(2))
    log.append(batch(2))
    assert calls == []
    log.append(batch(2))
    assert calls == [6]
    log.flush(6)
    assert log.unflushed_messages() == 0
    log.append(batch(4))
    assert calls == [6]  # 4 unflushed < 5


def test_flusher_runs_flushes_in_a_thread_and_advances_the_recovery_point(tmp_path, clock, monkeypatch):
    async def scenario():
        mgr = LogManager([tmp_path / "d"], SMALL, now_ms=clock)
        mgr.startup(0)
        mgr.flusher.start()
        log = mgr.get_or_create_log("t", 0, SMALL)
        loop_thread = threading.get_ident()
        threads = []
        real_flush = Log.flush

        def spy(self, up_to=None):
            threads.append(threading.get_ident())
            return real_flush(self, up_to)

        monkeypatch.setattr(Log, "flush", spy)
        while len(log.segments) < 4:
            log.append(batch(2))
        for _ in range(3000):  # 30 s at most
            if log.recovery_point == log.active_segment.base_offset:
                break
            await asyncio.sleep(0.01)
        assert log.recovery_point == log.active_segment.base_offset
        assert threads and loop_thread not in threads  # never on the event loop
        # flush.ms: nothing is due until the last flush is old enough
        log.config = SMALL.with_overrides({"flush.ms": "1000"})
        log.append(batch(1))
        assert mgr.flusher.check_flush_ms([log]) == 0
        clock.now += 1000
        assert mgr.flusher.check_flush_ms([log]) == 1
        for _ in range(3000):  # 30 s at most
            if log.recovery_point == log.log_end_offset:
                break
            await asyncio.sleep(0.01)
        assert log.recovery_point == log.log_end_offset
        await mgr.flusher.stop()
        mgr.shutdown()

    asyncio.run(scenario())


def test_only_logs_that_flush_by_time_are_checked_for_it(tmp_path, clock):
    """The flush.ms check runs every second over unflushed_logs(): logs that never flush by
    time (flush.ms unset, Kafka's default) stay out of it however much they hold, and a log
    joins it as soon as its flush.ms is set."""
    mgr = LogManager([tmp_path / "d"], SMALL, now_ms=clock)
    mgr.startup(0)
    never = mgr.get_or_create_log("t", 0, SMALL)
    timed = mgr.get_or_create_log("t", 1, SMALL.with_overrides({"flush.ms": "1000"}))
    for lg in (never, timed):
        lg.append(batch(2))
    assert never.unflushed_messages() > 0 and mgr.unflushed_logs() == [timed]
    never.config = SMALL.with_overrides({"flush.ms": "500"})  # no new data: still checked now
    assert set(mgr.unflushed_logs()) == {never, timed}
    clock.now += 500
    assert mgr.flusher.check_flush_ms(mgr.unflushed_logs()) == 1  # never's 500 ms have passed
    mgr.shutdown()


def test_after_a_crash_only_segments_past_the_recovery_point_are_rescanned(open_log, clock, monkeypatch):
    log = open_log(SMALL)
    while len(log.segments) < 6:
        log.append(batch(2))
    log.flush(log.active_segment.base_offset)  # what the flusher does after the last roll
    point = log.recovery_point
    want = read_all(log)
    recovered = []
    real = LogSegment.recover

    def spy(self, max_message_bytes):
        recovered.append(self.base_offset)
        return real(self, max_message_bytes)

    monkeypatch.setattr(LogSegment, "recover", spy)
    # kill -9: no clean shutdown marker, the checkpointed recovery point
    again = Log.open(log.dir, SMALL, recovery_point=point, clean_shutdown=False, now_ms=clock)
    assert recovered == [log.active_segment.base_offset]
    assert read_all(again) == want
    again.close()


def test_flush_error_takes_the_dir_offline(tmp_path, clock, monkeypatch):
    async def scenario():
        mgr = LogManager([tmp_path / "a", tmp_path / "b"], SMALL, now_ms=clock)
        mgr.startup(0)
        mgr.flusher.start()
        bad = mgr.get_or_create_log("t", 0, SMALL)
        good = mgr.get_or_create_log("t", 1, SMALL)
        assert mgr.dir_of(("t", 0)) != mgr.dir_of(("t", 1))

        def broken(self, up_to=None):
            if self is bad:
                raise OSError(5, "Input/output error")
            return real(self, up_to)

        real = Log.flush
        monkeypatch.setattr(Log, "flush", broken)
        bad.append(batch(1))
        mgr.flusher.request(bad, bad.log_end_offset)
        for _ in range(3000):  # 30 s at most
            if mgr.offline_dirs:
                break
            await asyncio.sleep(0.01)
        assert list(mgr.offline_dirs) == [mgr.dir_of(("t", 0))]
        assert bad.offline and not good.offline
        await mgr.flusher.stop()
        monkeypatch.setattr(Log, "flush", real)
        mgr.shutdown()

    asyncio.run(scenario())


def test_flusher_request_merges_targets():
    flusher = LogFlusher(lambda lg, e: None)

    class Fake:
        pass

    a = Fake()
    flusher.request(a, 10)
    flusher.request(a, 5)
    flusher.request(a, 12)
    assert flusher._pending == {a: 12}


def test_full_recovery_leaves_one_descriptor_per_inactive_segment(open_log, clock):
    log = open_log(SMALL)
    while len(log.segments) < 30:
        log.append(batch(2))
    log.close()
    before = len(os.listdir("/proc/self/fd"))
    again = Log.open(log.dir, SMALL, recovery_point=0, clean_shutdown=False, now_ms=clock)
    opened = len(os.listdir("/proc/self/fd")) - before
    assert len(again.segments) == 30
    assert opened <= 30 + 2  # the .log of each, plus the active segment's index writers
    again.close()


def test_wait_durable_returns_after_the_fsync_and_reports_failure(tmp_path, clock, monkeypatch):
    async def scenario():
        mgr = LogManager([tmp_path / "d"], LogConfig(), now_ms=clock)
        mgr.startup(0)
        mgr.flusher.start()
        log = mgr.get_or_create_log("t", 0, LogConfig().with_overrides({"flush.messages": "1"}))
        log.append(batch(3))
        assert log.recovery_point == 0  # the append only asked for the flush
        await asyncio.wait_for(mgr.flusher.wait_durable(log, log.log_end_offset), 10)
        assert log.recovery_point == log.log_end_offset

        def broken(self, up_to=None):
            raise OSError("disk gone")

        monkeypatch.setattr(Log, "flush", broken)
        log.append(batch(1))
        try:
            await asyncio.wait_for(mgr.flusher.wait_durable(log, log.log_end_offset), 10)
            raise AssertionError("a failed fsync must not look durable")
        except OSError as e:
            assert "disk gone" in str(e)
        await mgr.flusher.stop()
        monkeypatch.undo()
        mgr.shutdown()

    asyncio.run(scenario())


def test_a_new_log_without_batches_is_not_fsynced_until_it_gets_one(tmp_path, monkeypatch):
    """A clean stop flushes every log: one made this run that never held a batch has only its
    empty segment file, whose name a power cut may lose at no cost, so its directory is not
    fsynced; once it has a batch, its directory is (the segment's name with the data)."""
    import strom.log.log as log_module

    synced: list[str] = []
    real = log_module.fsync_path
    monkeypatch.setattr(log_module, "fsync_path", lambda p: synced.append(os.path.basename(p)) or real(p))
    new = Log.open(tmp_path / "t-0", LogConfig())
    new.flush()
    assert "t-0" not in synced
    new.append(batch(1))
    new.flush()
    assert "t-0" in synced
    new.close()
    reopened = Log.open(tmp_path / "t-1", LogConfig())  # a new log, closed empty, opens empty again
    reopened.close()
    (tmp_path / "t-1" / "00000000000000000000.log").unlink()  # the name a power cut may lose
    again = Log.open(tmp_path / "t-1", LogConfig(), clean_shutdown=True)
    assert again.log_end_offset == 0 and len(again.segments) == 1
    again.close()
