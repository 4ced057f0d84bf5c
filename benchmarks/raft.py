"""KRaft quorum benchmark: three RaftDrivers in one process over 127.0.0.1 sockets and real files.

Prints: election time after the leader stops (crash, and clean shutdown with EndQuorumEpoch) under
Kafka's default timeouts; commit latency p50/p99 of one record at a time against the disk's own
fsync latency (the floor: a commit needs the leader's and a follower's fsync); records/s through
the quorum with concurrent appenders; and the size, write and load time of a snapshot of the
metadata of 100,000 partitions. The metadata record codecs are not built yet, so that snapshot
holds placeholder records of the size Kafka's are (TopicRecord ~40 B, PartitionRecord with three
replicas ~90 B).

    .venv/bin/python benchmarks/raft.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "raft"))

from raft_wire import RaftServer, Sender  # noqa: E402

from strom.protocol.raft_records import Endpoint, VoterEntry  # noqa: E402
from strom.raft.config import QuorumConfig  # noqa: E402
from strom.raft.driver import RaftDriver  # noqa: E402
from strom.raft.file_log import FileMetadataLog  # noqa: E402
from strom.raft.log import OffsetAndEpoch  # noqa: E402
from strom.raft.snapshots import build_snapshot, read_snapshot  # noqa: E402
from strom.raft.state import Role  # noqa: E402


async def start_cluster(root: Path, ids=(1, 2, 3)):
    servers = {i: RaftServer() for i in ids}
    ports = {i: await s.start() for i, s in servers.items()}
    voters = tuple(VoterEntry(i, None, (Endpoint("CONTROLLER", "127.0.0.1", ports[i]),)) for i in ids)
    drivers = {}
    for i in ids:
        drivers[i] = RaftDriver(QuorumConfig(node_id=i, voters=voters), root / f"n{i}", Sender(ports))
        servers[i].driver = drivers[i]
    for d in drivers.values():
        await d.start()
    return servers, drivers


async def wait_leader(drivers, exclude=None, timeout=30.0) -> RaftDriver:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for i, d in drivers.items():
            c = d.core
            if i != exclude and c.role is Role.LEADER and c.high_watermark > c.epoch_start_offset:
                return d
        await asyncio.sleep(0.005)
    raise TimeoutError("no leader")


async def stop(servers, drivers):
    for i, d in drivers.items():
        if not d._closed:
            await d.close(resign=False)
        d._send_fn.close()
        await servers[i].close()


async def election_times(root: Path, runs: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"crash": [], "clean shutdown": []}
    for run in range(runs):
        for kind in out:
            servers, drivers = await start_cluster(root / f"e{run}-{kind.replace(' ', '')}")
            try:
                leader = await wait_leader(drivers)
                await leader.append([b"x"])
                old = next(i for i, d in drivers.items() if d is leader)
                t0 = time.monotonic()
                await leader.close(resign=(kind == "clean shutdown"))
                await servers[old].close()
                await wait_leader(drivers, exclude=old)
                out[kind].append(time.monotonic() - t0)
            finally:
                await stop(servers, drivers)
    return out


async def commit_latency(drivers, n: int) -> list[float]:
    leader = await wait_leader(drivers)
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        await leader.append([b"latency-%d" % i])
        lat.append(time.perf_counter() - t0)
    return lat


async def throughput(drivers, seconds: float, appenders: int, batch: int) -> float:
    leader = await wait_leader(drivers)
    value = b"m" * 90
    done = 0
    end = time.monotonic() + seconds

    async def appender():
        nonlocal done
        while time.monotonic() < end:
            await leader.append([value] * batch)
            done += batch

    t0 = time.monotonic()
    await asyncio.gather(*(appender() for _ in range(appenders)))
    return done / (time.monotonic() - t0)


def fsync_latency(root: Path, n: int) -> list[float]:
    path = root / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    lat = []
    try:
        for _ in range(n):
            os.write(fd, b"x" * 100)
            t0 = time.perf_counter()
            os.fsync(fd)
            lat.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
    return lat


def snapshot_of_partitions(root: Path, partitions: int) -> None:
    rng = random.Random(1)
    per_topic = 10
    values = []
    for _topic in range(partitions // per_topic):
        values.append(rng.randbytes(40))  # TopicRecord
        values.extend(rng.randbytes(90) for _ in range(per_topic))  # PartitionRecord, 3 replicas
    sid = OffsetAndEpoch(len(values) + 1000, 3)
    t0 = time.perf_counter()
    data = build_snapshot(sid, values, kraft_version=0, voters=None, last_contained_timestamp=0)
    built = time.perf_counter() - t0
    log = FileMetadataLog(root / "snap")
    t0 = time.perf_counter()
    log.write_snapshot(sid, data)
    written = time.perf_counter() - t0
    t0 = time.perf_counter()
    loaded = log.load()
    contents = read_snapshot(loaded.snapshot[1])
    load = time.perf_counter() - t0
    assert len(contents.values) == len(values)
    print(f"snapshot, {partitions:,} partitions ({len(values):,} placeholder records): "
          f"{len(data) / 1e6:.1f} MB, build {built * 1000:.0f} ms, write+fsync {written * 1000:.0f} ms, "
          f"read+decode {load * 1000:.0f} ms")


def ms(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q) - 1] * 1000 if len(xs) > 1 else xs[0] * 1000


async def main(quick: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        fs = fsync_latency(root, 200)
        print(f"baseline: fsync of a 100 B append on this disk p50 {ms(fs, 50):.2f} ms, p99 {ms(fs, 99):.2f} ms")
        servers, drivers = await start_cluster(root / "steady")
        try:
            lat = await commit_latency(drivers, 200 if quick else 1000)
            print(f"commit latency, 1 record at a time: p50 {ms(lat, 50):.2f} ms, p99 {ms(lat, 99):.2f} ms "
                  f"({len(lat)} appends)")
            for appenders, batch in ((1, 1), (64, 1), (64, 100)):
                rate = await throughput(drivers, 2.0 if quick else 5.0, appenders, batch)
                print(f"throughput, {appenders} appenders x {batch} records/append: {rate:,.0f} records/s")
        finally:
            await stop(servers, drivers)
        times = await election_times(root, 1 if quick else 3)
        for kind, xs in times.items():
            print(f"new leader committing after the leader's {kind} (Kafka default timeouts): "
                  + ", ".join(f"{x * 1000:.0f} ms" for x in xs))
        snapshot_of_partitions(root, 100_000)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    asyncio.run(main(parser.parse_args().quick))
