from __future__ import annotations

import os
import struct

import pytest
from crc32c import crc32c
from logtest_support import T0, batch, decode, dir_digest, read_all, timed_batch

from strom.log import Log, LogConfig, LogSegment
from strom.log.log import parse_log_dir_name
from strom.protocol import compression
from strom.protocol.errors import (
    CorruptRecordError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from strom.protocol.records import (
    TIMESTAMP_TYPE_MASK,
    assign_offsets,
    iter_records,
    read_header,
    scan_valid_prefix,
    validate_batches,
)

SMALL = LogConfig(segment_bytes=1000, index_interval_bytes=100)


def append_batches(log: Log, count: int, n: int = 3, **kw) -> list[int]:
    """Append `count` batches of `n` records; return their first offsets."""
    return [log.append(batch(n, tag=b"%d-" % i, **kw)).first_offset for i in range(count)]


# -- names


@pytest.mark.parametrize(
    ("name", "expected"),
    [("orders-0", ("orders", 0)), ("my-topic.v2-17", ("my-topic.v2", 17)), ("a-b-c-3", ("a-b-c", 3))],
)
def test_dir_name_parsing(name, expected):
    assert parse_log_dir_name(name) == expected


@pytest.mark.parametrize("name", ["orders", "orders-", "-1", "orders-x", "t-0.abc-delete"])
def test_bad_dir_names(name):
    with pytest.raises(ValueError):
        parse_log_dir_name(name)


def test_open_creates_first_segment(open_log, tmp_path):
    log = open_log(name="my.topic-with-dash-7")
    assert (log.topic, log.partition) == ("my.topic-with-dash", 7)
    assert log.log_start_offset == log.log_end_offset == 0
    assert [s.base_offset for s in log.segments] == [0]
    assert (tmp_path / "my.topic-with-dash-7" / "00000000000000000000.log").exists()


# -- append and read


def test_round_trip_over_segments(open_log):
    log = open_log(SMALL)
    firsts = append_batches(log, 40)
    assert firsts == list(range(0, 120, 3))
    assert log.log_end_offset == 120
    assert len(log.segments) > 3
    bases = [s.base_offset for s in log.segments]
    assert bases == sorted(bases) and bases[0] == 0
    assert all(s.size <= SMALL.segment_bytes for s in log.segments)
    records = read_all(log)
    assert [r[0] for r in records] == list(range(120))
    assert [r[2] for r in records[:4]] == [b"0-0xxxxxxxxxx", b"0-1xxxxxxxxxx", b"0-2xxxxxxxxxx", b"1-0xxxxxxxxxx"]
    # a read returns bytes of one segment only
    first = log.read(0, 1 << 20)
    assert first.size == log.segments[0].size and first.segment is log.segments[0]
    assert first.read_bytes() == log.segments[0].read_batch(0, log.segments[0].size)


def test_append_info(open_log, clock):
    log = open_log()
    buf = timed_batch([T0 + 5, T0 + 50, T0 + 20])
    info = log.append(buf)
    assert (info.first_offset, info.last_offset) == (0, 2)
    assert (info.max_timestamp, info.offset_of_max_timestamp) == (T0 + 50, 0)
    assert info.log_append_time == -1 and info.log_start_offset == 0
    assert info.valid_bytes == len(buf)
    # two batches in one request: consecutive offsets, rewritten in place
    two = batch(2) + batch(4)
    info = log.append(two)
    assert (info.first_offset, info.last_offset) == (3, 8)
    assert [h.base_offset for _, h in validate_batches(two, 1 << 20)] == [3, 5]


def test_append_accepts_bytes_and_sets_leader_epoch(open_log):
    log = open_log()
    log.append(bytes(batch(2)), leader_epoch=7)
    h = read_header(log.read(0, 1000).read_bytes())
    assert (h.base_offset, h.partition_leader_epoch) == (0, 7)


def test_read_from_middle_of_batch_returns_whole_batch(open_log):
    log = open_log()
    append_batches(log, 3, n=5)
    data = log.read(7, 1 << 20).read_bytes()
    batches, end = scan_valid_prefix(data)
    assert end == len(data)
    assert [h.base_offset for _, h in batches] == [5, 10]


def test_max_bytes_cuts_with_partial_batch(open_log):
    log = open_log()
    append_batches(log, 5)
    size = len(batch(3, tag=b"0-"))
    sl = log.read(0, 2 * size + 10)
    assert sl.size == 2 * size + 10
    batches, valid = scan_valid_prefix(sl.read_bytes())
    assert len(batches) == 2 and valid == 2 * size


def test_min_one_message(open_log):
    log = open_log()
    append_batches(log, 2, n=10)
    size = len(batch(10, tag=b"0-"))
    sl = log.read(3, 10)
    assert (sl.position, sl.size) == (0, size)
    sl = log.read(3, 10, min_one_message=False)
    assert sl.size == 0 and sl.read_bytes() == b""


def test_max_offset_bounds_the_read(open_log):
    log = open_log(SMALL)
    append_batches(log, 10)  # batches at 0, 3, 6, ...
    records = decode(log.read(0, 1 << 20, max_offset=9).read_bytes())
    assert [r[0] for r in records] == list(range(9))
    # a bound inside a batch keeps the batch that starts below it
    assert decode(log.read(0, 1 << 20, max_offset=8).read_bytes())[-1][0] == 8
    # min_one_message never crosses the bound
    assert log.read(9, 1, max_offset=9).size == 0
    assert log.read(12, 1 << 20, max_offset=10).size == 0
    # bound in a later segment: the whole earlier segment is returned
    assert log.read(0, 1 << 20, max_offset=log.log_end_offset).size == log.segments[0].size


def test_read_bounds(open_log):
    log = open_log()
    append_batches(log, 2)
    end = log.read(6, 100)
    assert end.size == 0 and end.read_bytes() == b""
    with pytest.raises(OffsetOutOfRangeError):
        log.read(7, 100)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 100)


