"""GroupMetadata: a classic group's state machine, members and committed offsets.

States and their legal predecessors are Kafka's (seed 002's GroupState):

    Empty               <- PreparingRebalance
    PreparingRebalance  <- Stable, CompletingRebalance, Empty
    CompletingRebalance <- PreparingRebalance
    Stable              <- CompletingRebalance
    Dead                <- any state (the group is being removed)

The coordinator drives the transitions; this class keeps the bookkeeping that must stay
consistent with them: the leader, the static instance id -> member id map, the members that
have a member id but have not joined yet (KIP-394), the members a new generation still waits
for in SyncGroup, and how many members support each protocol.
"""

from __future__ import annotations

import enum
import uuid
from collections import Counter

from strom.coordinator.group.consumer_protocol import PROTOCOL_TYPE, decode_subscription
from strom.coordinator.group.member import JoinCallback, MemberMetadata
from strom.coordinator.group.records import OffsetAndMetadata

TopicPartition = tuple[str, int]


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"

    def __str__(self) -> str:
        return self.value


EMPTY, PREPARING_REBALANCE, COMPLETING_REBALANCE, STABLE, DEAD = GroupState

VALID_PREVIOUS_STATES: dict[GroupState, frozenset[GroupState]] = {
    EMPTY: frozenset({PREPARING_REBALANCE}),
    PREPARING_REBALANCE: frozenset({STABLE, COMPLETING_REBALANCE, EMPTY}),
    COMPLETING_REBALANCE: frozenset({PREPARING_REBALANCE}),
    STABLE: frozenset({COMPLETING_REBALANCE}),
    DEAD: frozenset(GroupState),
}


class IllegalStateTransition(RuntimeError):
    pass


class Group:
    """What every group type shares: an id, committed offsets and their expiry."""

    group_type = "classic"

    def __init__(self, group_id: str, now_ms: int) -> None:
        self.group_id = group_id
        self.offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        self.current_state_timestamp: int | None = now_ms

    @property
    def state_name(self) -> str:
        raise NotImplementedError

    @property
    def is_dead(self) -> bool:
        raise NotImplementedError

    @property
    def is_empty(self) -> bool:
        raise NotImplementedError

    def expired_offsets(self, now_ms: int, retention_ms: int) -> list[TopicPartition]:
        raise NotImplementedError

    def _expired(self, now_ms: int, retention_ms: int, base_timestamp, keep_topics=frozenset()
                 ) -> list[TopicPartition]:
        out = []
        for tp, committed in self.offsets.items():
            if tp[0] in keep_topics:
                continue
            if committed.expire_timestamp is not None:  # commits of v2-v4 with a retention time
                if now_ms >= committed.expire_timestamp:
                    out.append(tp)
            elif now_ms - base_timestamp(committed) >= retention_ms:
                out.append(tp)
        return out

    def is_subscribed_to(self, topic: str) -> bool:
        raise NotImplementedError


