"""Start a real `strom serve` process on 127.0.0.1 with an ephemeral port and a temp dir, or a
cluster of them on a ZooKeeper.

Used by the integration tests and the benchmarks: the broker under test is always a separate
process reached over a real socket, exactly as users run it.

The client-side helpers every test suite shares live here too: `wait_for` (poll a condition with
a bound), `create_topic`, and `consume_until` / `consume_all` (read through confluent-kafka until
a condition holds, failing the test at the deadline instead of returning what arrived so far).
confluent-kafka is a test dependency, so those helpers import it when called.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Self, TypeVar

from strom.client import Connection
from strom.testing_fork import ForkedProcess, can_fork
from strom.zookeeper_server import ZooKeeperServer

if TYPE_CHECKING:
    from confluent_kafka import Consumer, KafkaError, Message, Producer
    from kazoo.client import KazooClient

T = TypeVar("T")
C = TypeVar("C")

_READY = re.compile(r"ready on (?P<listeners>\S+?)(?:,| \()")
_METRICS = re.compile(r"metrics on (?P<url>\S+)")
_REGISTERED = re.compile(r"registered with the controller: broker epoch (\d+)")
_LISTENER = re.compile(r"(?P<name>[A-Z_][A-Z0-9_]*)://\S+?:(?P<port>\d+)")


_fork_brokers = False


class _PipeLines:
    """A child's stderr as lines, read by a thread and also on demand.

    A test that has just seen a broker act (its answer, its exit) asks for the lines the broker
    logged before acting; a reader thread alone may not have got to them yet. `read_available`
    takes everything already in the pipe, under the lock the thread reads with; the thread waits
    for data outside it."""

    def __init__(self, stream: IO[str], lines: list[str]) -> None:
        self._stream = stream  # kept open for the descriptor's sake
        self._fd = stream.fileno()
        os.set_blocking(self._fd, False)
        self._lines = lines
        self._partial = b""
        self._lock = threading.Lock()
        self.ended = False

    def read_available(self) -> None:
        with self._lock:
            while not self.ended:
                try:
                    chunk = os.read(self._fd, 65536)
                except BlockingIOError:
                    return
                if not chunk:
                    self.ended = True
                    chunk = b"\n" if self._partial else b""
                *complete, self._partial = (self._partial + chunk).split(b"\n")
                self._lines.extend(line.decode("utf-8", "replace").rstrip() for line in complete)

    def follow(self) -> None:
        while not self.ended:
            select.select([self._fd], [], [])
            self.read_available()


def fork_brokers(enabled: bool = True) -> None:
    """Start each BrokerProcess from now on forked from a server process that has imported
    Strom already (see strom.testing_fork): the same broker, 0.2 s less CPU to start. For test
    suites that start many; a benchmark that times start-ups leaves it off. A plain script
    (not a pytest run) that turns it on needs an `if __name__ == "__main__":` guard:
    multiprocessing re-runs a script's main module in each forked child."""
    global _fork_brokers
    _fork_brokers = enabled


def unique_name(base: str) -> str:
    """A topic (or group, or transactional id) name no other test uses, readable from `base`."""
    return re.sub(r"[^a-zA-Z0-9-]+", "-", base).strip("-")[:80] + "-" + uuid.uuid4().hex[:8]


# Broker processes made since the running test's setup began: a failing test's report shows
# the logs of those it made itself (`with Cluster(...)` in its body) too.
_made_by_test: deque[BrokerProcess] = deque(maxlen=12)  # bounded: not every module clears it


def report_broker_logs(item, call):
    """pytest_runtest_makereport as a hook wrapper (wrap it with pytest.hookimpl in a conftest):
    a failing test's report shows the tail of each BrokerProcess log it used, and of each
    broker of a Cluster it used, as a fixture or made in its body."""
    if call.when == "setup":
        _made_by_test.clear()
    report = (yield).get_result()
    if not report.failed:
        return
    shown: set[int] = set()

    def show(title: str, broker: BrokerProcess) -> None:
        if id(broker) not in shown:
            shown.add(id(broker))
            report.sections.append((title, "\n".join(broker.stderr_lines[-40:])))

    for name, value in (getattr(item, "funcargs", None) or {}).items():
        if isinstance(value, BrokerProcess):
            show(f"broker log ({name})", value)
        elif isinstance(value, Cluster):
            for broker_id, broker in value.brokers.items():
                show(f"broker {broker_id} log ({name})", broker)
        elif isinstance(value, KRaftQuorum):
            for node_id, node in [*value.nodes.items(), *value.brokers.items()]:
                show(f"node {node_id} log ({name})", node)
    for broker in _made_by_test:
        show(f"broker log (made by the test, {broker.overrides.get('listeners', '')})", broker)


