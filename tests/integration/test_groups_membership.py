"""Classic consumer groups with real clients: members in processes of their own, so that one
can be killed without a LeaveGroup.

The scenario, for confluent-kafka, kafka-python, aiokafka and a group mixing all three: three
members of a group on a 6-partition topic get two partitions each; a fourth joins and the
partitions spread over four; one member is killed and its partitions move once its session
times out (not before); one closes cleanly and its partitions move at once.
"""

from __future__ import annotations

import time

import pytest

from strom.testing import create_topic, unique_name

from .group_member import Member, wait_balanced

pytestmark = pytest.mark.timeout(90)

SESSION_MS = 3000


def _scenario(bootstrap: str, topic: str, clients: list[str]) -> None:
    create_topic(bootstrap, topic, 6)
    group = unique_name("group")
    members = [Member(c, bootstrap, group, [topic], session_ms=SESSION_MS) for c in clients[:3]]
    try:
        assert [len(p) for p in wait_balanced(members, 6)] == [2, 2, 2]

        members.append(Member(clients[3], bootstrap, group, [topic], session_ms=SESSION_MS))
        assert sorted(len(p) for p in wait_balanced(members, 6)) == [1, 1, 2, 2]

        victim, survivors = members[0], members[1:]
        lost = victim.partitions()
        killed_at = time.monotonic()
        victim.kill()
        after_kill = wait_balanced(survivors, 6)
        moved_after = time.monotonic() - killed_at
        assert lost <= set().union(*after_kill)
        # Nothing tells the coordinator of a SIGKILL but the session timeout: its partitions
        # cannot move before (the last heartbeat was at most ~0.2 s before the kill).
        assert moved_after >= SESSION_MS / 1000 - 0.5, f"partitions moved after {moved_after:.2f} s"

        leaver, rest = survivors[0], survivors[1:]
        left_at = time.monotonic()
        leaver.close()
        wait_balanced(rest, 6)
        # A clean close sends LeaveGroup: the rebalance starts at once, not after a session.
        assert time.monotonic() - left_at < SESSION_MS / 1000 - 0.5
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
    _scenario(group_broker.bootstrap, topic, clients)


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
    a = Member("confluent", bootstrap, group, [topic], session_ms=10000, instance_id="a")
    b = Member("confluent", bootstrap, group, [topic], session_ms=10000, instance_id="b")
    try:
        a_parts, b_parts = wait_balanced([a, b], 4)
        restarted_at = time.monotonic()
        a.kill()  # no LeaveGroup: a static member's session outlives its process
        a2 = Member("confluent", bootstrap, group, [topic], session_ms=10000, instance_id="a")
        a2.wait(lambda: a2.partitions() == a_parts, 20, "the restarted member's old partitions")
        time.sleep(1.0)  # a rebalance, had there been one, would show within a few heartbeats
        assert b.reported("revoked", since=restarted_at) == []
        assert b.partitions() == b_parts
        assert a2.reported("revoked", since=restarted_at) == []
    finally:
        for m in (a, b, locals().get("a2")):
            if m is not None:
                m.kill()
