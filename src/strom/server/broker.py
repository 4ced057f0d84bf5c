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
their handlers (server/apis/controller_apis.py).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import resource
import socket
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from strom import heap
from strom.client import AsyncConnection, ClientSecurity
from strom.client.inter_broker import BrokerConnections
from strom.config.broker import BrokerConfig, Listener
from strom.config.dynamic import DEFAULT_ENTITY, DynamicBrokerConfig
from strom.config.repository import ConfigRepository
from strom.controller import znodes
from strom.controller.admin import TopicAdmin, read_configs
from strom.controller.channel import ControllerChannelManager
from strom.controller.controller import KafkaController
from strom.controller.features import NONE_FINALIZED, FinalizedFeatures
from strom.controller.security_store import StoreSecurityMetadata
from strom.controller.store import LocalMetadataStore, MetadataStore, NodeExists, StoreUnavailable
from strom.controller.znodes import BrokerInfo, EndPoint
from strom.coordinator.group import GroupCoordinator
from strom.coordinator.transaction.coordinator import TransactionCoordinator
from strom.coordinator.transaction.producer_id_manager import ProducerIdManager
from strom.log.config import LogConfig
from strom.log.manager import LogManager, new_cluster_id
from strom.log.open_files import OPEN_FILES
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
from strom.server.log_retention import DISK_SPACE_CHECK_MS, LogRetention
from strom.server.log_services import LogServices
from strom.server.producer_states import ProducerStates
from strom.server.scheduler import KafkaScheduler
from strom.server.txn_marker_channel import TransactionMarkerChannelManager
from strom.share.partition_manager import SharePartitionManager

log = logging.getLogger(__name__)

