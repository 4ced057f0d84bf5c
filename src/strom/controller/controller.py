"""KafkaController (seeds 000 and 001): every broker runs one; the one that wins the
/controller node is the active controller of the cluster.

The active controller keeps the cluster view (ControllerContext) loaded from the metadata
store, reacts to its watches (brokers coming and going, topics created, partitions added,
topics to delete), elects partition leaders, records leader and ISR in each partition's
state node with a conditional write fenced by the controller epoch, and tells brokers what
changed through the channel manager (LeaderAndIsr, UpdateMetadata, StopReplica). It never
touches a broker's state directly: its own broker is just one more receiver.

The embedded single broker runs exactly this over the local file store: it registers, wins
the election, and sends its requests to itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from strom.controller import elections, features, znodes
from strom.controller.channel import ControllerChannelManager, RequestBatch
from strom.controller.event_manager import ControllerEvent, ControllerEventManager
from strom.controller.loop_thread import LoopThread
from strom.controller.store import (
    BadVersion,
    Check,
    Create,
    MetadataStore,
    NodeExists,
    NoNode,
    SetData,
)
from strom.controller.znodes import BrokerInfo, PartitionState, TopicMetadata
from strom.heap import collections_paused
from strom.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
StoreIO = Callable[..., Awaitable[Any]]
DEFAULT_ENTITY = "<default>"  # the cluster-wide default's config node (/config/brokers/<default>)
_MULTI_CHUNK = 500  # ops per ZooKeeper multi, well under its 1 MB request limit


def _partition_state(node: tuple[Any, int] | None, replicas: list[int]) -> PartitionState:
    """A partition's state node as read (None: no state yet, a NewPartition)."""
    if node is None or not node[0]:
        return PartitionState(znodes.NO_LEADER, 0, [], replicas, zk_version=-1)
    data, version = node
    return PartitionState(data["leader"], data["leader_epoch"], list(data["isr"]), replicas,
                          data.get("controller_epoch", 0), version,
                          elr=list(data.get("eligible_leader_replicas") or []),
                          last_known_elr=list(data.get("last_known_elr") or []))


def _config_int(node: tuple[Any, int] | None, key: str, default: int) -> int:
    config = node[0].get("config") if node and isinstance(node[0], dict) else None
    try:
        return int(config[key]) if config and key in config else default
    except (TypeError, ValueError):
        return default


class ControllerMoved(Exception):
    """A conditional write found a newer controller epoch: this controller is stale."""


@dataclass
class ControllerContext:
    """The active controller's view of the cluster."""

    epoch: int = 0
    epoch_zk_version: int = -1
    live_brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    topics: dict[str, TopicMetadata] = field(default_factory=dict)
    # Partitions without a state node yet (NewPartition: no replica was live to lead).
    new_partitions: set[TopicPartition] = field(default_factory=set)
    topics_to_delete: set[str] = field(default_factory=set)
    # Replicas that have yet to confirm StopReplica(delete) for a topic being deleted.
    deletion_pending: dict[str, set[tuple[int, int]]] = field(default_factory=dict)
    # Brokers in controlled shutdown: they lead nothing more and leave every ISR.
    shutting_down: set[int] = field(default_factory=set)
    # eligible.leader.replicas.version >= 1 (KIP-966): partitions keep their ELRs.
    elr_enabled: bool = False
    # min.insync.replicas of the topics the current event looks at (read from their config nodes).
    min_isr: dict[str, int] = field(default_factory=dict)

    def eligible(self, replicas: list[int]) -> list[int]:
        """Replicas that may lead, in assignment order: live and not shutting down."""
        return elections.eligible(replicas, self.live_brokers, self.shutting_down)

    def partitions_on(self, brokers: set[int]):
        for topic in self.topics.values():
            for index, state in topic.partitions.items():
                if brokers.intersection(state.replicas):
                    yield topic, index, state


