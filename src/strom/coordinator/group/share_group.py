"""KIP-932 share groups: ShareGroupHeartbeat with server-side assignment.

A share group's members read partitions together, so an assignment never has to be taken
away before it is given: there is no revocation step as in KIP-848. The coordinator keeps a
group epoch (bumped when membership, a subscription or a subscribed topic's partitions
change), recomputes the target assignment for it (`simple_assign`), and every member gets its
new assignment with its next heartbeat, its member epoch becoming the group epoch. A member
whose heartbeat carries another epoch is fenced (FENCED_MEMBER_EPOCH), an unknown member id is
UNKNOWN_MEMBER_ID; both rejoin with epoch 0. Sessions expire after
group.share.session.timeout.ms. Whoever listens (the broker's SharePartitionManager) hears of
every member fenced by its session timeout, so the records it holds go back to the group at
once. A member that leaves (epoch -1) is not announced: a closing consumer acknowledges what it
holds after its leave heartbeat (its final ShareAcknowledge, epoch -1, which also gives back
the rest), as in Kafka, where the partition leaders never hear of a leave either.

There is no bound on the number of share groups: Kafka 4.1 removed group.share.max.groups
(4.0 only sized its share session cache with it), and an empty group stays until deleted.

Share groups share the group id namespace with classic and consumer groups: a group id in use
by another type answers GROUP_ID_NOT_FOUND, as Kafka does. Membership survives a restart or a
failover of the coordinator: as in Kafka, a group is kept in `__consumer_offsets` as
ShareGroupMetadata (group epoch), ShareGroupMemberMetadata, ShareGroupTargetAssignmentMetadata
and -Member, and ShareGroupCurrentMemberAssignment records (Kafka's key and value schemas). A
heartbeat that changes any of them appends what changed (tombstones for a member that went) and
is answered once that is replicated (acks=all, awaited by the request handler). The group
coordinator's replay of a `__consumer_offsets` partition, when this broker starts leading it,
collects the share group records too (`manager.py`), and `load` restores those groups: a member
comes back with its member id and epoch, its session timer started again. When leadership
leaves, `unload_partition` drops the partition's groups. The share-partition state lives in
`__share_group_state`.
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from strom.coordinator import GROUP_METADATA_TOPIC, log_store
from strom.coordinator.group import records
from strom.coordinator.group.epoch_group import (
    LEAVE_GROUP_MEMBER_EPOCH,
    Assignment,
    EpochGroup,
    EpochGroupCoordinator,
    HeartbeatMember,
    SubscriptionMetadata,
    invalid,
)
from strom.coordinator.group.epoch_group import Heartbeat as ShareHeartbeat
from strom.coordinator.group.epoch_group import HeartbeatResponse as ShareHeartbeatResult
from strom.coordinator.group.manager import ShareGroupRecords
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.record_schema import RecordFormatError

log = logging.getLogger(__name__)

SHARE = "share"
SHARE_GROUP_HEARTBEAT = 76
# A share member's heartbeat, and its answer, have only what every member's have: ShareHeartbeat
# and ShareHeartbeatResult are epoch_group's Heartbeat and HeartbeatResponse.


class ShareGroupState(enum.Enum):
    EMPTY = "Empty"
    STABLE = "Stable"
    DEAD = "Dead"


class ShareGroupMember(HeartbeatMember):
    """A share group member has only what every heartbeating member has."""

    __slots__ = ()


class ShareGroup(EpochGroup):
    group_type = SHARE
    members: dict[str, ShareGroupMember]

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.init_epochs()
        # What `__consumer_offsets` holds for the group: each record's key and value.
        self.stored: dict[bytes, bytes] = {}

    def records(self) -> dict[bytes, bytes]:
        """The group as Kafka's share group records (key -> value)."""
        g, K = self.group_id, records.ShareGroupKey
        out = {records.share_group_key(K(records.SHARE_GROUP_METADATA, g)):
               records.share_group_epoch_value(self.group_epoch),
               records.share_group_key(K(records.SHARE_GROUP_TARGET_ASSIGNMENT_METADATA, g)):
               records.share_group_epoch_value(self.assignment_epoch)}
        for m in self.members.values():
            out[records.share_group_key(K(records.SHARE_GROUP_MEMBER_METADATA, g, m.member_id))] = \
                records.share_member_metadata_value(m.rack_id, m.client_id, m.client_host, m.subscribed_topic_names)
            out[records.share_group_key(K(records.SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT, g, m.member_id))] = \
                records.share_current_assignment_value(m.member_epoch, m.member_epoch, m.assigned)
        for member_id, target in self.target.items():
            out[records.share_group_key(K(records.SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER, g, member_id))] = \
                records.share_target_member_value(target)
        return out

    @property
    def state(self) -> ShareGroupState:
        return ShareGroupState.STABLE if self.members else ShareGroupState.EMPTY

    def subscribed_topics(self) -> set[str]:
        return {t for m in self.members.values() for t in m.subscribed_topic_names}


