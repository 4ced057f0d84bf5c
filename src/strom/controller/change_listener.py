"""Kafka's ZkNodeChangeNotificationListener: how every broker learns of a change another one
wrote to the metadata store (configs, ACLs, delegation tokens), through the sequential nodes the
writer adds under a changes path."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from strom.controller.store import MetadataStore


class ChangeListener:
    """Kafka's ZkNodeChangeNotificationListener: follows the sequential nodes a path collects
    (`<prefix><n>`), handing each new one's data to `handle` in order, once."""

    def __init__(self, store: MetadataStore, io: Callable[..., Awaitable[Any]], path: str, prefix: str,
                 handle: Callable[[Any], Awaitable[None]]) -> None:
        self.store, self.io, self.path, self.prefix, self.handle = store, io, path, prefix, handle
        self._last_seen = -1
        self._watch = None
        self._pending: asyncio.Task | None = None

    def skip_existing(self) -> None:
        """What is there now is already loaded (blocking; at start-up)."""
        self._last_seen = max((self._seq(c) for c in self.store.children(self.path)), default=-1)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._watch = await self.io(self.store.watch_children, self.path,
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
        for child in sorted(await self.io(self.store.children, self.path), key=self._seq):
            if self._seq(child) <= self._last_seen:
                continue
            self._last_seen = self._seq(child)
            node = await self.io(self.store.get, f"{self.path}/{child}")
            if node is not None:
                await self.handle(node[0])

    def _seq(self, child: str) -> int:
        digits = child[len(self.prefix):]
        return int(digits) if digits.isdigit() else -1
