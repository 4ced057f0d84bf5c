from __future__ import annotations

import pytest
from logtest_support import batch, read_all

from strom.log import LogConfig, LogManager, LogSegment
from strom.log.checkpoint import read_checkpoint
from strom.log.leader_epoch import EpochEntry, LeaderEpochCache
from strom.log.manager import (
    CLEAN_SHUTDOWN_FILE,
    LOG_START_OFFSET_CHECKPOINT,
    META_PROPERTIES,
    RECOVERY_POINT_CHECKPOINT,
    read_properties,
)

SMALL = LogConfig(segment_bytes=1000, index_interval_bytes=100)


@pytest.fixture
def dirs(tmp_path):
    return [tmp_path / "d1", tmp_path / "d2"]


@pytest.fixture
def spy_recover(monkeypatch):
    calls: list[int] = []
    real = LogSegment.recover

    def spy(self, max_message_bytes):
        calls.append(self.base_offset)
        return real(self, max_message_bytes)

    monkeypatch.setattr(LogSegment, "recover", spy)
    return calls


def manager(dirs, clock, config=SMALL) -> LogManager:
    return LogManager(dirs, config, now_ms=clock)


def test_startup_writes_meta_and_returns_cluster_id(dirs, clock):
    m = manager(dirs, clock)
    cluster_id = m.startup(3, None)
    assert len(cluster_id) == 22 and not cluster_id.startswith("-")
    for d in dirs:
        props = read_properties(d / META_PROPERTIES)
        assert props == {"version": "0", "broker.id": "3", "cluster.id": cluster_id}
    m.shutdown()
    # the id on disk wins over nothing, and is returned again
    assert manager(dirs, clock).startup(3, None) == cluster_id
    assert manager(dirs, clock).startup(3, cluster_id) == cluster_id


def test_given_cluster_id_is_used(dirs, clock):
    assert manager(dirs, clock).startup(1, "abcdefghijklmnopqrstuv") == "abcdefghijklmnopqrstuv"


def test_broker_id_mismatch_rejected(dirs, clock):
    manager(dirs, clock).startup(1, None)
    with pytest.raises(ValueError, match="broker.id"):
        manager(dirs, clock).startup(2, None)


def test_cluster_id_mismatch_rejected(dirs, clock):
    manager(dirs, clock).startup(1, "clusterAAAAAAAAAAAAAAA")
    with pytest.raises(ValueError, match="cluster"):
        manager(dirs, clock).startup(1, "clusterBBBBBBBBBBBBBBB")


def test_restart_keeps_everything(dirs, clock, spy_recover):
    m = manager(dirs, clock)
    m.startup(0, None)
    for p in range(4):
        log = m.get_or_create_log("orders.v1-eu", p, SMALL)
        for i in range(10 + p):
            log.append(batch(2, tag=b"%d-" % i))
    assert m.get_or_create_log("orders.v1-eu", 0) is m.get_log("orders.v1-eu", 0)
    # spread over both dirs
    assert sorted(len(list(d.glob("orders.v1-eu-*"))) for d in dirs) == [2, 2]
    m.shutdown()
    for d in dirs:
        assert (d / CLEAN_SHUTDOWN_FILE).exists()
        rp = read_checkpoint(d / RECOVERY_POINT_CHECKPOINT)
        assert len(rp) == 2 and all(v == 2 * (10 + p) for (_, p), v in rp.items())
        assert set(read_checkpoint(d / LOG_START_OFFSET_CHECKPOINT).values()) == {0}

    m = manager(dirs, clock)
    m.startup(0, None)
    assert spy_recover == []  # clean shutdown: nothing re-scanned
    assert m.topics() == {"orders.v1-eu"}
    assert sorted(tp for tp, _ in m.logs()) == [("orders.v1-eu", p) for p in range(4)]
    for p in range(4):
        log = m.get_log("orders.v1-eu", p)
        assert log.log_end_offset == log.recovery_point == 2 * (10 + p)
        assert [r[0] for r in read_all(log)] == list(range(2 * (10 + p)))
    # the marker is consumed at start-up so that a crash is noticed
    assert not any((d / CLEAN_SHUTDOWN_FILE).exists() for d in dirs)
    m.get_log("orders.v1-eu", 0).append(batch(1))
    m.flush_dirty()
    assert m.get_log("orders.v1-eu", 0).recovery_point == 21


