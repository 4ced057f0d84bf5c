from __future__ import annotations

import os

import pytest
from logtest_support import batch, decode, timed_batch

from strom.log import segment as segment_module
from strom.log.config import LogConfig
from strom.log.segment import LogSegment
from strom.protocol.records import assign_offsets, scan_valid_prefix, validate_batches


def write(segment: LogSegment, buf: bytearray, first: int) -> int:
    batches = validate_batches(buf, 1 << 30)
    assign_offsets(buf, batches, first, 0)
    last, _, _ = segment.append(buf, batches, first)
    return last + 1


def fill(segment: LogSegment, count: int, first: int | None = None, **kw) -> list[tuple[int, int]]:
    """Append `count` 3-record batches; return (base offset, position) of each."""
    offset = segment.base_offset if first is None else first
    out = []
    for i in range(count):
        out.append((offset, segment.size))
        offset = write(segment, batch(3, tag=b"%d-" % i, **kw), offset)
    return out


def test_file_names_are_kafkas(tmp_path):
    seg = LogSegment(tmp_path, 42, LogConfig())
    # An empty segment is one file: its indexes are made when written or when it has data.
    assert [p.name for p in tmp_path.iterdir()] == ["00000000000000000042.log"]
    assert seg.next_offset == 42 and seg.size == 0
    fill(seg, 1)
    seg.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["00000000000000000042.index", "00000000000000000042.log", "00000000000000000042.timeindex"]


def test_append_indexes_sparsely_and_reads(tmp_path):
    seg = LogSegment(tmp_path, 1000, LogConfig(index_interval_bytes=300))
    layout = fill(seg, 40)
    ends = [pos for _, pos in layout[1:]] + [seg.size]
    biggest = max(end - pos for (_, pos), end in zip(layout, ends, strict=True))
    entries = seg.offset_index.entries()
    # about one entry per index_interval_bytes (an entry once more than that was written)
    assert seg.size // (300 + biggest) <= len(entries) <= seg.size // 300
    assert all((off, pos) in layout for off, pos in entries)  # entries point at batch starts
    assert seg.next_offset == 1000 + 40 * 3
    for (base, pos), end in zip(layout, ends, strict=True):
        for offset in (base, base + 1, base + 2):
            assert seg.read(offset, 1) == (pos, end - pos)  # min one message: whole batch
        assert seg.read(base, 1, min_one_message=False) == (pos, 0)
    assert seg.read(seg.next_offset, 100) is None
    # max_position bounds the slice
    assert seg.read(1000, 10_000, max_position=layout[2][1]) == (0, layout[2][1])
    seg.close()


def test_delete_keeps_fd_until_purge(tmp_path):
    seg = LogSegment(tmp_path, 0, LogConfig())
    fill(seg, 3)
    seg.seal()  # an inactive segment with data has all three files
    seg.delete()
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".deleted"] * 3
    data = os.pread(seg.fd, seg.size, 0)
    assert len(decode(data)) == 9
    seg.purge()
    assert list(tmp_path.iterdir()) == []
    assert seg.closed


