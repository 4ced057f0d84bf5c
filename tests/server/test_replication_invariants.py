"""The replication invariants, in process and each in a fraction of a second: a leader's
ReplicaManager over a real log, its Fetch handler through the protocol codec, and a follower's
replica fetcher against a leader that answers as the test says.

Each test fails when the check it pins is removed: scripts/mutation-check removes them one at a
time in a copy of the tree and runs these tests against it."""

from __future__ import annotations

import asyncio
import functools
import uuid
from types import SimpleNamespace

import pytest

from strom.controller import elections
from strom.controller.elections import LeaderAndIsr
from strom.log import Log, LogConfig, LogManager
from strom.metadata.model import NO_LEADER, PartitionState
from strom.protocol import messages
from strom.protocol.errors import ErrorCode
from strom.protocol.fetch import FLEXIBLE_FROM, MAX_VERSION
from strom.protocol.records import build_batch
from strom.replication.fetch_session import FetchSessionCache
from strom.replication.partition import Partition
from strom.replication.replica_fetcher import ReplicaFetcher, ReplicaFetcherManager
from strom.replication.replica_manager import ProduceResult, ReplicaManager
from strom.security.authorizer import (
    ALLOW,
    CLUSTER,
    CLUSTER_ACTION,
    CLUSTER_NAME,
    LITERAL,
    READ,
    TOPIC,
    Authorizer,
)
from strom.server.apis.fetch import handle_fetch
from strom.server.log_services import LogServices

LEADER, FOLLOWER, OTHER = 0, 1, 2
EPOCH = 5
TOPIC_NAME = "t"
TP = (TOPIC_NAME, 0)
FETCH = 1


def records(count: int, base_offset: int = 0) -> bytearray:
    return bytearray(build_batch([(b"k", b"v")] * count, base_offset=base_offset))


def host_leader(directory, replicas: list[int], isr: list[int], config: LogConfig | None = None,
                index: int = 0, rm: ReplicaManager | None = None,
                epoch: int = EPOCH) -> tuple[ReplicaManager, Partition]:
    """A ReplicaManager leading TOPIC_NAME-`index` in `epoch` over a real log; the ISR changes
    it asks for are kept in `rm.proposed`."""
    if rm is None:
        rm = ReplicaManager(LEADER, log_manager=None)
        rm.proposed = []
        rm.alter_isr = lambda _partition, isr: rm.proposed.append(isr)
    log = Log.open(directory / f"{TOPIC_NAME}-{index}", config or LogConfig())
    partition = Partition(TOPIC_NAME, index, uuid.uuid4(), LEADER, log)
    partition.make_leader(epoch, replicas, isr)
    rm._host(partition)
    return rm, partition


def close_logs(rm: ReplicaManager) -> None:
    for partition in rm.partitions.values():
        partition.log.close()


def write(rm: ReplicaManager, count: int, tp=TP) -> int:
    """An acks=all produce's append; returns the log end offset after it."""
    result = rm.append_records(-1, [(tp, records(count))])[tp]
    assert result.error == ErrorCode.NONE
    return result.end_offset


def follower_fetch(rm: ReplicaManager, replica: int, offset: int, tp=TP) -> None:
    rm.read(tp, offset, 1 << 20, True, replica_id=replica)


async def replicated(rm: ReplicaManager, end: int, timeout_s: float) -> ErrorCode:
    """What an acks=all produce whose append ended at `end` is answered."""
    result = ProduceResult(end_offset=end)
    await rm.await_replication({TP: result}, -1, timeout_s)
    return result.error


# -- 1. acks=all answers once the high watermark passes the write --------------------------------

