"""confluent-kafka (librdkafka) producers and consumers against a real broker."""

from __future__ import annotations

import socket
import struct
import time

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, KafkaError, Producer
from confluent_kafka import TopicPartition as TP
from confluent_kafka.admin import OffsetSpec

from strom.protocol import compression, messages, records
from strom.testing import TIMESTAMP_BASE_MS, BrokerProcess, create_topic, unique_name, wait_for

from .conftest import (
    Rec,
    admin,
    ck_consume,
    ck_produce,
    consumer,
    offsets_for_times,
    roundtrip,
    stored_batches,
    watermarks,
)

pytestmark = pytest.mark.timeout(60)

T0 = TIMESTAMP_BASE_MS  # an explicit CreateTime base, ms
# Tests that need their records in one batch: a linger far longer than the produce loop, even on
# a loaded machine (200 ms was not always); the final flush() sends at once regardless.
ONE_BATCH = {"linger.ms": 30_000}


def sample(n: int, partitions: int | None = None, size: int = 40) -> list[Rec]:
    return [
        Rec(f"value-{i}-".encode() * (size // 10), f"key-{i % 7}".encode(),
            (("h1", f"{i}".encode()), ("h1", b"again"), ("empty", b"")), T0 + i * 10,
            None if partitions is None else i % partitions)
        for i in range(n)
    ]


def test_roundtrip_keys_headers_timestamps(broker, topic):
    create_topic(broker.bootstrap, topic)
    records = sample(30, partitions=1) + [
        Rec(b"no key", None, (), T0 + 1, 0),
        Rec(None, b"tombstone", (), T0 + 2, 0),
        Rec(b"", b"", (("k", b"v"), ("null", None)), T0 + 3, 0),
        Rec(bytes(range(256)) * 800, b"big", (), T0 + 4, 0),  # ~200 KB, its own batch
    ]
    got = roundtrip(broker.bootstrap, topic, records)
    assert all(m.timestamp()[0] == TIMESTAMP_CREATE_TIME for m in got)


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_every_compression_codec(broker, topic, codec):
    create_topic(broker.bootstrap, topic, partitions=2)
    roundtrip(broker.bootstrap, topic, sample(400, partitions=2), **{"compression.type": codec,
                                                                   **ONE_BATCH})
    # The broker stores the producer's batches as they came: compressed, several records each.
    for p in (0, 1):
        batches = stored_batches(broker.bootstrap, topic, p)
        assert {b.compression for b in batches} == {getattr(compression, codec.upper())}
        assert sum(b.record_count for b in batches) == 200
        assert len(batches) < 200


@pytest.mark.parametrize("acks", [0, 1, "all"])
def test_acks(broker, topic, acks):
    create_topic(broker.bootstrap, topic)
    reports = roundtrip(broker.bootstrap, topic, sample(50, partitions=1), acks=acks)
    assert len(reports) == 50


def test_explicit_partitions(broker, topic):
    create_topic(broker.bootstrap, topic, partitions=3)
    got = roundtrip(broker.bootstrap, topic, sample(60, partitions=3))
    assert {m.partition() for m in got} == {0, 1, 2}


def test_keyed_partitioning(broker, topic):
    create_topic(broker.bootstrap, topic, partitions=4)
    records = [Rec(f"{k}-{i}".encode(), f"user-{k}".encode()) for i in range(5) for k in range(16)]
    got = roundtrip(broker.bootstrap, topic, records)
    placed: dict[bytes, set[int]] = {}
    for m in got:
        placed.setdefault(m.key(), set()).add(m.partition())
    assert len(placed) == 16 and all(len(ps) == 1 for ps in placed.values())
    assert len({p for ps in placed.values() for p in ps}) > 1


def test_offsets_for_times_inside_a_batch(broker, topic):
    create_topic(broker.bootstrap, topic)
    ck_produce(broker.bootstrap, topic, [Rec(b"v%d" % i, None, (), T0 + i * 1000, 0) for i in range(10)],
               **ONE_BATCH)
    assert len(stored_batches(broker.bootstrap, topic, 0)) == 1
    wanted = {T0 - 5: 0, T0: 0, T0 + 3000: 3, T0 + 3500: 4, T0 + 9000: 9, T0 + 9001: -1}
    assert offsets_for_times(broker.bootstrap, topic, list(wanted)) == list(wanted.values())


def test_admin_list_offsets_specs(broker, topic):
    create_topic(broker.bootstrap, topic)
    stamps = [T0 + 5, T0 + 50, T0 + 10, T0 + 50, T0 + 20]  # not monotonic, all in one batch
    ck_produce(broker.bootstrap, topic, [Rec(b"%d" % i, None, (), ts, 0) for i, ts in enumerate(stamps)],
               **ONE_BATCH)
    assert len(stored_batches(broker.bootstrap, topic, 0)) == 1
    client = admin(broker.bootstrap)
    specs = {"earliest": OffsetSpec.earliest(), "latest": OffsetSpec.latest(),
             "max": OffsetSpec.max_timestamp(), "t+8": OffsetSpec.for_timestamp(T0 + 8),
             "t+15": OffsetSpec.for_timestamp(T0 + 15), "t+51": OffsetSpec.for_timestamp(T0 + 51)}
    found = {}
    for name, spec in specs.items():
        [future] = client.list_offsets({TP(topic, 0): spec}, request_timeout=10).values()
        info = future.result(timeout=15)
        found[name] = (info.offset, info.timestamp)
    assert found == {"earliest": (0, -1), "latest": (5, -1), "max": (1, T0 + 50), "t+8": (1, T0 + 50),
                     "t+15": (1, T0 + 50), "t+51": (-1, -1)}
    assert offsets_for_times(broker.bootstrap, topic, [T0 + 6, T0 + 51]) == [1, -1]


def test_watermarks(broker, topic):
    create_topic(broker.bootstrap, topic, partitions=2)
    assert watermarks(broker.bootstrap, topic, 0) == (0, 0)
    ck_produce(broker.bootstrap, topic, sample(7, partitions=1))
    assert watermarks(broker.bootstrap, topic, 0) == (0, 7)
    assert watermarks(broker.bootstrap, topic, 1) == (0, 0)


def test_consume_from_the_middle_of_a_batch(broker, topic):
    create_topic(broker.bootstrap, topic)
    ck_produce(broker.bootstrap, topic, sample(20, partitions=1), **ONE_BATCH)
    [batch] = stored_batches(broker.bootstrap, topic, 0)
    assert (batch.base_offset, batch.record_count) == (0, 20)
    # The fetch from offset 7 gets the whole batch; the consumer must still start at 7.
    assert [b.base_offset for b in stored_batches(broker.bootstrap, topic, 0, offset=7)] == [0]
    got = ck_consume(broker.bootstrap, [(topic, 0, 7)], 13)
    assert [m.offset() for m in got] == list(range(7, 20))
    assert [m.value() for m in got] == [r.value for r in sample(20)[7:]]


def test_log_append_time_topic(broker, topic):
    create_topic(broker.bootstrap, topic, config={"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    reports = ck_produce(broker.bootstrap, topic, sample(10, partitions=1), acks="all", **ONE_BATCH)
    after = int(time.time() * 1000)
    assert len(stored_batches(broker.bootstrap, topic, 0)) == 1
    got = ck_consume(broker.bootstrap, [(topic, 0, 0)], 10)
    stamps = {m.timestamp() for m in got}
    assert len(stamps) == 1  # one batch, one append time
    kind, ts = stamps.pop()
    assert kind == TIMESTAMP_LOG_APPEND_TIME and before - 1000 <= ts <= after + 1000
    # The produce response carries the append time to the producer too.
    assert {m.timestamp() for m in reports} == {(TIMESTAMP_LOG_APPEND_TIME, ts)}
    [batch] = stored_batches(broker.bootstrap, topic, 0)
    assert batch.log_append_time and batch.max_timestamp == ts
    # Lookups by time use the append time, not the producer's CreateTime.
    assert offsets_for_times(broker.bootstrap, topic, [T0 + 50, ts, ts + 1]) == [0, 0, -1]


def test_auto_create_topic_on_produce(broker, topic):
    assert topic not in admin(broker.bootstrap).list_topics(timeout=10).topics
    reports = ck_produce(broker.bootstrap, topic, [Rec(b"hello", partition=1)])
    assert (reports[0].partition(), reports[0].offset()) == (1, 0)
    meta = admin(broker.bootstrap).list_topics(timeout=10).topics[topic]
    assert meta.error is None and sorted(meta.partitions) == [0, 1]  # num.partitions=2
    assert [m.value() for m in ck_consume(broker.bootstrap, [(topic, 1, 0)], 1)] == [b"hello"]


def test_consumer_metadata_does_not_auto_create(broker, topic):
    # librdkafka consumers ask with allow_auto_topic_creation=false; the answer they report
    # (the topic does not exist) shows the Metadata request was made and answered.
    c = consumer(broker.bootstrap, **{"group.id": unique_name("no-auto-create")})
    try:
        c.subscribe([topic])

        def told_unknown() -> bool:
            msg = c.poll(0.2)
            return msg is not None and msg.error() is not None \
                and msg.error().code() == KafkaError.UNKNOWN_TOPIC_OR_PART

        wait_for(told_unknown, timeout=30, interval=0, what="the consumer to hear the topic is unknown")
    finally:
        c.close()
    assert topic not in admin(broker.bootstrap).list_topics(timeout=10).topics


@pytest.fixture(scope="module")
def no_auto_create_broker():
    with BrokerProcess(overrides={"auto.create.topics.enable": "false"}) as proc:
        yield proc


def test_no_auto_create_produce_fails_unknown_topic(no_auto_create_broker, topic):
    bootstrap = no_auto_create_broker.bootstrap
    errors = []
    producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 5000,
                         "topic.metadata.propagation.max.ms": 500})
    producer.produce(topic, b"nowhere", on_delivery=lambda err, msg: errors.append(err))
    assert producer.flush(15) == 0
    [err] = errors
    assert err is not None and err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC), err
    meta = admin(bootstrap).list_topics(topic=topic, timeout=10).topics[topic]
    assert meta.error is not None and meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert topic not in admin(bootstrap).list_topics(timeout=10).topics


