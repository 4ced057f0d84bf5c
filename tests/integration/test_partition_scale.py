"""6,000 partitions on one broker: metadata work never stalls other clients, and every
partition comes back with its data after a clean restart and after kill -9.

"Never stalls" is shown by order, not by clock: requests sent while a CreateTopics (or a
DeleteTopics) of 6,000 partitions is known to be in progress are answered before it is.
"""

from __future__ import annotations

import select

import pytest
from confluent_kafka import Producer

from strom.client import Connection
from strom.protocol.messages import encode_request
from strom.protocol.records import build_batch, iter_records
from strom.testing import BrokerProcess, unique_name, wait_for

PRODUCE, FETCH, LIST_OFFSETS, METADATA, API_VERSIONS, CREATE_TOPICS, DELETE_TOPICS = 0, 1, 2, 3, 18, 19, 20
PARTITIONS = 6_000
# A poll that reads every partition (or lists their directories) costs the test and the broker
# a good part of a second of CPU: once a second, not twenty times.
WIDE_POLL = 1.0

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(overrides={"max.broker.partitions": str(PARTITIONS + 1000)}) as b:
        yield b


def connect(broker: BrokerProcess) -> Connection:
    return Connection("127.0.0.1", broker.port, timeout_s=600)


def send(conn: Connection, api_key: int, version: int, fields: dict) -> int:
    """Send without waiting for the answer; returns the correlation id."""
    conn.correlation += 1
    conn.send_raw(encode_request(api_key, version, fields, conn.correlation, conn.client_id))
    return conn.correlation


def unanswered(conn: Connection) -> bool:
    return not select.select([conn.sock], [], [], 0)[0]


def answered_meanwhile(broker: BrokerProcess, slow: Connection, started_line: str, probe_topic: str) -> None:
    """Once the broker's log shows the slow request at work: ApiVersions, Metadata and an
    acks=1 produce from another client are answered while `slow` still waits for its answer."""
    wait_for(lambda: started_line in broker.log_text(), 300, interval=0.01)
    with connect(broker) as other:
        versions = other.call(API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
        assert versions.error_code == 0
        metadata = other.call(METADATA, 12, {"topics": [{"name": probe_topic}], "allow_auto_topic_creation": False,
                                             "include_topic_authorized_operations": False})
        assert metadata.topics[0].error_code == 0
        produced = other.call(PRODUCE, 9, {"transactional_id": None, "acks": 1, "timeout_ms": 5000, "topic_data": [
            {"name": probe_topic, "partition_data": [{"index": 0, "records": build_batch([(None, b"meanwhile")])}]}]})
        assert produced.responses[0].partition_responses[0].error_code == 0
    assert unanswered(slow), "the slow request was answered before the requests sent after it"


def create(conn: Connection, name: str, partitions: int) -> None:
    body = conn.call(CREATE_TOPICS, 5, {"topics": [{"name": name, "num_partitions": partitions,
                                                     "replication_factor": 1, "assignments": [], "configs": []}],
                                         "timeout_ms": 30_000, "validate_only": False})
    assert body.topics[0].error_code == 0, body


def end_offsets(conn: Connection, topic: str) -> dict[int, int]:
    body = conn.call(LIST_OFFSETS, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": topic, "partitions": [{"partition_index": p, "current_leader_epoch": -1, "timestamp": -1}
                                       for p in range(PARTITIONS)]}]})
    parts = body.topics[0].partitions
    assert all(p.error_code == 0 for p in parts), [p for p in parts if p.error_code][:3]
    return {p.partition_index: p.offset for p in parts}


def assert_ends(ends: dict[int, int], when: str) -> None:
    """One record in every partition; names the ones that differ, not 20,000 lines of diff."""
    wrong = {p: end for p, end in ends.items() if end != 1}
    assert len(ends) == PARTITIONS and not wrong, f"{when}: {len(wrong)} partitions end elsewhere: {dict(list(wrong.items())[:10])}"


