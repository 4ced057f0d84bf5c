"""KRaft benchmark.

In one process, three RaftDrivers over 127.0.0.1 sockets and real files: election time after the
leader stops (crash, and clean shutdown with EndQuorumEpoch) under Kafka's default timeouts;
commit latency p50/p99 of one record at a time against the disk's own fsync latency (the floor:
a commit needs the leader's and a follower's fsync); records/s with concurrent appenders.

The metadata of 100,000 partitions (1,000 topics of 100 partitions, three replicas, a config
each) as Kafka's records: image encode, snapshot build, size, write, read and replay.

With real processes (three `strom serve` controllers, Kafka's default timeouts): a new active
controller after kill -9 of the active one, measured until a CreateTopics commits on the new one;
CreateTopics commit latency p50/p99 (TopicRecord + PartitionRecord, from the client); metadata
records/s through the quorum (CreateTopics of 20 topics x 50 partitions per request).

    .venv/bin/python benchmarks/raft.py [--quick] [--no-processes]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
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


def metadata_image(partitions: int, per_topic: int = 100):
    from strom.metadata import records as r
    from strom.metadata.image import MetadataImage

    image = MetadataImage()
    for b in (1, 2, 3):
        image.replay(r.RegisterBrokerRecord(broker_id=b, incarnation_id=uuid.uuid4(), broker_epoch=b, end_points=[
            r.RegisterBrokerRecord.BrokerEndpoint(name="PLAINTEXT", host="h", port=9092, security_protocol=0)],
            features=[], rack=None, fenced=False))
    for t in range(partitions // per_topic):
        tid = uuid.uuid4()
        image.replay(r.TopicRecord(name=f"topic-{t}", topic_id=tid))
        image.replay(r.ConfigRecord(resource_type=2, resource_name=f"topic-{t}", name="retention.ms", value="86400000"))
        for p in range(per_topic):
            replicas = [1 + (p + k) % 3 for k in range(3)]
            image.replay(r.PartitionRecord(partition_id=p, topic_id=tid, replicas=replicas, isr=replicas,
                                           leader=replicas[0], leader_epoch=0, partition_epoch=0,
                                           directories=[None] * 3))
    return image


def snapshot_of_partitions(root: Path, partitions: int) -> None:
    from strom.metadata.image import MetadataImage

    image = metadata_image(partitions)
    t0 = time.perf_counter()
    values = image.encode()
    encoded = time.perf_counter() - t0
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
    read = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = MetadataImage()
    again.replay_values(contents.values)
    replayed = time.perf_counter() - t0
    assert again.partition_count == partitions and len(contents.values) == len(values)
    print(f"snapshot, {partitions:,} partitions ({len(values):,} records): {len(data) / 1e6:.1f} MB; "
          f"image encode {encoded * 1000:.0f} ms, batches {built * 1000:.0f} ms, write+fsync {written * 1000:.0f} ms; "
          f"load: read {read * 1000:.0f} ms + decode and replay {replayed * 1000:.0f} ms")


def processes(quick: bool) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "kraft"))
    from kraft_support import create_topics, register_brokers

    from strom.client import Connection
    from strom.testing import KRaftQuorum, unique_name, wait_for

    # The records/s scenario makes tens of thousands of partitions: no per-broker bound in the way.
    with KRaftQuorum(3, overrides={"broker.session.timeout.ms": "600000", "max.broker.partitions": "10000000"}) as q:
        q.leader()
        register_brokers(q, [1001, 1002, 1003])
        failover = []
        for _ in range(2 if quick else 5):
            old = q.leader()
            create_topics(q, [(unique_name("warm"), 1, 3, {})])
            t0 = time.monotonic()
            q.nodes[old].kill()
            new = q.leader(timeout=60, exclude=[old])

            wait_for(lambda new=new: _create_ok(q, new), 60, interval=0.01, what="a commit on the new leader")
            failover.append(time.monotonic() - t0)
            q.nodes[old].restart()
            wait_for(lambda: q.describe() is not None and len(q.describe()["current_voters"]) == 3, 60)
        print("real processes, kill -9 of the active controller to a CreateTopics committed by the new one "
              "(Kafka's default timeouts): " + ", ".join(f"{x * 1000:.0f} ms" for x in failover)
              + f"; median {statistics.median(failover) * 1000:.0f} ms")
        leader = q.leader()
        lat = []
        with Connection("127.0.0.1", q.ports[leader], timeout_s=30) as conn:
            for _ in range(100 if quick else 400):
                t0 = time.perf_counter()
                body = conn.call(19, 7, {"timeout_ms": 5000, "validate_only": False, "topics": [
                    {"name": unique_name("lat"), "num_partitions": 1, "replication_factor": 3, "assignments": [],
                     "configs": []}]})
                lat.append(time.perf_counter() - t0)
                assert body.topics[0].error_code == 0, body
            print(f"real processes, CreateTopics of one partition (3 records) commit latency: p50 {ms(lat, 50):.1f} ms, "
                  f"p99 {ms(lat, 99):.1f} ms ({len(lat)} requests)")
            records, t0 = 0, time.monotonic()
            while time.monotonic() - t0 < (5 if quick else 15):
                body = conn.call(19, 7, {"timeout_ms": 30000, "validate_only": False, "topics": [
                    {"name": unique_name("rate"), "num_partitions": 50, "replication_factor": 3, "assignments": [],
                     "configs": []} for _ in range(20)]})
                assert all(t.error_code == 0 for t in body.topics), body
                records += 20 * 51
            rate = records / (time.monotonic() - t0)
            print(f"real processes, metadata records/s through the quorum (CreateTopics, 20 topics x 50 "
                  f"partitions per request): {rate:,.0f}")


def _create_ok(q, node: int) -> bool:
    from strom.client import Connection
    from strom.testing import unique_name

    try:
        with Connection("127.0.0.1", q.ports[node], timeout_s=5) as conn:
            body = conn.call(19, 7, {"timeout_ms": 5000, "validate_only": False, "topics": [
                {"name": unique_name("after"), "num_partitions": 1, "replication_factor": 3, "assignments": [],
                 "configs": []}]})
    except (OSError, ConnectionError):
        return False
    return body.topics[0].error_code == 0


def ms(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q) - 1] * 1000 if len(xs) > 1 else xs[0] * 1000


async def main(quick: bool, with_processes: bool) -> None:
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
    if with_processes:
        processes(quick)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-processes", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.quick, not args.no_processes))
