"""Bad group requests over the raw wire: each gets Kafka's error code, and the broker keeps
serving afterwards."""

from __future__ import annotations

import uuid

import pytest

from strom.coordinator import partition_for
from strom.coordinator.group.consumer_protocol import encode_assignment, encode_subscription
from strom.testing import create_topic, unique_name

from .conftest import GROUP_OVERRIDES, Rec, roundtrip, wire_call

pytestmark = pytest.mark.timeout(60)

FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 10, 11, 12, 13, 14
OFFSET_COMMIT, DELETE_GROUPS, CONSUMER_GROUP_HEARTBEAT, METADATA = 8, 42, 68, 3
NONE, INVALID_REQUEST, ILLEGAL_GENERATION, INCONSISTENT_GROUP_PROTOCOL = 0, 42, 22, 23
INVALID_GROUP_ID, UNKNOWN_MEMBER_ID, INVALID_SESSION_TIMEOUT, MEMBER_ID_REQUIRED = 24, 25, 26, 79
NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND, UNSUPPORTED_ASSIGNOR = 68, 69, 112


def join(bootstrap: str, group: str, member_id: str = "", protocols=None, session_ms: int = 10000,
         version: int = 5):
    if protocols is None:
        protocols = [{"name": "range", "metadata": encode_subscription(["t"])}]
    return wire_call(bootstrap, JOIN_GROUP, version, {
        "group_id": group, "session_timeout_ms": session_ms, "rebalance_timeout_ms": 10000,
        "member_id": member_id, "group_instance_id": None, "protocol_type": "consumer",
        "protocols": protocols})


def joined_member(bootstrap: str, group: str) -> tuple[str, int]:
    """A one-member group via the two-step join of KIP-394; (member id, generation)."""
    first = join(bootstrap, group)
    assert first.error_code == MEMBER_ID_REQUIRED and first.member_id
    second = join(bootstrap, group, member_id=first.member_id)
    assert second.error_code == NONE and second.leader == first.member_id
    return first.member_id, second.generation_id


def sync(bootstrap: str, group: str, member_id: str, generation: int, assignment: bytes = b""):
    return wire_call(bootstrap, SYNC_GROUP, 3, {
        "group_id": group, "generation_id": generation, "member_id": member_id,
        "group_instance_id": None, "assignments": [{"member_id": member_id, "assignment": assignment}]})


def heartbeat(bootstrap: str, group: str, member_id: str, generation: int) -> int:
    return wire_call(bootstrap, HEARTBEAT, 3, {"group_id": group, "generation_id": generation,
                                               "member_id": member_id, "group_instance_id": None}).error_code


@pytest.fixture
def group(group_broker) -> str:
    name = unique_name("bad")
    assert wire_call(group_broker.bootstrap, FIND_COORDINATOR, 3,
                     {"key": name, "key_type": 0}).error_code == NONE
    return name


def test_join_group_bad_requests(group_broker, group, topic):
    bootstrap = group_broker.bootstrap
    assert join(bootstrap, group, protocols=[]).error_code == INCONSISTENT_GROUP_PROTOCOL
    assert join(bootstrap, group, session_ms=999).error_code == INVALID_SESSION_TIMEOUT
    assert join(bootstrap, group, session_ms=1_800_001).error_code == INVALID_SESSION_TIMEOUT
    assert join(bootstrap, "").error_code == INVALID_GROUP_ID
    assert join(bootstrap, group, member_id="nobody").error_code == UNKNOWN_MEMBER_ID
    member_id, generation = joined_member(bootstrap, group)
    # A protocol the group's members do not support, or another protocol type, is refused.
    other = [{"name": "roundrobin", "metadata": encode_subscription(["t"])}]
    assert join(bootstrap, group, protocols=other).error_code == INCONSISTENT_GROUP_PROTOCOL
    # JoinGroup v3 (before KIP-394) joins at once without MEMBER_ID_REQUIRED.
    v3 = join(bootstrap, unique_name("v3"), version=3)
    assert (v3.error_code, v3.generation_id, v3.leader) == (NONE, 1, v3.member_id)
    _still_serving(bootstrap, topic)


