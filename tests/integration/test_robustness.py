"""The raw socket: peers that misbehave (garbage, unknown APIs, resets mid-response) are dropped
as Kafka drops them, with no error logged and everyone else still served; and requests in shapes
no client library here sends."""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path

import pytest

from strom.protocol import messages
from strom.testing import BrokerProcess, create_topic, unique_name, wait_for

from .conftest import Rec, ck_produce, roundtrip, stored_batches, watermarks, wire_call

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["asyncio"])
def lone_broker(request):
    """A broker of the test's own, so its log holds only what the test caused; on the event loop
    the test's parameter names (asyncio unless the test parametrizes `lone_broker`)."""
    with BrokerProcess(overrides={"socket.request.max.bytes": "1048576"},
                       env={"STROM_EVENT_LOOP": request.param}) as proc:
        yield proc


def connect(proc: BrokerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proc.port), timeout=5)


def closed_by_broker(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def open_sockets(proc: BrokerProcess) -> int:
    """How many sockets the broker process holds open (listeners and connections)."""
    count = 0
    for fd in Path(f"/proc/{proc.proc.pid}/fd").iterdir():
        try:
            count += os.readlink(fd).startswith("socket:")
        except FileNotFoundError:  # closed while we looked
            pass
    return count


def assert_serving_and_quiet(proc: BrokerProcess) -> None:
    probe = unique_name("probe")
    create_topic(proc.bootstrap, probe)
    roundtrip(proc.bootstrap, probe, [Rec(b"still here", partition=0)])
    text = proc.log_text()
    assert "Traceback" not in text and " ERROR " not in text, text[-3000:]


@pytest.mark.parametrize("payload", [
    struct.pack(">i", 12) + os.urandom(12),  # a frame of garbage
    struct.pack(">i", 6) + struct.pack(">hhh", 999, 0, 0),  # an api key Kafka does not have
    struct.pack(">i", 8) + struct.pack(">hhi", 0, 99, 1),  # Produce v99
    struct.pack(">i", -5),  # a negative size
    struct.pack(">i", 2 << 20) + b"\0" * 64,  # over socket.request.max.bytes
], ids=["garbage", "unknown-api-key", "produce-v99", "negative-size", "too-large"])  # the same in every worker
def test_bad_frames_close_the_connection(lone_broker, payload):
    with connect(lone_broker) as sock:
        sock.sendall(payload)
        assert closed_by_broker(sock)
    assert_serving_and_quiet(lone_broker)


def test_unknown_api_versions_version_is_answered_at_v0(lone_broker):
    # A header v2 (flexible) of ApiVersions v99, as a client newer than the broker sends.
    header = struct.pack(">hhih", 18, 99, 42, 1) + b"c" + b"\x00"
    with connect(lone_broker) as sock:
        sock.sendall(struct.pack(">i", len(header)) + header)
        reader = sock.makefile("rb")
        (size,) = struct.unpack(">i", reader.read(4))
        correlation_id, body = messages.decode_response(18, 0, reader.read(size))
    assert correlation_id == 42 and body.error_code == 35  # UNSUPPORTED_VERSION
    assert {k.api_key for k in body.api_keys} >= {0, 1, 2, 3, 18, 19, 20}


@pytest.mark.parametrize("lone_broker", ["asyncio", "uvloop"], indirect=True)
@pytest.mark.parametrize("read_first", [False, True])
def test_client_resetting_mid_fetch(lone_broker, topic, read_first):
    create_topic(lone_broker.bootstrap, topic)
    ck_produce(lone_broker.bootstrap, topic, [Rec(os.urandom(400_000), partition=0) for _ in range(40)],
               **{"linger.ms": 0})
    before = open_sockets(lone_broker)
    for _ in range(4):
        sock = connect(lone_broker)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(messages.encode_request(1, 4, {
            "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 64 << 20, "isolation_level": 0,
            "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 64 << 20}]}]}))
        if read_first:
            sock.recv(100)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # RST while the broker streams a 16 MB response
    # The broker has dealt with the resets once it has closed those connections.
    wait_for(lambda: open_sockets(lone_broker) <= before, timeout=60, what="the reset connections closed")
    assert watermarks(lone_broker.bootstrap, topic, 0) == (0, 40)
    assert sum(b.record_count for b in stored_batches(lone_broker.bootstrap, topic, 0)) == 40
    if lone_broker.env["STROM_EVENT_LOOP"] == "asyncio":
        # One peer going away says nothing about the event loop: zero-copy sends stay on.
        assert "no native sendfile" not in lone_broker.log_text()
    assert_serving_and_quiet(lone_broker)


def test_list_offsets_with_a_partition_twice_is_invalid(lone_broker, topic):
    create_topic(lone_broker.bootstrap, topic, partitions=2)
    ck_produce(lone_broker.bootstrap, topic, [Rec(b"x", partition=0)])
    partitions = [{"partition_index": p, "timestamp": -1, "current_leader_epoch": -1} for p in (0, 1, 0)]
    body = wire_call(lone_broker.bootstrap, 2, 4, {"replica_id": -1, "isolation_level": 0,
                                                   "topics": [{"name": topic, "partitions": partitions}]})
    assert [(p.partition_index, p.error_code, p.offset) for p in body.topics[0].partitions] == [
        (0, 42, -1), (1, 0, 0), (0, 42, -1)]  # INVALID_REQUEST for the duplicate, as Kafka


@pytest.mark.parametrize("version", [0, 3, 4])
def test_find_coordinator_names_this_broker(lone_broker, version):
    """The group coordinator is this broker (the leader of every `__consumer_offsets`
    partition), one key in v0-3, per key in v4."""
    fields = {"key": "g", "key_type": 0} if version < 4 else {"key_type": 0, "coordinator_keys": ["g", "h"]}
    body = wire_call(lone_broker.bootstrap, 10, version, fields)
    if version < 4:
        assert (body.error_code, body.node_id, body.port) == (0, 0, lone_broker.port)
    else:
        assert [(c.key, c.error_code, c.node_id, c.port) for c in body.coordinators] == \
            [("g", 0, 0, lone_broker.port), ("h", 0, 0, lone_broker.port)]


def test_fetch_and_list_offsets_check_the_leader_epoch_the_client_knows(broker, topic):
    """KIP-320: a client behind the leader's epoch is fenced, one ahead of it is told to wait."""
    create_topic(broker.bootstrap, topic)

    def fetch_error(epoch: int) -> int:
        body = wire_call(broker.bootstrap, 1, 12, {
            "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
            "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "current_leader_epoch": epoch, "fetch_offset": 0,
                 "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]})
        return body.responses[0].partitions[0].error_code

    def list_error(epoch: int) -> int:
        body = wire_call(broker.bootstrap, 2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "current_leader_epoch": epoch,
                                            "timestamp": -1}]}]})
        return body.topics[0].partitions[0].error_code

    for call in (fetch_error, list_error):
        assert call(-1) == 0 and call(0) == 0  # no epoch given, or the current one
        assert call(3) == 76  # UNKNOWN_LEADER_EPOCH


def test_describe_producers_lists_a_partitions_idempotent_producers(broker, topic):
    create_topic(broker.bootstrap, topic)
    ck_produce(broker.bootstrap, topic, [Rec(b"a", partition=0), Rec(b"b", partition=0)],
               **{"enable.idempotence": True})
    body = wire_call(broker.bootstrap, 61, 0, {"topics": [{"name": topic, "partition_indexes": [0, 9]}]})
    known, unknown = body.topics[0].partitions
    assert unknown.error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION
    assert known.error_code == 0 and len(known.active_producers) == 1
    producer = known.active_producers[0]
    assert producer.producer_id >= 0 and producer.last_sequence == 1
    assert producer.current_txn_start_offset == -1 and producer.last_timestamp > 0
