"""RaftCore on byte-level messages: each request is encoded as Kafka frames it, parsed by
strom.protocol.messages, handed to the core, and the core's answer encoded and decoded back."""

from __future__ import annotations

import random

import pytest

from strom.protocol.errors import ErrorCode
from strom.protocol.messages import decode_response, encode_request, encode_response, parse_request
from strom.protocol.raft_records import (
    LEADER_CHANGE,
    Endpoint,
    VoterEntry,
    control_records,
    data_batch,
    iter_batches,
)
from strom.raft import effects as fx
from strom.raft.config import QuorumConfig, parse_voters
from strom.raft.core import (
    ADD_RAFT_VOTER,
    DESCRIBE_QUORUM,
    FENCED_LEADER_EPOCH,
    FETCH,
    FETCH_SNAPSHOT,
    INCONSISTENT_VOTER_SET,
    INVALID_REQUEST,
    MAX_EPOCH,
    MAX_OBSERVERS,
    METADATA_TOPIC_ID,
    OBSERVER_EXPIRY_MS,
    VOTE,
    RaftCore,
    SafetyViolation,
)
from strom.raft.log import LogBatch, OffsetAndEpoch, split_batches
from strom.raft.snapshots import build_snapshot, filename, parse_filename, read_snapshot
from strom.raft.state import ElectionState, Role

VOTERS = tuple(VoterEntry(i, None, (Endpoint("CONTROLLER", "127.0.0.1", 9090 + i),)) for i in (1, 2, 3))


def core(node_id: int = 1, voters=VOTERS, **kw) -> RaftCore:
    c = RaftCore(QuorumConfig(node_id=node_id, voters=voters, cluster_id="c1"), rng=random.Random(0), **kw)
    c.start(0)
    return c


def call(c: RaftCore, api_key: int, version: int, fields: dict, now: int = 10):
    """Frame the request, parse it as a broker would, let the core answer, decode the answer."""
    request = parse_request(encode_request(api_key, version, fields, correlation_id=7)[4:])
    effects = c.handle_request("ref", -1, api_key, version, request.body.to_dict(json=False), now)
    answers = [e for e in effects if isinstance(e, fx.Respond)]
    if not answers:
        return None, effects
    frame = encode_response(request.header, answers[0].body)
    correlation, body = decode_response(api_key, version, frame[4:])
    assert correlation == 7
    return body, effects


def vote(candidate: int, epoch: int, last_epoch: int = 0, last_offset: int = 0, pre: bool = False) -> dict:
    return {"cluster_id": "c1", "voter_id": 1, "topics": [{"topic_name": "__cluster_metadata", "partitions": [{
        "partition_index": 0, "replica_epoch": epoch, "replica_id": candidate, "replica_directory_id": None,
        "voter_directory_id": None, "last_offset_epoch": last_epoch, "last_offset": last_offset, "pre_vote": pre}]}]}


def fetch(replica: int, epoch: int, offset: int, last_epoch: int, max_wait: int = 0) -> dict:
    return {"cluster_id": "c1", "replica_state": {"replica_id": replica, "replica_epoch": -1}, "max_wait_ms": max_wait,
            "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic_id": METADATA_TOPIC_ID, "partitions": [{
                "partition": 0, "current_leader_epoch": epoch, "fetch_offset": offset, "last_fetched_epoch": last_epoch,
                "log_start_offset": 0, "partition_max_bytes": 1 << 20, "replica_directory_id": None}]}],
            "forgotten_topics_data": [], "rack_id": ""}


def part(body):
    topics = getattr(body, "topics", None) or body.responses
    return topics[0].partitions[0]


def batches(epochs: list[int]) -> list[LogBatch]:
    """A log with one single-record batch per entry, at the given epochs."""
    out, offset = [], 0
    for e in epochs:
        out += split_batches(data_batch([b"r%d" % offset], offset, e, 0))
        offset += 1
    return out


def test_vote_is_persisted_before_it_is_sent_and_given_once_per_epoch():
    c = core()
    body, effects = call(c, VOTE, 2, vote(2, epoch=1))
    assert part(body).vote_granted and part(body).leader_epoch == 1
    kinds = [type(e) for e in effects]
    persisted = [e for e in effects if isinstance(e, fx.PersistElectionState)][-1]
    assert effects.index(persisted) < kinds.index(fx.Respond)
    assert persisted.state == ElectionState(1, -1, 2)
    assert '"votedId":2' in persisted.text and '"leaderEpoch":1' in persisted.text
    again, _ = call(c, VOTE, 2, vote(3, epoch=1))
    assert not part(again).vote_granted  # one vote per epoch
    same, effects = call(c, VOTE, 2, vote(2, epoch=1))
    assert part(same).vote_granted and not any(isinstance(e, fx.PersistElectionState) for e in effects)


