"""kafka-python 3.x: KafkaProducer, KafkaConsumer (assign + seek, no group) and KafkaAdminClient.

kafka-python 3 enables the idempotent producer by default (InitProducerId plus sequence
numbers), so these producers exercise Strom's de-duplication path as users get it.
"""

from __future__ import annotations

import time

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewPartitions, NewTopic
from kafka.errors import (
    InvalidConfigurationError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

from strom.protocol import compression
from strom.testing import TIMESTAMP_BASE_MS, unique_name

from .conftest import ck_consume, stored_batches, watermarks

pytestmark = pytest.mark.timeout(60)

T0 = TIMESTAMP_BASE_MS


def produce(bootstrap: str, topic: str, n: int, partitions: int = 1, **conf) -> list:
    producer = KafkaProducer(bootstrap_servers=bootstrap, **{"linger_ms": 20, **conf})
    try:
        futures = [producer.send(topic, value=b"kp-%d" % i * 5, key=b"k%d" % (i % 3), partition=i % partitions,
                                 headers=[("n", b"%d" % i), ("x", b"")], timestamp_ms=T0 + i)
                   for i in range(n)]
        producer.flush(timeout=30)  # sends at once, whatever the linger
        return [f.get(timeout=30) for f in futures]
    finally:
        producer.close(timeout=10)


def consume(bootstrap: str, topic: str, partition: int, offset: int, n: int) -> list:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        out, deadline = [], time.monotonic() + 20
        while len(out) < n and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                out.extend(records)
        assert len(out) == n, f"got {len(out)} of {n}"
        return out
    finally:
        consumer.close()


def create(bootstrap: str, *topics: NewTopic, **kwargs):
    client = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return client.create_topics(list(topics), **kwargs)
    finally:
        client.close()


@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4", "zstd"])
def test_produce_and_consume_every_codec(broker, topic, codec):
    create(broker.bootstrap, NewTopic(topic, 2, 1))
    sent = produce(broker.bootstrap, topic, 100, partitions=2, compression_type=codec)
    assert [(m.partition, m.offset) for m in sent] == [(i % 2, i // 2) for i in range(100)]
    for p in (0, 1):
        got = consume(broker.bootstrap, topic, p, 0, 50)
        assert [(r.offset, r.key, r.value, r.timestamp, r.timestamp_type) for r in got] == [
            (i // 2, b"k%d" % (i % 3), b"kp-%d" % i * 5, T0 + i, 0) for i in range(p, 100, 2)]
        assert [r.headers for r in got] == [[("n", b"%d" % i), ("x", b"")] for i in range(p, 100, 2)]
        assert {b.compression for b in stored_batches(broker.bootstrap, topic, p)} == \
            {getattr(compression, (codec or "none").upper())}


def test_seek_into_the_middle_and_cross_client(broker, topic):
    create(broker.bootstrap, NewTopic(topic, 1, 1))
    produce(broker.bootstrap, topic, 30, linger_ms=30_000)  # one batch: flush() ends the linger
    assert len(stored_batches(broker.bootstrap, topic, 0)) == 1
    got = consume(broker.bootstrap, topic, 0, 17, 13)
    assert [r.offset for r in got] == list(range(17, 30))
    # librdkafka reads what kafka-python wrote, byte for byte.
    other = ck_consume(broker.bootstrap, [(topic, 0, 0)], 30)
    assert [(m.key(), m.value(), m.headers(), m.timestamp()[1]) for m in other] == [
        (b"k%d" % (i % 3), b"kp-%d" % i * 5, [("n", b"%d" % i), ("x", b"")], T0 + i) for i in range(30)]


@pytest.mark.parametrize("acks", [0, 1, "all"])
def test_acks(broker, topic, acks):
    create(broker.bootstrap, NewTopic(topic, 1, 1))
    sent = produce(broker.bootstrap, topic, 20, acks=acks)
    if acks != 0:
        assert [m.offset for m in sent] == list(range(20))
    assert [r.value for r in consume(broker.bootstrap, topic, 0, 0, 20)] == [b"kp-%d" % i * 5 for i in range(20)]
    assert watermarks(broker.bootstrap, topic, 0) == (0, 20)


def test_admin_create_and_delete_topics(broker, topic):
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        [created] = client.create_topics([NewTopic(topic, 3, 1, topic_configs={"retention.ms": "60000"})])[
            "topics"]
        # CreateTopics v5+ describes the new topic: every config, its value and its source.
        assert (created["name"], created["error_code"], created["num_partitions"],
                created["replication_factor"]) == (topic, 0, 3, 1)
        assert created["configs"]["retention.ms"]["value"] == "60000"
        assert created["configs"]["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
        assert created["configs"]["segment.bytes"]["value"] == "1073741824"
        assert created["configs"]["segment.bytes"]["config_source"] == "DEFAULT_CONFIG"
        assert topic in client.list_topics()
        with pytest.raises(TopicAlreadyExistsError):
            client.create_topics([NewTopic(topic, 1, 1)])
        bad = unique_name("bad-config")
        with pytest.raises(InvalidConfigurationError):
            client.create_topics([NewTopic(bad, 1, 1, topic_configs={"retention.ms": "never"})])
        client.create_partitions({topic: NewPartitions(total_count=5)})
        produce(broker.bootstrap, topic, 5, partitions=5)
        assert [watermarks(broker.bootstrap, topic, p) for p in range(5)] == [(0, 1)] * 5
        client.delete_topics([topic])
        assert topic not in client.list_topics()
        with pytest.raises(UnknownTopicOrPartitionError):
            client.delete_topics([topic])
    finally:
        client.close()
