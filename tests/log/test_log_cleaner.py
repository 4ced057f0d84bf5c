"""The log cleaner on real segment files: which records survive, how segments are merged and
swapped, tombstones and their delete horizon, transactions, and crashes in the middle."""

from __future__ import annotations

import asyncio
import os
import struct

import pytest
from logtest_support import T0, keyed_batch, read_records

from strom.log import Log, LogConfig, LogManager
from strom.log.checkpoint import read_checkpoint
from strom.log.cleaner import (
    CLEANER_CHECKPOINT,
    DELETE_HORIZON_MASK,
    Cleaner,
    CleanerConfig,
    LogCleaner,
    LogToClean,
    cleanable_offsets,
)
from strom.protocol import compression
from strom.protocol.records import (
    CONTROL_MASK,
    TRANSACTIONAL_MASK,
    Record,
    build_batch,
    read_header,
    scan_valid_prefix,
)

COMPACT = LogConfig(segment_bytes=600, index_interval_bytes=64, cleanup_policy="compact",
                    delete_retention_ms=1000, file_delete_delay_ms=0)


def latest(records: list[Record]) -> dict[bytes, tuple[int, bytes | None]]:
    out: dict[bytes, tuple[int, bytes | None]] = {}
    for r in records:
        out[r.key] = (r.offset, r.value)
    return out


def clean(log: Log, now: int, checkpoint: int | None = None, capacity: int = 1 << 20,
          producer_last_offsets=None, stable_offset: int | None = None):
    """One synchronous pass, swapping groups in directly (what LogCleaner does on the loop)."""
    first_dirty, uncleanable = cleanable_offsets(log, checkpoint, now, stable_offset)
    ltc = LogToClean(("t", 0), log, first_dirty, uncleanable, 0, 0)
    cleaner = LogCleaner(None, CleanerConfig, producer_last_offsets=lambda _tp: producer_last_offsets or {})
    job = cleaner.plan(ltc, now)

    def swap(base, old):
        log.replace_segments(base, old)
        return True

    try:
        return Cleaner(capacity).clean(job, swap, lambda: False)
    finally:
        job.close()


def fill(log: Log, rounds: int, keys: int = 10, *, ts: int = T0) -> None:
    for r in range(rounds):
        log.append(keyed_batch([(b"k%d" % k, b"v%d-%d" % (k, r)) for k in range(keys)], ts=ts + r))


def test_keeps_latest_record_per_key_with_offsets_unchanged(open_log, clock):
    log = open_log(COMPACT)
    fill(log, 20)
    before = read_records(log)
    assert len(log.segments) > 5
    active_base = log.active_segment.base_offset
    result = clean(log, clock.now)
    after = read_records(log)
    # Below the active segment only the latest version of each key is left; the active
    # segment is untouched.
    assert [r for r in after if r.offset >= active_base] == [r for r in before if r.offset >= active_base]
    cleaned = [r for r in after if r.offset < active_base]
    expected = {k: v for k, v in latest([r for r in before if r.offset < active_base]).items()}
    assert {r.key: (r.offset, r.value) for r in cleaned} == expected
    assert len(cleaned) == len(expected)  # one per key
    assert [r.offset for r in after] == sorted(r.offset for r in after)
    assert latest(after) == latest(before)  # every key still reads its latest value
    assert result.end_offset == active_base
    assert log.log_end_offset == 200 and log.log_start_offset == 0
    # Groups are formed by the sizes before cleaning (as Kafka does): full segments are cleaned
    # one by one, and the next pass merges the now small ones within segment.bytes.
    count = len(log.segments)
    clean(log, clock.now)
    assert len(log.segments) < min(count, 4)
    assert all(s.size <= COMPACT.segment_bytes for s in log.segments[:-1])
    assert read_records(log) == after
    assert not [p for p in os.listdir(log.dir) if p.endswith((".cleaned", ".swap"))]


def test_survives_reopen_and_indexes_are_consistent(open_log, clock, tmp_path):
    log = open_log(COMPACT)
    fill(log, 20)
    clean(log, clock.now)
    want = read_records(log)
    log.close()
    for clean_shutdown in (True, False):
        again = Log.open(log.dir, COMPACT, clean_shutdown=clean_shutdown, now_ms=clock)
        assert read_records(again) == want
        # Reads from any offset land on the right batch (the offset index of cleaned segments).
        for r in want[::7]:
            assert read_records(again, r.offset)[0] == r
        again.close()


