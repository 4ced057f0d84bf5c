"""Eligible leader replicas (KIP-966): the partition change rules both controllers share
(controller/elections.py), and what the quorum controller writes for them on a one-voter
quorum over real files: the ELR as the ISR shrinks below min.insync.replicas, an empty ISR, an
election from the ELR, a broker that comes back after an unclean shutdown leaving the ELR, the
fields in the records and the image (and its snapshot). The controller listener's AlterPartition
and ElectLeaders take min.insync.replicas from the controller's own config. A KRaft broker's
side of the clean-shutdown rule: the broker epoch in the clean-shutdown markers, and the
BrokerLifecycleManager's PreviousBrokerEpoch and (KIP-1066) cordoned dirs."""

from __future__ import annotations

import asyncio
import json
import uuid
from types import SimpleNamespace

import pytest
from one_voter import FEATURES as ONE_VOTER_FEATURES
from one_voter import start_controller

from strom.config.broker import Listener, load
from strom.controller import cluster_control, elections, replication_control
from strom.controller.elections import ElrPolicy, LeaderAndIsr
from strom.controller.features import ELR_VERSION, SUPPORTED
from strom.controller.quorum_controller import QuorumController
from strom.controller.replication_control import Change, Limits, NewTopic
from strom.log.config import LogConfig
from strom.log.manager import CLEAN_SHUTDOWN_FILE, LogManager, write_properties
from strom.metadata import records as r
from strom.metadata.image import (
    TOPIC_RESOURCE,
    MetadataImage,
    merge_change,
    partition_record,
    partition_state,
)
from strom.metadata.model import PartitionState
from strom.metadata.storage import META_PROPERTIES, MetaProperties, kafka_uuid
from strom.server.kraft import lifecycle
from strom.server.kraft.controller_apis import ControllerApis
from strom.server.kraft.lifecycle import (
    BrokerLifecycleManager,
    read_clean_shutdown_epoch,
    write_clean_shutdown_epoch,
)

ON = ElrPolicy(True, 2)
NEVER = lambda: False  # noqa: E731  (unclean.leader.election.enable off)


def _state(leader, isr, replicas=(1, 2, 3), elr=(), last_known=()) -> PartitionState:
    return PartitionState(leader, 5, list(isr), list(replicas), elr=list(elr), last_known_elr=list(last_known))


# --- the rules ----------------------------------------------------------------------------------

def test_the_elr_follows_the_isr_below_min_isr():
    full = _state(1, [1, 2, 3])
    assert elections.next_elr(full, 1, [1, 2], ON) == ([], [])  # still at min ISR: nothing kept
    assert elections.next_elr(_state(1, [1, 2]), 1, [1], ON) == ([2], [])
    # A replica back in the ISR leaves the ELR; the ISR at min ISR again clears it.
    assert elections.next_elr(_state(1, [1], elr=[2, 3]), 1, [1, 3], ON) == ([], [])
    assert elections.next_elr(_state(1, [1], elr=[2, 3]), 1, [1], ElrPolicy(True, 3)) == ([2, 3], [])
    # Off (or an unclean election): nothing kept, whatever was.
    assert elections.next_elr(_state(1, [1, 2], elr=[3]), 1, [1], elections.ELR_OFF) == ([], [])
    assert elections.next_elr(_state(1, [1], elr=[2]), 3, [3], ON, unclean=True) == ([], [])
    # Who shut down uncleanly never joins.
    assert elections.next_elr(_state(1, [1, 2]), 1, [1], ON, unclean_shutdown={2}) == ([], [])


def test_the_last_isr_member_gone_empties_the_isr_and_an_elr_member_leads():
    # Broker 2 left the ISR cleanly below min ISR; now leader 1 (the last ISR member) dies.
    state = _state(1, [1], elr=[2])
    offline = elections.elect_offline(state, live={3}, shutting_down=set(), unclean_allowed=NEVER, policy=ON)
    assert offline == LeaderAndIsr(-1, [], False, [2, 1], [1])
    # Without ELRs the partition keeps its last ISR and waits for broker 1.
    assert elections.elect_offline(state, {3}, set(), NEVER) == LeaderAndIsr(-1, [1])

    leaderless = _state(-1, [], elr=[2, 1], last_known=[1])
    back = elections.elect_offline(leaderless, live={2, 3}, shutting_down=set(), unclean_allowed=NEVER, policy=ON)
    assert back == LeaderAndIsr(2, [2], False, [1], [])  # an ELR member leads, alone in the ISR
    assert elections.elect_offline(leaderless, {3}, set(), NEVER, policy=ON) is None  # 3 is not eligible
    unclean = elections.elect_offline(leaderless, {3}, set(), lambda: True, policy=ON)
    assert unclean == LeaderAndIsr(3, [3], True, [], [])