class GroupMetadata(Group):
    """A classic (JoinGroup/SyncGroup) group."""

    def __init__(self, group_id: str, now_ms: int, state: GroupState = EMPTY) -> None:
        super().__init__(group_id, now_ms)
        self.state = state
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.generation_id = 0
        self.leader_id: str | None = None
        self.members: dict[str, MemberMetadata] = {}
        self.static_members: dict[str, str] = {}
        self.pending_members: set[str] = set()
        self.pending_sync_members: set[str] = set()
        self.supported_protocols: Counter[str] = Counter()
        self.new_member_added = False
        self.subscribed_topics: set[str] | None = None
        # Timers and delayed operations the coordinator arms; kept here so that they die
        # with the group.
        self.delayed_join = None
        self.sync_timer = None
        self.pending_timers: dict[str, object] = {}

    def __repr__(self) -> str:
        return (f"GroupMetadata({self.group_id!r}, {self.state}, generation={self.generation_id}, "
                f"members={len(self.members)})")

    # --- state --------------------------------------------------------------------------------
    @property
    def state_name(self) -> str:
        return self.state.value

    @property
    def is_dead(self) -> bool:
        return self.state is DEAD

    @property
    def is_empty(self) -> bool:
        return self.state is EMPTY

    def is_(self, state: GroupState) -> bool:
        return self.state is state

    def transition_to(self, state: GroupState, now_ms: int) -> None:
        if self.state not in VALID_PREVIOUS_STATES[state]:
            raise IllegalStateTransition(
                f"group {self.group_id} cannot move from {self.state} to {state}")
        self.state = state
        self.current_state_timestamp = now_ms

    def can_rebalance(self) -> bool:
        return self.state in VALID_PREVIOUS_STATES[PREPARING_REBALANCE]

    # --- members ------------------------------------------------------------------------------
    def has(self, member_id: str) -> bool:
        return member_id in self.members

    def get(self, member_id: str) -> MemberMetadata:
        return self.members[member_id]

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def is_pending_member(self, member_id: str) -> bool:
        return member_id in self.pending_members

    def static_member_id(self, instance_id: str | None) -> str | None:
        return None if instance_id is None else self.static_members.get(instance_id)

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def num_awaiting_join(self) -> int:
        return sum(1 for m in self.members.values() if m.is_awaiting_join)

    def has_all_members_joined(self) -> bool:
        return not self.pending_members and all(m.is_awaiting_join for m in self.members.values())

    def not_yet_rejoined_members(self) -> list[MemberMetadata]:
        return [m for m in self.members.values() if not m.is_awaiting_join]

    def generate_member_id(self, client_id: str, instance_id: str | None) -> str:
        return f"{instance_id if instance_id is not None else client_id}-{uuid.uuid4()}"

    def add(self, member: MemberMetadata, callback: JoinCallback | None = None) -> None:
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self.supported_protocols.update(member.protocols())
        member.awaiting_join = callback
        self.pending_members.discard(member.member_id)

    def remove(self, member_id: str) -> MemberMetadata | None:
        member = self.members.pop(member_id, None)
        if member is not None:
            self.supported_protocols.subtract(member.protocols())
            self.supported_protocols += Counter()  # drop protocols nobody supports any more
            if member.group_instance_id is not None:
                self.static_members.pop(member.group_instance_id, None)
        if self.is_leader(member_id):
            self.leader_id = next(iter(self.members), None)
        self.pending_members.discard(member_id)
        self.pending_sync_members.discard(member_id)
        return member

    def update_member(self, member: MemberMetadata, protocols: list[tuple[str, bytes]],
                      rebalance_timeout_ms: int, session_timeout_ms: int,
                      callback: JoinCallback | None) -> None:
        self.supported_protocols.subtract(member.protocols())
        member.supported_protocols = protocols
        self.supported_protocols.update(member.protocols())
        self.supported_protocols += Counter()
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        member.awaiting_join = callback

    def replace_static_member(self, instance_id: str, old_member_id: str, new_member_id: str
                              ) -> tuple[MemberMetadata, JoinCallback | None, object]:
        """Give a static member's metadata to its new member id. Returns the member and the
        old incarnation's pending callbacks, which the caller fences."""
        member = self.members.pop(old_member_id)
        old_join, old_sync = member.awaiting_join, member.awaiting_sync
        member.awaiting_join = member.awaiting_sync = None
        member.member_id = new_member_id
        self.members[new_member_id] = member
        if self.is_leader(old_member_id):
            self.leader_id = new_member_id
        if old_member_id in self.pending_sync_members:
            self.pending_sync_members.discard(old_member_id)
            self.pending_sync_members.add(new_member_id)
        self.static_members[instance_id] = new_member_id
        return member, old_join, old_sync

    def maybe_elect_new_joined_leader(self) -> bool:
        """Make sure the leader is a member that rejoined; False if nobody did."""
        if self.leader_id is None:
            return False
        if self.get(self.leader_id).is_awaiting_join:
            return True
        for member_id, member in self.members.items():
            if member.is_awaiting_join:
                self.leader_id = member_id
                return True
        return False

    # --- protocols ----------------------------------------------------------------------------
    def supports_protocols(self, protocol_type: str, protocols: set[str]) -> bool:
        if self.is_(EMPTY):
            return bool(protocol_type) and bool(protocols)
        n = len(self.members)
        return self.protocol_type == protocol_type and any(
            self.supported_protocols[p] == n for p in protocols)

    def select_protocol(self) -> str:
        """The protocol every member supports that gets the most first-choice votes."""
        n = len(self.members)
        candidates = {p for p, count in self.supported_protocols.items() if count == n}
        votes = Counter(m.vote(candidates) for m in self.members.values())
        return max(votes.items(), key=lambda item: item[1])[0]

    def current_member_metadata(self) -> list[tuple[str, str | None, bytes]]:
        """What the leader gets in its JoinGroup response: every member's metadata for the
        selected protocol."""
        return [(m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
                for m in self.members.values()]

    def init_next_generation(self, now_ms: int) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition_to(COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.transition_to(EMPTY, now_ms)
        self.subscribed_topics = self.compute_subscribed_topics()
        self.pending_sync_members.clear()

    def compute_subscribed_topics(self) -> set[str] | None:
        """The topics consumers of the current generation subscribe to; None when unknown
        (not a consumer group)."""
        if self.protocol_type != PROTOCOL_TYPE or self.protocol_name is None:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            topics.update(decode_subscription(member.metadata(self.protocol_name)).topics)
        return topics

    def is_subscribed_to(self, topic: str) -> bool:
        return self.subscribed_topics is not None and topic in self.subscribed_topics

    # --- offsets ------------------------------------------------------------------------------
    def expired_offsets(self, now_ms: int, retention_ms: int) -> list[TopicPartition]:
        """Kafka's rules: an empty group's offsets expire `retention_ms` after it became empty;
        a stable consumer group's offsets of topics it no longer subscribes to expire after
        their last commit; offsets of a group that never had members (standalone consumers
        committing only) expire after their last commit."""
        if self.protocol_type is None:
            return self._expired(now_ms, retention_ms, lambda c: c.commit_timestamp)
        if self.is_(EMPTY):
            since = self.current_state_timestamp
            return self._expired(now_ms, retention_ms,
                                 lambda c: since if since is not None else c.commit_timestamp)
        if self.protocol_type == PROTOCOL_TYPE and self.subscribed_topics is not None \
                and self.is_(STABLE):
            return self._expired(now_ms, retention_ms, lambda c: c.commit_timestamp,
                                 self.subscribed_topics)
        return []