class _StartedInWith:
    """`with X() as x`: start() on entry (and close() if that fails: half a cluster is not left
    running), close() on exit."""

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()


class BrokerProcess(_StartedInWith):
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
        self.proc: subprocess.Popen | ForkedProcess | None = None
        self._drainer: threading.Thread | None = None
        self._stderr: _PipeLines | None = None
        self.port = 0
        self.metrics_url: str | None = None  # with metrics.port set: http://host:port/metrics
        self.ports: dict[str, int] = {}  # every listener's port, by listener name
        self._stderr_lines: list[str] = []
        self.startup_seconds = 0.0
        self.paused = False
        _made_by_test.append(self)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        # Listeners asked for on port 0 get a fixed free port at the first start, kept on
        # restart so clients can reconnect (see free_ports for why not the kernel's choice).
        listeners = self.overrides.get("listeners", "")
        wildcards = re.findall(r":0(?=,|$)", listeners)
        if wildcards:
            ports = iter(free_ports(len(wildcards)))
            self.overrides["listeners"] = re.sub(r":0(?=,|$)", lambda _: f":{next(ports)}", listeners)
        args = ["serve", "--log-level", "INFO"]
        for key, value in self.overrides.items():
            args += ["--override", f"{key}={value}"]
        env = dict(os.environ, **(self.env or {}))
        begin = time.monotonic()
        if self._stderr is not None:
            # A run that ended by itself (not by stop or kill) may have lines still in its pipe:
            # they go before the next run's.
            self._stderr.read_available()
        if _fork_brokers and can_fork(self.env):
            self.proc = ForkedProcess(args, env)
        else:
            self.proc = subprocess.Popen([sys.executable, "-m", "strom", *args], stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True, env=env)
        self._stderr = _PipeLines(self.proc.stderr, self._stderr_lines)
        self._drainer = threading.Thread(target=self._stderr.follow, daemon=True)
        self._drainer.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            match = _READY.search(line)
            if match:
                self.port = int(match["listeners"].rsplit(":", 1)[1])
                listeners = line.split(" ready on ", 1)[1].split(" (", 1)[0]
                self.ports = {m["name"]: int(m["port"]) for m in _LISTENER.finditer(listeners)}
                metrics = _METRICS.search(line)
                self.metrics_url = metrics["url"] if metrics else None
                self.startup_seconds = time.monotonic() - begin
                threading.Thread(target=self.proc.stdout.read, daemon=True).start()
                return self
        self.proc.kill()
        raise RuntimeError("broker did not become ready:\n" + "\n".join(self.stderr_lines[-30:]))

    @property
    def stderr_lines(self) -> list[str]:
        """Every line the broker has written to stderr so far, across restarts."""
        if self._stderr is not None:
            self._stderr.read_available()
        return self._stderr_lines

    def _log_complete(self) -> None:
        # Once the process is gone, its last lines are still in the pipe: read them before
        # returning, so that a test looking at the log after stop() or kill() sees all of it.
        if self._drainer is not None:
            self._drainer.join(10)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait: the clean shutdown path. Returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        self._log_complete()
        return code

    def pause(self) -> None:
        """SIGSTOP: the process stays, answers nothing and runs no timer until `resume`."""
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        """kill -9: no chance to flush or checkpoint."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self._log_complete()

    def restart(self) -> BrokerProcess:
        return self.start()

    def log_text(self) -> str:
        """Everything the broker wrote to stderr before this call, across restarts."""
        return "\n".join(self.stderr_lines)

    def close(self) -> None:
        self.kill()
        if self._tmp is not None:
            self._tmp.cleanup()


class RawClient(Connection):
    """A blocking client that speaks the protocol through `strom.protocol`, for tests and tools
    that need exact control over the bytes a broker receives."""

    def __init__(self, broker: BrokerProcess) -> None:
        super().__init__("127.0.0.1", broker.port)


# A CreateTime base for tests that set their records' timestamps: an hour before the run. A
# fixed date years back is past log.retention.ms (7 days by default), and a retention pass that
# happens to run between a test's produce and its read deletes the records.
TIMESTAMP_BASE_MS = (int(time.time()) - 3600) * 1000

KRAFT = "kraft"  # Cluster(zookeeper=KRAFT): the same cluster on a KRaft quorum instead


class Cluster(_StartedInWith):
    """Brokers 1..N on one ZooKeeper, each a BrokerProcess, under a chroot of their own so many
    clusters can share one ZooKeeper (a ZooKeeperServer per test module, say).

    With `zookeeper=KRAFT` the same cluster runs without ZooKeeper: nodes 1..N each a broker and
    a controller of one KRaft quorum (process.roles=broker,controller), `session_timeout_ms`
    being broker.session.timeout.ms; brokers added later are dedicated brokers. Tests written
    against a Cluster run in both modes unchanged, except what reads ZooKeeper (`zk()`)."""

    def __init__(self, brokers: int = 3, zookeeper: ZooKeeperServer | str | None = None,
                 overrides: dict[str, str] | None = None, chroot: str | None = None,
                 session_timeout_ms: int = 4000) -> None:
        self.kraft = zookeeper == KRAFT
        if self.kraft:
            self.quorum = KRaftQuorum(brokers, combined=True, overrides={
                "broker.session.timeout.ms": str(session_timeout_ms),
                "broker.heartbeat.interval.ms": str(max(100, session_timeout_ms // 8)), **(overrides or {})})
            self.brokers = dict(self.quorum.nodes)
            self.overrides = self.quorum.overrides
            self._client = None
            return
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
        if self.kraft:
            self.quorum.start(timeout)
            return self
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
        if self.kraft:
            self.quorum.overrides.update(overrides)
            broker = self.quorum._new_broker(broker_id)
            for key in overrides:
                del self.quorum.overrides[key]
            self.brokers[broker_id] = broker
            return broker.start()
        return self._new_broker(broker_id, overrides).start()

    def zk(self) -> KazooClient:
        """A kazoo client on this cluster's chroot, for reading what the brokers wrote."""
        if self.kraft:
            raise RuntimeError("a KRaft cluster has no ZooKeeper")
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
        from kazoo.exceptions import NoNodeError

        try:  # no exists() first: an ephemeral node (/controller) may go in between
            raw = self.zk().get(path)[0]
        except NoNodeError:
            return None
        return json.loads(raw) if raw else None

    def controller_id(self) -> int:
        """The active controller (KRaft: the quorum's leader)."""
        if self.kraft:
            described = self.quorum.describe()
            return -1 if described is None else described["leader_id"]
        node = self._read_json("/controller")
        return -1 if node is None else int(node["brokerid"])

    def controller_epoch(self) -> int:
        if self.kraft:
            described = self.quorum.describe()
            return 0 if described is None else described["leader_epoch"]
        node = self._read_json("/controller_epoch")
        return 0 if node is None else int(node)

    def broker_epoch(self, broker_id: int) -> int:
        """The broker's current epoch: ZooKeeper mode, the czxid of its registration znode; KRaft,
        the offset of its registration record in the metadata log, as the controller answered
        its BrokerRegistration (and the broker logged it); -1 before either."""
        if not self.kraft:
            stat = self.zk().exists(f"/brokers/ids/{broker_id}")
            return -1 if stat is None else stat.czxid
        logged = _REGISTERED.findall(self.brokers[broker_id].log_text())
        return int(logged[-1]) if logged else -1

    def wait_for(self, predicate: Callable[[], T], timeout: float = 30.0, what: str = "condition",
                 interval: float = 0.05) -> T:
        return wait_for(predicate, timeout, interval, what=what)

    def close(self) -> None:
        if self.kraft:
            self.quorum.close()
            return
        if self._client is not None:
            self._client.stop()
            self._client.close()
            self._client = None
        for broker in self.brokers.values():
            broker.close()
        if self._owns_zookeeper:
            self.zookeeper.close()