def test_vote_refused_to_a_candidate_with_an_older_log():
    c = core(log_batches=batches([1, 1, 2]), election=ElectionState(2, -1, -1))
    stale, _ = call(c, VOTE, 2, vote(2, epoch=3, last_epoch=1, last_offset=5))
    assert not part(stale).vote_granted  # a longer log of an older epoch is not up to date
    shorter, _ = call(c, VOTE, 2, vote(3, epoch=4, last_epoch=2, last_offset=2))
    assert not part(shorter).vote_granted
    ok, _ = call(c, VOTE, 2, vote(3, epoch=5, last_epoch=2, last_offset=3))
    assert part(ok).vote_granted and c.epoch == 5


def test_pre_vote_neither_bumps_the_epoch_nor_persists():
    c = core()
    body, effects = call(c, VOTE, 2, vote(2, epoch=4, pre=True))
    assert part(body).vote_granted
    assert c.epoch == 0 and not any(isinstance(e, fx.PersistElectionState) for e in effects)
    # Vote v1 has no PreVote field: the same request is a real vote there.
    body, _ = call(c, VOTE, 1, vote(2, epoch=1))
    assert part(body).vote_granted and c.epoch == 1


def test_follower_that_hears_its_leader_refuses_pre_votes():
    c = core(node_id=3)
    _, effects = call(c, 53, 1, {"cluster_id": "c1", "voter_id": 3, "topics": [{"topic_name": "__cluster_metadata", "partitions": [
        {"partition_index": 0, "voter_directory_id": None, "leader_id": 1, "leader_epoch": 1}]}], "leader_endpoints": []})
    assert c.role is Role.FOLLOWER and c.leader_id == 1
    send = next(e for e in effects if isinstance(e, fx.Send) and e.api_key == FETCH)
    assert send.dest == 1 and send.body["topics"][0]["partitions"][0]["current_leader_epoch"] == 1
    c.handle_response(send.request_id, {"error_code": 0, "responses": [{"topic_id": METADATA_TOPIC_ID, "partitions": [{
        "partition_index": 0, "error_code": 0, "high_watermark": 0, "current_leader": {"leader_id": 1, "leader_epoch": 1},
        "records": b""}]}]}, 12)
    body, _ = call(c, VOTE, 2, vote(2, epoch=1, pre=True), now=13)
    assert not part(body).vote_granted and part(body).leader_id == 1


def test_an_observer_passes_on_the_leader_endpoint_it_was_told():
    """A controller that knows no voter set yet (about to be added) learns its leader and where
    it listens from an answer; asked in turn, it names that address, not only the leader's id.
    Without it a second such controller followed a leader it had no address for, for ever."""
    c = RaftCore(QuorumConfig(node_id=3, voters=(), cluster_id="c1", bootstrap_servers=(("127.0.0.1", 9091),)),
                 rng=random.Random(0))
    effects = [*c.start(0), *c.tick(1)]
    send = next(e for e in effects if isinstance(e, fx.Send) and e.api_key == FETCH)
    c.handle_response(send.request_id, {"error_code": 0, "responses": [{"topic_id": METADATA_TOPIC_ID, "partitions": [{
        "partition_index": 0, "error_code": 6, "high_watermark": 0, "current_leader": {"leader_id": 1, "leader_epoch": 1},
        "records": b""}]}], "node_endpoints": [{"node_id": 1, "host": "127.0.0.1", "port": 9091, "rack": None}]}, 5)
    assert c.role is Role.FOLLOWER and c.leader_id == 1
    body, _ = call(c, FETCH, 17, fetch(2, epoch=1, offset=0, last_epoch=0))
    assert part(body).current_leader.leader_id == 1
    assert [(n.node_id, n.host, n.port) for n in body.node_endpoints] == [(1, "127.0.0.1", 9091)]


def test_single_voter_leads_and_writes_a_leader_change_record():
    c = RaftCore(QuorumConfig(node_id=1, voters=VOTERS[:1]), rng=random.Random(0))
    effects = c.start(0)
    assert c.role is Role.LEADER and c.epoch == 1
    appended = [e.batch for e in effects if isinstance(e, fx.AppendLog)]
    assert len(appended) == 1 and appended[0].is_control and appended[0].epoch == 1
    (rec,) = control_records(appended[0].data)
    assert rec.kind == LEADER_CHANGE and rec.value.leader_id == 1
    assert [v.voter_id for v in rec.value.voters] == [1]
    flush = next(e for e in effects if isinstance(e, fx.FlushLog))
    committed = [e for e in c.on_flushed(flush.end_offset, flush.generation, 1) if isinstance(e, fx.Committed)]
    assert committed and committed[0].high_watermark == 1


