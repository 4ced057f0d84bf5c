"""The power-loss filesystem itself: after a cut, exactly what Linux promises to keep is left
(file data by the file's fsync, names by their directory's fsync), and nothing else."""

from __future__ import annotations

import errno
import os
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import PowerLossMount, fsync_path, mounted, require_fuse

pytestmark = pytest.mark.timeout(120)

P = 4096


@pytest.fixture
def power(tmp_path: Path) -> Iterator[PowerLossMount]:
    yield from mounted(tmp_path)


def write_synced(path: Path, data: bytes, dir_sync: bool = True) -> None:
    """Create or replace `path` with `data` and fsync it, and its directory unless told not to
    (then the data is durable, the name not)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if dir_sync:
        fsync_path(path.parent)


def append(path: Path, data: bytes, sync: bool = False) -> None:
    with open(path, "ab") as f:
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())


def cycle(power: PowerLossMount, mode: str = "strict", seed: int = 0) -> Path:
    power.cut(mode, seed)
    power.mount()
    return power.mountpoint


def test_it_behaves_like_a_filesystem_while_powered(power):
    m = power.mountpoint
    (m / "d").mkdir()
    with open(m / "d" / "f", "w+b") as f:
        f.write(b"0123456789")
        f.seek(12)
        f.write(b"!")  # past the end: a hole of zeros
        f.truncate(13)
        f.seek(0)
        assert f.read() == b"0123456789\0\0!"
        f.truncate(4)
    append(m / "d" / "f", b"45")
    assert (m / "d" / "f").read_bytes() == b"012345"
    assert os.stat(m / "d" / "f").st_size == 6
    os.rename(m / "d" / "f", m / "g")
    assert sorted(os.listdir(m)) == ["d", "g"] and os.listdir(m / "d") == []
    with open(m / "g", "rb") as src, open(power.backing.parent / "copy", "wb") as dst:
        assert os.sendfile(dst.fileno(), src.fileno(), 1, 3) == 3  # how the broker serves fetches
    assert (power.backing.parent / "copy").read_bytes() == b"123"
    with pytest.raises(OSError) as e:
        os.rmdir(m / "g")
    assert e.value.errno == errno.ENOTDIR
    (m / "d").rmdir()
    assert os.listdir(m) == ["g"]


def test_data_written_without_fsync_is_lost_and_fsynced_data_survives(power):
    m = power.mountpoint
    write_synced(m / "kept", b"old")
    write_synced(m / "lost", b"old")
    append(m / "kept", b" new", sync=True)
    append(m / "lost", b" new")
    with open(m / "lost", "r+b") as f:
        f.write(b"OLD")  # an overwrite in place, unsynced like the append
    assert (m / "lost").read_bytes() == b"OLD new"
    m = cycle(power)
    assert (m / "kept").read_bytes() == b"old new"
    assert (m / "lost").read_bytes() == b"old"


def test_a_new_name_needs_its_directory_fsynced(power):
    m = power.mountpoint
    write_synced(m / "both", b"y")  # file and directory fsynced
    (m / "dir-only").write_bytes(b"z")
    fsync_path(m)  # the name is durable, the data not
    write_synced(m / "file-only", b"x", dir_sync=False)  # so the name is lost
    m = cycle(power)
    assert sorted(os.listdir(m)) == ["both", "dir-only"]
    assert (m / "both").read_bytes() == b"y"
    assert (m / "dir-only").read_bytes() == b""


def test_a_rename_reverts_until_its_directory_is_fsynced(power):
    m = power.mountpoint
    write_synced(m / "config", b"v1")
    # temp file, fsync, rename over the old one: without the directory fsync...
    write_synced(m / "config.tmp", b"v2", dir_sync=False)
    os.replace(m / "config.tmp", m / "config")
    assert (m / "config").read_bytes() == b"v2"
    m = cycle(power)
    assert os.listdir(m) == ["config"]
    assert (m / "config").read_bytes() == b"v1"
    # ... and with it.
    write_synced(m / "config.tmp", b"v3", dir_sync=False)
    os.replace(m / "config.tmp", m / "config")
    fsync_path(m)
    m = cycle(power)
    assert os.listdir(m) == ["config"]
    assert (m / "config").read_bytes() == b"v3"


def test_unlink_truncate_and_mkdir_revert_without_fsync(power):
    m = power.mountpoint
    write_synced(m / "gone", b"still here")
    write_synced(m / "short", b"abcdef")
    (m / "sub").mkdir()
    write_synced(m / "sub" / "inner", b"i")
    fsync_path(m)
    (m / "gone").unlink()
    os.truncate(m / "short", 2)
    (m / "sub" / "later").write_bytes(b"l")
    (m / "newdir").mkdir()
    write_synced(m / "newdir" / "f", b"f")  # durable inside a directory whose name is not
    m = cycle(power)
    assert sorted(os.listdir(m)) == ["gone", "short", "sub"]
    assert (m / "gone").read_bytes() == b"still here"
    assert (m / "short").read_bytes() == b"abcdef"
    assert os.listdir(m / "sub") == ["inner"]


def test_an_open_file_unlinked_leaves_no_trace(power):
    m = power.mountpoint
    write_synced(m / "segment", b"data")
    with open(m / "segment", "r+b") as f:
        (m / "segment").unlink()
        f.seek(0, 2)
        f.write(b" more")
        f.flush()
        os.fsync(f.fileno())  # syncs the nameless inode: it stays nameless
        fsync_path(m)
        assert os.listdir(m) == []  # no .fuse_hidden stand-in
        f.seek(0)
        assert f.read() == b"data more"
    m = cycle(power)
    assert os.listdir(m) == []


def test_a_clean_unmount_keeps_everything(power):
    m = power.mountpoint
    (m / "d").mkdir()
    (m / "d" / "f").write_bytes(b"never fsynced")
    assert power.unsynced() == ["/", "/d", "/d/f"]
    power.unmount()
    assert (power.backing / "d" / "f").read_bytes() == b"never fsynced"
    power.mount()
    assert (m / "d" / "f").read_bytes() == b"never fsynced"
    assert power.unsynced() == []


def test_once_the_power_is_off_nothing_works_and_nothing_counts(power):
    m = power.mountpoint
    write_synced(m / "f", b"before")
    with open(m / "f", "r+b", buffering=0) as f:
        assert power.command("cut strict") == "ok"
        with pytest.raises(OSError) as e:
            f.write(b"after")
        assert e.value.errno == errno.EIO
        with pytest.raises(OSError):
            os.fsync(f.fileno())
    power.unmount()
    assert (power.backing / "f").read_bytes() == b"before"


def test_an_fsync_still_in_flight_at_the_cut_counts_for_nothing(power):
    m = power.mountpoint
    write_synced(m / "f", b"synced")
    append(m / "f", b" pending")
    power.slow_fsync(30)
    outcome: list[BaseException | None] = []

    def fsync_slowly() -> None:
        try:
            fsync_path(m / "f")
            outcome.append(None)
        except OSError as e:
            outcome.append(e)

    syncer = threading.Thread(target=fsync_slowly)
    syncer.start()
    power.wait_syncing(1)
    power.command("cut strict")
    syncer.join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], OSError), outcome
    power.unmount()
    assert (power.backing / "f").read_bytes() == b"synced"


def test_a_torn_cut_leaves_synced_bytes_and_a_prefix_of_the_rest(power):
    m = power.mountpoint
    write_synced(m / "f", b"a" * 3 * P)
    lengths = set()
    for seed in range(5):
        append(m / "f", b"c" * 3 * P)  # unsynced
        cycle(power, "torn", seed)
        data = (m / "f").read_bytes()
        assert data[:3 * P] == b"a" * 3 * P, "synced bytes are never lost"
        assert data[3 * P:] == b"c" * (len(data) - 3 * P) and len(data) <= 6 * P
        lengths.add(len(data))
        write_synced(m / "f", b"a" * 3 * P)  # the same start for the next cut
    assert len(lengths) > 1, "five torn cuts all left the same file"


def test_torn_content_is_a_state_ordered_write_back_can_leave():
    require_fuse()  # no mount, but the module loads libfuse
    from .powerfs import torn

    rng = random.Random(7)
    for _ in range(500):
        old = bytes(rng.choice(b"ab") for _ in range(rng.randint(0, 60)))
        new = bytes(rng.choice(b"ab") for _ in range(rng.randint(0, 60)))
        shrunk_to = rng.choice([None, rng.randint(0, len(new))])
        if shrunk_to is None and len(new) < len(old):
            continue  # a file grows shorter only by a truncation
        out = torn(old, new, shrunk_to, rng)
        if out == old:
            continue
        common = len(os.path.commonprefix([old, new]))
        if shrunk_to is not None:
            assert new.startswith(out) and len(out) >= min(shrunk_to, common)
        else:
            assert any(out == new[:c] + old[c:] for c in range(common, len(new) + 1)), (old, new, out)