def _harness_port_range() -> range:
    """This test process's share of the ports below the kernel's ephemeral range.

    A port the kernel chose (bind to port 0) lies in the ephemeral range, and while its broker
    is down for a restart any client's outgoing connection may be given it as a local port,
    so that the restart cannot bind. Ports below the range are never handed out that way.
    Parallel test workers (pytest-xdist) each take a slice of their own."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    first = 20000 if low > 22000 else 1025
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    workers = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1), index + 1)
    size = (low - first) // workers
    return range(first + index * size, first + (index + 1) * size)


_port_range = _harness_port_range()
_next_port = itertools.count(random.randrange(len(_port_range)))
_port_lock = threading.Lock()


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 now, from below the ephemeral range (for
    listeners that must be known before the process starts, as a KRaft quorum's voters are,
    or that a restart must bind again). Taken in turn, so two calls never hand out one port
    twice before the range wraps."""
    import socket

    ports: list[int] = []
    with _port_lock:
        for _ in range(len(_port_range)):
            if len(ports) == count:
                break
            port = _port_range[next(_next_port) % len(_port_range)]
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            ports.append(port)
    if len(ports) < count:
        raise RuntimeError(f"no {count} free ports in {_port_range}")
    return ports


class KRaftQuorum(_StartedInWith):
    """KRaft controllers 1..N (process.roles=controller), each a BrokerProcess on a fixed free port
    with a temp dir, formatted as `strom storage format` formats them and started at once.

    A static quorum (controller.quorum.voters) by default; `dynamic` formats node 1 with
    --standalone and the others with --no-initial-controllers (KIP-853: add them with
    `add_voter`). `brokers` adds nodes with process.roles=broker: each registers with the
    active controller and follows the quorum as an observer."""

    def __init__(self, controllers: int = 3, *, dynamic: bool = False, brokers: int = 0, combined: bool = False,
                 overrides: dict[str, str] | None = None, first_id: int = 1) -> None:
        from strom.metadata.storage import kafka_uuid

        self._tmp = tempfile.TemporaryDirectory(prefix="strom-kraft-")
        self.root = Path(self._tmp.name)
        self.cluster_id = kafka_uuid()
        self.dynamic = dynamic
        self.combined = combined  # controllers are brokers too (process.roles=broker,controller)
        self.overrides = dict(overrides or {})
        self.ports: dict[int, int] = {}
        self.nodes: dict[int, BrokerProcess] = {}
        self.brokers: dict[int, BrokerProcess] = {}
        for node_id, port in zip(range(first_id, first_id + controllers), free_ports(controllers), strict=True):
            self.ports[node_id] = port
        for node_id in self.ports:
            self._new_controller(node_id, initial=not dynamic or node_id == first_id)
        for broker_id in range(100, 100 + brokers):
            self._new_broker(broker_id)

    @property
    def voters(self) -> str:
        return ",".join(f"{n}@127.0.0.1:{p}" for n, p in sorted(self.ports.items()))

    @property
    def bootstrap_controllers(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for n, p in sorted(self.ports.items()) if self.running(n))

    def _quorum_keys(self) -> dict[str, str]:
        if self.dynamic:
            return {"controller.quorum.bootstrap.servers": ",".join(f"127.0.0.1:{p}" for p in self.ports.values())}
        return {"controller.quorum.voters": self.voters}

    def _format(self, overrides: dict[str, str], **how) -> None:
        from strom.config.broker import BrokerConfig
        from strom.controller.features import default_levels
        from strom.metadata.storage import InitialController, format_storage

        cfg = BrokerConfig(overrides)
        controllers = None
        if how.get("standalone"):
            port = cfg.listeners[0].port
            controllers = [InitialController(cfg.broker_id, "127.0.0.1", port, uuid.uuid4())]
        format_storage(cluster_id=self.cluster_id, node_id=cfg.broker_id, log_dirs=cfg.log_dirs,
                       metadata_dir=cfg.metadata_log_dir, controller_listener="CONTROLLER",
                       features=default_levels(), initial_controllers=controllers)

    def _new_controller(self, node_id: int, initial: bool = True) -> BrokerProcess:
        data = self.root / f"controller-{node_id}"
        overrides = {"process.roles": "controller", "node.id": str(node_id),
                     "listeners": f"CONTROLLER://127.0.0.1:{self.ports[node_id]}",
                     "controller.listener.names": "CONTROLLER", "log.dirs": str(data / "logs"),
                     **self._quorum_keys(), **self.overrides}
        if self.combined:  # the broker listeners asked for (default one PLAINTEXT), and the controller's
            brokers = self.overrides.get("listeners", "PLAINTEXT://127.0.0.1:0")
            overrides.update({"process.roles": "broker,controller",
                              "listeners": f"{brokers},CONTROLLER://127.0.0.1:{self.ports[node_id]}"})
            overrides.setdefault("inter.broker.listener.name", "PLAINTEXT")
        if self.dynamic:
            self._format(overrides, standalone=initial, no_initial=not initial)
        else:
            self._format(overrides)
        node = BrokerProcess(data, overrides)
        self.nodes[node_id] = node
        return node

    def _new_broker(self, broker_id: int) -> BrokerProcess:
        data = self.root / f"broker-{broker_id}"
        overrides = {"process.roles": "broker", "node.id": str(broker_id), "controller.listener.names": "CONTROLLER",
                     "log.dirs": str(data / "logs"), **self._quorum_keys(), **self.overrides}
        self._format(overrides)
        broker = BrokerProcess(data, overrides)
        self.brokers[broker_id] = broker
        return broker

    def add_controller(self, node_id: int) -> BrokerProcess:
        """A new controller (dynamic quorums: formatted with --no-initial-controllers), started;
        it fetches as an observer until it is added as a voter."""
        self.ports[node_id] = free_ports(1)[0]
        return self._new_controller(node_id, initial=False).start()

    def config_file(self, node_id: int) -> Path:
        """The node's settings as a server.properties (for add-controller's --command-config)."""
        path = self.root / f"controller-{node_id}.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in self.nodes[node_id].overrides.items()))
        return path

    @property
    def bootstrap(self) -> str:
        """The broker listeners of the running nodes that are brokers (combined or dedicated)."""
        nodes = [*(self.nodes.values() if self.combined else ()), *self.brokers.values()]
        return ",".join(n.bootstrap for n in nodes if n.proc is not None and n.proc.poll() is None)

    def running(self, node_id: int) -> bool:
        """Started, not exited, not paused."""
        node = self.nodes.get(node_id)
        return node is not None and node.proc is not None and node.proc.poll() is None and not node.paused

    def start(self, timeout: float = 60.0) -> KRaftQuorum:
        errors: list[BaseException] = []

        def start(node: BrokerProcess) -> None:
            try:
                node.start(timeout)
            except BaseException as e:  # noqa: B036 - reported below, from the caller's thread
                errors.append(e)

        threads = [threading.Thread(target=start, args=(n,)) for n in [*self.nodes.values(), *self.brokers.values()]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return self

    def describe(self, timeout: float = 2.0) -> dict | None:
        """The quorum leader's DescribeQuorum answer as a dict (leader_id, leader_epoch,
        high_watermark, current_voters, observers, nodes), None if no leader answers now. Every
        running controller is asked: a leader cut off from the others may still think it leads,
        so the answer of the newest epoch wins."""
        fields = {"topics": [{"topic_name": "__cluster_metadata", "partitions": [{"partition_index": 0}]}]}
        best = None
        for node_id, port in sorted(self.ports.items()):
            if not self.running(node_id):
                continue
            try:
                with Connection("127.0.0.1", port, timeout_s=timeout) as conn:
                    body = conn.call(55, 2, fields)
            except (OSError, ConnectionError):
                continue
            part = body.topics[0].partitions[0] if body.topics and body.topics[0].partitions else None
            if body.error_code == 0 and part is not None and part.error_code == 0:
                if best is None or part.leader_epoch > best["leader_epoch"]:
                    best = part.to_dict(json=False)
                    best["nodes"] = [n.to_dict(json=False) for n in body.nodes]
        return best

    def leader(self, timeout: float = 30.0, exclude: Iterable[int] = ()) -> int:
        """The id of the controller that leads (waiting for one that is not in `exclude`)."""
        excluded = set(exclude)

        def found() -> int | None:
            d = self.describe()
            return d["leader_id"] if d and d["leader_id"] not in excluded else None

        return wait_for(found, timeout, interval=0.05, what="a quorum leader")

    def close(self) -> None:
        for node in [*self.nodes.values(), *self.brokers.values()]:
            if node.proc is not None and node.proc.poll() is None:
                try:
                    node.resume()
                except OSError:
                    pass
            node.close()
        self._tmp.cleanup()


# --- what tests share on the client side ------------------------------------------------------

def acl_broker_overrides(users: Iterable[str], extra: dict[str, str] | None = None) -> dict[str, str]:
    """A PLAINTEXT and a SASL_PLAINTEXT listener, PLAIN users `<name>` / `<name>-secret`, and
    the ACL authorizer with User:admin as super user; `extra` adds or replaces settings."""
    jaas = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
            + " ".join(f'user_{u}="{u}-secret"' for u in users) + ";")
    return {"listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
            "sasl.enabled.mechanisms": "PLAIN", "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer", "super.users": "User:admin",
            **(extra or {})}