def leader_of(epochs: list[int], epoch: int) -> RaftCore:
    """Node 1 as the leader of `epoch` over a log of `epochs`."""
    c = core(log_batches=batches(epochs), election=ElectionState(epoch - 1, -1, -1))
    c._become_prospective([])
    c._become_candidate([])
    c.granted.add(2)
    c._become_leader([])
    assert c.role is Role.LEADER and c.epoch == epoch
    return c


def test_fetch_with_a_diverging_log_gets_the_divergence_point():
    c = leader_of([1, 1, 3, 3], epoch=4)
    body, _ = call(c, FETCH, 17, fetch(2, epoch=4, offset=5, last_epoch=2))
    p = part(body)
    assert p.error_code == 0 and p.diverging_epoch.epoch == 1 and p.diverging_epoch.end_offset == 2
    assert not p.records
    body, _ = call(c, FETCH, 17, fetch(2, epoch=3, offset=2, last_epoch=1))
    assert part(body).error_code == FENCED_LEADER_EPOCH and part(body).current_leader.leader_id == 1
    body, _ = call(c, FETCH, 17, fetch(2, epoch=4, offset=2, last_epoch=1))
    got = [b.base_offset for b in split_batches(part(body).records)]
    assert got == [2, 3, 4]  # the epoch-3 entries and the leader's LeaderChange at 4


def test_high_watermark_waits_for_an_entry_of_the_leaders_epoch():
    c = leader_of([1, 1, 1], epoch=2)  # epoch 2 starts at offset 3 with its LeaderChange
    c.on_flushed(c.log.end_offset, c.flush_generation, 5)
    body, effects = call(c, FETCH, 17, fetch(2, epoch=2, offset=3, last_epoch=1))
    # A majority holds offsets 0-2, but they are from epoch 1: not committed yet.
    assert c.high_watermark == 0 and not any(isinstance(e, fx.Committed) for e in effects)
    body, effects = call(c, FETCH, 17, fetch(2, epoch=2, offset=4, last_epoch=2))
    assert c.high_watermark == 4 and part(body).high_watermark == 4
    committed = next(e for e in effects if isinstance(e, fx.Committed))
    assert [b.base_offset for b in committed.batches] == [0, 1, 2, 3]


def test_observers_fetch_but_do_not_count():
    c = leader_of([1], epoch=2)
    c.on_flushed(c.log.end_offset, c.flush_generation, 5)
    call(c, FETCH, 17, fetch(7, epoch=2, offset=2, last_epoch=2))
    assert c.high_watermark == 0 and 7 in c.observers and 7 not in c.replicas
    call(c, FETCH, 17, fetch(3, epoch=2, offset=2, last_epoch=2))
    assert c.high_watermark == 2
    body, _ = call(c, DESCRIBE_QUORUM, 2, {"topics": [{"topic_name": "__cluster_metadata",
                                                      "partitions": [{"partition_index": 0}]}]})
    p = part(body)
    assert p.leader_id == 1 and p.high_watermark == 2
    assert [v.replica_id for v in p.current_voters] == [1, 2, 3] and [o.replica_id for o in p.observers] == [7]
    for version in (0, 1):  # before v2 the answer has no endpoints: it encodes without them
        body, _ = call(c, DESCRIBE_QUORUM, version, {"topics": [{"topic_name": "__cluster_metadata",
                                                                "partitions": [{"partition_index": 0}]}]})
        assert part(body).high_watermark == 2 and [v.replica_id for v in part(body).current_voters] == [1, 2, 3]


def test_a_long_poll_is_answered_at_once_while_its_replica_has_not_heard_of_the_high_watermark():
    """A follower whose own fetch moved the high watermark, or which fetched its records before
    they were committed, learns the new high watermark at once, not after its next long poll:
    a broker's metadata would otherwise lag the commit by up to fetch max wait."""
    c = leader_of([1], epoch=2)
    c.on_flushed(c.log.end_offset, c.flush_generation, 5)
    body, _ = call(c, FETCH, 17, fetch(2, epoch=2, offset=2, last_epoch=2, max_wait=500))
    assert body is not None and c.high_watermark == 2 and part(body).high_watermark == 2  # moved by this fetch
    body, _ = call(c, FETCH, 17, fetch(3, epoch=2, offset=2, last_epoch=2, max_wait=500))
    assert body is not None and part(body).high_watermark == 2  # 3 had not heard of it either
    body, effects = call(c, FETCH, 17, fetch(3, epoch=2, offset=2, last_epoch=2, max_wait=500))
    assert body is None and len(c.parked) == 1  # nothing new for 3 now: it waits


