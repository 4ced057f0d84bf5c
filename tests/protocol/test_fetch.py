import uuid
from dataclasses import dataclass

import pytest

from strom.protocol import messages
from strom.protocol.fetch import PartitionData, encode_fetch_response
from strom.protocol.records import build_batch


@dataclass
class Region:
    data: bytes

    @property
    def size(self):
        return len(self.data)


@pytest.mark.parametrize("version", [4, 5, 7, 11, 12, 13, 15, 16, 17, 18])
def test_hand_encoded_fetch_response_matches_the_schema(version):
    batch = build_batch([(b"k", b"v")], base_offset=3)
    topics = [("orders", [PartitionData(0, 0, 10, 10, 2, Region(batch)),
                          PartitionData(1, 1, -1, -1, -1, None)]),
              ("empty", [])]
    ids = {"orders": uuid.uuid4(), "empty": uuid.uuid4()}
    parts, size = encode_fetch_response(version, topics, topic_ids=ids)
    body = b"".join(p.data if isinstance(p, Region) else p for p in parts)
    assert len(body) == size
    decoded = messages.RESPONSES[1].decode(body, version=version)
    p0, p1 = decoded.responses[0].partitions
    if version >= 13:  # topic ids (KIP-516)
        assert [t.topic_id for t in decoded.responses] == [ids["orders"], ids["empty"]]
    else:
        assert decoded.responses[0].topic == "orders" and decoded.responses[1].topic == "empty"
    assert (p0.partition_index, p0.high_watermark, bytes(p0.records)) == (0, 10, batch)
    if version >= 5:
        assert p0.log_start_offset == 2
    assert p1.error_code == 1 and not p1.records


def test_diverging_epoch_is_a_tagged_field_of_v12():
    topics = [("orders", [PartitionData(0, 0, 10, 10, 0, None, diverging_epoch=(3, 42)),
                          PartitionData(1, 0, 10, 10, 0, None)])]
    parts, size = encode_fetch_response(12, topics)
    body = b"".join(parts)
    assert len(body) == size
    p0, p1 = messages.RESPONSES[1].decode(body, version=12).responses[0].partitions
    assert (p0.diverging_epoch.epoch, p0.diverging_epoch.end_offset) == (3, 42)
    assert p1.diverging_epoch is None  # absent


def test_current_leader_and_node_endpoints_from_v16():
    """KIP-951: a partition that moved names its leader; the response carries that leader's
    endpoint (tagged fields, beside a diverging epoch on another partition)."""
    topic_id = uuid.uuid4()
    topics = [("orders", [PartitionData(0, 6, -1, -1, -1, None, current_leader=(2, 7)),
                          PartitionData(1, 0, 10, 10, 0, None, diverging_epoch=(3, 42), current_leader=(1, 1))])]
    for version in (15, 16, 17, 18):
        parts, size = encode_fetch_response(version, topics, topic_ids={"orders": topic_id},
                                            node_endpoints=[(2, "broker-2", 9093, None)])
        body = b"".join(parts)
        assert len(body) == size
        decoded = messages.RESPONSES[1].decode(body, version=version)
        p0, p1 = decoded.responses[0].partitions
        assert (p1.diverging_epoch.epoch, p1.diverging_epoch.end_offset) == (3, 42)
        if version < 16:
            assert p0.current_leader is None and not decoded.node_endpoints
            continue
        assert (p0.current_leader.leader_id, p0.current_leader.leader_epoch) == (2, 7)
        assert [(n.node_id, n.host, n.port, n.rack) for n in decoded.node_endpoints] == [(2, "broker-2", 9093, None)]


@pytest.mark.parametrize("version", [4, 12, 14, 15, 17])
@pytest.mark.parametrize("replica", [-1, 3])
def test_the_replica_of_a_fetch_is_read_where_its_version_puts_it(version, replica):
    """ReplicaId is a field up to v14 and in the tagged ReplicaState from v15 (KIP-903): a
    follower is known as one either way (its fetches are replication, not a client's)."""
    from strom.protocol.fetch import fetch_replica_id

    fields = {"max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
              "session_id": 0, "session_epoch": -1, "topics": [], "forgotten_topics_data": [], "rack_id": ""}
    if version >= 15:
        if replica >= 0:
            fields["replica_state"] = {"replica_id": replica, "replica_epoch": 7}
    else:
        fields["replica_id"] = replica
    frame = messages.encode_request(1, version, fields)
    request = messages.parse_request(bytearray(frame[4:]))
    assert fetch_replica_id(request.body) == replica


# --- the compiled parser of the usual Fetch request (_requests.c) -----------------------------

FETCH_FIELDS = {
    "FetchRequest": ("cluster_id", "replica_id", "max_wait_ms", "min_bytes", "max_bytes", "isolation_level",
                     "session_id", "session_epoch", "rack_id"),
    "FetchTopic": ("topic", "topic_id"),
    "FetchPartition": ("partition", "current_leader_epoch", "fetch_offset", "last_fetched_epoch", "log_start_offset",
                       "partition_max_bytes", "replica_directory_id", "high_watermark"),
}


