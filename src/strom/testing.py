"""Start a real `strom serve` process on 127.0.0.1 with an ephemeral port and a temp dir.

Used by the integration tests and the benchmarks: the broker under test is always a separate
process reached over a real socket, exactly as users run it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from strom.client import Connection

_READY = re.compile(r"ready on (?P<listeners>\S+?)(?:,| \()")


def unique_name(base: str) -> str:
    """A topic (or group, or transactional id) name no other test uses, readable from `base`."""
    return re.sub(r"[^a-zA-Z0-9-]+", "-", base).strip("-")[:80] + "-" + uuid.uuid4().hex[:8]


def report_broker_logs(item, call):
    """pytest_runtest_makereport as a hook wrapper (wrap it with pytest.hookimpl in a conftest):
    a failing test's report shows the tail of each BrokerProcess log it used."""
    report = (yield).get_result()
    if report.failed:
        for name, value in getattr(item, "funcargs", {}).items():
            if isinstance(value, BrokerProcess):
                report.sections.append((f"broker log ({name})", "\n".join(value.stderr_lines[-40:])))


class BrokerProcess:
    def __init__(self, data_dir: Path | None = None, overrides: dict[str, str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self._tmp = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="strom-test-")
            data_dir = Path(self._tmp.name)
        self.data_dir = Path(data_dir)
        self.overrides = {"listeners": "PLAINTEXT://127.0.0.1:0", "log.dirs": str(self.data_dir / "logs")}
        self.overrides.update(overrides or {})
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.stderr_lines: list[str] = []
        self.startup_seconds = 0.0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        args = [sys.executable, "-m", "strom", "serve", "--log-level", "INFO"]
        for key, value in self.overrides.items():
            args += ["--override", f"{key}={value}"]
        # A fixed port from a previous run is reused on restart so clients can reconnect.
        if self.port:
            args += ["--override", f"listeners=PLAINTEXT://127.0.0.1:{self.port}"]
        env = dict(os.environ, **(self.env or {}))
        begin = time.monotonic()
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env)
        threading.Thread(target=self._drain_stderr, args=(self.proc,), daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            match = _READY.search(line)
            if match:
                self.port = int(match["listeners"].rsplit(":", 1)[1])
                self.startup_seconds = time.monotonic() - begin
                threading.Thread(target=self.proc.stdout.read, daemon=True).start()
                return self
        self.proc.kill()
        raise RuntimeError("broker did not become ready:\n" + "\n".join(self.stderr_lines[-30:]))

    def _drain_stderr(self, proc: subprocess.Popen) -> None:
        for line in proc.stderr:
            self.stderr_lines.append(line.rstrip())

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait: the clean shutdown path. Returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def kill(self) -> None:
        """kill -9: no chance to flush or checkpoint."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def restart(self) -> BrokerProcess:
        return self.start()

    def log_text(self) -> str:
        return "\n".join(self.stderr_lines)

    def close(self) -> None:
        self.kill()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


class RawClient(Connection):
    """A blocking client that speaks the protocol through `strom.protocol`, for tests and tools
    that need exact control over the bytes a broker receives."""

    def __init__(self, broker: BrokerProcess) -> None:
        super().__init__("127.0.0.1", broker.port)