def simple_assign(members: Mapping[str, set[str]], topics: Mapping[str, tuple[uuid.UUID, int]]
                  ) -> dict[str, Assignment]:
    """Kafka's simple share assignor in spirit: each subscribed partition goes to one of its
    subscribers round-robin, and when a topic has more subscribers than partitions the
    partitions are shared so that every subscriber gets one."""
    out: dict[str, Assignment] = {m: {} for m in members}
    for name in sorted(topics):
        topic_id, count = topics[name]
        subscribers = sorted(m for m, subs in members.items() if name in subs)
        if not subscribers or count <= 0:
            continue
        if len(subscribers) <= count:
            pairs = [(subscribers[p % len(subscribers)], p) for p in range(count)]
        else:
            pairs = [(m, i % count) for i, m in enumerate(subscribers)]
        for member_id, p in pairs:
            out[member_id].setdefault(topic_id, set()).add(p)
    return out


@dataclass(frozen=True, slots=True)
class ShareGroupSettings:
    session_timeout_ms: int = 45000  # group.share.session.timeout.ms
    heartbeat_interval_ms: int = 5000  # group.share.heartbeat.interval.ms
    max_size: int = 200  # group.share.max.size

    @classmethod
    def from_broker_config(cls, config: Any) -> ShareGroupSettings:
        return cls(config["group.share.session.timeout.ms"], config["group.share.heartbeat.interval.ms"],
                   config["group.share.max.size"])


