"""A deterministic simulation of a Raft quorum: RaftCore instances under a virtual clock, a
seeded network that drops, delays, duplicates, reorders and partitions messages, and disks that
lose what was not flushed when a node crashes. Every random choice comes from one seed, so a
failing seed replays exactly.

Invariants are checked as the state changes (after every event): at most one leader per epoch,
one vote per node per epoch, a node's high watermark never goes back within a run of it, a
committed offset never changes value anywhere, and every node's committed prefix (from its log or
a snapshot) equals the one committed cluster-wide. Liveness: once the faults heal, a leader is
elected and a record appended then commits on every node within a bounded virtual time.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any

from strom.protocol.raft_records import Endpoint, VoterEntry
from strom.protocol.records import iter_records
from strom.raft import effects as fx
from strom.raft.config import QuorumConfig
from strom.raft.core import ADD_RAFT_VOTER, API_VERSIONS, REMOVE_RAFT_VOTER, NotLeader, RaftCore
from strom.raft.log import LogBatch, OffsetAndEpoch
from strom.raft.snapshots import build_snapshot, read_snapshot
from strom.raft.state import ElectionState, Role


class InvariantViolation(AssertionError):
    pass


@dataclass
class Faults:
    drop: float = 0.0
    duplicate: float = 0.0
    max_delay_ms: int = 5
    partitions: bool = False
    crashes: bool = False
    voter_changes: bool = False
    leader_churn: bool = False  # isolate or crash whoever leads, again and again


@dataclass
class Node:
    node_id: int
    core: RaftCore | None = None
    alive: bool = True
    incarnation: int = 0
    # the disk: what survives a crash
    election: ElectionState = field(default_factory=ElectionState)
    durable: list[LogBatch] = field(default_factory=list)
    snapshot: tuple[OffsetAndEpoch, bytes] | None = None
    # page cache: appended, not yet flushed
    volatile: list[LogBatch] = field(default_factory=list)
    # the state machine: committed values by offset, and its high watermark this incarnation
    applied: dict[int, bytes] = field(default_factory=dict)
    high_watermark: int = 0
    tick_at: int = -1


def _encode_entry(offset: int, value: bytes) -> bytes:
    return b"%d:" % offset + value


def _decode_entry(entry: bytes) -> tuple[int, bytes]:
    offset, _, value = entry.partition(b":")
    return int(offset), value


CONTROL = b"<control>"


class Simulation:
    def __init__(self, seed: int, *, voters: int = 3, observers: int = 0, faults: Faults | None = None,
                 dynamic: bool = False, snapshot_bytes: int = 4096, fetch_max_bytes: int = 8 << 20,
                 flush_delay_ms: int = 3, timeout_scale: float = 1.0, trace: bool = False) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.faults = faults or Faults()
        self.now = 0
        self.events: list[tuple[int, int, str, tuple]] = []
        self._seq = 0
        self.trace = trace
        self.log_lines: list[str] = []
        self.voter_ids = list(range(1, voters + 1))
        self.all_ids = list(range(1, voters + observers + 1))
        self.dynamic = dynamic
        endpoints = {i: (Endpoint("CONTROLLER", "127.0.0.1", 9000 + i),) for i in self.all_ids}
        self.entries = {i: VoterEntry(i, None, endpoints[i]) for i in self.all_ids}
        defaults = QuorumConfig(node_id=0)
        self.config_kwargs = dict(
            max_bytes_between_snapshots=snapshot_bytes, fetch_max_bytes=fetch_max_bytes,
            election_timeout_ms=int(defaults.election_timeout_ms * timeout_scale),
            fetch_timeout_ms=int(defaults.fetch_timeout_ms * timeout_scale),
            election_backoff_max_ms=int(defaults.election_backoff_max_ms * timeout_scale),
            request_timeout_ms=int(defaults.request_timeout_ms * timeout_scale),
            fetch_max_wait_ms=int(defaults.fetch_max_wait_ms * timeout_scale))
        self.flush_delay_ms = flush_delay_ms
        self.nodes = {i: Node(i) for i in self.all_ids}
        self.cut: set[frozenset[int]] = set()
        # cluster-wide facts the invariants compare against
        self.committed: dict[int, bytes] = {}
        self.leaders: dict[int, int] = {}
        self.votes: dict[tuple[int, int], int] = {}
        self.appended = 0
        self.rounds = 0
        if dynamic:
            self._bootstrap = self._bootstrap_snapshot()
        for i in self.all_ids:
            self._boot(self.nodes[i])

    # --- plumbing -----------------------------------------------------------------------------

    def _log(self, text: str) -> None:
        if self.trace:
            self.log_lines.append(f"{self.now:>7} {text}")

    def _at(self, t: int, kind: str, *payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, payload))

    def _config(self, node_id: int) -> QuorumConfig:
        voters = () if self.dynamic else tuple(self.entries[i] for i in self.voter_ids)
        return QuorumConfig(node_id=node_id, voters=voters, cluster_id="sim-cluster", **self.config_kwargs)

    def _bootstrap_snapshot(self) -> tuple[OffsetAndEpoch, bytes]:
        """What `kafka-storage format --initial-controllers` writes: a 0-0 checkpoint holding
        kraft.version 1 and the first voter set."""
        sid = OffsetAndEpoch(0, 0)
        return sid, build_snapshot(sid, [], kraft_version=1, voters=[self.entries[i] for i in self.voter_ids],
                                   last_contained_timestamp=0)

    def _boot(self, node: Node) -> None:
        node.incarnation += 1
        node.alive = True
        node.volatile = list(node.durable)
        node.applied = {}
        node.high_watermark = 0
        node.tick_at = -1
        snapshot = node.snapshot or (self._bootstrap if self.dynamic else None)
        node.core = RaftCore(self._config(node.node_id), rng=random.Random(self.rng.random()),
                             election=node.election, log_batches=list(node.durable), snapshot=snapshot)
        self._apply(node, node.core.start(self.now))
        self._schedule_tick(node)

    def _schedule_tick(self, node: Node) -> None:
        t = node.core.next_deadline()
        if node.tick_at <= self.now or t < node.tick_at:
            node.tick_at = t
            self._at(t, "tick", node.node_id, node.incarnation)

    def _connected(self, a: int, b: int) -> bool:
        return frozenset((a, b)) not in self.cut

    def _transmit(self, src: int, dst: int, kind: str, payload: tuple) -> None:
        f = self.faults
        if not self._connected(src, dst) or self.rng.random() < f.drop:
            return
        copies = 2 if self.rng.random() < f.duplicate else 1
        for _ in range(copies):
            self._at(self.now + self.rng.randint(1, f.max_delay_ms), kind, src, dst, payload)

    # --- effects ------------------------------------------------------------------------------

    def _apply(self, node: Node, effects: list[fx.Effect]) -> None:
        for e in effects:
            self._apply_one(node, e)
        self._check_leader(node)

    def _apply_one(self, node: Node, e: fx.Effect) -> None:
        nid = node.node_id
        if isinstance(e, fx.Send):
            self._transmit(nid, e.dest, "request", (node.incarnation, e.request_id, e.api_key, e.version, e.body))
        elif isinstance(e, fx.Respond):
            src, src_inc, rid = e.ref
            if src < 0:
                return  # an admin request of the simulation itself
            self._transmit(nid, src, "response", (src_inc, rid, e.body))
        elif isinstance(e, fx.PersistElectionState):
            s = e.state
            if s.voted_id >= 0:
                prev = self.votes.setdefault((nid, s.epoch), s.voted_id)
                if prev != s.voted_id:
                    self._fail(f"node {nid} voted for {prev} and then {s.voted_id} in epoch {s.epoch}")
            if s.epoch < node.election.epoch:
                self._fail(f"node {nid} persisted epoch {s.epoch} after {node.election.epoch}")
            node.election = s
        elif isinstance(e, fx.AppendLog):
            node.volatile.append(e.batch)
        elif isinstance(e, fx.TruncateLog):
            node.volatile = [b for b in node.volatile if b.base_offset < e.end_offset]
            node.durable = [b for b in node.durable if b.base_offset < e.end_offset]
        elif isinstance(e, fx.FlushLog):
            self._at(self.now + self.rng.randint(0, self.flush_delay_ms), "flush", nid, node.incarnation, e.end_offset, e.generation)
        elif isinstance(e, fx.WriteSnapshot):
            node.snapshot = (e.snapshot_id, e.data)
        elif isinstance(e, fx.DeleteLogPrefix):
            keep = (lambda b: False) if e.reset else (lambda b: b.end_offset > e.start_offset)
            node.volatile = [b for b in node.volatile if keep(b)]
            node.durable = [b for b in node.durable if keep(b)]
        elif isinstance(e, fx.Committed):
            self._on_committed(node, e)
        elif isinstance(e, fx.LoadSnapshot):
            self._on_load_snapshot(node, e)
        elif isinstance(e, fx.SnapshotDue):
            self._take_snapshot(node)
        elif isinstance(e, fx.LeaderChanged):
            self._log(f"node {nid}: leader {e.leader_id} epoch {e.epoch}")

    def _check_leader(self, node: Node) -> None:
        core = node.core
        if core.role is Role.LEADER:
            prev = self.leaders.setdefault(core.epoch, node.node_id)
            if prev != node.node_id:
                self._fail(f"two leaders in epoch {core.epoch}: {prev} and {node.node_id}")

    def _on_committed(self, node: Node, e: fx.Committed) -> None:
        if e.high_watermark < node.high_watermark:
            self._fail(f"node {node.node_id} high watermark went back {node.high_watermark} -> {e.high_watermark}")
        for batch in e.batches:
            if batch.is_control:
                values = [CONTROL] * (batch.last_offset - batch.base_offset + 1)
            else:
                values = [r.value for r in iter_records(batch.data)]
            for i, v in enumerate(values):
                self._commit(node, batch.base_offset + i, v)
        node.high_watermark = e.high_watermark

    def _commit(self, node: Node, offset: int, value: bytes) -> None:
        known = self.committed.setdefault(offset, value)
        if known != value:
            self._fail(f"offset {offset} committed as {known!r} and as {value!r} (node {node.node_id})")
        node.applied[offset] = value

    def _on_load_snapshot(self, node: Node, e: fx.LoadSnapshot) -> None:
        contents = read_snapshot(e.data)
        node.applied = {}
        for entry in contents.values:
            offset, value = _decode_entry(entry)
            self._commit(node, offset, value)
        if e.snapshot_id.offset < node.high_watermark:
            self._fail(f"node {node.node_id} loaded snapshot {e.snapshot_id} behind its high watermark")
        node.high_watermark = e.snapshot_id.offset

    def _take_snapshot(self, node: Node) -> None:
        core = node.core
        end = core.high_watermark
        values = [_encode_entry(o, v) for o, v in sorted(node.applied.items()) if o < end]
        self._apply(node, core.create_snapshot(end, values, self.now))

    def _fail(self, message: str) -> None:
        raise InvariantViolation(f"seed {self.seed} at {self.now} ms: {message}")

    # --- events -------------------------------------------------------------------------------

    def step(self) -> bool:
        if not self.events:
            return False
        t, _, kind, payload = heapq.heappop(self.events)
        self.now = t
        getattr(self, "_ev_" + kind)(*payload)
        return True

    def run_until(self, t: int, stop=None) -> bool:
        while self.events and self.events[0][0] <= t:
            self.step()
            if stop is not None and stop():
                return True
        self.now = max(self.now, t)
        return stop() if stop is not None else False

    def _node(self, nid: int, incarnation: int) -> Node | None:
        node = self.nodes[nid]
        return node if node.alive and node.incarnation == incarnation else None

    def _ev_tick(self, nid: int, incarnation: int) -> None:
        node = self._node(nid, incarnation)
        if node is None or node.tick_at != self.now:
            return  # superseded by an earlier tick
        self._apply(node, node.core.tick(self.now))
        self._schedule_tick(node)

    def _ev_request(self, src: int, dst: int, payload: tuple) -> None:
        node = self.nodes[dst]
        if not node.alive and self._connected(src, dst):
            # A crashed node's port refuses connections: the sender learns it at once.
            self._at(self.now + self.rng.randint(1, 5), "refused", src, payload[0], payload[1])
        if not node.alive or not self._connected(src, dst):
            return
        src_inc, rid, api_key, version, body = payload
        if api_key == API_VERSIONS:  # a leader asking a voter to be added (its controller listener answers)
            features = [{"name": "kraft.version", "min_version": 0, "max_version": 1}]
            self._transmit(dst, src, "response", (src_inc, rid, {"error_code": 0, "supported_features": features}))
            return
        self._apply(node, node.core.handle_request((src, src_inc, rid), src, api_key, version, body, self.now))
        self._schedule_tick(node)

    def _ev_refused(self, nid: int, incarnation: int, rid: int) -> None:
        node = self._node(nid, incarnation)
        if node is None:
            return
        self._apply(node, node.core.request_failed(rid, self.now, unreachable=True))
        self._schedule_tick(node)

    def _ev_response(self, src: int, dst: int, payload: tuple) -> None:
        dst_inc, rid, body = payload
        node = self._node(dst, dst_inc)
        if node is None or not self._connected(src, dst):
            return
        self._apply(node, node.core.handle_response(rid, body, self.now))
        self._schedule_tick(node)

    def _ev_flush(self, nid: int, incarnation: int, end_offset: int, generation: int) -> None:
        node = self._node(nid, incarnation)
        if node is None:
            return
        # fsync persists what is in the file now; flushes finishing out of order never un-persist
        # (the durable log is always a prefix of the written one: truncations cut both).
        synced = [b for b in node.volatile if b.base_offset < end_offset]
        if len(synced) > len(node.durable):
            node.durable = synced
        self._apply(node, node.core.on_flushed(end_offset, generation, self.now))
        self._schedule_tick(node)

    def _ev_append(self) -> None:
        leaders = [n for n in self.nodes.values() if n.alive and n.core.role is Role.LEADER]
        if leaders:
            node = self.rng.choice(leaders)
            self.appended += 1
            values = [b"v%d" % self.appended for _ in range(self.rng.randint(1, 3))]
            try:
                _, effects = node.core.append(values, self.now)
            except NotLeader:
                return
            self._apply(node, effects)
            self._schedule_tick(node)

    def _ev_crash(self, nid: int) -> None:
        if nid == 0:  # "whoever leads now"
            leaders = [n.node_id for n in self.nodes.values() if n.alive and n.core.role is Role.LEADER]
            if not leaders:
                return
            nid = leaders[0]
            self._at(self.now + self.rng.randint(50, 2000), "restart", nid)
        node = self.nodes[nid]
        if not node.alive:
            return
        self._log(f"crash {nid}")
        node.alive = False
        node.volatile = []

    def _ev_shutdown(self) -> None:
        """A leader shut down cleanly: it resigns (EndQuorumEpoch), then stops."""
        leaders = [n for n in self.nodes.values() if n.alive and n.core.role is Role.LEADER]
        if leaders:
            node = leaders[0]
            self._apply(node, node.core.resign(self.now))
            self._at(self.now + self.rng.randint(1, 20), "crash", node.node_id)
            self._at(self.now + self.rng.randint(100, 2000), "restart", node.node_id)

    def _ev_restart(self, nid: int) -> None:
        node = self.nodes[nid]
        if node.alive:
            return
        self._log(f"restart {nid}")
        self._boot(node)

    def _ev_partition(self, group: frozenset[int]) -> None:
        self._log(f"partition {sorted(group)}")
        for a in group:
            for b in self.all_ids:
                if b not in group:
                    self.cut.add(frozenset((a, b)))

    def _ev_heal(self) -> None:
        self.cut.clear()

    def _ev_isolate_leader(self) -> None:
        """Cut the leader off with a minority (its uncommitted tail then competes with what the
        majority writes next: the Figure 8 situations of the Raft paper)."""
        leaders = [n.node_id for n in self.nodes.values() if n.alive and n.core.role is Role.LEADER]
        if not leaders:
            return
        others = [i for i in self.all_ids if i != leaders[0]]
        extra = self.rng.randint(0, max(0, (len(self.voter_ids) - 1) // 2 - 1))
        self.cut.clear()
        self._ev_partition(frozenset([leaders[0], *self.rng.sample(others, min(extra, len(others)))]))

    def _ev_voter_change(self) -> None:
        leaders = [n for n in self.nodes.values() if n.alive and n.core.role is Role.LEADER]
        if not leaders:
            return
        node = leaders[0]
        current = node.core.voters.ids
        candidates = [i for i in self.all_ids if i not in current]
        if candidates and (len(current) < 3 or self.rng.random() < 0.5):
            nid = self.rng.choice(candidates)
            body = {"cluster_id": "sim-cluster", "timeout_ms": 5000, "voter_id": nid, "voter_directory_id": None,
                    "listeners": [{"name": "CONTROLLER", "host": "127.0.0.1", "port": 9000 + nid}]}
            api = ADD_RAFT_VOTER
        elif len(current) > 1:
            nid = self.rng.choice(sorted(current))
            body = {"cluster_id": "sim-cluster", "voter_id": nid, "voter_directory_id": None}
            api = REMOVE_RAFT_VOTER
        else:
            return
        self._log(f"voter change {api} {nid}")
        self._apply(node, node.core.handle_request((-1, 0, 0), -1, api, 0, body, self.now))
        self._schedule_tick(node)

    # --- a run --------------------------------------------------------------------------------

    def schedule_faults(self, duration_ms: int) -> None:
        """Random appends throughout, and the seed's faults within [0, duration_ms)."""
        f, rng = self.faults, self.rng
        t = 0
        while t < duration_ms:
            t += rng.randint(20, 200)
            self._at(t, "append")
        if f.partitions:
            for _ in range(rng.randint(1, 3)):
                start = rng.randrange(duration_ms)
                size = rng.randint(1, max(1, len(self.all_ids) // 2))
                group = frozenset(rng.sample(self.all_ids, size))
                self._at(start, "partition", group)
                self._at(min(duration_ms, start + rng.randint(500, 4000)), "heal")
        if f.leader_churn:
            t = 0
            while t < duration_ms:
                t += rng.randint(200, 1500)
                kind = rng.choice(["isolate_leader", "isolate_leader", "crash", "heal"])
                if kind == "crash":
                    self._at(t, "crash", 0)  # the leader, restarted later
                else:
                    self._at(t, kind)
        if f.crashes:
            for _ in range(rng.randint(1, 3)):
                nid = rng.choice(self.all_ids)
                start = rng.randrange(duration_ms)
                self._at(start, "crash", nid)
                self._at(min(duration_ms, start + rng.randint(50, 3000)), "restart", nid)
            for _ in range(rng.randint(0, 4)):
                self._at(rng.randrange(duration_ms), "crash", 0)
            if rng.random() < 0.5:
                self._at(rng.randrange(duration_ms), "shutdown")
        if f.voter_changes:
            for _ in range(rng.randint(1, 4)):
                self._at(rng.randrange(duration_ms), "voter_change")

    def heal(self) -> None:
        self.faults = Faults(max_delay_ms=self.faults.max_delay_ms)
        self.cut.clear()
        for nid, node in self.nodes.items():
            if not node.alive:
                self._ev_restart(nid)
        self.events = [e for e in self.events if e[2] not in ("append", "crash", "restart", "partition",
                                                               "voter_change", "shutdown", "isolate_leader")]
        heapq.heapify(self.events)

    def check_liveness(self, bound_ms: int) -> int:
        """After `heal`: a leader is elected and a record appended to it commits on every node
        within `bound_ms`. Returns the virtual time it took."""
        start = self.now
        deadline = start + bound_ms
        probes: dict[int, tuple[int, bytes]] = {}  # epoch -> (offset, value) appended then

        def committed_everywhere() -> bool:
            top = max(self.committed, default=-1)
            for offset, value in probes.values():
                if self.committed.get(offset) == value and all(
                        n.core.high_watermark > top for n in self._members()):
                    return True
            leaders = [n for n in self.nodes.values() if n.core.role is Role.LEADER]
            if len(leaders) == 1 and leaders[0].core.epoch not in probes:
                node = leaders[0]
                value = b"probe-%d-%d" % (self.seed, node.core.epoch)
                last, effects = node.core.append([value], self.now)
                probes[node.core.epoch] = (last, value)
                self._apply(node, effects)
                self._schedule_tick(node)
            return False

        while self.now < deadline and not committed_everywhere() and self.events:
            self.step()
        if not committed_everywhere():
            states = {n.node_id: (n.core.role.value, n.core.epoch, n.core.high_watermark, n.core.log.end_offset,
                                  sorted(n.core.voters.ids))
                      for n in self.nodes.values()}
            self._fail(f"no leader committed a record on every node within {bound_ms} ms of healing: {states}")
        self._check_prefixes()
        return self.now - start

    def _members(self) -> list[Node]:
        """The nodes liveness is owed to: all but a removed voter that never heard of its removal
        and sits in a later epoch than the leader's (the Raft thesis' disruptive server). KIP-996
        keeps it from deposing a live leader, and it cannot come back without doing so."""
        leaders = [n.core for n in self.nodes.values() if n.core.role is Role.LEADER]
        if len(leaders) != 1:
            return list(self.nodes.values())
        leader = leaders[0]
        return [n for n in self.nodes.values()
                if n.node_id in leader.voters.ids or n.core.epoch <= leader.epoch or n.core.role is Role.FOLLOWER]

    def _check_prefixes(self) -> None:
        """Every node's applied state equals the cluster's committed entries below its high
        watermark, and nothing committed is missing from the final leader's log or snapshot."""
        for node in self.nodes.values():
            hw = node.core.high_watermark
            for off, value in self.committed.items():
                if off < hw and node.applied.get(off) != value:
                    self._fail(f"node {node.node_id} has {node.applied.get(off)!r} at {off}, committed {value!r}")
        top = max(self.committed, default=-1)
        for node in self._members():
            if node.core.high_watermark <= top:
                self._fail(f"node {node.node_id} high watermark {node.core.high_watermark} is behind the "
                           f"committed offset {top}")


def run_seed(seed: int, *, trace: bool = False) -> Simulation:
    """One seed's schedule: cluster shape, faults, a fault phase, healing, liveness."""
    rng = random.Random(seed * 7919 + 1)
    shape = rng.random()
    voters = 1 if shape < 0.05 else 5 if shape > 0.8 else 3
    dynamic = rng.random() < 0.25
    observers = 1 if (dynamic or rng.random() < 0.2) else 0
    faults = Faults(
        drop=rng.choice([0.0, 0.0, 0.05, 0.2]),
        duplicate=rng.choice([0.0, 0.05, 0.2]),
        max_delay_ms=rng.choice([2, 20, 150]),
        partitions=rng.random() < 0.6,
        crashes=rng.random() < 0.6,
        voter_changes=dynamic,
        leader_churn=rng.random() < 0.5,
    )
    sim = Simulation(seed, voters=voters, observers=observers, faults=faults, dynamic=dynamic,
                     snapshot_bytes=rng.choice([1024, 4096, 1 << 20]),
                     fetch_max_bytes=rng.choice([100, 400, 8 << 20]), flush_delay_ms=rng.choice([3, 30]),
                     timeout_scale=rng.choice([1.0, 0.25]), trace=trace)
    duration = rng.choice([3000, 6000])
    sim.schedule_faults(duration)
    sim.run_until(duration)
    sim.heal()
    sim.check_liveness(30_000)
    return sim


if __name__ == "__main__":
    import sys

    seed = int(sys.argv[1])
    try:
        sim = run_seed(seed, trace=True)
        print("\n".join(sim.log_lines))
        print(f"seed {seed}: ok, {len(sim.committed)} offsets committed, {len(sim.leaders)} epochs with a leader")
    except InvariantViolation as e:
        print(e)
        sys.exit(1)
