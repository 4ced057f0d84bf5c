"""Classic consumer groups with real clients: members in processes of their own, so that one
can be killed without a LeaveGroup.

The scenario, for confluent-kafka, kafka-python, aiokafka and a group mixing all three: three
members of a group on a 6-partition topic get two partitions each; a fourth joins and the
partitions spread over four; one member is killed and its partitions move once its session
times out (the coordinator says it expired the member, not that it left); one closes cleanly
and its partitions move on its LeaveGroup (no session expires).
"""

from __future__ import annotations

import time

import pytest

from strom.testing import create_topic, unique_name, wait_for

from .group_member import (
    Member,
    assert_rejoined_without_rebalance,
    coordinator_lines,
    wait_balanced,
)

pytestmark = pytest.mark.timeout(90)

SESSION_MS = 3000


def _scenario(broker, topic: str, clients: list[str]) -> None:
    bootstrap = broker.bootstrap
    create_topic(bootstrap, topic, 6)
    group = unique_name("group")
    members = [Member(c, bootstrap, group, [topic], session_ms=SESSION_MS) for c in clients[:3]]
    try:
        assert [len(p) for p in wait_balanced(members, 6)] == [2, 2, 2]

        members.append(Member(clients[3], bootstrap, group, [topic], session_ms=SESSION_MS))
        assert sorted(len(p) for p in wait_balanced(members, 6)) == [1, 1, 2, 2]

        victim, survivors = members[0], members[1:]
        lost = victim.partitions()
        mark = len(broker.stderr_lines)
        victim.kill()
        after_kill = wait_balanced(survivors, 6)
        assert lost <= set().union(*after_kill)
        # Nothing tells the coordinator of a SIGKILL but the session timeout: the coordinator
        # removed the member because its session expired, not for its closed connection.
        wait_for(lambda: coordinator_lines(broker, group, "has failed", mark) >= 1, 30,
                 what="the coordinator to expire the killed member")
        assert coordinator_lines(broker, group, "explicit LeaveGroup", mark) == 0

        leaver, rest = survivors[0], survivors[1:]
        mark = len(broker.stderr_lines)
        leaver.close()
        wait_balanced(rest, 6)
        # A clean close sends LeaveGroup: the rebalance starts from it, no session expires.
        wait_for(lambda: coordinator_lines(broker, group, "explicit LeaveGroup", mark) == 1, 30,
                 what="the coordinator to hear the LeaveGroup")
        assert coordinator_lines(broker, group, "has failed", mark) == 0
    finally:
        for m in members:
            m.kill()


@pytest.mark.parametrize("clients", [
    ["confluent"] * 4,
    ["kafka-python"] * 4,
    ["aiokafka"] * 4,
    ["confluent", "kafka-python", "aiokafka", "confluent"],
], ids=["confluent", "kafka-python", "aiokafka", "mixed"])
def test_group_spreads_and_moves_partitions(group_broker, topic, clients):
    _scenario(group_broker, topic, clients)


@pytest.mark.parametrize("client,conf", [
    ("confluent", {"partition.assignment.strategy": "cooperative-sticky"}),
    ("kafka-python", {"assignors": ["cooperative-sticky"]}),
], ids=["confluent", "kafka-python"])
def test_cooperative_sticky_join_revokes_only_moved_partitions(group_broker, topic, client, conf):
    bootstrap = group_broker.bootstrap
    create_topic(bootstrap, topic, 6)
    group = unique_name("coop")
    members = [Member(client, bootstrap, group, [topic], **conf) for _ in range(2)]
    try:
        before = wait_balanced(members, 6)
        joined_at = time.monotonic()
        members.append(Member(client, bootstrap, group, [topic], **conf))
        after = wait_balanced(members, 6)
        moved = 0
        for member, old, new in zip(members[:2], before, after[:2], strict=True):
            revoked = set().union(*member.reported("revoked", since=joined_at))
            # Partitions that stay are never revoked; only those handed to the newcomer are.
            assert new <= old
            assert revoked == old - new, (old, new, revoked)
            moved += len(revoked)
        assert moved == 2
    finally:
        for m in members:
            m.kill()


def test_static_member_restart_keeps_assignment_without_rebalance(group_broker, topic):
    bootstrap = group_broker.bootstrap
    create_topic(bootstrap, topic, 4)
    group = unique_name("static")
    # Sessions far longer than a member restart: only a rebalance could move partitions.
    a = Member("confluent", bootstrap, group, [topic], session_ms=30000, instance_id="a")
    b = Member("confluent", bootstrap, group, [topic], session_ms=30000, instance_id="b")
    try:
        a_parts, b_parts = wait_balanced([a, b], 4)
        restarted_at, mark = time.monotonic(), len(group_broker.stderr_lines)
        a.kill()  # no LeaveGroup: a static member's session outlives its process
        a2 = Member("confluent", bootstrap, group, [topic], session_ms=30000, instance_id="a")
        a2.wait(lambda: a2.partitions() == a_parts, 30, "the restarted member's old partitions")
        assert_rejoined_without_rebalance(group_broker, group, "a", mark)
        assert b.reported("revoked", since=restarted_at) == []
        assert b.partitions() == b_parts
        assert a2.reported("revoked", since=restarted_at) == []
    finally:
        for m in (a, b, locals().get("a2")):
            if m is not None:
                m.kill()

