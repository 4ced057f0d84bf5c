"""What KIP-848 consumer groups and KIP-932 share groups have in common: members that join,
stay and leave by heartbeat; a group epoch bumped by any change of membership, subscriptions
or the subscribed topics' partitions; a target assignment computed for that epoch, which each
member then reaches (at once in a share group, one safe step at a time in a consumer group);
and a session per member that its heartbeats renew."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from strom.protocol.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

LEAVE_GROUP_MEMBER_EPOCH = -1

Assignment = dict[uuid.UUID, set[int]]
SubscriptionMetadata = frozenset[tuple[uuid.UUID, str, int]]  # (topic id, name, partitions)


def invalid(message: str) -> KafkaError:
    """A heartbeat whose fields do not fit together."""
    return KafkaError(message, ErrorCode.INVALID_REQUEST)


@dataclass(slots=True)
class Heartbeat:
    """What every member's heartbeat carries (None: unchanged since the last)."""

    group_id: str
    member_id: str
    member_epoch: int
    rack_id: str | None = None
    subscribed_topic_names: list[str] | None = None
    client_id: str = ""
    client_host: str = ""


@dataclass(slots=True)
class HeartbeatResponse:
    member_id: str | None
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: Assignment | None = None  # None: unchanged since the last response


@dataclass(eq=False, slots=True)
class HeartbeatMember:
    member_id: str
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: list[str] = field(default_factory=list)
    member_epoch: int = 0
    assigned: Assignment = field(default_factory=dict)
    session_timer: Any = None

    def update(self, req: Heartbeat) -> bool:
        """The fields every heartbeat carries; True when the subscribed topic names changed."""
        if req.rack_id is not None:
            self.rack_id = req.rack_id
        self.client_id, self.client_host = req.client_id, req.client_host
        if req.subscribed_topic_names is not None and \
                sorted(req.subscribed_topic_names) != sorted(self.subscribed_topic_names):
            self.subscribed_topic_names = list(req.subscribed_topic_names)
            return True
        return False


class EpochGroup:
    """A group's members and epochs (a mixin: each group type has its own constructor)."""

    group_id: str
    members: dict[str, Any]

    def init_epochs(self) -> None:
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.members = {}
        self.target: dict[str, Assignment] = {}
        self.subscription_metadata: SubscriptionMetadata = frozenset()


class EpochGroupCoordinator:
    """The heartbeat bookkeeping both coordinators run; each says how its group's
    subscriptions read, how it assigns, how long a session is and what its expiry does."""

    coordinator: Any

    def _subscription_metadata(self, group: Any) -> SubscriptionMetadata:
        raise NotImplementedError

    def _assign(self, group: Any) -> None:
        """A new target assignment for the group epoch."""
        raise NotImplementedError

    def _session_timeout_ms(self, group: Any) -> int:
        raise NotImplementedError

    def _group_setting(self, group_id: str, name: str, default: int) -> int:
        """The group's own value of a GROUP config (`consumer.session.timeout.ms`...), else the
        broker's default; validated when it was set."""
        value = self.coordinator.group_overrides(group_id).get(name)
        return default if value is None else int(value)

    def _session_expired(self, group: Any, member: Any) -> None:
        raise NotImplementedError

    def _advance_epoch(self, group: EpochGroup, bump: bool) -> None:
        """A new group epoch when `bump` or the subscribed topics' partitions changed, and
        the target assignment for it."""
        metadata = self._subscription_metadata(group)
        if metadata != group.subscription_metadata:
            group.subscription_metadata = metadata
            bump = True
        if bump:
            group.group_epoch += 1
            log.info("group %s: bumped group epoch to %d", group.group_id, group.group_epoch)
        if group.group_epoch > group.assignment_epoch:
            self._assign(group)

    def _schedule_session_timeout(self, group: EpochGroup, member: HeartbeatMember) -> None:
        if member.session_timer is not None:
            member.session_timer.cancel()

        def expire() -> None:
            member.session_timer = None
            if group.members.get(member.member_id) is member:
                self._session_expired(group, member)

        member.session_timer = self.coordinator.scheduler.call_later(self._session_timeout_ms(group), expire)
