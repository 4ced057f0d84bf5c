"""Bad input over raw sockets against a real broker: Kafka's error codes or a closed
connection, one log line, and the broker keeps serving everyone else."""

from __future__ import annotations

import struct

import pytest

from strom.protocol import messages
from strom.protocol.records import build_batch
from strom.testing import BrokerProcess, RawClient, wait_for

PRODUCE, LIST_OFFSETS, METADATA, API_VERSIONS, CREATE_TOPICS = 0, 2, 3, 18, 19

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(overrides={"auto.create.topics.enable": "false",
                                  "message.max.bytes": "10000",
                                  "socket.request.max.bytes": "200000"}) as b:
        yield b


def _create_topic(client: RawClient, name: str) -> int:
    body = client.call(CREATE_TOPICS, 5, {"topics": [{"name": name, "num_partitions": 1,
                                                      "replication_factor": 1, "assignments": [],
                                                      "configs": []}], "timeout_ms": 5000})
    return body.topics[0].error_code


def _produce(client: RawClient, topic: str, records: bytes) -> tuple[int, int]:
    body = client.call(PRODUCE, 9, {"transactional_id": None, "acks": -1, "timeout_ms": 5000,
                                     "topic_data": [{"name": topic, "partition_data": [
                                         {"index": 0, "records": records}]}]})
    p = body.responses[0].partition_responses[0]
    return p.error_code, p.base_offset


def _latest(client: RawClient, topic: str) -> int:
    body = client.call(LIST_OFFSETS, 5, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": topic, "partitions": [{"partition_index": 0, "current_leader_epoch": -1,
                                        "timestamp": -1}]}]})
    return body.topics[0].partitions[0].offset


