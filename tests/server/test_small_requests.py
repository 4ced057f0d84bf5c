"""Small requests on one connection: answers to pipelined requests (written together when they
queue up) come back complete and in order, also around a fetch answered from a file; and a
fetch waiting in the purgatory is answered when a record arrives, not when its wait ends."""

from __future__ import annotations

import socket

import pytest

from strom.protocol import messages
from strom.protocol.frames import FrameDecoder
from strom.protocol.records import build_batch, iter_records, scan_valid_prefix
from strom.testing import BrokerProcess, RawClient, metric_value, scrape, unique_name, wait_for

PRODUCE, FETCH, CREATE_TOPICS = 0, 1, 19
LONG_POLL_MS = 120_000  # far beyond the test's own timeout: only a wake-up can answer in time

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def broker(request):
    with BrokerProcess(env={"STROM_EVENT_LOOP": request.param}, overrides={"metrics.port": "0"}) as b:
        yield b


def _topic(broker) -> str:
    name = unique_name("small")
    client = RawClient(broker)
    client.call(CREATE_TOPICS, 5, {"topics": [{"name": name, "num_partitions": 1, "replication_factor": 1,
                                               "assignments": [], "configs": []}], "timeout_ms": 10000})
    client.close()
    return name


def _produce(topic: str, value: bytes, correlation_id: int, version: int = 9, acks: int = 1) -> bytes:
    return messages.encode_request(PRODUCE, version, {
        "transactional_id": None, "acks": acks, "timeout_ms": 10000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": build_batch([(None, value)])}]}]},
        correlation_id=correlation_id)


def _fetch(topic: str, offset: int, correlation_id: int, max_wait_ms: int) -> bytes:
    return messages.encode_request(FETCH, 12, {
        "replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": 1, "max_bytes": 1 << 20,
        "isolation_level": 0, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": topic, "partitions": [{"partition": 0, "fetch_offset": offset,
                                                    "partition_max_bytes": 1 << 20}]}],
        "forgotten_topics_data": [], "rack_id": ""}, correlation_id=correlation_id)


def _read_frames(sock: socket.socket, count: int, timeout: float = 30.0) -> list[bytes]:
    decoder, frames = FrameDecoder(1 << 26), []
    sock.settimeout(timeout)
    while len(frames) < count:
        chunk = sock.recv(1 << 16)
        assert chunk, "the broker closed the connection"
        frames += [bytes(f) for f in decoder.feed(chunk)]
    return frames


def _values(fetch_response) -> list[bytes]:
    records = bytes(fetch_response.responses[0].partitions[0].records or b"")
    batches, _ = scan_valid_prefix(records)
    return [r.value for pos, _ in batches for r in iter_records(records, pos)]


def test_pipelined_produces_are_answered_in_order_around_a_fetch(broker):
    """Two hundred single-record produces in one write (they queue on the connection and are
    answered together), a fetch in the middle of them, then more produces."""
    topic = _topic(broker)
    first, rest = 100, 100
    burst = b"".join(_produce(topic, b"v%d" % i, correlation_id=i) for i in range(first))
    burst += _fetch(topic, 0, correlation_id=first, max_wait_ms=0)
    burst += b"".join(_produce(topic, b"v%d" % i, correlation_id=i + 1, version=i % 5 + 8)
                      for i in range(first, first + rest))
    with socket.create_connection(("127.0.0.1", broker.port)) as sock:
        sock.sendall(burst)
        frames = _read_frames(sock, first + rest + 1)
    offsets = []
    for i, frame in enumerate(frames):
        if i == first:
            correlation, fetched = messages.decode_response(FETCH, 12, frame)
            assert correlation == first
            # The fetch sees exactly the records produced before it on this connection.
            assert _values(fetched) == [b"v%d" % n for n in range(first)]
            continue
        version = 9 if i < first else (i - 1) % 5 + 8
        correlation, body = messages.decode_response(PRODUCE, version, frame)
        assert correlation == i
        partition = body.responses[0].partition_responses[0]
        assert partition.error_code == 0
        offsets.append(partition.base_offset)
    assert offsets == list(range(first + rest))


