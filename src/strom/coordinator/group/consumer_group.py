"""KIP-848 consumer groups: ConsumerGroupHeartbeat with server-side assignment.

Instead of JoinGroup/SyncGroup rounds, each member sends heartbeats carrying its subscription
and the partitions it owns. The coordinator keeps three epochs: the group epoch (bumped when
membership, a subscription or a subscribed topic's partitions change), the target assignment
epoch (the group epoch the server-side assignor last ran for) and each member's epoch. A
member moves towards its target assignment one safe step at a time, as Kafka's
CurrentAssignmentBuilder does:

- partitions it must give up are first taken away (state unrevoked_partitions) and it keeps
  its epoch until its heartbeat no longer reports them;
- partitions another member still owns are withheld (state unreleased_partitions) until that
  member has released them;
- otherwise it reaches the target epoch (state stable).

A partition is therefore never owned by two members at once, and members whose partitions do
not move are never disturbed. Sessions expire after group.consumer.session.timeout.ms; a
member that does not revoke within its rebalance timeout is fenced.

Strom keeps these groups in memory only: their committed offsets are persisted like any other
group's, but membership is not, so after a broker restart members get UNKNOWN_MEMBER_ID and
rejoin (with their committed offsets).
"""

from __future__ import annotations

import base64
import enum
import logging
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from strom.coordinator.group.assignors import ASSIGNORS, MemberSubscription, TopicInfo
from strom.coordinator.group.config import CONSUMER
from strom.coordinator.group.consumer_protocol import PROTOCOL_TYPE, encode_assignment
from strom.coordinator.group.coordinator import GroupSummary
from strom.coordinator.group.epoch_group import (
    LEAVE_GROUP_MEMBER_EPOCH,
    Assignment,
    EpochGroup,
    EpochGroupCoordinator,
    Heartbeat,
    HeartbeatMember,
    HeartbeatResponse,
    SubscriptionMetadata,
    invalid,
)
from strom.coordinator.group.metadata import Group, GroupMetadata, TopicPartition
from strom.protocol.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE = 68, 69
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2


