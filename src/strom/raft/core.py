"""RaftCore: Kafka's Raft (KIP-595, KIP-996, KIP-630, KIP-853) as a sans-I/O state machine.

Inputs: `handle_request`, `handle_response`, `request_failed`, `on_flushed`, `tick`, and on a
leader `append`, `create_snapshot`, `resign`. Each returns the effects (strom.raft.effects) the
driver carries out in order. Messages are the codec's field dicts (`strom.protocol.messages`
names); the core never touches sockets, files, clocks or threads, so a simulation can run it
under a virtual clock and a seeded random source.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from typing import Any

from strom.protocol.errors import ErrorCode
from strom.protocol.raft_records import (
    KRAFT_VERSION,
    KRAFT_VOTERS,
    LEADER_CHANGE,
    Endpoint,
    VoterEntry,
    control_batch,
    control_records,
    data_batch,
    decode_voters,
    leader_change_value,
    voters_value,
)
from strom.raft.config import METADATA_TOPIC, METADATA_TOPIC_ID_INT, QuorumConfig
from strom.raft.effects import (
    AppendLog,
    Committed,
    DeleteLogPrefix,
    Effect,
    FlushLog,
    LeaderChanged,
    LoadSnapshot,
    PersistElectionState,
    Respond,
    Send,
    SnapshotDue,
    TruncateLog,
    WriteSnapshot,
)
from strom.raft.log import LogBatch, OffsetAndEpoch, RaftLog, split_batches
from strom.raft.snapshots import build_snapshot, read_snapshot
from strom.raft.state import NO_ID, ElectionState, Role
from strom.raft.voters import VoterSet, VoterSetHistory

VOTE, BEGIN_QUORUM_EPOCH, END_QUORUM_EPOCH, DESCRIBE_QUORUM = 52, 53, 54, 55
FETCH, FETCH_SNAPSHOT = 1, 59
ADD_RAFT_VOTER, REMOVE_RAFT_VOTER, UPDATE_RAFT_VOTER = 80, 81, 82
API_VERSIONS = 18
# The versions a Kafka 4.0/4.1 controller sends.
VERSIONS = {VOTE: 2, BEGIN_QUORUM_EPOCH: 1, END_QUORUM_EPOCH: 1, FETCH: 17, FETCH_SNAPSHOT: 1, API_VERSIONS: 3}
METADATA_TOPIC_ID = uuid.UUID(int=METADATA_TOPIC_ID_INT)

FENCED_LEADER_EPOCH = 74
UNKNOWN_LEADER_EPOCH = 75
INCONSISTENT_VOTER_SET = 94
SNAPSHOT_NOT_FOUND = 98
POSITION_OUT_OF_RANGE = 99
INCONSISTENT_CLUSTER_ID = 104
DUPLICATE_VOTER = 126
VOTER_NOT_FOUND = 127
INVALID_REQUEST = 42
MAX_EPOCH = (1 << 31) - 1  # an int32 on the wire: no election goes past it
# A leader forgets an observer it has not heard from in five minutes (as Kafka's does), and
# tracks at most MAX_OBSERVERS: a client naming a new replica id in each Fetch costs no more.
OBSERVER_EXPIRY_MS = 300_000
MAX_OBSERVERS = 10_000
UNSUPPORTED_VERSION = 35


@dataclass(frozen=True, slots=True)
class SnapshotPlan:
    snapshot_id: OffsetAndEpoch
    kraft_version: int
    voters: list[VoterEntry]

    def build(self, values: list[bytes], timestamp: int) -> bytes:
        return build_snapshot(self.snapshot_id, values, kraft_version=self.kraft_version, voters=self.voters,
                              last_contained_timestamp=timestamp)


class NotLeader(Exception):
    """append/create_snapshot on a node that is not the leader (or not in a state to)."""


class SafetyViolation(AssertionError):
    """The core was asked to do something Raft forbids (e.g. truncate committed entries)."""


@dataclass(slots=True)
class ReplicaState:
    end_offset: int = -1  # the offset the replica asked to fetch from: it holds all before it
    last_fetch_ms: int = -1
    last_caught_up_ms: int = -1
    begin_acked: bool = False
    directory_id: uuid.UUID | None = None
    known_high_watermark: int = -1  # the high watermark the last answer to its Fetch carried


@dataclass(slots=True)
class _InFlight:
    dest: int
    api_key: int
    deadline: int
    context: Any = None


@dataclass(slots=True)
class _ParkedFetch:
    ref: Any
    version: int
    body: dict
    replica_id: int
    deadline: int


@dataclass(slots=True)
class _PendingVoterChange:
    ref: Any
    api_key: int
    offset: int  # the VotersRecord's offset: answered once the high watermark passes it
    deadline: int
    removed: int = NO_ID


@dataclass(slots=True)
class _AddVoterProbe:
    """An AddRaftVoter waiting for the new voter's ApiVersions answer (KIP-853)."""

    ref: Any
    version: int
    entry: VoterEntry
    timeout_ms: int
    request_id: int


@dataclass(slots=True)
class _SnapshotFetch:
    snapshot_id: OffsetAndEpoch
    data: bytearray = field(default_factory=bytearray)


