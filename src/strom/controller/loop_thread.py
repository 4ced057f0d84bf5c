"""The controller's own event loop, on a thread of its own.

Electing or moving 100,000 partitions is seconds of Python; on the broker's loop it would
hold every client's produce and fetch for that long. The controller therefore runs its event
queue, its channel to brokers and its store round trips on this loop, and the broker reaches it
only through `call` (and the controller reaches its broker only through the channel's local
delivery, which crosses back the same way). Both loops share the GIL, so a busy controller
slows its broker's requests by a switch interval (milliseconds), never by a whole election.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on this thread's loop and await its result from the caller's loop."""
        if asyncio.get_running_loop() is self.loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def stop(self) -> None:
        """Stop the loop once the callbacks queued so far have run, and wait for the thread."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join(10)
