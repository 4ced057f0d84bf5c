"""GroupCoordinator: Kafka's classic group membership protocol and offset storage.

Seed 002's flow: members find the coordinator, send JoinGroup, the coordinator holds the
responses back in a DelayedJoin until every known member has rejoined (or the rebalance
timeout expires), picks a protocol all members support, and answers; the leader computes the
assignment on the client side and hands it in with its SyncGroup; the coordinator stores it in
`__consumer_offsets` and gives each member its share. Heartbeats keep members alive and tell
them when a new rebalance starts; a member whose session expires is removed.

Everything runs on the broker's event loop: a held-back response is a callback that completes
an awaited future, and timers are loop timers (through `Scheduler`, so tests can drive time).
Method names follow Kafka's GroupCoordinator so that its behaviour can be checked against it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from strom.coordinator.group.config import CLASSIC, GroupConfig
from strom.coordinator.group.manager import LoadedState, PendingTxnOffsets
from strom.coordinator.group.member import (
    JoinCallback,
    JoinGroupResult,
    MemberMetadata,
    SyncCallback,
    SyncGroupResult,
)
from strom.coordinator.group.metadata import (
    COMPLETING_REBALANCE,
    DEAD,
    EMPTY,
    PREPARING_REBALANCE,
    STABLE,
    Group,
    GroupMetadata,
    TopicPartition,
)
from strom.coordinator.group.records import GroupMetadataValue, MemberRecord, OffsetAndMetadata
from strom.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

OFFSET_COMMIT, OFFSET_FETCH, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 8, 9, 11, 12, 13, 14
TXN_OFFSET_COMMIT = 28
DESCRIBE_GROUPS, DELETE_GROUPS, OFFSET_DELETE = 15, 42, 47
# Api keys whose group id may be empty (Kafka keeps this for offset storage without groups and
# so that admins can see and delete the "" group).
_EMPTY_GROUP_ID_OK = frozenset({OFFSET_COMMIT, OFFSET_FETCH, DESCRIBE_GROUPS, DELETE_GROUPS})


class Timer(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    """Clock and timers of the coordinator (the event loop; a manual clock in unit tests)."""

    def now_ms(self) -> int: ...
    def call_later(self, delay_ms: float, callback: Callable[[], None]) -> Timer: ...


class LoopScheduler:
    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def call_later(self, delay_ms: float, callback: Callable[[], None]) -> Timer:
        def run() -> None:
            try:
                callback()
            except Exception:
                log.exception("group coordinator timer failed")

        return asyncio.get_running_loop().call_later(max(delay_ms, 0) / 1000, run)


class GroupStore(Protocol):
    """Where the coordinator persists (GroupMetadataManager; an in-memory fake in unit tests)."""

    def is_local(self, group_id: str) -> bool: ...
    def store_group(self, value: GroupMetadataValue, group_id: str) -> ErrorCode: ...
    def store_offsets(self, group_id: str, offsets: dict[TopicPartition, OffsetAndMetadata]
                      ) -> ErrorCode: ...
    def store_tombstones(self, group_id: str, partitions: Iterable[TopicPartition], group: bool
                         ) -> ErrorCode: ...
    def store_txn_offsets(self, group_id: str, producer_id: int, producer_epoch: int,
                          offsets: dict[TopicPartition, OffsetAndMetadata]) -> ErrorCode: ...
    def partition_for(self, group_id: str) -> int: ...


@dataclass(slots=True)
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    client_id: str = ""
    client_host: str = ""
    require_known_member_id: bool = True  # JoinGroup v4+ without a group instance id
    support_skip_assignment: bool = False  # JoinGroup v9+
    reason: str | None = None


@dataclass(slots=True)
class DelayedJoin:
    """The pending completion of a rebalance's join phase. The initial one (the first
    rebalance of an empty group) always waits `delay_ms` and extends itself while new members
    keep arriving, up to the rebalance timeout, as Kafka's InitialDelayedJoin does."""

    delay_ms: int
    initial: bool = False
    remaining_ms: int = 0
    timer: Timer | None = None


@dataclass(slots=True)
class GroupSummary:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    members: list[dict] = field(default_factory=list)
    group_type: str = CLASSIC


