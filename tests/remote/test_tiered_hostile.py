"""Remote reads against clients that push: a consumer without READ on a tiered topic gets
TOPIC_AUTHORIZATION_FAILED and nothing is read from the store for it; fetches of remote offsets
asking for 2 GiB each, many at once, get bounded answers, the broker's memory stays bounded and
its event loop keeps answering other requests meanwhile."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from strom.client import ClientSecurity, Connection
from strom.protocol.errors import ErrorCode
from strom.remote.reader import READ_CAP
from strom.testing import (
    BrokerProcess,
    acl_broker_overrides,
    memory_mb,
    metric_value,
    scrape,
    unique_name,
    wait_for,
)

FETCH, API_VERSIONS = 1, 18
EARLIEST_LOCAL = -4


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    root = tmp_path_factory.mktemp("remote-store")
    # The broker's own connections use the PLAINTEXT listener (User:ANONYMOUS here): a super user,
    # as a Kafka cluster makes its brokers.
    overrides = acl_broker_overrides(("admin", "alice"), {
        "super.users": "User:admin;User:ANONYMOUS", "remote.log.storage.system.enable": "true",
        "rsm.config.storage.root": str(root), "remote.log.manager.task.interval.ms": "200",
        "log.retention.check.interval.ms": "200", "rlmm.config.remote.log.metadata.topic.num.partitions": "1",
        "remote.log.reader.threads": "2", "remote.log.reader.max.pending.tasks": "4", "metrics.port": "0"})
    with BrokerProcess(overrides=overrides) as b:
        yield b


@pytest.fixture(scope="module")
def tiered(broker):
    topic = unique_name("hostile")
    plain = f"127.0.0.1:{broker.ports['PLAINTEXT']}"
    admin = AdminClient({"bootstrap.servers": plain})
    admin.create_topics([NewTopic(topic, 1, 1, config={
        "remote.storage.enable": "true", "segment.bytes": "65536", "local.retention.ms": "1"})])[topic].result(15)
    producer = Producer({"bootstrap.servers": plain, "batch.size": 16384, "linger.ms": 0})
    for i in range(3000):
        producer.produce(topic, b"h-%05d-" % i + b"z" * 300)
        if i % 40 == 39:
            producer.flush(10)
    assert producer.flush(15) == 0

    def local_start() -> int:
        consumer = Consumer({"bootstrap.servers": plain, "group.id": "offsets"})
        try:
            return consumer.offsets_for_times([TopicPartition(topic, 0, EARLIEST_LOCAL)], timeout=10)[0].offset
        finally:
            consumer.close()

    wait_for(lambda: local_start() >= 2000, timeout=60)
    return topic


def fetch(conn: Connection, topic: str, offset: int, max_bytes: int):
    body = conn.call(FETCH, 12, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": max_bytes, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "topics": [{"topic": topic, "partitions": [
            {"partition": 0, "current_leader_epoch": -1, "fetch_offset": offset, "last_fetched_epoch": -1,
             "log_start_offset": -1, "partition_max_bytes": max_bytes}]}],
        "forgotten_topics_data": [], "rack_id": ""})
    return body.responses[0].partitions[0]


def test_a_consumer_without_read_gets_no_remote_data(broker, tiered):
    alice = Connection("127.0.0.1", broker.ports["SASL_PLAINTEXT"], security=ClientSecurity(
        sasl_mechanism="PLAIN", username="alice", password="alice-secret"))
    def remote_reads() -> float:
        return metric_value(scrape(broker.metrics_url), "strom_remote_fetch_requests_total")

    before = remote_reads()
    with alice:
        answer = fetch(alice, tiered, 0, 1 << 20)
    assert answer.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert not answer.records
    assert remote_reads() == before  # refused before anything was read
    with Connection("127.0.0.1", broker.ports["PLAINTEXT"]) as conn:  # the same offset, authorized
        assert fetch(conn, tiered, 0, 1 << 20).records
    assert remote_reads() == before + 1


def test_many_huge_remote_fetches_get_bounded_answers_and_the_loop_keeps_answering(broker, tiered):
    rss_before = memory_mb(broker.proc.pid)
    sizes: list[int] = []
    errors: list[BaseException] = []
    pings: list[float] = []
    stop = threading.Event()

    def hammer(offset: int) -> None:
        try:
            with Connection("127.0.0.1", broker.ports["PLAINTEXT"]) as conn:
                for k in range(8):
                    answer = fetch(conn, tiered, (offset + 97 * k) % 1900, 2**31 - 1)
                    assert answer.error_code == ErrorCode.NONE, answer
                    sizes.append(len(answer.records or b""))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def ping() -> None:
        with Connection("127.0.0.1", broker.ports["PLAINTEXT"]) as conn:
            while not stop.is_set():
                started = time.monotonic()
                conn.call(API_VERSIONS, 3, {"client_software_name": "ping", "client_software_version": "1"})
                pings.append(time.monotonic() - started)
                time.sleep(0.01)

    pinger = threading.Thread(target=ping)
    pinger.start()
    workers = [threading.Thread(target=hammer, args=(i * 61,)) for i in range(24)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    stop.set()
    pinger.join(10)
    assert not errors, errors[:3]
    assert len(sizes) == 24 * 8
    assert max(sizes) <= READ_CAP  # whatever was asked, one read brings at most this much
    # some answered with data; the others empty (more waiting than the reader threads take, or
    # remote.fetch.max.wait.ms passed), which a consumer asks again: how many depends on the load
    assert any(sizes)
    assert memory_mb(broker.proc.pid) - rss_before < 300
    assert pings and max(pings) < 2.0  # the event loop answered throughout (speed is the benchmark's)