def test_acks_all_answers_only_once_the_isr_has_the_write(tmp_path):
    """ISR [0, 1], min.insync.replicas=2: the write times out while the follower has not
    fetched it, is acknowledged as soon as the follower fetches past it; one the follower fetched
    fails with NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR shrank to the leader alone before
    the producer was answered; and with the ISR that small the high watermark no longer moves
    (KIP-966)."""
    rm, partition = host_leader(tmp_path, [LEADER, FOLLOWER], [LEADER, FOLLOWER],
                                LogConfig(min_insync_replicas=2))

    async def scenario():
        first = write(rm, 3)
        assert await replicated(rm, first, 0.05) == ErrorCode.REQUEST_TIMED_OUT
        waiting = asyncio.create_task(replicated(rm, first, 5))
        follower_fetch(rm, FOLLOWER, 2)  # not yet the whole write
        await asyncio.sleep(0.05)
        assert not waiting.done()
        follower_fetch(rm, FOLLOWER, 3)
        assert await asyncio.wait_for(waiting, 1) == ErrorCode.NONE

        second = write(rm, 2)
        waiting = asyncio.create_task(replicated(rm, second, 5))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        follower_fetch(rm, FOLLOWER, 5)  # the high watermark covers the write ...
        rm.isr_changed(partition, [LEADER], partition.partition_epoch + 1)  # ... the follower leaves before
        assert partition.high_watermark == 5                               # the producer is answered
        assert await asyncio.wait_for(waiting, 1) == ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND

        # With the ISR that small an acks=all write is refused, and one with acks=1, which the ISR
        # alone has, stays above the high watermark.
        assert rm.append_records(-1, [(TP, records(1))])[TP].error == ErrorCode.NOT_ENOUGH_REPLICAS
        assert rm.append_records(1, [(TP, records(2))])[TP].error == ErrorCode.NONE
        assert (partition.log.log_end_offset, partition.high_watermark) == (7, 5)

    try:
        asyncio.run(scenario())
    finally:
        close_logs(rm)


# -- 2. a follower's Fetch needs CLUSTER_ACTION ------------------------------------------------

def acl(principal: str, operation: int, resource_type: int, name: str) -> SimpleNamespace:
    return SimpleNamespace(principal=principal, host="*", operation=operation, permission_type=ALLOW,
                           resource_type=resource_type, pattern_type=LITERAL, resource_name=name)


class AuthorizingLeader:
    """Leader of t-0 (ISR [0, 1], the follower at offset 0: high watermark 0 of 3) and t-1
    (replicas [0, 1], ISR [0]: the follower out of it), under an authorizer where User:alice may
    read the topic and User:broker may act as the cluster."""

    def __init__(self, directory) -> None:
        self.rm, self.in_isr = host_leader(directory, [LEADER, FOLLOWER], [LEADER, FOLLOWER])
        _, self.out_of_isr = host_leader(directory, [LEADER, FOLLOWER], [LEADER], index=1, rm=self.rm)
        for p in (self.in_isr, self.out_of_isr):
            write(self.rm, 3, (p.topic, p.index))
        self.topic_id = self.in_isr.topic_id
        authorizer = Authorizer(None, "", False)
        authorizer.replace_acls([acl("User:alice", READ, TOPIC, TOPIC_NAME),
                                 acl("User:broker", CLUSTER_ACTION, CLUSTER, CLUSTER_NAME)])
        self.broker = SimpleNamespace(
            replica_manager=self.rm, fetch_sessions=FetchSessionCache(10), authorizer=authorizer,
            stopping=False, endpoints=lambda _listener: [],
            metadata_cache=SimpleNamespace(names_by_id={self.topic_id: TOPIC_NAME},
                                           topics={TOPIC_NAME: SimpleNamespace(topic_id=self.topic_id)},
                                           partition=lambda _t, _p: None))

    def state(self) -> tuple:
        return tuple((p.high_watermark, p.isr, p.pending_isr) for p in (self.in_isr, self.out_of_isr)) + (
            tuple(self.rm.proposed),)

    async def fetch(self, version: int, principal: str, replica_id: int) -> dict:
        """A Fetch of both partitions from offset 3 (the log end), through the codec to the
        handler and back; the answers by partition."""
        frame = messages.encode_request(FETCH, version, {
            "replica_id": replica_id, "replica_state": {"replica_id": replica_id, "replica_epoch": -1},
            "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
            "topics": [{"topic": TOPIC_NAME, "topic_id": self.topic_id, "partitions": [
                {"partition": i, "current_leader_epoch": EPOCH, "fetch_offset": 3, "last_fetched_epoch": -1,
                 "log_start_offset": -1, "partition_max_bytes": 1 << 20} for i in (0, 1)]}]})
        parsed = messages.parse_request(frame[4:])
        ctx = SimpleNamespace(header=parsed.header, principal=principal, client="10.0.0.9:5000",
                              listener="PLAINTEXT")
        raw = await handle_fetch(self.broker, ctx, parsed.body)
        head = b"\0\0\0\1" + (b"\0" if version >= FLEXIBLE_FROM else b"")
        body = b"".join(p if isinstance(p, bytes | bytearray) else p.read_bytes() for p in raw.parts)
        _, response = messages.decode_response(FETCH, version, head + body)
        assert response.error_code == ErrorCode.NONE
        return {p.partition_index: p for t in response.responses for p in t.partitions}


