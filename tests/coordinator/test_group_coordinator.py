"""The classic group state machine, driven through the coordinator with a manual clock."""

from __future__ import annotations

import pytest
from coordinator_support import join, joined, make_coordinator, sync, synced

from strom.coordinator.group.consumer_protocol import encode_subscription
from strom.coordinator.group.manager import LoadedState
from strom.coordinator.group.metadata import (
    COMPLETING_REBALANCE,
    EMPTY,
    PREPARING_REBALANCE,
    STABLE,
    GroupMetadata,
    IllegalStateTransition,
)
from strom.coordinator.group.records import (
    GroupMetadataValue,
    MemberRecord,
    OffsetAndMetadata,
)
from strom.protocol.errors import ErrorCode

pytestmark = pytest.mark.timeout(10)

G = "group"


def stable_group(coordinator, scheduler, n: int = 2, **join_args) -> list[str]:
    """n members that joined together (within the initial delay): a Stable generation 1."""
    boxes = [join(coordinator, G, **join_args) for _ in range(n)]
    scheduler.advance(0)  # the initial delayed join completes with everyone who arrived
    results = [joined(b) for b in boxes]
    assert {r.generation_id for r in results} == {1}
    leader = results[0].leader_id
    ids = [r.member_id for r in results]
    assignments = {m: m.encode() for m in ids}
    sync_boxes = [sync(coordinator, G, m, 1, assignments if m == leader else None) for m in ids]
    assert [synced(b).assignment for b in sync_boxes] == [m.encode() for m in ids]
    assert coordinator.groups[G].state is STABLE
    return ids


def test_state_transitions_follow_kafka():
    group = GroupMetadata(G, 0)
    group.transition_to(PREPARING_REBALANCE, 1)
    group.transition_to(COMPLETING_REBALANCE, 2)
    group.transition_to(STABLE, 3)
    try:
        group.transition_to(EMPTY, 4)
    except IllegalStateTransition:
        pass
    else:
        raise AssertionError("Stable -> Empty must be refused")
    assert group.current_state_timestamp == 3


def test_member_id_required_then_join_then_sync():
    coordinator, scheduler, store = make_coordinator()
    first = join(coordinator, G, require_known=True)
    assert first.value.error == ErrorCode.MEMBER_ID_REQUIRED
    member_id = first.value.member_id
    assert member_id.startswith("client-") and coordinator.groups[G].pending_members == {member_id}
    box = join(coordinator, G, member_id, require_known=True)
    assert box.value is None  # the first rebalance of an empty group waits the initial delay
    scheduler.advance(0)
    result = joined(box)
    assert (result.generation_id, result.leader_id, result.protocol_name) == (1, member_id, "range")
    assert result.members == [(member_id, None, b"sub")]
    answer = synced(sync(coordinator, G, member_id, 1, {member_id: b"assignment"}))
    assert (answer.error, answer.assignment) == (ErrorCode.NONE, b"assignment")
    (kind, group_id, value), = store.writes
    assert (kind, group_id, value.generation, value.members[0].assignment) == \
        ("group", G, 1, b"assignment")


def test_pending_member_that_never_joins_expires():
    coordinator, scheduler, _ = make_coordinator()
    first = join(coordinator, G, require_known=True, session_ms=6000)
    scheduler.advance(6001)
    assert coordinator.groups[G].pending_members == set()
    assert join(coordinator, G, first.value.member_id).value.error == ErrorCode.UNKNOWN_MEMBER_ID


def test_initial_delay_waits_and_extends_while_members_arrive():
    coordinator, scheduler, _ = make_coordinator(initial_rebalance_delay_ms=3000)
    a = join(coordinator, G, rebalance_ms=10000)
    scheduler.advance(2000)
    b = join(coordinator, G, rebalance_ms=10000)
    scheduler.advance(1500)  # the first delay has passed, but a member arrived during it
    assert a.value is None and b.value is None
    scheduler.advance(3000)
    assert joined(a).generation_id == joined(b).generation_id == 1


def test_rebalance_completes_as_soon_as_everyone_rejoined():
    coordinator, scheduler, _ = make_coordinator()
    a, b = stable_group(coordinator, scheduler)
    c = join(coordinator, G)  # starts a rebalance; a and b learn of it from heartbeats
    assert coordinator.heartbeat(G, a, None, 1) == ErrorCode.REBALANCE_IN_PROGRESS
    ra = join(coordinator, G, a)
    assert c.value is None and ra.value is None
    rb = join(coordinator, G, b)  # the last one: no need to wait for the rebalance timeout
    assert {joined(r).generation_id for r in (ra, rb, c)} == {2}
    assert coordinator.groups[G].state is COMPLETING_REBALANCE
    assert len(joined(ra).members) == 3 and joined(rb).members == []