def tiered_overrides(store: dict[str, str], **extra: str) -> dict[str, str]:
    """Broker overrides for tiered storage in tests: the store's `rsm.config.*` keys (an
    S3Server's rsm_config(), or a directory's), the remote log manager and the retention check
    every 200 ms, deleted segments unlinked at once, a one-partition metadata topic."""
    return {"remote.log.storage.system.enable": "true", **store,
            "remote.log.manager.task.interval.ms": "200", "log.retention.check.interval.ms": "200",
            "log.segment.delete.delay.ms": "0", "rlmm.config.remote.log.metadata.topic.num.partitions": "1",
            **extra}


def list_offset(bootstrap: str, topic: str, spec: int, partition: int = 0) -> int:
    """ListOffsets of one partition for a timestamp or a spec (-1 latest, -2 earliest, -4
    earliest local, -5 latest tiered) through librdkafka."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "strom-list-offsets"})
    try:
        return consumer.offsets_for_times([TopicPartition(topic, partition, spec)], timeout=10)[0].offset
    finally:
        consumer.close()


def wait_for(predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.05,
             what: str = "condition") -> T:
    """Poll `predicate` until it returns something truthy, and return that; fail the test (an
    AssertionError naming `what`) once `timeout` seconds have passed. Bounds are meant to be
    generous: a test waits for a condition, it never asserts how fast it came."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def create_topic(bootstrap: str, name: str, partitions: int = 1, *, replication_factor: int = 1,
                 config: dict[str, str] | None = None, assignment: list[list[int]] | None = None,
                 timeout: float = 30.0) -> None:
    """CreateTopics through confluent-kafka's admin client; raises what the broker answered.
    `assignment` (a replica list per partition) replaces `partitions` and `replication_factor`."""
    from confluent_kafka.admin import AdminClient, NewTopic

    if assignment is not None:
        new = NewTopic(name, len(assignment), replica_assignment=assignment, config=config or {})
    else:
        new = NewTopic(name, partitions, replication_factor, config=config or {})
    client = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future
    client.create_topics([new], operation_timeout=timeout)[name].result(timeout=timeout + 5)