@pytest.mark.parametrize("version", range(4, MAX_VERSION + 1))
def test_a_follower_fetch_without_cluster_action_is_refused_and_changes_nothing(tmp_path, version):
    leader = AuthorizingLeader(tmp_path)
    before = leader.state()
    assert before == ((0, [LEADER, FOLLOWER], None), (3, [LEADER], None), ())

    async def scenario():
        # alice may read the topic as a consumer, but not replicate it
        answers = await leader.fetch(version, "User:alice", FOLLOWER)
        assert {i: a.error_code for i, a in answers.items()} == {
            0: ErrorCode.CLUSTER_AUTHORIZATION_FAILED, 1: ErrorCode.CLUSTER_AUTHORIZATION_FAILED}
        assert not any(a.records for a in answers.values())
        assert leader.state() == before
        consumed = await leader.fetch(version, "User:alice", -1)
        assert consumed[0].error_code == ErrorCode.NONE and not consumed[0].records  # hw 0: nothing to read
        assert leader.state() == before
        # The same fetch from a principal that may act as the cluster is a follower's.
        replicated = await leader.fetch(version, "User:broker", FOLLOWER)
        assert {i: a.error_code for i, a in replicated.items()} == {0: ErrorCode.NONE, 1: ErrorCode.NONE}
        assert leader.in_isr.high_watermark == 3 and leader.rm.proposed == [[LEADER, FOLLOWER]]

    try:
        asyncio.run(scenario())
    finally:
        close_logs(leader.rm)


# -- 3. a follower rejoins the ISR only once caught up to the high watermark -------------------

def test_a_follower_is_proposed_for_the_isr_only_from_the_high_watermark(tmp_path):
    rm, partition = host_leader(tmp_path, [LEADER, FOLLOWER, OTHER], [LEADER, OTHER])
    try:
        write(rm, 3)
        follower_fetch(rm, OTHER, 3)
        write(rm, 2)
        assert (partition.high_watermark, partition.log.log_end_offset) == (3, 5)
        follower_fetch(rm, FOLLOWER, 2)  # below the high watermark
        assert rm.proposed == [] and partition.pending_isr is None
        follower_fetch(rm, FOLLOWER, 3)  # at it, though short of the log end
        assert rm.proposed == [[LEADER, OTHER, FOLLOWER]]
    finally:
        close_logs(rm)


# -- the follower's side: a replica fetcher against a leader that answers as told --------------

class FakeConfig(dict):
    """The broker configs a follower reads, by key, and no cordoned log dirs (KIP-1066)."""

    cordoned_log_dirs: tuple = ()


