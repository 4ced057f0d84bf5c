"""LogManager across several dirs when one fails, the high-watermark checkpoint, and the log
start offset that DeleteRecords moves."""

from __future__ import annotations

import pytest
from logtest_support import batch, read_all

from strom.log import LogConfig, LogManager
from strom.log.checkpoint import read_checkpoint
from strom.log.manager import (
    CLEAN_SHUTDOWN_FILE,
    HIGH_WATERMARK_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
)
from strom.protocol.errors import OffsetOutOfRangeError, StorageError

SMALL = LogConfig(segment_bytes=400, index_interval_bytes=100)


def test_unusable_dir_at_startup_goes_offline(tmp_path, clock):
    (tmp_path / "b").write_bytes(b"a file, not a dir")
    mgr = LogManager([tmp_path / "a", tmp_path / "b"], SMALL, now_ms=clock)
    mgr.startup(0)
    assert list(mgr.offline_dirs) == [tmp_path / "b"]
    assert mgr.live_dirs == [tmp_path / "a"]
    created = [mgr.get_or_create_log("t", p) for p in range(3)]
    assert {mgr.dir_of(("t", p)) for p in range(3)} == {tmp_path / "a"}  # only live dirs
    created[0].append(batch(1))
    mgr.shutdown()
    assert (tmp_path / "a" / CLEAN_SHUTDOWN_FILE).exists()


def test_every_dir_unusable_fails_startup(tmp_path, clock):
    (tmp_path / "a").write_bytes(b"")
    with pytest.raises(OSError, match="none of the log dirs"):
        LogManager([tmp_path / "a"], SMALL, now_ms=clock).startup(0)


def test_io_error_takes_the_whole_dir_offline(tmp_path, clock):
    mgr = LogManager([tmp_path / "a", tmp_path / "b"], SMALL, now_ms=clock)
    mgr.startup(0)
    failures = []
    mgr.dir_failure_listeners.append(lambda d, why: failures.append(d))
    logs = {p: mgr.get_or_create_log("t", p) for p in range(4)}
    for lg in logs.values():
        lg.append(batch(2))
    in_b = [p for p in logs if mgr.dir_of(("t", p)) == tmp_path / "b"]
    (tmp_path / "b" / f"t-{in_b[0]}").rename(tmp_path / "gone")  # the next roll cannot create a file
    with pytest.raises(StorageError):
        while True:
            logs[in_b[0]].append(batch(3))
    assert failures == [tmp_path / "b"]
    for p, lg in logs.items():
        assert lg.offline == (p in in_b)
    with pytest.raises(StorageError):
        logs[in_b[1]].read(0, 1000)
    with pytest.raises(StorageError):
        logs[in_b[1]].append(batch(1))
    in_a = [p for p in logs if p not in in_b]
    logs[in_a[0]].append(batch(1))  # the other dir carries on
    mgr.checkpoint()
    assert read_checkpoint(tmp_path / "a" / RECOVERY_POINT_CHECKPOINT)
    mgr.shutdown()
    assert (tmp_path / "a" / CLEAN_SHUTDOWN_FILE).exists()
    assert not (tmp_path / "b" / CLEAN_SHUTDOWN_FILE).exists()  # its logs were not flushed


def test_startup_does_not_recreate_logs_of_an_offline_dir(tmp_path, clock):
    mgr = LogManager([tmp_path / "a", tmp_path / "b"], SMALL, now_ms=clock)
    mgr.startup(0)
    for p in range(2):
        mgr.get_or_create_log("t", p).append(batch(1))
    in_b = next(p for p in range(2) if mgr.dir_of(("t", p)) == tmp_path / "b")
    mgr.shutdown()
    (tmp_path / "b").rename(tmp_path / "b.gone")
    (tmp_path / "b").write_bytes(b"")  # unusable
    mgr = LogManager([tmp_path / "a", tmp_path / "b"], SMALL, now_ms=clock)
    mgr.new_logs_expected = False  # a broker's start-up: the controller names existing partitions
    mgr.startup(0)
    placeholder = mgr.get_or_create_log("t", in_b)
    assert placeholder.offline and mgr.dir_of(("t", in_b)) == tmp_path / "b"
    with pytest.raises(StorageError):
        placeholder.read(0, 100)
    mgr.new_logs_expected = True  # after start-up, a missing log is a new partition
    fresh = mgr.get_or_create_log("new", 0)
    assert not fresh.offline and mgr.dir_of(("new", 0)) == tmp_path / "a"
    mgr.shutdown()


def test_high_watermark_checkpoint(tmp_path, clock):
    mgr = LogManager([tmp_path / "a", tmp_path / "b"], SMALL, now_ms=clock)
    mgr.startup(0)
    for p in range(4):
        mgr.get_or_create_log("t", p).append(batch(p + 1))
    mgr.high_watermarks = lambda: {("t", p): p + 1 for p in range(4)}
    mgr.checkpoint_high_watermarks()
    per_dir = [read_checkpoint(d / HIGH_WATERMARK_CHECKPOINT) for d in mgr.log_dirs]
    assert sorted(len(x) for x in per_dir) == [2, 2]
    assert mgr.read_high_watermarks() == {("t", p): p + 1 for p in range(4)}
    mgr.shutdown()  # writes it again
    assert read_checkpoint(tmp_path / "a" / HIGH_WATERMARK_CHECKPOINT) == per_dir[0]


