"""Client quotas with real clients: producers and consumers over their byte rates are told to
wait (throttle_time_ms) and their data still arrives whole; a client under no quota is not
held; request-time quotas; connection creation rates; the admin API's checks and filters
(through `strom quotas` and raw requests)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from confluent_kafka import Consumer, Producer

from strom.client import Connection
from strom.protocol.errors import ErrorCode
from strom.testing import BrokerProcess, closing, create_topic, unique_name, wait_for


def strom(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strom", *args], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def broker():
    # Two 1-second windows: rates (and throttles, at most the two windows) settle in seconds.
    with BrokerProcess(overrides={"group.initial.rebalance.delay.ms": "0", "quota.window.num": "2"}) as b:
        server = ("--bootstrap-server", b.bootstrap)
        for args in (("--client-id", "slow-producer", "producer_byte_rate=50000"),
                     ("--client-id", "slow-consumer", "consumer_byte_rate=50000"),
                     ("--client-id", "chatty", "request_percentage=0.01")):
            done = strom("quotas", "set", *args, *server)
            assert done.returncode == 0, done.stderr
        yield b


def produce(broker, topic: str, client_id: str, count: int, size: int) -> list[int]:
    throttles: list[int] = []
    with closing(Producer({"bootstrap.servers": broker.bootstrap, "client.id": client_id, "linger.ms": 50,
                           "throttle_cb": lambda event: throttles.append(event.throttle_time)})) as producer:
        for i in range(count):
            producer.produce(topic, key=str(i).encode(), value=bytes([i % 256]) * size)
            producer.poll(0)
        assert producer.flush(120) == 0
        producer.poll(0.5)
    return throttles


def test_a_producer_over_its_byte_rate_is_throttled(broker):
    topic = unique_name("quota-produce")
    create_topic(broker.bootstrap, topic)
    assert produce(broker, topic, "unlimited", 20, 10_000) == []  # no quota: never held
    slow = produce(broker, topic, "slow-producer", 30, 10_000)
    assert slow and max(slow) > 0  # 300 KB at 50 KB/s: told to wait
    got = []
    with Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique_name("g"),
                   "auto.offset.reset": "earliest"}) as consumer:
        consumer.subscribe([topic])
        wait_for(lambda: got.extend(m for m in consumer.consume(100, 0.5) if not m.error()) or len(got) >= 50,
                 timeout=60, what="every record")
    assert sorted(int(m.key()) for m in got[20:]) == list(range(30))


def test_a_consumer_over_its_byte_rate_is_throttled_and_reads_everything(broker):
    topic = unique_name("quota-fetch")
    create_topic(broker.bootstrap, topic)
    produce(broker, topic, "unlimited", 30, 10_000)
    throttles: list[int] = []
    got = []
    with Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique_name("g"),
                   "client.id": "slow-consumer", "auto.offset.reset": "earliest",
                   "fetch.max.bytes": 1_100_000, "max.partition.fetch.bytes": 100_000,
                   "throttle_cb": lambda event: throttles.append(event.throttle_time)}) as consumer:
        consumer.subscribe([topic])
        wait_for(lambda: got.extend(m for m in consumer.consume(100, 0.5) if not m.error()) or len(got) >= 30,
                 timeout=90, what="every record through the quota")
    assert [int(m.key()) for m in got] == list(range(30))
    assert throttles and max(throttles) > 0


def test_request_time_quota(broker):
    metadata = {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}
    with Connection("127.0.0.1", broker.port, client_id="chatty") as conn:
        # 0.01% of the loop is 0.1 ms a second: a few Metadata requests are over it.
        assert any(conn.call(3, 9, metadata).throttle_time_ms > 0 for _ in range(20))
    with Connection("127.0.0.1", broker.port, client_id="relaxed") as conn:
        assert conn.call(3, 9, metadata).throttle_time_ms == 0


def test_quotas_are_described_and_checked(broker):
    server = ("--bootstrap-server", broker.bootstrap)
    assert strom("quotas", "set", "--user", "alice", "--client-id", "app", "producer_byte_rate=1024", *server).returncode == 0
    described = strom("quotas", "describe", "--user", "alice", *server)
    assert "Quota configs for user=alice, client-id=app are producer_byte_rate=1024.0" in described.stdout
    everything = strom("quotas", "describe", *server).stdout
    assert "client-id=slow-producer are producer_byte_rate=50000" in everything
    refused = strom("quotas", "set", "--user", "alice", "connection_creation_rate=5", *server)
    assert refused.returncode == 1 and "Invalid configuration key connection_creation_rate" in refused.stderr
    assert strom("quotas", "set", "--ip", "not-an-ip", "connection_creation_rate=5", *server).returncode == 1
    assert strom("quotas", "remove", "--user", "alice", "--client-id", "app", "producer_byte_rate", *server).returncode == 0
    assert "user=alice" not in strom("quotas", "describe", *server).stdout
    with Connection("127.0.0.1", broker.port) as conn:
        body = conn.call(49, 1, {"validate_only": False, "entries": [
            {"entity": [{"entity_type": "user", "entity_name": "bob"}, {"entity_type": "ip", "entity_name": None}],
             "ops": [{"key": "producer_byte_rate", "value": 10.0, "remove": False}]},
            {"entity": [{"entity_type": "client-id", "entity_name": "x"}],
             "ops": [{"key": "producer_byte_rate", "value": 1.5, "remove": False}]},
            {"entity": [{"entity_type": "user", "entity_name": None}],
             "ops": [{"key": "consumer_byte_rate", "value": 4096.0, "remove": False}]}]})
        assert [e.error_code for e in body.entries] == [ErrorCode.INVALID_REQUEST, ErrorCode.INVALID_REQUEST,
                                                        ErrorCode.NONE]
        defaults = conn.call(48, 1, {"strict": True, "components": [
            {"entity_type": "user", "match_type": 1, "match": None}]}).entries
        assert [[(e.entity_type, e.entity_name) for e in d.entity] for d in defaults] == [[("user", None)]]
        conn.call(49, 1, {"validate_only": False, "entries": [{"entity": [{"entity_type": "user", "entity_name": None}],
                                                              "ops": [{"key": "consumer_byte_rate", "value": 0.0,
                                                                       "remove": True}]}]})


def test_connection_creation_rate_per_ip():
    with BrokerProcess() as b:
        assert strom("quotas", "set", "--ip-default", "connection_creation_rate=3",
                     "--bootstrap-server", b.bootstrap).returncode == 0
        answered = 0
        for _ in range(60):
            try:
                with Connection("127.0.0.1", b.port) as conn:
                    conn.call(18, 0, {})
                    answered += 1
            except (ConnectionError, OSError, EOFError):
                pass
        assert 0 < answered < 60
        assert any("connection_creation_rate of 127.0.0.1 (3/s) reached" in line for line in b.stderr_lines)
