"""The hand-written Metadata request reader and response writer against the codec tables
(kafka-python's, generated from Kafka's schemas): the same bytes, every version."""

from __future__ import annotations

import random
import uuid

import pytest

from strom.protocol import messages
from strom.protocol.metadata import (
    NOT_REQUESTED,
    MetadataResponseWriter,
    PartitionEntry,
    parse_metadata_request,
)
from strom.protocol.produce import MalformedRequest

VERSIONS = range(0, 14)


def _random_topics(rng: random.Random, version: int) -> list[dict]:
    topics = []
    for i in range(rng.randrange(0, 6)):
        partitions = []
        for p in range(rng.randrange(0, 4)):
            replicas = rng.sample(range(5), rng.randrange(0, 4))
            partitions.append({"error_code": rng.choice((0, 5)), "partition_index": p,
                               "leader_id": rng.choice((-1, 0, 3)), "leader_epoch": rng.randrange(-1, 9),
                               "replica_nodes": replicas, "isr_nodes": replicas[:1],
                               "offline_replicas": replicas[1:2]})
        name = rng.choice((f"topic-{i}", "ünïcødé", "")) if version < 12 or rng.random() < 0.8 else None
        topics.append({"error_code": rng.choice((0, 3, 17)), "name": name,
                       "topic_id": uuid.UUID(int=rng.getrandbits(128)) if rng.random() < 0.7 else None,
                       "is_internal": rng.random() < 0.2, "partitions": partitions,
                       "authorized_operations": rng.choice((None, {3, 4})) })
    return topics


def _ops(ops) -> int:
    return NOT_REQUESTED if ops is None else sum(1 << op for op in ops)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_writer_lays_out_what_the_codec_does(version):
    rng = random.Random(version)
    for _ in range(20):
        topics = _random_topics(rng, version)
        brokers = [(b, f"host-{b}", 9092 + b, rng.choice((None, "rack-a"))) for b in range(rng.randrange(0, 3))]
        cluster_ops = rng.choice((None, {1, 2}))
        codec = messages.encode_body(3, version, {
            "throttle_time_ms": 7, "brokers": [{"node_id": n, "host": h, "port": p, "rack": r}
                                               for n, h, p, r in brokers],
            "cluster_id": "cluster-x", "controller_id": 2, "topics": topics,
            "authorized_operations": cluster_ops, "error_code": 0})
        writer = MetadataResponseWriter(version)
        for t in topics:
            writer.topic(t["error_code"], t["name"], t["topic_id"], t["is_internal"],
                         (PartitionEntry(p["error_code"], p["partition_index"], p["leader_id"], p["leader_epoch"],
                                         p["replica_nodes"], p["isr_nodes"], p["offline_replicas"])
                          for p in t["partitions"]),
                         _ops(t["authorized_operations"]), len(t["partitions"]))
        mine = b"".join(writer.parts(brokers, "cluster-x", 2, _ops(cluster_ops), throttle_time_ms=7))
        assert mine == bytes(codec)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_reader_reads_what_the_codec_writes(version):
    rng = random.Random(100 + version)
    for _ in range(20):
        null = version >= 1 and rng.random() < 0.2
        topics = None if null else [
            {"topic_id": uuid.UUID(int=rng.getrandbits(128)) if version >= 10 and rng.random() < 0.5 else None,
             "name": rng.choice(("a", "topic-ü", "x" * 300)) if version < 10 or rng.random() < 0.8 else None}
            for _ in range(rng.randrange(0, 5))]
        fields = {"topics": topics, "allow_auto_topic_creation": rng.random() < 0.5,
                  "include_cluster_authorized_operations": rng.random() < 0.5,
                  "include_topic_authorized_operations": rng.random() < 0.5}
        frame = messages.encode_request(3, version, fields)
        request = messages.parse_request(memoryview(frame)[4:]).body
        body = messages.build(messages.REQUESTS[3], version, fields).encode(version=version)
        codec = messages.REQUESTS[3].decode(memoryview(bytes(body)), version=version)
        expected = None if codec.topics is None or (version == 0 and not codec.topics) else [
            (t.topic_id if version >= 10 and t.topic_id != uuid.UUID(int=0) else None, t.name) for t in codec.topics]
        assert (None if request.all_topics else list(request.topics())) == expected
        assert request.allow_auto_topic_creation == (codec.allow_auto_topic_creation if version >= 4 else True)
        if version >= 8:
            assert request.include_topic_authorized_operations == codec.include_topic_authorized_operations