def test_an_unclean_shutdown_leaves_the_elr_and_the_last_known_leader_comes_last():
    leaderless = _state(-1, [], elr=[2, 1], last_known=[1])
    assert elections.forget_unclean(leaderless, 1, {3}, set(), NEVER, ON) == LeaderAndIsr(-1, [], False, [2], [1])
    only_known = _state(-1, [], elr=[], last_known=[1])
    # With no ISR or ELR member left, the last known leader leads once it is back (unclean).
    assert elections.elect_offline(only_known, {1, 3}, set(), NEVER, policy=ON) == LeaderAndIsr(1, [1])
    assert elections.elect_offline(only_known, {3}, set(), NEVER, policy=ON) is None
    assert elections.forget_unclean(_state(1, [1, 2]), 3, {1, 2}, set(), NEVER, ON) is None  # in neither


def test_elect_leaders_unclean_prefers_an_elr_member():
    leaderless = _state(-1, [], elr=[3], last_known=[1])
    chosen = elections.elect_on_demand("t", 0, leaderless, elections.UNCLEAN, {2, 3}, set(), ON)
    assert chosen == LeaderAndIsr(3, [3], False, [], [])
    chosen = elections.elect_on_demand("t", 0, leaderless, elections.UNCLEAN, {2}, set(), ON)
    assert chosen.leader == 2 and chosen.unclean and chosen.elr == []


def test_records_carry_the_elr_fields():
    topic_id = uuid.uuid4()
    state = _state(-1, [], elr=[2, 1], last_known=[1])
    rec = r.decode(r.encode(partition_record(topic_id, 0, state)))
    assert partition_state(rec).elr == [2, 1] and partition_state(rec).last_known_elr == [1]
    change = replication_control.change_record(topic_id, 0, state, leader=2, isr=[2], elr=[1], last_known_elr=[])
    merged = merge_change(state, r.decode(r.encode(change)))
    assert (merged.leader, merged.isr, merged.elr, merged.last_known_elr) == (2, [2], [1], [])
    untouched = replication_control.change_record(topic_id, 0, state, isr=[])
    assert merge_change(state, r.decode(r.encode(untouched))).elr == [2, 1]  # absent: unchanged
    assert SUPPORTED[ELR_VERSION].default_level == 1


def test_a_clean_shutdown_is_the_epoch_the_broker_had():
    from strom.controller.cluster_control import BrokerSession, shut_down_cleanly

    existing = SimpleNamespace(epoch=40)
    assert shut_down_cleanly(existing, SimpleNamespace(previous_broker_epoch=40), None)
    assert not shut_down_cleanly(existing, SimpleNamespace(previous_broker_epoch=39), None)
    assert not shut_down_cleanly(existing, SimpleNamespace(previous_broker_epoch=-1), BrokerSession(0, 40))
    # Let go after a controlled shutdown is not enough: the epoch in its markers says it.
    assert not shut_down_cleanly(existing, SimpleNamespace(previous_broker_epoch=-1), BrokerSession(0, 40, let_go=True))
    assert not shut_down_cleanly(None, SimpleNamespace(previous_broker_epoch=40), None)


def test_zookeeper_state_node_keeps_the_elr():
    from strom.controller.controller import _partition_state

    state = _state(-1, [], elr=[2, 1], last_known=[1])
    encoded = state.encode()
    assert encoded["eligible_leader_replicas"] == [2, 1] and encoded["last_known_elr"] == [1]
    assert "eligible_leader_replicas" not in _state(1, [1, 2, 3]).encode()  # Kafka's node otherwise
    read = _partition_state((encoded, 7), [1, 2, 3])
    assert read.elr == [2, 1] and read.last_known_elr == [1] and read.zk_version == 7


# --- the quorum controller ----------------------------------------------------------------------

FEATURES = {**ONE_VOTER_FEATURES, ELR_VERSION: 1}


async def _start(directory, limits: Limits | None = None) -> QuorumController:
    return await start_controller(directory, features=FEATURES, limits=limits)


def _registration(broker_id: int, previous_epoch: int = -1):
    return SimpleNamespace(broker_id=broker_id, cluster_id="c1", incarnation_id=uuid.uuid4(), rack=None,
                           listeners=[SimpleNamespace(name="PLAINTEXT", host="h", port=9000 + broker_id,
                                                      security_protocol=0)],
                           features=[], log_dirs=[uuid.uuid4()], previous_broker_epoch=previous_epoch)