@dataclass
class ReadProgress:
    """What a `consume_until` read has seen so far."""

    records: list[Message] = field(default_factory=list)
    # (topic, partition) -> the offset the consumer last reported reaching the end at (its
    # start offset until then).
    reached: dict[tuple[str, int], int] = field(default_factory=dict)
    errors: list[KafkaError] = field(default_factory=list)

    def describe(self) -> str:
        counts: dict[tuple[str, int], int] = {}
        for m in self.records:
            counts[(m.topic(), m.partition())] = counts.get((m.topic(), m.partition()), 0) + 1
        return (f"read {len(self.records)} records {counts}; ends reached {self.reached}; "
                f"errors {[str(e) for e in self.errors[-3:]]}")


def reading_consumer(bootstrap: str, **conf: Any) -> Consumer:
    """A confluent-kafka consumer for reading what tests wrote: no group membership (assign
    only), no commits, end-of-partition events on, and an error rather than a silent reset when
    a start offset is out of range."""
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": bootstrap, "group.id": unique_name("strom-check"),
                     "enable.auto.commit": False, "enable.auto.offset.store": False,
                     "enable.partition.eof": True, "auto.offset.reset": "error",
                     "fetch.wait.max.ms": 100, **conf})


def _read(consumer: Consumer, progress: ReadProgress, until: Callable[[ReadProgress], bool],
          timeout: float, what: str) -> ReadProgress:
    from confluent_kafka import KafkaError

    deadline = time.monotonic() + timeout
    while not until(progress):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}: "
                                 f"{progress.describe()}")
        for msg in consumer.consume(500, 0.2):
            err = msg.error()
            if err is None:
                progress.records.append(msg)
            elif err.code() == KafkaError._PARTITION_EOF:
                progress.reached[(msg.topic(), msg.partition())] = msg.offset()
            elif err.fatal() or err.code() in (KafkaError._AUTO_OFFSET_RESET,
                                               KafkaError.OFFSET_OUT_OF_RANGE):
                raise AssertionError(f"consumer error while waiting for {what}: {err}")
            else:  # a broker restarting under the read, say: the client retries
                progress.errors.append(err)
    return progress