def test_crash_recovers_from_checkpointed_recovery_point(dirs, clock, spy_recover):
    m = manager(dirs[:1], clock)
    m.startup(0, None)
    log = m.get_or_create_log("t", 0)
    for _ in range(30):
        log.append(batch(3))
    bases = [s.base_offset for s in log.segments]
    log.flush(up_to=bases[-2])
    m.checkpoint()
    for _ in range(3):
        log.append(batch(3))
    all_bases = [s.base_offset for s in log.segments]
    assert len(all_bases) > len(bases)
    # crash: no shutdown, no marker. Segments wholly below the recovery point are trusted.
    m2 = manager(dirs[:1], clock)
    m2.startup(0, None)
    assert spy_recover == [b for b in all_bases if b >= bases[-2]]
    assert m2.get_log("t", 0).log_end_offset == 99
    assert m2.get_log("t", 0).recovery_point == bases[-2]
    m2.shutdown()
    log.close()  # the crashed instance's descriptors


def test_missing_marker_means_recovery(dirs, clock, spy_recover):
    m = manager(dirs[:1], clock)
    m.startup(0, None)
    m.get_or_create_log("t", 0).append(batch(3))
    m.shutdown()
    (dirs[0] / CLEAN_SHUTDOWN_FILE).unlink()
    (dirs[0] / RECOVERY_POINT_CHECKPOINT).unlink()
    manager(dirs[:1], clock).startup(0, None)
    assert spy_recover == [0]


def test_delete_log(dirs, clock):
    m = manager(dirs[:1], clock)
    m.startup(0, None)
    log = m.get_or_create_log("gone", 0)
    log.append(batch(3))
    m.get_or_create_log("kept", 0).append(batch(1))
    never_written = m.get_or_create_log("unmade", 0)  # has no directory: nothing to remove
    assert m.delete_log("unmade", 0) and never_written.closed
    assert m.delete_log("gone", 0)
    assert not m.delete_log("gone", 0)
    assert m.get_log("gone", 0) is None
    assert sorted(p.name for p in dirs[0].iterdir() if p.is_dir()) == ["kept-0"]
    m.checkpoint()
    assert list(read_checkpoint(dirs[0] / RECOVERY_POINT_CHECKPOINT)) == [("kept", 0)]
    m.shutdown()


def test_the_cleaner_looks_only_at_compacted_logs(dirs, clock):
    """compacted_logs() (what the log cleaner walks every backoff) follows each log's
    cleanup.policy as it is set, changed and the log deleted, instead of every log there is."""
    m = manager(dirs[:1], clock)
    m.startup(0, None)
    compact = SMALL.with_overrides({"cleanup.policy": "compact"})
    keyed = m.get_or_create_log("keyed", 0, compact)
    plain = m.get_or_create_log("plain", 0)
    assert m.compacted_logs() == [(("keyed", 0), keyed)]
    plain.config = compact
    keyed.config = SMALL
    assert m.compacted_logs() == [(("plain", 0), plain)]
    m.delete_log("plain", 0)
    assert m.compacted_logs() == []
    m.shutdown()


def test_leftover_delete_dirs_removed_at_startup(dirs, clock):
    d = dirs[0]
    (d / "t-0.0123abcd-delete").mkdir(parents=True)
    (d / "t-0.0123abcd-delete" / "00000000000000000000.log").write_bytes(b"x")
    (d / "lost+found").mkdir()
    m = manager(dirs[:1], clock)
    m.startup(0, None)
    assert sorted(p.name for p in d.iterdir() if p.is_dir()) == ["lost+found"]
    assert m.topics() == set()


def test_config_for_topic(dirs, clock):
    m = manager(dirs[:1], clock)
    m.startup(0, None)
    m.get_or_create_log("a", 0).append(batch(1))
    m.get_or_create_log("b", 0).append(batch(1))
    m.shutdown()
    special = LogConfig(retention_ms=5)
    m = manager(dirs[:1], clock)
    m.startup(0, None, lambda topic: special if topic == "a" else SMALL)
    assert m.get_log("a", 0).config is special
    assert m.get_log("b", 0).config is SMALL