def test_a_waiting_fetch_is_answered_when_a_record_arrives(broker):
    topic = _topic(broker)
    url = broker.metrics_url
    with socket.create_connection(("127.0.0.1", broker.port)) as consumer:
        consumer.sendall(_fetch(topic, 0, correlation_id=7, max_wait_ms=LONG_POLL_MS))
        wait_for(lambda: metric_value(scrape(url), "strom_purgatory_size", operation="Fetch") >= 1,
                 timeout=20, what="the fetch waiting in the purgatory")
        producer = RawClient(broker)
        body = producer.call(PRODUCE, 9, {"transactional_id": None, "acks": 1, "timeout_ms": 10000,
                                          "topic_data": [{"name": topic, "partition_data": [
                                              {"index": 0, "records": build_batch([(b"k", b"hello")])}]}]})
        producer.close()
        assert body.responses[0].partition_responses[0].error_code == 0
        # Within the socket's timeout, a quarter of the fetch's wait: only the wake-up answers.
        (frame,) = _read_frames(consumer, 1, timeout=30)
    correlation, fetched = messages.decode_response(FETCH, 12, frame)
    assert correlation == 7
    assert _values(fetched) == [b"hello"]


def test_single_partition_answers_agree_with_the_general_ones(broker):
    """What the one-partition request skips (grouping, ordering, the acks=all wait that one
    replica needs not) against requests that take the general way, on one connection: acks=all
    and acks=1, a request naming two partitions (one missing, answered in the order asked),
    invalid acks, a corrupt batch between good ones, and Produce v13 naming its topic by id."""
    name = unique_name("small")
    client = RawClient(broker)
    created = client.call(CREATE_TOPICS, 7, {"topics": [{"name": name, "num_partitions": 1, "replication_factor": 1,
                                                         "assignments": [], "configs": []}], "timeout_ms": 10000})
    client.close()
    topic_id = created.topics[0].topic_id

    def produce(correlation_id: int, acks: int, partitions: list[tuple[int, bytes]], version: int = 9) -> bytes:
        topic = {"name": name, "topic_id": topic_id,
                 "partition_data": [{"index": i, "records": records} for i, records in partitions]}
        return messages.encode_request(PRODUCE, version, {"transactional_id": None, "acks": acks, "timeout_ms": 10000,
                                                          "topic_data": [topic]}, correlation_id=correlation_id)

    corrupt = bytearray(build_batch([(None, b"bad")]))
    corrupt[-1] ^= 0xFF  # the CRC no longer matches
    burst = [produce(0, -1, [(0, build_batch([(None, b"a")]))]),
             produce(1, 1, [(0, build_batch([(None, b"b")])), (5, build_batch([(None, b"x")]))]),
             produce(2, 2, [(0, build_batch([(None, b"x")]))]),
             produce(3, 1, [(0, bytes(corrupt))]),
             produce(4, -1, [(0, build_batch([(None, b"c")] * 3))], version=13),
             produce(5, 1, [(0, build_batch([(None, b"d")]))])]
    with socket.create_connection(("127.0.0.1", broker.port)) as sock:
        sock.sendall(b"".join(burst))
        frames = _read_frames(sock, len(burst))
    answers = []
    for i, frame in enumerate(frames):
        correlation, body = messages.decode_response(PRODUCE, 13 if i == 4 else 9, frame)
        assert correlation == i
        (topic,) = body.responses
        assert (topic.topic_id if i == 4 else topic.name) == (topic_id if i == 4 else name)
        answers.append([(p.index, p.error_code, p.base_offset) for p in topic.partition_responses])
    unknown, invalid_acks, corrupt_message = 3, 21, 2
    assert answers == [[(0, 0, 0)], [(0, 0, 1), (5, unknown, -1)], [(0, invalid_acks, -1)],
                       [(0, corrupt_message, -1)], [(0, 0, 2)], [(0, 0, 5)]]
