"""KIP-848 consumer groups (librdkafka with group.protocol=consumer): server-side assignment
through ConsumerGroupHeartbeat, incremental moves, session expiry, offsets and describe."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import (
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    ConsumerGroupType,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from strom.testing import create_topic, unique_name, wait_for

from .conftest import Rec, ck_produce
from .group_member import Member, coordinator_lines, wait_balanced

pytestmark = pytest.mark.timeout(90)

def consumer_member(bootstrap: str, group: str, topic: str) -> Member:
    return Member("confluent", bootstrap, group, [topic], group_protocol="consumer")


def test_consumer_protocol_group_spreads_and_moves_partitions(group_broker, topic):
    bootstrap = group_broker.bootstrap
    create_topic(bootstrap, topic, 6)
    group = unique_name("kip848")
    members = [consumer_member(bootstrap, group, topic) for _ in range(3)]
    try:
        before = wait_balanced(members, 6)
        assert [len(p) for p in before] == [2, 2, 2]

        joined_at = time.monotonic()
        members.append(consumer_member(bootstrap, group, topic))
        after = wait_balanced(members, 6)
        assert sorted(len(p) for p in after) == [1, 1, 2, 2]
        for member, old, new in zip(members[:3], before, after[:3], strict=True):
            # Server-side reconciliation only takes away what moves to the newcomer.
            revoked = set().union(*member.reported("revoked", since=joined_at))
            assert new <= old and revoked == old - new

        victim, survivors = members[0], members[1:]
        mark = len(group_broker.stderr_lines)
        victim.kill()
        wait_balanced(survivors, 6)
        # Only the session timeout tells: the coordinator fenced the member for it.
        wait_for(lambda: coordinator_lines(group_broker, group, "session expired", mark) == 1, 30,
                 what="the coordinator to expire the killed member")
        assert coordinator_lines(group_broker, group, "left the consumer group", mark) == 0

        leaver, rest = survivors[0], survivors[1:]
        mark = len(group_broker.stderr_lines)
        leaver.close()  # a heartbeat with member epoch -1
        wait_balanced(rest, 6)
        wait_for(lambda: coordinator_lines(group_broker, group, "left the consumer group", mark) == 1, 30,
                 what="the coordinator to hear the member leave")
        assert coordinator_lines(group_broker, group, "session expired", mark) == 0
    finally:
        for m in members:
            m.kill()


def test_consumer_protocol_commits_and_describe(group_broker, topic):
    bootstrap = group_broker.bootstrap
    create_topic(bootstrap, topic, 2)
    ck_produce(bootstrap, topic, [Rec(b"x%d" % i, partition=i % 2) for i in range(10)])
    group = unique_name("kip848-offsets")
    member = consumer_member(bootstrap, group, topic)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        wait_balanced([member], 2)
        member.wait(lambda: member.consumed() == 10, 20, "all ten records")
        member.command("commit", "committed")  # OffsetCommit v9 with the member epoch
        described = admin.describe_consumer_groups([group])[group].result(10)
        assert described.type == ConsumerGroupType.CONSUMER
        assert described.state == ConsumerGroupState.STABLE
        assert len(described.members) == 1
        assigned = {tp.partition for tp in described.members[0].assignment.topic_partitions}
        assert assigned == {0, 1}
        listed = admin.list_consumer_groups(types={ConsumerGroupType.CONSUMER}).result(10)
        assert group in {g.group_id for g in listed.valid}
        offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(
            group, [TopicPartition(topic, 0), TopicPartition(topic, 1)])])[group].result(10)
        assert sorted(tp.offset for tp in offsets.topic_partitions) == [5, 5]
    finally:
        member.kill()
