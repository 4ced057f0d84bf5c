"""Start a real `strom serve` process on 127.0.0.1 with an ephemeral port and a temp dir, or a
cluster of them on a ZooKeeper.

Used by the integration tests and the benchmarks: the broker under test is always a separate
process reached over a real socket, exactly as users run it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strom.client import Connection
from strom.zookeeper_server import ZooKeeperServer

if TYPE_CHECKING:
    from kazoo.client import KazooClient

_READY = re.compile(r"ready on (?P<listeners>\S+?)(?:,| \()")


def unique_name(base: str) -> str:
    """A topic (or group, or transactional id) name no other test uses, readable from `base`."""
    return re.sub(r"[^a-zA-Z0-9-]+", "-", base).strip("-")[:80] + "-" + uuid.uuid4().hex[:8]


def report_broker_logs(item, call):
    """pytest_runtest_makereport as a hook wrapper (wrap it with pytest.hookimpl in a conftest):
    a failing test's report shows the tail of each BrokerProcess log it used, and of each
    broker of a Cluster it used."""
    report = (yield).get_result()
    if report.failed:
        for name, value in getattr(item, "funcargs", {}).items():
            if isinstance(value, BrokerProcess):
                report.sections.append((f"broker log ({name})", "\n".join(value.stderr_lines[-40:])))
            elif isinstance(value, Cluster):
                for broker_id, broker in value.brokers.items():
                    report.sections.append((f"broker {broker_id} log ({name})",
                                            "\n".join(broker.stderr_lines[-40:])))


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


class Cluster:
    """Brokers 1..N on one ZooKeeper, each a BrokerProcess, under a chroot of their own so many
    clusters can share one ZooKeeper (a ZooKeeperServer per test module, say)."""

    def __init__(self, brokers: int = 3, zookeeper: ZooKeeperServer | None = None,
                 overrides: dict[str, str] | None = None, chroot: str | None = None,
                 session_timeout_ms: int = 4000) -> None:
        self._owns_zookeeper = zookeeper is None
        # A private ZooKeeper holds throwaway data: no fsync of its transaction log.
        self.zookeeper = zookeeper if zookeeper is not None else ZooKeeperServer(fsync=False)
        self.chroot = chroot or f"/strom-{uuid.uuid4().hex[:12]}"
        self.session_timeout_ms = session_timeout_ms
        self.overrides = dict(overrides or {})
        self.brokers: dict[int, BrokerProcess] = {}
        self._client: KazooClient | None = None
        for broker_id in range(1, brokers + 1):
            self._new_broker(broker_id, {})

    @property
    def zk_connect(self) -> str:
        return f"{self.zookeeper.connect}{self.chroot}"

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values()
                        if b.proc is not None and b.proc.poll() is None)

    def _new_broker(self, broker_id: int, overrides: dict[str, str]) -> BrokerProcess:
        broker = BrokerProcess(overrides={
            "zookeeper.connect": self.zk_connect,
            "broker.id": str(broker_id),
            "zookeeper.session.timeout.ms": str(self.session_timeout_ms),
            **self.overrides,
            **overrides,
        })
        self.brokers[broker_id] = broker
        return broker

    def start(self, timeout: float = 60.0) -> Cluster:
        """ZooKeeper (if this cluster owns it), then every broker at once."""
        if self._owns_zookeeper:
            self.zookeeper.start()
        for broker in self.brokers.values():
            broker.overrides["zookeeper.connect"] = self.zk_connect  # its port is known only now
        errors: list[BaseException] = []

        def start(broker: BrokerProcess) -> None:
            try:
                broker.start(timeout)
            except BaseException as e:  # noqa: B036 - reported below, from the caller's thread
                errors.append(e)

        threads = [threading.Thread(target=start, args=(b,)) for b in self.brokers.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return self

    def add_broker(self, broker_id: int, **overrides: str) -> BrokerProcess:
        """Start one more broker on this cluster (overrides with dots: **{"log.dirs": ...})."""
        if broker_id in self.brokers:
            raise ValueError(f"broker {broker_id} is already in this cluster")
        return self._new_broker(broker_id, overrides).start()

    def zk(self) -> KazooClient:
        """A kazoo client on this cluster's chroot, for reading what the brokers wrote."""
        if self._client is None:
            from kazoo.client import KazooClient

            # Make the chroot first, from outside it: the brokers may not have yet.
            outside = KazooClient(hosts=self.zookeeper.connect)
            outside.start()
            try:
                outside.ensure_path(self.chroot)
            finally:
                outside.stop()
                outside.close()
            self._client = KazooClient(hosts=self.zk_connect)
            self._client.start()
        return self._client

    def _read_json(self, path: str) -> Any:
        client = self.zk()
        if client.exists(path) is None:
            return None
        raw = client.get(path)[0]
        return json.loads(raw) if raw else None

    def controller_id(self) -> int:
        node = self._read_json("/controller")
        return -1 if node is None else int(node["brokerid"])

    def controller_epoch(self) -> int:
        node = self._read_json("/controller_epoch")
        return 0 if node is None else int(node)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 30.0,
                 what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(0.05)

    def close(self) -> None:
        if self._client is not None:
            self._client.stop()
            self._client.close()
            self._client = None
        for broker in self.brokers.values():
            broker.close()
        if self._owns_zookeeper:
            self.zookeeper.close()

    def __enter__(self) -> Cluster:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()