class FollowerBroker:
    """Broker FOLLOWER following t-0 from LEADER in EPOCH, its log in a real LogManager."""

    broker_id = FOLLOWER
    config = FakeConfig({"replica.fetch.backoff.ms": 1000, "num.replica.fetchers": 1,
              "follower.replication.throttled.rate": 2**63 - 1, "replica.fetch.max.bytes": 1 << 20,
              "replica.fetch.wait.max.ms": 0, "replica.fetch.min.bytes": 1,
              "replica.fetch.response.max.bytes": 10 << 20, "replica.lag.time.max.ms": 30000})

    def __init__(self, directory, checkpointed_hw: int | None = None) -> None:
        self.log_manager = LogManager([directory], LogConfig())
        self.log_manager.startup(FOLLOWER)
        self.replica_manager = ReplicaManager(FOLLOWER, self.log_manager)
        if checkpointed_hw is not None:
            self.replica_manager.checkpointed_hw[TP] = checkpointed_hw
        self.log_services = LogServices(self)  # what writes the high-watermark checkpoint
        self.partition = self.replica_manager.become_leader_or_follower(
            TOPIC_NAME, 0, uuid.uuid4(), LEADER, EPOCH, [LEADER, FOLLOWER], [LEADER, FOLLOWER], LogConfig())

    def write_epochs(self, *counts: tuple[int, int]) -> None:
        """Give the log `count` records in each (leader epoch, count), as a leader would have."""
        partition = self.partition
        for epoch, count in counts:
            partition.make_leader(epoch, [FOLLOWER], [FOLLOWER])
            partition.append_records_to_leader(records(count), 1, 1)
        partition.make_follower(LEADER, EPOCH, [LEADER, FOLLOWER], [LEADER, FOLLOWER])

    def close(self) -> None:
        self.log_manager.shutdown()


class AnsweringLeader:
    """Answers each Fetch with `answer` for t-0 (fields of a FetchResponse partition)."""

    def __init__(self, **answer) -> None:
        self.answer = {"partition_index": 0, "error_code": 0, "high_watermark": 0, "log_start_offset": 0,
                       "diverging_epoch": None, "records": None, **answer}
        self.requests: list[dict] = []

    async def call(self, _api_key, _version, fields, timeout_s=None):
        self.requests.append(fields)
        return SimpleNamespace(error_code=0, session_id=0, responses=[
            SimpleNamespace(topic=TOPIC_NAME, partitions=[SimpleNamespace(**self.answer)])])

    def close(self) -> None:
        pass


def fetch_once(broker: FollowerBroker, leader: AnsweringLeader) -> None:
    """One fetch of the follower's replica fetcher, its divergence already settled."""
    async def main():
        fetcher = ReplicaFetcher(ReplicaFetcherManager(broker), leader_id=LEADER, index=0)
        fetcher.task.cancel()  # the test drives it
        fetcher.conn = leader
        fetcher.add(broker.partition)
        fetcher.partitions[TP].truncating = False
        fetcher.truncating.clear()
        await fetcher._fetch()
        fetcher.conn = None

    asyncio.run(main())
    assert len(leader.requests) == 1


# -- 4. a follower's high watermark never passes its own log end -------------------------------

def test_a_follower_takes_the_leaders_high_watermark_only_up_to_its_log_end(tmp_path):
    broker = FollowerBroker(tmp_path)
    try:
        broker.write_epochs((1, 5))
        partition = broker.partition
        fetch_once(broker, AnsweringLeader(high_watermark=10))
        assert (partition.log.log_end_offset, partition.high_watermark) == (5, 5)
        broker.log_manager.checkpoint_high_watermarks()
        assert broker.log_manager.read_high_watermarks() == {TP: 5}
    finally:
        broker.close()


def test_a_checkpointed_high_watermark_past_the_log_end_is_held_to_it(tmp_path):
    """A checkpoint that names more than the log holds (its tail lost in a crash) is not taken
    as it is: the replica's high watermark, and so its next checkpoint, stop at its log end."""
    broker = FollowerBroker(tmp_path / "a", checkpointed_hw=10)
    try:
        assert (broker.partition.log.log_end_offset, broker.partition.high_watermark) == (0, 0)
        broker.log_manager.checkpoint_high_watermarks()
        assert broker.log_manager.read_high_watermarks() == {TP: 0}
    finally:
        broker.close()


