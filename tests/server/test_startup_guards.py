"""Start-up refuses what would silently go wrong: a second broker on the same log dirs, and
an inter-broker listener that is not there."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from strom.config.broker import BrokerConfig, ConfigError
from strom.testing import BrokerProcess


def test_listeners_without_a_known_protocol_serve_plaintext():
    BrokerConfig({"listeners": "CLIENT://127.0.0.1:0"})  # unmapped: plaintext, as before
    config = BrokerConfig({"listeners": "CLIENT://127.0.0.1:0,SECURE://127.0.0.1:0",
                           "listener.security.protocol.map": "CLIENT:PLAINTEXT,SECURE:SASL_SSL"})
    assert [config.protocol_of(n) for n in ("CLIENT", "SECURE")] == ["PLAINTEXT", "SASL_SSL"]


def test_the_inter_broker_listener_must_exist():
    clustered = {"zookeeper.connect": "127.0.0.1:2181", "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0"}
    assert BrokerConfig({**clustered, "inter.broker.listener.name": "SSL"}).inter_broker_listener == "SSL"
    with pytest.raises(ConfigError, match="not one of listeners"):
        BrokerConfig({**clustered, "inter.broker.listener.name": "INTERNAL"})


def test_second_broker_on_the_same_log_dir_refuses_to_start(tmp_path):
    with BrokerProcess(data_dir=tmp_path) as first:
        logs = tmp_path / "logs"

        def files() -> dict[str, int]:
            # The running first broker rewrites its checkpoints on a timer: those are its own.
            return {p.name: p.stat().st_mtime_ns for p in logs.iterdir() if not p.name.endswith("-checkpoint")}

        before = files()
        second = subprocess.run(
            [sys.executable, "-m", "strom", "serve", "--override", "listeners=PLAINTEXT://127.0.0.1:0",
             "--override", f"log.dirs={first.overrides['log.dirs']}"],
            capture_output=True, text=True, timeout=60)
        assert second.returncode != 0
        assert "in use by another broker" in second.stderr
        assert files() == before  # untouched
        assert first.proc.poll() is None
    # Once the first has stopped, the dir is free again.
    with BrokerProcess(data_dir=tmp_path):
        pass


@pytest.mark.parametrize("name", ["meta.properties", "strom-metadata.json"])
def test_unreadable_files_are_named_at_start_up(tmp_path, name):
    with BrokerProcess(data_dir=tmp_path) as broker:
        logs = Path(broker.overrides["log.dirs"])
        assert broker.stop() == 0
    (logs / name).write_bytes(b"\xff\xfe\x00garbage{")
    result = subprocess.run(
        [sys.executable, "-m", "strom", "serve", "--override", "listeners=PLAINTEXT://127.0.0.1:0",
         "--override", f"log.dirs={logs}"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert str(logs / name) in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_log_lines_quoting_client_values_are_bounded():
    from strom.protocol import messages

    with BrokerProcess() as broker:
        name = "t" * (1 << 20)  # a 1 MB topic name
        with socket.create_connection(("127.0.0.1", broker.port)) as sock:
            sock.sendall(messages.encode_request(3, 9, {"topics": [{"name": name}],
                                                         "allow_auto_topic_creation": True,
                                                         "include_cluster_authorized_operations": False,
                                                         "include_topic_authorized_operations": False}))
            sock.settimeout(10)
            sock.recv(1 << 16)
        time.sleep(0.5)
        assert max(len(line) for line in broker.stderr_lines) < 5000