def test_offsets_persist_across_reopen(open_log):
    log = open_log(SMALL)
    append_batches(log, 20)
    log.close()
    log = open_log(SMALL, clean_shutdown=True)
    assert log.log_end_offset == 60
    assert log.append(batch(2)).first_offset == 60
    log.close()
    log = open_log(SMALL, clean_shutdown=False)
    assert log.log_end_offset == 62
    assert log.append(batch(1)).first_offset == 62
    assert [r[0] for r in read_all(log)] == list(range(63))


def _corrupt_crc(buf: bytearray) -> bytearray:
    buf[-1] ^= 0xFF
    return buf


def _magic_one(buf: bytearray) -> bytearray:
    buf[16] = 1
    return buf


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: _corrupt_crc(batch(3)), CorruptRecordError),
        (lambda: batch(3)[:-5], CorruptRecordError),
        (lambda: batch(3) + batch(2)[:40], CorruptRecordError),
        (lambda: batch(3) + _corrupt_crc(batch(2)), CorruptRecordError),
        (lambda: _magic_one(batch(3)), InvalidRecordError),
        (lambda: bytearray(), InvalidRecordError),
        (lambda: batch(3, value_size=3000), RecordTooLargeError),
    ],
)
def test_invalid_record_sets_write_nothing(open_log, tmp_path, make, error):
    log = open_log(LogConfig(max_message_bytes=2000, segment_bytes=500))
    append_batches(log, 4)
    before = dir_digest(log.dir)
    end, segments = log.log_end_offset, len(log.segments)
    with pytest.raises(error) as info:
        log.append(make())
    assert info.value.code == error.code
    assert dir_digest(log.dir) == before
    assert (log.log_end_offset, len(log.segments)) == (end, segments)


def test_record_set_bigger_than_segment_goes_to_a_fresh_segment(open_log):
    log = open_log(LogConfig(segment_bytes=300))
    append_batches(log, 1)
    info = log.append(batch(3) + batch(3) + batch(3) + batch(3))
    assert info.first_offset == 3
    assert [s.base_offset for s in log.segments] == [0, 3]
    assert log.segments[1].size > 300
    assert log.append(batch(1)).first_offset == 15
    assert [s.base_offset for s in log.segments] == [0, 3, 15]


