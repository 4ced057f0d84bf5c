"""Per-record errors (KIP-467) as clients see them: when a batch is refused for some of its
records, Produce v8+ names each one, so the client fails those records with the broker's
reason and the others as casualties of the same batch. Nothing of such a batch is written."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer
from kafka import errors as kafka_errors

from strom.testing import BrokerProcess, consume_all, unique_name

INVALID_RECORD, INVALID_DIFFERENT_RECORD = 87, KafkaError._INVALID_DIFFERENT_RECORD


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess() as proc:
        yield proc


def create(broker, topic: str, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(15)


def confluent_deliveries(broker, topic: str, records: list[tuple[bytes | None, int | None]]) -> list[int | None]:
    """Produce (key, timestamp) records in one batch; the error code each delivery reports."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 500, "retries": 0,
                         "enable.idempotence": False})
    producer.list_topics(topic, timeout=10)
    results: dict[int, int | None] = {}
    for i, (key, ts) in enumerate(records):
        producer.produce(topic, b"value-%d" % i, key=key, timestamp=ts or 0,
                         on_delivery=lambda err, _m, i=i: results.__setitem__(i, err and err.code()))
    assert producer.flush(20) == 0
    return [results[i] for i in range(len(records))]


def test_keyless_records_in_a_compacted_topic_fail_alone_in_confluent_kafka(broker):
    topic = unique_name("kip467-compact")
    create(broker, topic, **{"cleanup.policy": "compact"})
    keys = [None if i % 3 == 0 else b"k%d" % i for i in range(10)]
    codes = confluent_deliveries(broker, topic, [(k, None) for k in keys])
    assert codes == [INVALID_RECORD if k is None else INVALID_DIFFERENT_RECORD for k in keys]
    assert consume_all(broker.bootstrap, topic, timeout=2) == []


def test_records_out_of_the_timestamp_range_fail_alone_in_confluent_kafka(broker):
    topic = unique_name("kip467-time")
    create(broker, topic, **{"message.timestamp.before.max.ms": "60000"})
    now = int(time.time() * 1000)
    stamps = [now, now - 3_600_000, now, now + 7_200_000, now]
    codes = confluent_deliveries(broker, topic, [(b"k", ts) for ts in stamps])
    # librdkafka reports a named record as INVALID_RECORD when several are named.
    assert codes == [INVALID_DIFFERENT_RECORD, INVALID_RECORD, INVALID_DIFFERENT_RECORD, INVALID_RECORD,
                     INVALID_DIFFERENT_RECORD]
    assert consume_all(broker.bootstrap, topic, timeout=2) == []


def test_kafka_python_gets_the_broker_reason_for_each_bad_record(broker):
    topic = unique_name("kip467-kp")
    create(broker, topic, **{"cleanup.policy": "compact"})
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=500, retries=0)
    try:
        futures = [producer.send(topic, b"v", key=None if i in (1, 2) else b"k%d" % i) for i in range(4)]
        producer.flush(20)
        outcomes = [f.exception for f in futures]
    finally:
        producer.close()
    assert all(isinstance(e, kafka_errors.InvalidRecordError) and "without key" in str(e) for e in outcomes[1:3])
    assert all(e is not None and "part of a batch which had one more more invalid records" in str(e)
               for e in (outcomes[0], outcomes[3]))