@pytest.mark.parametrize("version", (1, 9, 12))
def test_a_cut_or_lying_request_is_malformed(version):
    fields = {"topics": [{"topic_id": None, "name": "abcdef"}], "allow_auto_topic_creation": True,
              "include_cluster_authorized_operations": False, "include_topic_authorized_operations": False}
    body = messages.build(messages.REQUESTS[3], version, fields).encode(version=version)
    for cut in range(1, len(body)):
        with pytest.raises(MalformedRequest):
            parse_metadata_request(bytes(body[:cut]), 0, version)
    bad = bytearray(body)
    bad[bad.index(b"abcdef")] = 0xFF  # not UTF-8
    with pytest.raises(MalformedRequest):
        parse_metadata_request(bytes(bad), 0, version)
    assert list(parse_metadata_request(bytes(body) + b"extra", 0, version).topics()) == [(None, "abcdef")]


@pytest.mark.parametrize("version", VERSIONS)
def test_an_undescribed_topic_written_at_once_is_the_same_entry(version):
    names = ["t", "ü" * 200, ""] + ([None] if version >= 10 else [])
    fast, slow = MetadataResponseWriter(version), MetadataResponseWriter(version)
    for name in names:
        fast.error(3, name)
        slow.topic(3, name)
    assert b"".join(fast.parts([], None, -1)) == b"".join(slow.parts([], None, -1))


def test_describe_topic_partitions_requests_read_as_the_codec_reads_them():
    from strom.protocol.metadata import parse_describe_topic_partitions_request

    rng = random.Random(7)
    for _ in range(30):
        names = [rng.choice(("a", "ü" * 100, f"t-{rng.randrange(9)}")) for _ in range(rng.randrange(0, 5))]
        cursor = rng.choice((None, {"topic_name": "c", "partition_index": rng.choice((0, 7, 1 << 30))}))
        fields = {"topics": [{"name": n} for n in names], "response_partition_limit": rng.randrange(1, 3000),
                  "cursor": cursor}
        body = bytes(messages.build(messages.REQUESTS[75], 0, fields).encode(version=0))
        request = parse_describe_topic_partitions_request(body, 0, 0)
        assert list(request.names()) == names
        assert request.response_partition_limit == fields["response_partition_limit"]
        assert request.cursor == (None if cursor is None else (cursor["topic_name"], cursor["partition_index"]))
        for cut in range(1, len(body), 3):
            with pytest.raises(MalformedRequest):
                parse_describe_topic_partitions_request(body[:cut], 0, 0)


def test_a_streamed_response_is_what_the_codec_encodes():
    rng = random.Random(8)
    for _ in range(20):
        topics = [{"error_code": rng.choice((0, 3)), "name": f"t{i}", "topic_id": uuid.UUID(int=i + 1),
                   "is_internal": False, "topic_authorized_operations": -(2**31), "partitions": [
                       {"error_code": 0, "partition_index": p, "leader_id": 1, "leader_epoch": 3,
                        "replica_nodes": [1, 2], "isr_nodes": [1], "eligible_leader_replicas": None,
                        "last_known_elr": None, "offline_replicas": []} for p in range(rng.randrange(3))]}
                  for i in range(rng.randrange(0, 4))]
        cursor = rng.choice((None, {"topic_name": "n", "partition_index": 4}))
        streamed = messages.StreamedResponse(75, 0, "topics")
        for t in topics:
            streamed.add(t)
        mine = b"".join(streamed.parts({"throttle_time_ms": 9, "next_cursor": cursor}))
        assert mine == bytes(messages.encode_body(75, 0, {"throttle_time_ms": 9, "topics": topics,
                                                          "next_cursor": cursor}))


def test_an_undescribed_topic_of_describe_topic_partitions_is_the_codecs_entry():
    from strom.protocol.metadata import undescribed_topic_entry

    for code, name in ((3, "t"), (29, "ü" * 300), (42, None)):
        codec, mine = messages.StreamedResponse(75, 0, "topics"), messages.StreamedResponse(75, 0, "topics")
        codec.add({"error_code": code, "name": name, "is_internal": False, "partitions": [], "topic_id": None})
        mine.add_encoded(undescribed_topic_entry(code, name))
        assert codec.items == mine.items
