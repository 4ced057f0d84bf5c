"""Topic, dynamic broker and client configs (users' SCRAM credentials, user / client-id / IP
quotas) as stored under /config, kept current on every broker.

Loaded whole at start-up; afterwards each /config/changes notification (written by whichever
broker took the AlterConfigs) names one entity, which is read again and handed to
`on_change`. This is Kafka's ZooKeeper-mode config change listener.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote, unquote

from strom.controller import znodes
from strom.controller.admin import read_configs
from strom.controller.change_listener import ChangeListener
from strom.controller.store import MetadataStore

log = logging.getLogger(__name__)


class ConfigRepository:
    def __init__(self, store: MetadataStore, io: Callable[..., Awaitable[Any]],
                 on_change: Callable[[str, str], None]) -> None:
        self.store = store
        self.io = io
        self.on_change = on_change
        self.topics: dict[str, dict[str, str]] = {}
        self.brokers: dict[str, dict[str, str]] = {}
        # users, clients and ips by their path under /config, names sanitized as stored:
        # "users/alice", "users/alice/clients/app", "users/<default>", "clients/app", "ips/10.0.0.1".
        self.clients: dict[str, dict[str, str]] = {}
        # GROUP config resources (KIP-848/932 group configs) by group id, as given (not sanitized).
        self.groups: dict[str, dict[str, str]] = {}
        self._changes = ChangeListener(store, io, znodes.CONFIG_CHANGES, znodes.CONFIG_CHANGE_PREFIX, self._apply)

    def load(self) -> None:
        """Every config of the cluster (blocking; at start-up, before logs are loaded)."""
        self._changes.skip_existing()
        for name in self.store.children(znodes.CONFIG_TOPICS):
            self.topics[name] = read_configs(self.store, "topics", name)
        for name in self.store.children(znodes.CONFIG_BROKERS):
            self.brokers[name] = read_configs(self.store, "brokers", name)
        for user in self.store.children(znodes.CONFIG_USERS):
            self.clients[f"users/{user}"] = read_configs(self.store, "users", user)
            for client in self.store.children(f"{znodes.CONFIG_USERS}/{user}/clients"):
                self.clients[f"users/{user}/clients/{client}"] = read_configs(self.store, "users", f"{user}/clients/{client}")
        for kind in ("clients", "ips"):
            for name in self.store.children(f"/config/{kind}"):
                self.clients[f"{kind}/{name}"] = read_configs(self.store, kind, name)
        for name in self.store.children("/config/groups"):
            self.groups[unquote(name)] = read_configs(self.store, "groups", name)

    def topic(self, name: str) -> dict[str, str]:
        return self.topics.get(name, {})

    def broker(self, entity: str) -> dict[str, str]:
        return self.brokers.get(entity, {})

    def user(self, name: str) -> dict[str, str]:
        return self.clients.get(f"users/{sanitize(name)}", {})

    async def start(self) -> None:
        await self._changes.start()

    def stop(self) -> None:
        self._changes.stop()

    async def _apply(self, change: Any) -> None:
        if not isinstance(change, dict):
            return
        path = str(change.get("entity_path", ""))
        entity_type, _, name = path.partition("/")
        if entity_type in ("users", "clients", "ips") and name:
            # credentials and quotas are looked up when used: nothing to apply
            self.clients[path] = await self.io(read_configs, self.store, entity_type, name)
            return
        if entity_type == "groups" and name:
            configs = await self.io(read_configs, self.store, entity_type, name)
            if configs:
                self.groups[unquote(name)] = configs
            else:
                self.groups.pop(unquote(name), None)
            return
        target = {"topics": self.topics, "brokers": self.brokers}.get(entity_type)
        if target is None or not name:
            return
        configs = await self.io(read_configs, self.store, entity_type, name)
        if target.get(name) == configs:
            return
        target[name] = configs
        try:
            self.on_change(entity_type, name)
        except Exception:
            log.exception("applying the config change of %s/%s failed", entity_type, name)


def sanitize(name: str) -> str:
    """A user or client id as its znode is named (Kafka's Sanitizer: URL-encoded); Kafka's
    "<default>" entity is kept as it is."""
    return name if name == DEFAULT else quote(name, safe="")


DEFAULT = "<default>"