def test_leader_without_a_majority_fetching_resigns():
    c = leader_of([1], epoch=2)
    timeout = c.config.check_quorum_timeout_ms
    effects = c.tick(timeout + 100)
    assert c.role is Role.RESIGNED
    ends = [e for e in effects if isinstance(e, fx.Send) and e.api_key == 54]
    assert {e.dest for e in ends} == {2, 3}


def test_follower_below_the_log_start_is_sent_to_the_snapshot_and_loads_it():
    leader = leader_of([1, 1, 1, 1], epoch=2)
    leader.on_flushed(leader.log.end_offset, leader.flush_generation, 5)
    call(leader, FETCH, 17, fetch(2, epoch=2, offset=5, last_epoch=2))
    assert leader.high_watermark == 5
    leader.create_snapshot(4, [b"state-a", b"state-b"], 6)
    assert leader.log.start_offset == 4
    body, _ = call(leader, FETCH, 17, fetch(3, epoch=2, offset=1, last_epoch=1))
    assert part(body).snapshot_id.end_offset == 4 and part(body).snapshot_id.epoch == 1
    req = {"cluster_id": "c1", "replica_id": 3, "max_bytes": 100, "topics": [{"name": "__cluster_metadata",
           "partitions": [{"partition": 0, "current_leader_epoch": 2, "snapshot_id": {"end_offset": 4, "epoch": 1},
                           "position": 0, "replica_directory_id": None}]}]}
    body, _ = call(leader, FETCH_SNAPSHOT, 1, req)
    p = body.topics[0].partitions[0]
    assert p.error_code == 0 and p.position == 0 and len(p.unaligned_records) == 100 < p.size
    assert read_snapshot(leader.snapshot_data).values == [b"state-a", b"state-b"]


def test_a_truncation_below_the_high_watermark_is_refused():
    c = core(node_id=2, log_batches=batches([1, 1, 1]))
    c.high_watermark = 3
    with pytest.raises(SafetyViolation):
        c._truncate_diverged(OffsetAndEpoch(1, 1), [])


def test_snapshot_files_and_quorum_state_use_kafkas_formats():
    sid = OffsetAndEpoch(1234, 5)
    assert filename(sid) == "00000000000000001234-0000000005.checkpoint"
    assert parse_filename(filename(sid)) == sid
    data = build_snapshot(sid, [b"a", b"b"], kraft_version=1, voters=list(VOTERS), last_contained_timestamp=99)
    kinds = [(b.is_control, b.epoch) for b in iter_batches(data)]
    assert kinds == [(True, 5), (False, 5), (True, 5)]
    contents = read_snapshot(data)
    assert contents.values == [b"a", b"b"] and contents.kraft_version == 1
    assert [v.voter_id for v in contents.voters] == [1, 2, 3] and contents.voters[0].endpoints[0].port == 9091
    v0 = ElectionState(3, 2, 2).to_json(0, [1, 2, 3])
    assert v0 == ('{"clusterId":"","leaderId":2,"leaderEpoch":3,"votedId":2,"appliedOffset":0,'
                  '"currentVoters":[{"voterId":1},{"voterId":2},{"voterId":3}],"data_version":0}')
    v1 = ElectionState(3, -1, 2).to_json(1, [])
    assert '"votedDirectoryId":"AAAAAAAAAAAAAAAAAAAAAA"' in v1 and '"data_version":1' in v1
    assert ElectionState.from_json(v0) == ElectionState(3, 2, 2)


def test_controller_quorum_voters_parse():
    voters = parse_voters("1@localhost:9093, 2@[::1]:9094")
    assert [(v.voter_id, v.endpoints[0].host, v.endpoints[0].port) for v in voters] == [(1, "localhost", 9093),
                                                                                       (2, "::1", 9094)]
    with pytest.raises(ValueError):
        parse_voters("1@localhost:9093,1@localhost:9094")
    cfg = QuorumConfig.from_props(1, {"controller.quorum.election.timeout.ms": "500",
                                      "controller.quorum.voters": "1@h:1"})
    assert cfg.election_timeout_ms == 500 and cfg.fetch_timeout_ms == 2000 and cfg.voters[0].voter_id == 1


def begin(leader: int, epoch: int, voter: int = 1) -> dict:
    return {"cluster_id": "c1", "voter_id": voter, "topics": [{"topic_name": "__cluster_metadata", "partitions": [
        {"partition_index": 0, "voter_directory_id": None, "leader_id": leader, "leader_epoch": epoch}]}],
        "leader_endpoints": []}


def end(leader: int, epoch: int) -> dict:
    return {"cluster_id": "c1", "topics": [{"topic_name": "__cluster_metadata", "partitions": [
        {"partition_index": 0, "leader_id": leader, "leader_epoch": epoch, "preferred_candidates": []}]}],
        "leader_endpoints": []}


