"""Three RaftDrivers over real 127.0.0.1 sockets and files: they elect a leader, commit, survive
the leader's clean shutdown, and come back from their files."""

from __future__ import annotations

import asyncio
import random
import time

from raft_wire import RaftServer, Sender

from strom.protocol.raft_records import Endpoint, VoterEntry, iter_batches
from strom.raft import effects as fx
from strom.raft.config import QuorumConfig
from strom.raft.driver import RaftDriver
from strom.raft.file_log import QUORUM_STATE
from strom.raft.state import ElectionState, Role

FAST = dict(election_timeout_ms=300, fetch_timeout_ms=600, election_backoff_max_ms=200, request_timeout_ms=1000,
            fetch_max_wait_ms=100)


async def _cluster(tmp_path, ids=(1, 2, 3), ports=None):
    servers = {i: RaftServer() for i in ids}
    if ports is None:
        ports = {i: await s.start() for i, s in servers.items()}
    else:
        for i, s in servers.items():
            s.server = await asyncio.start_server(s._serve, "127.0.0.1", ports[i])
    voters = tuple(VoterEntry(i, None, (Endpoint("CONTROLLER", "127.0.0.1", ports[i]),)) for i in ids)
    committed: dict[int, list[bytes]] = {i: [] for i in ids}
    drivers = {}
    for i in ids:
        def listener(e, i=i):
            if isinstance(e, fx.Committed):
                for b in e.batches:
                    if not b.is_control:
                        committed[i].append(b.data)
        cfg = QuorumConfig(node_id=i, voters=voters, cluster_id="test-cluster", **FAST)
        drivers[i] = RaftDriver(cfg, tmp_path / f"n{i}" / "__cluster_metadata-0", Sender(ports), listener,
                                rng=random.Random(i))
        servers[i].driver = drivers[i]
    for d in drivers.values():
        await d.start()
    return servers, drivers, committed, ports


async def _leader(drivers, timeout=10.0) -> RaftDriver:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        leaders = [d for d in drivers.values() if d.core.role is Role.LEADER and d.core.high_watermark > d.core.epoch_start_offset]
        if len(leaders) == 1:
            return leaders[0]
        await asyncio.sleep(0.02)
    raise AssertionError({i: (d.core.role, d.core.epoch) for i, d in drivers.items()})


async def _stop(servers, drivers):
    for d in drivers.values():
        await d.close()
        d._send_fn.close()
    for s in servers.values():
        await s.close()


def test_three_drivers_elect_commit_and_fail_over(tmp_path):
    async def main():
        servers, drivers, committed, ports = await _cluster(tmp_path)
        try:
            leader = await _leader(drivers)
            offsets = [await leader.append([b"record-%d" % i]) for i in range(20)]
            assert offsets == sorted(offsets)
            hw = leader.core.high_watermark
            loop = asyncio.get_running_loop()
            end = loop.time() + 10
            while loop.time() < end and not all(d.core.high_watermark >= hw for d in drivers.values()):
                await asyncio.sleep(0.02)
            assert all(d.core.high_watermark >= hw for d in drivers.values())
            assert committed[1] == committed[2] == committed[3] and len(committed[1]) == 20
            # Clean shutdown of the leader: it resigns, the other two elect a new one and commit.
            old = next(i for i, d in drivers.items() if d is leader)
            old_epoch = leader.core.epoch
            await leader.close()
            await servers[old].close()
            rest = {i: d for i, d in drivers.items() if i != old}
            new = await _leader(rest)
            assert new.core.epoch > old_epoch
            await new.append([b"after-failover"])
            # The stopped node's files hold what Kafka's would: quorum-state JSON and segments.
            files = tmp_path / f"n{old}" / "__cluster_metadata-0"
            state = ElectionState.from_json((files / QUORUM_STATE).read_text())
            assert state.epoch == old_epoch and state.leader_id == old
            segment = (files / ("0" * 20 + ".log")).read_bytes()
            assert len(list(iter_batches(segment))) >= 21
            drivers.pop(old)
            servers.pop(old)
        finally:
            await _stop(servers, drivers)

    asyncio.run(main())


def test_drivers_restart_from_their_files(tmp_path):
    async def main():
        servers, drivers, committed, ports = await _cluster(tmp_path)
        try:
            leader = await _leader(drivers)
            for i in range(5):
                await leader.append([b"before-%d" % i])
            epoch = leader.core.epoch
        finally:
            await _stop(servers, drivers)
        servers, drivers, committed, _ = await _cluster(tmp_path, ports=ports)
        try:
            leader = await _leader(drivers)
            assert leader.core.epoch > epoch
            await leader.append([b"after-restart"])
            values = [v for d in committed.values() for v in d]
            assert any(b"after-restart" in v for v in values)
            # The restarted quorum re-commits what it had before the restart, in the same order.
            first = committed[leader.config.node_id]
            assert [v for v in first if b"before-" in v] == [v for v in first if b"before-" in v][:5]
            assert sum(b"before-" in v for v in first) == 5
        finally:
            await _stop(servers, drivers)

    asyncio.run(main())


def test_a_slow_state_machine_does_not_stall_the_quorum(tmp_path):
    """Followers whose listener takes long over each commit (a commit of 100,000 records being
    applied) keep fetching: the leader keeps its epoch and their logs keep up, and the listener
    still hears every commit, in order, once it gets to them."""
    async def main():
        servers, drivers, committed, ports = await _cluster(tmp_path)
        try:
            leader = await _leader(drivers)
            epoch = leader.core.epoch
            gate = asyncio.Event()
            for d in drivers.values():
                if d is leader:
                    continue
                hear = d.listener

                async def slow(e, hear=hear):
                    if isinstance(e, fx.Committed):
                        await gate.wait()
                    hear(e)

                d.listener = slow
            for i in range(10):
                await leader.append([b"while-slow-%d" % i])
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.5)  # 2.5 fetch timeouts in all with the state machines held
            hw = leader.core.high_watermark
            assert leader.core.role is Role.LEADER and leader.core.epoch == epoch
            assert all(d.core.high_watermark == hw and d.core.epoch == epoch for d in drivers.values())
            gate.set()
            loop = asyncio.get_running_loop()
            end = loop.time() + 10
            while loop.time() < end and not all(len(c) == 10 for c in committed.values()):
                await asyncio.sleep(0.02)
            assert committed[1] == committed[2] == committed[3] and len(committed[1]) == 10
        finally:
            await _stop(servers, drivers)

    asyncio.run(main())


def test_a_stalled_process_does_not_depose_its_leader(tmp_path):
    """The whole process stops for longer than the fetch timeout (a long pause of the
    interpreter): when it runs again, the answers that waited in the sockets are heard before
    the timers judge the quorum, so nobody stands for election over a stall they all shared."""
    async def main():
        servers, drivers, committed, ports = await _cluster(tmp_path)
        try:
            leader = await _leader(drivers)
            epoch = leader.core.epoch
            for round_ in range(5):
                await leader.append([b"before-stall-%d" % round_])
                await asyncio.sleep(0.15)
                time.sleep(1.5)  # 2.5 fetch timeouts with every loop held
            await asyncio.sleep(1.0)
            assert {d.core.epoch for d in drivers.values()} == {epoch}
            assert leader.core.role is Role.LEADER
        finally:
            await _stop(servers, drivers)

    asyncio.run(main())