def test_member_not_rejoining_is_dropped_after_rebalance_timeout():
    coordinator, scheduler, _ = make_coordinator()
    a, b = stable_group(coordinator, scheduler, rebalance_ms=8000)
    ra = join(coordinator, G, a, rebalance_ms=8000)  # the leader rejoins: a rebalance starts
    scheduler.advance(7999)
    assert ra.value is None
    scheduler.advance(2)
    result = joined(ra)
    assert result.generation_id == 2 and [m for m, _, _ in result.members] == [a]
    assert b not in coordinator.groups[G].members


def test_session_expiry_removes_member_and_rebalances():
    coordinator, scheduler, _ = make_coordinator()
    a, b = stable_group(coordinator, scheduler, session_ms=6000)
    scheduler.advance(4000)
    assert coordinator.heartbeat(G, a, None, 1) == ErrorCode.NONE  # b stays silent
    assert b in coordinator.groups[G].members
    scheduler.advance(2001)
    assert b not in coordinator.groups[G].members
    assert coordinator.groups[G].state is PREPARING_REBALANCE
    assert coordinator.heartbeat(G, a, None, 1) == ErrorCode.REBALANCE_IN_PROGRESS
    assert joined(join(coordinator, G, a)).generation_id == 2
    assert coordinator.heartbeat(G, b, None, 2) == ErrorCode.UNKNOWN_MEMBER_ID


def test_leave_of_last_member_empties_group_and_persists_it():
    coordinator, scheduler, store = make_coordinator()
    (a,) = stable_group(coordinator, scheduler, n=1)
    error, members = coordinator.leave_group(G, [(a, None, "bye"), ("ghost", None, None)])
    assert (error, members) == (ErrorCode.NONE, [ErrorCode.NONE, ErrorCode.UNKNOWN_MEMBER_ID])
    group = coordinator.groups[G]
    assert (group.state, group.generation_id) == (EMPTY, 2)
    assert store.writes[-1][2].members == [] and store.writes[-1][2].generation == 2


def test_static_member_rejoin_in_stable_keeps_generation_and_fences_old_id():
    coordinator, scheduler, store = make_coordinator()
    a, b = stable_group(coordinator, scheduler, instance_id=None)
    # Make b static by joining a fresh static member and stabilizing.
    s = join(coordinator, G, instance_id="static-1")
    ra = join(coordinator, G, a)
    join(coordinator, G, b)
    static_id = joined(s).member_id
    leader = joined(ra).leader_id
    generation = joined(ra).generation_id
    assignment = {a: b"A", b: b"B", static_id: b"S"}
    for m in (a, b, static_id):
        sync(coordinator, G, m, generation, assignment if m == leader else None)
    writes = len(store.writes)
    # The static member restarts: a new member id, the same instance id, no rebalance.
    again = joined(join(coordinator, G, instance_id="static-1"))
    assert again.generation_id == generation and again.member_id != static_id
    assert coordinator.groups[G].state is STABLE
    assert synced(sync(coordinator, G, again.member_id, generation, instance_id="static-1")).assignment == b"S"
    assert coordinator.heartbeat(G, static_id, "static-1", generation) == ErrorCode.FENCED_INSTANCE_ID
    assert coordinator.heartbeat(G, a, None, generation) == ErrorCode.NONE
    assert len(store.writes) == writes + 1  # the new member id is persisted


def test_static_member_survives_missing_a_rebalance_dynamic_does_not():
    coordinator, scheduler, _ = make_coordinator()
    box = join(coordinator, G, instance_id="s", session_ms=60000, rebalance_ms=5000)
    scheduler.advance(0)
    s = joined(box)
    synced(sync(coordinator, G, s.member_id, 1, {s.member_id: b"x"}))
    d = join(coordinator, G, rebalance_ms=5000)
    scheduler.advance(5001)  # s never rejoined; being static it stays a member
    result = joined(d)
    assert {m for m, _, _ in result.members} == {s.member_id, result.member_id}


def test_pending_sync_expiry_removes_members_that_never_synced():
    coordinator, scheduler, _ = make_coordinator()
    box = join(coordinator, G, rebalance_ms=4000)
    scheduler.advance(0)
    a = joined(box).member_id
    synced(sync(coordinator, G, a, 1, {a: b"x"}))
    b = join(coordinator, G, rebalance_ms=4000)
    ra = joined(join(coordinator, G, a, rebalance_ms=4000))
    b_id = joined(b).member_id
    assert (ra.generation_id, ra.leader_id) == (2, a)
    assert synced(sync(coordinator, G, a, 2, {a: b"a", b_id: b"b"})).error == ErrorCode.NONE
    scheduler.advance(4001)  # b never asked for its assignment
    assert b_id not in coordinator.groups[G].members
    assert coordinator.groups[G].state is PREPARING_REBALANCE


