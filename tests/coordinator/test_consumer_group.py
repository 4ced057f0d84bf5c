"""KIP-848 consumer groups: epochs, the revoke-before-assign reconciliation, fencing, static
members, and the server-side assignors."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import pytest
from coordinator_support import make_coordinator

from strom.coordinator.group.assignors import (
    MemberSubscription,
    TopicInfo,
    assign_range,
    assign_uniform,
)
from strom.coordinator.group.consumer_group import (
    ConsumerGroupCoordinator,
    ConsumerGroupState,
    HeartbeatRequest,
    MemberState,
)
from strom.protocol.errors import ErrorCode, KafkaError

pytestmark = pytest.mark.timeout(10)

G = "cg"
T1, T2 = uuid.UUID(int=1), uuid.UUID(int=2)


@dataclass
class _Topic:
    topic_id: uuid.UUID
    partitions: dict = field(default_factory=dict)


@pytest.fixture
def env():
    coordinator, scheduler, store = make_coordinator(consumer_session_timeout_ms=3000,
                                                     consumer_heartbeat_interval_ms=500)
    topics = {"t1": _Topic(T1, dict.fromkeys(range(4))), "t2": _Topic(T2, dict.fromkeys(range(2)))}
    coordinator.consumer_groups = ConsumerGroupCoordinator(coordinator, lambda: topics)
    return coordinator, scheduler, topics


def hb(coordinator, member_id: str, epoch: int, owned=None, topics=("t1",), **kw):
    full = epoch == 0
    return coordinator.consumer_groups.heartbeat(HeartbeatRequest(
        group_id=G, member_id=member_id, member_epoch=epoch,
        rebalance_timeout_ms=kw.pop("rebalance_timeout_ms", 10000 if full else -1),
        subscribed_topic_names=list(topics) if full else kw.pop("subscribed", None),
        owned=[] if full else owned, version=1, **kw))


def owned(assignment) -> list:
    return [(tid, sorted(ps)) for tid, ps in (assignment or {}).items()]


def no_double_ownership(coordinator) -> None:
    seen = set()
    for m in coordinator.groups[G].members.values():
        for parts in (m.assigned, m.pending_revocation):
            for tid, ps in parts.items():
                for p in ps:
                    assert (tid, p) not in seen, f"{tid}-{p} owned twice"
                    seen.add((tid, p))


def test_join_then_second_member_gets_partitions_only_after_revocation(env):
    coordinator, _, _ = env
    a = hb(coordinator, "a", 0)
    assert (a.member_epoch, a.assignment) == (1, {T1: {0, 1, 2, 3}})
    b = hb(coordinator, "b", 0)
    # b's target is half of t1, but a still owns it: b waits at the new epoch with nothing.
    assert (b.member_epoch, b.assignment) == (2, {})
    assert coordinator.groups[G].state is ConsumerGroupState.RECONCILING
    no_double_ownership(coordinator)
    a = hb(coordinator, "a", 1, owned=owned({T1: {0, 1, 2, 3}}))
    assert a.member_epoch == 1 and len(a.assignment[T1]) == 2  # revoke first, same epoch
    kept = a.assignment[T1]
    assert coordinator.groups[G].members["a"].state is MemberState.UNREVOKED_PARTITIONS
    no_double_ownership(coordinator)
    b = hb(coordinator, "b", 2, owned=[])
    assert b.assignment is None  # still nothing free for b
    a = hb(coordinator, "a", 1, owned=owned({T1: kept}))  # revocation acknowledged
    assert (a.member_epoch, a.assignment) == (2, None)
    b = hb(coordinator, "b", 2, owned=[])
    assert b.assignment == {T1: {0, 1, 2, 3} - kept}
    no_double_ownership(coordinator)
    assert coordinator.groups[G].state is ConsumerGroupState.STABLE


def test_epochs_are_checked(env):
    coordinator, _, _ = env
    hb(coordinator, "a", 0)
    with pytest.raises(KafkaError) as e:
        hb(coordinator, "a", 5, owned=[])
    assert e.value.code == ErrorCode.FENCED_MEMBER_EPOCH
    with pytest.raises(KafkaError) as e:
        hb(coordinator, "ghost", 3, owned=[])
    assert e.value.code == ErrorCode.UNKNOWN_MEMBER_ID
    group = coordinator.groups[G]
    validate = coordinator.consumer_groups.validate_commit
    assert validate(group, "a", 1) is None
    assert validate(group, "a", 0) == ErrorCode.STALE_MEMBER_EPOCH
    assert validate(group, "a", 2) == ErrorCode.FENCED_MEMBER_EPOCH
    assert validate(group, "", -1) == ErrorCode.UNKNOWN_MEMBER_ID  # members only while not empty


def test_session_expiry_and_leave_fence_members(env):
    coordinator, scheduler, _ = env
    hb(coordinator, "a", 0)
    hb(coordinator, "b", 0)
    hb(coordinator, "c", 0)
    for _ in range(4):
        scheduler.advance(1000)
        hb(coordinator, "a", coordinator.groups[G].members["a"].member_epoch,
           owned=owned(coordinator.groups[G].members["a"].assigned))
        hb(coordinator, "b", coordinator.groups[G].members["b"].member_epoch,
           owned=owned(coordinator.groups[G].members["b"].assigned))
    group = coordinator.groups[G]
    assert set(group.members) == {"a", "b"}  # c's session expired
    assert sorted(len(t.get(T1, ())) for t in group.target.values()) == [2, 2]
    left = hb(coordinator, "b", -1)
    assert left.member_epoch == -1 and set(group.members) == {"a"}
    assert group.target["a"] == {T1: {0, 1, 2, 3}}


def test_a_groups_own_session_timeout_and_heartbeat_interval_replace_the_brokers(env):
    """GROUP configs consumer.session.timeout.ms / consumer.heartbeat.interval.ms (KIP-848) for
    this group replace the broker's group.consumer.* values; other groups keep those."""
    coordinator, scheduler, _ = env
    overrides = {G: {"consumer.session.timeout.ms": "8000", "consumer.heartbeat.interval.ms": "900"}}
    coordinator.group_overrides = lambda group_id: overrides.get(group_id, {})
    assert hb(coordinator, "a", 0).heartbeat_interval_ms == 900
    scheduler.advance(5000)  # past the broker's 3000 ms, within the group's 8000
    assert set(coordinator.groups[G].members) == {"a"}
    scheduler.advance(3500)
    assert G not in coordinator.groups or not coordinator.groups[G].members
    overrides.clear()
    assert hb(coordinator, "b", 0).heartbeat_interval_ms == 500


