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
