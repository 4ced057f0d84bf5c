"""ACLs and delegation tokens in the metadata store, as Kafka's ZooKeeper mode keeps them (the
AclStore and TokenStore of metadata/security_store.py, for ZooKeeper and the embedded broker).

A resource's ACLs are one node, /kafka-acl/<Type>/<name> (literal patterns; "*" is every name)
or /kafka-acl-extended/prefixed/<Type>/<prefix>, holding {"version": 1, "acls": [...]}; each
change is announced by a sequential node under /kafka-acl-changes (the resource as "Type:name")
or /kafka-acl-extended-changes (JSON). A token is a node /delegation_token/tokens/<token id>,
each change announced by a sequential /delegation_token/token_changes/token_change_<n> node
holding the token id. Every broker follows both.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from strom.controller import znodes
from strom.controller.change_listener import ChangeListener
from strom.controller.store import BadVersion, MetadataStore, NodeExists
from strom.metadata.delegation_token import TokenInformation
from strom.metadata.security_store import AclResource

ACL_CHANGE_PREFIX = "acl_changes_"
TOKEN_CHANGE_PREFIX = "token_change_"


class _Feeds:
    """Several change listeners followed as one feed."""

    def __init__(self, *listeners: ChangeListener) -> None:
        self.listeners = listeners

    def skip_existing(self) -> None:
        for listener in self.listeners:
            listener.skip_existing()

    async def start(self) -> None:
        for listener in self.listeners:
            await listener.start()

    def stop(self) -> None:
        for listener in self.listeners:
            listener.stop()


class StoreSecurityMetadata:
    """The AclStore and TokenStore of a MetadataStore; `io` runs its blocking calls."""

    def __init__(self, store: MetadataStore, io: Callable[..., Awaitable[Any]]) -> None:
        self.store, self.io = store, io

    # -- ACLs

    @staticmethod
    def _acl_path(resource: AclResource) -> str:
        root = znodes.ACL_PREFIXED if resource.prefixed else znodes.ACL_LITERAL
        return f"{root}/{resource.resource_type}/{resource.name}"

    def acl_resources(self) -> list[AclResource]:
        return [AclResource(type_name, prefixed, name)
                for prefixed, root in ((False, znodes.ACL_LITERAL), (True, znodes.ACL_PREFIXED))
                for type_name in self.store.children(root)
                for name in self.store.children(f"{root}/{type_name}")]

    def read_acls(self, resource: AclResource) -> tuple[list[dict[str, str]], int] | None:
        node = self.store.get(self._acl_path(resource))
        if node is None:
            return None
        data, version = node
        return (data.get("acls", []) if isinstance(data, dict) else []), version

    def write_acls(self, resource: AclResource, entries: list[dict[str, str]], version: int | None) -> bool:
        path = self._acl_path(resource)
        data = {"version": 1, "acls": entries}
        try:
            if version is None:
                self.store.create(path, data)
            elif entries:
                self.store.set(path, data, expected_version=version)
            else:
                self.store.delete(path, expected_version=version)
        except (NodeExists, BadVersion):
            return False
        return True

    def announce_acl_change(self, resource: AclResource) -> None:
        if resource.prefixed:
            self.store.create(f"{znodes.ACL_EXTENDED_CHANGES}/{ACL_CHANGE_PREFIX}", {
                "version": 1, "resourceType": resource.resource_type, "name": resource.name,
                "patternType": "PREFIXED"}, sequential=True)
        else:
            self.store.create(f"{znodes.ACL_CHANGES}/{ACL_CHANGE_PREFIX}",
                              f"{resource.resource_type}:{resource.name}", sequential=True)

    def acl_changes(self, handle: Callable[[AclResource], Awaitable[None]]) -> _Feeds:
        async def literal(data: Any) -> None:
            type_name, _, name = str(data).partition(":")
            await handle(AclResource(type_name, False, name))

        async def extended(data: Any) -> None:
            if isinstance(data, str):
                data = json.loads(data)
            if isinstance(data, dict):
                await handle(AclResource(str(data.get("resourceType")), data.get("patternType") == "PREFIXED",
                                         data.get("name", "")))

        return _Feeds(ChangeListener(self.store, self.io, znodes.ACL_CHANGES, ACL_CHANGE_PREFIX, literal),
                      ChangeListener(self.store, self.io, znodes.ACL_EXTENDED_CHANGES, ACL_CHANGE_PREFIX, extended))

    # -- delegation tokens

    def token_ids(self) -> list[str]:
        return self.store.children(znodes.TOKENS)

    def read_token(self, token_id: str) -> TokenInformation | None:
        node = self.store.get(f"{znodes.TOKENS}/{token_id}")
        return TokenInformation.decode(node[0]) if node is not None and isinstance(node[0], dict) else None

    def write_token(self, token_id: str, info: TokenInformation | None) -> None:
        path = f"{znodes.TOKENS}/{token_id}"
        if info is None:
            if self.store.get(path) is not None:
                self.store.delete(path)
        elif self.store.get(path) is None:
            self.store.create(path, info.encode())
        else:
            self.store.set(path, info.encode())

    def announce_token_change(self, token_id: str) -> None:
        self.store.create(f"{znodes.TOKEN_CHANGES}/{TOKEN_CHANGE_PREFIX}", token_id, sequential=True)

    def token_changes(self, handle: Callable[[str], Awaitable[None]]) -> ChangeListener:
        async def changed(data: Any) -> None:
            await handle(str(data))

        return ChangeListener(self.store, self.io, znodes.TOKEN_CHANGES, TOKEN_CHANGE_PREFIX, changed)