# -- 5. a Fetch answer's diverging epoch: truncate, append nothing of it -----------------------

def test_a_diverging_epoch_in_a_fetch_answer_truncates_and_appends_none_of_it(tmp_path):
    """The follower has epoch 1 at 0-2 and epoch 2 at 3-4; the leader says its log left the
    follower's after epoch 1, at offset 3, and sends records too: the follower truncates to 3
    and keeps none of them."""
    broker = FollowerBroker(tmp_path)
    try:
        broker.write_epochs((1, 3), (2, 2))
        log = broker.partition.log
        assert (log.log_end_offset, log.leader_epoch_cache.latest_epoch()) == (5, 2)
        leader = AnsweringLeader(high_watermark=3, diverging_epoch=SimpleNamespace(epoch=1, end_offset=3),
                                 records=bytes(records(2, base_offset=5)))
        fetch_once(broker, leader)
        sent = leader.requests[0]["topics"][0]["partitions"][0]
        assert (sent["fetch_offset"], sent["last_fetched_epoch"]) == (5, 2)
        assert (log.log_end_offset, log.leader_epoch_cache.latest_epoch()) == (3, 1)
    finally:
        broker.close()


def test_a_diverging_epoch_at_the_log_end_drops_the_epoch_the_leader_lacks(tmp_path):
    """The follower led epoch 2 and wrote nothing in it before the leader took over again (a
    preferred election after a restart); the leader's log has no epoch 2 and answers the
    follower's fetch at its end with the epoch before it, ending right there. Nothing is to be
    removed, yet the follower's next fetch must name epoch 1, or the leader answers the same
    divergence at every fetch and the follower never again fetches or rejoins the ISR."""
    broker = FollowerBroker(tmp_path)
    try:
        broker.write_epochs((1, 3))
        log = broker.partition.log
        log.assign_leader_epoch(2, 3)
        diverging = SimpleNamespace(epoch=1, end_offset=3)
        leader = AnsweringLeader(high_watermark=3, diverging_epoch=diverging)
        fetch_once(broker, leader)
        sent = leader.requests[0]["topics"][0]["partitions"][0]
        assert (sent["fetch_offset"], sent["last_fetched_epoch"]) == (3, 2)
        assert (log.log_end_offset, log.leader_epoch_cache.latest_epoch()) == (3, 1)
        again = AnsweringLeader(high_watermark=3)
        fetch_once(broker, again)
        sent = again.requests[0]["topics"][0]["partitions"][0]
        assert (sent["fetch_offset"], sent["last_fetched_epoch"]) == (3, 1)
    finally:
        broker.close()


def test_the_leader_answers_a_diverged_follower_with_where_to_truncate(tmp_path):
    """The leader's side of the same (KIP-320): a follower whose last epoch ends earlier on the
    leader, or is not the leader's at all, gets the epoch and end offset to truncate to and
    no records."""
    rm, partition = host_leader(tmp_path, [LEADER, FOLLOWER], [LEADER, FOLLOWER], epoch=1)
    try:
        for epoch in (1, 3, 4):  # epoch 1 at 0-2, 3 at 3-5, 4 at 6-8
            partition.make_leader(epoch, [LEADER, FOLLOWER], [LEADER, FOLLOWER])
            write(rm, 3)
        for offset, last_epoch, diverging in ((5, 2, (1, 3)), (7, 3, (3, 6))):
            result = rm.read(TP, offset, 1 << 20, True, replica_id=FOLLOWER, last_fetched_epoch=last_epoch)
            assert (result.error, result.diverging_epoch, result.records) == (ErrorCode.NONE, diverging, None)
        result = rm.read(TP, 9, 1 << 20, True, replica_id=FOLLOWER, last_fetched_epoch=4)
        assert result.diverging_epoch is None
    finally:
        close_logs(rm)


