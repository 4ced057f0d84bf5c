"""Metadata log batches carry wall-clock milliseconds, as Kafka's do, while the Raft core's
timers run on the monotonic clock: a one-voter RaftDriver over real files."""

from __future__ import annotations

import asyncio
import random
import time

from strom.protocol.raft_records import Endpoint, VoterEntry, iter_batches
from strom.raft.config import QuorumConfig
from strom.raft.driver import RaftDriver
from strom.raft.state import Role


async def _nowhere(*_args):
    raise ConnectionError("a one-voter quorum sends nothing")


def test_batches_and_snapshots_are_stamped_with_the_wall_clock(tmp_path):
    async def main():
        config = QuorumConfig(node_id=1, voters=(VoterEntry(1, None, (Endpoint("CONTROLLER", "127.0.0.1", 1),)),),
                              cluster_id="c1")
        directory = tmp_path / "__cluster_metadata-0"
        driver = RaftDriver(config, directory, _nowhere, rng=random.Random(1))
        before = int(time.time() * 1000)
        await driver.start()
        try:
            for _ in range(500):
                if driver.core.role is Role.LEADER and driver.core.high_watermark > driver.core.epoch_start_offset:
                    break
                await asyncio.sleep(0.01)
            last = await driver.append([b"a", b"b"])
            assert await driver.snapshot(last + 1, lambda: [b"state"])
            after = int(time.time() * 1000)
        finally:
            await driver.close()
        batches = list(iter_batches((directory / ("0" * 20 + ".log")).read_bytes()))
        assert any(b.is_control for b in batches) and any(not b.is_control for b in batches)
        for b in batches:  # the leader's LeaderChange / voters control batches and the data batch
            assert before <= b.timestamp <= after, (b, before, after)
        snapshot = max(directory.glob("*.checkpoint"))
        assert all(before <= b.timestamp <= after for b in iter_batches(snapshot.read_bytes()))

    asyncio.run(main())