def test_cleanup_applies_retention_and_purges(dirs, clock):
    config = LogConfig(segment_bytes=300, retention_ms=1000, file_delete_delay_ms=100)
    m = manager(dirs[:1], clock, config)
    m.startup(0, None)
    log = m.get_or_create_log("t", 0)
    for _ in range(10):
        log.append(batch(3, ts=clock.now))
    n = len(log.segments)
    clock.now += 2000
    assert m.cleanup() == n
    assert list(log.dir.glob("*.deleted"))
    clock.now += 100
    assert m.cleanup() == 0
    assert not list(log.dir.glob("*.deleted"))
    m.shutdown()


def test_startup_of_many_partitions_does_not_rescan(tmp_path, clock, spy_recover):
    d = tmp_path / "data"
    m = LogManager([d], LogConfig(segment_bytes=500), now_ms=clock)
    m.startup(0, None)
    payload = batch(5)
    for p in range(1000):
        log = m.get_or_create_log("many", p)
        for _ in range(4 if p % 100 == 0 else 1):
            log.append(bytearray(payload))
    m.shutdown()
    spy_recover.clear()
    m = LogManager([d], LogConfig(segment_bytes=500), now_ms=clock)
    m.startup(0, None)
    assert spy_recover == []  # a clean start reads checkpoints; how fast is for benchmarks
    assert len(list(m.logs())) == 1000
    assert m.get_log("many", 100).log_end_offset == 20
    m.shutdown()


def test_crash_opens_logs_unchanged_since_their_flush_without_recovery(dirs, clock, spy_recover):
    """After a kill -9, a log whose active segment still has the size recorded when it was
    flushed to its end (and that rolled nothing since) is not read; the others recover."""
    m = manager(dirs[:1], clock)
    m.startup(0, None)
    for p in range(4):
        log = m.get_or_create_log("t", p)
        for _ in range(3):
            log.append(batch(2))
    m.flush_dirty()
    m.checkpoint()
    m.get_log("t", 1).append(batch(2))  # appended after the checkpoint: must be recovered
    rolled = m.get_log("t", 2)
    rolled.roll()  # a new segment after the checkpoint, the old one unchanged
    rolled.append(batch(2))
    spy_recover.clear()
    m2 = manager(dirs[:1], clock)  # no shutdown: as after kill -9
    m2.startup(0, None)
    assert not m2.get_log("t", 0).loaded and not m2.get_log("t", 3).loaded
    assert m2.get_log("t", 0).log_end_offset == 6
    assert m2.get_log("t", 1).log_end_offset == 8 and m2.get_log("t", 1).loaded
    assert m2.get_log("t", 2).log_end_offset == 8 and m2.get_log("t", 2).loaded
    assert sorted(spy_recover) == [0, 6]  # t-1's segment, t-2's new segment
    # The unread logs read back everything when used.
    assert [r[0] for r in read_all(m2.get_log("t", 3))] == list(range(6))
    m2.shutdown()
    for p in range(4):
        m.get_log("t", p).close()  # the crashed instance's descriptors


def test_a_lazily_opened_log_reads_its_directory_before_appending(dirs, clock):
    m = manager(dirs[:1], clock)
    m.startup(0, None)
    log = m.get_or_create_log("t", 0)
    log.append(batch(3))
    m.shutdown()
    m = manager(dirs[:1], clock)
    m.startup(0, None)
    log = m.get_log("t", 0)
    assert not log.loaded and log.log_end_offset == 3
    info = log.append(batch(2))
    assert log.loaded and info.first_offset == 3
    assert [r[0] for r in read_all(log)] == list(range(5))
    m.shutdown()


