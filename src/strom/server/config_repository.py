"""Topic, dynamic broker and user configs (SCRAM credentials) as stored under /config, kept
current on every broker.

Loaded whole at start-up; afterwards each /config/changes notification (written by whichever
broker took the AlterConfigs) names one entity, which is read again and handed to
`on_change`. This is Kafka's ZooKeeper-mode config change listener.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

from strom.controller import znodes
from strom.controller.admin import read_configs
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
        self.users: dict[str, dict[str, str]] = {}  # by user name (their znodes are sanitized)
        self._last_seen = -1
        self._watch = None
        self._pending: asyncio.Task | None = None

    def load(self) -> None:
        """Every config of the cluster (blocking; at start-up, before logs are loaded)."""
        self._last_seen = max((_seq(c) for c in self.store.children(znodes.CONFIG_CHANGES)), default=-1)
        for name in self.store.children(znodes.CONFIG_TOPICS):
            self.topics[name] = read_configs(self.store, "topics", name)
        for name in self.store.children(znodes.CONFIG_BROKERS):
            self.brokers[name] = read_configs(self.store, "brokers", name)
        for name in self.store.children(znodes.CONFIG_USERS):
            self.users[unquote(name)] = read_configs(self.store, "users", name)

    def topic(self, name: str) -> dict[str, str]:
        return self.topics.get(name, {})

    def broker(self, entity: str) -> dict[str, str]:
        return self.brokers.get(entity, {})

    def user(self, name: str) -> dict[str, str]:
        return self.users.get(name, {})

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._watch = await self.io(self.store.watch_children, znodes.CONFIG_CHANGES,
                                    lambda _children: loop.call_soon_threadsafe(self._schedule))

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()

    def _schedule(self) -> None:
        if self._pending is None or self._pending.done():
            self._pending = asyncio.get_running_loop().create_task(self._process())
        else:
            self._pending.add_done_callback(lambda _t: self._schedule())

    async def _process(self) -> None:
        children = await self.io(self.store.children, znodes.CONFIG_CHANGES)
        for child in sorted(children, key=_seq):
            seq = _seq(child)
            if seq <= self._last_seen:
                continue
            self._last_seen = seq
            node = await self.io(self.store.get, f"{znodes.CONFIG_CHANGES}/{child}")
            if node is None or not isinstance(node[0], dict):
                continue
            entity_type, _, name = str(node[0].get("entity_path", "")).partition("/")
            target = {"topics": self.topics, "brokers": self.brokers, "users": self.users}.get(entity_type)
            if target is None or not name:
                continue
            configs = await self.io(read_configs, self.store, entity_type, name)
            if entity_type == "users":
                name = unquote(name)
            if target.get(name) == configs:
                continue
            target[name] = configs
            if entity_type == "users":
                continue  # credentials are read when a client authenticates
            try:
                self.on_change(entity_type, name)
            except Exception:
                log.exception("applying the config change of %s/%s failed", entity_type, name)


def _seq(child: str) -> int:
    digits = child[len(znodes.CONFIG_CHANGE_PREFIX):]
    return int(digits) if digits.isdigit() else -1