# -- a follower that stops fetching a partition says so -----------------------------------------

def test_a_partition_refused_for_longer_than_the_lag_time_is_stalled_and_logged(tmp_path, caplog):
    """The follower's own view: a partition its leader keeps refusing (or answering with a
    divergence) is not fetched; past replica.lag.time.max.ms it counts as stalled, the fetcher
    logs it once, and the first answer without a problem ends it."""
    broker = FollowerBroker(tmp_path)
    broker.config = FakeConfig({**FollowerBroker.config, "replica.lag.time.max.ms": 20, "replica.fetch.backoff.ms": 0})
    try:
        broker.write_epochs((1, 3))

        async def main():
            manager = ReplicaFetcherManager(broker)
            fetcher = ReplicaFetcher(manager, leader_id=LEADER, index=0)
            fetcher.task.cancel()  # the test drives it
            fetcher.add(broker.partition)
            fetcher.partitions[TP].truncating = False
            fetcher.truncating.clear()
            manager.fetchers[(LEADER, 0)] = fetcher
            assert TP in fetcher.unfetched and not fetcher.stalled()  # new: not yet fetched
            for answer in ({"error_code": ErrorCode.NOT_LEADER_OR_FOLLOWER},
                           {"diverging_epoch": SimpleNamespace(epoch=1, end_offset=3)}):
                fetcher.unfetched.clear()
                fetcher.conn = AnsweringLeader(high_watermark=3, **answer)
                fetcher.partitions[TP].delayed_until = 0
                await fetcher._fetch()
                assert TP in fetcher.unfetched
                await asyncio.sleep(0.03)
                assert list(fetcher.stalled()) == [TP] and manager.stalled_partitions() == 1
                fetcher.check_stalls()
                fetcher._next_stall_warning = 0
            warnings = [r.getMessage() for r in caplog.records if "not fetched from broker" in r.getMessage()]
            assert len(warnings) == 2 and "t-0 (NOT_LEADER_OR_FOLLOWER)" in warnings[0], warnings
            assert "t-0 (diverging epoch)" in warnings[1]
            fetcher.conn = AnsweringLeader(high_watermark=3)
            fetcher._wanted = None
            await fetcher._fetch()  # carried and answered without a problem: fetched
            assert not fetcher.unfetched and not fetcher.stalled() and manager.stalled_partitions() == 0
            fetcher.conn = None
            fetcher.stopped = True

        asyncio.run(main())
    finally:
        broker.close()


def test_a_partition_the_requests_leave_out_is_stalled(tmp_path):
    """Whatever keeps a followed partition out of the fetches (a leader the partition no longer
    names, a delay that never ends) shows as stalled once it lasts, and so does a leader that
    stops answering at all."""
    broker = FollowerBroker(tmp_path)
    broker.config = FakeConfig({**FollowerBroker.config, "replica.lag.time.max.ms": 20})
    try:
        async def main():
            fetcher = ReplicaFetcher(ReplicaFetcherManager(broker), leader_id=LEADER, index=0)
            fetcher.task.cancel()
            fetcher.add(broker.partition)
            fetcher.partitions[TP].truncating = False
            fetcher.truncating.clear()
            fetcher.conn = AnsweringLeader(high_watermark=0)
            await fetcher._fetch()
            assert not fetcher.unfetched
            broker.partition.leader_id = OTHER  # moved on without this fetcher being told
            fetcher._wanted = None
            await fetcher._fetch()
            fetcher.check_stalls()
            assert fetcher.unfetched[TP][1] == f"led by broker {OTHER}"
            await asyncio.sleep(0.03)
            assert fetcher.stalled() == {TP: f"led by broker {OTHER}"}
            fetcher.unfetched.clear()
            fetcher.last_answer -= 1  # nothing answered for a second
            assert fetcher.stalled() == {TP: "no answer from the leader"}
            fetcher.conn = None
            fetcher.stopped = True

        asyncio.run(main())
    finally:
        broker.close()