def values(conn: Connection, topic: str) -> dict[int, list[bytes]]:
    """Every partition's records, read with one Fetch of all of them."""
    body = conn.call(FETCH, 12, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 64 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "topics": [{"topic": topic, "partitions": [
            {"partition": p, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
             "log_start_offset": -1, "partition_max_bytes": 4096} for p in range(PARTITIONS)]}],
        "forgotten_topics_data": [], "rack_id": ""})
    out = {}
    for p in body.responses[0].partitions:
        assert p.error_code == 0, p
        out[p.partition_index] = [r.value for r in iter_records(p.records or b"")]
    return out


def test_requests_sent_during_wide_metadata_work_are_answered_first_and_data_survives_restarts(broker):
    probe, wide = unique_name("probe"), unique_name("wide")
    with connect(broker) as conn:
        create(conn, probe, 1)
        # CreateTopics of every partition: other clients are served while it runs.
        slow = connect(broker)
        correlation = send(slow, CREATE_TOPICS, 5, {"topics": [{"name": wide, "num_partitions": PARTITIONS,
                                                                "replication_factor": 1, "assignments": [],
                                                                "configs": []}],
                                                    "timeout_ms": 600_000, "validate_only": False})
        answered_meanwhile(broker, slow, f"new topic {wide} with {PARTITIONS} partitions", probe)
        frame = slow.read_frame()
        slow.close()
        assert frame is not None and int.from_bytes(frame[:4], "big") == correlation
        wait_for(lambda: all(v == 0 for v in end_offsets(conn, wide).values()), 120, interval=WIDE_POLL)

        # One record in each partition, acks=all.
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 20})
        failed = []

        def delivered(err, msg) -> None:
            if err is not None:
                failed.append((msg.partition(), err))

        for p in range(PARTITIONS):
            producer.produce(wide, b"value-%d" % p, partition=p, on_delivery=delivered)
            if p % 5000 == 4999:
                producer.poll(0)
        assert producer.flush(120) == 0
        producer.close()
        assert not failed, failed[:5]
        expected = {p: [b"value-%d" % p] for p in range(PARTITIONS)}
        assert_ends(end_offsets(conn, wide), "after producing")

    for how, restart in (("a clean", lambda: broker.stop(timeout=300)), ("a kill -9", broker.kill)):
        assert restart() in (None, 0)
        broker.start(timeout=300)
        with connect(broker) as conn:
            wait_for(lambda conn=conn: _led(conn, wide), 120, interval=WIDE_POLL)
            assert_ends(end_offsets(conn, wide), f"after {how} restart")
            assert values(conn, wide) == expected

    # DeleteTopics of them all: others are served meanwhile, and the topic is gone for good.
    with connect(broker) as conn:
        slow = connect(broker)
        send(slow, DELETE_TOPICS, 4, {"topic_names": [wide], "timeout_ms": 600_000})
        answered_meanwhile(broker, slow, f"deleting topic {wide}", probe)
        assert slow.read_frame() is not None
        slow.close()
        wait_for(lambda: not list((broker.data_dir / "logs").glob(f"{wide}-*")), 300, interval=WIDE_POLL)
    assert broker.stop(timeout=300) == 0
    broker.start(timeout=300)
    with connect(broker) as conn:
        body = conn.call(METADATA, 12, {"topics": [{"name": wide}], "allow_auto_topic_creation": False,
                                        "include_topic_authorized_operations": False})
        assert body.topics[0].error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION


def _led(conn: Connection, topic: str) -> bool:
    body = conn.call(METADATA, 12, {"topics": [{"name": topic}], "allow_auto_topic_creation": False,
                                    "include_topic_authorized_operations": False})
    parts = body.topics[0].partitions
    return len(parts) == PARTITIONS and all(p.leader_id >= 0 for p in parts)