def test_tombstones_stay_for_delete_retention_then_go(open_log, clock):
    log = open_log(COMPACT)
    fill(log, 5)
    log.append(keyed_batch([(b"k3", None), (b"k7", None)]))
    fill(log, 1, keys=2)  # more dirty data after the tombstones
    log.roll()
    first = clean(log, clock.now)
    records = read_records(log)
    assert latest(records)[b"k3"][1] is None and latest(records)[b"k7"][1] is None
    assert first.min_delete_horizon == clock.now + COMPACT.delete_retention_ms
    stamped = [h for h in _headers(log) if h.attributes & DELETE_HORIZON_MASK]
    assert len(stamped) == 1 and stamped[0].base_timestamp == clock.now + 1000
    # The stamp does not change record timestamps.
    assert {r.key: r.timestamp for r in records if r.value is None} == {b"k3": T0, b"k7": T0}
    # Before the horizon a second pass keeps them; after it they are gone.
    clock.now += 999
    clean(log, clock.now, checkpoint=first.end_offset)
    assert sum(r.value is None for r in read_records(log)) == 2
    clock.now += 1
    second = clean(log, clock.now, checkpoint=first.end_offset)
    records = read_records(log)
    assert {r.key for r in records} == {b"k%d" % k for k in range(10)} - {b"k3", b"k7"}
    assert second.min_delete_horizon is None


def test_min_compaction_lag_and_stable_offset_bound_the_cleanable_part(open_log, clock):
    log = open_log(COMPACT.with_overrides({"min.compaction.lag.ms": "60000"}))
    fill(log, 10, ts=clock.now - 120_000)  # old enough
    old_end = log.log_end_offset
    fill(log, 10, ts=clock.now - 1_000)  # too young to compact
    log.roll()
    first_dirty, uncleanable = cleanable_offsets(log, None, clock.now)
    assert first_dirty == 0
    assert old_end - 10 <= uncleanable <= old_end + 10  # the first segment with young records
    clean(log, clock.now)
    young = [r for r in read_records(log) if r.offset >= uncleanable]
    assert len(young) == log.log_end_offset - uncleanable  # untouched
    # A stable offset (high watermark) below the active segment bounds it too.
    assert cleanable_offsets(log, None, clock.now, stable_offset=25)[1] <= 25


def test_dirty_ratio_decides_whether_a_log_is_cleaned(tmp_path, clock):
    mgr = LogManager([tmp_path / "d"], COMPACT, now_ms=clock)
    mgr.startup(0)
    log = mgr.get_or_create_log("t", 0, COMPACT)
    fill(log, 20)
    cleaner = LogCleaner(mgr, CleanerConfig, now_ms=clock)
    ltc = cleaner.grab_filthiest()
    assert ltc is not None and ltc.cleanable_ratio == 1.0  # never cleaned: all dirty
    cleaner.in_progress.clear()
    cleaner.checkpoints[("t", 0)] = log.active_segment.base_offset  # all clean now
    assert cleaner.grab_filthiest() is None
    log.append(keyed_batch([(b"k1", b"x" * 400)]))
    log.roll()
    assert cleaner.grab_filthiest() is None  # a little dirty: below the default ratio of 0.5
    log.config = COMPACT.with_overrides({"min.cleanable.dirty.ratio": "0.05"})
    ltc = cleaner.grab_filthiest()
    assert ltc is not None and 0.05 < ltc.cleanable_ratio < 0.5
    assert cleaner.grab_filthiest() is None  # in progress: not handed out twice
    cleaner.in_progress.clear()
    log.config = COMPACT.with_overrides({"cleanup.policy": "delete"})
    cleaner.checkpoints.clear()
    assert cleaner.grab_filthiest() is None  # not compacted at all
    mgr.shutdown()


def test_small_offset_map_takes_several_passes(open_log, clock):
    log = open_log(COMPACT)
    fill(log, 20, keys=10)
    log.roll()
    before = read_records(log)
    checkpoint = None
    passes = 0
    while checkpoint is None or checkpoint < log.active_segment.base_offset:
        result = clean(log, clock.now, checkpoint, capacity=600)  # a few keys per pass
        assert checkpoint is None or result.end_offset > checkpoint
        checkpoint = result.end_offset
        passes += 1
    assert passes > 1
    assert latest(read_records(log)) == latest(before)
    assert len(read_records(log)) == 10


