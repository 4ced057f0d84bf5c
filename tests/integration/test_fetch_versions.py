"""Fetch v13-v17 by hand on the wire: topics by id (KIP-516), an unknown id, the follower id in
ReplicaState (v15), sessions keyed by id, and the current leader with its endpoint when a
client's leader epoch is stale (v16, KIP-951). librdkafka's Fetch v16 runs through the client
suites."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer

from strom.client import Connection
from strom.protocol.errors import ErrorCode
from strom.testing import BrokerProcess, create_topic, unique_name

FETCH, METADATA = 1, 3


def topic_info(conn: Connection, topic: str) -> tuple[uuid.UUID, int]:
    body = conn.call(METADATA, 12, {"topics": [{"name": topic}], "allow_auto_topic_creation": False,
                                    "include_topic_authorized_operations": False})
    t = body.topics[0]
    return t.topic_id, t.partitions[0].leader_epoch


def fetch(conn: Connection, version: int, topic_id: uuid.UUID, offset: int = 0, leader_epoch: int = -1,
          session: tuple[int, int] = (0, -1), forgotten: list[uuid.UUID] = ()):
    who = {"replica_state": {"replica_id": -1, "replica_epoch": -1}} if version >= 15 else {"replica_id": -1}
    return conn.call(FETCH, version, {
        **who, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": session[0], "session_epoch": session[1],
        "topics": [{"topic_id": topic_id, "partitions": [{
            "partition": 0, "current_leader_epoch": leader_epoch, "fetch_offset": offset, "last_fetched_epoch": -1,
            "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
        "forgotten_topics_data": [{"topic_id": f, "partitions": [0]} for f in forgotten], "rack_id": ""})


@pytest.fixture
def broker():
    with BrokerProcess() as proc:
        yield proc


def produce(bootstrap: str, topic: str, count: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(count):
        p.produce(topic, b"%d" % i)
    assert p.flush(15) == 0


@pytest.mark.parametrize("version", [13, 15, 17])
def test_topics_by_id(broker, version):
    topic = unique_name("by-id")
    create_topic(broker.bootstrap, topic)
    produce(broker.bootstrap, topic, 3)
    with Connection("127.0.0.1", broker.port) as conn:
        topic_id, _ = topic_info(conn, topic)
        body = fetch(conn, version, topic_id)
        [answer] = body.responses
        assert answer.topic_id == topic_id and answer.partitions[0].error_code == 0
        assert answer.partitions[0].high_watermark == 3 and len(answer.partitions[0].records) > 0
        stranger = uuid.uuid4()
        [unknown] = fetch(conn, version, stranger).responses
        assert unknown.topic_id == stranger and unknown.partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_ID


def test_a_session_keyed_by_topic_id(broker):
    topic = unique_name("session-ids")
    create_topic(broker.bootstrap, topic)
    produce(broker.bootstrap, topic, 2)
    with Connection("127.0.0.1", broker.port) as conn:
        topic_id, _ = topic_info(conn, topic)
        opened = fetch(conn, 17, topic_id, session=(0, 0))
        assert opened.session_id != 0 and opened.responses[0].topic_id == topic_id
        produce(broker.bootstrap, topic, 1)
        # Incremental, naming the new position: only the new record comes back, under the id.
        news = conn.call(FETCH, 17, {
            "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": opened.session_id, "session_epoch": 1,
            "topics": [{"topic_id": topic_id, "partitions": [{
                "partition": 0, "current_leader_epoch": -1, "fetch_offset": 2, "last_fetched_epoch": -1,
                "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": [], "rack_id": ""})
        assert [t.topic_id for t in news.responses] == [topic_id]
        assert news.responses[0].partitions[0].high_watermark == 3
        forgot = fetch(conn, 17, uuid.uuid4(), session=(opened.session_id, 2), forgotten=[topic_id])
        assert [t.partitions[0].error_code for t in forgot.responses] == [ErrorCode.UNKNOWN_TOPIC_ID]


def test_a_stale_leader_epoch_learns_the_current_leader(tmp_path):
    """After a restart the partition's leader epoch has moved on: a fetch naming the old epoch
    is FENCED_LEADER_EPOCH and, from v16, carries the leader and its endpoint."""
    topic = unique_name("fenced")
    with BrokerProcess(data_dir=tmp_path / "data") as proc:
        create_topic(proc.bootstrap, topic)
        with Connection("127.0.0.1", proc.port) as conn:
            topic_id, first_epoch = topic_info(conn, topic)
    with BrokerProcess(data_dir=tmp_path / "data") as proc:
        with Connection("127.0.0.1", proc.port) as conn:
            _, epoch = topic_info(conn, topic)
            assert epoch > first_epoch, "a restart elects the leader again, with a new epoch"
            old = fetch(conn, 15, topic_id, leader_epoch=first_epoch)
            assert old.responses[0].partitions[0].error_code == ErrorCode.FENCED_LEADER_EPOCH
            assert old.responses[0].partitions[0].current_leader is None and not old.node_endpoints
            new = fetch(conn, 16, topic_id, leader_epoch=first_epoch)
            p = new.responses[0].partitions[0]
            assert p.error_code == ErrorCode.FENCED_LEADER_EPOCH
            assert (p.current_leader.leader_id, p.current_leader.leader_epoch) == (0, epoch)
            assert [(n.node_id, n.host, n.port) for n in new.node_endpoints] == [(0, "127.0.0.1", proc.port)]
