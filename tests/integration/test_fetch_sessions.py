"""Incremental fetch sessions (KIP-227): the request metadata's cases by hand on the wire, and
kafka-python's consumer of 1,000 partitions, which opens a session and then fetches
incrementally."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from kafka import KafkaConsumer, TopicPartition

from strom.client import Connection
from strom.protocol.errors import ErrorCode
from strom.testing import BrokerProcess, create_topic, metric_value, scrape, unique_name, wait_for

FETCH = 1


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(overrides={"metrics.port": "0"}) as proc:
        yield proc


def produce(bootstrap: str, topic: str, partition: int, count: int = 1) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(count):
        p.produce(topic, b"v%d" % i, partition=partition)
    assert p.flush(15) == 0


def fetch(conn: Connection, session_id: int, epoch: int, partitions: dict[tuple[str, int], int],
          forgotten: dict[str, list[int]] | None = None, max_wait_ms: int = 50):
    by_topic: dict[str, list[dict]] = {}
    for (topic, index), offset in partitions.items():
        by_topic.setdefault(topic, []).append({
            "partition": index, "current_leader_epoch": -1, "fetch_offset": offset, "last_fetched_epoch": -1,
            "log_start_offset": -1, "partition_max_bytes": 1 << 20})
    return conn.call(FETCH, 12, {
        "replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": 1, "max_bytes": 50 << 20,
        "isolation_level": 0, "session_id": session_id, "session_epoch": epoch,
        "topics": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
        "forgotten_topics_data": [{"topic": t, "partitions": ps} for t, ps in (forgotten or {}).items()],
        "rack_id": ""})


def answered(body) -> dict[tuple[str, int], int]:
    """(topic, partition) -> records bytes in the response, for every partition it carries."""
    return {(t.topic, p.partition_index): len(p.records or b"") for t in body.responses for p in t.partitions}


def test_a_session_from_open_to_close(broker):
    topic = unique_name("sessions")
    create_topic(broker.bootstrap, topic, partitions=3)
    produce(broker.bootstrap, topic, 0)
    all_three = {(topic, i): 0 for i in range(3)}
    with Connection("127.0.0.1", broker.port) as conn:
        opened = fetch(conn, 0, 0, all_three)  # full fetch, asking for a session
        session = opened.session_id
        assert opened.error_code == 0 and session != 0
        assert set(answered(opened)) == set(all_three) and answered(opened)[(topic, 0)] > 0

        # Incremental: only the partition whose position moved; nothing new anywhere.
        quiet = fetch(conn, session, 1, {(topic, 0): 1})
        assert (quiet.error_code, quiet.session_id, answered(quiet)) == (0, session, {})

        # A record on partition 1, which the request does not name: the session remembers it.
        produce(broker.bootstrap, topic, 1)
        news = fetch(conn, session, 2, {}, max_wait_ms=2000)
        assert list(answered(news)) == [(topic, 1)] and answered(news)[(topic, 1)] > 0

        # Forget partition 1: new records there are no longer answered.
        forgot = fetch(conn, session, 3, {}, forgotten={topic: [1]})
        assert answered(forgot) == {}
        produce(broker.bootstrap, topic, 1)
        produce(broker.bootstrap, topic, 2)
        later = fetch(conn, session, 4, {}, max_wait_ms=2000)
        assert list(answered(later)) == [(topic, 2)]

        # Wrong epoch, unknown session: top-level errors and nothing else.
        stale = fetch(conn, session, 4, {})
        assert (stale.error_code, stale.session_id, stale.responses) == (ErrorCode.INVALID_FETCH_SESSION_EPOCH, 0, [])
        unknown = fetch(conn, session ^ 0x5A5A5A, 1, {})
        assert unknown.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
        assert fetch(conn, session, 5, {}).error_code == 0  # the failures did not move the epoch

        # Epoch -1 closes the session and fetches without one.
        closing = fetch(conn, session, -1, {(topic, 2): 0})
        assert (closing.error_code, closing.session_id) == (0, 0) and list(answered(closing)) == [(topic, 2)]
        assert fetch(conn, session, 6, {}).error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND

        # Session 0, epoch -1: a plain full fetch, no session.
        plain = fetch(conn, 0, -1, all_three)
        assert plain.session_id == 0 and set(answered(plain)) == set(all_three)


def test_no_slots_means_no_sessions():
    with BrokerProcess(overrides={"max.incremental.fetch.session.cache.slots": "0"}) as proc:
        topic = unique_name("no-slots")
        create_topic(proc.bootstrap, topic)
        with Connection("127.0.0.1", proc.port) as conn:
            body = fetch(conn, 0, 0, {(topic, 0): 0})
        assert (body.error_code, body.session_id) == (0, 0) and list(answered(body)) == [(topic, 0)]


def test_kafka_python_reads_1000_partitions_through_one_incremental_session(broker):
    topic = unique_name("wide")
    create_topic(broker.bootstrap, topic, partitions=1000)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(3000):
        producer.produce(topic, b"%d" % i, partition=i % 1000)
    assert producer.flush(30) == 0
    before = metric_value(scrape(broker.metrics_url), "strom_incremental_fetch_sessions")
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                             fetch_max_wait_ms=100, max_partition_fetch_bytes=1 << 16)
    try:
        consumer.assign([TopicPartition(topic, i) for i in range(1000)])
        consumer.seek_to_beginning()
        got: list[bytes] = []

        def read_all() -> bool:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend(r.value for r in records)
            return len(got) >= 3000

        wait_for(read_all, timeout=90, what="3,000 records from 1,000 partitions")
        assert sorted(got, key=int) == [b"%d" % i for i in range(3000)]
        # Caught up: later fetches are incremental and name (almost) nothing.
        samples = scrape(broker.metrics_url)
        assert metric_value(samples, "strom_incremental_fetch_sessions") == before + 1
        # kafka-python forgets, for a while, the partitions whose records it still holds.
        assert metric_value(samples, "strom_incremental_fetch_partitions_cached") >= 900
    finally:
        consumer.close()