def test_compressed_batches_stay_compressed(open_log, clock):
    log = open_log(COMPACT)
    for r in range(6):
        log.append(keyed_batch([(b"k%d" % k, b"value-%d" % r * 5) for k in range(4)], codec=compression.GZIP))
    log.roll()
    clean(log, clock.now)
    headers = _headers(log)
    assert headers and all(h.compression == compression.GZIP for h in headers)
    assert len(read_records(log)) == 4
    # The last offset delta is kept even though records were dropped (Kafka keeps it).
    assert all(h.last_offset_delta == 3 for h in headers)


def test_records_without_key_are_dropped_and_past_map_records_kept(open_log, clock):
    log = open_log(COMPACT)
    log.append(keyed_batch([(None, b"no key"), (b"a", b"1")]))
    log.append(keyed_batch([(b"a", b"2")]))
    log.roll()
    clean(log, clock.now)
    assert [(r.key, r.value) for r in read_records(log)] == [(b"a", b"2")]


def control_batch(producer_id: int, kind: int) -> bytearray:
    rec = Record(0, T0, struct.pack(">hh", 0, kind), struct.pack(">hi", 0, 0), ())
    data = bytearray(build_batch([rec], timestamp=T0, producer_id=producer_id, producer_epoch=0))
    return _with_attributes(data, TRANSACTIONAL_MASK | CONTROL_MASK)


def _with_attributes(data: bytearray, bits: int) -> bytearray:
    from crc32c import crc32c

    data[21:23] = (int.from_bytes(data[21:23], "big") | bits).to_bytes(2, "big")
    data[17:21] = crc32c(bytes(data[21:])).to_bytes(4, "big")
    return data


def test_aborted_transactions_are_removed_and_markers_kept_until_empty(open_log, clock):
    log = open_log(COMPACT.with_overrides({"segment.bytes": "100000"}))
    txn = dict(producer_id=7, producer_epoch=0, attributes=TRANSACTIONAL_MASK)
    log.append(keyed_batch([(b"a", b"committed")], base_sequence=0, **txn))
    log.append(control_batch(7, 1))  # COMMIT
    log.append(keyed_batch([(b"a", b"aborted")], base_sequence=1, **txn))
    log.append(control_batch(7, 0))  # ABORT
    log.append(keyed_batch([(b"b", b"plain")]))
    log.roll()
    clean(log, clock.now)
    data = [(r.key, r.value) for r in read_records(log)]
    # The aborted write neither survives nor shadows the committed one; markers stay for now.
    assert (b"a", b"committed") in data and (b"a", b"aborted") not in data
    markers = [h for h in _headers(log) if h.attributes & CONTROL_MASK]
    assert len(markers) == 2
    # Supersede the committed value: its transaction becomes empty, its marker gets a horizon
    # and goes once the horizon passes. The abort marker's data is gone too.
    log.append(keyed_batch([(b"a", b"newer")]))
    log.roll()
    clean(log, clock.now)
    clean(log, clock.now)
    assert all(h.attributes & DELETE_HORIZON_MASK for h in _headers(log) if h.attributes & CONTROL_MASK)
    clock.now += 2000
    clean(log, clock.now)
    assert not [h for h in _headers(log) if h.attributes & CONTROL_MASK]
    assert sorted((r.key, r.value) for r in read_records(log)) == [(b"a", b"newer"), (b"b", b"plain")]


def test_undecided_transaction_is_not_cleaned(open_log, clock):
    log = open_log(COMPACT.with_overrides({"segment.bytes": "100000"}))
    log.append(keyed_batch([(b"a", b"1")]))
    log.append(keyed_batch([(b"a", b"2")]))
    open_at = log.log_end_offset
    log.append(keyed_batch([(b"a", b"pending")], producer_id=3, producer_epoch=0, base_sequence=0,
                           attributes=TRANSACTIONAL_MASK))
    log.append(keyed_batch([(b"a", b"3")]))
    log.roll()
    result = clean(log, clock.now)
    assert result.end_offset == open_at  # stopped at the start of the open transaction
    assert [r.value for r in read_records(log)] == [b"2", b"pending", b"3"]