def test_a_static_quorum_takes_election_messages_from_its_voters_only():
    """controller.quorum.voters names every voter for good: a Vote, BeginQuorumEpoch or
    EndQuorumEpoch naming another node, or this one, as its sender is refused before it can move
    the epoch (a stray or hostile client on the controller listener)."""
    c = core()
    for api, version, fields in ((VOTE, 2, vote(9, epoch=5)), (VOTE, 2, vote(1, epoch=5)),
                                 (53, 1, begin(9, 5)), (53, 1, begin(1, 5)), (54, 1, end(9, 5)), (54, 1, end(1, 5))):
        body, effects = call(c, api, version, fields)
        assert part(body).error_code == INCONSISTENT_VOTER_SET, (api, fields)
        assert c.epoch == 0 and not any(isinstance(e, fx.PersistElectionState) for e in effects)
    body, _ = call(c, 53, 1, begin(2, 1))  # a voter: followed
    assert part(body).error_code == 0 and c.role is Role.FOLLOWER and c.leader_id == 2 and c.epoch == 1


def test_a_dynamic_quorum_hears_a_leader_its_voter_set_does_not_name():
    """KIP-853: a voter's copy of the set may be older than the leader's, so, as in Kafka 4, a
    dynamic quorum follows a BeginQuorumEpoch from a node it does not know as a voter."""
    c = core()
    c.kraft_version = 1
    body, _ = call(c, 53, 1, begin(9, 1))
    assert part(body).error_code == 0 and c.leader_id == 9 and c.epoch == 1


def test_no_election_past_the_largest_epoch():
    """Epochs are int32 on the wire: a node in the largest one stands in it (not past it) while
    it has voted for nobody else there; one that voted for another does not, and keeps answering."""
    c = core(election=ElectionState(MAX_EPOCH, -1, -1))
    votes = [e for e in c.tick(1_000_000) if isinstance(e, fx.Send) and e.api_key == VOTE]
    assert c.role is Role.PROSPECTIVE and {e.body["topics"][0]["partitions"][0]["replica_epoch"] for e in votes} == {MAX_EPOCH}
    c._become_candidate([])
    assert c.epoch == MAX_EPOCH and c.election.voted_id == 1
    c = core(election=ElectionState(MAX_EPOCH, -1, 2))
    assert not c.may_campaign
    c.tick(1_000_000)
    assert c.epoch == MAX_EPOCH and c.role is not Role.CANDIDATE
    body, _ = call(c, DESCRIBE_QUORUM, 1, {"topics": [{"topic_name": "__cluster_metadata",
                                                      "partitions": [{"partition_index": 0}]}]}, now=1_000_001)
    assert part(body).leader_epoch == MAX_EPOCH


def test_observers_are_bounded_and_forgotten():
    c = leader_of([1], epoch=2)
    for replica in range(100, 100 + MAX_OBSERVERS):
        c._replica(replica).last_fetch_ms = replica  # heard from in this order
    call(c, FETCH, 17, fetch(7, epoch=2, offset=2, last_epoch=2), now=500)
    assert len(c.observers) == MAX_OBSERVERS and 7 in c.observers and 100 not in c.observers  # the oldest went
    later = 100 + MAX_OBSERVERS + OBSERVER_EXPIRY_MS  # every one above silent for longer than that
    call(c, FETCH, 17, fetch(8, epoch=2, offset=2, last_epoch=2), now=later)
    call(c, FETCH, 17, fetch(9, epoch=2, offset=2, last_epoch=2), now=later + 1)
    assert set(c.observers) == {8, 9}  # the silent ones expired once room was needed


def test_leader_asks_a_silent_voter_again_and_steps_down_for_its_later_epoch():
    """A voter that lost an election the others never heard of sits in a later epoch and
    fetches from nobody (seed 3208 of the simulation). The leader sends BeginQuorumEpoch again
    to a voter silent for half the fetch timeout; the answer names the later epoch, and the
    leader leaves its own for a new election."""
    c = leader_of([1], epoch=2)
    half = c.config.fetch_timeout_ms // 2
    c.on_flushed(c.log.end_offset, c.flush_generation, 5)
    for rid in [r for r, f in c.inflight.items() if f.api_key == 53]:  # both take the new leader
        c.handle_response(rid, {"error_code": 0, "topics": [{"topic_name": "__cluster_metadata", "partitions": [
            {"partition_index": 0, "error_code": 0, "leader_id": 1, "leader_epoch": 2}]}]}, 5)
    for voter in (2, 3):  # and fetch its epoch's first record
        call(c, FETCH, 17, fetch(voter, epoch=2, offset=2, last_epoch=2), now=10)
    call(c, FETCH, 17, fetch(3, epoch=2, offset=2, last_epoch=2), now=10 + half)  # then 2 falls silent
    effects = c.tick(11 + half)
    begins = [e for e in effects if isinstance(e, fx.Send) and e.api_key == 53]
    assert [e.dest for e in begins] == [2]
    assert not [e for e in c.tick(12 + half) if isinstance(e, fx.Send) and e.api_key == 53]  # not every tick
    c.handle_response(begins[0].request_id, {"error_code": 0, "topics": [{"topic_name": "__cluster_metadata",
        "partitions": [{"partition_index": 0, "error_code": FENCED_LEADER_EPOCH, "leader_id": -1,
                        "leader_epoch": 4}]}]}, 13 + half)
    assert c.role is not Role.LEADER and c.epoch == 4