def test_fetch_limits_still_return_a_whole_oversized_batch(broker, topic):
    create_topic(broker.bootstrap, topic)
    records = [Rec(bytes([i]) * 300_000, partition=0) for i in range(3)]
    records += [Rec(b"small-%d" % i * 100, partition=0) for i in range(50)]
    ck_produce(broker.bootstrap, topic, records, **{"linger.ms": 0})
    # Limits far below one record: the broker must still hand out one whole batch per fetch.
    got = ck_consume(broker.bootstrap, [(topic, 0, 0)], len(records),
                     **{"max.partition.fetch.bytes": 1024, "fetch.max.bytes": 2048,
                        "message.max.bytes": 1000})
    assert [m.value() for m in got] == [r.value for r in records]


def test_out_of_range_offset_resets(broker, topic):
    create_topic(broker.bootstrap, topic)
    ck_produce(broker.bootstrap, topic, sample(10, partitions=1))
    got = ck_consume(broker.bootstrap, [(topic, 0, 500)], 10, **{"auto.offset.reset": "earliest"})
    assert [m.offset() for m in got] == list(range(10))
    c = consumer(broker.bootstrap, **{"auto.offset.reset": "error"})
    try:
        c.assign([TP(topic, 0, 500)])
        deadline, err = time.monotonic() + 10, None
        while err is None and time.monotonic() < deadline:
            msg = c.poll(0.2)
            err = msg.error() if msg is not None else None
        assert err is not None and err.code() == KafkaError._AUTO_OFFSET_RESET, err
        assert "Offset out of range" in err.str() or "OFFSET_OUT_OF_RANGE" in err.str(), err.str()
    finally:
        c.close()