class KafkaController:
    """`own_thread`: run on a LoopThread of its own (a broker), else on the caller's loop
    (unit tests). Every public coroutine may be awaited from any loop."""

    def __init__(self, store: MetadataStore, io: StoreIO, broker_id: int,
                 channel_factory: Callable[[], ControllerChannelManager],
                 unclean_enabled: Callable[[str], bool] = lambda _topic: False,
                 own_thread: bool = True,
                 found_intact: Callable[[str, int], bool] = lambda _topic, _index: False,
                 min_insync: Callable[[str], int] | None = None) -> None:
        self.store = store
        # min.insync.replicas of a topic (its override, else the broker's), for the ELRs; None:
        # read from the topic's config node, else the cluster-wide dynamic default, else 1.
        self.min_insync = min_insync
        # unclean.leader.election.enable of a topic (its override, else the broker's).
        self.unclean_enabled = unclean_enabled
        # Did this broker's start-up find the partition's log with all it had (the log manager's)?
        self.found_intact = found_intact
        self.io = io
        self.broker_id = broker_id
        self._channel_factory = channel_factory  # made on the controller's loop, which it uses
        self.channel: ControllerChannelManager | None = None
        self._thread = LoopThread(f"controller-{broker_id}") if own_thread else None
        self.ctx = ControllerContext()
        self.active_controller_id = -1
        self.restarted = True  # until the first failover of this process
        self.events: ControllerEventManager | None = None
        self._watches: list = []
        self._topic_watches: dict[str, Any] = {}
        self._controller_watch = None

    @property
    def is_active(self) -> bool:
        return self.active_controller_id == self.broker_id and self.ctx.epoch_zk_version >= 0

    # -- lifecycle ------------------------------------------------------------------------

    async def _own_loop(self, coro: Awaitable[Any]) -> Any:
        return await (coro if self._thread is None else self._thread.call(coro))

    async def _call(self, name: str, *args: Any) -> Any:
        """Queue an event from any loop and wait until it has been processed."""
        return await self._own_loop(self.events.call(name, *args))

    async def startup(self) -> None:
        """Watch /controller and run for election; returns once this broker knows the outcome
        (and, if it won, has loaded the cluster and sent its first requests)."""
        await self._own_loop(self._startup())

    async def _startup(self) -> None:
        self.channel = self._channel_factory()
        self.events = ControllerEventManager(self._process)
        self._controller_watch = await self.io(
            self.store.watch_data, znodes.CONTROLLER,
            lambda data, version: self.events.put("controller_change", data))
        await self.events.call("startup")

    async def shutdown(self) -> None:
        if self.events is not None:
            await self._own_loop(self._shutdown())
        if self._thread is not None:
            self._thread.stop()

    async def _shutdown(self) -> None:
        if self.is_active:
            await self.channel.drain(5)
        try:
            await asyncio.wait_for(self.events.call("resign"), 5)
        except (TimeoutError, Exception):  # shutting down regardless
            pass
        if self._controller_watch is not None:
            self._controller_watch.cancel()
        self.events.close()
        self.channel.shutdown()

    async def controlled_shutdown(self, broker_id: int, broker_epoch: int) -> dict:
        return await self._call("controlled_shutdown", broker_id, broker_epoch)

    async def elect_leaders(self, election_type: int, partitions: list[tuple[str, int]] | None) -> dict:
        return await self._call("elect_leaders", election_type, partitions)

    async def alter_reassignments(self, changes: list[tuple[str, int, list[int] | None]]) -> dict:
        return await self._call("alter_reassignments", changes)

    async def list_reassignments(self, partitions: list[tuple[str, int]] | None) -> dict:
        return await self._call("list_reassignments", partitions)

    async def update_features(self, updates: list[features.FeatureUpdate], validate_only: bool
                              ) -> features.FeatureErrors:
        """UpdateFeatures: plan the new levels and write them to /feature in one conditional
        write (a no-op when another controller took over meanwhile)."""
        return await self._call("update_features", updates, validate_only)

    async def alter_partition(self, request) -> dict:
        """AlterPartition from a leader, processed as an event like everything else."""
        return await self._call("alter_partition", request)

    def session_expired(self) -> None:
        """The store's session ended: /controller (if ours) is gone, so stop acting on it."""
        if self.events is not None:
            self.events.put("resign")

    def session_reconnected(self) -> None:
        if self.events is not None:
            self.events.put("startup")

    # -- events ---------------------------------------------------------------------------

    async def _process(self, event: ControllerEvent) -> Any:
        handler = getattr(self, f"_on_{event.name}")
        if event.name not in ("startup", "controller_change", "resign") and not self.is_active:
            return None  # a watch of a controller that has since resigned
        self.ctx.min_isr.clear()  # topic configs may have changed since the last event
        try:
            return await handler(*event.args)
        except ControllerMoved:
            log.warning("controller epoch %d is stale: another broker is controller; resigning",
                        self.ctx.epoch)
            await self._on_resign()
            await self._on_startup()

    async def _on_startup(self) -> None:
        await self._elect()

    async def _on_controller_change(self, _data: Any) -> None:
        # The watch's data may be older than the queue: what counts is the node now.
        node = await self.io(self.store.get, znodes.CONTROLLER)
        new_id = node[0].get("brokerid", -1) if node and isinstance(node[0], dict) else -1
        was_active = self.is_active
        if new_id == self.broker_id and was_active:
            return
        if was_active:
            await self._on_resign()
        self.active_controller_id = new_id
        if new_id == -1:
            await self._elect()

    async def _on_resign(self) -> None:
        if self.is_active:
            log.info("broker %d resigns as controller (epoch %d)", self.broker_id, self.ctx.epoch)
        for watch in [*self._watches, *self._topic_watches.values()]:
            watch.cancel()
        self._watches.clear()
        self._topic_watches.clear()
        self.channel.shutdown()
        self.ctx = ControllerContext()
        if self.active_controller_id == self.broker_id:
            self.active_controller_id = -1

    # -- election (seed 001: elect / registerControllerAndIncrementControllerEpoch) -----------

    async def _elect(self) -> None:
        node = await self.io(self.store.get, znodes.CONTROLLER)
        if node is not None and isinstance(node[0], dict):
            self.active_controller_id = node[0].get("brokerid", -1)
            if self.active_controller_id != -1:
                self.restarted = False
                return
        try:
            epoch, zk_version = await self.io(self._register_controller)
        except (NodeExists, BadVersion):
            node = await self.io(self.store.get, znodes.CONTROLLER)
            self.active_controller_id = node[0].get("brokerid", -1) if node and node[0] else -1
            log.info("broker %d lost the controller election to broker %d", self.broker_id,
                     self.active_controller_id)
            self.restarted = False  # the controller that is will see this broker's restart
            return
        self.active_controller_id = self.broker_id
        self.ctx = ControllerContext(epoch=epoch, epoch_zk_version=zk_version)
        log.info("broker %d elected controller with epoch %d", self.broker_id, epoch)
        await self._on_failover()

    def _register_controller(self) -> tuple[int, int]:
        """Create the ephemeral /controller node and bump /controller_epoch in one multi, so
        two brokers can never both win with the same epoch."""
        node = self.store.get(znodes.CONTROLLER_EPOCH)
        if node is None:
            try:
                self.store.create(znodes.CONTROLLER_EPOCH, 0)
            except NodeExists:
                pass
            node = self.store.get(znodes.CONTROLLER_EPOCH)
        epoch, version = int(node[0]), node[1]
        self.store.multi([
            Create(znodes.CONTROLLER, {"version": 1, "brokerid": self.broker_id,
                                       "timestamp": znodes.now_ms()}, ephemeral=True),
            SetData(znodes.CONTROLLER_EPOCH, epoch + 1, version),
        ])
        return epoch + 1, version + 1

    # -- failover (onControllerFailover) ------------------------------------------------------

    async def _on_failover(self) -> None:
        def watch_children(path: str, event: str):
            return self.store.watch_children(path, lambda children: self.events.put(event, children))

        live = await self.io(self._read_live_brokers)
        self.ctx.live_brokers = live
        for broker in live.values():
            self.channel.add_broker(broker)
        topics = await self.io(self._read_topics)
        self.ctx.topics = {t.name: t for t in topics}
        for t in topics:
            for index, state in t.partitions.items():
                if state.zk_version < 0:
                    self.ctx.new_partitions.add((t.name, index))
        await self.io(self._finalize_default_features)
        node = await self.io(self.store.get, znodes.FEATURE)
        self.ctx.elr_enabled = znodes.decode_features(node[0] if node else None).get(features.ELR_VERSION, 0) >= 1
        # As Kafka's failover: brokers already serving learn the new controller, the live
        # brokers and every partition's state (the dead marked offline) before the elections,
        # which at 100,000 partitions take seconds. Not this broker if it is starting: it serves
        # once an UpdateMetadata names it, which must come after its LeaderAndIsr (below).
        serving = {b for b in live if b != self.broker_id or not self.restarted}
        if serving and self.ctx.topics:
            first = self._batch()
            first.update_metadata_only = serving
            first.add_update_metadata(serving, list(self._all_partitions()))
            self._send(first)
        batch = self._batch()
        # Every live broker learns the whole cluster, and every replica what it serves, in one
        # batch: a broker starting with this controller waits for its UpdateMetadata, which then
        # comes after the LeaderAndIsr, so it serves knowing and hosting its partitions.
        batch.add_update_metadata(live, [])
        if self.restarted:
            await self._new_epoch_for_restarted_leader()
        # Replicas on brokers that are not live leave the ISRs, as Kafka's replica state machine
        # starts them offline: a broker that died with the last controller (or before this one
        # was elected) had no broker change of its own, and acks=all would otherwise wait for
        # it until its leaders dropped it after replica.lag.time.max.ms. How they went is not
        # known here, so they count as gone uncleanly (they leave the ELRs too).
        offline = frozenset({r for _, _, state in self._all_partitions() for r in (*state.isr, *state.elr)}
                            - live.keys())
        await self._elect_offline_and_new(batch, list(self._all_partitions()), unclean=offline)
        if offline:
            await self._drop_from_isrs(set(offline), list(self.ctx.partitions_on(set(offline))), batch, offline)
        for topic, index, state in self._all_partitions():
            live_replicas = [r for r in state.replicas if r in live]
            batch.add_leader_and_isr(live_replicas, topic, index, state)
        self._send(batch)
        self._watches.append(await self.io(watch_children, znodes.BROKER_IDS, "broker_change"))
        self._watches.append(await self.io(watch_children, znodes.TOPICS, "topic_change"))
        self._watches.append(await self.io(watch_children, znodes.DELETE_TOPICS, "topic_deletion"))
        for t in topics:
            await self._watch_topic(t.name)
        log.info("controller %d ready: %d brokers, %d topics, epoch %d", self.broker_id, len(live),
                 len(topics), self.ctx.epoch)

    def _finalize_default_features(self) -> None:
        """A cluster without /feature (new, or made by a Strom that predates it) gets the
        levels a new Kafka 4.0 cluster has."""
        try:
            self.store.create(znodes.FEATURE, znodes.encode_features(features.default_levels()))
        except NodeExists:
            pass

    async def _on_update_features(self, updates: list[features.FeatureUpdate], validate_only: bool
                                  ) -> features.FeatureErrors:
        node = await self.io(self.store.get, znodes.FEATURE)
        current = znodes.decode_features(node[0]) if node is not None else {}
        levels, results = features.plan_updates(current, updates)
        failed = any(code != ErrorCode.NONE for code, _ in results.values())
        if not failed and not validate_only and levels != current:
            encoded = znodes.encode_features(levels)
            if node is None:
                await self.io(self.store.create, znodes.FEATURE, encoded)
            else:
                await self.io(self.store.set, znodes.FEATURE, encoded, node[1])
            log.info("finalized features now %s", levels)
            self.ctx.elr_enabled = levels.get(features.ELR_VERSION, 0) >= 1
        return results

    # -- eligible leader replicas (KIP-966) ---------------------------------------------------

    async def _read_min_isrs(self, names) -> None:
        """min.insync.replicas of these topics (their override, else the cluster-wide dynamic
        default, else 1), read once per event; only while ELRs are kept."""
        wanted = sorted({n for n in names if n not in self.ctx.min_isr})
        if not self.ctx.elr_enabled or not wanted:
            return
        if self.min_insync is not None:
            self.ctx.min_isr.update((n, self.min_insync(n)) for n in wanted)
            return

        def read() -> list:
            paths = [znodes.config_path("topics", n) for n in wanted]
            return self.store.get_many([*paths, znodes.config_path("brokers", DEFAULT_ENTITY)])

        *topics, default = await self.io(read)
        fallback = _config_int(default, "min.insync.replicas", 1)
        for name, node in zip(wanted, topics, strict=True):
            self.ctx.min_isr[name] = _config_int(node, "min.insync.replicas", fallback)

    def _policy(self, name: str, replicas: list[int]) -> elections.ElrPolicy:
        return elections.elr_policy(self.ctx.elr_enabled, self.ctx.min_isr.get(name, 1), replicas)

    async def _new_epoch_for_restarted_leader(self) -> None:
        """This broker just started and leads partitions from before: a leader that restarted
        and may have lost unflushed records starts a new leader epoch, as it would had another
        controller seen it go and come back (consumers and followers then see the truncation,
        KIP-320). A log found intact lost nothing and keeps its epoch: after a clean shutdown
        of 100,000 partitions, that is 100,000 leader epoch files not rewritten."""
        self.restarted = False
        updates = [(t, i, replace(s, leader_epoch=s.leader_epoch + 1, controller_epoch=self.ctx.epoch))
                   for t, i, s in self._all_partitions()
                   if s.leader == self.broker_id and s.zk_version >= 0 and not self.found_intact(t.name, i)]
        await self._write_states([], updates)
        for topic, index, new in updates:
            topic.partitions[index] = new

    async def _watch_topic(self, name: str) -> None:
        if name not in self._topic_watches:
            self._topic_watches[name] = await self.io(
                self.store.watch_data, znodes.topic_path(name),
                lambda data, version: self.events.put("partition_modifications", name, data))

    def _read_live_brokers(self) -> dict[int, BrokerInfo]:
        live = {}
        for child in self.store.children(znodes.BROKER_IDS):
            node = self.store.get_stat(f"{znodes.BROKER_IDS}/{child}")
            if node is not None and node[0]:
                live[int(child)] = BrokerInfo.decode(int(child), node[0], node[1].czxid)
        return live

    def _read_topic(self, name: str, data: dict | None = None) -> TopicMetadata | None:
        if data is None:
            node = self.store.get(znodes.topic_path(name))
            if node is None:
                return None
            data = node[0]
        topic_id, assignment = znodes.decode_assignment(data)
        adding, removing = znodes.decode_reassignment(data)
        topic = TopicMetadata(name, topic_id, internal=znodes.is_internal(name))
        indexes = sorted(assignment)
        # One pipelined read of every state node: a topic of 10,000 partitions is not 10,000
        # round trips to ZooKeeper.
        nodes = self.store.get_many([znodes.partition_state_path(name, i) for i in indexes])
        for index, node in zip(indexes, nodes, strict=True):
            state = _partition_state(node, assignment[index])
            state.adding, state.removing = adding.get(index, []), removing.get(index, [])
            topic.partitions[index] = state
        return topic

    def _read_topics(self) -> list[TopicMetadata]:
        names = self.store.children(znodes.TOPICS)
        topics = []
        for name, node in zip(names, self.store.get_many([znodes.topic_path(n) for n in names]), strict=True):
            topic = self._read_topic(name, node[0]) if node is not None else None
            if topic is not None:
                topics.append(topic)
        return topics

    def _all_partitions(self):
        for topic in self.ctx.topics.values():
            for index, state in topic.partitions.items():
                yield topic, index, state

    # -- partition state machine: New/Offline -> Online ----------------------------------------

    def _batch(self) -> RequestBatch:
        return RequestBatch(self.broker_id, self.ctx.epoch)

    def _send(self, batch: RequestBatch) -> None:
        batch.send(self.channel, self.ctx.live_brokers, self._stop_replica_callback)

    def _stop_replica_callback(self, broker_id: int):
        return lambda response: self.events.put("stop_replica_response", broker_id, response)

    async def _elect_offline_and_new(self, batch: RequestBatch, partitions, controlled: bool = False,
                                     unclean: frozenset[int] = frozenset()) -> None:
        """NewPartition -> Online (first live replica leads, the live replicas are the ISR) and
        OfflinePartition -> Online (the first live ISR member in assignment order leads).
        A partition whose ISR has no live member stays offline, its last ISR kept, unless
        unclean.leader.election.enable lets any live replica lead (seed 002's strategies)."""
        live = self.ctx.live_brokers
        partitions = list(partitions)
        await self._read_min_isrs(t.name for t, _, _ in partitions)
        with collections_paused():  # a new state per partition: 100,000 at a failover
            creates, updates = self._elected_states(partitions, controlled, unclean)
        await self._write_states(creates, updates)
        with collections_paused():
            for topic, index, new in [*creates, *updates]:
                self.ctx.new_partitions.discard((topic.name, index))
                topic.partitions[index] = new
                batch.add_leader_and_isr([r for r in new.replicas if r in live], topic, index, new,
                                         is_new=new.zk_version == 0 and new.leader_epoch == 0)

    def _elected_states(self, partitions, controlled: bool, unclean: frozenset[int] = frozenset()) -> tuple[list, list]:
        """The new states of `_elect_offline_and_new`: (created, updated), to be written."""
        live = self.ctx.live_brokers
        creates, updates = [], []
        for topic, index, state in partitions:
            if topic.name in self.ctx.topics_to_delete:
                continue
            if (topic.name, index) in self.ctx.new_partitions:
                first = elections.elect_new(state.replicas, live)
                if first is not None:
                    creates.append((topic, index, PartitionState(first.leader, 0, first.isr, state.replicas,
                                                                 self.ctx.epoch, 0)))
                continue
            chosen = elections.elect_offline(state, live, self.ctx.shutting_down,
                                             lambda name=topic.name: self.unclean_enabled(name), controlled,
                                             self._policy(topic.name, state.replicas), unclean)
            if chosen is None:
                continue
            if chosen.unclean:
                log.warning("unclean election for %s-%d: out-of-sync replica %d leads; records "
                            "only the last ISR %s had are lost", topic.name, index, chosen.leader, state.isr)
            elif chosen.leader == znodes.NO_LEADER:
                log.warning("partition %s-%d is offline: no live replica in ISR %s",
                            topic.name, index, state.isr)
            updates.append((topic, index, replace(state, leader=chosen.leader, leader_epoch=state.leader_epoch + 1,
                                                  isr=chosen.isr, controller_epoch=self.ctx.epoch, elr=chosen.elr,
                                                  last_known_elr=chosen.last_known_elr)))
        return creates, updates

    async def _write_states(self, creates, updates) -> None:
        """Record new leader/ISR states, fenced by the controller epoch; updates are
        conditional on the state's version (partition epoch). Sets each new zk_version."""
        with collections_paused():
            ops: list = [(Create(znodes.partition_state_path(t.name, i), s.encode()), s, 0) for t, i, s in creates]
            ops += [(SetData(znodes.partition_state_path(t.name, i), s.encode(), s.zk_version), s, s.zk_version + 1)
                    for t, i, s in updates]
        chunks = [ops[start:start + _MULTI_CHUNK] for start in range(0, len(ops), _MULTI_CHUNK)]
        fence = Check(znodes.CONTROLLER_EPOCH, self.ctx.epoch_zk_version)
        outcomes = await self.io(self.store.multi_many, [[fence, *(op for op, _, _ in c)] for c in chunks])
        for chunk, failure in zip(chunks, outcomes, strict=True):
            if failure is None:  # written, whatever became of the other chunks
                for _, state, version in chunk:
                    state.zk_version = version
        failure = next((f for f in outcomes if f is not None), None)
        if failure is not None:
            await self._fenced_failure(failure)

    async def _fenced_multi(self, ops: list) -> None:
        fence = Check(znodes.CONTROLLER_EPOCH, self.ctx.epoch_zk_version)
        try:
            await self.io(self.store.multi, [fence, *ops])
        except (BadVersion, NoNode, NodeExists) as e:
            await self._fenced_failure(e)

    async def _fenced_failure(self, failure: Exception) -> None:
        """A fenced write failed: because another controller took over (the epoch node moved
        on), or for a reason of its own, raised as it is."""
        node = await self.io(self.store.get, znodes.CONTROLLER_EPOCH)
        if node is None or node[1] != self.ctx.epoch_zk_version:
            raise ControllerMoved() from None
        raise failure

    # -- brokers (BrokerChange: onBrokerStartup / onBrokerFailure) -----------------------------

    async def _on_broker_change(self, _children: list[str]) -> None:
        current = await self.io(self._read_live_brokers)
        old = self.ctx.live_brokers
        bounced = {b for b in current.keys() & old.keys() if current[b].epoch != old[b].epoch}
        dead = (old.keys() - current.keys()) | bounced
        new = (current.keys() - old.keys()) | bounced
        if not dead and not new:
            return
        log.info("broker change: new %s, dead %s, bounced %s", sorted(new - bounced),
                 sorted(dead - bounced), sorted(bounced))
        # Gone without finishing a controlled shutdown (killed, or its session expired): its logs
        # may have lost unflushed records, so it leaves the ELRs too (KIP-966).
        unclean = frozenset(b for b in dead if b not in self.ctx.shutting_down)
        for b in dead:
            self.channel.remove_broker(b)
            self.ctx.shutting_down.discard(b)
        batch = self._batch()
        # A bounced broker first fails (its old registration's leadership and ISR places go),
        # then starts, as Kafka's controller handles it.
        self.ctx.live_brokers = {b: info for b, info in current.items() if b not in dead}
        if dead:
            await self._on_brokers_failed(dead, batch, unclean)
        self.ctx.live_brokers = current
        for b in new:
            self.channel.add_broker(current[b])
        if new:
            await self._on_brokers_started(new, batch)
        batch.add_update_metadata(current, [])
        self._send(batch)

    async def _on_brokers_failed(self, dead: set[int], batch: RequestBatch,
                                 unclean: frozenset[int] = frozenset()) -> None:
        """Partitions they led get a new leader from the ISR; partitions they followed drop
        them from the ISR (a new leader epoch, as Kafka's controller-driven shrink), and the
        ELRs those of them that went uncleanly."""
        affected = list(self.ctx.partitions_on(dead))
        await self._elect_offline_and_new(batch, [p for p in affected if p[2].leader in dead], unclean=unclean)
        await self._drop_from_isrs(dead, affected, batch, unclean)
        for topic, index, _state in affected:  # metadata shows the offline replicas
            batch.add_update_metadata([], [(topic, index, topic.partitions[index])])

    async def _drop_from_isrs(self, dead: set[int], partitions: list, batch: RequestBatch,
                              unclean: frozenset[int] = frozenset()) -> None:
        """Partitions with a live leader drop the dead brokers from their ISRs (and ELRs, those
        that went uncleanly)."""
        live = self.ctx.live_brokers
        await self._read_min_isrs(t.name for t, _, _ in partitions)
        updates = []
        for topic, index, _state in partitions:
            state = topic.partitions[index]
            isr = elections.isr_after_failure(state, dead, live)
            if isr is None and unclean.intersection(state.elr):
                isr = list(state.isr)  # only its ELR changes
            if isr is not None:
                elr, last_known = elections.next_elr(state, state.leader, isr, self._policy(topic.name, state.replicas),
                                                     unclean_shutdown=unclean)
                bump = 0 if isr == state.isr else 1
                updates.append((topic, index, replace(state, isr=isr, leader_epoch=state.leader_epoch + bump,
                                                      controller_epoch=self.ctx.epoch, elr=elr,
                                                      last_known_elr=last_known)))
        before = {(topic.name, index): topic.partitions[index].leader_epoch for topic, index, _ in updates}
        await self._write_states([], updates)
        for topic, index, new in updates:
            topic.partitions[index] = new
            if new.leader_epoch != before[(topic.name, index)]:  # not for a change of the ELR alone
                batch.add_leader_and_isr([r for r in new.replicas if r in live], topic, index, new)

    async def _on_brokers_started(self, new: set[int], batch: RequestBatch) -> None:
        """The new brokers get the whole metadata and their replicas; partitions that had no
        live leader may now get one; deletions waiting for them go on."""
        batch.add_update_metadata(new, [p for p in self._all_partitions()
                                        if p[0].name not in self.ctx.topics_to_delete])
        await self._elect_offline_and_new(batch, [
            p for p in self._all_partitions()
            if (p[0].name, p[1]) in self.ctx.new_partitions or p[2].leader == znodes.NO_LEADER])
        for topic, index, state in self.ctx.partitions_on(new):
            if topic.name in self.ctx.topics_to_delete or (topic.name, index) in self.ctx.new_partitions:
                continue
            batch.add_leader_and_isr([r for r in state.replicas if r in new], topic, index, state)
        for name in self.ctx.topics_to_delete:
            for broker, index in self.ctx.deletion_pending.get(name, ()):
                if broker in new:
                    batch.add_stop_replica(broker, name, index, -1, True)

    # -- topics (TopicChange, PartitionModifications) -------------------------------------------

    async def _on_topic_change(self, children: list[str]) -> None:
        added = [name for name in children if name not in self.ctx.topics]
        if not added:
            return
        batch = self._batch()
        for name in added:
            topic = await self.io(self._read_topic, name)
            if topic is None:
                continue
            self.ctx.topics[name] = topic
            await self._watch_topic(name)
            await self._online_partitions(batch, topic, list(topic.partitions))
            log.info("controller: new topic %s with %d partitions", name, len(topic.partitions))
        self._send(batch)

    async def _online_partitions(self, batch: RequestBatch, topic: TopicMetadata, indexes: list[int]) -> None:
        for index in indexes:
            if topic.partitions[index].zk_version < 0:
                self.ctx.new_partitions.add((topic.name, index))
        await self._elect_offline_and_new(batch, [(topic, i, topic.partitions[i]) for i in indexes])
        # Partitions that stayed New still appear in metadata, leaderless.
        batch.add_update_metadata([], [(topic, i, topic.partitions[i]) for i in indexes])

    async def _on_partition_modifications(self, name: str, data: Any) -> None:
        topic = self.ctx.topics.get(name)
        if topic is None or not data or name in self.ctx.topics_to_delete:
            return
        _, assignment = znodes.decode_assignment(data)
        added = sorted(set(assignment) - set(topic.partitions))
        if not added:
            return
        for index in added:
            topic.partitions[index] = PartitionState(znodes.NO_LEADER, 0, [], assignment[index], zk_version=-1)
        batch = self._batch()
        await self._online_partitions(batch, topic, added)
        self._send(batch)
        log.info("controller: topic %s grew to %d partitions", name, len(topic.partitions))

    # -- topic deletion (TopicDeletionManager) ---------------------------------------------

    async def _on_topic_deletion(self, children: list[str]) -> None:
        batch = self._batch()
        for name in children:
            topic = self.ctx.topics.get(name)
            if topic is None:
                await self.io(self.store.delete, f"{znodes.DELETE_TOPICS}/{name}")
                continue
            if name in self.ctx.topics_to_delete:
                continue
            log.info("controller: deleting topic %s", name)
            self.ctx.topics_to_delete.add(name)
            pending = {(r, i) for i, s in topic.partitions.items() for r in s.replicas}
            self.ctx.deletion_pending[name] = pending
            # Brokers forget the topic's metadata now; replicas delete their logs as they can.
            batch.add_update_metadata([], [(topic, i, replace(s, leader=znodes.LEADER_DURING_DELETE))
                                           for i, s in topic.partitions.items()])
            for broker, index in pending:
                batch.add_stop_replica(broker, name, index, topic.partitions[index].leader_epoch, True)
            if not pending:
                await self._complete_deletion(name)
        self._send(batch)

    async def _on_stop_replica_response(self, broker_id: int, response: Any) -> None:
        if response.error_code != ErrorCode.NONE:
            log.warning("StopReplica on broker %d failed: %s", broker_id, ErrorCode(response.error_code).name)
            return
        for p in response.partition_errors:
            pending = self.ctx.deletion_pending.get(p.topic_name)
            if pending is not None and p.error_code == ErrorCode.NONE:
                pending.discard((broker_id, p.partition_index))
        for name in [n for n, pending in self.ctx.deletion_pending.items() if not pending]:
            await self._complete_deletion(name)

    async def _complete_deletion(self, name: str) -> None:
        def delete_nodes() -> None:
            self.store.delete(znodes.topic_path(name))
            self.store.delete(znodes.config_path("topics", name))
            self.store.delete(f"{znodes.DELETE_TOPICS}/{name}")

        watch = self._topic_watches.pop(name, None)
        if watch is not None:
            watch.cancel()
        await self.io(delete_nodes)
        self.ctx.topics.pop(name, None)
        self.ctx.topics_to_delete.discard(name)
        self.ctx.deletion_pending.pop(name, None)
        self.ctx.new_partitions = {tp for tp in self.ctx.new_partitions if tp[0] != name}
        log.info("controller: topic %s deleted", name)

    # -- ISR changes from leaders (AlterPartition) ----------------------------------------------

    async def _on_alter_partition(self, request) -> dict:
        """Accept a leader's new ISR if it speaks for the current leader epoch and partition
        epoch, record it (same leader epoch, new partition epoch) and tell every broker."""
        live = self.ctx.live_brokers
        sender = live.get(request.broker_id)
        if sender is None or 0 <= request.broker_epoch != sender.epoch:
            return {"throttle_time_ms": 0, "error_code": ErrorCode.STALE_BROKER_EPOCH, "topics": []}
        batch = self._batch()
        await self._read_min_isrs(t.topic_name for t in request.topics)
        checked = [(t.topic_name, p, self._check_alter(request.broker_id, t.topic_name, p))
                   for t in request.topics for p in t.partitions]
        accepted = [(self.ctx.topics[name], p.partition_index, new)
                    for name, p, (answer, new) in checked if new is not None]
        failed = await self._write_isr_changes(accepted)
        answers: dict[str, list[dict]] = {}
        for name, p, (answer, new) in checked:
            if new is not None and (name, p.partition_index) in failed:
                answer["error_code"] = ErrorCode.INVALID_UPDATE_VERSION
            elif new is not None:
                topic = self.ctx.topics[name]
                topic.partitions[p.partition_index] = new
                batch.add_update_metadata([], [(topic, p.partition_index, new)])
                if new.adding or new.removing:
                    await self._maybe_complete_reassignment(batch, topic, p.partition_index)
                    new = topic.partitions[p.partition_index]
                answer.update(leader_id=new.leader, leader_epoch=new.leader_epoch, isr=list(new.isr),
                              partition_epoch=new.zk_version)
            answers.setdefault(name, []).append(answer)
        if accepted:
            log.info("ISR changes of %d partitions from broker %d%s", len(accepted) - len(failed),
                     request.broker_id, "" if len(accepted) > 1 else
                     f": {accepted[0][0].name}-{accepted[0][1]} ISR {accepted[0][2].isr}")
        self._send(batch)
        return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE,
                "topics": [{"topic_name": name, "partitions": ps} for name, ps in answers.items()]}

    async def _write_isr_changes(self, accepted: list) -> set[tuple[str, int]]:
        """Write the new states together; where a conditional write fails (a state changed
        under it), each of that chunk is tried alone. Returns the partitions not written."""
        try:
            await self._write_states([], accepted)
            return set()
        except BadVersion:
            pass
        failed = set()
        for topic, index, new in accepted:
            if new.zk_version != topic.partitions[index].zk_version:
                continue  # written by a chunk that went through before the failing one
            try:
                await self._write_states([], [(topic, index, new)])
            except BadVersion:
                failed.add((topic.name, index))
        return failed

    def _check_alter(self, leader: int, name: str, p) -> tuple[dict, PartitionState | None]:
        """The answer to one partition of an AlterPartition, and the state to write if valid."""
        topic = self.ctx.topics.get(name)
        state = topic.partitions.get(p.partition_index) if topic is not None else None
        answer = {"partition_index": p.partition_index, "error_code": ErrorCode.NONE,
                  "leader_id": -1, "leader_epoch": -1, "isr": [], "leader_recovery_state": 0,
                  "partition_epoch": -1}
        new_isr = list(p.new_isr)
        answer["error_code"] = elections.check_alter_partition(
            state, name in self.ctx.topics_to_delete, leader, p.leader_epoch, p.partition_epoch, new_isr,
            self.ctx.live_brokers, self.ctx.shutting_down)
        if answer["error_code"] != ErrorCode.NONE:
            log.info("AlterPartition for %s-%d from broker %d refused: %s", name, p.partition_index,
                     leader, ErrorCode(answer["error_code"]).name)
            return answer, None
        elr, last_known = elections.next_elr(state, state.leader, new_isr, self._policy(name, state.replicas))
        return answer, replace(state, isr=new_isr, controller_epoch=self.ctx.epoch, elr=elr, last_known_elr=last_known)

    # -- controlled shutdown (handleControlledShutdownRequest) -----------------------------------

    async def _on_controlled_shutdown(self, broker_id: int, broker_epoch: int) -> dict:
        """Move leadership off a stopping broker and drop it from every ISR, before it goes.
        Returns the partitions it still leads (no other in-sync replica could take them)."""
        info = self.ctx.live_brokers.get(broker_id)
        if info is None or 0 <= broker_epoch != info.epoch:
            return {"error_code": ErrorCode.STALE_BROKER_EPOCH, "remaining_partitions": []}
        self.ctx.shutting_down.add(broker_id)
        batch = self._batch()
        await self._read_min_isrs(t.name for t, _, _ in self.ctx.partitions_on({broker_id}))
        led = [p for p in self.ctx.partitions_on({broker_id})
               if p[2].leader == broker_id and len(p[2].replicas) > 1]
        await self._elect_offline_and_new(batch, led, controlled=True)
        updates = []
        with collections_paused():
            for topic, index, state in self.ctx.partitions_on({broker_id}):
                state = topic.partitions[index]
                isr = elections.isr_after_shutdown(state, broker_id)
                if isr is not None:
                    elr, last_known = elections.next_elr(state, state.leader, isr,
                                                         self._policy(topic.name, state.replicas))
                    updates.append((topic, index, replace(state, isr=isr, leader_epoch=state.leader_epoch + 1,
                                                          controller_epoch=self.ctx.epoch, elr=elr,
                                                          last_known_elr=last_known)))
        await self._write_states([], updates)
        with collections_paused():
            for topic, index, new in updates:
                topic.partitions[index] = new
                batch.add_leader_and_isr(self.ctx.eligible(new.replicas), topic, index, new)
            for topic, index, _state in self.ctx.partitions_on({broker_id}):
                if topic.partitions[index].leader != broker_id:
                    batch.add_stop_replica(broker_id, topic.name, index, -1, False)
        self._send(batch)
        # Only what another live broker could still take: what none can (every other replica
        # gone or stopping too) would hold the broker through all its retries for nothing, so it
        # is let go at once, as KRaft's controller does.
        remaining = [{"topic_name": t.name, "partition_index": i}
                     for t, i, s in self.ctx.partitions_on({broker_id})
                     if t.partitions[i].leader == broker_id and self.ctx.eligible(s.replicas)]
        log.info("controlled shutdown of broker %d: %d partitions still led there", broker_id,
                 len(remaining))
        return {"error_code": ErrorCode.NONE, "remaining_partitions": remaining}

    # -- preferred and unclean elections on demand (ElectLeaders), and auto-rebalance ------------

    async def _on_elect_leaders(self, election_type: int, partitions) -> dict[tuple[str, int], tuple]:
        """election_type 0: the preferred (first assigned) replica leads if it is live and in
        sync; 1: unclean, for partitions without a leader. {tp: (error, message)}."""
        wanted = partitions if partitions is not None else [
            (t.name, i) for t, i, _ in self._all_partitions()]
        results: dict[tuple[str, int], tuple] = {}
        chosen = []
        await self._read_min_isrs(name for name, _ in wanted)
        for name, index in wanted:
            topic = self.ctx.topics.get(name)
            state = topic.partitions.get(index) if topic is not None else None
            if state is None or name in self.ctx.topics_to_delete:
                results[(name, index)] = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None)
                continue
            decision = elections.elect_on_demand(name, index, state, election_type, self.ctx.live_brokers,
                                                 self.ctx.shutting_down, self._policy(name, state.replicas))
            if not isinstance(decision, elections.LeaderAndIsr):
                results[(name, index)] = decision
                continue
            if decision.unclean:
                log.warning("unclean election (ElectLeaders) for %s-%d: out-of-sync replica %d "
                            "leads; records only the last ISR %s had are lost", name, index, decision.leader,
                            state.isr)
            chosen.append((topic, index, replace(state, leader=decision.leader, leader_epoch=state.leader_epoch + 1,
                                                 isr=decision.isr, controller_epoch=self.ctx.epoch, elr=decision.elr,
                                                 last_known_elr=decision.last_known_elr)))
        await self._write_states([], chosen)
        batch = self._batch()
        for topic, index, new in chosen:
            topic.partitions[index] = new
            batch.add_leader_and_isr(self.ctx.eligible(new.replicas), topic, index, new)
            results[(topic.name, index)] = (ErrorCode.NONE, None)
        self._send(batch)
        if chosen:
            log.info("%s election moved leadership of %d partitions",
                     "preferred" if election_type == 0 else "unclean", len(chosen))
        return results

    async def _on_auto_rebalance(self, percentage: int) -> None:
        """Kafka's checkAndTriggerAutoLeaderRebalance: a broker whose share of partitions led by
        someone other than their preferred leader (it) is above the threshold gets them back."""
        partitions = ((topic.name, index, state) for topic, index, state in self._all_partitions()
                      if topic.name not in self.ctx.topics_to_delete)
        for broker, (ratio, tps) in elections.imbalanced_brokers(
                partitions, self.ctx.live_brokers, self.ctx.shutting_down, percentage).items():
            log.info("leader imbalance of broker %d is %.0f%% (> %d%%): preferred election",
                     broker, ratio, percentage)
            await self._on_elect_leaders(0, tps)

    # -- partition reassignment (KIP-455) ----------------------------------------------------

    async def _write_assignment(self, topic: TopicMetadata) -> None:
        """The topic's node with every partition's replicas and ongoing reassignment."""
        data = znodes.encode_assignment(
            topic.topic_id, {i: s.replicas for i, s in topic.partitions.items()},
            {i: s.adding for i, s in topic.partitions.items()},
            {i: s.removing for i, s in topic.partitions.items()})
        await self._fenced_multi([SetData(znodes.topic_path(topic.name), data)])

    async def _on_alter_reassignments(self, changes) -> dict[tuple[str, int], tuple]:
        """Start (target replicas) or cancel (None) reassignments: {tp: (error, message)}.
        Phase one: the partition's replicas become target + original, the new ones start
        fetching; phase two (once every target replica is in sync) follows in
        `_maybe_complete_reassignment`."""
        results: dict[tuple[str, int], tuple] = {}
        batch = self._batch()
        touched: dict[str, TopicMetadata] = {}
        for name, index, target in changes:
            topic = self.ctx.topics.get(name)
            state = topic.partitions.get(index) if topic is not None else None
            if state is None or name in self.ctx.topics_to_delete:
                results[(name, index)] = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None)
                continue
            step = elections.start_reassignment(state, target, self.ctx.live_brokers)
            if not isinstance(step, elections.ReassignmentStep):
                results[(name, index)] = step
                continue
            if target is None:
                log.info("cancelling the reassignment of %s-%d back to %s", name, index, state.original_replicas)
            original = state.original_replicas
            new = replace(state, replicas=step.replicas, adding=step.adding, removing=step.removing,
                          leader_epoch=state.leader_epoch + 1, controller_epoch=self.ctx.epoch)
            await self._write_states([], [(topic, index, new)])
            topic.partitions[index] = new
            touched[name] = topic
            batch.add_leader_and_isr(self.ctx.eligible(new.replicas), topic, index, new)
            for r in step.dropped:
                batch.add_stop_replica(r, name, index, -1, True)
            results[(name, index)] = (ErrorCode.NONE, None)
            log.info("reassigning %s-%d: %s -> %s (adding %s, removing %s)", name, index, original,
                     new.target_replicas, new.adding, new.removing)
        for topic in touched.values():
            await self._write_assignment(topic)
        for name, index, _ in changes:
            if results.get((name, index), (None,))[0] == ErrorCode.NONE:
                await self._maybe_complete_reassignment(batch, touched[name], index)
        self._send(batch)
        return results

    async def _maybe_complete_reassignment(self, batch: RequestBatch, topic: TopicMetadata, index: int) -> None:
        """Phase two, once every target replica is in the ISR: a target replica leads, the
        replicas become the target, and the removed ones stop and delete their logs."""
        state = topic.partitions[index]
        done = elections.complete_reassignment(state, self.ctx.live_brokers, self.ctx.shutting_down)
        if done is None:
            return
        leader = done.leader
        await self._read_min_isrs([topic.name])
        elr, last_known = elections.next_elr(replace(state, replicas=done.replicas), leader, done.isr,
                                             self._policy(topic.name, done.replicas))
        new = replace(state, replicas=done.replicas, adding=[], removing=[], leader=leader, isr=done.isr,
                      leader_epoch=state.leader_epoch + 1, controller_epoch=self.ctx.epoch, elr=elr,
                      last_known_elr=last_known)
        await self._write_states([], [(topic, index, new)])
        topic.partitions[index] = new
        await self._write_assignment(topic)
        batch.add_leader_and_isr(self.ctx.eligible(new.replicas), topic, index, new)
        for r in state.removing:
            batch.add_stop_replica(r, topic.name, index, -1, True)
        log.info("reassignment of %s-%d complete: replicas %s, leader %d", topic.name, index,
                 new.replicas, leader)

    async def _on_list_reassignments(self, partitions) -> dict[tuple[str, int], PartitionState]:
        wanted = partitions if partitions is not None else [
            (t.name, i) for t, i, _ in self._all_partitions()]
        out = {}
        for name, index in wanted:
            topic = self.ctx.topics.get(name)
            state = topic.partitions.get(index) if topic is not None else None
            if state is not None and (state.adding or state.removing):
                out[(name, index)] = state
        return out
