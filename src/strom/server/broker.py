"""One broker process: start-up and shut-down in the order of seed 000's KafkaServer.startup.

config -> metadata store (ZooKeeper, or the local file of the embedded broker) -> log manager
(recovery) -> socket server -> registration under /brokers/ids -> controller (election) ->
first metadata from the controller -> coordinators -> scheduled tasks -> RUNNING. Shut-down
reverses it: stop accepting, let in-flight requests finish, resign, flush and checkpoint,
mark the clean shutdown so the next start skips recovery.

Broker only assembles and orders. The work between start-up and shut-down is done by the
components it holds: the socket server and KafkaApis (network/, server/apis/), the replica
manager, fetchers and AlterPartition, and the managers Kafka names, one module each:
AutoTopicCreationManager (auto_topic_creation.py), Coordinators (coordinators.py: the
coordinators' internal-topic partitions), TransactionMarkerChannelManager
(txn_marker_channel.py), AddPartitionsToTxnManager (add_partitions_to_txn.py), KafkaScheduler
(scheduler.py), LogRetention (log_retention.py: retention and disk space) and ProducerStates
(producer_states.py: producer expiry and snapshots). The controller's requests are applied by
their handlers (server/apis/controller_apis.py). The metadata store's side (opening it on its
own thread, the cluster id, registration under /brokers/ids, the /feature watch, the ZooKeeper-mode
controller, controlled shutdown) is StoreLifecycle's (store_lifecycle.py).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from strom import heap
from strom.client import ClientSecurity
from strom.client.inter_broker import BrokerConnections
from strom.config.broker import BrokerConfig, Listener, advertised_listeners
from strom.config.dynamic import DEFAULT_ENTITY, DynamicBrokerConfig
from strom.config.repository import ConfigRepository
from strom.controller.admin import TopicAdmin, read_configs
from strom.controller.controller import KafkaController
from strom.controller.features import NONE_FINALIZED, FinalizedFeatures
from strom.controller.security_store import StoreSecurityMetadata
from strom.controller.store import MetadataStore
from strom.coordinator.group import GroupCoordinator
from strom.coordinator.transaction.coordinator import TransactionCoordinator
from strom.coordinator.transaction.producer_id_manager import ProducerIdManager
from strom.log.config import LogConfig
from strom.log.manager import LogManager
from strom.metadata.cache import MetadataCache
from strom.network.request import RequestContext
from strom.network.socket_server import SocketServer
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.messages import REQUESTS, RESPONSES, RequestHeader, build, is_flexible
from strom.replication.alter_partition import AlterPartitionManager
from strom.replication.fetch_session import FetchSessionCache
from strom.replication.log_dir_mover import LogDirMover
from strom.replication.quota import ReplicationQuota
from strom.replication.replica_fetcher import STALL_CHECK_MS, ReplicaFetcherManager
from strom.replication.replica_manager import ReplicaManager
from strom.security.authorizer import INTERNAL, Authorizer, authorizer_from_config
from strom.security.delegation_tokens import DelegationTokens, TokenCache
from strom.security.sasl import broker_security
from strom.server.add_partitions_to_txn import AddPartitionsToTxnManager
from strom.server.apis import KafkaApis, load_all
from strom.server.auto_topic_creation import AutoTopicCreationManager
from strom.server.coordinators import Coordinators
from strom.server.iceberg_topics import IcebergTopics, start_iceberg_topics
from strom.server.log_retention import DISK_SPACE_CHECK_MS, LogRetention
from strom.server.log_services import LogServices
from strom.server.producer_states import ProducerStates
from strom.server.scheduler import KafkaScheduler
from strom.server.schema_registry import start_schema_registry, stop_schema_registry
from strom.server.store_lifecycle import StoreLifecycle
from strom.server.tiered_storage import start_remote_log_manager
from strom.server.txn_marker_channel import TransactionMarkerChannelManager
from strom.share.partition_manager import SharePartitionManager

if TYPE_CHECKING:
    from strom.remote.manager import RemoteLogManager

log = logging.getLogger(__name__)

FIRST_METADATA_TIMEOUT_S = 30.0


class BrokerState(enum.Enum):
    NOT_RUNNING = 0
    STARTING = 1
    RECOVERY = 2
    RUNNING = 3
    PENDING_CONTROLLED_SHUTDOWN = 6
    SHUTTING_DOWN = 7


class Broker:
    # What a KRaft node's broker replaces (server/kraft/broker.py): its log manager leaves the
    # metadata partition to Raft and keeps meta.properties as formatted; its APIs add KRaft's.
    log_manager_class = LogManager
    apis_class = KafkaApis
    # Admin requests are decided here against this broker's metadata (a KRaft broker forwards
    # them to the controller, which decides against its own image).
    forwards_admin = False

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        if config.ignored:
            log.warning("these Kafka configs have no effect in Strom and are ignored: %s",
                        ", ".join(config.ignored))
        self.broker_id = config.broker_id
        self.broker_epoch = -1
        self.state = BrokerState.NOT_RUNNING
        self.default_log_config = config.default_log_config()
        self.log_manager = self.log_manager_class(config.log_dirs, self.default_log_config,
                                                  recovery_threads=config["num.recovery.threads.per.data.dir"])
        self.log_manager.min_free_bytes = config["log.dir.min.free.bytes"]
        self.dynamic_config = DynamicBrokerConfig(config)
        self.log_services = LogServices(self)  # cleaner, flusher, live reconfiguration
        self.metadata_cache = MetadataCache(self.broker_id)
        self.fetch_sessions = FetchSessionCache(config["max.incremental.fetch.session.cache.slots"])
        self.replica_manager = ReplicaManager(
            self.broker_id, self.log_manager,
            lambda topic, index: self.metadata_cache.partition(topic, index) is not None)
        self.apis = self.apis_class(self)
        self.socket_server = SocketServer(self, self.apis, config["socket.request.max.bytes"],
                                          config["queued.max.request.bytes"])
        self.clustered = bool(config["zookeeper.connect"])
        self.store: MetadataStore | None = None
        self.store_lifecycle = StoreLifecycle(self)  # its thread, registration, the ZooKeeper controller
        self.config_repository: ConfigRepository | None = None
        self.admin: TopicAdmin | None = None
        self.controller: KafkaController | None = None
        self.controller_channel = None  # a KRaft broker's way to the quorum's active controller
        self.replica_fetchers: ReplicaFetcherManager | None = None
        self.alter_partition: AlterPartitionManager | None = None
        self.leader_endpoints: dict[int, tuple[str, int]] = {}  # from LeaderAndIsr's live leaders
        self.connections = BrokerConnections(self)
        self.log_dir_mover = LogDirMover(self)
        # The managers that do the broker's work between start-up and shut-down.
        self.scheduler = KafkaScheduler()
        self.auto_topics = AutoTopicCreationManager(self)
        self.internal_partitions = self.auto_topics.internal_partitions  # the group coordinator's wiring reads it
        self.coordinators = Coordinators(self)
        self.txn_markers = TransactionMarkerChannelManager(self)
        self.add_partitions_to_txn = AddPartitionsToTxnManager(self)
        self.log_retention = LogRetention(self.log_manager)
        self.producer_states = ProducerStates(self)
        self.group_coordinator: GroupCoordinator | None = None
        self.share_partitions = SharePartitionManager(self)  # KIP-932 share sessions and partitions
        # Kafka 4.1: a share consumer's connection that closes gives back what its sessions hold.
        self.socket_server.connection_listeners.append(self.share_partitions.connection_closed)
        self.group_configs: dict[str, dict[str, str]] = {}  # GROUP config resource overrides
        self.txn_coordinator: TransactionCoordinator | None = None
        self.cluster_id = ""
        self.advertised: list[Listener] = []
        self._logs_open = False
        self.stopping = False
        self.metrics_server = None  # metrics.endpoint.MetricsServer when metrics.port is set
        self.inter_broker_security: ClientSecurity | None = None
        self.authorizer: Authorizer | None = None  # authorizer.class.name set: ACLs decide
        self.finalized_features: FinalizedFeatures = NONE_FINALIZED  # /feature, as last seen
        self.remote_log_manager: RemoteLogManager | None = None  # remote.log.storage.system.enable
        self.iceberg_topics: IcebergTopics | None = None  # iceberg.enabled

    # --- lifecycle -----------------------------------------------------------------------
    async def startup(self) -> None:
        self.state = BrokerState.STARTING
        self.inter_broker_security = broker_security(self.config)  # before anything connects
        load_all()
        self.socket_server.budget_file_descriptors()
        self.log_manager.lock_dirs()  # before anything reads or writes them (metadata file too)
        self.store = await self.store_lifecycle.open()
        self.config_repository = ConfigRepository(self.store, self.store_io, self._config_changed)
        cluster_id = await self.store_lifecycle.cluster_id()
        await self.store_io(self.config_repository.load)
        self.delegation_tokens = self._delegation_tokens()
        await self.store_io(self.delegation_tokens.load)
        self.authorizer = authorizer_from_config(self.config, StoreSecurityMetadata(self.store, self.store_io))
        if self.authorizer is not None:
            await self.store_io(self.authorizer.load)
        self.state = BrokerState.RECOVERY
        heap.watch_collections()
        self.cluster_id = self.log_manager.startup(self.broker_id, cluster_id, self.log_config_for)
        heap.settle_after_bulk_change(len(self.log_manager))  # with the metadata store read before
        self._logs_open = True
        self.replica_manager.checkpointed_hw = self.log_manager.read_high_watermarks()
        self.replica_fetchers = ReplicaFetcherManager(self)
        self.alter_partition = AlterPartitionManager(self)
        self.replica_manager.alter_isr = self.alter_partition.submit
        self.replica_manager.isr_eligible = self.isr_eligible
        self.replica_manager.leader_quota = ReplicationQuota(
            lambda: self.config["leader.replication.throttled.rate"])
        if cluster_id is None:
            await self.store_lifecycle.record_cluster_id(self.cluster_id)
        self.admin = TopicAdmin(self.store, self.metadata_cache.broker_racks, self._validate_topic_configs,
                                self.metadata_cache.replica_counts,
                                lambda: self.config["max.broker.partitions"])
        self.log_services.load_dynamic_config()
        self.producer_id_manager = ProducerIdManager(self.store, self.broker_id)
        await self.socket_server.start(self.listeners, self.config["socket.send.buffer.bytes"],
                                       self.config["socket.receive.buffer.bytes"])
        self.advertised = advertised_listeners(self.config["advertised.listeners"], self.listeners,
                                               self.socket_server.bound)
        if self.config["metrics.port"] >= 0:
            from strom.metrics.endpoint import MetricsServer  # loads prometheus-client

            self.socket_server.enable_metrics()
            self.metrics_server = MetricsServer(self)
            self.metrics_server.start(self.config["metrics.host"], self.config["metrics.port"])
        await self.config_repository.start()
        await self.delegation_tokens.start()
        await self.store_lifecycle.watch_features()
        if self.authorizer is not None:
            await self.authorizer.start()
        await self._register()
        await self._start_controller()
        if not await self.metadata_cache.wait_for(
                lambda: self.broker_id in self.metadata_cache.live_brokers, FIRST_METADATA_TIMEOUT_S):
            log.warning("no metadata from a controller after %.0f s; serving anyway",
                        FIRST_METADATA_TIMEOUT_S)
        await self._delete_orphan_logs()
        self.group_configs = self.config_repository.groups  # kept current by /config/changes
        self.group_coordinator, self.txn_coordinator = self.coordinators.start()  # before serving
        self.remote_log_manager = start_remote_log_manager(self)
        self.iceberg_topics = start_iceberg_topics(self)
        self.schema_registry = await start_schema_registry(self)  # schema.registry.listeners set
        self._schedule_jobs()
        self.log_services.start()
        self.state = BrokerState.RUNNING
        self.socket_server.ready.set()
        # Logs trusted after a clean shutdown were opened without reading them: read them now,
        # off the loop, before clients and timers need them.
        self.scheduler.once("load-logs", self.replica_manager.load_in_background())

    def _delegation_tokens(self) -> TokenCache:
        """Where this broker's delegation tokens come from: the metadata store's nodes."""
        return DelegationTokens(StoreSecurityMetadata(self.store, self.store_io), self.config)

    async def _start_controller(self) -> None:
        """This broker's candidate for controller of a ZooKeeper cluster (or the embedded broker's)."""
        await self.store_lifecycle.start_controller()

    async def shutdown(self) -> None:
        if self.state in (BrokerState.SHUTTING_DOWN, BrokerState.PENDING_CONTROLLED_SHUTDOWN):
            return
        self.log_manager.background_load_stopped = True  # a stop soon after a start: no more reading logs
        if self.clustered and self.config["controlled.shutdown.enable"] and self.broker_epoch >= 0:
            self.state = BrokerState.PENDING_CONTROLLED_SHUTDOWN
            await self.store_lifecycle.controlled_shutdown()
        # What the stop makes (100,000 logs closed, snapshots, checkpoints) is garbage by the end
        # of it: full collections walking it held a stop of 100,000 partitions twice.
        with heap.collections_paused():
            await self._stop()

    async def _stop(self) -> None:
        self.state = BrokerState.SHUTTING_DOWN
        self.stopping = True
        if self.remote_log_manager is not None:  # first: its long polls to this broker would hold the drain
            await self.remote_log_manager.close()
        if self.iceberg_topics is not None:  # its translators long-poll this broker too
            await self.iceberg_topics.close()
        await stop_schema_registry(self)  # before the drain: its reader long-polls this broker
        if self.metrics_server is not None:
            await asyncio.to_thread(self.metrics_server.stop)
        await self.socket_server.stop_accepting()
        self.coordinators.shutdown()
        for key in list(self.replica_manager.partitions):
            self.replica_manager.fetch_purgatory.wake(key)  # long polls answer now
        await self.socket_server.drain(timeout=10)
        self.scheduler.shutdown()
        self.connections.close()
        if self.replica_fetchers is not None:
            self.replica_fetchers.shutdown()
            self.alter_partition.shutdown()
        if self.controller is not None:
            await self.controller.shutdown()
        if self.config_repository is not None:
            self.config_repository.stop()
            self.delegation_tokens.stop()
            if self.authorizer is not None:
                self.authorizer.stop()
        if self._logs_open:  # a start-up that failed before (say, on a locked dir) writes nothing
            await self.log_services.stop()
            await self.producer_states.snapshot(at_shutdown=True)
            await asyncio.to_thread(self.log_manager.shutdown)
        self.log_manager.unlock_dirs()
        await self.store_lifecycle.close()  # the /feature watch, the store (a clustered broker's znode goes at once)
        self.state = BrokerState.NOT_RUNNING

    # --- the metadata store ------------------------------------------------------------------
    async def store_io(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run a metadata-store call on the store's thread, so the calling loop keeps serving."""
        return await self.store_lifecycle.io(fn, *args, **kwargs)

    async def _register(self) -> None:
        """Register under /brokers/ids; its creation zxid is this broker's epoch."""
        await self.store_lifecycle.register()

    async def _delete_orphan_logs(self) -> None:
        """The embedded broker: logs of partitions the metadata store no longer has."""
        await self.store_lifecycle.delete_orphan_logs()

    def broker_endpoint(self, broker_id: int) -> tuple[str, int]:
        """Where another broker listens for inter-broker requests (LookupError if unknown)."""
        info = self.metadata_cache.live_brokers.get(broker_id)
        endpoint = info.endpoint(self.inter_broker_listener) if info is not None else None
        if endpoint is not None:
            return endpoint.host, endpoint.port
        if broker_id in self.leader_endpoints:
            return self.leader_endpoints[broker_id]
        raise LookupError(f"no endpoint known for broker {broker_id}")

    @property
    def inter_broker_listener(self) -> str:
        return self.config.inter_broker_listener

    async def deliver_local(self, api_key: int, version: int, fields: dict):
        """Inter-broker requests between this broker and its own controller: the same
        handler as over the wire."""
        return await self.handle_local(api_key, version, build(REQUESTS[api_key], version, fields))

    async def handle_local(self, api_key: int, version: int, body: Any) -> Any:
        header = RequestHeader(api_key, version, 0, f"controller-{self.broker_id}",
                               is_flexible(api_key, version))
        ctx = RequestContext(header, self.inter_broker_listener, "controller", INTERNAL)
        response = await self.apis.handle(ctx, body)
        return build(RESPONSES[api_key], version, response)

    def _schedule_jobs(self) -> None:
        """The periodic jobs (Kafka's KafkaScheduler tasks), started once the coordinators are."""
        config, schedule = self.config, self.scheduler.schedule
        schedule("log-retention", config["log.retention.check.interval.ms"], self.log_retention.run)
        schedule("log-dir-space", DISK_SPACE_CHECK_MS, self.log_retention.check_disk_space)
        schedule("recovery-point-checkpoint", config["log.flush.offset.checkpoint.interval.ms"],
                 self.log_services.checkpoint_recovery_points)
        schedule("group-metadata-expiration", config["offsets.retention.check.interval.ms"],
                 self.group_coordinator.cleanup_group_metadata)
        schedule("transaction-abort", config["transaction.abort.timed.out.transaction.cleanup.interval.ms"],
                 self.txn_coordinator.abort_timed_out)
        schedule("transactional-id-expiration", config["transaction.remove.expired.transaction.cleanup.interval.ms"],
                 self.txn_coordinator.remove_expired)
        schedule("auto-leader-rebalance", config["leader.imbalance.check.interval.seconds"] * 1000,
                 self.store_lifecycle.auto_leader_rebalance)
        lag_ms = config["replica.lag.time.max.ms"]
        schedule("isr-expiration", max(lag_ms // 2, 1), lambda: self.replica_manager.maybe_shrink_isr(lag_ms))
        schedule("follower-stall-check", STALL_CHECK_MS, self.replica_fetchers.check_stalls)
        schedule("producer-id-expiration", config["producer.id.expiration.check.interval.ms"],
                 self.producer_states.expire)
        if self.delegation_tokens.enabled and self.delegation_tokens.expires_locally:
            schedule("delegation-token-expiration", config["delegation.token.expiry.check.interval.ms"],
                     partial(self.store_io, self.delegation_tokens.remove_expired))

    # --- what handlers and the controller use -----------------------------------------------
    @property
    def listeners(self) -> list[Listener]:
        """The listeners this broker serves: all but a KRaft node's controller listeners."""
        return [x for x in self.config.listeners if x.name not in self.config.controller_listener_names]

    @property
    def controller_id(self) -> int:
        return self.metadata_cache.controller_id

    def endpoints(self, listener_name: str) -> list[dict]:
        """Live brokers reachable on `listener_name`, as the controller last said."""
        return self.metadata_cache.brokers(listener_name)

    def isr_eligible(self, replica: int) -> bool:
        """Whether a caught-up follower may join an ISR: a broker the controller counts live."""
        return replica in self.metadata_cache.live_brokers

    def fenced_endpoints(self, listener_name: str) -> list[dict]:
        """Registered brokers the controller has fenced, as `endpoints` lists the live ones. A
        ZooKeeper cluster has none: a broker whose session ended is no longer registered."""
        return []

    def require_controller(self) -> None:
        """CreateTopics, DeleteTopics and CreatePartitions go to the controller, as in Kafka:
        clients find it in Metadata and retry there on NOT_CONTROLLER."""
        if self.controller is None or not self.controller.is_active:
            raise KafkaError("This is not the correct controller for this cluster.",
                             ErrorCode.NOT_CONTROLLER)

    async def read_topic_configs(self, topic: str) -> dict[str, str]:
        """A topic's configs as the metadata store holds them now (not as last cached)."""
        return await self.store_io(read_configs, self.store, "topics", topic)

    def topic_configs(self, topic: str) -> dict[str, str]:
        return self.config_repository.topic(topic) if self.config_repository else {}

    def log_config_for(self, topic: str) -> LogConfig:
        configs = self.topic_configs(topic)
        return self.default_log_config.with_overrides(configs) if configs else self.default_log_config

    def _validate_topic_configs(self, configs: Mapping[str, str]) -> None:
        self.default_log_config.with_overrides(configs)

    def _config_changed(self, entity_type: str, name: str) -> None:
        """A /config/changes notification from another broker (or this one)."""
        if entity_type == "topics":
            self.log_services.topic_config_changed(name)
        elif name in (DEFAULT_ENTITY, str(self.broker_id)):
            self.log_services.load_dynamic_config()

    def broker_configs(self, entity: str) -> dict[str, str]:
        return self.config_repository.broker(entity)