def following(node_id: int = 3, leader: int = 1, epoch: int = 1) -> RaftCore:
    """A voter that follows `leader` and has just fetched from it."""
    c = core(node_id=node_id)
    _, effects = call(c, 53, 1, begin(leader, epoch, voter=node_id))
    send = next(e for e in effects if isinstance(e, fx.Send) and e.api_key == FETCH)
    c.handle_response(send.request_id, {"error_code": 0, "responses": [{"topic_id": METADATA_TOPIC_ID, "partitions": [{
        "partition_index": 0, "error_code": 0, "high_watermark": 0,
        "current_leader": {"leader_id": leader, "leader_epoch": epoch}, "records": b""}]}]}, 12)
    assert c.role is Role.FOLLOWER and c.fetched_from_leader
    return c


def test_a_voter_that_hears_a_live_leader_refuses_every_vote():
    """KIP-996: a follower that fetched from its leader within the fetch timeout, and the leader
    itself, refuse a Vote, pre-vote or standard, at any epoch, and keep their epoch: one forged
    Vote at the largest epoch left every voter Unattached there for good."""
    for c in (following(), leader_of([1], epoch=2)):
        before = (c.role, c.epoch, c.leader_id)
        for pre in (True, False):
            for epoch in (c.epoch, c.epoch + 1, MAX_EPOCH):
                body, effects = call(c, VOTE, 2, vote(2, epoch=epoch, last_epoch=5, last_offset=100, pre=pre), now=13)
                assert not part(body).vote_granted, (c.role, pre, epoch)
                assert not any(isinstance(e, fx.PersistElectionState) for e in effects)
                assert (c.role, c.epoch, c.leader_id) == before
    c = following()
    later = c.fetch_deadline  # the leader went silent for the fetch timeout: the vote is granted
    body, _ = call(c, VOTE, 2, vote(2, epoch=2, last_epoch=0, last_offset=0), now=later)
    assert part(body).vote_granted and c.epoch == 2


def test_a_standard_vote_more_than_one_epoch_ahead_is_refused():
    """A real candidate stands in the epoch after the one it was in, and its pre-vote round told
    it of the voters' epochs: a voter takes a standard Vote at most one epoch ahead of its own.
    One that missed elections learns the later epoch from the answers to its own pre-vote."""
    c = core(election=ElectionState(3, -1, -1))
    for epoch in (5, MAX_EPOCH):
        body, effects = call(c, VOTE, 2, vote(2, epoch=epoch))
        assert not part(body).vote_granted and c.epoch == 3
        assert not any(isinstance(e, fx.PersistElectionState) for e in effects)
    body, _ = call(c, VOTE, 2, vote(2, epoch=5, pre=True))  # a pre-vote moves nothing: answered as before
    assert part(body).vote_granted and c.epoch == 3
    body, _ = call(c, VOTE, 2, vote(2, epoch=4))
    assert part(body).vote_granted and c.epoch == 4


def test_a_quorum_in_the_largest_epoch_elects_a_leader_in_it():
    """Epochs are int32 on the wire: no election goes past the largest. A quorum already there
    (quorum-state written by a forged Vote) still elects one leader in that epoch, under the
    one-vote-per-epoch rule, instead of staying leaderless for good (Kafka's epoch + 1 wraps to a
    negative epoch every voter fences)."""
    from raft_sim import Simulation

    sim = Simulation(7, voters=3)
    for nid, node in sim.nodes.items():  # every voter but 2 voted for 2 in the largest epoch
        node.election = ElectionState(MAX_EPOCH, -1, 2 if nid != 2 else -1)
        sim._boot(node)
    sim.check_liveness(30_000)
    leader = next(n.core for n in sim.nodes.values() if n.core.role is Role.LEADER)
    assert leader.epoch == MAX_EPOCH and leader.node_id == 2
    c = core(election=ElectionState(MAX_EPOCH, 2, 2))  # it had a leader there: no second one
    assert not c.may_campaign


