"""The shipped config/server.properties starts a broker as the README says it does."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

from strom.testing import free_ports

SERVER_PROPERTIES = Path(__file__).resolve().parents[2] / "config" / "server.properties"


def test_the_shipped_server_properties_starts_a_broker(tmp_path):
    ready, err = serve(SERVER_PROPERTIES, "listeners=PLAINTEXT://127.0.0.1:0", f"log.dirs={tmp_path}")
    assert re.search(r"ready on PLAINTEXT://127\.0\.0\.1:\d+", ready), ready + err[-2000:]
    assert "WARNING" not in err and "ERROR" not in err, err[-2000:]
    assert (tmp_path / "meta.properties").exists()


def test_every_key_it_sets_is_one_strom_knows():
    from strom.config.broker import DEFINITIONS

    keys = [line.split("=", 1)[0].lstrip("#").strip() for line in SERVER_PROPERTIES.read_text().splitlines()
            if "=" in line and not line.startswith("# ")]
    assert keys and not [k for k in keys if k not in DEFINITIONS]


# The settings of Kafka's own sample files (config/kraft/server.properties and the ZooKeeper
# config/server.properties of Kafka 3.x), as a user would bring them.
KRAFT_SAMPLE = """
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@localhost:{port}
listeners=PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:{port}
inter.broker.listener.name=PLAINTEXT
advertised.listeners=PLAINTEXT://localhost:9092
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL
num.network.threads=3
num.io.threads=8
socket.send.buffer.bytes=102400
socket.receive.buffer.bytes=102400
socket.request.max.bytes=104857600
log.dirs={dir}
num.partitions=1
num.recovery.threads.per.data.dir=1
offsets.topic.replication.factor=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
log.retention.hours=168
log.segment.bytes=1073741824
log.retention.check.interval.ms=300000
"""
ZOOKEEPER_SAMPLE = """
broker.id=0
num.network.threads=3
num.io.threads=8
socket.send.buffer.bytes=102400
socket.receive.buffer.bytes=102400
socket.request.max.bytes=104857600
log.dirs={dir}
num.partitions=1
num.recovery.threads.per.data.dir=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
log.retention.hours=168
log.retention.check.interval.ms=300000
zookeeper.connect=localhost:2181
zookeeper.connection.timeout.ms=18000
group.initial.rebalance.delay.ms=0
"""


def serve(properties: Path, *overrides: str) -> tuple[str, str]:
    """Start `strom serve` on the file, wait for its ready line, stop it: (ready line, stderr)."""
    args = [sys.executable, "-m", "strom", "serve", str(properties)]
    for item in overrides:
        args += ["--override", item]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    return ready, err


def test_kafkas_kraft_sample_needs_formatting_then_starts_without_warnings(tmp_path):
    props = tmp_path / "server.properties"
    # The voter and the controller listener on one free port: the broker registers with it.
    props.write_text(KRAFT_SAMPLE.format(dir=tmp_path / "data", port=free_ports(1)[0]))
    refused = subprocess.run([sys.executable, "-m", "strom", "serve", str(props)], capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 1 and not (tmp_path / "data" / "meta.properties").exists()
    assert refused.stderr.strip().splitlines()[-1].startswith("strom: cannot start: no meta.properties in")
    assert "strom storage format" in refused.stderr
    cluster_id = subprocess.run([sys.executable, "-m", "strom", "storage", "random-uuid"], capture_output=True,
                                text=True, check=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "strom", "storage", "format", "-t", cluster_id, "-c", str(props)],
                   capture_output=True, text=True, check=True)
    ready, err = serve(props)
    assert "ready on PLAINTEXT://localhost:9092, CONTROLLER://127.0.0.1:" in ready, err[-2000:]
    assert f"cluster {cluster_id}" in ready
    warnings = [line for line in err.splitlines() if "WARNING" in line]
    assert warnings == []  # every key of the sample is one Strom uses (KRaft's, the share coordinator's)


def test_kafkas_zookeeper_sample_starts_embedded_when_told_no_zookeeper(tmp_path):
    props = tmp_path / "server.properties"
    props.write_text(ZOOKEEPER_SAMPLE.format(dir=tmp_path / "data"))
    ready, err = serve(props, "listeners=PLAINTEXT://127.0.0.1:0", "zookeeper.connect=")
    assert "ready on PLAINTEXT://127.0.0.1:" in ready, err[-2000:]
    assert "WARNING" not in err and "ERROR" not in err, err[-2000:]


def test_a_key_kafka_does_not_know_is_refused_with_a_suggestion(tmp_path):
    props = tmp_path / "server.properties"
    props.write_text("num.partitons=3\n")
    result = subprocess.run([sys.executable, "-m", "strom", "serve", str(props)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "did you mean 'num.partitions'" in result.stderr
