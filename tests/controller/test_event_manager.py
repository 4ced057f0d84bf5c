"""The controller's event queue: events put from other threads run, and an event put after
the controller's loop has closed (a ZooKeeper watch in flight while it stops) is dropped."""

import asyncio
import threading

from strom.controller.event_manager import ControllerEventManager
from strom.controller.loop_thread import LoopThread


def test_events_run_in_order_and_one_put_after_the_loop_closed_is_dropped() -> None:
    seen: list[str] = []

    async def process(event) -> str:
        seen.append(event.name)
        await asyncio.sleep(0)
        return event.name.upper()

    thread = LoopThread("test-controller")

    async def start() -> ControllerEventManager:
        return ControllerEventManager(process)

    events = asyncio.run_coroutine_threadsafe(start(), thread.loop).result(5)

    async def drive() -> str:
        putter = threading.Thread(target=lambda: [events.put(f"e{i}") for i in range(3)])
        putter.start()
        putter.join()
        return await events.call("last")

    assert asyncio.run_coroutine_threadsafe(drive(), thread.loop).result(5) == "LAST"
    while len(seen) < 4:  # the thread's puts cross to the loop on their own schedule
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0.01), thread.loop).result(5)
    assert sorted(seen) == ["e0", "e1", "e2", "last"]

    async def close() -> None:
        events.close()
        await asyncio.gather(events.task, return_exceptions=True)

    asyncio.run_coroutine_threadsafe(close(), thread.loop).result(5)
    thread.stop()
    assert thread.loop.is_closed()
    events.put("watch_fired_late")  # must neither raise nor run
    assert len(seen) == 4