def test_last_batch_of_an_active_producer_is_kept_even_if_empty(open_log, clock):
    log = open_log(COMPACT)
    log.append(keyed_batch([(b"a", b"1"), (b"b", b"1")], producer_id=5, producer_epoch=0, base_sequence=0))
    log.append(keyed_batch([(b"a", b"2"), (b"b", b"2")]))
    log.roll()
    clean(log, clock.now, producer_last_offsets={5: 1})
    headers = _headers(log)
    assert headers[0].producer_id == 5 and headers[0].record_count == 0
    assert (headers[0].base_offset, headers[0].last_offset, headers[0].base_sequence) == (0, 1, 0)
    assert [(r.offset, r.value) for r in read_records(log)] == [(2, b"2"), (3, b"2")]


def _headers(log: Log):
    out = []
    for segment in log.segments:
        data = segment.read_batch(0, segment.size)
        batches, _ = scan_valid_prefix(data)
        out.extend(h for _, h in batches)
    return out


# --- crash safety of the swap ------------------------------------------------------------------


@pytest.mark.parametrize("crash_after", ["cleaned", "swap_one", "swap_all", "deleted_one", "deleted_all"])
def test_crash_during_swap_leaves_old_or_new_never_a_mix(open_log, clock, monkeypatch, crash_after):
    log = open_log(COMPACT)
    fill(log, 20)
    log.roll()
    old_records = read_records(log)
    renames: list[tuple[str, str]] = []
    real_rename = os.rename
    limit = {"cleaned": 0, "swap_one": 1, "swap_all": 3, "deleted_one": 4, "deleted_all": None}[crash_after]

    class Crash(Exception):
        pass

    def rename(src, dst):
        if limit is not None and len(renames) >= limit:
            raise Crash()
        renames.append((str(src), str(dst)))
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    first_dirty, uncleanable = cleanable_offsets(log, None, clock.now)
    job = LogCleaner(None, CleanerConfig).plan(LogToClean(("t", 0), log, first_dirty, uncleanable, 0, 0), clock.now)
    swapped = []

    def swap(base, old):
        if crash_after == "deleted_all":
            # every old segment renamed to .deleted, then the crash before .swap -> final
            stem = log.dir / f"{base:020d}"
            for s in ("log", "index", "timeindex"):
                real_rename(f"{stem}.{s}.cleaned", f"{stem}.{s}.swap")
            for s in old:
                s.delete()
            raise Crash()
        log.replace_segments(base, old)
        swapped.append(base)
        return True

    with pytest.raises(Crash):
        Cleaner(1 << 20).clean(job, swap, lambda: False)
    job.close()
    monkeypatch.setattr(os, "rename", real_rename)
    for segment in log.segments:
        segment._close_fd()
    log.closed = True
    reopened = Log.open(log.dir, COMPACT, now_ms=clock)  # as after kill -9: full recovery
    records = read_records(reopened)
    first_group_end = job.sources[1].base_offset
    if crash_after == "cleaned":
        assert records == old_records  # no .swap file yet: the old segments win
    else:
        # Once the fsynced .log.swap exists it wins, whatever else the crash interrupted: the
        # first group reads cleaned, later groups still old, and every key its latest value.
        assert latest(records) == latest(old_records)
        assert len([r for r in records if r.offset < first_group_end]) < first_group_end
        assert [r for r in records if r.offset >= first_group_end] == \
            [r for r in old_records if r.offset >= first_group_end]
    assert [r.offset for r in records] == sorted({r.offset for r in records})
    assert not [p for p in os.listdir(reopened.dir) if p.endswith((".cleaned", ".swap", ".deleted"))]
    reopened.close()


# --- the cleaner threads driven from the event loop --------------------------------------------