# -- rolling


def test_roll_by_size(open_log):
    log = open_log(LogConfig(segment_bytes=500))
    size = len(batch(3, tag=b"0-"))
    append_batches(log, 10)
    per_segment = 500 // size
    assert [s.base_offset for s in log.segments] == list(range(0, 30, 3 * per_segment))


def test_roll_by_time(open_log, clock):
    log = open_log(LogConfig(segment_ms=1000))
    append_batches(log, 2)
    clock.now += 1000
    append_batches(log, 1)
    assert len(log.segments) == 1
    clock.now += 1
    append_batches(log, 1)
    assert [s.base_offset for s in log.segments] == [0, 9]
    # an empty active segment is never rolled by time
    log.roll()
    clock.now += 10_000
    assert log.append(batch(1)).first_offset == 12
    assert [s.base_offset for s in log.segments] == [0, 9, 12]


def test_roll_when_index_full(open_log):
    log = open_log(LogConfig(index_interval_bytes=0, segment_index_bytes=24))
    append_batches(log, 10)
    # each segment: first batch unindexed, then 3 entries fill the 24-byte index
    assert [s.base_offset for s in log.segments] == [0, 12, 24]
    assert all(len(s.offset_index) <= 3 for s in log.segments)


def _claims(count: int) -> bytearray:
    """A valid-CRC batch whose header claims `count` records (the broker never decodes them)."""
    buf = batch(1)
    struct.pack_into(">i", buf, 23, count - 1)  # lastOffsetDelta
    struct.pack_into(">i", buf, 57, count)  # recordCount
    struct.pack_into(">I", buf, 17, crc32c(bytes(buf[21:])))
    return buf


def test_roll_when_relative_offset_would_overflow(open_log):
    log = open_log()
    log.append(_claims(2**30))
    log.append(_claims(2**30 - 1))
    assert log.log_end_offset == 2**31 - 1
    assert [s.base_offset for s in log.segments] == [0]
    log.append(batch(1))  # offset 2**31 - 1: relative offset still fits in int32
    assert [s.base_offset for s in log.segments] == [0]
    log.append(batch(1))  # offset 2**31 would not
    assert [s.base_offset for s in log.segments] == [0, 2**31]


def test_config_change_applies_to_next_append(open_log):
    log = open_log()
    append_batches(log, 3)
    log.config = LogConfig(segment_bytes=100)
    log.append(batch(1))
    assert len(log.segments) == 2
    assert all(s.config is log.config for s in log.segments)


# -- index


def test_offset_index_is_sparse_and_lookups_correct(open_log):
    config = LogConfig(index_interval_bytes=1024)
    log = open_log(config)
    append_batches(log, 200, n=2)
    seg = log.segments[0]
    entries = seg.offset_index.entries()
    assert seg.size // (1024 + 200) <= len(entries) <= seg.size // 1024
    for offset in range(0, 400, 7):
        indexed, position = seg.offset_index.lookup(offset)
        assert indexed <= offset
        pos, header = seg.locate(offset)
        assert pos >= position
        assert header[0] <= offset <= header[0] + header[6]


# -- recovery


def test_recovery_after_torn_tail(open_log):
    log = open_log(SMALL)
    append_batches(log, 12)
    active = log.active_segment
    path, size = active.log_path, active.size
    log.close()
    os.truncate(path, size - 10)  # cut into the last batch
    log = open_log(SMALL, clean_shutdown=False)
    assert log.log_end_offset == 33
    assert log.active_segment.size == size - len(batch(3, tag=b"11-"))
    assert log.append(batch(1)).first_offset == 33
    assert [r[0] for r in read_all(log)] == list(range(34))


def test_recovery_after_garbage_tail(open_log):
    log = open_log(SMALL)
    append_batches(log, 5)
    path, size = log.active_segment.log_path, log.active_segment.size
    log.close()
    with open(path, "ab") as f:
        f.write(os.urandom(300))
    log = open_log(SMALL, clean_shutdown=False)
    assert log.active_segment.size == size == os.path.getsize(path)
    assert log.append(batch(1)).first_offset == 15


