"""One broker process: start-up and shut-down in the order of seed 000's KafkaServer.startup.

config -> log manager (recovery) -> metadata store and controller -> replica manager ->
socket server -> scheduled tasks (retention, checkpoints) -> RUNNING. Shut-down reverses
it: stop accepting, let in-flight requests finish, flush and checkpoint, mark the clean
shutdown so the next start skips recovery.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import socket
import time
from collections.abc import Callable, Mapping

from strom.controller.controller import Controller, TopicMetadata
from strom.controller.store import LocalMetadataStore
from strom.coordinator import GROUP_METADATA_TOPIC, TRANSACTION_STATE_TOPIC
from strom.coordinator.group import GroupCoordinator, create_group_coordinator
from strom.coordinator.transaction.coordinator import TransactionCoordinator
from strom.coordinator.transaction.manager import TransactionStateManager
from strom.coordinator.transaction.producer_id_manager import ProducerIdManager
from strom.log.config import LogConfig
from strom.log.manager import LogManager
from strom.protocol.errors import ErrorCode
from strom.server.apis import load_all
from strom.server.config import BrokerConfig, Listener
from strom.server.dynamic_config import DynamicBrokerConfig
from strom.server.log_services import LogServices
from strom.server.replica_manager import ReplicaManager
from strom.server.socket_server import SocketServer

log = logging.getLogger(__name__)

METADATA_FILE = "strom-metadata.json"
# Where each internal topic's settings are (offsets.topic.num.partitions, ...).
_INTERNAL_CONFIG_PREFIX = {GROUP_METADATA_TOPIC: "offsets.topic", TRANSACTION_STATE_TOPIC: "transaction.state.log"}


class BrokerState(enum.Enum):
    NOT_RUNNING = 0
    STARTING = 1
    RECOVERY = 2
    RUNNING = 3
    PENDING_CONTROLLED_SHUTDOWN = 6
    SHUTTING_DOWN = 7


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.state = BrokerState.NOT_RUNNING
        self.default_log_config = config.default_log_config()
        self.log_manager = LogManager(config.log_dirs, self.default_log_config)
        self.dynamic_config = DynamicBrokerConfig(config)
        self.log_services = LogServices(self)  # cleaner, flusher, live reconfiguration
        self.replica_manager = ReplicaManager(self.broker_id, self.log_manager)
        self.socket_server = SocketServer(self, config["socket.request.max.bytes"])
        self.controller: Controller | None = None
        self.group_coordinator: GroupCoordinator | None = None
        self.txn_coordinator: TransactionCoordinator | None = None
        self.cluster_id = ""
        self.advertised: list[Listener] = []
        self._tasks: list[asyncio.Task] = []
        self.stopping = False

    # --- lifecycle -----------------------------------------------------------------------
    async def startup(self) -> None:
        self.state = BrokerState.STARTING
        load_all()
        self.state = BrokerState.RECOVERY
        self.cluster_id = self.log_manager.startup(self.broker_id, None, self.log_config_for)
        store = LocalMetadataStore(self.config.log_dirs[0] / METADATA_FILE)
        self.controller = Controller(store, self.broker_id, lambda: [self.broker_id], self,
                                     self._validate_topic_configs)
        self.log_services.load_dynamic_config()
        self.controller.startup()
        self.producer_id_manager = ProducerIdManager(store, self.broker_id)
        self._delete_orphan_logs()
        self.group_coordinator = create_group_coordinator(self)
        self.group_coordinator.startup(self.group_coordinator.store.load())  # before serving
        self.txn_coordinator = self._create_txn_coordinator()
        self.txn_coordinator.startup(self.txn_coordinator.store.load())  # finishes prepared ones
        await self.socket_server.start(self.config.listeners, self.config["socket.send.buffer.bytes"],
                                       self.config["socket.receive.buffer.bytes"])
        self.advertised = self._advertised_listeners()
        self._schedule("log-retention", self.config["log.retention.check.interval.ms"], self._retention)
        self._schedule("recovery-point-checkpoint",
                       self.config["log.flush.offset.checkpoint.interval.ms"], self._checkpoint)
        self._schedule("group-metadata-expiration", self.config["offsets.retention.check.interval.ms"],
                       self.group_coordinator.cleanup_group_metadata)
        self._schedule("transaction-abort", self.config[
            "transaction.abort.timed.out.transaction.cleanup.interval.ms"],
            self.txn_coordinator.abort_timed_out)
        self._schedule("transactional-id-expiration", self.config[
            "transaction.remove.expired.transaction.cleanup.interval.ms"],
            self.txn_coordinator.remove_expired)
        self._schedule("producer-id-expiration", self.config["producer.id.expiration.check.interval.ms"],
                       self._expire_producers)
        self.log_services.start()
        self.state = BrokerState.RUNNING

    async def shutdown(self) -> None:
        if self.state == BrokerState.SHUTTING_DOWN:
            return
        self.state = BrokerState.SHUTTING_DOWN
        self.stopping = True
        await self.socket_server.stop_accepting()
        if self.group_coordinator is not None:
            self.group_coordinator.shutdown()  # held-back JoinGroup/SyncGroup: NOT_COORDINATOR
        if self.txn_coordinator is not None:
            self.txn_coordinator.shutdown()
        for key in list(self.replica_manager.partitions):
            self.replica_manager.fetch_purgatory.wake(key)  # long polls answer now
        await self.socket_server.drain(timeout=10)
        for task in self._tasks:
            task.cancel()
        await self.log_services.stop()
        await self._snapshot_producers(at_shutdown=True)
        await asyncio.to_thread(self.log_manager.shutdown)
        self.state = BrokerState.NOT_RUNNING

    def _schedule(self, name: str, interval_ms: int, job: Callable[[], object]) -> None:
        async def run() -> None:
            while True:
                await asyncio.sleep(interval_ms / 1000)
                try:
                    result = job()
                    if asyncio.iscoroutine(result):
                        await result
                except Exception:
                    log.exception("scheduled task %s failed", name)

        if 0 < interval_ms < 2**31:
            self._tasks.append(asyncio.get_running_loop().create_task(run(), name=name))

    def _retention(self) -> None:
        deleted = self.log_manager.cleanup()
        if deleted:
            log.info("retention deleted %d segments", deleted)

    async def _checkpoint(self) -> None:
        await self._snapshot_producers()
        await asyncio.to_thread(self.log_manager.checkpoint)

    async def _snapshot_producers(self, at_shutdown: bool = False) -> None:
        """Producer state is encoded on the loop that owns it and written from a thread. At
        shutdown every partition gets one, even empty (Kafka snapshots on close), so that the
        next start-up does not re-read whole logs to rebuild the state."""
        snapshots = [(p.producer_state, *snap) for p in self.replica_manager.partitions.values()
                     if not p.log.offline and (snap := p.producer_snapshot(at_shutdown)) is not None]

        def write() -> None:
            for state, offset, data in snapshots:
                try:
                    state.write_snapshot(offset, data)
                except OSError as e:  # a failing log dir must not stop the rest
                    log.error("cannot write producer snapshot in %s: %s", state.dir, e)

        if snapshots:
            await asyncio.to_thread(write)

    def _create_txn_coordinator(self) -> TransactionCoordinator:
        store = TransactionStateManager(self.replica_manager,
                                        lambda: self.internal_partitions(TRANSACTION_STATE_TOPIC))
        return TransactionCoordinator(store,
                                      self.producer_id_manager.generate, self.write_txn_markers,
                                      self.config["transaction.max.timeout.ms"],
                                      self.config["transactional.id.expiration.ms"])

    def write_txn_markers(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                          committed: bool, partitions) -> dict:
        """WriteTxnMarkers for partitions this broker leads (the coordinator's marker channel,
        and the API): write each marker, then let the group coordinator apply or drop offsets
        the transaction committed to a `__consumer_offsets` partition."""
        errors = self.replica_manager.write_txn_markers(producer_id, producer_epoch, coordinator_epoch,
                                                        committed, partitions)
        for (topic, index), error in errors.items():
            if topic == GROUP_METADATA_TOPIC and error == ErrorCode.NONE:
                self.group_coordinator.complete_txn(producer_id, index, committed)
        return errors

    def verify_transaction(self, transactional_id: str, producer_id: int, producer_epoch: int,
                           tp: tuple[str, int]) -> ErrorCode:
        """Is `tp` part of the producer's open transaction? Asked of the transaction coordinator
        (AddPartitionsToTxn v4 with verify_only; here the coordinator is this broker)."""
        return self.txn_coordinator.verify_partitions(transactional_id, producer_id, producer_epoch,
                                                      [tp])[tp]

    def _expire_producers(self) -> None:
        now, expiration = int(time.time() * 1000), self.config["producer.id.expiration.ms"]
        removed = sum(p.producer_state.remove_expired(now, expiration)
                      for p in self.replica_manager.partitions.values())
        if removed:
            log.info("forgot %d idle producer states (producer.id.expiration.ms=%d)", removed, expiration)

    def _delete_orphan_logs(self) -> None:
        """Logs on disk for topics the metadata no longer has (deleted while we were down)."""
        hosted = set(self.replica_manager.partitions)
        for tp, _ in list(self.log_manager.logs()):
            if tp not in hosted:
                log.info("deleting log %s-%d of a topic that no longer exists", *tp)
                self.log_manager.delete_log(*tp)

    # --- what handlers and the controller use -----------------------------------------------
    @property
    def controller_id(self) -> int:
        return self.broker_id

    def _advertised_listeners(self) -> list[Listener]:
        configured = self.config["advertised.listeners"]
        by_name = {a.name: a for a in configured or []}
        out = []
        for listener in self.config.listeners:
            bound_host, bound_port = self.socket_server.bound[listener.name]
            chosen = by_name.get(listener.name)
            if chosen is not None:
                out.append(Listener(chosen.name, chosen.host, chosen.port or bound_port))
                continue
            host = listener.host
            if host in ("", "0.0.0.0", "::"):
                host = socket.getfqdn()
            out.append(Listener(listener.name, host, bound_port))
        return out

    def endpoints(self, listener_name: str) -> list[dict]:
        for listener in self.advertised:
            if listener.name == listener_name:
                return [{"node_id": self.broker_id, "host": listener.host, "port": listener.port,
                         "rack": self.config["broker.rack"]}]
        return []

    def auto_create_topic(self, name: str) -> TopicMetadata:
        topic = self.controller.create_topic(
            name, -1, -1, None, {},
            default_partitions=self.config["num.partitions"],
            default_replication_factor=self.config["default.replication.factor"],
        )
        log.info("auto-created topic %s with %d partitions", name, len(topic.partitions))
        return topic

    def internal_partitions(self, name: str) -> int:
        """Partitions of an internal topic: as created, or as configured until it exists."""
        topic = self.controller.topics.get(name)
        if topic is not None:
            return len(topic.partitions)
        return self.config[f"{_INTERNAL_CONFIG_PREFIX[name]}.num.partitions"]

    def ensure_internal_topic(self, name: str) -> TopicMetadata:
        """`__consumer_offsets` or `__transaction_state`, created on first use as Kafka creates
        them: compacted, with the configured partition count; the replication factor is capped
        at the live brokers so that a single broker can coordinate."""
        topic = self.controller.topics.get(name)
        if topic is not None:
            return topic
        prefix = _INTERNAL_CONFIG_PREFIX[name]
        factor = min(self.config[f"{prefix}.replication.factor"], len(self.controller.live_brokers()))
        configs = {"cleanup.policy": "compact", "segment.bytes": str(self.config[f"{prefix}.segment.bytes"])}
        topic = self.controller.create_topic(name, self.config[f"{prefix}.num.partitions"], factor,
                                             None, configs)
        log.info("created internal topic %s with %d partitions", name, len(topic.partitions))
        return topic

    def log_config_for(self, topic: str) -> LogConfig:
        meta = self.controller.topics.get(topic) if self.controller else None
        if meta is None or not meta.configs:
            return self.default_log_config
        return self.default_log_config.with_overrides(meta.configs)

    def _validate_topic_configs(self, configs: Mapping[str, str]) -> None:
        self.default_log_config.with_overrides(configs)

    # BrokerChannel: the controller's LeaderAndIsr and StopReplica, delivered in-process.
    def leader_and_isr(self, topic: TopicMetadata, partition: int) -> None:
        state = topic.partitions[partition]
        if state.leader != self.broker_id:
            return
        config = self.default_log_config.with_overrides(topic.configs) if topic.configs else self.default_log_config
        self.replica_manager.become_leader(topic.name, partition, topic.topic_id, state.leader_epoch,
                                          state.replicas, state.isr, config)

    def topic_config_changed(self, topic: TopicMetadata) -> None:
        self.log_services.topic_config_changed(topic)

    def stop_replica(self, topic: str, partition: int, delete: bool) -> None:
        self.replica_manager.stop_replica(topic, partition, delete)
        if delete and self.group_coordinator is not None:
            # Kafka's StopReplica with delete: committed offsets of the partition go too.
            self.group_coordinator.on_partitions_deleted([(topic, partition)])