def test_protocol_selection_uses_common_protocols_and_votes():
    coordinator, scheduler, _ = make_coordinator()
    a = join(coordinator, G, protocols=[("roundrobin", b"1"), ("range", b"2")])
    scheduler.advance(0)
    assert joined(a).protocol_name == "roundrobin"  # alone, it gets its first choice
    b = join(coordinator, G, protocols=[("sticky", b"3"), ("range", b"4")])
    ra = join(coordinator, G, joined(a).member_id, protocols=[("roundrobin", b"1"), ("range", b"2")])
    result = joined(ra)
    assert result.protocol_name == "range"  # the only protocol both support
    assert dict((m, md) for m, _, md in result.members)[joined(b).member_id] == b"4"
    bad = join(coordinator, G, protocols=[("sticky", b"")])
    assert bad.value.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    empty = join(coordinator, "other", protocols=[])
    assert empty.value.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL


def test_join_validation_errors():
    coordinator, _, store = make_coordinator(min_session_timeout_ms=6000, max_size=1)
    assert join(coordinator, G, session_ms=5999).value.error == ErrorCode.INVALID_SESSION_TIMEOUT
    assert join(coordinator, "").value.error == ErrorCode.INVALID_GROUP_ID
    assert join(coordinator, G, "someone").value.error == ErrorCode.UNKNOWN_MEMBER_ID
    join(coordinator, G)
    assert join(coordinator, G).value.error == ErrorCode.GROUP_MAX_SIZE_REACHED
    store.local = False
    assert join(coordinator, "x").value.error == ErrorCode.NOT_COORDINATOR


def test_offsets_commit_fetch_and_expire_when_empty():
    coordinator, scheduler, store = make_coordinator(offsets_retention_ms=60_000)
    (a,) = stable_group(coordinator, scheduler, n=1, protocols=[("range", encode_subscription(["t"]))])
    committed = OffsetAndMetadata(42, 3, "meta", scheduler.now)
    assert coordinator.commit_offsets(G, a, None, 1, {("t", 0): committed}) == {("t", 0): ErrorCode.NONE}
    assert coordinator.commit_offsets(G, "x", None, 1, {("t", 1): committed}) == \
        {("t", 1): ErrorCode.UNKNOWN_MEMBER_ID}
    assert coordinator.commit_offsets(G, a, None, 7, {("t", 1): committed}) == \
        {("t", 1): ErrorCode.ILLEGAL_GENERATION}
    too_long = OffsetAndMetadata(1, -1, "m" * 5000, 0)
    assert coordinator.commit_offsets(G, a, None, 1, {("t", 2): too_long}) == \
        {("t", 2): ErrorCode.OFFSET_METADATA_TOO_LARGE}
    assert coordinator.fetch_offsets(G, None) == (ErrorCode.NONE, {("t", 0): committed})
    # Offsets of a stable group's subscribed topics never expire ...
    for _ in range(24):
        scheduler.advance(5000)
        assert coordinator.heartbeat(G, a, None, 1) == ErrorCode.NONE
    assert coordinator.cleanup_group_metadata() == 0
    # ... but once the group is empty they expire a retention period later, and so does it.
    coordinator.leave_group(G, [(a, None, None)])
    scheduler.advance(59_999)
    assert coordinator.cleanup_group_metadata() == 0
    scheduler.advance(2)
    assert coordinator.cleanup_group_metadata() == 1
    assert G not in coordinator.groups
    assert store.writes[-1] == ("tombstones", G, [("t", 0)], True)


def test_standalone_commits_create_an_empty_group_and_delete_groups():
    coordinator, scheduler, store = make_coordinator()
    committed = OffsetAndMetadata(5, -1, "", scheduler.now)
    assert coordinator.commit_offsets("solo", "", None, -1, {("t", 0): committed}) == \
        {("t", 0): ErrorCode.NONE}
    assert coordinator.commit_offsets("solo2", "m", None, 4, {("t", 0): committed}) == \
        {("t", 0): ErrorCode.ILLEGAL_GENERATION}
    assert coordinator.delete_groups(["solo", "nope"]) == \
        {"solo": ErrorCode.NONE, "nope": ErrorCode.GROUP_ID_NOT_FOUND}
    assert "solo" not in coordinator.groups
    # A group that only stored offsets (generation 0) leaves no group tombstone.
    assert store.writes[-1] == ("tombstones", "solo", [("t", 0)], False)


def test_load_restores_stable_group_whose_silent_members_then_expire():
    coordinator, scheduler, _ = make_coordinator()
    coordinator.active = False
    loaded = LoadedState(
        groups={G: GroupMetadataValue("consumer", 4, "range", "m1", scheduler.now, [
            MemberRecord("m1", "i1", "c", "/h", 30000, 6000, b"sub", b"asg")])},
        offsets={G: {("t", 0): OffsetAndMetadata(9)}, "offsets-only": {("t", 1): OffsetAndMetadata(1)}})
    coordinator.startup(loaded)
    group = coordinator.groups[G]
    assert (group.state, group.generation_id, group.static_members) == (STABLE, 4, {"i1": "m1"})
    assert coordinator.groups["offsets-only"].state is EMPTY
    assert synced(sync(coordinator, G, "m1", 4, instance_id="i1")).assignment == b"asg"
    scheduler.advance(6001)
    assert group.state is EMPTY and group.generation_id == 5
