"""The KRaft sample configs in config/kraft/, shaped as Kafka 4's: each is formatted with `strom
storage format` and started with `strom serve` as its header says, and a record goes through
the broker. Only the addresses (free ports instead of 9092/9093) and log.dirs (a temp dir instead
of /tmp/strom-kraft-*) are overridden, so that the test can run beside anything else."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from strom.log.manager import read_properties
from strom.testing import free_ports, unique_name

from .conftest import ok

pytestmark = pytest.mark.timeout(180)

SAMPLES = Path(__file__).resolve().parents[2] / "config" / "kraft"
# Kafka 4 sample keys every file has.
COMMON_KEYS = {"process.roles", "node.id", "controller.quorum.bootstrap.servers", "listeners",
               "advertised.listeners", "controller.listener.names", "num.network.threads",
               "num.io.threads", "socket.send.buffer.bytes", "socket.receive.buffer.bytes",
               "socket.request.max.bytes", "log.dirs", "num.partitions",
               "num.recovery.threads.per.data.dir", "offsets.topic.replication.factor",
               "transaction.state.log.replication.factor", "transaction.state.log.min.isr",
               "share.coordinator.state.topic.replication.factor",
               "share.coordinator.state.topic.min.isr", "log.retention.hours", "log.segment.bytes",
               "log.retention.check.interval.ms"}
BROKER_KEYS = {"inter.broker.listener.name", "listener.security.protocol.map"}


def _args(overrides: dict[str, str]) -> list[str]:
    return [arg for key, value in overrides.items() for arg in ("--override", f"{key}={value}")]


class Node:
    """`strom serve SAMPLE --override ...`, once its ready line is out."""

    def __init__(self, sample: Path, overrides: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "strom", "serve", str(sample), *_args(overrides)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.ready = self.proc.stdout.readline()
        if " ready on " not in self.ready:
            raise AssertionError(f"{sample.name} did not start: {self.stop()[1][-3000:]}")

    def stop(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, err


def _format(sample: Path, cluster_id: str, overrides: dict[str, str], *extra: str) -> str:
    return ok("storage", "format", "-t", cluster_id, "-c", str(sample), *extra, *_args(overrides))


def _round_trip(bootstrap: str) -> None:
    topic = unique_name("sample")
    ok("produce", topic, "--bootstrap-server", bootstrap, "--sync", input="from-the-sample\n")
    out = ok("consume", topic, "--from-beginning", "--max-messages", "1", "--bootstrap-server", bootstrap,
             allow_stderr=True)
    assert out.split() == ["from-the-sample"]


def test_the_samples_have_kafkas_keys():
    combined, broker, controller = (read_properties(SAMPLES / f"{n}.properties")
                                    for n in ("server", "broker", "controller"))
    for props in (combined, broker, controller):
        assert COMMON_KEYS <= set(props), COMMON_KEYS - set(props)
    assert BROKER_KEYS <= set(combined) and BROKER_KEYS <= set(broker)
    assert (combined["process.roles"], broker["process.roles"], controller["process.roles"]) == \
        ("broker,controller", "broker", "controller")
    assert combined["listeners"] == "PLAINTEXT://localhost:9092,CONTROLLER://localhost:9093"
    assert broker["controller.quorum.bootstrap.servers"] == controller["listeners"].split("//")[1] == "localhost:9093"
    assert broker["node.id"] != controller["node.id"]


def test_the_combined_sample_formats_standalone_and_serves(tmp_path):
    sample = SAMPLES / "server.properties"
    client, quorum = free_ports(2)
    listeners = f"PLAINTEXT://localhost:{client},CONTROLLER://localhost:{quorum}"
    overrides = {"listeners": listeners, "advertised.listeners": listeners,
                 "controller.quorum.bootstrap.servers": f"localhost:{quorum}", "log.dirs": str(tmp_path / "logs")}
    cluster_id = ok("storage", "random-uuid").strip()
    assert "Formatting dynamic metadata voter directory" in _format(sample, cluster_id, overrides, "--standalone")
    node = Node(sample, overrides)
    try:
        assert f"broker+controller 1 ready on {listeners.replace(',', ', ')} (cluster {cluster_id}" in node.ready
        _round_trip(f"localhost:{client}")
    finally:
        code, err = node.stop()
    assert code == 0, err[-3000:]
    assert [line for line in err.splitlines() if "WARNING" in line or "ERROR" in line] == []


def test_the_dedicated_controller_and_broker_samples(tmp_path):
    controller_sample, broker_sample = SAMPLES / "controller.properties", SAMPLES / "broker.properties"
    client, quorum = free_ports(2)
    controller_overrides = {"listeners": f"CONTROLLER://localhost:{quorum}",
                            "advertised.listeners": f"CONTROLLER://localhost:{quorum}",
                            "controller.quorum.bootstrap.servers": f"localhost:{quorum}",
                            "log.dirs": str(tmp_path / "controller")}
    broker_overrides = {"listeners": f"PLAINTEXT://localhost:{client}",
                        "advertised.listeners": f"PLAINTEXT://localhost:{client}",
                        "controller.quorum.bootstrap.servers": f"localhost:{quorum}",
                        "log.dirs": str(tmp_path / "broker")}
    cluster_id = ok("storage", "random-uuid").strip()
    _format(controller_sample, cluster_id, controller_overrides, "--standalone")
    assert "Formatting metadata directory" in _format(broker_sample, cluster_id, broker_overrides)
    controller = Node(controller_sample, controller_overrides)
    broker = None
    try:
        assert f"controller 1 ready on CONTROLLER://localhost:{quorum}" in controller.ready
        broker = Node(broker_sample, broker_overrides)
        assert f"broker 2 ready on PLAINTEXT://localhost:{client} (cluster {cluster_id}" in broker.ready
        _round_trip(f"localhost:{client}")
        status = ok("metadata-quorum", "--bootstrap-server", f"localhost:{client}", "describe", "--status")
        assert '"id": 2' in status.split("CurrentObservers:")[1]  # the broker follows as an observer
    finally:
        results = [broker.stop() if broker is not None else (0, ""), controller.stop()]
    for code, err in results:
        assert code == 0, err[-3000:]
        assert [line for line in err.splitlines() if "WARNING" in line or "ERROR" in line] == []
