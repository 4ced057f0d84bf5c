"""ControllerEventManager: one queue, one consumer (seed 001).

Every ZooKeeper watch, broker request and timer becomes an event put on this queue; a single
task takes them one at a time, so the controller's state is only ever changed by one event
at a time, even while an event waits for the metadata store. `put` may be called from any
thread (the ZooKeeper client calls watches on its own).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ControllerEvent:
    name: str
    args: tuple = ()
    done: asyncio.Future | None = field(default=None, repr=False)


class ControllerEventManager:
    def __init__(self, process: Callable[[ControllerEvent], Awaitable[Any]]) -> None:
        self.process = process
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[ControllerEvent] = asyncio.Queue()
        self.task = self.loop.create_task(self._run(), name="controller-event-thread")

    def put(self, name: str, *args: Any) -> None:
        """Queue an event; safe from any thread. A watch that fires while the controller
        stops (its callback was on the way when the watch was cancelled) finds no one to take
        its event: it is dropped, the loop may already be closed."""
        event = ControllerEvent(name, args)
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:
            if not self.loop.is_closed():
                raise
            log.debug("controller event %s after the controller stopped: dropped", name)

    async def call(self, name: str, *args: Any) -> Any:
        """Queue an event from the loop and wait until it has been processed."""
        event = ControllerEvent(name, args, self.loop.create_future())
        self.queue.put_nowait(event)
        return await event.done

    async def _run(self) -> None:
        while True:
            event = await self.queue.get()
            try:
                result = await self.process(event)
            except asyncio.CancelledError:
                raise
            except BaseException as e:
                log.exception("controller failed processing event %s", event.name)
                if event.done is not None and not event.done.done():
                    event.done.set_exception(e)
                continue
            if event.done is not None and not event.done.done():
                event.done.set_result(result)

    def close(self) -> None:
        self.task.cancel()