class GroupCoordinator:
    def __init__(self, config: GroupConfig, store: GroupStore, scheduler: Scheduler | None = None
                 ) -> None:
        self.config = config
        self.store = store
        self.scheduler: Scheduler = scheduler or LoopScheduler()
        self.groups: dict[str, Group] = {}
        # Offsets committed inside open transactions: producer id -> group -> offsets.
        self.pending_txn_offsets: PendingTxnOffsets = {}
        self.active = False
        # `__consumer_offsets` partitions this broker leads whose replay is still running (off
        # the event loop), each with the token of its load: their groups are answered
        # COORDINATOR_LOAD_IN_PROGRESS until it is applied.
        self.loading: dict[int, object] = {}
        # A group's GROUP config overrides (IncrementalAlterConfigs on the group resource):
        # consumer.* and share.* timeouts there replace the broker's group.* defaults.
        self.group_overrides: Callable[[str], Mapping[str, str]] = lambda _group_id: {}
        self.consumer_groups: Any = None  # the KIP-848 side, attached by `consumer_group.py`
        self.share_groups: Any = None  # KIP-932 share groups, attached by `share_group.py`

    # --- lifecycle ------------------------------------------------------------------------------
    def startup(self, loaded: LoadedState | None = None) -> None:
        if loaded is not None:
            self._load(loaded)
        self.active = True

    def shutdown(self) -> None:
        """Answer every held-back request with NOT_COORDINATOR and stop all timers, as Kafka
        does when it unloads a group."""
        self.active = False
        self.unload_partition(None)

    def unload_partition(self, partition: int | None) -> None:
        """Leadership of `__consumer_offsets` partition `partition` (None: all) left this
        broker: its groups are dropped here, held-back requests answered NOT_COORDINATOR."""
        if partition is None:
            self.loading.clear()
        else:
            self.loading.pop(partition, None)  # a load still running is not applied
        for group_id, group in list(self.groups.items()):
            if partition is not None and self.store.partition_for(group_id) != partition:
                continue
            if isinstance(group, GroupMetadata):
                self._unload(group)
            elif self.consumer_groups is not None:
                self.consumer_groups.unload(group)
            del self.groups[group_id]
        for producer_id, pending in list(self.pending_txn_offsets.items()):
            for group_id in [g for g in pending if partition is None or self.store.partition_for(g) == partition]:
                del pending[group_id]  # replayed again if this broker leads the partition again
            if not pending:
                del self.pending_txn_offsets[producer_id]
        if self.share_groups is not None:
            self.share_groups.unload_partition(partition)

    def cancel_classic_timers(self, group: GroupMetadata) -> None:
        """Stop every timer of a classic group that is being replaced or unloaded."""
        self._cancel_join(group)
        self._cancel_sync_expiration(group)
        for timer in group.pending_timers.values():
            timer.cancel()
        group.pending_timers.clear()
        for member in group.members.values():
            self._cancel_heartbeat(member)

    def _unload(self, group: GroupMetadata) -> None:
        previous = group.state
        group.state = DEAD
        self.cancel_classic_timers(group)
        for member in group.members.values():
            if previous is PREPARING_REBALANCE:
                member.invoke_join(JoinGroupResult(member.member_id, ErrorCode.NOT_COORDINATOR))
            member.invoke_sync(SyncGroupResult(ErrorCode.NOT_COORDINATOR))

    def _load(self, loaded: LoadedState) -> None:
        now = self.scheduler.now_ms()
        for group_id in set(loaded.groups) | set(loaded.offsets):
            value = loaded.groups.get(group_id)
            group = GroupMetadata(group_id, now)
            if value is not None:
                group.protocol_type = value.protocol_type or None
                group.generation_id = value.generation
                group.protocol_name = value.protocol
                group.leader_id = value.leader
                group.current_state_timestamp = (value.current_state_timestamp
                                                 if value.current_state_timestamp >= 0 else None)
                for m in value.members:
                    member = MemberMetadata(m.member_id, m.group_instance_id, m.client_id,
                                            m.client_host, m.rebalance_timeout, m.session_timeout,
                                            group.protocol_type or "",
                                            [(value.protocol or "", m.subscription)], m.assignment)
                    group.add(member)
                group.state = STABLE if group.members else EMPTY
                group.subscribed_topics = group.compute_subscribed_topics()
            group.offsets = dict(loaded.offsets.get(group_id, {}))
            self.groups[group_id] = group
            for member in group.members.values():
                self._schedule_heartbeat(group, member)
        # Merged: the open transactions of the partitions already led here stay.
        for producer_id, pending in loaded.pending_txn_offsets.items():
            self.pending_txn_offsets.setdefault(producer_id, {}).update(pending)
        if self.share_groups is not None:
            self.share_groups.load(loaded.share_groups)
        if self.groups:
            log.info("loaded %d groups (%d records) from the group metadata topic",
                     len(self.groups), loaded.records)

    # --- helpers --------------------------------------------------------------------------------
    def _now(self) -> int:
        return self.scheduler.now_ms()

    def is_loading(self, group_id: str) -> bool:
        """True while the group's partition of `__consumer_offsets` is being loaded here."""
        return bool(self.loading) and self.store.partition_for(group_id) in self.loading

    def validate_group_status(self, group_id: str | None, api_key: int) -> ErrorCode | None:
        if group_id is None or (group_id == "" and api_key not in _EMPTY_GROUP_ID_OK):
            return ErrorCode.INVALID_GROUP_ID
        if not self.active:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if self.is_loading(group_id):
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        if not self.store.is_local(group_id):
            return ErrorCode.NOT_COORDINATOR
        return None

    def _classic_group(self, group_id: str) -> GroupMetadata | None:
        group = self.groups.get(group_id)
        return group if isinstance(group, GroupMetadata) else None

    def _store_group(self, group: GroupMetadata, assignment: dict[str, bytes]) -> ErrorCode:
        value = GroupMetadataValue(
            protocol_type=group.protocol_type or "",
            generation=group.generation_id,
            protocol=group.protocol_name,
            leader=group.leader_id,
            current_state_timestamp=group.current_state_timestamp or -1,
            members=[MemberRecord(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                  m.rebalance_timeout_ms, m.session_timeout_ms,
                                  m.metadata(group.protocol_name), assignment.get(m.member_id, b""))
                     for m in group.members.values()],
        )
        return self.store.store_group(value, group.group_id)

    # --- heartbeats and timers ------------------------------------------------------------------
    def _schedule_heartbeat(self, group: GroupMetadata, member: MemberMetadata,
                            timeout_ms: int | None = None) -> None:
        """Kafka's completeAndScheduleNextHeartbeatExpiration."""
        self._cancel_heartbeat(member)
        delay = member.session_timeout_ms if timeout_ms is None else timeout_ms
        member.heartbeat_timer = self.scheduler.call_later(
            delay, lambda: self._on_expire_heartbeat(group, member))

    @staticmethod
    def _cancel_heartbeat(member: MemberMetadata) -> None:
        if member.heartbeat_timer is not None:
            member.heartbeat_timer.cancel()
            member.heartbeat_timer = None

    def _on_expire_heartbeat(self, group: GroupMetadata, member: MemberMetadata) -> None:
        member.heartbeat_timer = None
        if group.is_dead or group.members.get(member.member_id) is not member:
            return
        if member.has_satisfied_heartbeat():
            return  # waiting in a rebalance: the completed rebalance re-arms the timer
        log.info("member %s in group %s has failed, removing it from the group",
                 member.member_id, group.group_id)
        self._remove_member_and_update_group(
            group, member, f"removing member {member.member_id} on heartbeat expiration")

    def _add_pending_member_expiration(self, group: GroupMetadata, member_id: str,
                                       timeout_ms: int) -> None:
        old = group.pending_timers.pop(member_id, None)
        if old is not None:
            old.cancel()
        group.pending_timers[member_id] = self.scheduler.call_later(
            timeout_ms, lambda: self._on_expire_pending_member(group, member_id))

    def _on_expire_pending_member(self, group: GroupMetadata, member_id: str) -> None:
        group.pending_timers.pop(member_id, None)
        if not group.is_dead and group.is_pending_member(member_id):
            log.info("pending member %s in group %s has been removed after session timeout "
                     "expiration", member_id, group.group_id)
            self._remove_pending_member_and_update_group(group, member_id)

    def _remove_pending_member_and_update_group(self, group: GroupMetadata, member_id: str) -> None:
        group.remove(member_id)
        timer = group.pending_timers.pop(member_id, None)
        if timer is not None:
            timer.cancel()
        if group.is_(PREPARING_REBALANCE):
            self._check_join(group)

    # --- rebalance ------------------------------------------------------------------------------
    def _maybe_prepare_rebalance(self, group: GroupMetadata, reason: str) -> None:
        if group.can_rebalance():
            self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: GroupMetadata, reason: str) -> None:
        if group.is_(COMPLETING_REBALANCE):
            self._reset_and_propagate_assignment_error(group, ErrorCode.REBALANCE_IN_PROGRESS)
        self._cancel_sync_expiration(group)
        if group.is_(EMPTY):
            delay = self.config.initial_rebalance_delay_ms
            join = DelayedJoin(delay, initial=True,
                               remaining_ms=max(group.rebalance_timeout_ms - delay, 0))
        else:
            join = DelayedJoin(group.rebalance_timeout_ms)
        group.transition_to(PREPARING_REBALANCE, self._now())
        log.info("preparing to rebalance group %s in state %s with old generation %d (reason: %s)",
                 group.group_id, group.state, group.generation_id, reason)
        self._watch_join(group, join)

    def _watch_join(self, group: GroupMetadata, join: DelayedJoin) -> None:
        self._cancel_join(group)
        group.delayed_join = join
        if not join.initial and group.has_all_members_joined():
            self._complete_join(group)
            return
        join.timer = self.scheduler.call_later(join.delay_ms, lambda: self._on_join_timeout(group, join))

    def _check_join(self, group: GroupMetadata) -> None:
        """Kafka's rebalancePurgatory.checkAndComplete: finish the join phase as soon as every
        known member has rejoined, without waiting for the rebalance timeout."""
        join = group.delayed_join
        if join is not None and not join.initial and group.has_all_members_joined():
            self._complete_join(group)

    def _on_join_timeout(self, group: GroupMetadata, join: DelayedJoin) -> None:
        if group.delayed_join is not join:
            return
        join.timer = None
        if join.initial and group.new_member_added and join.remaining_ms != 0:
            group.new_member_added = False
            delay = min(self.config.initial_rebalance_delay_ms, join.remaining_ms)
            remaining = max(join.remaining_ms - join.delay_ms, 0)
            self._watch_join(group, DelayedJoin(delay, initial=True, remaining_ms=remaining))
            return
        self._complete_join(group)

    def _cancel_join(self, group: GroupMetadata) -> None:
        join, group.delayed_join = group.delayed_join, None
        if join is not None and join.timer is not None:
            join.timer.cancel()
            join.timer = None

    def _complete_join(self, group: GroupMetadata) -> None:
        self._cancel_join(group)
        self._on_complete_join(group)

    def _on_complete_join(self, group: GroupMetadata) -> None:
        gone = [m for m in group.not_yet_rejoined_members() if not m.is_static]
        if gone:
            log.info("group %s removed dynamic members who haven't joined: %s",
                     group.group_id, [m.member_id for m in gone])
            for member in gone:
                group.remove(member.member_id)
                self._cancel_heartbeat(member)
        if group.is_dead:
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            # Nobody rejoined: wait another rebalance timeout for the session timeouts to
            # remove the silent members.
            log.error("group %s could not complete rebalance because no members rejoined",
                      group.group_id)
            self._watch_join(group, DelayedJoin(group.rebalance_timeout_ms))
            return
        group.init_next_generation(self._now())
        if group.is_(EMPTY):
            log.info("group %s with generation %d is now empty", group.group_id, group.generation_id)
            error = self._store_group(group, {})
            if error != ErrorCode.NONE:
                log.warning("failed to write empty metadata for group %s: %s", group.group_id,
                            error.name)
            return
        log.info("stabilized group %s generation %d with %d members", group.group_id,
                 group.generation_id, len(group.members))
        everyone = group.current_member_metadata()
        for member in list(group.members.values()):
            is_leader = group.is_leader(member.member_id)
            member.invoke_join(JoinGroupResult(
                member.member_id, ErrorCode.NONE, group.generation_id, group.protocol_type,
                group.protocol_name, group.leader_id or "", False, everyone if is_leader else []))
            self._schedule_heartbeat(group, member)
            member.is_new = False
            group.pending_sync_members.add(member.member_id)
        self._schedule_pending_sync(group)

    def _schedule_pending_sync(self, group: GroupMetadata) -> None:
        self._cancel_sync_expiration(group)
        generation = group.generation_id
        group.sync_timer = self.scheduler.call_later(
            group.rebalance_timeout_ms, lambda: self._on_expire_pending_sync(group, generation))

    def _cancel_sync_expiration(self, group: GroupMetadata) -> None:
        timer, group.sync_timer = group.sync_timer, None
        if timer is not None:
            timer.cancel()

    def _remove_pending_sync_member(self, group: GroupMetadata, member_id: str) -> None:
        group.pending_sync_members.discard(member_id)
        if not group.pending_sync_members:
            self._cancel_sync_expiration(group)

    def _on_expire_pending_sync(self, group: GroupMetadata, generation: int) -> None:
        group.sync_timer = None
        if generation != group.generation_id or group.state not in (COMPLETING_REBALANCE, STABLE):
            return
        if group.pending_sync_members:
            missing = sorted(group.pending_sync_members)
            for member_id in missing:
                member = group.remove(member_id)
                if member is not None:
                    self._cancel_heartbeat(member)
            self._prepare_rebalance(group, f"removing {missing} on pending sync request expiration")

    def _reset_and_propagate_assignment_error(self, group: GroupMetadata, error: ErrorCode) -> None:
        for member in group.members.values():
            member.assignment = b""
        self._propagate_assignment(group, error)

    def _propagate_assignment(self, group: GroupMetadata, error: ErrorCode) -> None:
        ok = error == ErrorCode.NONE
        for member in list(group.members.values()):
            if member.is_awaiting_sync:
                member.invoke_sync(SyncGroupResult(
                    error, group.protocol_type if ok else None, group.protocol_name if ok else None,
                    member.assignment))
                self._schedule_heartbeat(group, member)

    def _remove_member_and_update_group(self, group: GroupMetadata, member: MemberMetadata,
                                        reason: str) -> None:
        # A member may leave (or expire) while its JoinGroup is held back: answer it first.
        member.invoke_join(JoinGroupResult("", ErrorCode.UNKNOWN_MEMBER_ID))
        member.invoke_sync(SyncGroupResult(ErrorCode.UNKNOWN_MEMBER_ID))
        group.remove(member.member_id)
        self._cancel_heartbeat(member)
        if group.state in (STABLE, COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, reason)
        elif group.is_(PREPARING_REBALANCE):
            self._check_join(group)

    # --- JoinGroup ------------------------------------------------------------------------------
    async def join_group(self, request: JoinRequest) -> JoinGroupResult:
        """Answer now or when the rebalance completes."""
        future: asyncio.Future[JoinGroupResult] = asyncio.get_running_loop().create_future()

        def respond(result: JoinGroupResult) -> None:
            if not future.done():
                future.set_result(result)

        self.handle_join_group(request, respond)
        return await future

    def handle_join_group(self, req: JoinRequest, respond: JoinCallback) -> None:
        error = self.validate_group_status(req.group_id, JOIN_GROUP)
        if error is not None:
            respond(JoinGroupResult(req.member_id, error))
            return
        if not self.config.min_session_timeout_ms <= req.session_timeout_ms \
                <= self.config.max_session_timeout_ms:
            respond(JoinGroupResult(req.member_id, ErrorCode.INVALID_SESSION_TIMEOUT))
            return
        is_unknown = req.member_id == ""
        group = self.groups.get(req.group_id)
        if group is None and self.share_groups is not None and req.group_id in self.share_groups.groups:
            # The id is a KIP-932 share group's: classic members cannot join it.
            respond(JoinGroupResult(req.member_id, ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
            return
        if group is None:
            if not is_unknown:
                respond(JoinGroupResult(req.member_id, ErrorCode.UNKNOWN_MEMBER_ID))
                return
            group = GroupMetadata(req.group_id, self._now())
            self.groups[req.group_id] = group
        elif not isinstance(group, GroupMetadata):
            if not group.is_empty or group.is_dead:
                # A KIP-848 consumer group with members: classic members cannot join it.
                respond(JoinGroupResult(req.member_id, ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
                return
            # An empty consumer group becomes a classic group again, keeping its offsets.
            classic = GroupMetadata(req.group_id, self._now())
            classic.offsets = group.offsets
            self.consumer_groups.unload(group)
            self.groups[req.group_id] = group = classic
        if group.is_dead:
            respond(JoinGroupResult(req.member_id, ErrorCode.COORDINATOR_NOT_AVAILABLE))
        elif not self._accept_joining_member(group, req.member_id):
            member = group.remove(req.member_id)
            if member is not None:
                self._cancel_heartbeat(member)
            respond(JoinGroupResult("", ErrorCode.GROUP_MAX_SIZE_REACHED))
        elif is_unknown:
            self._do_new_member_join_group(group, req, respond)
        else:
            self._do_current_member_join_group(group, req, respond)
        if group.is_(PREPARING_REBALANCE):
            self._check_join(group)

    def _accept_joining_member(self, group: GroupMetadata, member_id: str) -> bool:
        if group.state in (EMPTY, DEAD):
            return True
        if group.is_(PREPARING_REBALANCE):
            # Count awaiting members, not members: the last to rejoin of a group over the
            # limit (after group.max.size was lowered) are the ones turned away.
            return (group.has(member_id) and group.get(member_id).is_awaiting_join) or \
                group.num_awaiting_join() < self.config.max_size
        return group.has(member_id) or len(group.members) < self.config.max_size

    def _do_new_member_join_group(self, group: GroupMetadata, req: JoinRequest,
                                  respond: JoinCallback) -> None:
        if not group.supports_protocols(req.protocol_type, {name for name, _ in req.protocols}):
            respond(JoinGroupResult("", ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
            return
        new_member_id = group.generate_member_id(req.client_id, req.group_instance_id)
        if req.group_instance_id is not None:
            old_member_id = group.static_member_id(req.group_instance_id)
            if old_member_id is None:
                log.info("static member with group instance id %s joins group %s in state %s "
                         "as new member %s", req.group_instance_id, group.group_id, group.state,
                         new_member_id)
                self._add_member_and_rebalance(group, new_member_id, req, respond)
            else:
                log.info("static member with group instance id %s rejoins group %s in state %s; "
                         "replacing member %s with %s", req.group_instance_id, group.group_id,
                         group.state, old_member_id, new_member_id)
                self._update_static_member_and_rebalance(group, old_member_id, new_member_id, req,
                                                         respond)
        elif req.require_known_member_id:
            # KIP-394: hand out the member id first, so that a client retrying a timed-out
            # JoinGroup does not leave a trail of phantom members.
            group.pending_members.add(new_member_id)
            self._add_pending_member_expiration(group, new_member_id, req.session_timeout_ms)
            respond(JoinGroupResult(new_member_id, ErrorCode.MEMBER_ID_REQUIRED))
        else:
            self._add_member_and_rebalance(group, new_member_id, req, respond)

    def _do_current_member_join_group(self, group: GroupMetadata, req: JoinRequest,
                                      respond: JoinCallback) -> None:
        member_id = req.member_id
        if not group.supports_protocols(req.protocol_type, {name for name, _ in req.protocols}):
            respond(JoinGroupResult(member_id, ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
            return
        if group.is_pending_member(member_id):
            if req.group_instance_id is not None:
                respond(JoinGroupResult(member_id, ErrorCode.INVALID_REQUEST))  # pending members are dynamic
                return
            timer = group.pending_timers.pop(member_id, None)
            if timer is not None:
                timer.cancel()
            self._add_member_and_rebalance(group, member_id, req, respond)
            return
        error = self._validate_current_member(group, member_id, req.group_instance_id, "join-group")
        if error is not None:
            respond(JoinGroupResult(member_id, error))
            return
        member = group.get(member_id)
        reason = f"client reason: {req.reason}" if req.reason else "no client reason"
        if group.is_(PREPARING_REBALANCE):
            self._update_member_and_rebalance(
                group, member, req, respond, f"member {member_id} joining group during "
                f"PreparingRebalance; {reason}")
        elif group.is_(COMPLETING_REBALANCE):
            if member.matches(req.protocols):
                # The member lost the JoinGroup response: give it the same generation again.
                respond(JoinGroupResult(
                    member_id, ErrorCode.NONE, group.generation_id, group.protocol_type,
                    group.protocol_name, group.leader_id or "", False,
                    group.current_member_metadata() if group.is_leader(member_id) else []))
            else:
                self._update_member_and_rebalance(
                    group, member, req, respond, f"updating metadata for member {member_id} "
                    f"during CompletingRebalance; {reason}")
        elif group.is_(STABLE):
            if group.is_leader(member_id):
                # The leader rejoining forces a rebalance: that is how it acts on changes that
                # do not show in member metadata (new partitions of a subscribed topic).
                self._update_member_and_rebalance(
                    group, member, req, respond, f"leader {member_id} re-joining group during "
                    f"Stable; {reason}")
            elif not member.matches(req.protocols):
                self._update_member_and_rebalance(
                    group, member, req, respond, f"updating metadata for member {member_id} "
                    f"during Stable; {reason}")
            else:
                respond(JoinGroupResult(
                    member_id, ErrorCode.NONE, group.generation_id, group.protocol_type,
                    group.protocol_name, group.leader_id or "", False, []))
        else:
            log.warning("attempt to add rejoining member %s of group %s in unexpected state %s",
                        member_id, group.group_id, group.state)
            respond(JoinGroupResult(member_id, ErrorCode.UNKNOWN_MEMBER_ID))

    def _add_member_and_rebalance(self, group: GroupMetadata, member_id: str, req: JoinRequest,
                                  respond: JoinCallback) -> None:
        member = MemberMetadata(member_id, req.group_instance_id, req.client_id, req.client_host,
                                req.rebalance_timeout_ms, req.session_timeout_ms, req.protocol_type,
                                list(req.protocols), is_new=True)
        if group.is_(PREPARING_REBALANCE) and group.generation_id == 0:
            group.new_member_added = True
        group.add(member, respond)
        # A new member has no member id to heartbeat with and its connection is muted while
        # it waits; the long new-member timeout drops it if it never completes a rebalance.
        self._schedule_heartbeat(group, member, self.config.new_member_join_timeout_ms)
        self._maybe_prepare_rebalance(
            group, f"adding new member {member_id} with group instance id {req.group_instance_id}")

    def _update_member_and_rebalance(self, group: GroupMetadata, member: MemberMetadata,
                                     req: JoinRequest, respond: JoinCallback, reason: str) -> None:
        previous = member.awaiting_join
        group.update_member(member, list(req.protocols), req.rebalance_timeout_ms,
                            req.session_timeout_ms, respond)
        if previous is not None and previous is not respond:
            # The same member joined again while its earlier JoinGroup was still held back
            # (a client retry on a new connection): the earlier request is superseded.
            previous(JoinGroupResult(member.member_id, ErrorCode.REBALANCE_IN_PROGRESS))
        self._maybe_prepare_rebalance(group, reason)

    def _update_static_member_and_rebalance(self, group: GroupMetadata, old_member_id: str,
                                            new_member_id: str, req: JoinRequest,
                                            respond: JoinCallback) -> None:
        instance_id = req.group_instance_id
        assert instance_id is not None
        current_leader = group.leader_id
        member, old_join, old_sync = group.replace_static_member(instance_id, old_member_id,
                                                                 new_member_id)
        # Fence the previous incarnation if it still waits for a response.
        if old_join is not None:
            old_join(JoinGroupResult(old_member_id, ErrorCode.FENCED_INSTANCE_ID))
        if old_sync is not None:
            old_sync(SyncGroupResult(ErrorCode.FENCED_INSTANCE_ID))
        self._schedule_heartbeat(group, member)
        old_protocols = member.supported_protocols
        old_timeouts = (member.rebalance_timeout_ms, member.session_timeout_ms)
        group.update_member(member, list(req.protocols), req.rebalance_timeout_ms,
                            req.session_timeout_ms, respond)
        reason = f"static member {new_member_id} with instance id {instance_id} rejoined"
        if group.is_(STABLE):
            if group.protocol_name != group.select_protocol():
                self._maybe_prepare_rebalance(group, f"{reason} with a change of protocol")
                return
            # KIP-345: a restarted static member takes its old place without a rebalance;
            # persist the new member id so that a coordinator restart keeps it too.
            error = self._store_group(group, {m.member_id: m.assignment
                                              for m in group.members.values()})
            if error != ErrorCode.NONE:
                log.warning("failed to persist static member %s of group %s: %s", instance_id,
                            group.group_id, error.name)
                group.update_member(member, old_protocols, *old_timeouts, None)
                group.replace_static_member(instance_id, new_member_id, old_member_id)
                self._schedule_heartbeat(group, member)
                respond(JoinGroupResult("", error))
                return
            is_leader = group.is_leader(new_member_id)
            skip = req.support_skip_assignment and is_leader
            member.invoke_join(JoinGroupResult(
                new_member_id, ErrorCode.NONE, group.generation_id, group.protocol_type,
                group.protocol_name,
                # Old clients get the previous leader id, so a rejoining leader does not run a
                # trivial assignment a stable group would not propagate; KIP-814 clients are
                # told they lead and to skip the assignment.
                (group.leader_id if req.support_skip_assignment else current_leader) or "",
                skip, group.current_member_metadata() if skip else []))
        elif group.is_(COMPLETING_REBALANCE):
            # The leader may already be assigning with the old member id: start over.
            self._prepare_rebalance(group, reason)
        # PreparingRebalance: the member simply takes part in the ongoing rebalance.

    def _validate_current_member(self, group: GroupMetadata, member_id: str,
                                 instance_id: str | None, operation: str) -> ErrorCode | None:
        if instance_id is not None:
            current = group.static_member_id(instance_id)
            if current is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if current != member_id:
                log.info("request member id %s for static member %s is fenced by current member "
                         "id %s during %s", member_id, instance_id, current, operation)
                return ErrorCode.FENCED_INSTANCE_ID
            return None
        return None if group.has(member_id) else ErrorCode.UNKNOWN_MEMBER_ID

    # --- SyncGroup ------------------------------------------------------------------------------
    async def sync_group(self, group_id: str, generation_id: int, member_id: str,
                         protocol_type: str | None, protocol_name: str | None,
                         instance_id: str | None, assignments: dict[str, bytes]) -> SyncGroupResult:
        future: asyncio.Future[SyncGroupResult] = asyncio.get_running_loop().create_future()

        def respond(result: SyncGroupResult) -> None:
            if not future.done():
                future.set_result(result)

        self.handle_sync_group(group_id, generation_id, member_id, protocol_type, protocol_name,
                               instance_id, assignments, respond)
        return await future

    def handle_sync_group(self, group_id: str, generation_id: int, member_id: str,
                          protocol_type: str | None, protocol_name: str | None,
                          instance_id: str | None, assignments: dict[str, bytes],
                          respond: SyncCallback) -> None:
        error = self.validate_group_status(group_id, SYNC_GROUP)
        if error is not None:
            respond(SyncGroupResult(error))
            return
        group = self._classic_group(group_id)
        if group is None:
            respond(SyncGroupResult(ErrorCode.UNKNOWN_MEMBER_ID))
            return
        if group.is_dead:
            respond(SyncGroupResult(ErrorCode.COORDINATOR_NOT_AVAILABLE))
            return
        error = self._validate_current_member(group, member_id, instance_id, "sync-group")
        if error is None:
            if generation_id != group.generation_id:
                error = ErrorCode.ILLEGAL_GENERATION
            elif (protocol_type is not None and protocol_type != group.protocol_type) or (
                    protocol_name is not None and protocol_name != group.protocol_name):
                error = ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        if error is not None:
            respond(SyncGroupResult(error))
        elif group.is_(EMPTY):
            respond(SyncGroupResult(ErrorCode.UNKNOWN_MEMBER_ID))
        elif group.is_(PREPARING_REBALANCE):
            respond(SyncGroupResult(ErrorCode.REBALANCE_IN_PROGRESS))
        elif group.is_(COMPLETING_REBALANCE):
            group.get(member_id).awaiting_sync = respond
            self._remove_pending_sync_member(group, member_id)
            if group.is_leader(member_id):
                self._complete_sync(group, member_id, generation_id, assignments)
        else:  # Stable: the assignment is already known
            self._remove_pending_sync_member(group, member_id)
            member = group.get(member_id)
            respond(SyncGroupResult(ErrorCode.NONE, group.protocol_type, group.protocol_name,
                                    member.assignment))
            self._schedule_heartbeat(group, member)

    def _complete_sync(self, group: GroupMetadata, leader_id: str, generation_id: int,
                       assignments: dict[str, bytes]) -> None:
        log.info("assignment received from leader %s for group %s for generation %d; the group "
                 "has %d members, %d of which are static", leader_id, group.group_id,
                 group.generation_id, len(group.members), len(group.static_members))
        missing = [m for m in group.members if m not in assignments]
        if missing:
            log.warning("setting empty assignments for members %s of %s for generation %d",
                        missing, group.group_id, group.generation_id)
        assignment = {m: assignments.get(m, b"") for m in group.members}
        error = self._store_group(group, assignment)
        if not (group.is_(COMPLETING_REBALANCE) and generation_id == group.generation_id):
            return
        if error != ErrorCode.NONE:
            self._reset_and_propagate_assignment_error(group, error)
            self._maybe_prepare_rebalance(
                group, f"error when storing group assignment during SyncGroup (member: {leader_id})")
            return
        for member_id, member in group.members.items():
            member.assignment = assignment[member_id]
        self._propagate_assignment(group, ErrorCode.NONE)
        group.transition_to(STABLE, self._now())

    # --- Heartbeat and LeaveGroup ---------------------------------------------------------------
    def heartbeat(self, group_id: str, member_id: str, instance_id: str | None,
                  generation_id: int) -> ErrorCode:
        error = self.validate_group_status(group_id, HEARTBEAT)
        if error is not None:
            return error
        group = self._classic_group(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if group.is_dead:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        error = self._validate_current_member(group, member_id, instance_id, "heartbeat")
        if error is not None:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        if group.is_(EMPTY):
            return ErrorCode.UNKNOWN_MEMBER_ID
        self._schedule_heartbeat(group, group.get(member_id))
        if group.is_(PREPARING_REBALANCE):
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave_group(self, group_id: str, leaving: list[tuple[str, str | None, str | None]]
                    ) -> tuple[ErrorCode, list[ErrorCode]]:
        """`leaving` is (member id, group instance id, reason) per member; a member id of ""
        with an instance id removes that static member (the admin path of KIP-345)."""
        error = self.validate_group_status(group_id, LEAVE_GROUP)
        if error is not None:
            return error, []
        group = self._classic_group(group_id)
        if group is None:
            return ErrorCode.NONE, [ErrorCode.UNKNOWN_MEMBER_ID] * len(leaving)
        if group.is_dead:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, []
        errors = []
        for member_id, instance_id, reason in leaving:
            why = f"removing member {member_id or instance_id} on LeaveGroup; client reason: " \
                  f"{reason or 'not provided'}"
            if member_id == "":
                current = group.static_member_id(instance_id)
                if current is None:
                    errors.append(ErrorCode.UNKNOWN_MEMBER_ID)
                    continue
                self._leave(group, current, why)
            elif group.is_pending_member(member_id):
                self._remove_pending_member_and_update_group(group, member_id)
                log.info("pending member %s has left group %s", member_id, group_id)
            else:
                error = self._validate_current_member(group, member_id, instance_id, "leave-group")
                if error is not None:
                    errors.append(error)
                    continue
                self._leave(group, member_id, why)
            errors.append(ErrorCode.NONE)
        return ErrorCode.NONE, errors

    def _leave(self, group: GroupMetadata, member_id: str, reason: str) -> None:
        member = group.get(member_id)
        log.info("member %s has left group %s through explicit LeaveGroup", member_id,
                 group.group_id)
        self._remove_member_and_update_group(group, member, reason)

    # --- offsets --------------------------------------------------------------------------------
    def commit_offsets(self, group_id: str, member_id: str, instance_id: str | None,
                       generation_id: int, offsets: dict[TopicPartition, OffsetAndMetadata]
                       ) -> dict[TopicPartition, ErrorCode]:
        def every(code: ErrorCode) -> dict[TopicPartition, ErrorCode]:
            return dict.fromkeys(offsets, code)

        error = self.validate_group_status(group_id, OFFSET_COMMIT)
        if error is not None:
            return every(error)
        group = self.groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                # A generation for a group that does not exist: a member of a group that has
                # since gone away.
                return every(ErrorCode.ILLEGAL_GENERATION)
            # Offset storage without group management (assign() consumers, admin tools).
            group = GroupMetadata(group_id, self._now())
            self.groups[group_id] = group
        if not isinstance(group, GroupMetadata):
            error = self.consumer_groups.validate_commit(group, member_id, generation_id)
            return every(error) if error is not None else self._store_offsets(group, offsets)
        error = self._validate_offset_commit(group, generation_id, member_id, instance_id)
        if error is not None:
            return every(error)
        if group.is_(COMPLETING_REBALANCE):
            # The member has its new generation but not its assignment yet.
            return every(ErrorCode.REBALANCE_IN_PROGRESS)
        if group.state in (STABLE, PREPARING_REBALANCE):
            # Commits count as liveness; the heartbeat response tells of a rebalance.
            self._schedule_heartbeat(group, group.get(member_id))
        return self._store_offsets(group, offsets)

    def _validate_offset_commit(self, group: GroupMetadata, generation_id: int, member_id: str,
                                instance_id: str | None) -> ErrorCode | None:
        if group.is_dead:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation_id >= 0 or member_id != "" or instance_id is not None:
            error = self._validate_current_member(group, member_id, instance_id, "offset-commit")
            if error is not None:
                return error
            return ErrorCode.ILLEGAL_GENERATION if generation_id != group.generation_id else None
        if not group.is_(EMPTY):
            return ErrorCode.UNKNOWN_MEMBER_ID  # only members commit to a group with members
        return None

    def _store_offsets(self, group: Group, offsets: dict[TopicPartition, OffsetAndMetadata],
                       producer_id: int = -1, producer_epoch: int = -1
                       ) -> dict[TopicPartition, ErrorCode]:
        """Persist the offsets whose metadata fits; with a producer id as part of its
        transaction, pending until the transaction commits."""
        limit = self.config.offset_metadata_max_bytes
        results: dict[TopicPartition, ErrorCode] = {}
        accepted = {}
        for tp, committed in offsets.items():
            if len(committed.metadata) > limit:
                results[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                accepted[tp] = committed
        if not accepted:
            return results
        group_id = group.group_id
        if producer_id < 0:
            error = self.store.store_offsets(group_id, accepted)
            if error == ErrorCode.NONE:
                group.offsets.update(accepted)
        else:
            error = self.store.store_txn_offsets(group_id, producer_id, producer_epoch, accepted)
            if error == ErrorCode.NONE:
                self.pending_txn_offsets.setdefault(producer_id, {}).setdefault(group_id, {}).update(accepted)
        results.update(dict.fromkeys(accepted, error))
        return results

    # --- offsets inside transactions (TxnOffsetCommit) -------------------------------------------
    def commit_txn_offsets(self, group_id: str, producer_id: int, producer_epoch: int,
                           member_id: str, instance_id: str | None, generation_id: int,
                           offsets: dict[TopicPartition, OffsetAndMetadata]
                           ) -> dict[TopicPartition, ErrorCode]:
        """Write offsets as part of the producer's transaction; they count once it commits."""
        error = self.validate_group_status(group_id, TXN_OFFSET_COMMIT)
        if error is None:
            group = self.groups.get(group_id)
            if group is None:
                group = self.groups[group_id] = GroupMetadata(group_id, self._now())
            if generation_id >= 0 or member_id:  # v3+: the producer's consumer must be current
                if isinstance(group, GroupMetadata):
                    error = self._validate_offset_commit(group, generation_id, member_id, instance_id)
                else:
                    error = self.consumer_groups.validate_commit(group, member_id, generation_id)
        if error is not None:
            return dict.fromkeys(offsets, error)
        return self._store_offsets(group, offsets, producer_id, producer_epoch)

    def complete_txn(self, producer_id: int, offsets_partition: int, committed: bool) -> None:
        """The transaction marker reached `__consumer_offsets` partition `offsets_partition`:
        the producer's pending offsets of the groups there are applied, or dropped."""
        pending = self.pending_txn_offsets.get(producer_id)
        if not pending:
            return
        for group_id in [g for g in pending if self.store.partition_for(g) == offsets_partition]:
            offsets = pending.pop(group_id)
            if committed:
                group = self.groups.get(group_id)
                if group is None:
                    group = self.groups[group_id] = GroupMetadata(group_id, self._now())
                group.offsets.update(offsets)
        if not pending:
            del self.pending_txn_offsets[producer_id]

    def has_pending_txn_offsets(self, group_id: str, tp: TopicPartition) -> bool:
        """True if an open transaction committed an offset of `tp` for the group (OffsetFetch
        with require_stable answers UNSTABLE_OFFSET_COMMIT then)."""
        return any(tp in groups.get(group_id, ()) for groups in self.pending_txn_offsets.values())

    def fetch_offsets(self, group_id: str, partitions: list[TopicPartition] | None
                      ) -> tuple[ErrorCode, dict[TopicPartition, OffsetAndMetadata | None]]:
        """Committed offsets (None: nothing committed), whatever the group's state, since a
        group may use Kafka for offsets only. `partitions` None means all of them."""
        error = self.validate_group_status(group_id, OFFSET_FETCH)
        if error is not None:
            return error, {}
        group = self.groups.get(group_id)
        if group is None or group.is_dead:
            return ErrorCode.NONE, {tp: None for tp in partitions or ()}
        if partitions is None:
            return ErrorCode.NONE, dict(group.offsets)
        return ErrorCode.NONE, {tp: group.offsets.get(tp) for tp in partitions}

    def delete_offsets(self, group_id: str, partitions: list[TopicPartition]
                       ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        error = self.validate_group_status(group_id, OFFSET_DELETE)
        if error is not None:
            return error, {}
        group = self.groups.get(group_id)
        if group is None or group.is_dead:
            return ErrorCode.GROUP_ID_NOT_FOUND, {}
        results: dict[TopicPartition, ErrorCode] = {}
        if group.is_empty:
            eligible = list(partitions)
        elif isinstance(group, GroupMetadata) and group.protocol_type != "consumer":
            return ErrorCode.NON_EMPTY_GROUP, {}
        else:
            eligible = []
            for tp in partitions:
                if group.is_subscribed_to(tp[0]):
                    results[tp] = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
                else:
                    eligible.append(tp)
        if eligible:
            self._cleanup_group(group, [tp for tp in eligible if tp in group.offsets])
            log.info("deleted offsets of %s from group %s", eligible, group_id)
        results.update(dict.fromkeys(eligible, ErrorCode.NONE))
        return ErrorCode.NONE, results

    def on_partitions_deleted(self, partitions: list[TopicPartition]) -> None:
        """A topic was deleted: every group forgets (and tombstones) its offsets there."""
        if not self.active:
            return
        for group in list(self.groups.values()):
            removed = [tp for tp in partitions if tp in group.offsets]
            if removed:
                self._cleanup_group(group, removed)

    def _cleanup_group(self, group: Group, removed: list[TopicPartition]) -> None:
        """Drop offsets, and the group itself once it is empty with no offsets left, from
        memory and (with tombstones) from the log."""
        for tp in removed:
            group.offsets.pop(tp, None)
        remove_group = group.is_dead or (group.is_empty and not group.offsets)
        tombstone_group = False
        if remove_group and self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]
            if isinstance(group, GroupMetadata):
                if not group.is_dead:
                    log.info("group %s transitioned to Dead in generation %d", group.group_id,
                             group.generation_id)
                    group.transition_to(DEAD, self._now())
                # A group only ever used for offsets (generation 0) has no record to delete.
                tombstone_group = group.generation_id > 0
            else:
                self.consumer_groups.unload(group)
                tombstone_group = False
        if removed or tombstone_group:
            self.store.store_tombstones(group.group_id, removed, tombstone_group)

    def cleanup_group_metadata(self) -> int:
        """The offsets.retention.check.interval.ms task: expire offsets, drop dead groups."""
        now = self._now()
        expired = 0
        for group in list(self.groups.values()):
            removed = group.expired_offsets(now, self.config.offsets_retention_ms)
            expired += len(removed)
            self._cleanup_group(group, removed)
        if expired:
            log.info("removed %d expired offsets", expired)
        return expired

    # --- admin ----------------------------------------------------------------------------------
    def list_groups(self, states: Iterable[str] = (), types: Iterable[str] = ()
                    ) -> list[GroupSummary]:
        wanted_states = {s.lower() for s in states}
        wanted_types = {t.lower() for t in types}
        out = []
        for group in self.groups.values():
            if wanted_states and group.state_name.lower() not in wanted_states:
                continue
            if wanted_types and group.group_type not in wanted_types:
                continue
            out.append(self._summary(group, with_members=False))
        return out

    def describe_group(self, group_id: str) -> tuple[ErrorCode, GroupSummary]:
        error = self.validate_group_status(group_id, DESCRIBE_GROUPS)
        dead = GroupSummary(group_id, DEAD.value, "", "")
        if error is not None:
            return error, dead
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.NONE, dead
        return ErrorCode.NONE, self._summary(group, with_members=True)

    def _summary(self, group: Group, with_members: bool) -> GroupSummary:
        if not isinstance(group, GroupMetadata):
            return self.consumer_groups.summary(group, with_members)
        summary = GroupSummary(group.group_id, group.state_name, group.protocol_type or "",
                               group.protocol_name or "" if group.is_(STABLE) else "")
        if with_members:
            stable = group.is_(STABLE)
            summary.members = [
                {"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                 "client_id": m.client_id, "client_host": m.client_host,
                 "member_metadata": m.metadata(group.protocol_name) if stable else b"",
                 "member_assignment": m.assignment if stable else b""}
                for m in group.members.values()]
        return summary

    def delete_groups(self, group_ids: list[str]) -> dict[str, ErrorCode]:
        results: dict[str, ErrorCode] = {}
        for group_id in group_ids:
            error = self.validate_group_status(group_id, DELETE_GROUPS)
            if error is not None:
                results[group_id] = error
                continue
            group = self.groups.get(group_id)
            if group is None or group.is_dead:
                results[group_id] = ErrorCode.GROUP_ID_NOT_FOUND
            elif not group.is_empty:
                results[group_id] = ErrorCode.NON_EMPTY_GROUP
            else:
                if isinstance(group, GroupMetadata):
                    group.transition_to(DEAD, self._now())
                self._cleanup_group(group, list(group.offsets))
                results[group_id] = ErrorCode.NONE
                log.info("deleted group %s", group_id)
        return results