def refused(c: RaftCore, api_key: int, fields: dict, now: int = 13) -> None:
    """The request is refused (INVALID_REQUEST) and leaves the node as it was."""
    before = (c.role, c.epoch, c.leader_id, c.election, c.leader_resigned, c.fetch_deadline)
    body, effects = call(c, api_key, 1, fields, now=now)
    assert part(body).error_code == INVALID_REQUEST, (api_key, fields)
    assert (part(body).leader_id, part(body).leader_epoch) == (c.leader_id, c.epoch)
    assert not any(isinstance(e, (fx.PersistElectionState, fx.LeaderChanged)) for e in effects)
    assert (c.role, c.epoch, c.leader_id, c.election, c.leader_resigned, c.fetch_deadline) == before


def test_a_forged_begin_quorum_epoch_moves_no_voter():
    """A BeginQuorumEpoch comes from a leader that could have won its epoch: one epoch after the
    voter's (or in it), and none while the voter hears a live leader (as KIP-996 refuses Votes).
    One forged at the largest epoch left every voter following a leader that never was, with no
    epoch left to elect a real one in."""
    c = following()  # node 3, following 1 in epoch 1
    for leader, epoch in ((2, MAX_EPOCH), (1, MAX_EPOCH), (2, 3), (2, 2)):
        refused(c, 53, begin(leader, epoch, voter=3))
    assert c.role is Role.FOLLOWER and c.leader_id == 1 and c.epoch == 1
    leader = leader_of([1], epoch=2)
    refused(leader, 53, begin(2, MAX_EPOCH))
    refused(leader, 53, begin(2, 3))
    assert leader.role is Role.LEADER and leader.epoch == 2
    c = core(election=ElectionState(3, -1, -1))  # no leader known: one epoch ahead at most
    for epoch in (5, MAX_EPOCH):
        refused(c, 53, begin(2, epoch))
    body, _ = call(c, 53, 1, begin(2, 4))
    assert part(body).error_code == 0 and c.role is Role.FOLLOWER and (c.leader_id, c.epoch) == (2, 4)
    c = core(election=ElectionState(5, -1, 2))  # the candidate it voted for won
    body, _ = call(c, 53, 1, begin(2, 5))
    assert part(body).error_code == 0 and (c.leader_id, c.epoch) == (2, 5)
    c = following()
    body, _ = call(c, 53, 1, begin(2, 2, voter=3), now=c.fetch_deadline)  # its leader went silent
    assert part(body).error_code == 0 and c.role is Role.FOLLOWER and (c.leader_id, c.epoch) == (2, 2)


def test_a_forged_end_quorum_epoch_changes_nothing():
    """EndQuorumEpoch is the current leader resigning its current epoch: from anyone else, or
    for another epoch, it is refused and changes nothing (a later epoch used to be taken)."""
    c = following()  # node 3, following 1 in epoch 1
    for leader, epoch in ((2, 1), (2, MAX_EPOCH), (1, MAX_EPOCH), (1, 2)):
        refused(c, 54, end(leader, epoch))
    leader = leader_of([1], epoch=2)
    refused(leader, 54, end(2, 2))
    refused(leader, 54, end(2, MAX_EPOCH))
    c = core(election=ElectionState(3, -1, -1))
    for leader, epoch in ((2, 3), (2, 4), (2, MAX_EPOCH)):
        refused(c, 54, end(leader, epoch))
    c = following()
    deadline = c.fetch_deadline
    body, _ = call(c, 54, 1, end(1, 1), now=13)  # its leader resigns: it stands soon
    assert part(body).error_code == 0 and c.leader_resigned and c.fetch_deadline < deadline and c.epoch == 1


def test_a_resigning_leader_is_succeeded_in_the_next_epoch():
    """The checks on BeginQuorumEpoch and EndQuorumEpoch leave real elections alone: a leader
    that resigns is succeeded in the next epoch, and every voter follows the new leader."""
    from raft_sim import Simulation

    sim = Simulation(11, voters=3)
    sim.check_liveness(30_000)
    for _ in range(2):
        old = next(n for n in sim.nodes.values() if n.core.role is Role.LEADER)
        epoch = old.core.epoch
        sim._apply(old, old.core.resign(sim.now))
        sim._schedule_tick(old)
        sim.check_liveness(30_000)
        new = next(n.core for n in sim.nodes.values() if n.core.role is Role.LEADER)
        assert new.epoch == epoch + 1 and new.node_id != old.node_id
        assert all(n.core.epoch == new.epoch and n.core.leader_id == new.node_id for n in sim.nodes.values())