def test_torn_tail_found_even_with_clean_flag(open_log):
    """A clean-shutdown claim never makes us append after a torn batch."""
    log = open_log()
    append_batches(log, 3)
    path = log.active_segment.log_path
    log.close()
    with open(path, "ab") as f:
        f.write(batch(3)[:30])
    log = open_log(clean_shutdown=True)
    assert log.log_end_offset == 9 and log.active_segment.size == os.path.getsize(path)


def test_corrupt_batch_in_unflushed_segment_drops_later_segments(open_log, tmp_path):
    log = open_log(SMALL)
    append_batches(log, 30)
    bases = [s.base_offset for s in log.segments]
    victim = log.segments[1]
    path, pos = victim.log_path, victim.read(bases[1] + 4, 1)[0]
    log.close()
    with open(path, "r+b") as f:
        f.seek(pos + 65)
        f.write(b"\xde\xad")
    log = open_log(SMALL, recovery_point=bases[1], clean_shutdown=False)
    assert [s.base_offset for s in log.segments] == bases[:2]
    assert log.log_end_offset == bases[1] + 3
    assert sorted(p.name for p in log.dir.glob("*.log")) == [s.log_path.name for s in log.segments]
    assert [r[0] for r in read_all(log)] == list(range(bases[1] + 3))


def test_damaged_index_rebuilt_on_clean_start(open_log):
    log = open_log(SMALL)
    append_batches(log, 30)
    first = log.segments[0]
    entries = first.offset_index.entries()
    assert entries
    index_path = first.offset_index.path
    log.close()
    index_path.write_bytes(os.urandom(len(entries) * 8))
    log = open_log(SMALL, clean_shutdown=True)
    assert log.segments[0].offset_index.entries() == entries
    assert index_path.read_bytes() == b"".join(
        (off).to_bytes(4, "big") + pos.to_bytes(4, "big") for off, pos in entries
    )
    assert [r[0] for r in read_all(log)] == list(range(90))


def test_only_the_last_small_segment_is_trusted_without_index_files(open_log, monkeypatch):
    """A log's small active segment is closed without index files (nothing to index, and its
    end is found by a scan at the next start anyway). An earlier segment without them is
    rebuilt: its max timestamp, which retention reads, would otherwise be unknown."""
    config = LogConfig(segment_bytes=300)  # segments far below the 4096-byte index interval
    log = open_log(config)
    append_batches(log, 12)
    segments = log.segments
    assert len(segments) >= 3
    last_max_ts = segments[-1].max_timestamp
    log.close()
    last = segments[-1]
    assert not last.offset_index.path.exists() and not last.time_index.path.exists()
    first = segments[0]
    assert first.offset_index.path.exists() and first.time_index.path.exists()  # sealed at its roll
    first.offset_index.path.unlink()
    first.time_index.path.unlink()
    rebuilt: list[int] = []
    real = LogSegment.recover
    monkeypatch.setattr(LogSegment, "recover", lambda self, *a: rebuilt.append(self.base_offset) or real(self, *a))
    log = open_log(config, clean_shutdown=True)
    assert rebuilt == [first.base_offset]
    assert log.segments[-1].max_timestamp == last_max_ts
    assert [r[0] for r in read_all(log)] == list(range(36))


def test_missing_indexes_rebuilt(open_log):
    log = open_log(SMALL)
    append_batches(log, 20)
    seg = log.segments[0]
    entries, max_ts = seg.offset_index.entries(), seg.max_timestamp
    log.close()
    seg.offset_index.path.unlink()
    seg.time_index.path.unlink()
    log = open_log(SMALL, clean_shutdown=True)
    assert log.segments[0].offset_index.entries() == entries
    assert log.segments[0].max_timestamp == max_ts