# -- the controller's side: who may lead -------------------------------------------------------

def partition_state(leader: int, isr: list[int], replicas: tuple[int, ...] = (1, 2, 3)) -> PartitionState:
    return PartitionState(leader=leader, leader_epoch=7, isr=isr, replicas=list(replicas), zk_version=3)


def test_a_failed_leader_is_replaced_from_the_isr_only_unless_unclean_election_is_on():
    state = partition_state(1, [1, 3])  # 2 is live but out of sync
    live = {2, 3}
    assert elections.elect_offline(state, live, set(), lambda: False) == LeaderAndIsr(3, [3])
    state = partition_state(1, [1])
    assert elections.elect_offline(state, live, set(), lambda: False) == LeaderAndIsr(NO_LEADER, [1])
    assert elections.elect_offline(state, live, set(), lambda: True) == LeaderAndIsr(2, [2], unclean=True)


def test_elect_leaders_moves_leadership_only_to_an_in_sync_replica():
    live = {1, 2, 3}
    preferred_out_of_sync = partition_state(2, [2, 3])
    refused = elections.elect_on_demand("t", 0, preferred_out_of_sync, elections.PREFERRED, live, set())
    assert not isinstance(refused, LeaderAndIsr) and refused[0] == ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE
    assert elections.elect_on_demand("t", 0, partition_state(2, [1, 2]), elections.PREFERRED, live, set()) == \
        LeaderAndIsr(1, [1, 2])
    # An unclean ElectLeaders still takes an in-sync replica when one is live.
    leaderless = partition_state(NO_LEADER, [3])
    assert elections.elect_on_demand("t", 0, leaderless, elections.UNCLEAN, {2, 3}, set()) == LeaderAndIsr(3, [3])
    assert elections.elect_on_demand("t", 0, leaderless, elections.UNCLEAN, {2}, set()) == \
        LeaderAndIsr(2, [2], unclean=True)


def test_an_isr_change_from_a_past_leader_epoch_is_fenced():
    state = partition_state(1, [1, 2])
    check = functools.partial(elections.check_alter_partition, state, False, 1, partition_epoch=3,
                              new_isr=[1], live={1, 2, 3}, shutting_down=set())
    assert check(leader_epoch=7) == ErrorCode.NONE
    assert check(leader_epoch=6) == ErrorCode.FENCED_LEADER_EPOCH


# -- known gaps -----------------------------------------------------------------------------------

def test_a_follower_rejoins_only_once_it_has_the_leaders_epoch_start(tmp_path):
    """A new leader's high watermark may lag its log end (5 of 10 here: ISR member 2 has not
    fetched from it yet), and the previous leader may have acknowledged offsets up to 10. A
    follower at 6 has the high watermark but not those offsets: in the ISR, its election would
    lose them. Kafka adds it only once it has reached the epoch's start offset (10)."""
    log = Log.open(tmp_path / f"{TOPIC_NAME}-0", LogConfig())
    log.append(records(10), leader_epoch=4)
    rm = ReplicaManager(LEADER, log_manager=None)
    rm.proposed = []
    rm.alter_isr = lambda _partition, isr: rm.proposed.append(isr)
    partition = Partition(TOPIC_NAME, 0, uuid.uuid4(), LEADER, log, high_watermark=5)
    partition.make_leader(EPOCH, [LEADER, FOLLOWER, OTHER], [LEADER, OTHER])
    rm._host(partition)
    try:
        assert (partition.high_watermark, partition.log.log_end_offset) == (5, 10)
        follower_fetch(rm, FOLLOWER, 6)
        assert rm.proposed == []
        follower_fetch(rm, FOLLOWER, 10)
        assert rm.proposed == [[LEADER, OTHER, FOLLOWER]]
    finally:
        log.close()