def dynamic_leader(voters: tuple = VOTERS[:1]) -> RaftCore:
    """Node 1 leading a KIP-853 quorum of `voters`, its epoch committed."""
    sid = OffsetAndEpoch(0, 0)
    snapshot = (sid, build_snapshot(sid, [], kraft_version=1, voters=list(voters), last_contained_timestamp=0))
    c = RaftCore(QuorumConfig(node_id=1, voters=(), cluster_id="c1"), rng=random.Random(0), snapshot=snapshot)
    c.start(0)
    if len(voters) > 1:
        c._become_candidate([])
        c.granted.update(v.voter_id for v in voters)
        c._become_leader([])
    for v in voters[1:]:
        call(c, FETCH, 17, fetch(v.voter_id, epoch=c.epoch, offset=c.log.end_offset, last_epoch=c.epoch), now=5)
    c.on_flushed(c.log.end_offset, c.flush_generation, 5)
    assert c.role is Role.LEADER and c.high_watermark > c.epoch_start_offset
    return c


def add_voter(voter: int, port: int) -> dict:
    return {"cluster_id": "c1", "timeout_ms": 5000, "voter_id": voter, "voter_directory_id": None,
            "listeners": [{"name": "CONTROLLER", "host": "127.0.0.1", "port": port}]}


def test_add_voter_asks_the_new_voter_for_api_versions_first():
    """KIP-853: Kafka's leader sends ApiVersions to the new voter's endpoint and wants it caught
    up before it appends the VotersRecord. A stranger that fetched as observer 77 and named a
    dead port left a --standalone quorum of two voters, one of them nobody, without a leader."""
    c = dynamic_leader()
    for now in range(10, 30):  # a stranger fetching as observer 77, caught up
        call(c, FETCH, 17, fetch(77, epoch=c.epoch, offset=c.log.end_offset, last_epoch=c.epoch), now=now)
    _, effects = call(c, ADD_RAFT_VOTER, 0, add_voter(77, 1), now=30)
    probe = [e for e in effects if isinstance(e, fx.Send)]
    assert [(e.dest, e.api_key, e.address) for e in probe] == [(77, 18, ("127.0.0.1", 1))]
    assert c.voters.ids == {1} and not any(isinstance(e, (fx.Respond, fx.AppendLog)) for e in effects)
    answers = [e for e in c.request_failed(probe[0].request_id, 31, unreachable=True) if isinstance(e, fx.Respond)]
    assert answers[0].body["error_code"] == int(ErrorCode.REQUEST_TIMED_OUT) and c.voters.ids == {1}
    # one that answers without kraft.version 1 is refused too (Kafka: INVALID_REQUEST)
    _, effects = call(c, ADD_RAFT_VOTER, 0, add_voter(77, 2), now=32)
    rid = next(e.request_id for e in effects if isinstance(e, fx.Send))
    answers = [e for e in c.handle_response(rid, {"error_code": 0, "supported_features": []}, 33)
               if isinstance(e, fx.Respond)]
    assert answers[0].body["error_code"] == 42 and c.voters.ids == {1}
    # a reachable, caught-up controller is added
    _, effects = call(c, ADD_RAFT_VOTER, 0, add_voter(77, 3), now=34)
    rid = next(e.request_id for e in effects if isinstance(e, fx.Send))
    features = [{"name": "kraft.version", "min_version": 0, "max_version": 1}]
    c.handle_response(rid, {"error_code": 0, "supported_features": features}, 35)
    assert c.voters.ids == {1, 77}


def test_add_voter_refuses_a_lagging_observer_and_remove_voter_repairs_a_lost_voter():
    c = dynamic_leader(VOTERS)
    call(c, FETCH, 17, fetch(4, epoch=c.epoch, offset=0, last_epoch=0), now=6)  # far behind
    body, effects = call(c, ADD_RAFT_VOTER, 0, add_voter(4, 9094), now=7)
    assert body.error_code == int(ErrorCode.REQUEST_TIMED_OUT) and "lagging" in body.error_message
    assert not any(isinstance(e, fx.Send) and e.api_key == 18 for e in effects)
    # voter 3 is gone for good: the two left remove it and the quorum goes on without it
    c.handle_request("remove", -1, 81, 0, {"cluster_id": "c1", "voter_id": 3, "voter_directory_id": None}, 8)
    assert c.voters.ids == {1, 2}
    c.on_flushed(c.log.end_offset, c.flush_generation, 9)
    effects = c.handle_request("fetch", 2, FETCH, 17, fetch(2, epoch=c.epoch, offset=c.log.end_offset,
                                                            last_epoch=c.epoch), 10)
    removed = [e.body for e in effects if isinstance(e, fx.Respond) and e.api_key == 81]
    assert removed and removed[0]["error_code"] == 0 and c.high_watermark == c.log.end_offset