def test_log_cleaner_runs_passes_and_writes_its_checkpoint(tmp_path, clock):
    async def scenario():
        mgr = LogManager([tmp_path / "d"], COMPACT, now_ms=clock)
        mgr.startup(0)
        log = mgr.get_or_create_log("t", 0, COMPACT)
        other = mgr.get_or_create_log("plain", 0, LogConfig(segment_bytes=600))
        fill(log, 20)
        fill(other, 20)
        cleaner = LogCleaner(mgr, lambda: CleanerConfig(backoff_ms=10), now_ms=clock)
        cleaner.startup()
        for _ in range(3000):  # 30 s at most
            if cleaner.passes:
                break
            await asyncio.sleep(0.01)
        await cleaner.shutdown()
        assert cleaner.passes >= 1
        assert len(read_records(log)) < 200 and len(read_records(other)) == 200
        assert read_checkpoint(tmp_path / "d" / CLEANER_CHECKPOINT) == {("t", 0): log.active_segment.base_offset}
        assert cleaner.last_result.records_read == log.active_segment.base_offset
        cleaned_to = log.active_segment.base_offset
        mgr.shutdown()
        # A new cleaner starts from the checkpoint: nothing is dirty.
        mgr = LogManager([tmp_path / "d"], COMPACT, now_ms=clock)
        mgr.startup(0, None, lambda topic: COMPACT if topic == "t" else LogConfig(segment_bytes=600))
        again = LogCleaner(mgr, CleanerConfig, now_ms=clock)
        again.load_checkpoints()
        assert again.checkpoints == {("t", 0): cleaned_to}
        assert again.grab_filthiest() is None
        mgr.shutdown()

    asyncio.run(scenario())


def test_swap_is_refused_when_retention_removed_a_source_segment(open_log, clock):
    log = open_log(COMPACT.with_overrides({"cleanup.policy": "compact,delete", "retention.ms": "1000"}))
    fill(log, 20, ts=clock.now - 10_000)
    log.roll()
    first_dirty, uncleanable = cleanable_offsets(log, None, clock.now)
    job = LogCleaner(None, CleanerConfig).plan(LogToClean(("t", 0), log, first_dirty, uncleanable, 0, 0), clock.now)
    assert log.delete_retention_segments(clock.now) > 0  # meanwhile, on the loop

    def swap(base, old):
        with pytest.raises(ValueError):
            log.replace_segments(base, old)
        return False

    from strom.log.cleaner import CleaningAborted

    with pytest.raises(CleaningAborted):
        Cleaner(1 << 20).clean(job, swap, lambda: False)
    job.close()
    assert not [p for p in os.listdir(log.dir) if p.endswith(".cleaned")]
    assert read_records(log) == []  # retention's result stands


def test_rebuilt_batches_are_valid_v2_batches(open_log, clock):
    log = open_log(COMPACT)
    fill(log, 8)
    log.append(keyed_batch([(b"k%d" % k, b"newer") for k in range(0, 10, 2)]))
    log.roll()
    clean(log, clock.now)
    sizes = [s.size for s in log.segments[:-1]]
    assert any(sizes)
    for segment in log.segments[:-1]:
        data = segment.read_batch(0, segment.size)
        batches, valid = scan_valid_prefix(data)  # checks every CRC
        assert valid == len(data)
        assert all(read_header(data, pos).magic == 2 for pos, _ in batches)
    assert any(h.record_count < 10 for h in _headers(log)[:-1])  # some were re-encoded


def test_deleting_the_log_during_a_pass_aborts_it_quietly(tmp_path, clock, monkeypatch):
    async def scenario():
        mgr = LogManager([tmp_path / "d"], COMPACT, now_ms=clock)
        mgr.startup(0)
        log = mgr.get_or_create_log("t", 0, COMPACT)
        fill(log, 20)
        loop = asyncio.get_running_loop()
        real = Cleaner.clean

        def clean_after_delete(self, job, swap, aborted):
            async def delete():
                mgr.delete_log("t", 0)  # DeleteTopics arrives while the thread works

            asyncio.run_coroutine_threadsafe(delete(), loop).result()
            return real(self, job, swap, aborted)

        monkeypatch.setattr(Cleaner, "clean", clean_after_delete)
        cleaner = LogCleaner(mgr, CleanerConfig, now_ms=clock)
        assert await cleaner.clean_filthiest()
        assert cleaner.passes == 0 and not cleaner.in_progress and not cleaner.uncleanable
        assert not mgr.offline_dirs  # a vanished log is not a failed disk
        assert not (tmp_path / "d" / "t-0").exists()
        mgr.shutdown()

    asyncio.run(scenario())