METADATA_FILE = "strom-metadata.json"
FIRST_METADATA_TIMEOUT_S = 30.0
CONTROLLED_SHUTDOWN = 7
FD_RESERVE = 256  # descriptors neither log files nor client connections may take


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
        self._store_thread: ThreadPoolExecutor | None = None
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
        self._feature_watch = None

    def _features_changed(self, data, version: int) -> None:
        # The store's thread: one assignment of an immutable value, read by the event loop.
        if data is None:
            self.finalized_features = NONE_FINALIZED
        elif version >= self.finalized_features.epoch:  # never back to an older read
            self.finalized_features = FinalizedFeatures(znodes.decode_features(data), version)

    # --- lifecycle -----------------------------------------------------------------------
    async def startup(self) -> None:
        self.state = BrokerState.STARTING
        self._loop = asyncio.get_running_loop()
        self.inter_broker_security = broker_security(self.config)  # before anything connects
        load_all()
        self._budget_file_descriptors()
        self.log_manager.lock_dirs()  # before anything reads or writes them (metadata file too)
        self.store = await asyncio.to_thread(self._open_store)
        self.config_repository = ConfigRepository(self.store, self.store_io, self._config_changed)
        cluster_id = await self.store_io(self._stored_cluster_id)
        if cluster_id is None and self.clustered:  # the first broker of a new cluster names it
            cluster_id = await self.store_io(self._record_cluster_id, new_cluster_id())
        await self.store_io(self.config_repository.load)
        self.delegation_tokens = self._delegation_tokens()
        await self.store_io(self.delegation_tokens.load)
        self.authorizer = self._create_authorizer()
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
            await self.store_io(self._record_cluster_id, self.cluster_id)
        self.admin = TopicAdmin(self.store, self.metadata_cache.broker_racks, self._validate_topic_configs,
                                self.metadata_cache.replica_counts,
                                lambda: self.config["max.broker.partitions"])
        self.log_services.load_dynamic_config()
        self.producer_id_manager = ProducerIdManager(self.store, self.broker_id)
        await self.socket_server.start(self.listeners, self.config["socket.send.buffer.bytes"],
                                       self.config["socket.receive.buffer.bytes"])
        self.advertised = self._advertised_listeners()
        if self.config["metrics.port"] >= 0:
            from strom.metrics.endpoint import MetricsServer  # loads prometheus-client

            self.socket_server.enable_metrics()
            self.metrics_server = MetricsServer(self)
            self.metrics_server.start(self.config["metrics.host"], self.config["metrics.port"])
        await self.config_repository.start()
        await self.delegation_tokens.start()
        self._feature_watch = await self.store_io(self.store.watch_data, znodes.FEATURE, self._features_changed)
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
        """This broker's candidate for controller of a ZooKeeper cluster (or the embedded
        broker's controller); it runs for election at once."""
        self.store.add_session_listener(self._session_event)
        self.controller = KafkaController(
            self.store, self.store_io, self.broker_id,
            lambda: ControllerChannelManager(self.broker_id, self.inter_broker_listener,
                                             self._deliver_from_controller, self.inter_broker_security),
            lambda topic: self.log_config_for(topic).unclean_leader_election_enable,
            found_intact=self.log_manager.found_intact)
        await self.controller.startup()
        if (node := await self.store_io(self.store.get, znodes.FEATURE)) is not None:
            self._features_changed(*node)  # made by this controller just now: known before serving

    async def shutdown(self) -> None:
        if self.state in (BrokerState.SHUTTING_DOWN, BrokerState.PENDING_CONTROLLED_SHUTDOWN):
            return
        self.log_manager.background_load_stopped = True  # a stop soon after a start: no more reading logs
        if self.clustered and self.config["controlled.shutdown.enable"] and self.broker_epoch >= 0:
            await self._controlled_shutdown()
        # What the stop makes (100,000 logs closed, snapshots, checkpoints) is garbage by the end
        # of it: full collections walking it held a stop of 100,000 partitions twice.
        with heap.collections_paused():
            await self._stop()

    async def _stop(self) -> None:
        self.state = BrokerState.SHUTTING_DOWN
        self.stopping = True
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
            if self._feature_watch is not None:
                self._feature_watch.cancel()
            if self.authorizer is not None:
                self.authorizer.stop()
        if self._logs_open:  # a start-up that failed before (say, on a locked dir) writes nothing
            await self.log_services.stop()
            await self.producer_states.snapshot(at_shutdown=True)
            await asyncio.to_thread(self.log_manager.shutdown)
        self.log_manager.unlock_dirs()
        if self.store is not None:
            await asyncio.to_thread(self.store.close)  # a clustered broker's znode goes at once
        if self._store_thread is not None:
            self._store_thread.shutdown(wait=False)
        self.state = BrokerState.NOT_RUNNING

    async def _controlled_shutdown(self) -> None:
        """Seed 001's controlled shutdown: ask the controller to move leadership off this broker
        (and out of every ISR) while it still serves, so clients and followers move over
        before it goes. Retried `controlled.shutdown.max.retries` times."""
        self.state = BrokerState.PENDING_CONTROLLED_SHUTDOWN
        retries = self.config["controlled.shutdown.max.retries"]
        fields = {"broker_id": self.broker_id, "broker_epoch": self.broker_epoch}
        for attempt in range(retries + 1):
            unreachable: int | None = None
            try:
                controller = self.metadata_cache.controller_id
                if controller == self.broker_id:
                    response = await self.deliver_local(CONTROLLED_SHUTDOWN, 3, fields)
                else:
                    host, port = self.broker_endpoint(controller)
                    conn = await AsyncConnection.open(host, port, f"broker-{self.broker_id}-shutdown",
                                                      security=self.inter_broker_security)
                    try:
                        response = await conn.call(CONTROLLED_SHUTDOWN, 3, fields)
                    finally:
                        conn.close()
                if response.error_code == ErrorCode.NONE and not response.remaining_partitions:
                    log.info("controlled shutdown succeeded: this broker leads nothing more")
                    return
                if response.error_code == ErrorCode.NOT_CONTROLLER:
                    # It resigned meanwhile (stopping too, say): its successor is asked once known.
                    log.info("controlled shutdown: broker %d is no longer the controller", controller)
                    unreachable = controller
                else:
                    log.warning("controlled shutdown: %s, %d partitions still led here",
                                ErrorCode(response.error_code).name, len(response.remaining_partitions))
            except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError, LookupError) as e:
                log.warning("controlled shutdown request failed: %s", e or type(e).__name__)
                unreachable = controller
            if attempt < retries:
                backoff = self.config["controlled.shutdown.retry.backoff.ms"] / 1000
                if unreachable is None:
                    await asyncio.sleep(backoff)
                else:  # the controller is gone (stopping too, say): ask its successor once known
                    await self.metadata_cache.wait_for(
                        lambda gone=unreachable: self.metadata_cache.controller_id not in (gone, -1),
                        backoff)
        log.warning("controlled shutdown incomplete after %d retries; shutting down anyway", retries)

    # --- the metadata store ------------------------------------------------------------------
    def _open_store(self) -> MetadataStore:
        # Every store call runs on this thread: ZooKeeper round trips, and the local store's
        # journal fsyncs, never on the event loop.
        self._store_thread = ThreadPoolExecutor(1, thread_name_prefix="metadata-io")
        if not self.clustered:
            return LocalMetadataStore(self.config.log_dirs[0] / METADATA_FILE)
        from strom.controller.zk_store import ZooKeeperMetadataStore  # kazoo only when clustered

        session_ms = self.config["zookeeper.session.timeout.ms"]
        connect = self.config["zookeeper.connect"]
        timeout_ms = self.config["zookeeper.connection.timeout.ms"] or session_ms
        log.info("connecting to ZooKeeper at %s (up to %d ms: zookeeper.connection.timeout.ms)",
                 connect, timeout_ms)
        # kazoo logs every refused attempt (ten a second); the outcome is said in one line.
        kazoo_log = logging.getLogger("kazoo.client")
        kazoo_log.disabled = True
        try:
            store = ZooKeeperMetadataStore(connect, session_ms, timeout_ms,
                                           self.config["zookeeper.digest.auth"],
                                           self.config["zookeeper.set.acl"])
            for path in znodes.PERSISTENT_PATHS:
                try:
                    store.create(path)
                except NodeExists:
                    pass
        except StoreUnavailable as e:  # a start-up failure like any other: one line, exit 1
            raise ConnectionError(str(e)) from None
        kazoo_log.disabled = False  # a session lost later is worth its log lines
        return store

    async def store_io(self, fn: Callable, *args, **kwargs):
        """Run a metadata-store call on the store's thread, so the calling loop keeps serving
        (a ZooKeeper round trip; the local store's fsync)."""
        return await asyncio.get_running_loop().run_in_executor(self._store_thread,
                                                                partial(fn, *args, **kwargs))

    def _stored_cluster_id(self) -> str | None:
        node = self.store.get(znodes.CLUSTER_ID)
        return node[0]["id"] if node and isinstance(node[0], dict) else None

    def _record_cluster_id(self, cluster_id: str) -> str:
        """Create /cluster/id unless another broker did first; the id that is stored."""
        try:
            self.store.create(znodes.CLUSTER_ID, {"version": "1", "id": cluster_id})
        except NodeExists:
            return self._stored_cluster_id()
        return cluster_id

    async def _register(self) -> None:
        """Create /brokers/ids/<id> (ephemeral); its creation zxid is this broker's epoch. After
        a kill -9 the old registration lives until its session times out: wait for that."""
        info = BrokerInfo(self.broker_id, [EndPoint(a.name, a.host, a.port, self._protocol_of(a.name))
                                           for a in self.advertised], self.config["broker.rack"])
        path = f"{znodes.BROKER_IDS}/{self.broker_id}"
        deadline = time.monotonic() + self.config["zookeeper.session.timeout.ms"] / 1000 * 2 + 5
        while True:
            try:
                await self.store_io(self.store.create, path, info.encode(), ephemeral=True)
                break
            except NodeExists:
                if time.monotonic() > deadline:
                    raise ValueError(f"broker id {self.broker_id} is already registered at {path} "
                                     "by a running broker") from None
                log.info("waiting for the previous registration of broker %d to expire", self.broker_id)
                await asyncio.sleep(0.5)
        node = await self.store_io(self.store.get_stat, path)
        self.broker_epoch = node[1].czxid
        log.info("registered broker %d at %s with broker epoch %d", self.broker_id, path, self.broker_epoch)

    def _session_event(self, event: str) -> None:
        """From the store's thread: the ZooKeeper session expired (our ephemeral nodes are gone)
        or a new one began (register again, run for controller again)."""
        loop = self._loop
        if event == "expired":
            log.warning("ZooKeeper session expired")
            loop.call_soon_threadsafe(self.controller.session_expired)
        elif event == "reconnected":
            async def rejoin() -> None:
                await self._register()
                self.controller.session_reconnected()

            loop.call_soon_threadsafe(lambda: loop.create_task(rejoin()))

    def _create_authorizer(self) -> Authorizer | None:
        return authorizer_from_config(self.config, StoreSecurityMetadata(self.store, self.store_io))

    def _protocol_of(self, listener: str) -> str:
        return self.config.protocol_of(listener)

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
        return await self._handle_local(api_key, version, build(REQUESTS[api_key], version, fields))

    async def _handle_local(self, api_key: int, version: int, body):
        header = RequestHeader(api_key, version, 0, f"controller-{self.broker_id}",
                               is_flexible(api_key, version))
        ctx = RequestContext(header, self.inter_broker_listener, "controller", INTERNAL)
        response = await self.apis.handle(ctx, body)
        return build(RESPONSES[api_key], version, response)

    async def _deliver_from_controller(self, api_key: int, version: int, fields: dict):
        """The controller's requests to this broker: built on the controller's loop (a
        LeaderAndIsr of 10,000 partitions is not cheap), handled on this broker's."""
        body = build(REQUESTS[api_key], version, fields)
        future = asyncio.run_coroutine_threadsafe(self._handle_local(api_key, version, body), self._loop)
        return await asyncio.wrap_future(future)

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
                 self._auto_leader_rebalance)
        lag_ms = config["replica.lag.time.max.ms"]
        schedule("isr-expiration", max(lag_ms // 2, 1), lambda: self.replica_manager.maybe_shrink_isr(lag_ms))
        schedule("follower-stall-check", STALL_CHECK_MS, self.replica_fetchers.check_stalls)
        schedule("producer-id-expiration", config["producer.id.expiration.check.interval.ms"],
                 self.producer_states.expire)
        if self.delegation_tokens.enabled and self.delegation_tokens.expires_locally:
            schedule("delegation-token-expiration", config["delegation.token.expiry.check.interval.ms"],
                     partial(self.store_io, self.delegation_tokens.remove_expired))

    def _auto_leader_rebalance(self) -> None:
        if self.config["auto.leader.rebalance.enable"] and self.controller is not None and self.controller.is_active:
            self.controller.events.put("auto_rebalance", self.config["leader.imbalance.per.broker.percentage"])

    def _budget_file_descriptors(self) -> None:
        """Raise the open-file limit to its hard maximum (as the JVM does for Kafka) and split it:
        half for log files (a bounded cache: partitions are not capped by the limit), most of
        the rest for client connections, and a reserve for everything else (checkpoints, the
        cleaner, the metadata store), so clients can never starve the log of descriptors."""
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = max(soft, 1 << 20)
        if soft < hard:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
                soft = hard
            except (ValueError, OSError) as e:
                log.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, e)
        OPEN_FILES.capacity = max(64, soft // 2)
        self.socket_server.max_connections_by_fds = max(16, soft - OPEN_FILES.capacity - FD_RESERVE)
        log.info("open-file limit %d: log files keep at most %d open, clients at most %d connections",
                 soft, OPEN_FILES.capacity, self.socket_server.max_connections_by_fds)

    async def _delete_orphan_logs(self) -> None:
        """The embedded broker: logs on disk of partitions the metadata store no longer has (a deletion the broker
        stopped in the middle of). Decided by the store, not by what is hosted yet: the
        controller's LeaderAndIsr of a large topic arrives in chunks and may still be applying
        when the first UpdateMetadata lets start-up go on (hosted-so-far once deleted the last
        2,000 partitions of a 20,000-partition topic at a restart)."""
        if self.clustered:
            return
        stored = await self.store_io(self._stored_partitions)
        for tp, _ in list(self.log_manager.logs()):
            if tp not in stored:
                log.info("deleting log %s-%d of a topic that no longer exists", *tp)
                self.log_manager.delete_log(*tp)

    def _stored_partitions(self) -> set[tuple[str, int]]:
        """Every partition of every topic in the metadata store (blocking: store_io)."""
        names = self.store.children(znodes.TOPICS)
        out: set[tuple[str, int]] = set()
        for name, node in zip(names, self.store.get_many([znodes.topic_path(n) for n in names]), strict=True):
            if node is not None:
                out.update((name, index) for index in znodes.decode_assignment(node[0])[1])
        return out

    # --- what handlers and the controller use -----------------------------------------------
    @property
    def listeners(self) -> list[Listener]:
        """The listeners this broker serves: all but a KRaft node's controller listeners."""
        return [x for x in self.config.listeners if x.name not in self.config.controller_listener_names]

    @property
    def controller_id(self) -> int:
        return self.metadata_cache.controller_id

    def _advertised_listeners(self) -> list[Listener]:
        configured = self.config["advertised.listeners"]
        by_name = {a.name: a for a in configured or []}
        out = []
        for listener in self.listeners:
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