def _heartbeat(broker_id: int, epoch: int, *, fence=False, shut_down=False):
    return SimpleNamespace(broker_id=broker_id, broker_epoch=epoch, current_metadata_offset=1 << 40,
                           want_fence=fence, want_shut_down=shut_down)


async def _join(c: QuorumController, broker_id: int, previous_epoch: int = -1) -> int:
    epoch = await c.register_broker(_registration(broker_id, previous_epoch))
    assert not (await c.heartbeat(_heartbeat(broker_id, epoch))).is_fenced
    return epoch


def test_quorum_controller_elects_from_the_elr(tmp_path):
    """RF 3, min.insync.replicas 2: broker 3 fails, broker 2 stops cleanly (the ISR is below min
    ISR: 2 is eligible), leader 1 fails (the ISR empties). Broker 2 comes back cleanly and leads;
    broker 1 comes back after an unclean shutdown and leaves the ELR."""
    async def main():
        c = await _start(tmp_path / "m")
        try:
            epochs = {b: await _join(c, b) for b in (1, 2, 3)}
            created = await c.write("create", lambda img: replication_control.create_topics(
                img, [NewTopic("t", -1, -1, {0: [1, 2, 3]}, {"min.insync.replicas": "2"})], Limits(), False))
            assert not isinstance(created["t"], Exception)

            def part() -> PartitionState:
                return c.image.topics["t"].partitions[0]

            await c.heartbeat(_heartbeat(3, epochs[3], fence=True))
            assert (part().isr, part().elr) == ([1, 2], [])
            assert not (await c.heartbeat(_heartbeat(2, epochs[2], shut_down=True))).should_shut_down
            assert (await c.heartbeat(_heartbeat(2, epochs[2], shut_down=True))).should_shut_down
            assert (part().leader, part().isr, part().elr) == (1, [1], [2])
            await c.heartbeat(_heartbeat(1, epochs[1], fence=True))
            assert (part().leader, part().isr, part().elr, part().last_known_elr) == (-1, [], [2, 1], [1])

            await _join(c, 3)  # not eligible: nothing changes but its own state
            assert (part().leader, part().elr) == (-1, [2, 1])
            epochs[2] = await _join(c, 2, previous_epoch=epochs[2])  # its epoch from the markers: clean
            assert (part().leader, part().isr, part().elr, part().last_known_elr) == (2, [2], [1], [])
            await _join(c, 1)  # no clean-shutdown epoch: it leaves the ELR before it is unfenced
            assert (part().leader, part().isr, part().elr) == (2, [2], [])

            # Leader 2 fails too: live broker 1 is in neither ISR nor ELR, so nobody leads.
            await c.heartbeat(_heartbeat(2, epochs[2], fence=True))
            assert (part().leader, part().isr, part().elr, part().last_known_elr) == (-1, [], [2], [2])
            # The snapshot's records bring the ELR back.
            image = MetadataImage()
            image.replay_values([r.encode(rec) for rec in c.image.records()])
            assert image.topics["t"].partitions[0].elr == part().elr
            assert image.topics["t"].partitions[0].last_known_elr == [2]
            # A new min.insync.replicas clears the ELRs kept for the old one.
            await c.write("min-isr", lambda img: Change(cluster_control.alter_configs(
                img, TOPIC_RESOURCE, "t", [(cluster_control.SET, "min.insync.replicas", "1")],
                lambda *_args: None, lambda _key: False)))
            assert (part().leader, part().elr, part().last_known_elr) == (-1, [], [])
        finally:
            await c.close()
            await c.driver.close()

    asyncio.run(main())


