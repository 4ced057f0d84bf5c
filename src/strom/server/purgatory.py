"""Delayed operations waiting on partition keys (Kafka's purgatory, for fetch long polls).

A delayed fetch registers one future under each partition it reads; an append to any of them
wakes it so it can re-check `min_bytes`, and its deadline bounds the wait. All on the event
loop, so no locks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterable

from strom.metrics.stats import remote_wait


class Purgatory:
    def __init__(self) -> None:
        self._watchers: dict[Hashable, set[asyncio.Future]] = {}

    async def wait_any(self, keys: Iterable[Hashable], timeout: float) -> bool:
        """Wait until one of `keys` is woken or `timeout` seconds pass; True if woken."""
        future = asyncio.get_running_loop().create_future()
        keys = list(keys)
        for key in keys:
            self._watchers.setdefault(key, set()).add(future)
        try:
            with remote_wait():
                await asyncio.wait_for(future, timeout)
            return True
        except TimeoutError:
            return False
        finally:
            for key in keys:
                waiters = self._watchers.get(key)
                if waiters is not None:
                    waiters.discard(future)
                    if not waiters:
                        del self._watchers[key]

    def wake(self, key: Hashable) -> None:
        for future in self._watchers.get(key, ()):
            if not future.done():
                future.set_result(None)

    def __len__(self) -> int:
        return len({f for waiters in self._watchers.values() for f in waiters})