def test_sync_heartbeat_and_commit_with_stale_or_unknown_members(group_broker, group, topic):
    bootstrap = group_broker.bootstrap
    create_topic(bootstrap, topic, 1)
    member_id, generation = joined_member(bootstrap, group)
    assert sync(bootstrap, group, member_id, generation - 1).error_code == ILLEGAL_GENERATION
    assert sync(bootstrap, group, "nobody", generation).error_code == UNKNOWN_MEMBER_ID
    assignment = encode_assignment({topic: [0]})
    result = sync(bootstrap, group, member_id, generation, assignment)
    assert (result.error_code, result.assignment) == (NONE, assignment)
    assert heartbeat(bootstrap, group, member_id, generation) == NONE
    assert heartbeat(bootstrap, group, member_id, generation + 1) == ILLEGAL_GENERATION
    assert heartbeat(bootstrap, group, "nobody", generation) == UNKNOWN_MEMBER_ID

    def commit(member: str, gen: int, group_id: str = group) -> int:
        body = wire_call(bootstrap, OFFSET_COMMIT, 7, {
            "group_id": group_id, "generation_id_or_member_epoch": gen, "member_id": member,
            "group_instance_id": None, "topics": [{"name": topic, "partitions": [
                {"partition_index": 0, "committed_offset": 1, "committed_leader_epoch": -1,
                 "committed_metadata": None}]}]})
        return body.topics[0].partitions[0].error_code

    assert commit("nobody", generation) == UNKNOWN_MEMBER_ID
    assert commit(member_id, generation + 5) == ILLEGAL_GENERATION
    assert commit("", -1) == UNKNOWN_MEMBER_ID  # only members commit to a group with members
    assert commit("someone", 3, unique_name("gone")) == ILLEGAL_GENERATION  # no such group
    assert commit(member_id, generation) == NONE

    # LeaveGroup v3 answers per member; DeleteGroups refuses a group with members.
    left = wire_call(bootstrap, LEAVE_GROUP, 3, {"group_id": group, "members": [
        {"member_id": "nobody", "group_instance_id": None},
        {"member_id": member_id, "group_instance_id": None}]})
    assert (left.error_code, [m.error_code for m in left.members]) == (NONE, [UNKNOWN_MEMBER_ID, NONE])
    deleted = wire_call(bootstrap, DELETE_GROUPS, 2, {"groups_names": [group, unique_name("none")]})
    assert [r.error_code for r in deleted.results] == [NONE, GROUP_ID_NOT_FOUND]
    _still_serving(bootstrap, topic + "-after")


def test_find_coordinator_keys_and_types(group_broker):
    bootstrap = group_broker.bootstrap
    keys = ["a", "polygenelubricants", "group-with-ünïcode"]
    body = wire_call(bootstrap, FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": keys})
    assert [(c.key, c.error_code, c.port) for c in body.coordinators] == \
        [(k, NONE, group_broker.port) for k in keys]
    assert wire_call(bootstrap, FIND_COORDINATOR, 1, {"key": "x", "key_type": 7}).error_code == INVALID_REQUEST
    assert wire_call(bootstrap, FIND_COORDINATOR, 0, {"key": "x"}).error_code == NONE
    # __consumer_offsets exists now, internal and compacted, with the configured partitions.
    meta = wire_call(bootstrap, METADATA, 1, {"topics": [{"name": "__consumer_offsets"}]})
    (offsets_topic,) = meta.topics
    assert offsets_topic.is_internal and len(offsets_topic.partitions) == \
        int(GROUP_OVERRIDES["offsets.topic.num.partitions"])
    assert partition_for("polygenelubricants", 10) == 0  # hashCode is Integer.MIN_VALUE


def test_consumer_group_heartbeat_bad_requests(group_broker, group, topic):
    bootstrap = group_broker.bootstrap

    def heartbeat_v0(**fields) -> int:
        request = {"group_id": group, "member_id": "", "member_epoch": 0, "instance_id": None,
                   "rack_id": None, "rebalance_timeout_ms": 5000, "subscribed_topic_names": [topic],
                   "server_assignor": None, "topic_partitions": [], **fields}
        return wire_call(bootstrap, CONSUMER_GROUP_HEARTBEAT, 0, request).error_code

    assert heartbeat_v0(subscribed_topic_names=None) == INVALID_REQUEST
    assert heartbeat_v0(topic_partitions=None) == INVALID_REQUEST
    assert heartbeat_v0(member_epoch=-7, member_id="m") == INVALID_REQUEST
    assert heartbeat_v0(server_assignor="no-such-assignor") == UNSUPPORTED_ASSIGNOR
    assert heartbeat_v0(member_epoch=3, member_id="nobody") == UNKNOWN_MEMBER_ID
    _, generation = joined_member(bootstrap, group + "-classic")
    # A classic group with members is not a consumer group.
    assert heartbeat_v0(group_id=group + "-classic") == GROUP_ID_NOT_FOUND
    body = wire_call(bootstrap, CONSUMER_GROUP_HEARTBEAT, 1, {
        "group_id": group, "member_id": str(uuid.uuid4()), "member_epoch": 0, "instance_id": None,
        "rack_id": None, "rebalance_timeout_ms": 5000, "subscribed_topic_names": [topic],
        "subscribed_topic_regex": None, "server_assignor": "range", "topic_partitions": []})
    assert (body.error_code, body.member_epoch) == (NONE, 1)
    _still_serving(bootstrap, topic + "-after")


def _still_serving(bootstrap: str, topic: str) -> None:
    roundtrip(bootstrap, topic, [Rec(b"still here")])
