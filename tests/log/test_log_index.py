from __future__ import annotations

import os
import struct

import pytest

from strom.log.index import OffsetIndex, TimeIndex


def test_offset_index_append_lookup_and_reload(tmp_path):
    path = tmp_path / "00000000000000000100.index"
    idx = OffsetIndex(path, 100)
    assert not idx.existed and not path.exists()  # made by the first write, not before
    idx.append_many([(110, 500), (120, 1000), (135, 1600)])
    idx.append(150, 2000)
    assert path.stat().st_size == 4 * 8
    assert path.read_bytes()[:8] == struct.pack(">ii", 10, 500)  # relative offset, position
    assert idx.lookup(99) == (100, 0)
    assert idx.lookup(109) == (100, 0)
    assert idx.lookup(110) == (110, 500)
    assert idx.lookup(134) == (120, 1000)
    assert idx.lookup(10**9) == (150, 2000)
    idx.close()

    again = OffsetIndex(path, 100)
    assert again.existed and again.sanity_check(2100)
    assert again.entries() == [(110, 500), (120, 1000), (135, 1600), (150, 2000)]
    assert again.last_entry == (150, 2000)


def test_offset_index_one_write_per_append_call(tmp_path, monkeypatch):
    idx = OffsetIndex(tmp_path / "0.index", 0)
    calls = []
    real = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda fd, data, pos: calls.append(len(data)) or real(fd, data, pos))
    idx.append_many([(i, i * 100) for i in range(1, 51)])
    assert calls == [50 * 8]
    idx.close()


def test_offset_index_rejects_out_of_order(tmp_path):
    idx = OffsetIndex(tmp_path / "0.index", 0)
    idx.append(10, 100)
    with pytest.raises(ValueError):
        idx.append(10, 200)
    with pytest.raises(ValueError):
        idx.append(11, 50)
    assert len(idx) == 1
    idx.close()


def test_offset_index_truncate(tmp_path):
    idx = OffsetIndex(tmp_path / "0.index", 0)
    idx.append_many([(10, 100), (20, 200), (30, 300)])
    idx.truncate_to(20)
    assert idx.entries() == [(10, 100)]
    assert (tmp_path / "0.index").stat().st_size == 8
    idx.append(25, 250)
    idx.truncate_to_position(250)
    assert idx.entries() == [(10, 100)]
    idx.reset([(5, 7)])
    assert idx.entries() == [(5, 7)]
    idx.close()
    assert OffsetIndex(tmp_path / "0.index", 0).entries() == [(5, 7)]


def test_offset_index_full(tmp_path):
    idx = OffsetIndex(tmp_path / "0.index", 0)
    idx.append_many([(1, 1), (2, 2)])
    assert idx.is_full(16) and not idx.is_full(24)
    idx.close()


@pytest.mark.parametrize(
    ("data", "log_size"),
    [
        (b"\x00" * 7, 1000),  # torn entry
        (struct.pack(">iiii", 5, 100, 4, 200), 1000),  # offsets go backwards
        (struct.pack(">iiii", 5, 200, 6, 100), 1000),  # positions go backwards
        (struct.pack(">ii", 5, 5000), 1000),  # beyond the log
        (struct.pack(">ii", -3, 10), 1000),  # below the base offset
    ],
)
def test_offset_index_sanity_check_catches_damage(tmp_path, data, log_size):
    path = tmp_path / "0.index"
    path.write_bytes(data)
    assert not OffsetIndex(path, 0).sanity_check(log_size)


def test_time_index_maybe_append_and_lookup(tmp_path):
    path = tmp_path / "00000000000000000050.timeindex"
    idx = TimeIndex(path, 50)
    assert idx.last_entry == (-1, 50)
    idx.append_many([(1000, 55), (1000, 56), (900, 57), (2000, 60)])  # non-growing ones skipped
    assert idx.entries() == [(1000, 55), (2000, 60)]
    assert path.read_bytes()[:12] == struct.pack(">qi", 1000, 5)
    assert idx.lookup(999) == (-1, 50)
    assert idx.lookup(1000) == (1000, 55)
    assert idx.lookup(1999) == (1000, 55)
    assert idx.lookup(5000) == (2000, 60)
    idx.close()
    again = TimeIndex(path, 50)
    assert again.sanity_check(100) and again.last_entry == (2000, 60)
    again.truncate_to(60)
    assert again.entries() == [(1000, 55)]
    assert path.stat().st_size == 12
    again.close()


def test_time_index_sanity_check(tmp_path):
    path = tmp_path / "0.timeindex"
    path.write_bytes(b"\x01" * 13)
    assert not TimeIndex(path, 0).sanity_check(100)
    path.write_bytes(struct.pack(">qiqi", 2000, 1, 1000, 2))
    assert not TimeIndex(path, 0).sanity_check(100)
    path.write_bytes(struct.pack(">qi", 2000, 1))
    assert not TimeIndex(path, 0).sanity_check(0)  # entries for an empty log
    assert TimeIndex(path, 0).sanity_check(100)