def memory_mb(pid: int, field: str = "VmRSS") -> float:
    """A process's resident memory in MiB from /proc: `VmRSS` now, or `VmHWM` at its peak."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for process {pid}")


def make_pki(directory: Path) -> dict[str, Any]:
    """Certificates for TLS tests (trustme, a test dependency): a CA, the broker's certificate
    for 127.0.0.1 (as a key-and-chain PEM file, and as PEM text for inline stores), and a client
    certificate for CN=alice,O=Acme."""
    import trustme

    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("alice.example.com", common_name="alice", organization_name="Acme")
    paths: dict[str, Any] = {name: directory / f"{name}.pem" for name in ("ca", "server", "client_key", "client_cert")}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    server.private_key_and_cert_chain_pem.write_to_path(str(paths["server"]))
    client.private_key_pem.write_to_path(str(paths["client_key"]))
    client.cert_chain_pems[0].write_to_path(str(paths["client_cert"]))
    paths["server_key_text"] = server.private_key_pem.bytes().decode()
    paths["server_chain_text"] = "".join(p.bytes().decode() for p in server.cert_chain_pems)
    paths["ca_text"] = ca.cert_pem.bytes().decode()
    return paths


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a Prometheus scrape of `url`, keyed by (sample name, labels)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def metric_value(samples: dict[tuple[str, frozenset], float], name: str, **labels: str) -> float:
    """One series of a scrape; a missing series fails the test (so 0 means a real 0)."""
    key = (name, frozenset(labels.items()))
    assert key in samples, f"no series {name}{labels}"
    return samples[key]


def close_client(client: Producer | Consumer) -> None:
    """Close a confluent-kafka producer or consumer at once: a producer's unsent records are
    purged first (its close() would otherwise wait up to message.timeout.ms for them, after a
    failed test say). Closing twice is harmless, and so is a transactional producer that a
    fatal error (fenced, an invalid state the test provoked) left unable to abort."""
    from confluent_kafka import KafkaException

    try:
        if hasattr(client, "purge"):
            client.purge()
        client.close()
    except (RuntimeError, KafkaException):  # closed already, or a fatal transactional state
        pass


@contextmanager
def closing(client: C) -> Iterator[C]:
    """`with closing(Producer(...)) as producer:`, closed by close_client whatever happens."""
    try:
        yield client
    finally:
        close_client(client)


def produce_acked(bootstrap: str, topic: str, values: Iterable[bytes], *, partition: int = 0,
                  batch_each: bool = False, **conf: Any) -> list[int]:
    """Produce `values` to one partition with an idempotent producer and return the offsets
    they were acknowledged at (failing the test on any delivery error). `batch_each`: one
    record per batch (a flush after each)."""
    from confluent_kafka import Producer

    offsets: list[int] = []
    failures: list = []

    def done(err, msg) -> None:
        (failures.append(err) if err else offsets.append(msg.offset()))

    count = 0
    with closing(Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, **conf})) as producer:
        for value in values:
            producer.produce(topic, value, partition=partition, on_delivery=done)
            count += 1
            if batch_each:
                producer.flush(30)
        assert producer.flush(30) == 0, "records left unacknowledged"
    assert not failures, failures
    assert len(offsets) == count
    return offsets


def read_values(bootstrap: str, topic: str, expected: int, *, partition: int = 0,
                start: int = 0) -> list[bytes]:
    """The values of one partition from `start` to its end: exactly `expected` of them."""
    values = [m.value() for m in consume_all(bootstrap, topic, [partition], start=start,
                                             count=expected, allow_empty=not expected)]
    assert len(values) == expected, f"read {len(values)} of {expected}"
    return values


def consume_until(bootstrap: str, assignment: Sequence[tuple[str, int, int]],
                  until: Callable[[ReadProgress], bool], *, timeout: float = 60.0,
                  what: str = "records", **conf: Any) -> ReadProgress:
    """Assign (topic, partition, offset)s and read until `until(progress)` holds; fails the
    test at the deadline, saying what was read."""
    from confluent_kafka import TopicPartition

    consumer = reading_consumer(bootstrap, **conf)
    try:
        consumer.assign([TopicPartition(t, p, o) for t, p, o in assignment])
        progress = ReadProgress(reached={(t, p): o for t, p, o in assignment})
        return _read(consumer, progress, until, timeout, what)
    finally:
        consumer.close()


def consume_all(bootstrap: str, topic: str, partitions: Iterable[int] | None = None, *,
                start: int | None = None, count: int | None = None, allow_empty: bool = False,
                timeout: float = 60.0, **conf: Any) -> list[Message]:
    """Every record of `partitions` of `topic` (default: all) from `start` (default: each log
    start) up to the high watermarks as they are when called, in the order they arrived;
    read_uncommitted unless `conf` says otherwise.

    The end is where the consumer reports reaching it (offsets may have gaps: compaction,
    transaction markers, aborted records under read_committed). With `count`, the read also goes
    on until that many records arrived (a new leader may answer a high watermark that is still
    catching up). Fails the test at the deadline, and when partitions that hold records gave
    none, unless `allow_empty` (read_committed over aborted transactions only, say)."""
    from confluent_kafka import KafkaException, TopicPartition

    consumer = reading_consumer(bootstrap, **{"isolation.level": "read_uncommitted", **conf})

    failures: list[str] = []  # the last one is named if the watermarks never come

    def watermarks() -> dict[int, tuple[int, int]] | None:
        # None while a partition has no leader to answer (a broker was just killed, say).
        marks = {}
        for p in wanted:
            try:
                marks[p] = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)
            except KafkaException as e:
                failures[:] = [f"partition {p}: {e}"]
                # librdkafka keeps a partition it saw without a leader (a broker whose metadata
                # had not heard of the new leader yet) as "Unknown partition" for this query
                # until its metadata is refreshed, which nothing else here asks for: ask.
                with contextlib.suppress(KafkaException):
                    consumer.list_topics(topic, timeout=5)
                return None
        return marks

    try:
        if partitions is None:
            meta = consumer.list_topics(topic, timeout=15).topics[topic]
            assert meta.error is None, f"{topic}: {meta.error}"
            partitions = sorted(meta.partitions)
        wanted = list(partitions)
        try:
            marks = wait_for(watermarks, timeout, interval=0.2, what=f"the watermarks of {topic}")
        except AssertionError as e:
            raise AssertionError(f"{e} (last failure: {failures[-1] if failures else None})") from None
        starts = {p: low if start is None else start for p, (low, _) in marks.items()}
        ends = {(topic, p): high for p, (_, high) in marks.items()}
        consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
        progress = ReadProgress(reached={(topic, p): o for p, o in starts.items()})

        def done(progress: ReadProgress) -> bool:
            return (all(progress.reached[tp] >= end for tp, end in ends.items())
                    and (count is None or len(progress.records) >= count))

        what = f"{topic} up to {ends}" + ("" if count is None else f" and {count} records")
        _read(consumer, progress, done, timeout, what)
    finally:
        consumer.close()
    holding = any(ends[(topic, p)] > starts[p] for p in starts)
    assert allow_empty or progress.records or not holding, \
        f"read nothing from {topic} although its partitions hold records up to {ends}"
    return progress.records
