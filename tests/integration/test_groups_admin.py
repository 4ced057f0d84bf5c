"""Group administration: ListGroups, DescribeGroups, DeleteGroups, OffsetFetch and LeaveGroup by
instance id through kafka-python's and confluent-kafka's admin clients, and `strom groups`."""

from __future__ import annotations

import subprocess
import sys

import pytest
from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, TopicPartition
from kafka import TopicPartition as KTopicPartition
from kafka.admin import KafkaAdminClient, MemberToRemove

from strom.testing import create_topic, unique_name

from .conftest import Rec, admin, ck_produce, wire_call
from .group_member import Member, wait_balanced

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def active_group(group_broker, topic):
    """A classic group with one static member that consumed and committed 10 records of a
    two-partition topic, which then received 3 more (lag 3)."""
    bootstrap = group_broker.bootstrap
    create_topic(bootstrap, topic, 2)
    ck_produce(bootstrap, topic, [Rec(b"r%d" % i, partition=i % 2) for i in range(10)])
    group = unique_name("admin")
    member = Member("confluent", bootstrap, group, [topic], instance_id="only")
    try:
        wait_balanced([member], 2)
        member.wait(lambda: member.consumed() == 10, 20, "ten records")
        member.command("commit", "committed")
        ck_produce(bootstrap, topic, [Rec(b"late", partition=0)] * 3)
        yield group, member
    finally:
        member.kill()


def close_static(bootstrap: str, group: str, member: Member) -> None:
    """Static members do not leave on close (KIP-345): close it and remove it by instance id,
    with a LeaveGroup v3 that names no member id, as kafka-consumer-groups.sh would."""
    member.close()
    body = wire_call(bootstrap, 13, 3, {"group_id": group, "members": [
        {"member_id": "", "group_instance_id": "only"}]})
    assert (body.error_code, [m.error_code for m in body.members]) == (0, [0])


def strom_groups(bootstrap: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strom", "groups", *args, "--bootstrap-server",
                           bootstrap], capture_output=True, text=True, timeout=30)


def test_kafka_python_admin(group_broker, topic, active_group):
    group, member = active_group
    client = KafkaAdminClient(bootstrap_servers=group_broker.bootstrap)
    try:
        assert {"group_id": group, "protocol_type": "consumer", "group_state": "Stable",
                "group_type": "classic"} in client.list_groups(states_filter=["Stable"])
        assert group not in {g["group_id"] for g in client.list_groups(states_filter=["Empty"])}
        described = client.describe_groups([group, "no-such-group"])
        g = described[group]
        assert (g["group_state"], g["protocol_type"], g["protocol_data"]) == ("Stable", "consumer", "range")
        (m,) = g["members"]
        assert m["group_instance_id"] == "only" and m["client_host"] == "/127.0.0.1"
        assert m["member_metadata"]["topics"] == [topic]
        assert m["member_assignment"]["assigned_partitions"] == [{"topic": topic, "partitions": [0, 1]}]
        assert described["no-such-group"]["group_state"] == "Dead"
        # Several groups in one OffsetFetch (v8), one of them without commits.
        other = unique_name("none")
        offsets = client.list_group_offsets({group: None, other: [KTopicPartition(topic, 0)]})
        assert {tp.partition: o.offset for tp, o in offsets[group].items()} == {0: 5, 1: 5}
        assert offsets[other][KTopicPartition(topic, 0)].offset == -1
        # A subscribed topic's offsets cannot be deleted while the group consumes it.
        errors = client.delete_group_offsets(group, [KTopicPartition(topic, 0)])
        assert errors[KTopicPartition(topic, 0)].__name__ == "GroupSubscribedToTopicError"
        assert client.delete_groups([group]) == {group: "NonEmptyGroupError"}
        # The admin path of KIP-345: remove a static member by its instance id.
        removed = client.remove_group_members(group, [MemberToRemove(group_instance_id="only")])
        assert [e.__name__ for e in removed.values()] == ["NoError"]
        member.wait(lambda: any(e["event"] in ("revoked", "lost") for e in member.events), 20,
                    "the member noticing it was removed")
    finally:
        client.close()


def test_confluent_admin(group_broker, topic, active_group):
    group, member = active_group
    client = admin(group_broker.bootstrap)
    listed = client.list_consumer_groups(states={ConsumerGroupState.STABLE}).result(10)
    assert group in {g.group_id for g in listed.valid}
    # librdkafka asks ConsumerGroupDescribe first and falls back to DescribeGroups for classic groups.
    described = client.describe_consumer_groups([group])[group].result(10)
    assert described.state == ConsumerGroupState.STABLE
    assert described.partition_assignor == "range"
    assert [m.group_instance_id for m in described.members] == ["only"]
    assert sorted(tp.partition for tp in described.members[0].assignment.topic_partitions) == [0, 1]
    committed = client.list_consumer_group_offsets([ConsumerGroupTopicPartitions(
        group, [TopicPartition(topic, 0), TopicPartition(topic, 1)])])[group].result(10)
    assert [tp.offset for tp in committed.topic_partitions] == [5, 5]
    close_static(group_broker.bootstrap, group, member)
    client.delete_consumer_groups([group])[group].result(10)
    listed = client.list_consumer_groups().result(10)
    assert group not in {g.group_id for g in listed.valid}


def test_strom_groups_cli(group_broker, topic, active_group):
    bootstrap = group_broker.bootstrap
    group, member = active_group
    listed = strom_groups(bootstrap, "list")
    assert listed.returncode == 0 and group in listed.stdout.split()
    stable = strom_groups(bootstrap, "list", "--state", "Stable")
    assert any(line.split() == [group, "Stable", "classic"] for line in stable.stdout.splitlines())

    described = strom_groups(bootstrap, "describe", group)
    assert described.returncode == 0, described.stderr
    header, *rows = [line.split() for line in described.stdout.splitlines()]
    assert header == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                      "CONSUMER-ID", "HOST", "CLIENT-ID"]
    # partition 0 got three more records after the commit: lag 3; partition 1 is caught up.
    assert [row[:6] for row in rows] == [[group, topic, "0", "5", "8", "3"],
                                         [group, topic, "1", "5", "5", "0"]]
    assert len({row[6] for row in rows}) == 1 and rows[0][6].startswith("only-")
    state = strom_groups(bootstrap, "describe", group, "--state")
    assert state.stdout.splitlines()[1].split()[-3:] == ["range", "Stable", "1"]

    refused = strom_groups(bootstrap, "delete", group)
    assert refused.returncode == 1 and "not empty" in refused.stderr
    close_static(bootstrap, group, member)
    deleted = strom_groups(bootstrap, "delete", group)
    assert deleted.returncode == 0 and "successful" in deleted.stdout
    gone = strom_groups(bootstrap, "describe", group)
    assert "does not exist" in gone.stdout
    assert group not in strom_groups(bootstrap, "list").stdout.split()
