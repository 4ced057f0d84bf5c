"""Start-up, listeners and clean shutdown of a real broker process."""

import socket

import pytest
from confluent_kafka import Producer

from strom.protocol import messages
from strom.testing import BrokerProcess, RawClient

pytestmark = pytest.mark.timeout(120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metadata_brokers(port: int) -> list[tuple[int, str, int]]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(messages.encode_request(3, 12, {"topics": None}, correlation_id=1))
        data = b""
        while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
            chunk = sock.recv(65536)
            assert chunk
            data += chunk
    _, body = messages.decode_response(3, 12, data[4:])
    return [(b.node_id, b.host, b.port) for b in body.brokers]


def test_each_listener_advertises_itself():
    port_a, port_b = _free_port(), _free_port()
    overrides = {
        "listeners": f"PLAINTEXT://127.0.0.1:{port_a},REPLICATION://127.0.0.1:{port_b}",
        "advertised.listeners": f"PLAINTEXT://localhost:{port_a},REPLICATION://127.0.0.1:{port_b}",
        "broker.id": "7",
    }
    broker = BrokerProcess(overrides=overrides)
    try:
        broker.start()
        assert _metadata_brokers(port_a) == [(7, "localhost", port_a)]
        assert _metadata_brokers(port_b) == [(7, "127.0.0.1", port_b)]
    finally:
        broker.close()


def test_sigterm_shuts_down_cleanly_and_marks_it(tmp_path):
    broker = BrokerProcess(data_dir=tmp_path)
    broker.start()
    assert broker.stop() == 0
    log_dir = tmp_path / "logs"
    assert (log_dir / ".kafka_cleanshutdown").exists()
    assert (log_dir / "meta.properties").read_text().count("broker.id=0") == 1
    assert "Traceback" not in broker.log_text()
    broker.start()  # the marker lets the next start skip recovery
    assert "no clean shutdown marker" not in broker.log_text()  # a new dir, then a clean stop
    assert broker.stop() == 0


def test_kill_9_start_says_it_recovered(tmp_path):
    broker = BrokerProcess(data_dir=tmp_path)
    try:
        broker.start()
        client = RawClient(broker)
        client.call(19, 5, {"topics": [{"name": "t", "num_partitions": 1, "replication_factor": 1,
                                        "assignments": [], "configs": []}], "timeout_ms": 5000})
        client.close()
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        producer.produce("t", b"written")  # a log never written has nothing on disk to recover
        assert producer.flush(30) == 0
        broker.kill()
        broker.start()
        assert broker.log_text().count("no clean shutdown marker") == 1
    finally:
        broker.close()
