"""KafkaScheduler: the broker's periodic jobs, each a task on the event loop that runs its job
every interval. A job that fails is logged and runs again at its next turn."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine

log = logging.getLogger(__name__)

NEVER_MS = 2**31  # intervals this long are Kafka's Long.MAX_VALUE defaults: never scheduled


class KafkaScheduler:
    def __init__(self) -> None:
        self._tasks: list[asyncio.Task] = []

    def schedule(self, name: str, interval_ms: int, job: Callable[[], object]) -> None:
        """Run `job` (a function, or one returning a coroutine) every `interval_ms`, from one
        interval after now; an interval <= 0 or >= 2^31 ms schedules nothing."""
        async def run() -> None:
            while True:
                await asyncio.sleep(interval_ms / 1000)
                try:
                    result = job()
                    if asyncio.iscoroutine(result):
                        await result
                except Exception:
                    log.exception("scheduled task %s failed", name)

        if 0 < interval_ms < NEVER_MS:
            self._tasks.append(asyncio.get_running_loop().create_task(run(), name=name))

    def once(self, name: str, work: Coroutine) -> None:
        """Run `work` once in the background (cancelled at shutdown if still running)."""
        self._tasks.append(asyncio.get_running_loop().create_task(work, name=name))

    def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
