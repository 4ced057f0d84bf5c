"""A request naming many logs that a clean restart opened lazily reads their directories a
slice at a time, giving the loop back in between: other clients are served meanwhile, not
after thousands of directory reads (a 20,000-partition Fetch held the loop for 5.7 s)."""

import asyncio
from types import SimpleNamespace

from strom.replication.replica_manager import LOAD_SLICE, ReplicaManager


class LazyLog:
    def __init__(self, events: list) -> None:
        self.loaded = self.closed = self.offline = self.end_corrected = False
        self.events = events

    def load(self) -> None:
        self.loaded = True
        self.events.append("load")


def test_lazy_logs_are_read_a_slice_at_a_time_with_the_loop_given_back() -> None:
    events: list[str] = []
    manager = ReplicaManager(1, log_manager=None)
    count = 2 * LOAD_SLICE + 10
    manager.partitions = {("t", i): SimpleNamespace(log=LazyLog(events)) for i in range(count)}
    manager.partitions[("t", 0)].log.loaded = True  # the background load got there first

    async def run() -> None:
        async def other_client() -> None:
            while len(events) < count - 1:
                events.append("other")
                await asyncio.sleep(0)

        other = asyncio.create_task(other_client())
        await asyncio.sleep(0)
        await manager.load_logs([("t", i) for i in range(count)] + [("gone", 0)])
        await other

    asyncio.run(run())
    loads = [i for i, e in enumerate(events) if e == "load"]
    assert len(loads) == count - 1  # each unloaded log once; the loaded one and the unknown not
    runs, current = [], 0
    for e in events:
        if e == "load":
            current += 1
        elif current:
            runs.append(current)
            current = 0
    if current:
        runs.append(current)
    assert max(runs) <= LOAD_SLICE and len(runs) >= 3, runs  # never more than a slice in one stretch
