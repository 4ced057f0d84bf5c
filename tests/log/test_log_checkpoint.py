from __future__ import annotations

import os

import pytest

from strom.log.checkpoint import read_checkpoint, write_checkpoint


def test_round_trip_in_kafkas_format(tmp_path):
    path = tmp_path / "recovery-point-offset-checkpoint"
    entries = {("orders", 0): 100, ("orders", 1): 7, ("a-b.c", 12): 0}
    write_checkpoint(path, entries)
    lines = path.read_text().splitlines()
    assert lines[:2] == ["0", "3"]
    assert "a-b.c 12 0" in lines and "orders 0 100" in lines
    assert read_checkpoint(path) == entries
    assert not list(tmp_path.glob("*.tmp"))


def test_missing_file_is_empty(tmp_path):
    assert read_checkpoint(tmp_path / "nope") == {}


def test_empty_checkpoint(tmp_path):
    path = tmp_path / "cp"
    write_checkpoint(path, {})
    assert path.read_text() == "0\n0\n"
    assert read_checkpoint(path) == {}


@pytest.mark.parametrize(
    "text",
    ["", "0\n", "1\n0\n", "0\n2\nt 0 1\n", "0\n1\nt 0\n", "0\n1\nt x 1\n", "zero\n0\n"],
)
def test_malformed_raises_with_path(tmp_path, text):
    path = tmp_path / "cp"
    path.write_text(text)
    with pytest.raises(ValueError, match=str(path)):
        read_checkpoint(path)


def test_failed_write_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "cp"
    write_checkpoint(path, {("t", 0): 1})

    def boom(src, dst):
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        write_checkpoint(path, {("t", 0): 2})
    monkeypatch.undo()
    assert read_checkpoint(path) == {("t", 0): 1}