def test_recovery_point_honoured(open_log, monkeypatch):
    log = open_log(SMALL)
    append_batches(log, 30)
    bases = [s.base_offset for s in log.segments]
    log.close()
    recovered = []
    real = LogSegment.recover

    def spy(self, max_message_bytes):
        recovered.append(self.base_offset)
        return real(self, max_message_bytes)

    monkeypatch.setattr(LogSegment, "recover", spy)
    # recovery point inside the second-to-last segment: it and the last are re-scanned
    log = open_log(SMALL, recovery_point=bases[-2] + 1, clean_shutdown=False)
    assert recovered == bases[-2:]
    assert log.recovery_point == bases[-2] + 1
    log.close()
    recovered.clear()
    # recovery point exactly at the last segment's base: only that one
    log = open_log(SMALL, recovery_point=bases[-1], clean_shutdown=False)
    assert recovered == bases[-1:]
    log.close()
    recovered.clear()
    log = open_log(SMALL, recovery_point=0, clean_shutdown=True)
    assert recovered == []
    assert log.recovery_point == log.log_end_offset == 90


def test_leftover_files_cleaned_on_open(open_log, tmp_path):
    log = open_log()
    append_batches(log, 1)
    log.close()
    d = log.dir
    for name in ["00000000000000000005.log.deleted", "00000000000000000000.log.cleaned",
                 "00000000000000000000.log.swap", "00000000000000000077.index",
                 "00000000000000000077.timeindex"]:
        (d / name).write_bytes(b"junk")
    (d / "leader-epoch-checkpoint").write_text("0\n0\n")
    open_log(clean_shutdown=True)
    # The junk swapped in is cut off: an empty segment, which needs no index files.
    assert sorted(p.name for p in d.iterdir()) == ["00000000000000000000.log", "leader-epoch-checkpoint"]


def test_flush_advances_recovery_point(open_log, monkeypatch):
    log = open_log(SMALL)
    append_batches(log, 20)
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real(fd))
    log.flush(up_to=30)
    assert log.recovery_point == 30
    segment_fds = {s.fd for s in log.segments}
    flushed = [fd for fd in synced if fd in segment_fds]
    assert flushed == [s.fd for s in log.segments if s.base_offset < 30]
    synced.clear()
    log.flush()
    assert log.recovery_point == 60
    assert log.segments[0].fd not in synced
    synced.clear()
    log.flush()
    assert synced == []


# -- retention


def test_retention_by_time(open_log, clock):
    config = LogConfig(segment_bytes=1000, retention_ms=10_000, file_delete_delay_ms=0)
    log = open_log(config)
    append_batches(log, 20, ts=T0)
    old = len(log.segments)
    clock.now = T0 + 5000
    append_batches(log, 20, ts=T0 + 5000)
    bases = [s.base_offset for s in log.segments]
    clock.now = T0 + 10_000
    assert log.delete_retention_segments() == 0
    clock.now = T0 + 10_001
    # the segment straddling both timestamps is kept
    assert log.delete_retention_segments() == old - 1
    assert log.log_start_offset == bases[old - 1] == log.segments[0].base_offset
    with pytest.raises(OffsetOutOfRangeError):
        log.read(log.log_start_offset - 1, 100)
    assert [r[0] for r in read_all(log)] == list(range(log.log_start_offset, 120))
    assert log.purge_deleted() == old - 1
    assert len(list(log.dir.glob("*.log"))) == len(log.segments)


def test_retention_of_everything_keeps_an_empty_active_segment(open_log, clock):
    log = open_log(LogConfig(segment_bytes=1000, retention_ms=1000))
    append_batches(log, 10, ts=T0)
    n = len(log.segments)
    clock.now = T0 + 2000
    assert log.delete_retention_segments() == n
    assert [s.base_offset for s in log.segments] == [30]
    assert log.log_start_offset == log.log_end_offset == 30
    assert log.read(30, 100).size == 0
    assert log.append(batch(1, ts=clock.now)).first_offset == 30
    assert log.delete_retention_segments() == 0  # fresh data is kept
    # an empty active segment is never deleted
    log.truncate_fully_and_start_at(40)
    clock.now += 10**9
    assert log.delete_retention_segments() == 0


