"""What the security layer asks of the store that keeps a cluster's ACLs and delegation tokens.

The authorizer and the token manager (strom.security) read and write through these interfaces
and never see the store behind them: controller/security_store.py implements them over the
ZooKeeper-shaped MetadataStore (ZooKeeper, and the embedded broker's local file). A KRaft node
passes no store: its ACLs and tokens arrive from the metadata image instead, and the active
controller writes their changes to the quorum.

A change written here is announced to every broker, each of which follows the announcements
(a ChangeFeed) and reads the changed ACLs or token again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, Protocol

from strom.metadata.delegation_token import TokenInformation


class AclResource(NamedTuple):
    """A resource pattern as the store names it."""

    resource_type: str  # Kafka's name of the type: "Topic", "Group", "Cluster", ...
    prefixed: bool  # a PREFIXED pattern; else LITERAL
    name: str


class ChangeFeed(Protocol):
    """Announcements of changes, handed one at a time, in order, once each."""

    def skip_existing(self) -> None:
        """What was announced until now is already read (blocking; at start-up)."""

    async def start(self) -> None: ...

    def stop(self) -> None: ...


class StoreIO(Protocol):
    # Runs one blocking call of the store off the event loop (the store's own thread).
    io: Callable[..., Awaitable[Any]]


class AclStore(StoreIO, Protocol):
    """ACLs by resource pattern; each entry as Kafka stores it ({"principal", "host",
    "operation", "permissionType"}). Every method but acl_changes' feed blocks."""

    def acl_resources(self) -> list[AclResource]: ...

    def read_acls(self, resource: AclResource) -> tuple[list[dict[str, str]], int] | None:
        """The resource's entries and their version; None when it has none stored."""

    def write_acls(self, resource: AclResource, entries: list[dict[str, str]], version: int | None) -> bool:
        """Replace the entries if they are still at `version` (None: none stored; no entries:
        remove them); False when they changed meanwhile."""

    def announce_acl_change(self, resource: AclResource) -> None: ...

    def acl_changes(self, handle: Callable[[AclResource], Awaitable[None]]) -> ChangeFeed: ...


class TokenStore(StoreIO, Protocol):
    """Delegation tokens by id (never their HMAC). Every method but token_changes' feed blocks."""

    def token_ids(self) -> list[str]: ...

    def read_token(self, token_id: str) -> TokenInformation | None: ...

    def write_token(self, token_id: str, info: TokenInformation | None) -> None:
        """Store the token, or remove it (None)."""

    def announce_token_change(self, token_id: str) -> None: ...

    def token_changes(self, handle: Callable[[str], Awaitable[None]]) -> ChangeFeed: ...
