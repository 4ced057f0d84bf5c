"""Topic configs Kafka 4.x has and Strom lacked: compression.type (the broker recompresses
into the topic's codec, KIP-390 levels), message.timestamp.before/after.max.ms, and the rest
accepted with Kafka's types; deprecated 3.x keys accepted, tiered storage refused."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from strom.client import Connection
from strom.protocol.compression import GZIP, LZ4, NONE, ZSTD
from strom.protocol.errors import ErrorCode
from strom.protocol.records import Record, build_batch
from strom.testing import BrokerProcess

from .conftest import ck_consume, stored_batches

BOOLEAN, STRING, INT, LONG, DOUBLE, LIST = 1, 2, 3, 5, 6, 7  # DescribeConfigs config_type
DESCRIBE_CONFIGS, PRODUCE = 32, 0


def create(broker, topic: str, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(15)


def produce(broker, topic: str, values: list[bytes], timestamp: int = 0, **conf) -> list:
    errors: list = []
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 50, **conf})
    p.list_topics(topic, timeout=10)
    for v in values:
        p.produce(topic, v, timestamp=timestamp, on_delivery=lambda err, _m: errors.append(err))
    p.flush(15)
    return errors


@pytest.mark.parametrize("topic_codec, producer_codec, stored", [
    ("zstd", "none", ZSTD), ("uncompressed", "gzip", NONE), ("lz4", "snappy", LZ4), ("producer", "gzip", GZIP),
])
def test_the_topic_codec_is_the_stored_codec(broker, topic, topic_codec, producer_codec, stored):
    create(broker, topic, **{"compression.type": topic_codec})
    values = [b"value-%d-" % i * 20 for i in range(50)]
    assert produce(broker, topic, values, **{"compression.type": producer_codec}) == [None] * 50
    batches = stored_batches(broker.bootstrap, topic, 0)
    assert batches and {b.compression for b in batches} == {stored}
    assert [m.value() for m in ck_consume(broker.bootstrap, [(topic, 0, 0)], 50)] == values


def test_compression_levels_are_validated(broker, topic):
    create(broker, topic, **{"compression.type": "zstd", "compression.zstd.level": "19"})
    assert produce(broker, topic, [b"x" * 1000]) == [None]
    assert stored_batches(broker.bootstrap, topic, 0)[0].compression == ZSTD
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for key, value in (("compression.zstd.level", "23"), ("compression.lz4.level", "0"),
                       ("compression.gzip.level", "10"), ("compression.type", "brotli")):
        name = f"{topic}-{key.split('.')[1]}-{value}"
        with pytest.raises(KafkaException, match=key):
            admin.create_topics([NewTopic(name, 1, 1, config={key: value})])[name].result(15)


def test_timestamps_out_of_bounds_are_refused(broker, topic):
    now = int(time.time() * 1000)
    create(broker, topic, **{"message.timestamp.before.max.ms": "60000"})
    # Kafka 4.0's default message.timestamp.after.max.ms is one hour.
    [future] = produce(broker, topic, [b"from the future"], timestamp=now + 2 * 3_600_000)
    [past] = produce(broker, topic, [b"from the past"], timestamp=now - 600_000)
    assert future.name() == past.name() == "INVALID_TIMESTAMP"
    assert produce(broker, topic, [b"now"], timestamp=now) == [None]
    assert [m.value() for m in ck_consume(broker.bootstrap, [(topic, 0, 0)], 1)] == [b"now"]
    # LogAppendTime topics take any producer timestamp: the broker's time replaces it.
    create(broker, topic + "-lat", **{"message.timestamp.type": "LogAppendTime"})
    assert produce(broker, topic + "-lat", [b"x"], timestamp=now + 5 * 3_600_000) == [None]


@pytest.mark.parametrize("codec", [NONE, ZSTD])
def test_each_record_out_of_range_is_named(broker, topic, codec):
    """Kafka checks every record, not the batch's first and largest timestamps: a record
    below the first one can be too old too. Produce v8+ names each (KIP-467), and nothing of
    the batch is written."""
    now = int(time.time() * 1000)
    create(broker, topic, **{"message.timestamp.before.max.ms": "60000"})
    stamps = [now, now - 600_000, now + 2 * 3_600_000, now - 1000, now - 700_000]
    batch = build_batch([Record(i, ts, None, b"r%d" % i, ()) for i, ts in enumerate(stamps)], codec=codec)
    with Connection("127.0.0.1", broker.port) as conn:
        def produce_v9(records: bytes):
            body = conn.call(PRODUCE, 9, {"transactional_id": None, "acks": -1, "timeout_ms": 5000, "topic_data": [
                {"name": topic, "partition_data": [{"index": 0, "records": records}]}]})
            return body.responses[0].partition_responses[0]

        answer = produce_v9(batch)
        assert answer.error_code == ErrorCode.INVALID_TIMESTAMP
        assert [(e.batch_index, e.batch_index_error_message.split(" is more than ")[1].split("=")[0])
                for e in answer.record_errors] == [
            (1, "message.timestamp.before.max.ms"), (2, "message.timestamp.after.max.ms"),
            (4, "message.timestamp.before.max.ms")]
        assert "3 record(s)" in answer.error_message
        # The same records within range are taken whole.
        good = build_batch([Record(i, now - 10 * i, None, b"ok%d" % i, ()) for i in range(5)], codec=codec)
        assert produce_v9(good).error_code == 0
    assert [m.value() for m in ck_consume(broker.bootstrap, [(topic, 0, 0)], 5)] == [b"ok%d" % i for i in range(5)]


def test_types_deprecated_keys_and_tiered_storage(broker, topic):
    create(broker, topic, **{"message.format.version": "3.0-IV1", "segment.jitter.ms": "1000",
                             "preallocate": "true", "local.retention.ms": "-2"})
    with Connection("127.0.0.1", broker.port) as conn:
        body = conn.call(DESCRIBE_CONFIGS, 4, {
            "resources": [{"resource_type": 2, "resource_name": topic, "configuration_keys": None}],
            "include_synonyms": False, "include_documentation": False})
    described = {c.name: (c.value, c.config_type) for c in body.results[0].configs}
    assert described["retention.bytes"][1] == LONG and described["segment.bytes"][1] == INT
    assert described["compression.type"] == ("producer", STRING)
    assert described["preallocate"] == ("true", BOOLEAN)
    assert described["message.timestamp.after.max.ms"] == ("3600000", LONG)
    assert described["segment.jitter.ms"] == ("1000", LONG)
    assert "message.format.version" not in described  # accepted, warned about, and dropped
    assert "topic config message.format.version=3.0-IV1 ignored" in broker.log_text()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    name = topic + "-tiered"
    with pytest.raises(KafkaException, match="Tiered Storage functionality is disabled in the broker"):
        admin.create_topics([NewTopic(name, 1, 1, config={"remote.storage.enable": "true"})])[name].result(15)


# Kafka 4.0's topic configs (its documentation's "Topic-Level Configs"): type and default.
LONG_MAX = "9223372036854775807"
KAFKA_4_0_TOPIC_CONFIGS = {
    "cleanup.policy": (LIST, "delete"),
    "compression.gzip.level": (INT, "-1"),
    "compression.lz4.level": (INT, "9"),
    "compression.type": (STRING, "producer"),
    "compression.zstd.level": (INT, "3"),
    "delete.retention.ms": (LONG, "86400000"),
    "file.delete.delay.ms": (LONG, "60000"),
    "flush.messages": (LONG, LONG_MAX),
    "flush.ms": (LONG, LONG_MAX),
    "follower.replication.throttled.replicas": (LIST, ""),
    "index.interval.bytes": (INT, "4096"),
    "leader.replication.throttled.replicas": (LIST, ""),
    "local.retention.bytes": (LONG, "-2"),
    "local.retention.ms": (LONG, "-2"),
    "max.compaction.lag.ms": (LONG, LONG_MAX),
    "max.message.bytes": (INT, "1048588"),
    "message.timestamp.after.max.ms": (LONG, "3600000"),
    "message.timestamp.before.max.ms": (LONG, LONG_MAX),
    "message.timestamp.type": (STRING, "CreateTime"),
    "min.cleanable.dirty.ratio": (DOUBLE, "0.5"),
    "min.compaction.lag.ms": (LONG, "0"),
    "min.insync.replicas": (INT, "1"),
    "preallocate": (BOOLEAN, "false"),
    "remote.log.copy.disable": (BOOLEAN, "false"),
    "remote.log.delete.on.disable": (BOOLEAN, "false"),
    "remote.storage.enable": (BOOLEAN, "false"),
    "retention.bytes": (LONG, "-1"),
    "retention.ms": (LONG, "604800000"),
    "segment.bytes": (INT, "1073741824"),
    "segment.index.bytes": (INT, "10485760"),
    "segment.jitter.ms": (LONG, "0"),
    "segment.ms": (LONG, "604800000"),
    "unclean.leader.election.enable": (BOOLEAN, "false"),
}


def test_every_topic_config_of_kafka_4_0_with_its_type_and_default():
    """A topic on a broker with Kafka's defaults describes exactly Kafka 4.0's topic configs,
    each with Kafka's type and default, DEFAULT_CONFIG as source, none read-only or secret."""
    with BrokerProcess() as broker:
        name = "described"
        create(broker, name)
        with Connection("127.0.0.1", broker.port) as conn:
            body = conn.call(DESCRIBE_CONFIGS, 4, {
                "resources": [{"resource_type": 2, "resource_name": name, "configuration_keys": None}],
                "include_synonyms": False, "include_documentation": False})
    configs = {c.name: c for c in body.results[0].configs}
    assert {n: (c.config_type, c.value) for n, c in configs.items()} == KAFKA_4_0_TOPIC_CONFIGS
    default_config = 5
    assert {n for n, c in configs.items() if c.config_source != default_config} == set()
    assert not any(c.read_only or c.is_sensitive for c in configs.values())