@pytest.mark.parametrize("chunk", [64, 300, 1 << 20])
def test_recover_in_chunks(tmp_path, monkeypatch, chunk):
    """Recovery reads in chunks; batches straddling chunk ends or bigger than a chunk survive."""
    monkeypatch.setattr(segment_module, "_RECOVER_CHUNK", chunk)
    seg = LogSegment(tmp_path, 0, LogConfig(index_interval_bytes=100))
    offset = 0
    for i in range(30):
        offset = write(seg, batch(1 + i % 4, value_size=7 * i), offset)
    size, entries = seg.size, seg.offset_index.entries()
    with open(seg.log_path, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x07\x00\x00\x01\x00garbage")
    seg.close()

    seg = LogSegment(tmp_path, 0, LogConfig(index_interval_bytes=100))
    assert seg.recover(max_message_bytes=1 << 20) == 19
    assert seg.size == size == os.path.getsize(seg.log_path)
    assert seg.offset_index.entries() == entries
    assert seg.next_offset == offset
    assert [r[0] for r in decode(os.pread(seg.fd, seg.size, 0))] == list(range(offset))
    seg.close()


def test_recover_cuts_at_corrupt_batch(tmp_path):
    seg = LogSegment(tmp_path, 0, LogConfig())
    layout = fill(seg, 5)
    pos, size = layout[3][1], seg.size
    os.pwrite(seg.fd, b"\xff", pos + 70)  # inside the CRC-covered part of batch 3
    assert seg.recover(1 << 20) == size - pos
    assert seg.size == pos == os.path.getsize(seg.log_path)
    assert seg.next_offset == layout[3][0]
    seg.close()


def test_truncate_to(tmp_path):
    seg = LogSegment(tmp_path, 0, LogConfig(index_interval_bytes=0))
    layout = fill(seg, 6, ts=5000)
    removed = seg.truncate_to(10)  # offset 10 lives in batch 3 (offsets 9..11)
    assert removed == layout[-1][1] + (layout[1][1] - layout[0][1]) - layout[3][1]
    assert seg.size == layout[3][1] and seg.next_offset == 9
    assert all(pos < seg.size for _, pos in seg.offset_index.entries())
    assert seg.max_timestamp == 5000
    seg.close()


def test_find_offset_by_timestamp_decodes_one_batch(tmp_path):
    seg = LogSegment(tmp_path, 0, LogConfig(index_interval_bytes=0))
    offset = 0
    for b in range(10):
        offset = write(seg, timed_batch([1000 + 100 * b + 10 * i for i in range(5)]), offset)
    # batch b holds offsets 5b..5b+4 with timestamps 1000+100b+10i
    assert seg.find_offset_by_timestamp(0) == (0, 1000)
    assert seg.find_offset_by_timestamp(1325) == (18, 1330)
    assert seg.find_offset_by_timestamp(1340) == (19, 1340)
    assert seg.find_offset_by_timestamp(1341) == (20, 1400)
    assert seg.find_offset_by_timestamp(1941) is None
    assert seg.find_offset_by_timestamp(1000, start_offset=7) == (7, 1120)
    assert seg.max_timestamp_record() == (1940, 49)
    seg.close()


def test_reopen_restores_state_from_indexes(tmp_path):
    seg = LogSegment(tmp_path, 0, LogConfig(index_interval_bytes=200))
    fill(seg, 20, ts=7000)
    nxt, size = seg.next_offset, seg.size
    seg.close()
    seg = LogSegment(tmp_path, 0, LogConfig(index_interval_bytes=200))
    assert seg.sanity_check()
    assert seg.load_tail()
    assert (seg.next_offset, seg.size, seg.max_timestamp) == (nxt, size, 7000)
    assert scan_valid_prefix(os.pread(seg.fd, seg.size, 0))[1] == size
    seg.close()


def test_reads_start_at_the_last_appended_batch_only_while_it_is_there(tmp_path):
    """A read at or past the batch appended last starts there (not at its index entry); after
    a truncation, a failed append or a recovery it is forgotten: new batches at the same
    positions must not be read from a stale place. Every offset is checked against the layout."""
    seg = LogSegment(tmp_path, 0, LogConfig(index_interval_bytes=100_000))  # one index entry
    layout = fill(seg, 30)

    def check(layout: list[tuple[int, int]]) -> None:
        ends = [pos for _, pos in layout[1:]] + [seg.size]
        for (base, pos), end in zip(layout, ends, strict=True):
            for offset in (base, base + 2):
                assert seg.read(offset, 1) == (pos, end - pos), offset
                # the bytes, when the search for the batch read them already, are the file's
                for max_size in (1, 1 << 20):
                    at, size, data = seg.read_region(offset, max_size)
                    assert data is None or data == seg.read_batch(at, size), offset
            assert seg.position_of(base) == pos
        assert seg.read(seg.next_offset, 100) is None

    check(layout)
    assert seg.read_region(layout[-1][0], 1 << 20)[2] is not None  # a read at the end: one pread
    assert seg._last_appended == (layout[-1][1], layout[-1][0])
    seg.truncate_to(layout[20][0])  # the last batch gone; longer batches written at its place
    assert seg._last_appended is None
    layout = layout[:20] + fill(seg, 5, first=layout[20][0], value_size=57)
    check(layout)
    seg.recover(1 << 20)
    assert seg._last_appended is None
    check(layout)
    seg.close()