def test_retention_without_timestamps_uses_mtime(open_log, clock):
    log = open_log(LogConfig(segment_bytes=300, retention_ms=1000))
    append_batches(log, 6, ts=-1)
    assert log.segments[0].max_timestamp == -1
    clock.now = log.segments[0].last_modified_ms + 500
    assert log.delete_retention_segments() == 0
    clock.now += 1000
    n = len(log.segments)
    assert log.delete_retention_segments() == n
    assert log.log_start_offset == log.log_end_offset == 18


def test_retention_by_size(open_log):
    log = open_log(LogConfig(segment_bytes=1000, retention_bytes=2500))
    append_batches(log, 40)
    sizes = [s.size for s in log.segments]
    total = sum(sizes)
    deleted = log.delete_retention_segments()
    assert deleted > 0
    assert log.size_in_bytes >= 2500
    assert log.size_in_bytes - log.segments[0].size < 2500
    assert total - sum(sizes[:deleted]) == log.size_in_bytes
    assert log.log_start_offset == log.segments[0].base_offset > 0


def test_retention_respects_policy_and_high_watermark(open_log, clock):
    log = open_log(LogConfig(segment_bytes=300, retention_ms=1000, cleanup_policy="compact"))
    append_batches(log, 10, ts=T0)
    clock.now = T0 + 5000
    assert log.delete_retention_segments() == 0
    log.config = LogConfig(segment_bytes=300, retention_ms=1000)
    bases = [s.base_offset for s in log.segments]
    assert log.delete_retention_segments(high_watermark=bases[2]) == 2
    assert log.log_start_offset == bases[2]


def test_deleted_segment_stays_readable_until_delay_passes(open_log, clock):
    log = open_log(LogConfig(segment_bytes=300, retention_ms=1000, file_delete_delay_ms=60_000))
    append_batches(log, 6, ts=T0)
    in_flight = log.read(0, 1 << 20)
    expected = in_flight.read_bytes()
    clock.now = T0 + 5000
    assert log.delete_retention_segments() > 0
    assert list(log.dir.glob("*.deleted"))
    assert in_flight.read_bytes() == expected  # the fetch being sent is unaffected
    assert log.purge_deleted(clock.now + 59_999) == 0
    assert log.purge_deleted(clock.now + 60_000) > 0
    assert not list(log.dir.glob("*.deleted"))


# -- timestamps


@pytest.mark.parametrize("codec", [compression.NONE, compression.GZIP, compression.SNAPPY,
                                   compression.LZ4, compression.ZSTD])
def test_fetch_offset_by_timestamp(open_log, codec):
    log = open_log(LogConfig(segment_bytes=400, index_interval_bytes=50))
    for b in range(20):
        log.append(timed_batch([T0 + 1000 * b + 10 * i for i in range(4)], codec=codec))
    assert len(log.segments) > 2
    assert log.fetch_offset_by_timestamp(0) == (0, T0)
    assert log.fetch_offset_by_timestamp(T0 + 7015) == (30, T0 + 7020)
    assert log.fetch_offset_by_timestamp(T0 + 7020) == (30, T0 + 7020)
    assert log.fetch_offset_by_timestamp(T0 + 7031) == (32, T0 + 8000)
    assert log.fetch_offset_by_timestamp(T0 + 19_030) == (79, T0 + 19_030)
    assert log.fetch_offset_by_timestamp(T0 + 19_031) is None
    assert log.offset_of_max_timestamp() == (T0 + 19_030, 79)


def test_offset_of_max_timestamp_inside_batch_and_after_reopen(open_log):
    log = open_log(LogConfig(segment_bytes=300))
    assert log.offset_of_max_timestamp() is None
    log.append(timed_batch([T0, T0 + 10]))
    log.append(timed_batch([T0 + 5, T0 + 90, T0 + 90, T0 + 1]))  # max at offset 3
    log.append(timed_batch([T0 + 2, T0 + 3]))
    log.append(timed_batch([T0 + 90]))  # ties do not move it
    assert log.offset_of_max_timestamp() == (T0 + 90, 3)
    log.close()
    log = open_log(LogConfig(segment_bytes=300), clean_shutdown=True)
    assert log.offset_of_max_timestamp() == (T0 + 90, 3)
    assert log.fetch_offset_by_timestamp(T0 + 50) == (3, T0 + 90)


