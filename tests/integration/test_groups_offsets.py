"""Committed offsets: durability across `kill -9`, OffsetFetch/OffsetCommit/OffsetDelete details
and expiry, with real clients and (for what no client shows) the raw wire."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from strom.testing import BrokerProcess, create_topic, unique_name, wait_for

from .conftest import GROUP_OVERRIDES, Rec, ck_produce, wire_call
from .group_member import Member, assert_rejoined_without_rebalance, wait_balanced

pytestmark = pytest.mark.timeout(90)

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, OFFSET_DELETE = 8, 9, 10, 47


@pytest.fixture
def restartable_broker(tmp_path):
    with BrokerProcess(data_dir=tmp_path, overrides=GROUP_OVERRIDES) as proc:
        yield proc


def group_consumer(bootstrap: str, group: str, **conf) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                     "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                     "heartbeat.interval.ms": 200, "fetch.wait.max.ms": 100, **conf})


def consume(consumer: Consumer, count: int, timeout: float = 20.0) -> list:
    out, deadline = [], time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        msg = consumer.poll(0.1)
        if msg is not None:
            assert msg.error() is None, msg.error()
            out.append(msg)
    assert len(out) == count, f"got {len(out)} of {count}"
    return out


def test_commit_survives_kill_9_and_consumer_resumes_exactly(restartable_broker, topic):
    broker = restartable_broker
    create_topic(broker.bootstrap, topic, 3)
    ck_produce(broker.bootstrap, topic, [Rec(b"a%d" % i, partition=i % 3) for i in range(30)])
    group = unique_name("resume")
    c = group_consumer(broker.bootstrap, group)
    c.subscribe([topic])
    # Read some of each partition and commit exactly those, with metadata.
    first = consume(c, 14)
    committed = {}
    for m in first:
        committed[m.partition()] = max(committed.get(m.partition(), 0), m.offset() + 1)
    c.commit(offsets=[TopicPartition(topic, p, o, metadata=f"m{p}") for p, o in committed.items()],
             asynchronous=False)
    c.close()

    broker.kill()  # no flush, no checkpoint, no clean-shutdown marker
    broker.restart()
    ck_produce(broker.bootstrap, topic, [Rec(b"b%d" % i, partition=i % 3) for i in range(9)])

    c = group_consumer(broker.bootstrap, group)
    try:
        tps = [TopicPartition(topic, p) for p in range(3)]
        got = {tp.partition: (tp.offset, tp.metadata) for tp in c.committed(tps, timeout=10)}
        assert got == {p: (committed.get(p, -1001), f"m{p}" if p in committed else None)
                       for p in range(3)}
        c.subscribe([topic])
        rest = consume(c, 39 - len(first))
        by_partition: dict[int, list[int]] = {}
        for m in rest:
            by_partition.setdefault(m.partition(), []).append(m.offset())
        # Each partition resumes at its committed offset and reads on without a gap or a repeat.
        for p, offsets in by_partition.items():
            start = committed.get(p, 0)
            assert offsets == list(range(start, start + len(offsets))), (p, offsets)
        seen = {(m.partition(), m.offset()) for m in first + rest}
        assert len(seen) == 39
    finally:
        c.close()


def test_static_members_survive_kill_9(restartable_broker, topic):
    broker = restartable_broker
    create_topic(broker.bootstrap, topic, 4)
    group = unique_name("static-restart")
    a = Member("confluent", broker.bootstrap, group, [topic], session_ms=30000, instance_id="a")
    b = Member("confluent", broker.bootstrap, group, [topic], session_ms=30000, instance_id="b")
    a2 = None
    try:
        a_parts, b_parts = wait_balanced([a, b], 4)
        a.kill()
        broker.kill()
        broker.restart()
        restarted_at, mark = time.monotonic(), len(broker.stderr_lines)
        # The group, its generation and both static members come back from __consumer_offsets:
        # the restarted member takes its old place and the one that stayed is not disturbed.
        a2 = Member("confluent", broker.bootstrap, group, [topic], session_ms=30000, instance_id="a")
        a2.wait(lambda: a2.partitions() == a_parts, 30, "the old partitions after the restart")
        assert_rejoined_without_rebalance(broker, group, "a", mark)
        assert b.reported("revoked", since=restarted_at) == []
        assert b.partitions() == b_parts
    finally:
        for m in (a, b, a2):
            if m is not None:
                m.kill()


def _coordinator_ready(bootstrap: str, group: str) -> None:
    body = wire_call(bootstrap, FIND_COORDINATOR, 3, {"key": group, "key_type": 0})
    assert body.error_code == 0, body


def _commit(bootstrap: str, version: int, group: str, topic: str, offsets: dict[int, int],
            **fields) -> dict[int, int]:
    partitions = [{"partition_index": p, "committed_offset": o, "committed_metadata": f"md-{p}",
                   "committed_leader_epoch": 7} for p, o in offsets.items()]
    body = wire_call(bootstrap, OFFSET_COMMIT, version, {
        "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
        "group_instance_id": None, "retention_time_ms": -1,
        "topics": [{"name": topic, "partitions": partitions}], **fields})
    return {p.partition_index: p.error_code for t in body.topics for p in t.partitions}


def test_offset_fetch_all_partitions_of_several_groups(group_broker, topic):
    bootstrap = group_broker.bootstrap
    create_topic(bootstrap, topic, 3)
    g1, g2, g3 = unique_name("f1"), unique_name("f2"), unique_name("f3")
    for g in (g1, g2):
        _coordinator_ready(bootstrap, g)
    assert _commit(bootstrap, 8, g1, topic, {0: 5, 2: 9}) == {0: 0, 2: 0}
    assert _commit(bootstrap, 8, g2, topic, {1: 3}) == {1: 0}
    body = wire_call(bootstrap, OFFSET_FETCH, 8, {"groups": [
        {"group_id": g1, "topics": None}, {"group_id": g2, "topics": None},
        {"group_id": g3, "topics": [{"name": topic, "partition_indexes": [0]}]}],
        "require_stable": False})
    got = {g.group_id: {(t.name, p.partition_index): (p.committed_offset, p.committed_leader_epoch,
                                                      p.metadata, p.error_code)
                        for t in g.topics for p in t.partitions} for g in body.groups}
    assert got == {
        g1: {(topic, 0): (5, 7, "md-0", 0), (topic, 2): (9, 7, "md-2", 0)},
        g2: {(topic, 1): (3, 7, "md-1", 0)},
        g3: {(topic, 0): (-1, -1, "", 0)},  # nothing committed
    }
    assert [g.error_code for g in body.groups] == [0, 0, 0]


def test_offset_delete_and_commit_retention_expiry(tmp_path, topic):
    overrides = {**GROUP_OVERRIDES, "offsets.retention.check.interval.ms": "200"}
    with BrokerProcess(data_dir=tmp_path, overrides=overrides) as broker:
        bootstrap = broker.bootstrap
        create_topic(bootstrap, topic, 2)
        group = unique_name("expire")
        _coordinator_ready(bootstrap, group)
        assert _commit(bootstrap, 8, group, topic, {0: 4, 1: 6}) == {0: 0, 1: 0}
        body = wire_call(bootstrap, OFFSET_DELETE, 0, {"group_id": group, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0}]},
            {"name": "no-such-topic", "partitions": [{"partition_index": 0}]}]})
        assert body.error_code == 0
        assert {(t.name, p.partition_index): p.error_code for t in body.topics for p in t.partitions} \
            == {(topic, 0): 0, ("no-such-topic", 0): 3}
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        try:
            tps = [TopicPartition(topic, p) for p in range(2)]
            assert [tp.offset for tp in c.committed(tps, timeout=10)] == [-1001, 6]
            # OffsetCommit v2-v4 carry a retention of their own: an explicit expire timestamp.
            assert _commit(bootstrap, 2, group, topic, {0: 11}, retention_time_ms=300) == {0: 0}
            assert [tp.offset for tp in c.committed(tps, timeout=10)] == [11, 6]
            wait_for(lambda: c.committed(tps, timeout=10)[0].offset == -1001, timeout=60,
                     what="the offset to expire")
            assert c.committed(tps, timeout=10)[1].offset == 6  # no retention: kept
        finally:
            c.close()
        # Expired and deleted offsets stay gone after a restart: their tombstones are in the log.
        broker.kill()
        broker.restart()
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        try:
            assert [tp.offset for tp in c.committed(tps, timeout=10)] == [-1001, 6]
        finally:
            c.close()


def test_deleting_a_topic_deletes_its_committed_offsets(restartable_broker, topic):
    bootstrap = restartable_broker.bootstrap
    other = unique_name("kept")
    create_topic(bootstrap, topic, partitions=2)
    create_topic(bootstrap, other)
    group = unique_name("deleted-topic-group")
    c = group_consumer(bootstrap, group)
    c.commit(offsets=[TopicPartition(topic, 0, 5), TopicPartition(topic, 1, 7),
                      TopicPartition(other, 0, 3)], asynchronous=False)
    c.close()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic], operation_timeout=10)[topic].result(15)

    def committed() -> dict:
        c = group_consumer(bootstrap, group)
        try:
            return {(tp.topic, tp.partition): tp.offset for tp in c.committed(
                [TopicPartition(topic, 0), TopicPartition(other, 0)], timeout=10)}
        finally:
            c.close()

    def made_again() -> bool:
        try:
            create_topic(bootstrap, topic, partitions=2)
            return True
        except KafkaException as e:
            # As Kafka's controller: DeleteTopics is answered once the brokers' metadata has
            # dropped the topic, and until the controller has removed it too, a new topic of
            # that name is TOPIC_ALREADY_EXISTS ("marked for deletion"). Clients retry.
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
            return False

    wait_for(made_again, 15, what="the topic made again once its deletion finished")
    assert committed() == {(topic, 0): -1001, (other, 0): 3}  # same name again: no offsets
    restartable_broker.kill()  # the tombstones are in __consumer_offsets: a restart agrees
    restartable_broker.restart()
    assert committed() == {(topic, 0): -1001, (other, 0): 3}
