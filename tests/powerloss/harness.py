"""The power-loss filesystem seen from a test: mount it, cut the power, mount it again.

`PowerLossMount` runs `powerfs.py` as a process of its own (a FUSE daemon must not share a
process with code that blocks on its mount) and talks to it over its standard input/output.
Test modules make their fixtures from `mounted` (a power-loss filesystem of the test's own)
and `brokers_on` (`strom serve` processes whose log dir lives on it).

These tests need FUSE: /dev/fuse, libfuse 3 and mfusepy (`scripts/bootstrap test` installs the
last two). Where the machine has no /dev/fuse they are skipped with the reason; under CI
(CI=true), which offers it, they fail instead.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from ctypes.util import find_library
from pathlib import Path

import pytest

from strom.testing import BrokerProcess

POWERFS = Path(__file__).with_name("powerfs.py")


def fuse_missing() -> str | None:
    """Why this machine cannot run the harness, or None when it can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist: the kernel offers no FUSE here (a container needs --device /dev/fuse)"
    if find_library("fuse3") is None or shutil.which("fusermount3") is None:
        return "libfuse 3 is not installed: run scripts/bootstrap test (Debian's fuse3)"
    try:
        import mfusepy  # noqa: F401
    except ImportError:
        return "mfusepy is not installed: run scripts/bootstrap test"
    except OSError as e:
        return f"mfusepy cannot load libfuse: {e}"
    return None


class PowerLossMount:
    """A directory whose unsynced changes a test can throw away. `mountpoint` is where
    processes write; `backing` holds what is on disk while nothing is mounted."""

    def __init__(self, root: Path) -> None:
        self.backing = root / "disk"
        self.mountpoint = root / "mnt"
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.stderr_lines: list[str] = []
        self.mounts = 0

    # -- the process

    def mount(self, timeout: float = 30.0) -> PowerLossMount:
        assert self.proc is None, "already mounted"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, str(POWERFS), str(self.backing), str(self.mountpoint)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env)
        self._lines = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc.stdout, self._lines), daemon=True).start()
        threading.Thread(target=self._drain, args=(self.proc.stderr,), daemon=True).start()
        self._expect("ready", timeout)
        deadline = time.monotonic() + timeout
        while not os.path.ismount(self.mountpoint):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.mountpoint} not mounted after {timeout} s: {self._tail()}")
            time.sleep(0.01)
        self.mounts += 1
        return self

    @staticmethod
    def _read(stream, lines: queue.Queue) -> None:
        for line in stream:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    def _drain(self, stream) -> None:
        for line in stream:
            self.stderr_lines.append(line.rstrip())

    def _tail(self) -> str:
        return "\n".join(self.stderr_lines[-30:])

    def _expect(self, wanted: str | None, timeout: float) -> str:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"power-loss filesystem silent for {timeout} s: {self._tail()}") from None
        if line is None:
            raise RuntimeError(f"power-loss filesystem exited: {self._tail()}")
        if wanted is not None and line != wanted:
            raise RuntimeError(f"power-loss filesystem said {line!r}, not {wanted!r}")
        return line

    def command(self, line: str, timeout: float = 30.0) -> str:
        assert self.proc is not None, "not mounted"
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._expect(None, timeout)

    # -- what tests use

    def unsynced(self) -> list[str]:
        """Paths (relative to the mount, '/'-rooted) whose changes are not durable yet."""
        return json.loads(self.command("unsynced"))

    def slow_fsync(self, seconds: float) -> None:
        """Make every later fsync take `seconds`; it counts only if the power outlives it."""
        assert self.command(f"delay {seconds}") == "ok"

    def wait_syncing(self, count: int, timeout: float = 30.0) -> None:
        """Wait until `count` fsyncs are in flight (see `slow_fsync`)."""
        deadline = time.monotonic() + timeout
        while int(self.command("syncing")) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"no {count} fsyncs in flight after {timeout} s")
            time.sleep(0.01)

    def unmount(self, timeout: float = 30.0) -> None:
        """Unmount and wait for the filesystem to write its state to `backing`: the live state,
        or after `cut` what survived."""
        assert self.proc is not None, "not mounted"
        from .powerfs import unmount  # the same helper the filesystem uses on its own

        deadline = time.monotonic() + timeout
        while not unmount(self.mountpoint):
            if time.monotonic() > deadline:
                raise RuntimeError(f"cannot unmount {self.mountpoint}")
            time.sleep(0.1)
        self._expect("exported", timeout)
        assert self.proc.wait(timeout) == 0, self._tail()
        self.proc = None

    def cut(self, mode: str = "strict", seed: int = 0) -> None:
        """Cut the power: every change not made durable by an fsync is lost. `torn` keeps a
        random part of them instead (see powerfs.py). Leaves the filesystem unmounted."""
        assert self.command(f"cut {mode} {seed}") == "ok"
        self.unmount()

    def power_cycle(self, broker: BrokerProcess, mode: str = "strict", seed: int = 0) -> None:
        """SIGKILL the broker, cut the power, mount the disk again and restart the broker."""
        broker.kill()
        self.cut(mode, seed)
        self.mount()
        broker.restart()

    def close(self) -> None:
        if self.proc is None:
            return
        from .powerfs import unmount

        if not unmount(self.mountpoint):
            unmount(self.mountpoint, lazy=True)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def fsync_path(path: Path) -> None:
    """fsync a file or a directory by name."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def require_fuse() -> None:
    """Skip the calling test, saying why, where the machine cannot run the harness; under CI,
    which offers FUSE, fail it instead."""
    missing = fuse_missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"power-loss tests need FUSE, which CI offers: {missing}")
        pytest.skip(f"power-loss tests need FUSE: {missing}")


def mounted(tmp_path: Path) -> Iterator[PowerLossMount]:
    """The body of a `power` fixture: a power-loss filesystem of the test's own, mounted."""
    require_fuse()
    fs = PowerLossMount(tmp_path).mount()
    try:
        yield fs
    finally:
        fs.close()


def brokers_on(power: PowerLossMount) -> Iterator[Callable[..., BrokerProcess]]:
    """The body of a `start_broker` fixture: start `strom serve` processes on the power-loss
    mount, with Kafka config overrides. Their log dir is made and made durable first, as an
    operator provisions a data dir (what Strom does with a log dir it creates itself is a test
    of its own)."""
    started: list[BrokerProcess] = []

    def start(overrides: dict[str, str] | None = None) -> BrokerProcess:
        logs = power.mountpoint / "logs"
        if not logs.exists():
            logs.mkdir()
            fsync_path(power.mountpoint)
        broker = BrokerProcess(data_dir=power.mountpoint, overrides=overrides)
        started.append(broker)
        return broker.start()

    yield start
    for broker in started:
        broker.close()