def _still_serving(broker: BrokerProcess) -> None:
    client = RawClient(broker)
    body = client.call(API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
    assert body.error_code == 0 and any(k.api_key == PRODUCE for k in body.api_keys)
    client.close()


def test_api_versions_v4_is_served_directly(broker):
    """kafka-python 3 opens with v4 (Kafka 3.9's newest): no v0 fallback round trip needed."""
    client = RawClient(broker)
    body = client.call(API_VERSIONS, 4, {"client_software_name": "t", "client_software_version": "1"})
    assert body.error_code == 0
    assert [(k.min_version, k.max_version) for k in body.api_keys if k.api_key == API_VERSIONS] == [(0, 4)]
    client.close()


def test_garbage_bytes_close_the_connection(broker):
    client = RawClient(broker)
    client.send_raw(struct.pack(">i", 12) + b"\xff" * 12)
    assert client.is_closed()
    _still_serving(broker)


def test_frame_longer_than_allowed(broker):
    client = RawClient(broker)
    client.send_raw(struct.pack(">i", 300000))
    assert client.is_closed()
    wait_for(lambda: "exceeds socket.request.max.bytes" in broker.log_text(), 10, what="the log line")
    _still_serving(broker)


def test_unknown_api_key_closes(broker):
    client = RawClient(broker)
    client.send_raw(struct.pack(">ihhih", 10, 4242, 0, 1, -1))
    assert client.is_closed()
    _still_serving(broker)


def test_unsupported_api_versions_version_answered_at_v0(broker):
    client = RawClient(broker)
    client.send_raw(struct.pack(">ihhihb", 11, API_VERSIONS, 99, 5, -1, 0))
    payload = client.read_frame()
    correlation, body = messages.decode_response(API_VERSIONS, 0, payload)
    assert correlation == 5 and body.error_code == 35  # UNSUPPORTED_VERSION
    assert {k.api_key for k in body.api_keys} >= {PRODUCE, METADATA, API_VERSIONS}


def test_unsupported_version_of_other_api_closes(broker):
    client = RawClient(broker)
    # DescribeAcls v0, which Kafka 4.0 dropped (KIP-896): the codec knows it, the broker does not serve it.
    client.send_raw(messages.encode_request(29, 0, {
        "resource_type_filter": 1, "resource_name_filter": None, "principal_filter": None,
        "host_filter": None, "operation": 1, "permission_type": 1}))
    assert client.is_closed()
    _still_serving(broker)


def test_truncated_request_closes(broker):
    client = RawClient(broker)
    raw = messages.encode_request(CREATE_TOPICS, 5, {"topics": [
        {"name": "truncated", "num_partitions": 1, "replication_factor": 1, "assignments": [],
         "configs": []}], "timeout_ms": 1000})
    body = raw[4:-8]
    client.send_raw(struct.pack(">i", len(body)) + body)
    assert client.is_closed()
    _still_serving(broker)


def test_crc_mismatch_and_oversize_leave_the_log_untouched(broker):
    client = RawClient(broker)
    assert _create_topic(client, "bad-batches") == 0
    assert _produce(client, "bad-batches", build_batch([(b"k", b"v")])) == (0, 0)
    corrupt = bytearray(build_batch([(b"k", b"v")] * 3))
    corrupt[-1] ^= 0x55
    assert _produce(client, "bad-batches", bytes(corrupt))[0] == 2  # CORRUPT_MESSAGE
    big = build_batch([(None, b"x" * 20000)])
    assert _produce(client, "bad-batches", big)[0] == 10  # MESSAGE_TOO_LARGE
    assert _latest(client, "bad-batches") == 1
    assert _produce(client, "bad-batches", build_batch([(b"k", b"v")] * 2)) == (0, 1)
    assert _latest(client, "bad-batches") == 3
    # Logged before the answer was sent, but read from the broker's stderr by another thread.
    wait_for(lambda: "CORRUPT_MESSAGE" in broker.log_text(), 10, what="the rejection's log line")


def test_invalid_topic_names(broker):
    client = RawClient(broker)
    assert _create_topic(client, "bad/name") == 17
    assert _create_topic(client, "x" * 250) == 17
    assert _create_topic(client, "..") == 17
    body = client.call(METADATA, 12, {"topics": [{"name": "bad name!"}],
                                       "allow_auto_topic_creation": True})
    assert body.topics[0].error_code == 17


def test_produce_to_missing_topic_without_auto_create(broker):
    client = RawClient(broker)
    assert _produce(client, "does-not-exist", build_batch([(b"k", b"v")]))[0] == 3
    body = client.call(METADATA, 12, {"topics": [{"name": "does-not-exist"}],
                                       "allow_auto_topic_creation": True})
    assert body.topics[0].error_code == 3


def test_failed_acks0_produce_closes_the_connection(broker):
    client = RawClient(broker)
    client.send_raw(messages.encode_request(PRODUCE, 9, {
        "transactional_id": None, "acks": 0, "timeout_ms": 5000,
        "topic_data": [{"name": "no-such-topic-acks0", "partition_data": [
            {"index": 0, "records": build_batch([(b"k", b"v")])}]}]}))
    assert client.is_closed()
    _still_serving(broker)


def test_clients_cannot_append_to_internal_topics(broker):
    """A forged record in __consumer_offsets would rewrite a group's committed offsets; only
    the coordinators write there."""
    client = RawClient(broker)
    try:
        find = client.call(10, 3, {"key": "any-group", "key_type": 0})  # creates __consumer_offsets
        assert find.error_code == 0
        body = client.call(PRODUCE, 9, {"transactional_id": None, "acks": 1, "timeout_ms": 5000,
                                         "topic_data": [{"name": "__consumer_offsets", "partition_data": [
                                             {"index": 0, "records": build_batch([(b"k", b"v")])}]}]})
        answer = body.responses[0].partition_responses[0]
        assert answer.error_code == 17  # INVALID_TOPIC_EXCEPTION
        assert "internal topic" in (answer.error_message or "")
    finally:
        client.close()
    _still_serving(broker)
