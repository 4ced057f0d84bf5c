"""MemberMetadata: one member of a classic group, as seed 002's GroupMetadata keeps it.

A member is "awaiting join" while its JoinGroup response is held back for a rebalance, and
"awaiting sync" while a follower's SyncGroup waits for the leader's assignment. Both are
callbacks, as in Kafka: whoever completes the rebalance calls them, and a handler turns the
call into its response.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from strom.protocol.errors import ErrorCode


@dataclass(slots=True)
class JoinGroupResult:
    member_id: str
    error: ErrorCode = ErrorCode.NONE
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    skip_assignment: bool = False
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)


@dataclass(slots=True)
class SyncGroupResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


JoinCallback = Callable[[JoinGroupResult], None]
SyncCallback = Callable[[SyncGroupResult], None]


@dataclass(eq=False, slots=True)
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    supported_protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    awaiting_join: JoinCallback | None = None
    awaiting_sync: SyncCallback | None = None
    # A member that joined and has not yet seen a completed rebalance: its expiry is the long
    # new-member timeout, and it is not "satisfied" by waiting in a rebalance.
    is_new: bool = False
    heartbeat_timer: Any = None

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    @property
    def is_awaiting_join(self) -> bool:
        return self.awaiting_join is not None

    @property
    def is_awaiting_sync(self) -> bool:
        return self.awaiting_sync is not None

    def protocols(self) -> set[str]:
        return {name for name, _ in self.supported_protocols}

    def metadata(self, protocol: str | None) -> bytes:
        for name, metadata in self.supported_protocols:
            if name == protocol:
                return metadata
        return b""

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        """Same protocols in the same order with the same metadata: a rejoin changes nothing."""
        return protocols == self.supported_protocols

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among those every member supports."""
        for name, _ in self.supported_protocols:
            if name in candidates:
                return name
        raise ValueError(f"member {self.member_id} supports none of {sorted(candidates)}")

    def has_satisfied_heartbeat(self) -> bool:
        """At session expiry: members waiting in a rebalance count as alive, new members not."""
        if self.is_new:
            return False
        return self.is_awaiting_join or self.is_awaiting_sync

    def invoke_join(self, result: JoinGroupResult) -> None:
        callback, self.awaiting_join = self.awaiting_join, None
        if callback is not None:
            callback(result)

    def invoke_sync(self, result: SyncGroupResult) -> None:
        callback, self.awaiting_sync = self.awaiting_sync, None
        if callback is not None:
            callback(result)