def test_a_stop_ends_the_background_load_and_leaves_unread_logs_as_they_were(dirs, clock):
    import asyncio

    m = manager(dirs[:1], clock)
    m.startup(0, None)
    for p in range(6):
        m.get_or_create_log("t", p).append(batch(p + 1))
    m.shutdown()
    m = manager(dirs[:1], clock)
    m.startup(0, None)
    loaded_before_stop = []

    def stop_after_first_batch(done: int) -> None:
        loaded_before_stop.append(done)
        m.background_load_stopped = True  # the broker began to stop

    m.on_loaded = stop_after_first_batch
    assert asyncio.run(m.load_in_background(batch=2)) == 2
    assert loaded_before_stop == [2]
    unread = [p for p in range(6) if not m.get_log("t", p).loaded]
    assert len(unread) == 4
    m.shutdown()  # the unread ones close without being read or written
    m = manager(dirs[:1], clock)
    m.startup(0, None)
    for p in range(6):  # every log whole after the next start, read or not before
        assert [r[0] for r in read_all(m.get_log("t", p))] == list(range(p + 1))
    m.shutdown()


def test_start_up_says_which_logs_it_found_intact(dirs, clock, spy_recover):
    """A restarted leader keeps its leader epoch only for logs that lost nothing: after a clean
    shutdown every log; after a crash those unchanged since their last flush."""
    m = manager(dirs[:1], clock)
    m.startup(0, None)
    for p in range(3):
        m.get_or_create_log("t", p).append(batch(2))
    m.shutdown()
    m = manager(dirs[:1], clock)
    m.startup(0, None)
    assert [m.found_intact("t", p) for p in range(3)] == [True, True, True]
    assert not m.found_intact("t", 3)  # not a log here
    m.get_log("t", 1).append(batch(2))  # unflushed when the broker is killed
    m.checkpoint()  # the periodic checkpoint: unread logs keep their flushed ends in it
    m2 = manager(dirs[:1], clock)  # no shutdown: as after kill -9
    m2.startup(0, None)
    assert [m2.found_intact("t", p) for p in range(3)] == [True, False, True]
    assert sorted(spy_recover) == [0]  # t-1 only: the flushed ends of the clean start still count
    m2.delete_log("t", 0)
    assert not m2.found_intact("t", 0)
    m2.shutdown()
    for p in (0, 2):
        m.get_log("t", p).close()  # the crashed instance's descriptors


def test_crash_opens_logs_made_since_the_checkpoints_and_never_written_without_recovery(
        dirs, clock, spy_recover):
    """kill -9 soon after the first produce to many new partitions made their files: the new
    logs, empty and named by no checkpoint, are not read one by one at the next start (nothing
    to recover), but nothing vouches for them as intact; a new log that was written, or holds
    anything else, recovers."""
    m = manager(dirs[:1], clock)
    m.startup(0, None)
    for p in range(4):
        m.get_or_create_log("t", p).make_files()
    m.get_log("t", 1).append(batch(2))  # written, never flushed nor checkpointed
    (dirs[0] / "t-2" / "leader-epoch-checkpoint").write_text("0\n1\n0 0\n")  # something else
    m2 = manager(dirs[:1], clock)  # no shutdown, no checkpoint: as after kill -9
    m2.startup(0, None)
    assert [m2.get_log("t", p).loaded for p in range(4)] == [False, True, True, False]
    assert sorted(spy_recover) == [0, 0]  # t-1 and t-2
    assert [m2.get_log("t", p).log_end_offset for p in range(4)] == [0, 2, 0, 0]
    assert not any(m2.found_intact("t", p) for p in range(4))
    info = m2.get_log("t", 3).append(batch(2))  # read when first used, and usable
    assert info.first_offset == 0 and [r[0] for r in read_all(m2.get_log("t", 3))] == [0, 1]
    m2.shutdown()
    for p in range(4):
        m.get_log("t", p).close()  # the crashed instance's descriptors