def test_static_member_temporary_leave_and_rejoin_keeps_assignment(env):
    coordinator, scheduler, _ = env
    hb(coordinator, "a", 0, instance_id="i-a")
    hb(coordinator, "b", 0, instance_id="i-b")
    for m in ("a", "b", "a", "b"):
        member = coordinator.groups[G].members[m]
        hb(coordinator, m, member.member_epoch, owned=owned(member.assigned), instance_id=f"i-{m}")
    group = coordinator.groups[G]
    before, epoch = {m: dict(group.members[m].assigned) for m in ("a", "b")}, group.group_epoch
    assert sorted(len(p[T1]) for p in before.values()) == [2, 2]
    assert hb(coordinator, "a", -2, instance_id="i-a").member_epoch == -2
    with pytest.raises(KafkaError) as e:
        hb(coordinator, "a2", 0, instance_id="i-b")  # b has not left: its instance id is taken
    assert e.value.code == ErrorCode.UNRELEASED_INSTANCE_ID
    back = hb(coordinator, "a2", 0, instance_id="i-a")
    assert back.assignment == before["a"] and group.group_epoch == epoch
    assert set(group.members) == {"a2", "b"}


def test_member_that_never_revokes_is_fenced_after_rebalance_timeout(env):
    coordinator, scheduler, _ = env
    hb(coordinator, "a", 0, rebalance_timeout_ms=2000)
    hb(coordinator, "b", 0)
    hb(coordinator, "a", 1, owned=owned({T1: {0, 1, 2, 3}}))  # told to revoke two
    scheduler.advance(1000)
    hb(coordinator, "b", 2, owned=[])
    scheduler.advance(1001)  # a keeps heartbeating the partitions it should have given up
    assert "a" not in coordinator.groups[G].members


def test_request_validation(env):
    coordinator, _, _ = env
    cases = [dict(member_epoch=0, rebalance_timeout_ms=-1),
             dict(member_epoch=0, subscribed_topic_names=None),
             dict(member_epoch=0, owned=None),
             dict(member_epoch=-5)]
    for case in cases:
        request = dict(group_id=G, member_id="m", member_epoch=0, rebalance_timeout_ms=1000,
                       subscribed_topic_names=["t1"], owned=[], version=1)
        request.update(case)
        with pytest.raises(KafkaError) as e:
            coordinator.consumer_groups.heartbeat(HeartbeatRequest(**request))
        assert e.value.code == ErrorCode.INVALID_REQUEST, case
    with pytest.raises(KafkaError) as e:
        hb(coordinator, "m", 0, server_assignor="magic")
    assert e.value.code == ErrorCode.UNSUPPORTED_ASSIGNOR


def test_regex_subscription_and_new_partitions_bump_the_epoch(env):
    coordinator, _, topics = env
    joined = coordinator.consumer_groups.heartbeat(HeartbeatRequest(
        group_id=G, member_id="r", member_epoch=0, rebalance_timeout_ms=1000,
        subscribed_topic_regex="t[0-9]", owned=[], version=1))
    assert joined.assignment == {T1: {0, 1, 2, 3}, T2: {0, 1}}
    topics["t2"].partitions[2] = None  # the topic grew
    again = hb(coordinator, "r", 1, owned=owned(joined.assignment))
    assert again.member_epoch == 2 and again.assignment[T2] == {0, 1, 2}


def _subs(n: int, topics=(T1,), current=None) -> dict[str, MemberSubscription]:
    return {f"m{i}": MemberSubscription(frozenset(topics), (current or {}).get(f"m{i}", {}))
            for i in range(n)}


def test_uniform_assignor_is_balanced_and_sticky():
    topics = {T1: TopicInfo(T1, "t1", 7), T2: TopicInfo(T2, "t2", 3)}
    first = assign_uniform(_subs(3, (T1, T2)), topics)
    sizes = sorted(sum(len(ps) for ps in a.values()) for a in first.values())
    assert sizes == [3, 3, 4]
    assert sorted((t, p) for a in first.values() for t, ps in a.items() for p in ps) == \
        sorted([(T1, p) for p in range(7)] + [(T2, p) for p in range(3)])
    # A fourth member joins: everyone keeps what it can, only the surplus moves.
    second = assign_uniform(_subs(4, (T1, T2), first), topics)
    for m in first:
        kept = {(t, p) for t, ps in second[m].items() for p in ps}
        had = {(t, p) for t, ps in first[m].items() for p in ps}
        assert kept <= had
    assert sorted(sum(len(ps) for ps in a.values()) for a in second.values()) == [2, 2, 3, 3]


def test_range_assignor_gives_consecutive_ranges():
    out = assign_range(_subs(3), {T1: TopicInfo(T1, "t1", 8)})
    assert [sorted(out[f"m{i}"][T1]) for i in range(3)] == [[0, 1, 2], [3, 4, 5], [6, 7]]