def test_high_watermark_checkpoint_is_rebuilt_only_when_something_moved(tmp_path, clock):
    """An idle broker does not rebuild replication-offset-checkpoint every interval: only when
    its high-watermark clock ticked, or a log came, went or moved."""
    mgr = LogManager([tmp_path / "a"], SMALL, now_ms=clock)
    mgr.startup(0)
    mgr.get_or_create_log("t", 0).append(batch(1))
    hws, version, reads = {("t", 0): 1}, [7], []
    mgr.high_watermarks = lambda: reads.append(1) or dict(hws)
    mgr.high_watermarks_version = lambda: version[0]
    mgr.checkpoint_high_watermarks()
    mgr.checkpoint_high_watermarks()
    assert len(reads) == 1  # nothing moved: not even read again
    hws[("t", 0)], version[0] = 2, 8
    mgr.checkpoint_high_watermarks()
    assert len(reads) == 2 and mgr.read_high_watermarks() == {("t", 0): 2}
    mgr.get_or_create_log("t", 1)  # a new log: the layout moved
    hws[("t", 1)] = 0
    mgr.checkpoint_high_watermarks()
    assert len(reads) == 3 and mgr.read_high_watermarks() == {("t", 0): 2, ("t", 1): 0}
    mgr.shutdown()


def test_offset_checkpoints_walk_the_logs_only_when_an_offset_moved(tmp_path, clock):
    """Idle, the 60 s recovery-point (with flushed-end) and log-start checkpoints do not walk
    every log: only after a flush, a truncation, a log start move or a new log."""
    mgr = LogManager([tmp_path / "a"], SMALL, now_ms=clock)
    mgr.startup(0)
    log = mgr.get_or_create_log("t", 0)
    for _ in range(4):
        log.append(batch(2))
    walks: list[str] = []
    real = mgr.write_per_dir
    mgr.write_per_dir = lambda name, *a, **k: walks.append(name) or real(name, *a, **k)

    def checkpoint() -> None:
        mgr.checkpoint_recovery_points()
        mgr.checkpoint_log_start_offsets()

    checkpoint()
    assert walks == [RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT]
    checkpoint()
    assert len(walks) == 2  # nothing moved
    for change in (log.flush,  # the recovery point moves
                   # the end moves back above the recovery point: its flushed end must go
                   lambda: (log.append(batch(2)), log.truncate_to(9)),
                   lambda: log.increment_log_start_offset(2),
                   lambda: mgr.get_or_create_log("t", 1)):
        change()
        walks.clear()
        checkpoint()
        assert walks == [RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT], change
        checkpoint()
        assert len(walks) == 2
    assert read_checkpoint(tmp_path / "a" / LOG_START_OFFSET_CHECKPOINT) == {("t", 0): 2, ("t", 1): 0}
    assert read_checkpoint(tmp_path / "a" / RECOVERY_POINT_CHECKPOINT) == {("t", 0): 8, ("t", 1): 0}
    mgr.shutdown()


def test_log_start_offset_moves_up_only_and_survives_restart(tmp_path, clock):
    mgr = LogManager([tmp_path / "a"], SMALL, now_ms=clock)
    mgr.startup(0)
    log = mgr.get_or_create_log("t", 0)
    for _ in range(20):
        log.append(batch(2))
    assert log.increment_log_start_offset(13)
    assert not log.increment_log_start_offset(5)
    assert log.log_start_offset == 13 and log.recovery_point >= 13
    with pytest.raises(OffsetOutOfRangeError):
        log.increment_log_start_offset(41)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(12, 1000)
    assert read_all(log)[0][0] == 13
    before = len(log.segments)
    assert log.delete_retention_segments() > 0  # segments wholly below 13 go
    assert len(log.segments) < before and log.log_start_offset == 13
    mgr.checkpoint_log_start_offsets()
    assert read_checkpoint(tmp_path / "a" / LOG_START_OFFSET_CHECKPOINT) == {("t", 0): 13}
    mgr.shutdown()
    mgr = LogManager([tmp_path / "a"], SMALL, now_ms=clock)
    mgr.startup(0)
    assert mgr.get_log("t", 0).log_start_offset == 13
    mgr.shutdown()


def test_stable_items_survive_a_change_made_while_the_garbage_collector_runs():
    """What a worker thread's walk of the loop's dicts meets: a collection in the middle of
    copying the items runs Python code (callbacks, finalizers), and the loop's thread gets in
    and changes the dict. Here a gc callback makes that change, deterministically."""
    import gc

    from strom.log.manager import stable_items

    d = {i: i for i in range(50_000)}

    def meddle(phase: str, _info: dict) -> None:
        if phase == "start":
            d[len(d) + 1_000_000] = 0

    gc.callbacks.append(meddle)
    try:
        with pytest.raises(RuntimeError, match="changed size"):
            list(d.items())  # what the walks did
        before = len(d)
        items = stable_items(d)
    finally:
        gc.callbacks.remove(meddle)
    assert before <= len(items) <= len(d) and len(set(items)) == len(items)