def test_log_append_time_stamping(open_log, clock):
    log = open_log(LogConfig(message_timestamp_type="LogAppendTime"))
    clock.now = T0 + 12345
    info = log.append(timed_batch([1, 2, 3]) + batch(2, ts=5))
    assert info.log_append_time == T0 + 12345
    assert info.max_timestamp == T0 + 12345 and info.offset_of_max_timestamp == 0
    data = log.read(0, 1 << 20).read_bytes()
    batches = validate_batches(bytearray(data), 1 << 20)  # CRCs were recomputed
    assert all(h.attributes & TIMESTAMP_TYPE_MASK and h.max_timestamp == T0 + 12345 for _, h in batches)
    assert {r.timestamp for pos, _ in batches for r in iter_records(data, pos)} == {T0 + 12345}
    assert log.fetch_offset_by_timestamp(T0) == (0, T0 + 12345)
    assert log.offset_of_max_timestamp() == (T0 + 12345, 0)


# -- truncation and deletion


def test_truncate_fully_and_start_at(open_log):
    log = open_log(SMALL)
    append_batches(log, 20)
    log.truncate_fully_and_start_at(500)
    assert [s.base_offset for s in log.segments] == [500]
    assert log.log_start_offset == log.log_end_offset == log.recovery_point == 500
    assert log.append(batch(2)).first_offset == 500
    with pytest.raises(OffsetOutOfRangeError):
        log.read(10, 100)
    log.close()
    log = open_log(SMALL, clean_shutdown=True)
    assert (log.log_start_offset, log.log_end_offset) == (500, 502)


def test_truncate_to(open_log):
    log = open_log(SMALL)
    append_batches(log, 30)
    bases = [s.base_offset for s in log.segments]
    log.truncate_to(bases[2] + 3)
    assert [s.base_offset for s in log.segments] == bases[:3]
    assert log.log_end_offset == bases[2] + 3
    assert log.append(batch(1)).first_offset == bases[2] + 3
    assert [r[0] for r in read_all(log)] == list(range(bases[2] + 4))
    assert not log.truncate_to(10**6)


def test_delete_removes_directory(open_log):
    log = open_log()
    append_batches(log, 3)
    log.delete()
    assert not log.dir.exists()
    with pytest.raises(Exception):  # noqa: B017
        log.append(batch(1))


@pytest.mark.parametrize("which", [0, -1])
def test_time_index_naming_offsets_beyond_the_segment_is_rebuilt(open_log, which):
    log = open_log(SMALL)
    append_batches(log, 30, ts=T0)
    seg = log.segments[which]
    path, entries = seg.time_index.path, seg.time_index.entries()
    log.close()
    path.write_bytes(struct.pack(">qi", T0 + 10**12, 10**6))  # far future, far offset
    log = open_log(SMALL, clean_shutdown=True)
    seg = log.segments[which]
    assert seg.time_index.entries() == entries
    assert seg.max_timestamp == T0


def test_read_in_an_offset_gap_serves_the_next_segment(tmp_path, clock):
    d = tmp_path / "gappy-0"
    d.mkdir()
    for base, count in [(0, 3), (20, 2)]:
        seg = LogSegment(d, base, LogConfig())
        offset = base
        for _ in range(count):
            buf = batch(3)
            batches = validate_batches(buf, 1 << 20)
            assign_offsets(buf, batches, offset, 0)
            offset = seg.append(buf, batches, offset)[0] + 1
        seg.close()
    log = Log.open(d, LogConfig(), clean_shutdown=True, now_ms=clock)
    assert log.log_end_offset == 26
    sl = log.read(10, 1 << 20)
    assert sl.segment is log.segments[1]
    assert [r[0] for r in decode(sl.read_bytes())] == list(range(20, 26))
    assert [r[0] for r in decode(log.read(7, 1 << 20).read_bytes())] == [6, 7, 8]
    assert log.read(10, 1 << 20, max_offset=20).size == 0
    log.close()