@pytest.mark.parametrize("whole", [True, False], ids=["syncfs", "fsync-each"])
def test_clean_shutdown_by_one_syncfs_or_an_fsync_per_file(dirs, clock, spy_recover, monkeypatch, whole):
    """Where the filesystem can be synced whole, a clean shutdown fsyncs no log file: one syncfs
    (and one more after closing) makes everything durable, and the restart trusts it all as
    after flushing each log. A small active segment is closed without index files either way;
    the restart finds its end and max timestamp by the scan it makes of it anyway."""
    import os

    import strom.log.manager as manager_module

    synced_whole: list = []
    epochs_at_sync: list = []  # what the small log's epoch file said when each syncfs ran
    monkeypatch.setattr(manager_module, "can_sync_whole", lambda d: whole)
    real_sync_whole = manager_module.sync_whole

    def sync_whole(d):
        synced_whole.append(d)
        epochs_at_sync.append(LeaderEpochCache(d / "small-0").entries)
        real_sync_whole(d)

    monkeypatch.setattr(manager_module, "sync_whole", sync_whole)
    m = manager(dirs[:1], clock)
    m.startup(0, None)
    small = m.get_or_create_log("small", 0, LogConfig())  # a 4096-byte index interval
    small.defer_epoch_writes(lambda cache: None)  # as a broker's batched writer, which has not run
    small.append(batch(2, ts=1_000), leader_epoch=3)
    small.append(batch(1, ts=3_000), leader_epoch=3)
    assert small.leader_epoch_cache.dirty  # the epoch file waits for the broker's batched writer
    large = m.get_or_create_log("large", 0)
    for i in range(12):  # past SMALL's 100-byte index interval: index entries
        large.append(batch(2, ts=2_000 + i))
    fsynced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: fsynced.append(os.readlink(f"/proc/self/fd/{fd}")) or real_fsync(fd))
    m.shutdown()
    monkeypatch.setattr(os, "fsync", real_fsync)
    log_files_fsynced = [f for f in fsynced if f.endswith(".log")]
    if whole:
        assert synced_whole == [dirs[0], dirs[0]] and log_files_fsynced == []
        # The recovery point moves past epoch 3's batches at the first syncfs: its file first.
        assert epochs_at_sync[0] == [EpochEntry(3, 0)]
    else:
        assert synced_whole == [] and len(log_files_fsynced) >= 2
    assert (dirs[0] / CLEAN_SHUTDOWN_FILE).exists()
    assert read_checkpoint(dirs[0] / RECOVERY_POINT_CHECKPOINT) == {("small", 0): 3, ("large", 0): 24}
    small_files = sorted(p.name for p in (dirs[0] / "small-0").iterdir())
    assert not any(name.endswith((".index", ".timeindex")) for name in small_files), small_files
    large_active = large.segments[-1]
    assert large_active.offset_index.path.exists() and large_active.time_index.path.exists()

    m = manager(dirs[:1], clock)
    m.startup(0, None)
    assert spy_recover == []  # nothing re-scanned as a recovery
    small = m.get_log("small", 0)
    assert small.log_end_offset == small.recovery_point == 3
    assert [r[0] for r in read_all(small)] == [0, 1, 2]
    assert small.active_segment.max_timestamp == 3_000  # found by the scan of the small segment
    assert LeaderEpochCache(small.dir).entries == [EpochEntry(3, 0)]  # written before the sync
    assert m.get_log("large", 0).log_end_offset == 24
    m.shutdown()


def test_a_dir_syncfs_fails_on_is_not_marked_clean(dirs, clock, spy_recover, monkeypatch):
    import strom.log.manager as manager_module

    def failing(d):
        raise OSError(5, "Input/output error", str(d))

    monkeypatch.setattr(manager_module, "can_sync_whole", lambda d: True)
    monkeypatch.setattr(manager_module, "sync_whole", failing)
    m = manager(dirs[:1], clock)
    m.startup(0, None)
    m.get_or_create_log("t", 0).append(batch(3))
    m.shutdown()
    assert not (dirs[0] / CLEAN_SHUTDOWN_FILE).exists()
    assert read_checkpoint(dirs[0] / RECOVERY_POINT_CHECKPOINT) == {("t", 0): 0}  # nothing known durable
    monkeypatch.setattr(manager_module, "can_sync_whole", lambda d: False)
    m = manager(dirs[:1], clock)
    m.startup(0, None)
    assert spy_recover == [0]  # recovered, as after a crash
    assert m.get_log("t", 0).log_end_offset == 3
    m.shutdown()
