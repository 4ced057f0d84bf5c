"""An idle replica fetcher reuses its last fetch states instead of reading every partition's
log before each fetch, and reads them again after anything that can change them: a partition
added or removed, an answer, a delay, a truncation, and every REBUILD_EVERY fetches at least
(for what changes outside the fetcher, as the follower's own retention moving a log start)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from strom.protocol.errors import ErrorCode
from strom.replication.replica_fetcher import REBUILD_EVERY, ReplicaFetcher, ReplicaFetcherManager

LEADER = 1


class FakeBroker:
    broker_id = 3
    config = {"replica.fetch.backoff.ms": 1000, "num.replica.fetchers": 1,
              "follower.replication.throttled.rate": 2**63 - 1, "replica.fetch.max.bytes": 1 << 20,
              "replica.fetch.wait.max.ms": 500, "replica.fetch.min.bytes": 1,
              "replica.fetch.response.max.bytes": 10 << 20}


class CountingLog:
    """A follower's log as the fetcher reads it, counting the reads of its fetch state."""

    def __init__(self) -> None:
        self.reads = 0
        self.log_end_offset = 5
        self.log_start_offset = 0
        self.config = SimpleNamespace(follower_replication_throttled_replicas=None)
        self.leader_epoch_cache = SimpleNamespace(latest_epoch=self._latest_epoch)

    def _latest_epoch(self) -> int:
        self.reads += 1
        return 2


def partition(index: int) -> SimpleNamespace:
    return SimpleNamespace(topic="t", index=index, leader_id=LEADER, leader_epoch=2, log=CountingLog())


class FakeLeader:
    """Answers every fetch in the session with nothing new; records what each request named."""

    def __init__(self) -> None:
        self.requests: list[dict] = []

    async def call(self, api_key: int, version: int, fields: dict, timeout_s: float = 0) -> SimpleNamespace:
        self.requests.append(fields)
        return SimpleNamespace(error_code=0, session_id=55, responses=[])

    def close(self) -> None:
        pass

    def named(self, request: int = -1) -> list[tuple[str, int]]:
        return sorted((t["topic"], p["partition"]) for t in self.requests[request]["topics"]
                      for p in t["partitions"])

    def forgotten(self, request: int = -1) -> list[tuple[str, int]]:
        return sorted((t["topic"], p) for t in self.requests[request]["forgotten_topics_data"]
                      for p in t["partitions"])


def run(scenario) -> None:
    async def main() -> None:
        fetcher = ReplicaFetcher(ReplicaFetcherManager(FakeBroker()), leader_id=LEADER, index=0)
        fetcher.task.cancel()  # the test drives _fetch itself
        leader = fetcher.conn = FakeLeader()
        try:
            await scenario(fetcher, leader)
        finally:
            fetcher.conn = None

    asyncio.run(main())


def add_fetching(fetcher: ReplicaFetcher, *indexes: int) -> None:
    """Partitions whose divergence with the leader is settled: fetched from now on."""
    for i in indexes:
        fetcher.add(partition(i))
        fetcher.partitions[("t", i)].truncating = False


def reads(fetcher: ReplicaFetcher) -> int:
    return sum(s.partition.log.reads for s in fetcher.partitions.values())


def test_idle_fetches_reuse_the_states_until_something_changes() -> None:
    async def scenario(fetcher: ReplicaFetcher, leader: FakeLeader) -> None:
        add_fetching(fetcher, 0, 1, 2)
        await fetcher._fetch()
        assert leader.named() == [("t", 0), ("t", 1), ("t", 2)]  # the session's first, full request
        assert reads(fetcher) == 3
        for _ in range(3):
            await fetcher._fetch()
            assert leader.named() == [] and leader.forgotten() == []
        assert reads(fetcher) == 3  # not read again: nothing changed
        assert [r["session_epoch"] for r in leader.requests] == [0, 1, 2, 3]

        add_fetching(fetcher, 3)  # a change: read everything again, name only the new one
        await fetcher._fetch()
        assert leader.named() == [("t", 3)] and reads(fetcher) == 7

        fetcher.remove(("t", 1))
        await fetcher._fetch()
        assert leader.named() == [] and leader.forgotten() == [("t", 1)]

    run(scenario)


def test_a_change_outside_the_fetcher_is_sent_within_rebuild_every_fetches() -> None:
    async def scenario(fetcher: ReplicaFetcher, leader: FakeLeader) -> None:
        add_fetching(fetcher, 0)
        await fetcher._fetch()
        fetcher.partitions[("t", 0)].partition.log.log_start_offset = 3  # its own retention
        named_at = None
        for n in range(1, REBUILD_EVERY + 2):
            await fetcher._fetch()
            if leader.named():
                named_at = n
                break
        assert named_at == REBUILD_EVERY + 1
        assert leader.requests[-1]["topics"][0]["partitions"][0]["log_start_offset"] == 3

    run(scenario)


def test_a_delayed_partition_is_fetched_again_once_its_delay_is_over() -> None:
    async def scenario(fetcher: ReplicaFetcher, leader: FakeLeader) -> None:
        add_fetching(fetcher, 0, 1)
        await fetcher._fetch()
        fetcher._delay(fetcher.partitions[("t", 1)], ErrorCode.UNKNOWN_LEADER_EPOCH)  # 50 ms
        await fetcher._fetch()
        assert leader.forgotten() == [("t", 1)]  # left out while it waits
        await asyncio.sleep(0.1)
        await fetcher._fetch()
        assert leader.named() == [("t", 1)]  # back at once, not after REBUILD_EVERY fetches

    run(scenario)