def test_alter_partition_and_elect_leaders_take_the_controllers_min_insync_replicas(tmp_path):
    """A topic without its own min.insync.replicas, on a controller whose config says 3 (its
    server.properties, through Limits): the ISR shrinking by AlterPartition keeps the replica
    that left as ELR, and a preferred election (ISR still below 3) keeps it too. With the
    default of 1 both would clear it."""
    async def main():
        c = await _start(tmp_path / "m", Limits(min_insync_default=3))
        apis = ControllerApis(None, c, c.driver)
        try:
            epochs = {b: await _join(c, b) for b in (1, 2, 3)}
            await c.write("create", lambda img: replication_control.create_topics(
                img, [NewTopic("t", -1, -1, {0: [1, 2, 3]}, {})], c.settings.limits, False))

            def part() -> PartitionState:
                return c.image.topics["t"].partitions[0]

            async def alter_isr(leader: int, isr: list[int]) -> None:
                state = part()
                p = SimpleNamespace(partition_index=0, leader_epoch=state.leader_epoch,
                                    partition_epoch=state.zk_version, new_isr=isr, leader_recovery_state=0)
                request = SimpleNamespace(broker_id=leader, broker_epoch=epochs[leader], topics=[
                    SimpleNamespace(topic_name="t", topic_id=None, partitions=[p])])
                answer = await apis._alter_partition(SimpleNamespace(header=SimpleNamespace(api_version=1)), request)
                assert answer["error_code"] == 0 and answer["topics"][0]["partitions"][0]["error_code"] == 0

            await alter_isr(1, [1, 2])  # broker 3 falls behind
            assert (part().leader, part().isr, part().elr) == (1, [1, 2], [3])
            await c.heartbeat(_heartbeat(1, epochs[1], fence=True))  # leader 1 fails: 2 leads
            assert (part().leader, part().isr, part().elr) == (2, [2], [3, 1])
            epochs[1] = await _join(c, 1, previous_epoch=epochs[1])  # back cleanly
            await alter_isr(2, [2, 1])  # caught up again: in the ISR, out of the ELR
            assert (part().leader, part().isr, part().elr) == (2, [2, 1], [3])

            request = SimpleNamespace(election_type=0, topic_partitions=[SimpleNamespace(topic="t", partitions=[0])])
            answer = await apis._elect_leaders(SimpleNamespace(header=SimpleNamespace(api_version=1)), request)
            assert answer["replica_election_results"][0]["partition_result"][0]["error_code"] == 0
            assert (part().leader, part().isr, part().elr) == (1, [2, 1], [3])
        finally:
            await c.close()
            await c.driver.close()

    asyncio.run(main())


# --- a KRaft broker's clean shutdown and heartbeats --------------------------------------------

EPOCH = 40


def _log_dirs(tmp_path, n: int) -> tuple[list, list[uuid.UUID]]:
    """`n` formatted log dirs (meta.properties with a directory.id each) and their ids."""
    dirs, ids = [], []
    for i in range(n):
        d = tmp_path / f"logs-{i}"
        d.mkdir()
        ids.append(uuid.uuid4())
        write_properties(d / META_PROPERTIES, MetaProperties(1, "c1", kafka_uuid(ids[-1])).as_props())
        dirs.append(d)
    return dirs, ids


def test_the_clean_shutdown_marker_carries_the_broker_epoch(tmp_path):
    dirs, _ = _log_dirs(tmp_path, 2)
    for d in dirs:
        (d / CLEAN_SHUTDOWN_FILE).touch()  # as the log manager's clean shutdown leaves it
    write_clean_shutdown_epoch(dirs, EPOCH)
    assert json.loads((dirs[0] / CLEAN_SHUTDOWN_FILE).read_text()) == {"version": 0, "brokerEpoch": EPOCH}
    assert read_clean_shutdown_epoch(dirs, dirs) == EPOCH
    assert read_clean_shutdown_epoch(dirs, dirs[:1]) == -1  # a dir offline: not provably clean
    (dirs[1] / CLEAN_SHUTDOWN_FILE).write_text('{"version":0,"brokerEpoch":39}')
    assert read_clean_shutdown_epoch(dirs, dirs) == -1  # the dirs disagree
    for garbled in ("", "{", '{"version":0}', '{"brokerEpoch":"40"}', "[40]"):
        (dirs[1] / CLEAN_SHUTDOWN_FILE).write_text(garbled)
        assert read_clean_shutdown_epoch(dirs, dirs) == -1, garbled
    (dirs[1] / CLEAN_SHUTDOWN_FILE).unlink()  # killed -9: no marker
    assert read_clean_shutdown_epoch(dirs, dirs) == -1
    write_clean_shutdown_epoch(dirs, EPOCH)  # a dir without a marker does not get one
    assert not (dirs[1] / CLEAN_SHUTDOWN_FILE).exists()


def test_a_restart_is_clean_by_the_epoch_the_log_manager_marked(tmp_path):
    """Through a real LogManager: its clean shutdown's markers, given this broker's epoch, name
    it to the next start (read before the start-up removes them); after a kill -9 there is
    none. The controller takes the one and not the other."""
    dirs, _ = _log_dirs(tmp_path, 2)
    manager = LogManager(dirs, LogConfig())
    manager.startup(1, "c1")
    manager.shutdown()
    write_clean_shutdown_epoch(dirs, EPOCH)
    previous = read_clean_shutdown_epoch(dirs, dirs)
    assert previous == EPOCH
    again = LogManager(dirs, LogConfig())
    again.startup(1, "c1")  # removes the markers: a crash from here on is unclean
    crashed = read_clean_shutdown_epoch(dirs, dirs)
    assert crashed == -1
    registered = SimpleNamespace(epoch=EPOCH)
    assert cluster_control.shut_down_cleanly(registered, SimpleNamespace(previous_broker_epoch=previous), None)
    assert not cluster_control.shut_down_cleanly(registered, SimpleNamespace(previous_broker_epoch=crashed), None)


