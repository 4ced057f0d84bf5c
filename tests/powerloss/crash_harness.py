"""The CrashFS harness seen from a test: mount it, cut the power under brokers, mount again.

`CrashMount` runs crashfs.py as a process of its own (a FUSE daemon must not share a process
with code that blocks on its mount) and talks to it over its standard input and output.
`Power` starts brokers whose data lives on the mount and cuts their power: SIGKILL every
broker, drop everything the filesystem was not told to keep (fsync), mount again.

Test modules take the fixtures through `mounted_crashfs` and `powered`, which need
`/dev/fuse`: where it is missing they skip with the reason, except under CI (which offers it),
where they fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from strom.testing import BrokerProcess

CRASHFS = Path(__file__).with_name("crashfs.py")


def fuse_unavailable() -> str | None:
    """Why a CrashFS cannot be mounted here, or None when it can."""
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "the power-loss tests need /dev/fuse (a FUSE-capable kernel and device)"
    try:
        import pyfuse3  # noqa: F401
    except ImportError as e:
        return f"the power-loss tests need pyfuse3 (scripts/bootstrap test installs it): {e}"
    if os.geteuid() != 0 and not any(
            os.access(Path(d) / "fusermount3", os.X_OK) for d in os.get_exec_path()):
        return "the power-loss tests need root or fusermount3 (Debian's fuse3) to mount"
    return None


def fsync_path(path: Path) -> None:
    """fsync a file or directory through a fresh read-only descriptor."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_mounted(path: Path) -> bool:
    target = str(path.resolve())
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1] == target for line in mounts)


class CrashMount:
    """A CrashFS daemon keeping its state in `root/state`, mounted on `root/mnt` (`.path`)."""

    def __init__(self, root: Path) -> None:
        self.state = root / "state"
        self.path = root / "mnt"
        self.state.mkdir(parents=True, exist_ok=True)
        self.path.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None

    def mount(self, timeout: float = 30.0) -> None:
        self.proc = subprocess.Popen([sys.executable, str(CRASHFS), str(self.state), str(self.path)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        if line != "mounted":
            self.proc.kill()
            raise RuntimeError(f"CrashFS did not mount on {self.path} (it said {line!r})")
        self._wait_mounted(True, timeout)

    def _wait_mounted(self, mounted: bool, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while _is_mounted(self.path) != mounted:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.path} is {'not ' if mounted else 'still '}mounted")
            time.sleep(0.05)

    def _command(self, line: str) -> None:
        assert self.proc is not None and self.proc.poll() is None, "CrashFS is not running"
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def set_fsync_delay(self, seconds: float) -> None:
        """Make every later fsync wait `seconds` before it counts (a slow disk)."""
        self._command(f"delay {seconds}")
        reply = self.proc.stdout.readline().strip()
        assert reply == "ok", reply

    def cut(self, torn_seed: int | None = None, timeout: float = 30.0) -> None:
        """The power goes: unmount, keeping only what was fsynced (and with `torn_seed`, a
        random prefix of each file's unsynced bytes, as write-back may have left)."""
        self._command("cut" if torn_seed is None else f"cut torn {torn_seed}")
        self.proc.wait(timeout)
        self.proc = None
        self._wait_mounted(False, timeout)

    def power_cycle(self, torn_seed: int | None = None) -> None:
        """Cut the power, then mount what survived."""
        self.cut(torn_seed)
        self.mount()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.cut()
            except (OSError, subprocess.TimeoutExpired, RuntimeError):
                self.proc.kill()
        if _is_mounted(self.path):  # a daemon that died leaves a dead mount behind
            subprocess.run(["umount", "-l", str(self.path)], check=False)


class Power:
    """Brokers whose log dirs live on a CrashFS, and the switch that cuts their power."""

    def __init__(self, mount: CrashMount) -> None:
        self.mount = mount
        self.brokers: list[BrokerProcess] = []

    def broker(self, name: str = "broker", make_log_dir: bool = True, **overrides: str) -> BrokerProcess:
        """A started broker whose log dir is `name/logs` on the mount. `name` is made and made
        durable first; so is `logs` (as an installation provides it) unless `make_log_dir` is
        False, which leaves creating it to the broker."""
        data_dir = self.mount.path / name
        data_dir.mkdir()
        fsync_path(self.mount.path)
        if make_log_dir:
            (data_dir / "logs").mkdir()
            fsync_path(data_dir)
        proc = BrokerProcess(data_dir=data_dir, overrides=overrides)
        self.brokers.append(proc)
        return proc.start()

    def cut(self, torn_seed: int | None = None) -> None:
        """SIGKILL every broker, lose every unsynced change, mount what is left. The brokers
        stay down: `.restart()` them."""
        for proc in self.brokers:
            proc.kill()
        self.mount.power_cycle(torn_seed)

    def logs(self) -> str:
        """The tail of every broker's log, for assertion messages."""
        return "\n".join(f"--- broker {i}\n" + "\n".join(p.stderr_lines[-40:])
                         for i, p in enumerate(self.brokers))

    def close(self) -> None:
        for proc in self.brokers:
            proc.close()


def mounted_crashfs(tmp_path: Path) -> Iterator[CrashMount]:
    """The body of a `crash_mount` fixture: a CrashFS of the test's own, mounted."""
    reason = fuse_unavailable()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(reason + "; CI machines offer it, so this is a broken set-up")
        pytest.skip(reason)
    mount = CrashMount(tmp_path / "crashfs")
    mount.mount()
    try:
        yield mount
    finally:
        mount.close()


def powered(tmp_path: Path) -> Iterator[Power]:
    """The body of a `power` fixture: brokers on a CrashFS of the test's own (the brokers are
    killed before the filesystem goes)."""
    for mount in mounted_crashfs(tmp_path):
        power = Power(mount)
        try:
            yield power
        finally:
            power.close()