def test_long_poll_wakes_up_on_append(broker, topic):
    """A Fetch parked at the end with a 120 s max wait is answered by the append, with the
    record: the response must arrive well inside the wait (a 60 s socket timeout fails it)."""
    create_topic(broker.bootstrap, topic)
    host, port = broker.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(messages.encode_request(1, 4, {
            "replica_id": -1, "max_wait_ms": 120_000, "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": 0, "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]}))
        # Give the fetch time to park; had it not, it would find the record at once: no failure.
        time.sleep(0.5)
        ck_produce(broker.bootstrap, topic, [Rec(b"wake up", partition=0)], **{"linger.ms": 0})
        reader = sock.makefile("rb")
        (size,) = struct.unpack(">i", reader.read(4))
        _, body = messages.decode_response(1, 4, reader.read(size))
    data = body.responses[0].partitions[0]
    assert (data.error_code, data.high_watermark) == (0, 1)
    batch = records.read_header(data.records, 0)
    assert (batch.base_offset, batch.record_count) == (0, 1)


def test_record_batch_over_message_max_bytes_is_rejected(broker, topic):
    create_topic(broker.bootstrap, topic, config={"max.message.bytes": "100000"})
    errors = []
    producer = Producer({"bootstrap.servers": broker.bootstrap, "message.max.bytes": 1_000_000,
                         "compression.type": "none"})
    producer.produce(topic, b"x" * 200_000, partition=0, on_delivery=lambda err, msg: errors.append(err))
    assert producer.flush(15) == 0
    [err] = errors
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err
    assert watermarks(broker.bootstrap, topic, 0) == (0, 0)
    roundtrip(broker.bootstrap, topic, [Rec(b"y" * 90_000, partition=0)])