class RaftCore:
    def __init__(self, config: QuorumConfig, *, rng: random.Random, election: ElectionState | None = None,
                 log_batches: list[LogBatch] | None = None,
                 snapshot: tuple[OffsetAndEpoch, bytes] | None = None,
                 directory_id: uuid.UUID | None = None) -> None:
        self.config = config
        self.node_id = config.node_id
        self.directory_id = directory_id
        self.rng = rng
        self.election = election or ElectionState()
        self.snapshot_data: bytes | None = None
        self.kraft_version = 0
        self.history = VoterSetHistory(VoterSet(tuple(config.voters)))
        self.log = RaftLog(snapshot[0] if snapshot else None)
        if snapshot:
            self._adopt_snapshot(snapshot[0], snapshot[1])
        for batch in log_batches or ():
            if batch.end_offset <= self.log.start_offset:
                continue
            self.log.append(batch)
            self._scan_control(batch)
        self.log.flushed_offset = self.log.end_offset  # what a restart reads back is on disk
        self.high_watermark = self.log.start_offset
        self.role = Role.UNATTACHED
        self.leader_resigned = False
        self.fetched_from_leader = False
        self.granted: set[int] = set()
        self.rejected: set[int] = set()
        self.replicas: dict[int, ReplicaState] = {}
        self.observers: dict[int, ReplicaState] = {}
        self.epoch_start_offset = -1
        self.parked: list[_ParkedFetch] = []
        self.pending_change: _PendingVoterChange | None = None
        self.add_probe: _AddVoterProbe | None = None
        self.inflight: dict[int, _InFlight] = {}
        self._next_request_id = 1
        self.retry_at: dict[tuple[int, int], int] = {}
        self.election_deadline = 0
        self.fetch_deadline = 0
        self.backoff_until = -1
        self.next_fetch_at = 0
        self.fetch_request: int | None = None
        self.flush_wait: int | None = None  # follower: fetch again once flushed to here
        self.flush_generation = 0
        self.snapshot_fetch: _SnapshotFetch | None = None
        self.snapshot_due_sent = False
        self.last_snapshot_ms = 0
        self.bootstrap_index = 0
        # Where nodes listen as answers told (KIP-853's NodeEndpoints), by node id: how an
        # observer that knows no voter set yet passes its leader's address on, as Kafka's
        # FollowerState keeps the leader's endpoints.
        self.heard_endpoints: dict[int, dict] = {}
        self.now = 0
        # The wall clock minus `now`, as the driver measures it: timers run on `now` (monotonic),
        # batches are stamped with wall-clock ms, as Kafka stamps them.
        self.wall_clock_offset_ms = 0

    # --- properties ---------------------------------------------------------------------------

    def timestamp(self) -> int:
        """What a batch appended now is stamped with: wall-clock ms."""
        return self.now + self.wall_clock_offset_ms

    @property
    def epoch(self) -> int:
        return self.election.epoch

    @property
    def leader_id(self) -> int:
        """The leader this node follows or is; -1 once it stopped believing in one (resigned,
        or standing for election), so that its answers do not send others back to it."""
        return self.election.leader_id if self.role in (Role.LEADER, Role.FOLLOWER) else NO_ID

    @property
    def voters(self) -> VoterSet:
        return self.history.latest()

    @property
    def is_voter(self) -> bool:
        return self.node_id in self.voters

    @property
    def may_campaign(self) -> bool:
        """A voter stands for election; so does a node that an uncommitted VotersRecord removes
        (Raft thesis 4.2.2): the old set may still need it, or no one could commit the change."""
        if self.epoch >= MAX_EPOCH and (self.election.leader_id != NO_ID
                                        or self.election.voted_id not in (NO_ID, self.node_id)):
            # No epoch after the largest (int32 on the wire): a node stands in it, once no
            # leader is known there and it has not voted for another, so that one vote per
            # epoch still allows one leader in it. Kafka's epoch + 1 wraps to a fenced negative.
            return False
        if self.is_voter:
            return True
        latest = self.history.latest_offset()
        return latest >= self.high_watermark and self.node_id in self._voters_at(latest)

    # --- start ----------------------------------------------------------------------------------

    def start(self, now: int) -> list[Effect]:
        """The effects of coming up: the snapshot to load, then the role the stored election
        state implies (a leader that restarts resigns: it cannot know what it had sent)."""
        self.now = now
        self.last_snapshot_ms = now
        out: list[Effect] = []
        if self.snapshot_data is not None and self.log.snapshot_id is not None:
            out.append(LoadSnapshot(self.log.snapshot_id, self.snapshot_data))
        e = self.election
        if e.leader_id == self.node_id:
            self._set_resigned(out)
        elif e.leader_id != NO_ID:
            self._become_follower(e.epoch, e.leader_id, out, persist=False)
        else:
            self.role = Role.UNATTACHED
            self._reset_election_timer()
            out.append(LeaderChanged(NO_ID, e.epoch))
        if self.voters.ids == {self.node_id} and self.role is not Role.FOLLOWER:
            self._become_prospective(out)
        return out

    # --- inputs ---------------------------------------------------------------------------------

    def tick(self, now: int) -> list[Effect]:
        self.now = now
        out: list[Effect] = []
        for rid in [r for r, f in self.inflight.items() if f.deadline <= now]:
            self._fail(rid, out)
        role = self.role
        if role is Role.LEADER:
            self._leader_tick(out)
        elif role is Role.FOLLOWER:
            if now >= self.fetch_deadline:
                if self.may_campaign:
                    self._become_prospective(out)
                else:
                    self._become_unattached(self.epoch, out, persist=False)
        elif role in (Role.PROSPECTIVE, Role.CANDIDATE):
            if self.backoff_until >= 0:
                if now >= self.backoff_until:
                    self.backoff_until = -1
                    self._become_prospective(out)
            elif now >= self.election_deadline:
                self._become_prospective(out)
            else:
                self._retry_votes(out)
        elif role in (Role.UNATTACHED, Role.RESIGNED):
            if self.may_campaign and now >= self.election_deadline:
                self._become_prospective(out)
        self._maybe_fetch(out)
        self._maybe_snapshot_due(out)
        return out

    def next_deadline(self) -> int:
        """The virtual time at which `tick` has something to do."""
        times = [f.deadline for f in self.inflight.values()]
        role = self.role
        if role is Role.LEADER:
            times += [p.deadline for p in self.parked]
            times.append(self.now + self.config.retry_backoff_ms * 5)
            if self.pending_change is not None:
                times.append(self.pending_change.deadline)
        elif role is Role.FOLLOWER:
            times.append(self.fetch_deadline)
        elif role in (Role.PROSPECTIVE, Role.CANDIDATE):
            times.append(self.backoff_until if self.backoff_until >= 0 else self.election_deadline)
            times += [t for t in self.retry_at.values()]
        elif self.may_campaign:
            times.append(self.election_deadline)
        if self._wants_fetch():
            times.append(self.next_fetch_at)
        later = [t for t in times if t is not None]
        return max(self.now + 1, min(later)) if later else self.now + self.config.fetch_timeout_ms

    def handle_request(self, ref: Any, src: int, api_key: int, version: int, body: dict,
                       now: int) -> list[Effect]:
        """A request from node `src` (-1 when unknown); answered with Respond(ref, ...) now or
        later (a fetch long-poll, a voter change waiting to commit)."""
        self.now = now
        out: list[Effect] = []
        cluster = body.get("cluster_id")
        if cluster is not None and self.config.cluster_id is not None and cluster != self.config.cluster_id:
            out.append(Respond(ref, api_key, version, _top_error(api_key, INCONSISTENT_CLUSTER_ID)))
            return out
        handler = {
            VOTE: self._on_vote_request,
            BEGIN_QUORUM_EPOCH: self._on_begin_request,
            END_QUORUM_EPOCH: self._on_end_request,
            FETCH: self._on_fetch_request,
            FETCH_SNAPSHOT: self._on_fetch_snapshot_request,
            DESCRIBE_QUORUM: self._on_describe_quorum,
            ADD_RAFT_VOTER: self._on_add_voter,
            REMOVE_RAFT_VOTER: self._on_remove_voter,
            UPDATE_RAFT_VOTER: self._on_update_voter,
        }.get(api_key)
        if handler is None:
            raise ValueError(f"api key {api_key} is not a Raft request")
        handler(ref, version, body, out)
        self._maybe_fetch(out)
        return out

    def handle_response(self, request_id: int, body: dict, now: int) -> list[Effect]:
        """The answer to the Send with `request_id`; late or repeated answers are ignored."""
        self.now = now
        out: list[Effect] = []
        sent = self.inflight.pop(request_id, None)
        if sent is None:
            return out
        self.retry_at.pop((sent.dest, sent.api_key), None)
        for e in body.get("node_endpoints") or ():
            self.heard_endpoints[e["node_id"]] = {"node_id": e["node_id"], "host": e["host"], "port": e["port"]}
        if body.get("error_code", 0) == INCONSISTENT_CLUSTER_ID:
            self._fail_sent(request_id, sent, out)
            return out
        handler = {
            VOTE: self._on_vote_response,
            BEGIN_QUORUM_EPOCH: self._on_begin_response,
            END_QUORUM_EPOCH: self._on_end_response,
            FETCH: self._on_fetch_response,
            FETCH_SNAPSHOT: self._on_fetch_snapshot_response,
            API_VERSIONS: self._on_api_versions_response,
        }[sent.api_key]
        handler(request_id, sent, body, out)
        self._maybe_fetch(out)
        return out

    def request_failed(self, request_id: int, now: int, unreachable: bool = False) -> list[Effect]:
        """No answer will come (timeout; `unreachable`: the peer refused or closed the
        connection, i.e. no process listens there any more)."""
        self.now = now
        out: list[Effect] = []
        sent = self.inflight.get(request_id)
        if (unreachable and sent is not None and sent.api_key == FETCH and self.role is Role.FOLLOWER
                and sent.dest == self.leader_id and not self.leader_resigned):
            # The leader's process is gone (a crash): do not wait out the fetch timeout. Each
            # follower stands for election after a random part of the election timeout, so they
            # do not collide; pre-vote keeps a leader that others still reach where it is.
            self.leader_resigned = True
            wait = self.rng.randrange(max(1, self.config.election_timeout_ms // 2))
            self.fetch_deadline = min(self.fetch_deadline, now + wait)
        self._fail(request_id, out)
        self._maybe_fetch(out)
        return out

    def on_flushed(self, end_offset: int, generation: int, now: int) -> list[Effect]:
        """A FlushLog finished: everything below `end_offset` is on disk."""
        self.now = now
        out: list[Effect] = []
        if generation != self.flush_generation:
            return out  # the log was truncated since: this flush says nothing of what is there now
        if end_offset > self.log.flushed_offset:
            self.log.flushed_offset = min(end_offset, self.log.end_offset)
        if self.role is Role.LEADER:
            self._update_high_watermark(out)
        if self.flush_wait is not None and self.log.flushed_offset >= self.flush_wait:
            self.flush_wait = None
        self._maybe_fetch(out)
        return out

    def append(self, values: list[bytes], now: int) -> tuple[int, list[Effect]]:
        """Leader only: append `values` as one batch; returns its last offset and the effects."""
        self.now = now
        if self.role is not Role.LEADER:
            raise NotLeader(f"node {self.node_id} is {self.role.value} in epoch {self.epoch}")
        if not values:
            raise ValueError("nothing to append")
        out: list[Effect] = []
        batch = data_batch(values, self.log.end_offset, self.epoch, self.timestamp())
        last = self._append_local(split_batches(batch)[0], out)
        out.append(FlushLog(self.log.end_offset, self.flush_generation))
        self._complete_parked(out)
        return last, out

    def resign(self, now: int) -> list[Effect]:
        """Graceful shutdown of a leader: EndQuorumEpoch to the voters, best successors first."""
        self.now = now
        out: list[Effect] = []
        if self.role is Role.LEADER:
            self._resign(out)
        return out

    def create_snapshot(self, end_offset: int, values: list[bytes], now: int) -> list[Effect]:
        """Snapshot the state machine's state as of `end_offset` (committed, a batch boundary):
        write it, then drop the log before it."""
        plan = self.snapshot_plan(end_offset)
        return self.install_snapshot(plan.snapshot_id, plan.build(values, now), now)

    def snapshot_plan(self, end_offset: int) -> SnapshotPlan:
        """What a snapshot ending at `end_offset` is called and holds besides the state
        machine's records; a driver builds its bytes (`SnapshotPlan.build`, off its event loop)
        and hands them to `install_snapshot`. ValueError when there can be no such snapshot."""
        if end_offset > self.high_watermark:
            raise ValueError(f"snapshot at {end_offset} is past the high watermark {self.high_watermark}")
        current = self.log.snapshot_id.offset if self.log.snapshot_id else 0
        if end_offset <= current or not self.log.is_batch_boundary(end_offset):
            raise ValueError(f"snapshot at {end_offset} is not a batch boundary after {current}")
        return SnapshotPlan(OffsetAndEpoch(end_offset, self.log.epoch_of(end_offset)), self.kraft_version,
                            list(self._voters_at(end_offset).voters))

    def install_snapshot(self, snapshot_id: OffsetAndEpoch, data: bytes, now: int) -> list[Effect]:
        """Write a snapshot built from `snapshot_plan`, then drop the log before it; nothing when
        a newer snapshot came meanwhile (fetched from the leader)."""
        self.now = now
        out: list[Effect] = []
        current = self.log.snapshot_id.offset if self.log.snapshot_id else 0
        if snapshot_id.offset <= current:
            self.snapshot_due_sent = False
            return out
        out.append(WriteSnapshot(snapshot_id, data))
        self.snapshot_data = data
        self.log.delete_before_snapshot(snapshot_id)
        out.append(DeleteLogPrefix(snapshot_id.offset))
        self.snapshot_due_sent = False
        self.last_snapshot_ms = now
        return out

    def snapshot_failed(self) -> None:
        """The state machine could not snapshot now: SnapshotDue comes again."""
        self.snapshot_due_sent = False

    # --- state transitions ----------------------------------------------------------------------

    def _persist(self, state: ElectionState, out: list[Effect]) -> None:
        self.election = state
        out.append(PersistElectionState(state, state.to_json(self.kraft_version, sorted(self.voters.ids))))

    def _reset_election_timer(self) -> None:
        t = self.config.election_timeout_ms
        self.election_deadline = self.now + t + self.rng.randrange(t)

    def _leave_leadership(self, out: list[Effect]) -> None:
        for p in self.parked:
            out.append(Respond(p.ref, FETCH, p.version, self._fetch_response(ErrorCode.NOT_LEADER_OR_FOLLOWER)))
        self.parked.clear()
        if self.pending_change is not None:
            out.append(Respond(self.pending_change.ref, self.pending_change.api_key, 0,
                               _voter_change_response(ErrorCode.NOT_LEADER_OR_FOLLOWER, "leader changed")))
            self.pending_change = None
        if self.add_probe is not None:
            self._answer_probe(ErrorCode.NOT_LEADER_OR_FOLLOWER, "leader changed", out)

    def _common_transition(self, out: list[Effect]) -> None:
        if self.role is Role.LEADER:
            self._leave_leadership(out)
        self.granted.clear()
        self.rejected.clear()
        self.backoff_until = -1
        self.leader_resigned = False
        self.fetched_from_leader = False
        self.snapshot_fetch = None
        self.fetch_request = None
        self.retry_at.clear()
        for rid in [r for r, f in self.inflight.items() if f.api_key in (VOTE, FETCH, FETCH_SNAPSHOT)]:
            del self.inflight[rid]

    def _become_unattached(self, epoch: int, out: list[Effect], *, voted: int = NO_ID,
                           persist: bool = True) -> None:
        self._common_transition(out)
        self.role = Role.UNATTACHED
        if persist:
            self._persist(ElectionState(epoch, NO_ID, voted), out)
        self._reset_election_timer()
        self.next_fetch_at = self.now
        out.append(LeaderChanged(NO_ID, epoch))

    def _become_follower(self, epoch: int, leader: int, out: list[Effect], *, persist: bool = True) -> None:
        voted = self.election.voted_id if epoch == self.epoch else NO_ID
        self._common_transition(out)
        self.role = Role.FOLLOWER
        if persist:
            self._persist(ElectionState(epoch, leader, voted), out)
        self.fetch_deadline = self.now + self.config.fetch_timeout_ms
        self.next_fetch_at = self.now
        out.append(LeaderChanged(leader, epoch))

    def _become_prospective(self, out: list[Effect]) -> None:
        """KIP-996: ask the voters whether they would vote, without bumping the epoch, so a
        node that was cut off cannot disturb a healthy leader when it comes back."""
        if not self.may_campaign:
            return
        self._common_transition(out)
        self.role = Role.PROSPECTIVE
        self.granted = {self.node_id}
        self._reset_election_timer()
        if len(self.granted & self.voters.ids) >= self.voters.majority():
            self._become_candidate(out)
            return
        for v in self.voters.ids - {self.node_id}:
            self._send_vote(v, True, out)

    def _become_candidate(self, out: list[Effect]) -> None:
        self._common_transition(out)
        self.role = Role.CANDIDATE
        epoch = min(self.epoch + 1, MAX_EPOCH)  # may_campaign allows the largest only unvoted
        self._persist(ElectionState(epoch, NO_ID, self.node_id, self.directory_id), out)
        out.append(LeaderChanged(NO_ID, self.epoch))
        self.granted = {self.node_id}
        self._reset_election_timer()
        if len(self.granted & self.voters.ids) >= self.voters.majority():
            self._become_leader(out)
            return
        for v in self.voters.ids - {self.node_id}:
            self._send_vote(v, False, out)

    def _become_leader(self, out: list[Effect]) -> None:
        granting = sorted(self.granted)
        self._common_transition(out)
        self.role = Role.LEADER
        self._persist(ElectionState(self.epoch, self.node_id, self.node_id, self.directory_id), out)
        self.replicas = {v: ReplicaState(last_fetch_ms=self.now) for v in self.voters.ids if v != self.node_id}
        self.observers = {}
        self.epoch_start_offset = self.log.end_offset
        value = leader_change_value(self.node_id, sorted(self.voters.ids), granting)
        batch = control_batch([(LEADER_CHANGE, value)], self.log.end_offset, self.epoch, self.timestamp())
        self._append_local(split_batches(batch)[0], out)
        out.append(FlushLog(self.log.end_offset, self.flush_generation))
        out.append(LeaderChanged(self.node_id, self.epoch))
        for v in self.replicas:
            self._send_begin(v, out)

    def _set_resigned(self, out: list[Effect]) -> None:
        self._common_transition(out)
        self.role = Role.RESIGNED
        self._reset_election_timer()
        out.append(LeaderChanged(NO_ID, self.epoch))

    def _resign(self, out: list[Effect]) -> None:
        successors = sorted((v for v in self.replicas if v in self.voters),
                            key=lambda v: (-self.replicas[v].end_offset, v))
        self._set_resigned(out)
        body = {"cluster_id": self.config.cluster_id,
                "topics": [{"topic_name": METADATA_TOPIC, "partitions": [{
                    "partition_index": 0, "leader_id": self.node_id, "leader_epoch": self.epoch,
                    "preferred_candidates": [{"candidate_id": v, "candidate_directory_id": None}
                                             for v in successors]}]}],
                "leader_endpoints": self._leader_endpoints()}
        for v in successors:
            self._send(v, END_QUORUM_EPOCH, body, out)

    def _observe_epoch(self, epoch: int, leader: int, out: list[Effect]) -> bool:
        """A message told of `epoch` (and its leader, if known). Move to it if it is newer, or
        learn the leader of the current epoch. True when this node changed state."""
        if epoch > self.epoch:
            if leader != NO_ID and leader != self.node_id:
                self._become_follower(epoch, leader, out)
            else:
                self._become_unattached(epoch, out)
            return True
        if (epoch == self.epoch and leader not in (NO_ID, self.node_id)
                and self.role in (Role.UNATTACHED, Role.PROSPECTIVE, Role.CANDIDATE)):
            self._become_follower(epoch, leader, out)
            return True
        return False

    def _node_endpoints(self, rack: bool = False) -> list[dict]:
        """Where the leader this node knows of listens (KIP-853's NodeEndpoints), so a node
        that knows no voter set yet (an observer, a controller about to be added) can reach it."""
        leader = self.voters.get(self.leader_id) if self.leader_id != NO_ID else None
        if leader is not None and leader.endpoints:
            e = leader.endpoints[0]
            out = {"node_id": leader.voter_id, "host": e.host, "port": e.port}
        elif self.leader_id in self.heard_endpoints:
            out = dict(self.heard_endpoints[self.leader_id])
        else:
            return []
        if rack:
            out["rack"] = None
        return [out]

    def _leader_endpoints(self) -> list[dict]:
        me = self.voters.get(self.node_id)
        return [{"name": e.name, "host": e.host, "port": e.port} for e in me.endpoints] if me else []

    # --- sending --------------------------------------------------------------------------------

    def _send(self, dest: int, api_key: int, body: dict, out: list[Effect], context: Any = None,
              address: tuple[str, int] | None = None) -> int:
        rid = self._next_request_id
        self._next_request_id += 1
        self.inflight[rid] = _InFlight(dest, api_key, self.now + self.config.request_timeout_ms, context)
        out.append(Send(dest, api_key, VERSIONS[api_key], body, rid, address))
        return rid

    def _has_inflight(self, dest: int, api_key: int) -> bool:
        return any(f.dest == dest and f.api_key == api_key for f in self.inflight.values())

    def _send_vote(self, dest: int, pre_vote: bool, out: list[Effect]) -> None:
        last = self.log.last_offset_and_epoch()
        body = {"cluster_id": self.config.cluster_id, "voter_id": dest,
                "topics": [{"topic_name": METADATA_TOPIC, "partitions": [{
                    "partition_index": 0, "replica_epoch": self.epoch, "replica_id": self.node_id,
                    "replica_directory_id": self.directory_id, "voter_directory_id": None,
                    "last_offset_epoch": last.epoch, "last_offset": last.offset, "pre_vote": pre_vote}]}]}
        self._send(dest, VOTE, body, out, context=(self.role, self.epoch))

    def _send_begin(self, dest: int, out: list[Effect]) -> None:
        body = {"cluster_id": self.config.cluster_id, "voter_id": dest,
                "topics": [{"topic_name": METADATA_TOPIC, "partitions": [{
                    "partition_index": 0, "voter_directory_id": None, "leader_id": self.node_id,
                    "leader_epoch": self.epoch}]}],
                "leader_endpoints": self._leader_endpoints()}
        self._send(dest, BEGIN_QUORUM_EPOCH, body, out)

    def _retry_votes(self, out: list[Effect]) -> None:
        pre = self.role is Role.PROSPECTIVE
        for v in self.voters.ids - self.granted - self.rejected - {self.node_id}:
            if not self._has_inflight(v, VOTE) and self.now >= self.retry_at.get((v, VOTE), 0):
                self._send_vote(v, pre, out)

    def _fail(self, request_id: int, out: list[Effect]) -> None:
        sent = self.inflight.pop(request_id, None)
        if sent is not None:
            self._fail_sent(request_id, sent, out)

    def _fail_sent(self, request_id: int, sent: _InFlight, out: list[Effect]) -> None:
        if self.add_probe is not None and request_id == self.add_probe.request_id:
            self._answer_probe(ErrorCode.REQUEST_TIMED_OUT,
                               f"new voter {self.add_probe.entry.voter_id} is not ready to receive requests", out)
            return
        self.retry_at[(sent.dest, sent.api_key)] = self.now + self.config.retry_backoff_ms
        if sent.api_key in (FETCH, FETCH_SNAPSHOT):
            if request_id == self.fetch_request:
                self.fetch_request = None
            self.next_fetch_at = self.now + self.config.retry_backoff_ms
            if self.role is Role.UNATTACHED:
                self.bootstrap_index += 1

    # --- Vote -----------------------------------------------------------------------------------

    def _on_vote_request(self, ref: Any, version: int, body: dict, out: list[Effect]) -> None:
        p = _partition(body)
        if p is None:
            out.append(Respond(ref, VOTE, version, _top_error(VOTE, INVALID_REQUEST)))
            return
        candidate, epoch = p["replica_id"], p["replica_epoch"]
        pre_vote = bool(p.get("pre_vote")) and version >= 2
        if epoch < self.epoch:
            out.append(Respond(ref, VOTE, version, self._vote_response(False)))
            return
        if self._not_a_peer(candidate):
            out.append(Respond(ref, VOTE, version, self._vote_response(False, INCONSISTENT_VOTER_SET)))
            return
        if (self._hears_leader() and candidate != self.leader_id) or (not pre_vote and epoch > self.epoch + 1):
            # KIP-996: while a leader is alive no candidate is needed, whatever its epoch. And a
            # real candidate stands in the epoch after its own, which its pre-vote round has
            # made at least ours (a voter behind it learns the epoch from the answers to its own
            # pre-vote): a larger jump is forged, and taking it could spend every epoch at once.
            out.append(Respond(ref, VOTE, version, self._vote_response(False)))
            return
        if epoch > self.epoch and not pre_vote:
            self._become_unattached(epoch, out)
        up_to_date = (p["last_offset_epoch"], p["last_offset"]) >= (self.log.last_epoch, self.log.end_offset)
        # Like Kafka (KIP-853), a replica votes even when its own copy of the voter set does not
        # name it or the candidate: that copy may be stale; the candidate counts against its own.
        grant = up_to_date and candidate != self.node_id
        if pre_vote:
            out.append(Respond(ref, VOTE, version, self._vote_response(grant)))
            return
        # One vote per epoch, and none once the epoch has a leader.
        e = self.election
        if e.leader_id != NO_ID or e.voted_id not in (NO_ID, candidate) or self.role in (Role.LEADER, Role.CANDIDATE):
            grant = False
        if grant:
            if e.voted_id == NO_ID:
                self._persist(ElectionState(self.epoch, NO_ID, candidate, p.get("replica_directory_id")), out)
            if self.role is not Role.UNATTACHED:
                self._become_unattached(self.epoch, out, persist=False)
            self._reset_election_timer()
        out.append(Respond(ref, VOTE, version, self._vote_response(grant)))

    def _hears_leader(self) -> bool:
        """Whether this node leads, or follows a leader it has fetched from since it began
        following and within the fetch timeout (Kafka's rule): two followers of a dead leader
        cannot keep sending each other back to it."""
        if self.role is Role.LEADER:
            return True  # check quorum deposes a leader the majority stopped fetching from
        return (self.role is Role.FOLLOWER and self.fetched_from_leader and not self.leader_resigned
                and self.now < self.fetch_deadline)

    def _vote_response(self, granted: bool, error: int = 0) -> dict:
        return {"error_code": 0, "topics": [{"topic_name": METADATA_TOPIC, "partitions": [{
            "partition_index": 0, "error_code": error, "leader_id": self.leader_id, "leader_epoch": self.epoch,
            "vote_granted": granted}]}], "node_endpoints": self._node_endpoints()}

    def _on_vote_response(self, rid: int, sent: _InFlight, body: dict, out: list[Effect]) -> None:
        p = _partition(body)
        if p is None or body.get("error_code") or p.get("error_code"):
            return
        # A voter that grants may still name the leader it follows (one it has not heard from):
        # only a refusal sends this node back to that leader.
        leader = NO_ID if p["vote_granted"] and p["leader_epoch"] == self.epoch else p["leader_id"]
        if self._observe_epoch(p["leader_epoch"], leader, out):
            return
        role, epoch = sent.context
        if role is not self.role or epoch != self.epoch or role not in (Role.PROSPECTIVE, Role.CANDIDATE):
            return  # an answer to an earlier round
        if p["vote_granted"]:
            self.granted.add(sent.dest)
        else:
            self.rejected.add(sent.dest)
        voters = self.voters
        granted = len(self.granted & voters.ids)
        if granted >= voters.majority():
            if role is Role.PROSPECTIVE:
                self._become_candidate(out)
            else:
                self._become_leader(out)
        elif len(voters.ids) - len(self.rejected & voters.ids) < voters.majority() and self.backoff_until < 0:
            # Lost this round: wait a random backoff so competing nodes do not collide again.
            self.backoff_until = self.now + self.rng.randrange(max(1, self.config.election_backoff_max_ms))

    # --- BeginQuorumEpoch / EndQuorumEpoch -------------------------------------------------------

    def _epoch_response(self, api_key: int, error: int) -> dict:
        return {"error_code": 0, "topics": [{"topic_name": METADATA_TOPIC, "partitions": [{
            "partition_index": 0, "error_code": error, "leader_id": self.leader_id,
            "leader_epoch": self.epoch}]}], "node_endpoints": self._node_endpoints()}

    def _not_a_peer(self, node: int) -> bool:
        """Whether an election message (Vote, BeginQuorumEpoch, EndQuorumEpoch) naming `node` as
        its sender cannot come from a peer. A static quorum (controller.quorum.voters) knows every
        voter for good, so another node or this one is refused before it moves the epoch, as
        Kafka 3 refused it; a dynamic quorum (KIP-853) hears from voters its copy may not know
        yet, and takes them as Kafka 4 does."""
        return bool(self.config.voters) and self.kraft_version == 0 and (
            node == self.node_id or node not in self.voters)

    def _on_begin_request(self, ref: Any, version: int, body: dict, out: list[Effect]) -> None:
        p = _partition(body)
        if p is None:
            out.append(Respond(ref, BEGIN_QUORUM_EPOCH, version, _top_error(BEGIN_QUORUM_EPOCH, INVALID_REQUEST)))
            return
        epoch, leader = p["leader_epoch"], p["leader_id"]
        if epoch < self.epoch:
            out.append(Respond(ref, BEGIN_QUORUM_EPOCH, version, self._epoch_response(BEGIN_QUORUM_EPOCH,
                                                                                     FENCED_LEADER_EPOCH)))
            return
        if self._not_a_peer(leader) or (epoch == self.epoch and self.election.leader_id not in (NO_ID, leader)):
            out.append(Respond(ref, BEGIN_QUORUM_EPOCH, version, self._epoch_response(BEGIN_QUORUM_EPOCH,
                                                                                     INCONSISTENT_VOTER_SET)))
            return
        if epoch > self.epoch and (epoch > self.epoch + 1 or self._hears_leader()):
            # A leader's epoch is taken one past this voter's at most, as far as an election it
            # could have voted in reaches (a vote it gave would have moved it there already); a
            # voter further behind learns the epoch from the answers to its own pre-vote or fetch,
            # and one that hears a live leader wants no other (KIP-996's rule for Vote). A forged
            # one at the largest epoch left voters following a leader that never was, for good.
            out.append(Respond(ref, BEGIN_QUORUM_EPOCH, version, self._epoch_response(BEGIN_QUORUM_EPOCH,
                                                                                     INVALID_REQUEST)))
            return
        if not (self.role is Role.FOLLOWER and epoch == self.epoch):
            self._become_follower(epoch, leader, out)
        out.append(Respond(ref, BEGIN_QUORUM_EPOCH, version, self._epoch_response(BEGIN_QUORUM_EPOCH, 0)))

    def _on_begin_response(self, rid: int, sent: _InFlight, body: dict, out: list[Effect]) -> None:
        p = _partition(body)
        if p is None:
            return
        if self._observe_epoch(p["leader_epoch"], p["leader_id"], out):
            return
        if self.role is Role.LEADER and p["error_code"] == 0 and sent.dest in self.replicas:
            self.replicas[sent.dest].begin_acked = True

    def _on_end_request(self, ref: Any, version: int, body: dict, out: list[Effect]) -> None:
        p = _partition(body)
        if p is None:
            out.append(Respond(ref, END_QUORUM_EPOCH, version, _top_error(END_QUORUM_EPOCH, INVALID_REQUEST)))
            return
        epoch, leader = p["leader_epoch"], p["leader_id"]
        if epoch < self.epoch:
            out.append(Respond(ref, END_QUORUM_EPOCH, version, self._epoch_response(END_QUORUM_EPOCH,
                                                                                   FENCED_LEADER_EPOCH)))
            return
        if self._not_a_peer(leader):
            out.append(Respond(ref, END_QUORUM_EPOCH, version, self._epoch_response(END_QUORUM_EPOCH,
                                                                                   INCONSISTENT_VOTER_SET)))
            return
        if epoch != self.epoch or self.role is not Role.FOLLOWER or leader != self.leader_id:
            # Only the leader this node follows ends its epoch: from anyone else, or for another
            # epoch, it is forged (a later epoch taken from it moved voters where no one led).
            out.append(Respond(ref, END_QUORUM_EPOCH, version, self._epoch_response(END_QUORUM_EPOCH,
                                                                                   INVALID_REQUEST)))
            return
        # The leader is going away: stand for election soon, sooner the higher it ranked us.
        self.leader_resigned = True
        candidates = [c["candidate_id"] for c in p.get("preferred_candidates") or []]
        candidates += list(p.get("preferred_successors") or [])
        if self.node_id in candidates:
            rank = candidates.index(self.node_id)
            wait = min(self.config.retry_backoff_ms << min(rank, 20), self.config.election_backoff_max_ms)
        else:
            wait = self.config.election_backoff_max_ms + self.rng.randrange(max(1, self.config.election_timeout_ms))
        self.fetch_deadline = min(self.fetch_deadline, self.now + wait)
        out.append(Respond(ref, END_QUORUM_EPOCH, version, self._epoch_response(END_QUORUM_EPOCH, 0)))

    def _on_end_response(self, rid: int, sent: _InFlight, body: dict, out: list[Effect]) -> None:
        p = _partition(body)
        if p is not None:
            self._observe_epoch(p["leader_epoch"], p["leader_id"], out)

    # --- Fetch: leader side ----------------------------------------------------------------------

    def _fetch_response(self, error: int, *, records: bytes = b"", diverging: OffsetAndEpoch | None = None,
                        snapshot_id: OffsetAndEpoch | None = None) -> dict:
        part = {"partition_index": 0, "error_code": error, "high_watermark": self.high_watermark,
                "last_stable_offset": self.high_watermark, "log_start_offset": self.log.start_offset,
                "diverging_epoch": None if diverging is None else {"epoch": diverging.epoch,
                                                                    "end_offset": diverging.offset},
                "current_leader": {"leader_id": self.leader_id, "leader_epoch": self.epoch},
                "snapshot_id": None if snapshot_id is None else {"end_offset": snapshot_id.offset,
                                                                  "epoch": snapshot_id.epoch},
                "aborted_transactions": None, "preferred_read_replica": -1, "records": records}
        return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0,
                "responses": [{"topic_id": METADATA_TOPIC_ID, "partitions": [part]}],
                "node_endpoints": self._node_endpoints(rack=True)}

    def _on_fetch_request(self, ref: Any, version: int, body: dict, out: list[Effect]) -> None:
        p = _partition(body)
        if p is None:
            out.append(Respond(ref, FETCH, version, self._fetch_response(INVALID_REQUEST)))
            return
        state = body.get("replica_state") or {}
        replica = state.get("replica_id", body.get("replica_id", -1))
        if replica is None:
            replica = -1
        epoch = p.get("current_leader_epoch", -1)
        if epoch > self.epoch:
            out.append(Respond(ref, FETCH, version, self._fetch_response(UNKNOWN_LEADER_EPOCH)))
            return
        if self.role is not Role.LEADER:
            out.append(Respond(ref, FETCH, version, self._fetch_response(ErrorCode.NOT_LEADER_OR_FOLLOWER)))
            return
        if epoch < self.epoch:
            out.append(Respond(ref, FETCH, version, self._fetch_response(FENCED_LEADER_EPOCH)))
            return
        fetch_offset, last_epoch = p["fetch_offset"], p.get("last_fetched_epoch", -1)
        verdict = self._validate_fetch(fetch_offset, last_epoch)
        if verdict is not None:
            kind, where = verdict
            resp = (self._fetch_response(0, snapshot_id=where) if kind == "snapshot"
                    else self._fetch_response(0, diverging=where))
            out.append(Respond(ref, FETCH, version, resp))
            return
        if replica >= 0:
            rs = self._replica(replica)
            rs.directory_id = p.get("replica_directory_id") or rs.directory_id
            rs.end_offset = fetch_offset
            rs.last_fetch_ms = self.now
            if fetch_offset >= self.high_watermark:
                rs.last_caught_up_ms = self.now
            self._update_high_watermark(out)
        max_bytes = min(p.get("partition_max_bytes") or self.config.fetch_max_bytes, self.config.fetch_max_bytes)
        batches = self.log.read(fetch_offset, max_bytes)
        # Parked only while there is nothing new for it: no records, and no high watermark it
        # has not heard of (its own fetch may have just moved it; KIP-1166's reason).
        knows_hw = replica < 0 or self._replica(replica).known_high_watermark >= self.high_watermark
        if not batches and knows_hw and body.get("max_wait_ms", 0) > 0:
            wait = min(body["max_wait_ms"], self.config.fetch_max_wait_ms)
            self.parked.append(_ParkedFetch(ref, version, body, replica, self.now + wait))
            return
        self._answer_fetch(ref, version, replica, b"".join(b.data for b in batches), out)

    def _replica(self, replica: int) -> ReplicaState:
        if replica in self.voters:
            return self.replicas.setdefault(replica, ReplicaState())
        # Taken out and put back last: the dict runs from the observer heard from longest ago to
        # the latest, so forgetting costs only what it forgets.
        rs = self.observers.pop(replica, None)
        if rs is None:
            self._forget_observers()
            rs = ReplicaState(last_fetch_ms=self.now)
        self.observers[replica] = rs
        return rs

    def _forget_observers(self) -> None:
        """Room for one more observer: those silent for OBSERVER_EXPIRY_MS go, and while
        MAX_OBSERVERS are still tracked, the one heard from longest ago."""
        horizon = self.now - OBSERVER_EXPIRY_MS
        while self.observers:
            oldest = next(iter(self.observers))
            if self.observers[oldest].last_fetch_ms >= horizon and len(self.observers) < MAX_OBSERVERS:
                return
            del self.observers[oldest]

    def _answer_fetch(self, ref: Any, version: int, replica: int, records: bytes, out: list[Effect]) -> None:
        if replica >= 0:
            self._replica(replica).known_high_watermark = self.high_watermark
        out.append(Respond(ref, FETCH, version, self._fetch_response(0, records=records)))

    def _validate_fetch(self, offset: int, last_epoch: int) -> tuple[str, OffsetAndEpoch] | None:
        """None when the follower's log matches ours up to `offset`; else ("snapshot", id) or
        ("diverging", (end offset, epoch)) telling it what to do (Kafka's validateOffsetAndEpoch)."""
        log = self.log
        snap = log.snapshot_id
        if offset < log.start_offset or (offset == log.start_offset and snap is not None
                                         and offset > 0 and last_epoch != snap.epoch):
            if snap is not None:
                return "snapshot", snap
            return "diverging", OffsetAndEpoch(log.start_offset, 0)
        if offset == log.start_offset:
            return None
        found = log.end_offset_for_epoch(last_epoch)
        if found.epoch < 0:
            if snap is not None:
                return "snapshot", snap
            return "diverging", OffsetAndEpoch(log.start_offset, 0)
        if found.epoch != last_epoch or offset > found.offset:
            return "diverging", found
        return None

    def _complete_parked(self, out: list[Effect]) -> None:
        if not self.parked:
            return
        parked, self.parked = self.parked, []
        for pf in parked:
            p = _partition(pf.body)
            batches = self.log.read(p["fetch_offset"], self.config.fetch_max_bytes) if p else []
            self._answer_fetch(pf.ref, pf.version, pf.replica_id, b"".join(b.data for b in batches), out)

    def _update_high_watermark(self, out: list[Effect]) -> None:
        offsets = []
        for v in self.voters.ids:
            if v == self.node_id:
                offsets.append(self.log.flushed_offset)
            else:
                rs = self.replicas.get(v)
                offsets.append(rs.end_offset if rs else -1)
        offsets.sort(reverse=True)
        candidate = offsets[self.voters.majority() - 1]
        # Only an entry of this epoch, replicated to a majority, commits what is before it.
        if candidate > self.epoch_start_offset and candidate > self.high_watermark:
            self._advance_high_watermark(candidate, out)
            self._complete_parked(out)
            self._maybe_finish_voter_change(out)

    def _advance_high_watermark(self, new_hw: int, out: list[Effect]) -> None:
        if new_hw <= self.high_watermark:
            return
        batches = tuple(self.log.batches_between(self.high_watermark, new_hw))
        self.high_watermark = new_hw
        out.append(Committed(new_hw, batches))

    def _leader_tick(self, out: list[Effect]) -> None:
        now = self.now
        if self.parked:
            due = [p for p in self.parked if p.deadline <= now]
            if due:
                self.parked = [p for p in self.parked if p.deadline > now]
                for pf in due:
                    self._answer_fetch(pf.ref, pf.version, pf.replica_id, b"", out)
        pc = self.pending_change
        if pc is not None and now >= pc.deadline:
            out.append(Respond(pc.ref, pc.api_key, 0, _voter_change_response(ErrorCode.REQUEST_TIMED_OUT,
                                                                             "not committed in time")))
            self.pending_change = None
        # Check quorum: a leader cut off from a majority steps down so that the others can elect.
        horizon = now - self.config.check_quorum_timeout_ms
        alive = sum(1 for v in self.voters.ids
                    if v == self.node_id or (v in self.replicas and self.replicas[v].last_fetch_ms >= horizon))
        if alive < self.voters.majority():
            self._resign(out)
            return
        if not self.is_voter and self.history.latest_offset() < self.high_watermark and self.pending_change is None:
            self._resign(out)  # its removal is committed: leave the quorum to its voters
            return
        # BeginQuorumEpoch again to a voter that has not fetched for half the fetch timeout, as
        # Kafka's leader does: one stuck in a later epoch (it lost an election the others never
        # heard of) then answers with that epoch, and this leader steps down for a new election.
        silent = now - self.config.fetch_timeout_ms // 2
        for v, rs in self.replicas.items():
            if (v in self.voters and not self._has_inflight(v, BEGIN_QUORUM_EPOCH)
                    and now >= self.retry_at.get((v, BEGIN_QUORUM_EPOCH), 0)
                    and ((not rs.begin_acked and rs.end_offset < self.epoch_start_offset + 1)
                         or rs.last_fetch_ms < silent)):
                self._send_begin(v, out)
                self.retry_at[(v, BEGIN_QUORUM_EPOCH)] = now + self.config.fetch_timeout_ms // 2

    # --- Fetch: follower side --------------------------------------------------------------------

    def _wants_fetch(self) -> bool:
        if self.fetch_request is not None or self.flush_wait is not None:
            return False
        if self.role is Role.FOLLOWER:
            return True
        # A node that knows no leader and cannot elect one looks for it by fetching from voters.
        return self.role in (Role.UNATTACHED, Role.RESIGNED) and not self.may_campaign

    def _maybe_fetch(self, out: list[Effect]) -> None:
        if not self._wants_fetch() or self.now < self.next_fetch_at:
            return
        if self.role is Role.FOLLOWER:
            dest = self.leader_id
        else:
            # No leader known: ask controller.quorum.bootstrap.servers (ids -2, -3, ... as Kafka
            # numbers them), else the voters this node knows.
            bootstrap = self.config.bootstrap_servers
            others = ([bootstrap_id(i) for i in range(len(bootstrap))] if bootstrap
                      else sorted(self.voters.ids - {self.node_id}))
            if not others:
                return
            dest = others[self.bootstrap_index % len(others)]
        if self.snapshot_fetch is not None:
            sf = self.snapshot_fetch
            body = {"cluster_id": self.config.cluster_id, "replica_id": self.node_id,
                    "max_bytes": self.config.snapshot_chunk_bytes,
                    "topics": [{"name": METADATA_TOPIC, "partitions": [{
                        "partition": 0, "current_leader_epoch": self.epoch,
                        "snapshot_id": {"end_offset": sf.snapshot_id.offset, "epoch": sf.snapshot_id.epoch},
                        "position": len(sf.data), "replica_directory_id": self.directory_id}]}]}
            self.fetch_request = self._send(dest, FETCH_SNAPSHOT, body, out)
            return
        last = self.log.last_offset_and_epoch()
        body = {"cluster_id": self.config.cluster_id,
                "replica_state": {"replica_id": self.node_id, "replica_epoch": -1},
                "max_wait_ms": self.config.fetch_max_wait_ms, "min_bytes": 0,
                "max_bytes": self.config.fetch_max_bytes, "isolation_level": 0, "session_id": 0,
                "session_epoch": -1,
                "topics": [{"topic_id": METADATA_TOPIC_ID, "partitions": [{
                    "partition": 0, "current_leader_epoch": self.epoch, "fetch_offset": last.offset,
                    "last_fetched_epoch": last.epoch, "log_start_offset": self.log.start_offset,
                    "partition_max_bytes": self.config.fetch_max_bytes,
                    "replica_directory_id": self.directory_id}]}],
                "forgotten_topics_data": [], "rack_id": ""}
        self.fetch_request = self._send(dest, FETCH, body, out, context=(self.epoch, last.offset))

    def _on_fetch_response(self, rid: int, sent: _InFlight, body: dict, out: list[Effect]) -> None:
        if rid != self.fetch_request:
            return
        self.fetch_request = None
        p = _partition(body, "responses")
        if p is None or body.get("error_code"):
            self.next_fetch_at = self.now + self.config.retry_backoff_ms
            return
        leader = p.get("current_leader") or {}
        leader_id = leader.get("leader_id", NO_ID)
        if leader_id == NO_ID and not self.may_campaign:
            # A node that only looks for the leader takes no leaderless later epoch from a peer:
            # one stranded there (a removed voter still campaigning) would strand it too.
            pass
        elif self._observe_epoch(leader.get("leader_epoch", -1), leader_id, out):
            return
        if (self.role is Role.FOLLOWER and sent.dest == self.leader_id and p["error_code"]
                and leader.get("leader_id", NO_ID) == NO_ID and leader.get("leader_epoch") == self.epoch):
            self.leader_resigned = True  # our leader says it is not leading any more: elect soon
            self.fetch_deadline = min(self.fetch_deadline, self.now + self.config.election_backoff_max_ms)
        if p["error_code"] != 0 or self.role is not Role.FOLLOWER or sent.dest != self.leader_id:
            self.next_fetch_at = self.now + self.config.retry_backoff_ms
            if self.role is Role.UNATTACHED:
                self.bootstrap_index += 1
            return
        epoch, fetch_offset = sent.context
        if epoch != self.epoch or fetch_offset != self.log.end_offset:
            return
        self.fetch_deadline = self.now + self.config.fetch_timeout_ms
        self.fetched_from_leader = True
        self.leader_resigned = False  # it answers again: whatever made us doubt it has passed
        self.next_fetch_at = self.now
        if p.get("diverging_epoch"):
            d = p["diverging_epoch"]
            self._truncate_diverged(OffsetAndEpoch(d["end_offset"], d["epoch"]), out)
            return
        if p.get("snapshot_id"):
            s = p["snapshot_id"]
            self.snapshot_fetch = _SnapshotFetch(OffsetAndEpoch(s["end_offset"], s["epoch"]))
            return
        records = p.get("records") or b""
        appended = False
        for batch in split_batches(records):
            if batch.base_offset != self.log.end_offset or batch.epoch < self.log.last_epoch:
                break
            self._append_local(batch, out)
            appended = True
        if appended:
            out.append(FlushLog(self.log.end_offset, self.flush_generation))
            self.flush_wait = self.log.end_offset
        self._advance_high_watermark(min(p["high_watermark"], self.log.end_offset), out)

    def _truncate_diverged(self, diverging: OffsetAndEpoch, out: list[Effect]) -> None:
        local = self.log.end_offset_for_epoch(diverging.epoch)
        to = min(diverging.offset, local.offset)
        to = max(to, self.log.start_offset)
        if to < self.high_watermark:
            raise SafetyViolation(f"node {self.node_id}: truncation to {to} is below the high watermark "
                                  f"{self.high_watermark}")
        if to >= self.log.end_offset:
            return
        self.log.truncate(to)
        self.history.truncate(to)
        self.flush_generation += 1
        out.append(TruncateLog(to))

    def _append_local(self, batch: LogBatch, out: list[Effect]) -> int:
        self.log.append(batch)
        self._scan_control(batch)
        out.append(AppendLog(batch))
        return batch.last_offset

    def _scan_control(self, batch: LogBatch) -> None:
        if not batch.is_control:
            return
        for rec in control_records(batch.data):
            if rec.kind == KRAFT_VERSION:
                self.kraft_version = rec.value.k_raft_version
            elif rec.kind == KRAFT_VOTERS:
                self.history.add(batch.base_offset, VoterSet(tuple(decode_voters(rec.value))))

    # --- FetchSnapshot ---------------------------------------------------------------------------

    def _on_fetch_snapshot_request(self, ref: Any, version: int, body: dict, out: list[Effect]) -> None:
        p = _partition(body, "topics", "partitions")
        if p is None:
            out.append(Respond(ref, FETCH_SNAPSHOT, version, _top_error(FETCH_SNAPSHOT, INVALID_REQUEST)))
            return
        sid = p["snapshot_id"]
        wanted = OffsetAndEpoch(sid["end_offset"], sid["epoch"])
        error, chunk, size, position = 0, b"", 0, p["position"]
        if p["current_leader_epoch"] > self.epoch:
            error = UNKNOWN_LEADER_EPOCH
        elif self.role is not Role.LEADER:
            error = ErrorCode.NOT_LEADER_OR_FOLLOWER
        elif p["current_leader_epoch"] < self.epoch:
            error = FENCED_LEADER_EPOCH
        elif self.snapshot_data is None or self.log.snapshot_id != wanted:
            error = SNAPSHOT_NOT_FOUND
        else:
            size = len(self.snapshot_data)
            if not 0 <= position <= size:
                error = POSITION_OUT_OF_RANGE
            else:
                limit = min(body.get("max_bytes") or self.config.snapshot_chunk_bytes, self.config.snapshot_chunk_bytes)
                chunk = self.snapshot_data[position:position + limit]
        out.append(Respond(ref, FETCH_SNAPSHOT, version, {
            "throttle_time_ms": 0, "error_code": 0,
            "topics": [{"name": METADATA_TOPIC, "partitions": [{
                "index": 0, "error_code": error, "snapshot_id": {"end_offset": wanted.offset, "epoch": wanted.epoch},
                "current_leader": {"leader_id": self.leader_id, "leader_epoch": self.epoch},
                "size": size, "position": position, "unaligned_records": chunk}]}],
            "node_endpoints": self._node_endpoints()}))

    def _on_fetch_snapshot_response(self, rid: int, sent: _InFlight, body: dict, out: list[Effect]) -> None:
        if rid != self.fetch_request:
            return
        self.fetch_request = None
        p = _partition(body, "topics", "partitions")
        sf = self.snapshot_fetch
        if p is None or sf is None:
            self.next_fetch_at = self.now + self.config.retry_backoff_ms
            return
        leader = p.get("current_leader") or {}
        if self._observe_epoch(leader.get("leader_epoch", -1), leader.get("leader_id", NO_ID), out):
            return
        if p["error_code"] != 0 or self.role is not Role.FOLLOWER:
            # The leader moved on (a newer snapshot, or none): go back to fetching the log.
            self.snapshot_fetch = None
            self.next_fetch_at = self.now + self.config.retry_backoff_ms
            return
        self.fetch_deadline = self.now + self.config.fetch_timeout_ms
        sid = p["snapshot_id"]
        if OffsetAndEpoch(sid["end_offset"], sid["epoch"]) != sf.snapshot_id or p["position"] != len(sf.data):
            return
        sf.data += p.get("unaligned_records") or b""
        if len(sf.data) < p["size"]:
            return
        self.snapshot_fetch = None
        data = bytes(sf.data)
        snapshot_id = sf.snapshot_id
        if snapshot_id.offset < self.high_watermark:
            raise SafetyViolation(f"node {self.node_id}: snapshot {snapshot_id} is behind the high watermark "
                                  f"{self.high_watermark}")
        try:
            read_snapshot(data)
        except ValueError:
            return
        out.append(WriteSnapshot(snapshot_id, data))
        out.append(DeleteLogPrefix(snapshot_id.offset, reset=True))
        self.log.reset_to_snapshot(snapshot_id)
        self.flush_generation += 1
        self._adopt_snapshot(snapshot_id, data)
        self.high_watermark = snapshot_id.offset
        out.append(LoadSnapshot(snapshot_id, data))

    def _adopt_snapshot(self, snapshot_id: OffsetAndEpoch, data: bytes) -> None:
        contents = read_snapshot(data)
        self.snapshot_data = data
        if contents.kraft_version:
            self.kraft_version = contents.kraft_version
        base = VoterSet(tuple(contents.voters)) if contents.voters else VoterSet(tuple(self.config.voters))
        self.history.reset(base)

    def _voters_at(self, offset: int) -> VoterSet:
        """The voter set in force for a snapshot that ends at `offset`."""
        h = self.history
        best = h.base
        for off, vs in zip(h._offsets, h._sets, strict=True):
            if off < offset:
                best = vs
        return best

    def _maybe_snapshot_due(self, out: list[Effect]) -> None:
        if self.snapshot_due_sent:
            return
        start = self.log.snapshot_id.offset if self.log.snapshot_id else 0
        if self.high_watermark <= start:
            return
        if (self.log.bytes_since_snapshot >= self.config.max_bytes_between_snapshots
                or self.now - self.last_snapshot_ms >= self.config.max_snapshot_interval_ms):
            self.snapshot_due_sent = True
            out.append(SnapshotDue(self.high_watermark))

    # --- DescribeQuorum --------------------------------------------------------------------------

    def _on_describe_quorum(self, ref: Any, version: int, body: dict, out: list[Effect]) -> None:
        def state(node: int, rs: ReplicaState | None) -> dict:
            if node == self.node_id:
                return {"replica_id": node, "replica_directory_id": self.directory_id,
                        "log_end_offset": self.log.end_offset, "last_fetch_timestamp": self.now,
                        "last_caught_up_timestamp": self.now}
            rs = rs or ReplicaState()
            voter = self.voters.get(node)
            directory = voter.directory_id if voter is not None and voter.directory_id else rs.directory_id
            return {"replica_id": node, "replica_directory_id": directory, "log_end_offset": rs.end_offset,
                    "last_fetch_timestamp": rs.last_fetch_ms, "last_caught_up_timestamp": rs.last_caught_up_ms}

        error = 0 if self.role is Role.LEADER else ErrorCode.NOT_LEADER_OR_FOLLOWER
        part = {"partition_index": 0, "error_code": error, "error_message": None,
                "leader_id": self.leader_id, "leader_epoch": self.epoch, "high_watermark": self.high_watermark,
                "current_voters": [state(v, self.replicas.get(v)) for v in sorted(self.voters.ids)] if not error else [],
                "observers": [state(o, rs) for o, rs in sorted(self.observers.items())] if not error else []}
        nodes = [{"node_id": v.voter_id, "listeners": [{"name": e.name, "host": e.host, "port": e.port}
                                                        for e in v.endpoints]}
                 for v in self.voters.voters]
        out.append(Respond(ref, DESCRIBE_QUORUM, version, {
            "error_code": 0, "error_message": None,
            "topics": [{"topic_name": METADATA_TOPIC, "partitions": [part]}],
            "nodes": nodes if version >= 2 else []}))  # endpoints arrived in v2

    # --- KIP-853 voter changes -------------------------------------------------------------------

    def _voter_change_check(self) -> tuple[int, str] | None:
        if self.role is not Role.LEADER:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, "not the leader"
        if self.kraft_version < 1:
            return UNSUPPORTED_VERSION, "the quorum has static voters (kraft.version 0)"
        if self.high_watermark <= self.epoch_start_offset:
            return ErrorCode.REQUEST_TIMED_OUT, "the leader has not committed its epoch yet"
        if (self.pending_change is not None or self.add_probe is not None
                or self.history.latest_offset() >= self.high_watermark):
            return ErrorCode.REQUEST_TIMED_OUT, "another voter change is in progress"
        return None

    def _append_voters(self, voters: VoterSet, out: list[Effect]) -> int:
        value = voters_value(list(voters.voters))
        batch = control_batch([(KRAFT_VOTERS, value)], self.log.end_offset, self.epoch, self.timestamp())
        offset = self._append_local(split_batches(batch)[0], out)
        self.replicas = {v: self.replicas.get(v) or self.observers.pop(v, None) or ReplicaState(last_fetch_ms=self.now)
                         for v in voters.ids if v != self.node_id}
        out.append(FlushLog(self.log.end_offset, self.flush_generation))
        self._complete_parked(out)
        return offset

    def _on_add_voter(self, ref: Any, version: int, body: dict, out: list[Effect]) -> None:
        problem = self._voter_change_check()
        voter_id = body["voter_id"]
        if problem is None and voter_id in self.voters:
            problem = DUPLICATE_VOTER, f"{voter_id} is already a voter"
        problem = problem or self._lagging(voter_id)
        entry = VoterEntry(voter_id, body.get("voter_directory_id"),
                           tuple(_endpoints(body.get("listeners") or [])))
        me = self.voters.get(self.node_id)
        listener = me.endpoints[0].name if me is not None and me.endpoints else None
        endpoint = next((e for e in entry.endpoints if e.name == listener), entry.endpoints[0] if entry.endpoints else None)
        if problem is None and endpoint is None:
            problem = INVALID_REQUEST, f"no listener given for {voter_id}"
        if problem is not None:
            out.append(Respond(ref, ADD_RAFT_VOTER, version, _voter_change_response(*problem)))
            return
        # As Kafka's leader does (KIP-853): ask the new voter's endpoint for ApiVersions first.
        # A voter nobody can reach, or that cannot follow the kraft.version, would take a place
        # in every majority from the moment the VotersRecord is appended.
        rid = self._send(voter_id, API_VERSIONS, {"client_software_name": "strom-raft",
                                                  "client_software_version": "1"},
                         out, address=(endpoint.host, endpoint.port))
        self.add_probe = _AddVoterProbe(ref, version, entry, body.get("timeout_ms") or 0, rid)

    def _lagging(self, voter_id: int) -> tuple[int, str] | None:
        """Kafka's isReplicaCaughtUp for a voter to be added: fetching, and caught up lately."""
        obs = self.observers.get(voter_id)
        horizon = self.now - self.config.fetch_timeout_ms
        if obs is None or obs.last_fetch_ms < horizon:
            return ErrorCode.REQUEST_TIMED_OUT, f"{voter_id} is not fetching from the leader"
        if obs.last_caught_up_ms < 0 or obs.last_caught_up_ms < horizon:
            return ErrorCode.REQUEST_TIMED_OUT, f"{voter_id} is lagging behind"
        return None

    def _answer_probe(self, error: int, message: str, out: list[Effect]) -> None:
        probe, self.add_probe = self.add_probe, None
        self.inflight.pop(probe.request_id, None)
        out.append(Respond(probe.ref, ADD_RAFT_VOTER, probe.version, _voter_change_response(error, message)))

    def _on_api_versions_response(self, rid: int, sent: _InFlight, body: dict, out: list[Effect]) -> None:
        probe = self.add_probe
        if probe is None or rid != probe.request_id:
            return
        voter_id = probe.entry.voter_id
        if body.get("error_code"):
            self._answer_probe(ErrorCode.REQUEST_TIMED_OUT,
                               f"ApiVersions of new voter {voter_id} answered error {body['error_code']}", out)
            return
        kraft = next((f for f in body.get("supported_features") or () if f.get("name") == "kraft.version"), None)
        if kraft is None or not kraft["min_version"] <= self.kraft_version <= kraft["max_version"]:
            self._answer_probe(INVALID_REQUEST, f"new voter {voter_id} does not support kraft.version "
                                                f"{self.kraft_version}", out)
            return
        self.add_probe = None
        problem = self._voter_change_check() or self._lagging(voter_id)
        if problem is None and voter_id in self.voters:
            problem = DUPLICATE_VOTER, f"{voter_id} is already a voter"
        if problem is not None:
            out.append(Respond(probe.ref, ADD_RAFT_VOTER, probe.version, _voter_change_response(*problem)))
            return
        offset = self._append_voters(self.voters.adding(probe.entry), out)
        self.pending_change = _PendingVoterChange(probe.ref, ADD_RAFT_VOTER, offset,
                                                  self.now + max(probe.timeout_ms, self.config.request_timeout_ms))

    def _on_remove_voter(self, ref: Any, version: int, body: dict, out: list[Effect]) -> None:
        problem = self._voter_change_check()
        voter_id = body["voter_id"]
        wanted_dir = body.get("voter_directory_id")
        current = self.voters.get(voter_id)
        if problem is None and (current is None or (wanted_dir is not None and current.directory_id is not None
                                                    and wanted_dir != current.directory_id)):
            problem = VOTER_NOT_FOUND, f"{voter_id} with directory {wanted_dir} is not a voter"
        if problem is None and len(self.voters.voters) == 1:
            problem = INVALID_REQUEST, "cannot remove the last voter"
        if problem is not None:
            out.append(Respond(ref, REMOVE_RAFT_VOTER, version, _voter_change_response(*problem)))
            return
        offset = self._append_voters(self.voters.removing(voter_id), out)
        self.pending_change = _PendingVoterChange(ref, REMOVE_RAFT_VOTER, offset,
                                                  self.now + self.config.request_timeout_ms, voter_id)

    def _on_update_voter(self, ref: Any, version: int, body: dict, out: list[Effect]) -> None:
        def answer(error: int) -> None:
            out.append(Respond(ref, UPDATE_RAFT_VOTER, version, {
                "throttle_time_ms": 0, "error_code": error,
                "current_leader": {"leader_id": self.leader_id, "leader_epoch": self.epoch, "host": "", "port": 0}}))

        problem = self._voter_change_check()
        voter_id = body["voter_id"]
        current = self.voters.get(voter_id)
        if problem is None and current is None:
            problem = VOTER_NOT_FOUND, ""
        if problem is not None:
            answer(problem[0])
            return
        feature = body.get("k_raft_version_feature") or {}
        entry = VoterEntry(voter_id, current.directory_id, tuple(_endpoints(body.get("listeners") or [])),
                           feature.get("min_supported_version", 0), feature.get("max_supported_version", 1))
        self._append_voters(self.voters.replacing(entry), out)
        answer(0)

    def _maybe_finish_voter_change(self, out: list[Effect]) -> None:
        pc = self.pending_change
        if pc is None or self.high_watermark <= pc.offset:
            return
        self.pending_change = None
        out.append(Respond(pc.ref, pc.api_key, 0, _voter_change_response(0, None)))
        if pc.removed == self.node_id and self.role is Role.LEADER:
            self._resign(out)


def bootstrap_id(index: int) -> int:
    """The node id a driver gives the `index`th of controller.quorum.bootstrap.servers."""
    return -2 - index


def _partition(body: dict, topics_key: str = "topics", partitions_key: str = "partitions") -> dict | None:
    topics = body.get(topics_key) or []
    if len(topics) != 1:
        return None
    parts = topics[0].get(partitions_key) or []
    return parts[0] if len(parts) == 1 else None


def _top_error(api_key: int, error: int) -> dict:
    if api_key == FETCH:
        return {"throttle_time_ms": 0, "error_code": error, "session_id": 0, "responses": [], "node_endpoints": []}
    if api_key == FETCH_SNAPSHOT:
        return {"throttle_time_ms": 0, "error_code": error, "topics": [], "node_endpoints": []}
    if api_key in (ADD_RAFT_VOTER, REMOVE_RAFT_VOTER):
        return _voter_change_response(error, None)
    if api_key == UPDATE_RAFT_VOTER:
        return {"throttle_time_ms": 0, "error_code": error, "current_leader": None}
    if api_key == DESCRIBE_QUORUM:
        return {"error_code": error, "error_message": None, "topics": [], "nodes": []}
    return {"error_code": error, "topics": [], "node_endpoints": []}


def _voter_change_response(error: int, message: str | None) -> dict:
    return {"throttle_time_ms": 0, "error_code": int(error), "error_message": message}


def _endpoints(listeners: list[dict]) -> list[Endpoint]:
    return [Endpoint(x["name"], x["host"], x["port"]) for x in listeners]