def _fetch_frame(version: int, *, follower: bool = False, tags: bool = False) -> bytearray:
    ids = [uuid.UUID(int=7), uuid.UUID(int=9)]
    partition = {"partition": 3, "current_leader_epoch": 5, "fetch_offset": 1 << 40, "last_fetched_epoch": 4,
                 "log_start_offset": 17, "partition_max_bytes": 1 << 20}
    if tags and version >= 17:
        partition["replica_directory_id"] = uuid.UUID(int=11)
    if tags and version >= 18:
        partition["high_watermark"] = 1 << 39
    fields = {"max_wait_ms": 500, "min_bytes": 1, "max_bytes": 50 << 20, "isolation_level": 1, "session_id": 12,
              "session_epoch": 3, "rack_id": "rack-ä",
              "topics": [{"topic": "orders", "topic_id": ids[0], "partitions": [partition, {**partition, "partition": 4}]},
                         {"topic": "ä" * 70, "topic_id": ids[1], "partitions": []}],
              "forgotten_topics_data": [{"topic": "gone", "topic_id": ids[1], "partitions": [1, 2, 300]}]}
    if version >= 15:
        if follower:
            fields["replica_state"] = {"replica_id": 2, "replica_epoch": 8}
    else:
        fields["replica_id"] = 2 if follower else -1
    if tags and version >= 12:
        fields["cluster_id"] = "cluster-1"
    return bytearray(messages.encode_request(1, version, fields, correlation_id=41)[4:])


def _same_fetch(compiled, codec) -> None:
    assert compiled.header == codec.header and compiled.size == codec.size
    body, want = compiled.body, codec.body

    def same(got, expected, kind):
        for field in FETCH_FIELDS[kind]:
            assert getattr(got, field) == getattr(expected, field, None), (kind, field)

    same(body, want, "FetchRequest")
    state, want_state = body.replica_state, getattr(want, "replica_state", None)
    assert (state is None) == (want_state is None)
    if state is not None:
        assert (state.replica_id, state.replica_epoch) == (want_state.replica_id, want_state.replica_epoch)
    assert len(body.topics) == len(want.topics)
    for t, wt in zip(body.topics, want.topics, strict=True):
        same(t, wt, "FetchTopic")
        assert len(t.partitions) == len(wt.partitions)
        for p, wp in zip(t.partitions, wt.partitions, strict=True):
            same(p, wp, "FetchPartition")
    forgotten = getattr(want, "forgotten_topics_data", None) or []
    assert [(f.topic, f.topic_id, f.partitions) for f in body.forgotten_topics_data] == \
        [(f.topic, getattr(f, "topic_id", None), list(f.partitions)) for f in forgotten]


@pytest.mark.parametrize("version", range(4, 19))
@pytest.mark.parametrize("follower", [False, True])
@pytest.mark.parametrize("tags", [False, True])
def test_compiled_fetch_parser_makes_what_the_codec_does(version, follower, tags):
    """Every field of every version, the tagged ones (cluster id, ReplicaState, directory id,
    high watermark) sent and not: the compiled parser's objects hold what the codec's do, and
    the Raft core reads the same plain fields from both."""
    frame = _fetch_frame(version, follower=follower, tags=tags)
    compiled = messages._parse_compiled(bytearray(frame))
    assert compiled is not None and type(compiled.body).__name__ == "FetchRequest"
    codec = messages.parse_request_py(bytearray(frame))
    _same_fetch(compiled, codec)
    from strom.protocol.fetch import fetch_replica_id

    assert fetch_replica_id(compiled.body) == fetch_replica_id(codec.body) == (2 if follower else -1)
    assert _within(compiled.body.to_dict(), codec.body.to_dict(json=False))


def _within(mine, want) -> bool:
    """`mine` holds what `want` holds (plain dicts may hold more: fields of other versions,
    at their defaults)."""
    if isinstance(want, dict):
        return all(k in mine and _within(mine[k], v) for k, v in want.items())
    if isinstance(want, list):
        return len(mine) == len(want) and all(_within(m, w) for m, w in zip(mine, want, strict=True))
    return mine == want


def test_unknown_tags_are_left_to_the_codec() -> None:
    frame = _fetch_frame(12)
    assert frame[-1] == 0  # the request's empty tag section, last
    with_tag = frame[:-1] + b"\x01\x07\x02\xab\xcd"  # one tagged field (7) the schema does not have
    assert messages._parse_compiled(bytearray(with_tag)) is None
    assert messages.parse_request_py(bytearray(with_tag)).header.correlation_id == 41


@pytest.mark.parametrize("version", [4, 11, 12, 15, 18])
def test_compiled_fetch_parser_never_accepts_what_the_codec_refuses(version):
    """Every truncation and thousands of random byte changes: the compiled parser answers None
    or exactly what the codec parses."""
    from compiled_support import agrees_on_damage

    accepted = agrees_on_damage(_fetch_frame(version, follower=True, tags=True), version, 2000, _same_fetch)
    assert accepted > 100
