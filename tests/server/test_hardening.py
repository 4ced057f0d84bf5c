"""What a hostile or careless client may not do to a broker: each case gets Kafka's error, the
broker keeps serving normal clients, and nothing acknowledged before is lost."""

from __future__ import annotations

import struct

import pytest
from confluent_kafka import Consumer, TopicPartition
from crc32c import crc32c

from strom.protocol.records import CRC_START, HEADER_SIZE, build_batch
from strom.testing import (
    BrokerProcess,
    RawClient,
    memory_mb,
    produce_acked,
    read_values,
    unique_name,
)

PRODUCE = 0
INVALID_RECORD, CORRUPT_MESSAGE = 87, 2


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(overrides={"num.partitions": "1"}) as b:
        yield b


def reseal(batch: bytearray) -> bytes:
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[CRC_START:])))
    return bytes(batch)


def raw_produce(broker: BrokerProcess, topic: str, records: bytes, version: int = 9):
    with RawClient(broker) as client:
        body = client.call(PRODUCE, version, {
            "transactional_id": None, "acks": -1, "timeout_ms": 10_000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": records}]}]})
    return body.responses[0].partition_responses[0]


# --- item 6: record batches are validated beyond their header -----------------------------------
def test_a_batch_claiming_more_records_than_it_holds_is_refused(broker):
    topic = unique_name("count")
    produce_acked(broker.bootstrap, topic, [b"before"])
    batch = bytearray(build_batch([(b"k", b"one record")]))
    struct.pack_into(">i", batch, 23, 2**31 - 2)  # last offset delta
    struct.pack_into(">i", batch, 57, 2**31 - 1)  # record count
    answer = raw_produce(broker, topic, reseal(batch))
    assert answer.error_code == INVALID_RECORD
    assert "fewer records" in answer.error_message
    assert [(e.batch_index, "fewer records" in e.batch_index_error_message)
            for e in answer.record_errors] == [(1, True)]
    # The log end offset did not move by 2^31: the next record lands at offset 1.
    produce_acked(broker.bootstrap, topic, [b"after"])
    assert read_values(broker.bootstrap, topic, 2) == [b"before", b"after"]


def test_random_record_bytes_with_a_correct_crc_are_refused(broker):
    topic = unique_name("garbage")
    produce_acked(broker.bootstrap, topic, [b"before"])
    batch = bytearray(build_batch([(b"k", b"v" * 50)] * 3))
    batch[HEADER_SIZE:] = bytes(range(256))[: len(batch) - HEADER_SIZE]
    answer = raw_produce(broker, topic, reseal(batch))
    assert answer.error_code == INVALID_RECORD, answer
    # Consumers are not stopped at a poisoned offset: every record they see is readable.
    produce_acked(broker.bootstrap, topic, [b"after"])
    assert read_values(broker.bootstrap, topic, 2) == [b"before", b"after"]


def test_a_torn_record_set_is_corrupt_and_old_produce_versions_get_no_record_errors(broker):
    topic = unique_name("torn")
    produce_acked(broker.bootstrap, topic, [b"before"])
    batch = build_batch([(b"k", b"v")] * 3)
    answer = raw_produce(broker, topic, batch[:-5])
    assert answer.error_code == CORRUPT_MESSAGE
    batch = bytearray(build_batch([(b"k", b"v")]))
    struct.pack_into(">i", batch, 23, 1)
    struct.pack_into(">i", batch, 57, 2)
    answer = raw_produce(broker, topic, reseal(batch), version=7)
    assert answer.error_code == CORRUPT_MESSAGE  # INVALID_RECORD came with v8
    assert read_values(broker.bootstrap, topic, 1) == [b"before"]


# --- items 4 and 7: topics the broker cannot serve, and the internal topics -------------------
def admin(bootstrap: str):
    from confluent_kafka.admin import AdminClient
    return AdminClient({"bootstrap.servers": bootstrap})


def raw_create(broker: BrokerProcess, topic: str, partitions: int):
    # Raw: confluent-kafka refuses 2^31-1 partitions itself, a hostile client does not.
    with RawClient(broker) as client:
        body = client.call(19, 5, {"topics": [{
            "name": topic, "num_partitions": partitions, "replication_factor": 1,
            "assignments": [], "configs": []}], "timeout_ms": 30_000, "validate_only": False})
    return body.topics[0]


@pytest.mark.parametrize("partitions", [100_000, 2**31 - 1])
def test_more_partitions_than_a_broker_may_hold_are_refused(broker, partitions):
    topic = unique_name("served")
    produce_acked(broker.bootstrap, topic, [b"kept"])
    answer = raw_create(broker, unique_name("huge"), partitions)
    assert answer.error_code == 44  # POLICY_VIOLATION
    assert "max.broker.partitions=20000" in answer.error_message
    # Nothing else went offline: the existing topic still takes and serves records.
    produce_acked(broker.bootstrap, topic, [b"more"])
    assert read_values(broker.bootstrap, topic, 2) == [b"kept", b"more"]


def test_growing_a_topic_past_the_limit_is_refused(broker):
    from confluent_kafka.admin import NewPartitions
    topic = unique_name("grow")
    produce_acked(broker.bootstrap, topic, [b"x"])
    client = admin(broker.bootstrap)
    future = client.create_partitions([NewPartitions(topic, 100_000)])[topic]
    with pytest.raises(Exception) as refused:
        future.result(timeout=30)
    assert refused.value.args[0].name() == "POLICY_VIOLATION"


def test_internal_topics_cannot_be_deleted_or_written_by_clients(broker):
    topic = unique_name("offsets")
    produce_acked(broker.bootstrap, topic, [b"a", b"b"])
    group = unique_name("group")
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)
    consumer.close()
    for internal in ("__consumer_offsets",):
        client = admin(broker.bootstrap)
        future = client.delete_topics([internal], operation_timeout=10)[internal]
        with pytest.raises(Exception) as refused:
            future.result(timeout=30)
        assert refused.value.args[0].code() == 17  # INVALID_TOPIC_EXCEPTION
    forged = raw_produce(broker, "__consumer_offsets", build_batch([(b"forged", b"offset")]))
    assert forged.error_code == 17  # INVALID_TOPIC_EXCEPTION
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    committed = consumer.committed([TopicPartition(topic, 0)], timeout=30)
    consumer.close()
    assert committed[0].offset == 2


# --- item 10: one large legal request does not stall everyone else ---------------------------
def test_other_clients_are_answered_while_a_huge_metadata_request_is_worked_on(broker):
    import threading
    import time

    from strom.protocol.messages import encode_request

    names = [{"name": f"no-such-topic-{i:07d}"} for i in range(300_000)]
    request = encode_request(3, 12, {"topics": names, "allow_auto_topic_creation": False,
                                     "include_topic_authorized_operations": False})
    answers: list[float] = []  # when each small request was answered
    big_done = threading.Event()

    def ping() -> None:
        with RawClient(broker) as client:
            while not big_done.is_set():
                client.call(18, 3, {"client_software_name": "t", "client_software_version": "1"})
                answers.append(time.monotonic())

    with RawClient(broker) as big:
        big.sock.settimeout(120)
        pinger = threading.Thread(target=ping)
        pinger.start()
        start = time.monotonic()
        big.send_raw(request)
        try:
            frame = big.read_frame()
        finally:
            end = time.monotonic()
            big_done.set()
            pinger.join(30)
    assert frame is not None and len(frame) > 300_000 * 20  # every topic answered
    # Relative, not a speed limit: while the big request is worked on, the longest wait of a
    # small one is a fraction of it (a blocked loop makes one wait span nearly all of it).
    times = [start] + [t for t in answers if start < t < end] + [end]
    longest_wait = max(b - a for a, b in zip(times, times[1:], strict=False))
    assert longest_wait < 0.5 * (end - start), (longest_wait, end - start, len(times))
    still_serving_client(broker)


def still_serving_client(broker: BrokerProcess) -> None:
    topic = unique_name("alive")
    produce_acked(broker.bootstrap, topic, [b"alive"])
    assert read_values(broker.bootstrap, topic, 1) == [b"alive"]


# --- item 8: dynamic configs within Kafka's ranges ---------------------------------------------
@pytest.mark.parametrize("key,value", [
    ("log.cleaner.threads", "200000"),  # at most doubled per change
    ("log.segment.bytes", str(2**31)),  # a Kafka INT
    ("max.connections", str(2**40)),
    ("log.cleaner.backoff.ms", str(2**70)),  # beyond a Kafka LONG
    ("log.retention.bytes", "lots"),
])
def test_dynamic_broker_configs_out_of_range_are_refused(broker, key, value):
    from confluent_kafka.admin import ConfigResource, ResourceType

    for entity in ("", "0"):  # the cluster-wide default and this broker
        with RawClient(broker) as client:
            body = client.call(44, 1, {"resources": [{
                "resource_type": 4, "resource_name": entity,
                "configs": [{"name": key, "config_operation": 0, "value": value}]}],
                "validate_only": False})
        answer = body.responses[0]
        assert answer.error_code == 40, answer  # INVALID_CONFIG
        assert key in answer.error_message
    client = admin(broker.bootstrap)
    described = client.describe_configs([ConfigResource(ResourceType.BROKER, "0")])
    config = next(iter(described.values())).result(timeout=30)
    assert config[key].value != value
    still_serving_client(broker)


def test_the_broker_restarts_cleanly_after_all_of_the_above(broker):
    topic = unique_name("last")
    produce_acked(broker.bootstrap, topic, [b"acked-%d" % i for i in range(100)])
    broker.stop()
    broker.start()
    assert read_values(broker.bootstrap, topic, 100) == [b"acked-%d" % i for i in range(100)]
    assert "Traceback" not in broker.log_text()


# --- item 2: what all connections' large requests may hold together ----------------------------
def test_large_requests_share_queued_max_request_bytes_and_all_get_answered():
    import socket
    import threading

    from strom.protocol.messages import encode_request

    limits = {"socket.request.max.bytes": str(8 << 20), "queued.max.request.bytes": str(16 << 20)}
    with BrokerProcess(overrides=limits) as broker:
        before = memory_mb(broker.proc.pid)
        # Ten clients announce 8 MiB each and send half: only two frames fit the pool, the
        # other connections are not read (their bytes stay in the kernel, not the broker).
        socks = []
        for _ in range(10):
            s = socket.create_connection(("127.0.0.1", broker.port))
            s.settimeout(2)
            try:
                s.sendall(struct.pack(">i", 8 << 20) + bytes(4 << 20))
            except TimeoutError:
                pass  # a connection the broker does not read: the kernel's buffers are full
            socks.append(s)
        with RawClient(broker) as client:  # small requests go on meanwhile
            assert client.call(18, 3, {"client_software_name": "t",
                                       "client_software_version": "1"}).error_code == 0
        grown = memory_mb(broker.proc.pid) - before
        assert grown < 30, f"RSS grew by {grown:.0f} MB for 10 half-sent 8 MiB frames"
        for s in socks:
            s.close()
        # Large legal requests on six connections at once: each is answered, two at a time.
        request = encode_request(3, 12, {"topics": [{"name": f"t-{i:06d}"} for i in range(180_000)],
                                         "allow_auto_topic_creation": False,
                                         "include_topic_authorized_operations": False})
        assert (4 << 20) < len(request) < (8 << 20)
        answered = []

        def ask() -> None:
            with RawClient(broker) as client:
                client.sock.settimeout(120)
                client.send_raw(request)
                frame = client.read_frame()
                answered.append(frame is not None and len(frame) > 180_000 * 10)

        threads = [threading.Thread(target=ask) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert answered == [True] * 6
        still_serving_client(broker)
