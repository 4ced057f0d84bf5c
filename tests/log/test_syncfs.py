"""Which log dirs a clean shutdown makes durable with one syncfs (strom/log/syncfs.py)."""

from __future__ import annotations

import os

import pytest

from strom.log.syncfs import (
    SYNCFS_FILESYSTEMS,
    can_sync_whole,
    filesystem_type,
    kernel_version,
    sync_whole,
)


def mountinfo_line(mount_id: int, device: str, mount_point: str, fstype: str, source: str) -> str:
    return f"{mount_id} 1 {device} / {mount_point} rw,relatime shared:1 - {fstype} {source} rw"


def test_the_filesystem_is_found_by_the_device_of_the_path(tmp_path):
    dev = os.stat(tmp_path).st_dev
    mine = f"{os.major(dev)}:{os.minor(dev)}"
    other = f"{os.major(dev) + 1}:{os.minor(dev)}"
    text = "\n".join([
        mountinfo_line(20, other, "/", "overlay", "overlay"),
        mountinfo_line(21, mine, "/data", "xfs", "/dev/vdb"),
        mountinfo_line(22, other, "/proc", "proc", "proc"),
    ])
    assert filesystem_type(tmp_path, text) == "xfs"
    # FUSE (CrashFS among them) and stacked or network filesystems keep one fsync per file
    for fstype in ("fuse.crashfs", "overlay", "nfs4"):
        assert fstype not in SYNCFS_FILESYSTEMS
        assert filesystem_type(tmp_path, text.replace(" xfs ", f" {fstype} ")) == fstype
    assert filesystem_type(tmp_path, mountinfo_line(20, other, "/", "ext4", "/dev/vda")) is None


def test_kernel_releases_are_read_as_major_minor():
    assert kernel_version("6.1.0-18-amd64") == (6, 1)
    assert kernel_version("5.10.209-198.858.amzn2.x86_64") == (5, 10)
    assert kernel_version("4.19.0") < (5, 8) <= kernel_version("5.8.0")
    assert kernel_version("unknown") == (0, 0)


def test_this_machine_answers_from_its_own_mount_table(tmp_path):
    with open("/proc/self/mountinfo") as f:
        fstype = filesystem_type(tmp_path, f.read())
    expected = fstype in SYNCFS_FILESYSTEMS and kernel_version(os.uname().release) >= (5, 8)
    assert can_sync_whole(tmp_path) is expected


def test_sync_whole_syncs_or_raises(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    sync_whole(tmp_path)
    with pytest.raises(FileNotFoundError):
        sync_whole(tmp_path / "gone")