class FakeChannel:
    """The lifecycle's way to the controller: records each call, registers at EPOCH + 1 and
    answers heartbeats unfenced."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, dict]] = []

    async def call(self, api_key: int, version: int, fields: dict, timeout_s: float = 0) -> SimpleNamespace:
        self.calls.append((api_key, version, dict(fields)))
        if api_key == lifecycle.BROKER_REGISTRATION:
            return SimpleNamespace(error_code=0, broker_epoch=EPOCH + 1)
        return SimpleNamespace(error_code=0, is_caught_up=True, is_fenced=False,
                               should_shut_down=fields["want_shut_down"])

    def close(self) -> None:
        pass

    def heartbeats(self) -> list[tuple[int, dict]]:
        return [(v, f) for k, v, f in self.calls if k == lifecycle.BROKER_HEARTBEAT]


def test_the_lifecycle_names_its_clean_shutdown_epoch_and_cordoned_dirs(tmp_path):
    """PreviousBrokerEpoch is the epoch the markers named; heartbeats name the directory ids of
    the cordoned dirs as the broker's config has them now ([] when none); closing leaves the
    new epoch in the markers of the dirs it registered (not in one it did not)."""
    dirs, ids = _log_dirs(tmp_path, 3)
    config = load(None, [f"log.dirs={','.join(map(str, dirs))}", "broker.heartbeat.interval.ms=20",
                         "controller.quorum.voters=1@127.0.0.1:1"])
    cordoned: list = []
    channel = FakeChannel()
    manager = BrokerLifecycleManager(config, "c1", channel, lambda: 1 << 40, ids[:2], previous_broker_epoch=EPOCH,
                                     cordoned_log_dirs=lambda: list(cordoned))

    async def heartbeat_naming(wanted: list[uuid.UUID]) -> int:
        for _ in range(500):
            named = [(v, f) for v, f in channel.heartbeats() if f["cordoned_log_dirs"] == wanted]
            if named:
                return named[-1][0]
            await asyncio.sleep(0.01)
        raise AssertionError(f"no heartbeat named {wanted}: {channel.heartbeats()[-1:]}")

    async def main() -> None:
        await manager.start([Listener("PLAINTEXT", "127.0.0.1", 9092)])
        try:
            ((_, version, registration),) = [c for c in channel.calls if c[0] == lifecycle.BROKER_REGISTRATION]
            assert (version, registration["previous_broker_epoch"]) == (lifecycle.REGISTRATION_VERSION, EPOCH)
            assert registration["log_dirs"] == ids[:2]
            assert await heartbeat_naming([]) == lifecycle.HEARTBEAT_VERSION
            cordoned[:] = [dirs[1], dirs[2]]  # a dynamic change; dirs[2] was not registered
            await heartbeat_naming([ids[1]])
            cordoned[:] = []
            await heartbeat_naming([])
        finally:
            for d in dirs:
                (d / CLEAN_SHUTDOWN_FILE).touch()  # the log manager's clean shutdown, before close
            await manager.close()
        assert read_clean_shutdown_epoch(dirs[:2], dirs[:2]) == EPOCH + 1
        assert (dirs[2] / CLEAN_SHUTDOWN_FILE).read_text() == ""

    asyncio.run(main())


@pytest.mark.parametrize("broken", ["missing", "not-kraft"])
def test_a_log_dir_without_a_readable_directory_id_is_left_out(tmp_path, broken):
    dirs, ids = _log_dirs(tmp_path, 2)
    if broken == "missing":
        (dirs[1] / META_PROPERTIES).unlink()
    else:
        write_properties(dirs[1] / META_PROPERTIES, {"version": "0", "broker.id": "1"})
    config = load(None, [f"log.dirs={','.join(map(str, dirs))}", "controller.quorum.voters=1@127.0.0.1:1"])
    manager = BrokerLifecycleManager(config, "c1", FakeChannel(), lambda: 0, ids, cordoned_log_dirs=lambda: dirs)
    assert manager._registered_dirs() == {dirs[0]: ids[0]}