class ShareGroupCoordinator(EpochGroupCoordinator):
    """The share-group half of the group coordinator: its own groups, the coordinator's timers
    and group id namespace."""

    def __init__(self, coordinator: Any, topics: Callable[[], Mapping[str, Any]],
                 settings: ShareGroupSettings) -> None:
        self.coordinator = coordinator
        self.topics = topics
        self.settings = settings
        # The share groups of the `__consumer_offsets` partitions led here.
        self.groups: dict[str, ShareGroup] = {}
        # Called with (group id, member id) when a member is fenced (its session timed out).
        self.member_listeners: list[Callable[[str, str], None]] = []
        # The stored records of groups deleted whose tombstones could not be written yet.
        self._deleted: dict[str, dict[bytes, bytes]] = {}

    # --- loading and storing ---------------------------------------------------------------------
    def load(self, found: Mapping[str, ShareGroupRecords]) -> None:
        """Restore the share groups whose records the replay of a `__consumer_offsets`
        partition found (a group already here is replaced, its timers stopped)."""
        for group_id, stored in found.items():
            self._drop(group_id)
            try:
                group = self._restore(group_id, stored)
            except (RecordFormatError, ValueError) as e:
                log.warning("share group %s: its records do not parse, not loaded: %s", group_id, e)
                continue
            if group is not None:
                self.groups[group_id] = group
                log.info("share group %s: loaded at group epoch %d with %d members", group_id,
                         group.group_epoch, len(group.members))

    def unload_partition(self, partition: int | None) -> None:
        """Leadership of `__consumer_offsets` partition `partition` (None: all) left this
        broker: its share groups are dropped here, their session timers stopped."""
        partition_for = self.coordinator.store.partition_for
        for group_id in [g for g in self.groups if partition is None or partition_for(g) == partition]:
            self._drop(group_id)

    def _drop(self, group_id: str) -> None:
        group = self.groups.pop(group_id, None)
        if group is None:
            return
        for member in group.members.values():
            if member.session_timer is not None:
                member.session_timer.cancel()
                member.session_timer = None

    def _restore(self, group_id: str, stored: ShareGroupRecords) -> ShareGroup | None:
        group = ShareGroup(group_id)
        has_metadata = False
        for key, data in stored.values():
            value = records.read_share_group_value(key.record_type, data)
            if key.record_type == records.SHARE_GROUP_METADATA:
                group.group_epoch, has_metadata = value, True
            elif key.record_type == records.SHARE_GROUP_TARGET_ASSIGNMENT_METADATA:
                group.assignment_epoch = value
            elif key.record_type == records.SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER:
                group.target[key.member] = value
            else:
                member = group.members.setdefault(key.member, ShareGroupMember(key.member))
                if key.record_type == records.SHARE_GROUP_MEMBER_METADATA:
                    member.rack_id, member.client_id, member.client_host = value.rack_id, value.client_id, \
                        value.client_host
                    member.subscribed_topic_names = list(value.subscribed)
                else:
                    member.member_epoch, member.assigned = value
        if not has_metadata:  # a deleted group's records left behind
            return None
        group.subscription_metadata = self._subscription_metadata(group)
        group.stored = {k: v for k, (_, v) in stored.items()}
        for member in group.members.values():
            self._schedule_session_timeout(group, member)
        return group

    def store(self, group_id: str) -> bool:
        """Append what changed in the group since it was last stored (all of it once deleted:
        tombstones); True if anything was. Raises KafkaError when the append fails."""
        group = self.groups.get(group_id)
        wanted = group.records() if group is not None else {}
        stored = group.stored if group is not None else self._deleted.pop(group_id, {})
        entries: list[tuple[bytes, bytes | None]] = [(k, v) for k, v in wanted.items() if stored.get(k) != v]
        entries += [(k, None) for k in stored if k not in wanted]
        if not entries:
            return False
        store = self.coordinator.store
        replica_manager = getattr(store, "replica_manager", None)
        if replica_manager is None:
            return False
        tp = (GROUP_METADATA_TOPIC, store.partition_for(group_id))
        error = log_store.append(replica_manager, tp, entries)
        if error != ErrorCode.NONE:
            if group is None:
                self._deleted[group_id] = stored  # tombstoned with the next try
            error = log_store.STORE_ERRORS.get(error, error)
            log.warning("share group %s: storing its records failed: %s", group_id, error.name)
            raise KafkaError(f"The share group's records could not be stored: {error.name}.", error)
        if group is not None:
            group.stored = wanted
        return True

    def _store_quietly(self, group_id: str) -> None:
        """Store a change nobody waits for (a session expiry, a deleted group)."""
        try:
            self.store(group_id)
        except KafkaError:
            pass  # the next heartbeat of the group writes it

    # --- ShareGroupHeartbeat --------------------------------------------------------------------
    def heartbeat(self, req: ShareHeartbeat) -> ShareHeartbeatResult:
        """Raises KafkaError with the code and message of the error response."""
        self._validate(req)
        error = self.coordinator.validate_group_status(req.group_id, SHARE_GROUP_HEARTBEAT)
        if error is not None:
            raise KafkaError(error.name, error)
        if req.member_epoch == LEAVE_GROUP_MEMBER_EPOCH:
            return self._leave(req)
        group = self._get_or_maybe_create(req.group_id, req.member_epoch)
        member = group.members.get(req.member_id)
        if member is None:
            if req.member_epoch != 0:
                raise KafkaError(f"Member {req.member_id} is not a member of group {req.group_id}.",
                                 ErrorCode.UNKNOWN_MEMBER_ID)
            if len(group.members) >= self.settings.max_size:
                raise KafkaError(f"The share group has reached its maximum capacity of "
                                 f"{self.settings.max_size} members.", ErrorCode.GROUP_MAX_SIZE_REACHED)
            member = group.members[req.member_id] = ShareGroupMember(req.member_id)
            log.info("share group %s: member %s joins", group.group_id, req.member_id)
            bump = True
        else:
            if req.member_epoch not in (0, member.member_epoch):
                raise KafkaError(f"The share group member has epoch {req.member_epoch}, the "
                                 f"coordinator knows {member.member_epoch}. It must rejoin.",
                                 ErrorCode.FENCED_MEMBER_EPOCH)
            bump = False
        if member.update(req):
            bump = True
        self._advance_epoch(group, bump)
        before = member.assigned
        member.assigned = group.target.get(member.member_id, {})
        full = req.member_epoch == 0 or before != member.assigned or member.member_epoch != group.assignment_epoch
        member.member_epoch = group.assignment_epoch
        self._schedule_session_timeout(group, member)
        interval = self._group_setting(group.group_id, "share.heartbeat.interval.ms",
                                       self.settings.heartbeat_interval_ms)
        return ShareHeartbeatResult(member.member_id, member.member_epoch, interval,
                                    member.assigned if full else None)

    @staticmethod
    def _validate(req: ShareHeartbeat) -> None:
        if not req.group_id:
            raise invalid("GroupId can't be empty.")
        if not req.member_id:
            raise invalid("MemberId can't be empty.")
        if req.rack_id == "":
            raise invalid("RackId can't be empty.")
        if req.member_epoch == 0:
            if not req.subscribed_topic_names:
                raise invalid("SubscribedTopicNames must be set in first request.")
        elif req.member_epoch < LEAVE_GROUP_MEMBER_EPOCH:
            raise invalid("MemberEpoch is invalid.")

    def _get_or_maybe_create(self, group_id: str, member_epoch: int) -> ShareGroup:
        group = self.groups.get(group_id)
        if group is not None:
            return group
        other = self.coordinator.groups.get(group_id)
        if other is not None and not other.is_dead:
            raise KafkaError(f"Group {group_id} is not a share group.", ErrorCode.GROUP_ID_NOT_FOUND)
        if member_epoch != 0:
            raise KafkaError(f"Share group {group_id} has no member with this id.", ErrorCode.UNKNOWN_MEMBER_ID)
        group = self.groups[group_id] = ShareGroup(group_id)
        return group

    def _subscription_metadata(self, group: ShareGroup) -> SubscriptionMetadata:
        wanted = group.subscribed_topics()
        return frozenset((meta.topic_id, name, len(meta.partitions))
                         for name, meta in self.topics().items() if name in wanted)

    def _assign(self, group: ShareGroup) -> None:
        topics = {name: (tid, n) for tid, name, n in group.subscription_metadata}
        members = {m.member_id: set(m.subscribed_topic_names) for m in group.members.values()}
        group.target = simple_assign(members, topics)
        group.assignment_epoch = group.group_epoch
        log.info("share group %s: target assignment for epoch %d", group.group_id, group.group_epoch)

    def _leave(self, req: ShareHeartbeat) -> ShareHeartbeatResult:
        group = self.groups.get(req.group_id)
        member = group.members.get(req.member_id) if group is not None else None
        if group is None or member is None:
            raise KafkaError(f"Member {req.member_id} is not a member of group {req.group_id}.",
                             ErrorCode.UNKNOWN_MEMBER_ID)
        self._remove(group, member, "left", announce=False)
        return ShareHeartbeatResult(req.member_id, LEAVE_GROUP_MEMBER_EPOCH, 0)

    def _remove(self, group: ShareGroup, member: ShareGroupMember, why: str, announce: bool = True) -> None:
        if member.session_timer is not None:
            member.session_timer.cancel()
            member.session_timer = None
        del group.members[member.member_id]
        group.target.pop(member.member_id, None)
        group.group_epoch += 1
        log.info("share group %s: member %s %s", group.group_id, member.member_id, why)
        if not announce:
            return
        for listener in self.member_listeners:
            listener(group.group_id, member.member_id)

    def _session_timeout_ms(self, group: ShareGroup) -> int:
        return self._group_setting(group.group_id, "share.session.timeout.ms", self.settings.session_timeout_ms)

    def _session_expired(self, group: ShareGroup, member: ShareGroupMember) -> None:
        if self.coordinator.validate_group_status(group.group_id, SHARE_GROUP_HEARTBEAT) is not None:
            return  # no longer the coordinator (its partition is being unloaded)
        self._remove(group, member, "fenced: its session expired")
        self._store_quietly(group.group_id)

    def is_member(self, group_id: str, member_id: str) -> bool:
        group = self.groups.get(group_id)
        return group is not None and member_id in group.members

    # --- admin ----------------------------------------------------------------------------------
    def describe(self, group_id: str) -> dict:
        group = self.groups.get(group_id)
        if group is None:
            other = self.coordinator.groups.get(group_id)
            error, message = ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} not found."
            if self.coordinator.is_loading(group_id):
                error, message = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "The group is being loaded."
            elif other is not None and not other.is_dead:
                message = f"Group {group_id} is not a share group."
            return {"group_id": group_id, "error_code": error, "error_message": message,
                    "group_state": "Dead", "group_epoch": -1, "assignment_epoch": -1, "assignor_name": "",
                    "members": []}
        names = {meta.topic_id: name for name, meta in self.topics().items()}
        members = [{
            "member_id": m.member_id, "rack_id": m.rack_id, "member_epoch": m.member_epoch,
            "client_id": m.client_id, "client_host": m.client_host,
            "subscribed_topic_names": sorted(m.subscribed_topic_names),
            "assignment": {"topic_partitions": [
                {"topic_id": tid, "topic_name": names.get(tid, ""), "partitions": sorted(ps)}
                for tid, ps in m.assigned.items()]}}
            for m in group.members.values()]
        return {"group_id": group_id, "error_code": ErrorCode.NONE, "error_message": None,
                "group_state": group.state.value, "group_epoch": group.group_epoch,
                "assignment_epoch": group.assignment_epoch, "assignor_name": "simple", "members": members}

    def delete(self, group_id: str) -> ErrorCode:
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if group.members:
            return ErrorCode.NON_EMPTY_GROUP
        del self.groups[group_id]
        self._deleted[group_id] = group.stored
        self._store_quietly(group_id)
        return ErrorCode.NONE

    def shutdown(self) -> None:
        self.unload_partition(None)
