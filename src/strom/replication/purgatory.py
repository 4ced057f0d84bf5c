"""Delayed operations waiting on partition keys (Kafka's purgatory, for fetch long polls).

A delayed fetch registers one future under each partition it reads; an append to any of them
wakes it so it can re-check `min_bytes`, and its deadline bounds the wait. All on the event
loop, so no locks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Container, Hashable, Iterable

from strom.metrics.stats import remote_wait


class Purgatory:
    def __init__(self) -> None:
        self._watchers: dict[Hashable, set[asyncio.Future]] = {}
        # Waits on whatever keys a container holds at wake time (a follower's fetch session of
        # thousands of partitions registers once, not once per partition per fetch).
        self._wide: dict[asyncio.Future, Container[Hashable]] = {}

    async def wait_any(self, keys: Iterable[Hashable], timeout: float) -> bool:
        """Wait until one of `keys` is woken or `timeout` seconds pass; True if woken."""
        future = asyncio.get_running_loop().create_future()
        keys = list(keys)
        for key in keys:
            self._watchers.setdefault(key, set()).add(future)
        try:
            return await self._wait(future, timeout)
        finally:
            for key in keys:
                waiters = self._watchers.get(key)
                if waiters is not None:
                    waiters.discard(future)
                    if not waiters:
                        del self._watchers[key]

    async def wait_any_in(self, keys: Container[Hashable], timeout: float) -> bool:
        """As wait_any, for any key `keys` holds when it is woken."""
        future = asyncio.get_running_loop().create_future()
        self._wide[future] = keys
        try:
            return await self._wait(future, timeout)
        finally:
            del self._wide[future]

    @staticmethod
    async def _wait(future: asyncio.Future, timeout: float) -> bool:
        try:
            with remote_wait():
                await asyncio.wait_for(future, timeout)
            return True
        except TimeoutError:
            return False

    def wake(self, key: Hashable) -> None:  # at every append: the usual nothing to wake costs two lookups
        watchers = self._watchers.get(key)
        if watchers:
            for future in watchers:
                if not future.done():
                    future.set_result(None)
        if not self._wide:
            return
        for future, keys in self._wide.items():
            if key in keys and not future.done():
                future.set_result(None)

    def __len__(self) -> int:
        return len({f for waiters in self._watchers.values() for f in waiters}) + len(self._wide)