class ConsumerGroupState(enum.Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


class MemberState(enum.Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


@dataclass(eq=False, slots=True)
class ConsumerGroupMember(HeartbeatMember):
    instance_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    previous_member_epoch: int = 0
    state: MemberState = MemberState.STABLE
    pending_revocation: Assignment = field(default_factory=dict)
    rebalance_timer: Any = None


class ConsumerGroup(Group, EpochGroup):
    group_type = CONSUMER
    members: dict[str, ConsumerGroupMember]

    def __init__(self, group_id: str, now_ms: int) -> None:
        super().__init__(group_id, now_ms)
        self.init_epochs()
        self.static_members: dict[str, str] = {}
        self.assignor_name = ""
        self.dead = False

    def __repr__(self) -> str:
        return f"ConsumerGroup({self.group_id!r}, {self.state.value}, epoch={self.group_epoch})"

    @property
    def state(self) -> ConsumerGroupState:
        if self.dead:
            return ConsumerGroupState.DEAD
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        for m in self.members.values():
            if m.member_epoch != self.assignment_epoch or m.state is not MemberState.STABLE:
                return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    @property
    def state_name(self) -> str:
        return self.state.value

    @property
    def is_dead(self) -> bool:
        return self.dead

    @property
    def is_empty(self) -> bool:
        return not self.members

    def subscribes(self, topic: str) -> bool:
        for m in self.members.values():
            if topic in m.subscribed_topic_names or _regex_matches(m.subscribed_topic_regex, topic):
                return True
        return False

    def is_subscribed_to(self, topic: str) -> bool:
        return self.subscribes(topic)

    def expired_offsets(self, now_ms: int, retention_ms: int) -> list[TopicPartition]:
        keep = {t for t, _ in self.offsets if self.subscribes(t)}
        return self._expired(now_ms, retention_ms, lambda c: c.commit_timestamp, keep)

    def owned_by_others(self, member: ConsumerGroupMember) -> set[tuple[uuid.UUID, int]]:
        out = set()
        for other in self.members.values():
            if other is member:
                continue
            for parts in (other.assigned, other.pending_revocation):
                for topic_id, ps in parts.items():
                    out.update((topic_id, p) for p in ps)
        return out


def _regex_matches(regex: str | None, topic: str) -> bool:
    if not regex or topic.startswith("__"):
        return False
    try:
        return re.fullmatch(regex, topic) is not None
    except re.error:
        return False


def _new_member_id() -> str:
    """Kafka's Uuid.toString(): URL-safe base64 of the 16 bytes, unpadded."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


@dataclass(slots=True)
class HeartbeatRequest(Heartbeat):
    instance_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: list[tuple[uuid.UUID, list[int]]] | None = None
    version: int = 0


class ConsumerGroupCoordinator(EpochGroupCoordinator):
    """The KIP-848 half of the group coordinator; shares its groups, timers and offsets."""

    def __init__(self, coordinator: Any, topics: Callable[[], Mapping[str, Any]]) -> None:
        self.coordinator = coordinator
        self.topics = topics

    @property
    def config(self):
        return self.coordinator.config

    # --- ConsumerGroupHeartbeat -----------------------------------------------------------------
    def heartbeat(self, req: HeartbeatRequest) -> HeartbeatResponse:
        """Raises KafkaError with the code and message of the error response."""
        if CONSUMER not in self.config.rebalance_protocols:
            raise KafkaError("the consumer group protocol is not enabled "
                             "(group.coordinator.rebalance.protocols)", ErrorCode.UNSUPPORTED_VERSION)
        self._validate(req)
        error = self.coordinator.validate_group_status(req.group_id, CONSUMER_GROUP_HEARTBEAT)
        if error is not None:
            raise KafkaError(error.name, error)
        if req.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
            return self._leave(req)
        group = self._get_or_maybe_create(req.group_id, req.member_epoch)
        if not req.member_id:
            req.member_id = _new_member_id()
        if req.member_id not in group.members and len(group.members) >= self.config.consumer_max_size:
            raise KafkaError(f"the consumer group has reached its maximum capacity of "
                             f"{self.config.consumer_max_size} members", ErrorCode.GROUP_MAX_SIZE_REACHED)
        member = self._get_or_maybe_subscribe(group, req)
        self._advance_epoch(group, self._update_member(group, member, req))
        before = _copy(member.assigned)
        self._maybe_reconcile(group, member, req.owned)
        self._schedule_session_timeout(group, member)
        full = req.member_epoch == 0 or (req.rebalance_timeout_ms != -1 and req.owned is not None and (
            req.subscribed_topic_names is not None or req.subscribed_topic_regex is not None))
        changed = before != member.assigned
        return HeartbeatResponse(member.member_id, member.member_epoch, self._heartbeat_interval_ms(group.group_id),
                                 member.assigned if full or changed else None)

    def _validate(self, req: HeartbeatRequest) -> None:
        if not req.group_id:
            raise invalid("GroupId can't be empty.")
        if req.instance_id == "":
            raise invalid("InstanceId can't be empty.")
        if req.rack_id == "":
            raise invalid("RackId can't be empty.")
        if req.version >= 1 and not req.member_id:
            raise invalid("MemberId can't be empty.")
        if req.member_epoch > 0 or req.member_epoch == LEAVE_GROUP_MEMBER_EPOCH:
            if not req.member_id:
                raise invalid("MemberId can't be empty.")
        elif req.member_epoch == 0:
            if req.rebalance_timeout_ms == -1:
                raise invalid("RebalanceTimeoutMs must be provided in first request.")
            if req.owned is None or req.owned:
                raise invalid("TopicPartitions must be empty when (re-)joining.")
            if not req.subscribed_topic_names and not req.subscribed_topic_regex:
                raise invalid("SubscribedTopicNames or SubscribedTopicRegex must be set in first "
                              "request.")
        elif req.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            if not req.member_id:
                raise invalid("MemberId can't be empty.")
            if req.instance_id is None:
                raise invalid("InstanceId can't be null.")
        else:
            raise invalid("MemberEpoch is invalid.")
        if req.subscribed_topic_regex:
            try:
                re.compile(req.subscribed_topic_regex)
            except re.error as e:
                raise invalid(f"SubscribedTopicRegex is invalid: {e}") from None
        if req.server_assignor is not None and req.server_assignor not in self._assignors():
            raise KafkaError(f"ServerAssignor {req.server_assignor} is not supported. Supported "
                             f"assignors: {', '.join(self._assignors())}.",
                             ErrorCode.UNSUPPORTED_ASSIGNOR)

    def _assignors(self) -> list[str]:
        return [a for a in self.config.consumer_assignors if a in ASSIGNORS] or ["uniform"]

    def _get_or_maybe_create(self, group_id: str, member_epoch: int) -> ConsumerGroup:
        groups = self.coordinator.groups
        group = groups.get(group_id)
        if isinstance(group, ConsumerGroup) and not group.dead:
            return group
        share_groups = self.coordinator.share_groups
        if group is None and share_groups is not None and group_id in share_groups.groups:
            raise KafkaError(f"Group {group_id} is not a consumer group.", ErrorCode.GROUP_ID_NOT_FOUND)
        if group is not None and not (isinstance(group, GroupMetadata) and group.is_empty):
            raise KafkaError(f"Group {group_id} is not a consumer group.", ErrorCode.GROUP_ID_NOT_FOUND)
        if member_epoch != 0:
            # Strom does not persist consumer group membership: after a restart a member that
            # comes back with its epoch is told to rejoin, keeping its committed offsets.
            raise KafkaError(f"Consumer group {group_id} has no member with this id.",
                             ErrorCode.UNKNOWN_MEMBER_ID)
        fresh = ConsumerGroup(group_id, self.coordinator.scheduler.now_ms())
        if group is not None:  # an empty classic group (or its offsets) becomes a consumer group
            fresh.offsets = group.offsets
            self.coordinator.cancel_classic_timers(group)
        groups[group_id] = fresh
        return fresh

    def _get_or_maybe_subscribe(self, group: ConsumerGroup, req: HeartbeatRequest
                                ) -> ConsumerGroupMember:
        if req.instance_id is None:
            member = group.members.get(req.member_id)
            if member is None:
                if req.member_epoch != 0:
                    raise KafkaError(f"Member {req.member_id} is not a member of group "
                                     f"{group.group_id}.", ErrorCode.UNKNOWN_MEMBER_ID)
                member = ConsumerGroupMember(req.member_id)
                group.members[req.member_id] = member
                log.info("group %s: member %s joins the consumer group", group.group_id,
                         req.member_id)
                return member
            self._check_epoch(member, req)
            return member
        existing_id = group.static_members.get(req.instance_id)
        existing = group.members.get(existing_id) if existing_id else None
        if req.member_epoch == 0:
            if existing is None:
                member = group.members.get(req.member_id) or ConsumerGroupMember(req.member_id)
                group.members[req.member_id] = member
                group.static_members[req.instance_id] = req.member_id
                return member
            if existing.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                raise KafkaError(f"Static member {existing.member_id} with instance id "
                                 f"{req.instance_id} cannot join the group because the instance id "
                                 f"is owned by {existing.member_id} member.",
                                 ErrorCode.UNRELEASED_INSTANCE_ID)
            # A static member returning after a temporary leave takes over its predecessor's
            # assignment under its new member id: no rebalance.
            self._cancel_timers(existing)
            del group.members[existing.member_id]
            existing.member_id = req.member_id
            existing.member_epoch = existing.previous_member_epoch = 0
            group.members[req.member_id] = existing
            group.static_members[req.instance_id] = req.member_id
            if existing_id in group.target:
                group.target[req.member_id] = group.target.pop(existing_id)
            log.info("group %s: static member %s rejoins as %s", group.group_id, req.instance_id,
                     req.member_id)
            return existing
        if existing is None:
            raise KafkaError(f"Instance id {req.instance_id} is unknown.", ErrorCode.UNKNOWN_MEMBER_ID)
        if existing.member_id != req.member_id:
            raise KafkaError(f"Static member {req.member_id} with instance id {req.instance_id} "
                             f"was fenced by member {existing.member_id}.", ErrorCode.FENCED_INSTANCE_ID)
        self._check_epoch(existing, req)
        return existing

    @staticmethod
    def _check_epoch(member: ConsumerGroupMember, req: HeartbeatRequest) -> None:
        epoch = req.member_epoch
        if epoch > member.member_epoch:
            raise KafkaError(f"The consumer group member has a greater member epoch ({epoch}) "
                             f"than the one known by the group coordinator ({member.member_epoch}). "
                             "The member must abandon all its partitions and rejoin.",
                             ErrorCode.FENCED_MEMBER_EPOCH)
        if epoch < member.member_epoch:
            # The response that bumped the epoch may have been lost: the previous epoch is
            # accepted if the member owns nothing it should not.
            owned_ok = req.owned is not None and all(
                set(ps) <= member.assigned.get(tid, set()) for tid, ps in req.owned)
            if epoch != member.previous_member_epoch or not owned_ok:
                raise KafkaError(f"The consumer group member has a smaller member epoch ({epoch}) "
                                 f"than the one known by the group coordinator "
                                 f"({member.member_epoch}). The member must abandon all its "
                                 "partitions and rejoin.", ErrorCode.FENCED_MEMBER_EPOCH)

    def _update_member(self, group: ConsumerGroup, member: ConsumerGroupMember,
                       req: HeartbeatRequest) -> bool:
        """Apply the request's fields; True if the subscription changed (a new group epoch)."""
        if req.instance_id is not None:
            member.instance_id = req.instance_id
        if req.rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
        if req.server_assignor is not None:
            member.server_assignor = req.server_assignor
        changed = req.member_epoch == 0 and member.member_id not in group.target
        if member.update(req):
            changed = True
        if req.subscribed_topic_regex is not None and \
                req.subscribed_topic_regex != (member.subscribed_topic_regex or ""):
            member.subscribed_topic_regex = req.subscribed_topic_regex or None
            changed = True
        return changed

    def _subscription_metadata(self, group: ConsumerGroup) -> SubscriptionMetadata:
        topics = self.topics()
        out = set()
        for name, meta in topics.items():
            if group.subscribes(name):
                out.add((meta.topic_id, name, len(meta.partitions)))
        return frozenset(out)

    def _assign(self, group: ConsumerGroup) -> None:
        topics = {tid: TopicInfo(tid, name, n) for tid, name, n in group.subscription_metadata}
        by_name = {info.name: tid for tid, info in topics.items()}
        members = {}
        for member_id, m in group.members.items():
            subscribed = {by_name[t] for t in by_name
                          if t in m.subscribed_topic_names or _regex_matches(m.subscribed_topic_regex, t)}
            members[member_id] = MemberSubscription(frozenset(subscribed),
                                                    group.target.get(member_id, {}))
        assignor = self._choose_assignor(group)
        group.target = ASSIGNORS[assignor](members, topics)
        group.assignor_name = assignor
        group.assignment_epoch = group.group_epoch
        log.info("group %s: computed target assignment for epoch %d with the %s assignor",
                 group.group_id, group.assignment_epoch, assignor)

    def _choose_assignor(self, group: ConsumerGroup) -> str:
        """The assignor most members asked for, else the first configured one."""
        votes: dict[str, int] = {}
        for m in group.members.values():
            if m.server_assignor:
                votes[m.server_assignor] = votes.get(m.server_assignor, 0) + 1
        if votes:
            return max(votes.items(), key=lambda kv: kv[1])[0]
        return self._assignors()[0]

    def _maybe_reconcile(self, group: ConsumerGroup, member: ConsumerGroupMember,
                         owned: list[tuple[uuid.UUID, list[int]]] | None) -> None:
        target_epoch = group.assignment_epoch
        if member.member_epoch == target_epoch and member.state is MemberState.STABLE:
            return
        target = group.target.get(member.member_id, {})

        def still_owns(revoking: Assignment) -> bool:
            if owned is None:
                return True
            return any(p in revoking.get(tid, ()) for tid, ps in owned for p in ps)

        if member.state is MemberState.UNREVOKED_PARTITIONS and still_owns(member.pending_revocation):
            return  # wait for the member to give the partitions up
        others = group.owned_by_others(member)
        assigned: Assignment = {}
        revoking: Assignment = {}
        pending: Assignment = {}
        unreleased = False
        for tid in set(target) | set(member.assigned):
            want = target.get(tid, set())
            have = member.assigned.get(tid, set())
            keep = have & want
            if keep:
                assigned[tid] = keep
            if have - keep:
                revoking[tid] = have - keep
            new = {p for p in want - keep if (tid, p) not in others}
            unreleased = unreleased or len(new) < len(want - keep)
            if new:
                pending[tid] = new
        previous_state = member.state
        if revoking and still_owns(revoking):
            member.state = MemberState.UNREVOKED_PARTITIONS
            member.assigned, member.pending_revocation = assigned, revoking
        else:
            for tid, ps in pending.items():
                assigned.setdefault(tid, set()).update(ps)
            member.state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
            if member.member_epoch != target_epoch:
                member.previous_member_epoch = member.member_epoch
                member.member_epoch = target_epoch
            member.assigned, member.pending_revocation = assigned, {}
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            if previous_state is not MemberState.UNREVOKED_PARTITIONS:
                self._schedule_rebalance_timeout(group, member)
        else:
            self._cancel_rebalance_timeout(member)

    # --- leaving and fencing --------------------------------------------------------------------
    def _leave(self, req: HeartbeatRequest) -> HeartbeatResponse:
        group = self.coordinator.groups.get(req.group_id)
        if not isinstance(group, ConsumerGroup):
            raise KafkaError(f"Group {req.group_id} not found.", ErrorCode.GROUP_ID_NOT_FOUND)
        interval = self._heartbeat_interval_ms(group.group_id)
        if req.instance_id is None:
            member = group.members.get(req.member_id)
            if member is None:
                raise KafkaError(f"Member {req.member_id} is not a member of group "
                                 f"{group.group_id}.", ErrorCode.UNKNOWN_MEMBER_ID)
        else:
            member_id = group.static_members.get(req.instance_id)
            member = group.members.get(member_id) if member_id else None
            if member is None:
                raise KafkaError(f"Instance id {req.instance_id} is unknown.",
                                 ErrorCode.UNKNOWN_MEMBER_ID)
            if member.member_id != req.member_id:
                raise KafkaError(f"Static member {req.member_id} with instance id "
                                 f"{req.instance_id} was fenced by member {member.member_id}.",
                                 ErrorCode.FENCED_INSTANCE_ID)
            if req.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                # A temporary leave: the assignment is kept for the session timeout.
                log.info("group %s: static member %s with instance id %s temporarily left",
                         group.group_id, member.member_id, req.instance_id)
                member.previous_member_epoch = member.member_epoch
                member.member_epoch = LEAVE_GROUP_STATIC_MEMBER_EPOCH
                self._schedule_session_timeout(group, member)
                return HeartbeatResponse(req.member_id, LEAVE_GROUP_STATIC_MEMBER_EPOCH, interval)
        log.info("group %s: member %s left the consumer group", group.group_id, member.member_id)
        self._fence(group, member)
        return HeartbeatResponse(req.member_id, LEAVE_GROUP_MEMBER_EPOCH, interval)

    def _fence(self, group: ConsumerGroup, member: ConsumerGroupMember) -> None:
        """Remove a member; the others converge on a new target assignment."""
        self._cancel_timers(member)
        group.members.pop(member.member_id, None)
        group.target.pop(member.member_id, None)
        if member.instance_id is not None and group.static_members.get(member.instance_id) == member.member_id:
            del group.static_members[member.instance_id]
        group.group_epoch += 1
        group.subscription_metadata = self._subscription_metadata(group)
        group.current_state_timestamp = self.coordinator.scheduler.now_ms()
        self._assign(group)

    def _session_timeout_ms(self, group: ConsumerGroup) -> int:
        return self._group_setting(group.group_id, "consumer.session.timeout.ms",
                                   self.config.consumer_session_timeout_ms)

    def _heartbeat_interval_ms(self, group_id: str) -> int:
        return self._group_setting(group_id, "consumer.heartbeat.interval.ms",
                                   self.config.consumer_heartbeat_interval_ms)

    def _session_expired(self, group: ConsumerGroup, member: ConsumerGroupMember) -> None:
        log.info("group %s: member %s fenced because its session expired", group.group_id, member.member_id)
        self._fence(group, member)

    def _schedule_rebalance_timeout(self, group: ConsumerGroup, member: ConsumerGroupMember) -> None:
        self._cancel_rebalance_timeout(member)
        epoch = member.member_epoch

        def expire() -> None:
            member.rebalance_timer = None
            if group.members.get(member.member_id) is member and member.member_epoch == epoch \
                    and member.state is MemberState.UNREVOKED_PARTITIONS:
                log.info("group %s: member %s fenced because it did not revoke its partitions "
                         "within the rebalance timeout", group.group_id, member.member_id)
                self._fence(group, member)

        timeout = member.rebalance_timeout_ms if member.rebalance_timeout_ms > 0 else 300_000
        member.rebalance_timer = self.coordinator.scheduler.call_later(timeout, expire)

    @staticmethod
    def _cancel_rebalance_timeout(member: ConsumerGroupMember) -> None:
        if member.rebalance_timer is not None:
            member.rebalance_timer.cancel()
            member.rebalance_timer = None

    def _cancel_timers(self, member: ConsumerGroupMember) -> None:
        self._cancel_rebalance_timeout(member)
        if member.session_timer is not None:
            member.session_timer.cancel()
            member.session_timer = None

    def unload(self, group: ConsumerGroup) -> None:
        group.dead = True
        for member in group.members.values():
            self._cancel_timers(member)

    # --- offsets --------------------------------------------------------------------------------
    def validate_commit(self, group: ConsumerGroup, member_id: str, member_epoch: int
                        ) -> ErrorCode | None:
        if member_epoch < 0 and not group.members:
            return None  # admin tools and standalone consumers commit to an empty group
        return self.validate_member(group, member_id, member_epoch)

    @staticmethod
    def validate_member(group: ConsumerGroup, member_id: str | None, member_epoch: int
                        ) -> ErrorCode | None:
        member = group.members.get(member_id or "")
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if member_epoch > member.member_epoch:
            return ErrorCode.FENCED_MEMBER_EPOCH
        if member_epoch < member.member_epoch:
            return ErrorCode.STALE_MEMBER_EPOCH
        return None

    # --- describing -----------------------------------------------------------------------------
    def describe(self, group_id: str) -> dict:
        error = self.coordinator.validate_group_status(group_id, CONSUMER_GROUP_DESCRIBE)
        base = {"group_id": group_id, "group_state": "", "group_epoch": -1, "assignment_epoch": -1,
                "assignor_name": "", "members": [], "error_message": None}
        if error is not None:
            return {**base, "error_code": error}
        group = self.coordinator.groups.get(group_id)
        if not isinstance(group, ConsumerGroup) or group.dead:
            message = f"Group {group_id} not found." if group is None else \
                f"Group {group_id} is not a consumer group."
            return {**base, "error_code": ErrorCode.GROUP_ID_NOT_FOUND, "error_message": message}
        names = {meta.topic_id: name for name, meta in self.topics().items()}

        def described(parts: Assignment) -> dict:
            return {"topic_partitions": [
                {"topic_id": tid, "topic_name": names.get(tid, ""), "partitions": sorted(ps)}
                for tid, ps in sorted(parts.items(), key=lambda kv: names.get(kv[0], ""))]}

        return {**base, "error_code": ErrorCode.NONE, "group_state": group.state_name,
                "group_epoch": group.group_epoch, "assignment_epoch": group.assignment_epoch,
                "assignor_name": group.assignor_name or self._choose_assignor(group),
                "members": [{
                    "member_id": m.member_id, "instance_id": m.instance_id, "rack_id": m.rack_id,
                    "member_epoch": m.member_epoch, "client_id": m.client_id,
                    "client_host": m.client_host,
                    "subscribed_topic_names": sorted(m.subscribed_topic_names),
                    "subscribed_topic_regex": m.subscribed_topic_regex,
                    "assignment": described(m.assigned),
                    "target_assignment": described(group.target.get(m.member_id, {})),
                    "member_type": 1,
                } for m in group.members.values()]}

    def summary(self, group: ConsumerGroup, with_members: bool) -> GroupSummary:
        summary = GroupSummary(group.group_id, group.state_name, PROTOCOL_TYPE,
                               group.assignor_name, group_type=CONSUMER)
        if with_members:
            names = {meta.topic_id: name for name, meta in self.topics().items()}
            summary.members = [
                {"member_id": m.member_id, "group_instance_id": m.instance_id,
                 "client_id": m.client_id, "client_host": m.client_host, "member_metadata": b"",
                 "member_assignment": encode_assignment(
                     {names[t]: sorted(ps) for t, ps in m.assigned.items() if t in names})}
                for m in group.members.values()]
        return summary


def _copy(parts: Assignment) -> Assignment:
    return {tid: set(ps) for tid, ps in parts.items()}
