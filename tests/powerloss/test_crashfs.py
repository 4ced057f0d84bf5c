"""CrashFS itself: after a power cut, exactly what was fsynced is left (files by their own fsync,
names by their directory's)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from .crash_harness import CrashMount, fsync_path, mounted_crashfs

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def crash_mount(tmp_path: Path) -> Iterator[CrashMount]:
    yield from mounted_crashfs(tmp_path)


def write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def test_a_written_file_behaves_like_a_file_until_the_cut(crash_mount: CrashMount) -> None:
    root = crash_mount.path
    (root / "d").mkdir()
    with open(root / "d" / "f", "w+b") as f:
        f.write(b"0123456789")
        f.seek(4)
        f.write(b"xy")
        f.truncate(8)
        f.seek(0)
        assert f.read() == b"0123xy67"
    with open(root / "d" / "f", "ab") as f:
        f.write(b"!")
    assert (root / "d" / "f").read_bytes() == b"0123xy67!"
    assert os.stat(root / "d" / "f").st_size == 9
    os.rename(root / "d" / "f", root / "g")
    assert sorted(os.listdir(root)) == ["d", "g"] and os.listdir(root / "d") == []
    with pytest.raises(OSError):
        os.rmdir(root)
    (root / "d").rmdir()
    # sendfile, as the broker serves fetches
    with open(root / "g", "rb") as src, open(root.parent / "copy", "wb") as dst:
        assert os.sendfile(dst.fileno(), src.fileno(), 2, 5) == 5
    assert (root.parent / "copy").read_bytes() == b"23xy6"


def test_unsynced_data_is_lost_and_synced_data_survives(crash_mount: CrashMount) -> None:
    root = crash_mount.path
    write_synced(root / "kept", b"durable")
    (root / "lost").write_bytes(b"never synced")
    with open(root / "kept", "ab") as f:
        f.write(b" then more")  # after the fsync: gone with the power
    fsync_path(root)  # both names are durable; only "kept" has durable bytes
    crash_mount.power_cycle()
    assert (root / "kept").read_bytes() == b"durable"
    assert (root / "lost").read_bytes() == b""


def test_fsync_through_another_descriptor_covers_the_inode(crash_mount: CrashMount) -> None:
    root = crash_mount.path
    fd = os.open(root / "index", os.O_WRONLY | os.O_CREAT, 0o644)
    os.pwrite(fd, b"entries", 0)
    fsync_path(root / "index")  # a read-only descriptor, the writer still open
    os.pwrite(fd, b"-later", 7)
    os.close(fd)
    fsync_path(root)
    crash_mount.power_cycle()
    assert (root / "index").read_bytes() == b"entries"


def test_a_new_name_needs_its_directory_synced(crash_mount: CrashMount) -> None:
    root = crash_mount.path
    (root / "sub").mkdir()
    fsync_path(root)
    write_synced(root / "sub" / "synced-file-in-unsynced-dir", b"data")
    write_synced(root / "top", b"data")  # its data is synced, its name is not
    crash_mount.power_cycle()
    assert os.listdir(root) == ["sub"]
    assert os.listdir(root / "sub") == []
    write_synced(root / "sub" / "f", b"data")
    fsync_path(root / "sub")
    crash_mount.power_cycle()
    assert (root / "sub" / "f").read_bytes() == b"data"


def test_rename_and_unlink_revert_without_a_directory_fsync(crash_mount: CrashMount) -> None:
    root = crash_mount.path
    write_synced(root / "checkpoint", b"old")
    write_synced(root / "victim", b"v")
    fsync_path(root)
    write_synced(root / "checkpoint.tmp", b"new")
    os.replace(root / "checkpoint.tmp", root / "checkpoint")
    (root / "victim").unlink()
    assert sorted(os.listdir(root)) == ["checkpoint"]
    crash_mount.power_cycle()
    assert sorted(os.listdir(root)) == ["checkpoint", "victim"]
    assert (root / "checkpoint").read_bytes() == b"old"
    # the same steps with the directory fsync that makes a checkpoint replacement atomic
    write_synced(root / "checkpoint.tmp", b"new")
    os.replace(root / "checkpoint.tmp", root / "checkpoint")
    (root / "victim").unlink()
    fsync_path(root)
    crash_mount.power_cycle()
    assert sorted(os.listdir(root)) == ["checkpoint"]
    assert (root / "checkpoint").read_bytes() == b"new"


def test_a_renamed_directory_keeps_its_synced_entries(crash_mount: CrashMount) -> None:
    root = crash_mount.path
    (root / "topic-0").mkdir()
    write_synced(root / "topic-0" / "00.log", b"records")
    fsync_path(root / "topic-0")
    fsync_path(root)
    os.rename(root / "topic-0", root / "topic-0.deleted")
    fsync_path(root)
    (root / "topic-0.deleted" / "00.log").unlink()  # not synced: comes back
    crash_mount.power_cycle()
    assert os.listdir(root) == ["topic-0.deleted"]
    assert (root / "topic-0.deleted" / "00.log").read_bytes() == b"records"


def test_an_open_unlinked_file_stays_usable(crash_mount: CrashMount) -> None:
    root = crash_mount.path
    with open(root / "segment", "w+b") as f:
        f.write(b"abc")
        (root / "segment").unlink()
        f.write(b"def")
        f.seek(0)
        assert f.read() == b"abcdef"
        os.fsync(f.fileno())  # synced, but no durable name reaches it
    crash_mount.power_cycle()
    assert os.listdir(root) == []


def test_a_torn_cut_keeps_a_prefix_of_the_unsynced_bytes(crash_mount: CrashMount) -> None:
    root = crash_mount.path
    written = bytes(range(256)) * 64
    names = [f"f{i}" for i in range(12)]
    for name in names:
        write_synced(root / name, b"head")
        with open(root / name, "ab") as f:
            f.write(written)
    fsync_path(root)
    crash_mount.cut(torn_seed=7)
    crash_mount.mount()
    kept = [(root / name).read_bytes() for name in names]
    # Each file is its synced part plus some prefix of what followed, torn at any byte.
    for data in kept:
        assert data[:4] == b"head" and written.startswith(data[4:])
    assert len({len(d) for d in kept}) > 1
    assert any(len(d) % 256 for d in kept)


def test_a_slow_fsync_cut_short_is_not_durable(crash_mount: CrashMount) -> None:
    """With a slow disk, an fsync that the power cut interrupts made nothing durable (and an
    fsync that returned did)."""

    root = crash_mount.path
    write_synced(root / "f", b"first")
    fsync_path(root)
    crash_mount.set_fsync_delay(0.05)
    with open(root / "f", "ab") as f:
        f.write(b" second")
        f.flush()
        os.fsync(f.fileno())  # slow, but it returns: durable
    crash_mount.set_fsync_delay(30)
    started = threading.Event()

    def slow_sync() -> None:
        try:
            with open(root / "f", "ab") as f:
                f.write(b" third")
                f.flush()
                started.set()
                os.fsync(f.fileno())
        except OSError:
            pass  # the power went under it

    syncer = threading.Thread(target=slow_sync, daemon=True)
    syncer.start()
    assert started.wait(10)
    crash_mount.cut()
    syncer.join(10)
    crash_mount.mount()
    assert (root / "f").read_bytes() == b"first second"


def test_a_clean_shutdown_fsyncs_each_file_on_crashfs(crash_mount: CrashMount) -> None:
    """CrashFS sees each fsync, not a syncfs of the mount (FUSE passes that on only to servers
    that ask for it): the log manager must not take syncfs for durability there, or every
    power-cut test of a clean stop would test nothing."""
    from strom.log.syncfs import can_sync_whole

    assert not can_sync_whole(crash_mount.path)
