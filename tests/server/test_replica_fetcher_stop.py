"""A replica fetcher stops when the broker stops: none is made after the fetchers shut down,
and one whose cancellation was lost inside a call still ends (else the process never exits)."""

import asyncio
from types import SimpleNamespace

from strom.replication.replica_fetcher import ReplicaFetcher, ReplicaFetcherManager


class FakeBroker:
    broker_id = 3
    config = {"replica.fetch.backoff.ms": 1000, "num.replica.fetchers": 1,
              "follower.replication.throttled.rate": 2**63 - 1}


class FakeConnection:
    def close(self) -> None:
        pass


def test_a_fetcher_whose_cancellation_was_lost_in_a_call_still_ends() -> None:
    async def scenario() -> tuple[bool, int]:
        fetcher = ReplicaFetcher(ReplicaFetcherManager(FakeBroker()), leader_id=1, index=0)
        fetcher.conn = FakeConnection()
        fetcher.partitions[("t", 0)] = SimpleNamespace(truncating=False)
        calls = 0

        async def fetch_that_loses_a_cancellation() -> None:
            # asyncio.wait_for in Python 3.11 returns an answer that arrived as it was
            # cancelled, and the cancellation is gone
            nonlocal calls
            calls += 1
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                pass

        fetcher._fetch = fetch_that_loses_a_cancellation
        await asyncio.sleep(0.05)
        fetcher.task.cancel()  # what the event loop does to tasks left at exit: once
        await asyncio.wait({fetcher.task}, timeout=2)
        done = fetcher.task.done()
        if not done:
            fetcher.stop()
        return done, calls

    done, calls = asyncio.run(scenario())
    assert calls >= 2
    assert done, "the fetcher went on fetching after its cancellation"


def test_no_fetcher_is_made_once_the_fetchers_shut_down() -> None:
    async def scenario() -> dict:
        manager = ReplicaFetcherManager(FakeBroker())
        manager.shutdown()
        manager.add_partition(SimpleNamespace(topic="t", index=0, leader_id=1))
        fetchers = dict(manager.fetchers)
        for fetcher in fetchers.values():
            fetcher.stop()
        return fetchers

    assert asyncio.run(scenario()) == {}
