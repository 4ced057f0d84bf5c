"""One broker process: start-up and shut-down in the order of seed 000's KafkaServer.startup.

config -> metadata store (ZooKeeper, or the local file of the embedded broker) -> log manager
(recovery) -> socket server -> registration under /brokers/ids -> controller (election) ->
first metadata from the controller -> coordinators -> scheduled tasks -> RUNNING. Shut-down
reverses it: stop accepting, let in-flight requests finish, resign, flush and checkpoint,
mark the clean shutdown so the next start skips recovery.
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

from strom.client import AsyncConnection, ClientSecurity
from strom.config.broker import BrokerConfig, Listener
from strom.config.dynamic import DEFAULT_ENTITY, DynamicBrokerConfig
from strom.config.repository import ConfigRepository
from strom.controller import znodes
from strom.controller.admin import TopicAdmin, read_configs
from strom.controller.channel import ControllerChannelManager
from strom.controller.controller import KafkaController
from strom.controller.features import NONE_FINALIZED, FinalizedFeatures
from strom.controller.store import LocalMetadataStore, MetadataStore, NodeExists
from strom.controller.znodes import BrokerInfo, EndPoint, TopicMetadata
from strom.coordinator import GROUP_METADATA_TOPIC, TRANSACTION_STATE_TOPIC, partition_for
from strom.coordinator.group import GroupCoordinator, create_group_coordinator
from strom.coordinator.transaction.coordinator import TransactionCoordinator
from strom.coordinator.transaction.manager import TransactionStateManager
from strom.coordinator.transaction.producer_id_manager import ProducerIdManager
from strom.log.config import LogConfig
from strom.log.manager import LogManager, new_cluster_id
from strom.log.open_files import OPEN_FILES
from strom.metadata.cache import MetadataCache
from strom.network.request import RequestContext
from strom.network.socket_server import SocketServer
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.messages import REQUESTS, RESPONSES, RequestHeader, build, is_flexible
from strom.security.authorizer import AUTHORIZERS, INTERNAL, Authorizer
from strom.security.delegation_tokens import DelegationTokens
from strom.security.sasl import broker_security
from strom.server.alter_partition import AlterPartitionManager
from strom.server.apis import KafkaApis, load_all
from strom.server.fetch_session import FetchSessionCache
from strom.server.inter_broker import BrokerConnections
from strom.server.log_dir_mover import LogDirMover
from strom.server.log_services import LogServices
from strom.server.replica_fetcher import ReplicaFetcherManager
from strom.server.replica_manager import ReplicaManager
from strom.server.replication_quota import ReplicationQuota

log = logging.getLogger(__name__)

METADATA_FILE = "strom-metadata.json"
# Where each internal topic's settings are (offsets.topic.num.partitions, ...).
_INTERNAL_CONFIG_PREFIX = {GROUP_METADATA_TOPIC: "offsets.topic", TRANSACTION_STATE_TOPIC: "transaction.state.log"}
FIRST_METADATA_TIMEOUT_S = 30.0
WRITE_TXN_MARKERS, ADD_PARTITIONS_TO_TXN = 27, 24
# A marker on its way to another broker: neither written nor given up, so retried.
_MARKER_PENDING = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
CONTROLLED_SHUTDOWN = 7
AUTO_CREATE_WAIT_S = 1.0
DISK_SPACE_CHECK_MS = 1000
FD_RESERVE = 256  # descriptors neither log files nor client connections may take


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
        if config.ignored:
            log.warning("these Kafka configs have no effect in Strom and are ignored: %s",
                        ", ".join(config.ignored))
        self.broker_id = config.broker_id
        self.broker_epoch = -1
        self.state = BrokerState.NOT_RUNNING
        self.default_log_config = config.default_log_config()
        self.log_manager = LogManager(config.log_dirs, self.default_log_config)
        self.log_manager.min_free_bytes = config["log.dir.min.free.bytes"]
        self.dynamic_config = DynamicBrokerConfig(config)
        self.log_services = LogServices(self)  # cleaner, flusher, live reconfiguration
        self.metadata_cache = MetadataCache(self.broker_id)
        self.fetch_sessions = FetchSessionCache(config["max.incremental.fetch.session.cache.slots"])
        self.replica_manager = ReplicaManager(
            self.broker_id, self.log_manager,
            lambda topic, index: self.metadata_cache.partition(topic, index) is not None)
        self.apis = KafkaApis(self)
        self.socket_server = SocketServer(self, self.apis, config["socket.request.max.bytes"],
                                          config["queued.max.request.bytes"])
        self.clustered = bool(config["zookeeper.connect"])
        self.store: MetadataStore | None = None
        self._store_thread: ThreadPoolExecutor | None = None
        self.config_repository: ConfigRepository | None = None
        self.admin: TopicAdmin | None = None
        self.controller: KafkaController | None = None
        self.replica_fetchers: ReplicaFetcherManager | None = None
        self.alter_partition: AlterPartitionManager | None = None
        self.leader_endpoints: dict[int, tuple[str, int]] = {}  # from LeaderAndIsr's live leaders
        self.connections = BrokerConnections(self)
        self.log_dir_mover = LogDirMover(self)
        self._marker_results: dict[tuple, ErrorCode] = {}
        self._markers_in_flight: set[tuple] = set()
        self.group_coordinator: GroupCoordinator | None = None
        self.txn_coordinator: TransactionCoordinator | None = None
        self.cluster_id = ""
        self.advertised: list[Listener] = []
        self._tasks: list[asyncio.Task] = []
        self._logs_open = False
        self.stopping = False
        self.metrics_server = None  # metrics_endpoint.MetricsServer when metrics.port is set
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
        self.delegation_tokens = DelegationTokens(self.store, self.store_io, self.config)
        await self.store_io(self.delegation_tokens.load)
        self.authorizer = self._create_authorizer()
        if self.authorizer is not None:
            await self.store_io(self.authorizer.load)
        self.state = BrokerState.RECOVERY
        self.cluster_id = self.log_manager.startup(self.broker_id, cluster_id, self.log_config_for)
        self._logs_open = True
        self.replica_manager.checkpointed_hw = self.log_manager.read_high_watermarks()
        self.replica_fetchers = ReplicaFetcherManager(self)
        self.alter_partition = AlterPartitionManager(self)
        self.replica_manager.alter_isr = self.alter_partition.submit
        self.replica_manager.leader_quota = ReplicationQuota(
            lambda: self.config["leader.replication.throttled.rate"])
        if cluster_id is None:
            await self.store_io(self._record_cluster_id, self.cluster_id)
        self.admin = TopicAdmin(self.store, self.metadata_cache.broker_racks, self._validate_topic_configs,
                                self.metadata_cache.replica_counts,
                                lambda: self.config["max.broker.partitions"])
        self.log_services.load_dynamic_config()
        self.producer_id_manager = ProducerIdManager(self.store, self.broker_id)
        await self.socket_server.start(self.config.listeners, self.config["socket.send.buffer.bytes"],
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
        self.store.add_session_listener(self._session_event)
        channel = ControllerChannelManager(self.broker_id, self.inter_broker_listener, self.deliver_local,
                                           self.inter_broker_security)
        self.controller = KafkaController(
            self.store, self.store_io, self.broker_id, channel,
            lambda topic: self.log_config_for(topic).unclean_leader_election_enable)
        await self.controller.startup()
        if (node := await self.store_io(self.store.get, znodes.FEATURE)) is not None:
            self._features_changed(*node)  # made by this controller just now: known before serving
        if not await self.metadata_cache.wait_for(
                lambda: self.broker_id in self.metadata_cache.live_brokers, FIRST_METADATA_TIMEOUT_S):
            log.warning("no metadata from a controller after %.0f s; serving anyway",
                        FIRST_METADATA_TIMEOUT_S)
        if not self.clustered:
            self._delete_orphan_logs()
        self.group_coordinator = create_group_coordinator(self)
        self.group_coordinator.startup(self.group_coordinator.store.load())  # before serving
        self.txn_coordinator = self._create_txn_coordinator()
        self.txn_coordinator.startup(self.txn_coordinator.store.load())  # finishes prepared ones
        self._schedule("log-retention", self.config["log.retention.check.interval.ms"], self._retention)
        self._schedule("log-dir-space", DISK_SPACE_CHECK_MS, self._check_disk_space)
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
        self._schedule("auto-leader-rebalance", self.config["leader.imbalance.check.interval.seconds"] * 1000,
                       self._auto_leader_rebalance)
        lag_ms = self.config["replica.lag.time.max.ms"]
        self._schedule("isr-expiration", max(lag_ms // 2, 1),
                       lambda: self.replica_manager.maybe_shrink_isr(lag_ms))
        self._schedule("producer-id-expiration", self.config["producer.id.expiration.check.interval.ms"],
                       self._expire_producers)
        if self.delegation_tokens.enabled:
            self._schedule("delegation-token-expiration", self.config["delegation.token.expiry.check.interval.ms"],
                           partial(self.store_io, self.delegation_tokens.remove_expired))
        self.log_services.start()
        self.state = BrokerState.RUNNING
        self.socket_server.ready.set()

    async def shutdown(self) -> None:
        if self.state in (BrokerState.SHUTTING_DOWN, BrokerState.PENDING_CONTROLLED_SHUTDOWN):
            return
        if self.clustered and self.config["controlled.shutdown.enable"] and self.broker_epoch >= 0:
            await self._controlled_shutdown()
        self.state = BrokerState.SHUTTING_DOWN
        self.stopping = True
        if self.metrics_server is not None:
            await asyncio.to_thread(self.metrics_server.stop)
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
            await self._snapshot_producers(at_shutdown=True)
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
                log.warning("controlled shutdown: %s, %d partitions still led here",
                            ErrorCode(response.error_code).name, len(response.remaining_partitions))
            except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError, LookupError) as e:
                log.warning("controlled shutdown request failed: %s", e or type(e).__name__)
            if attempt < retries:
                await asyncio.sleep(self.config["controlled.shutdown.retry.backoff.ms"] / 1000)
        log.warning("controlled shutdown incomplete after %d retries; shutting down anyway", retries)

    # --- the metadata store ------------------------------------------------------------------
    def _open_store(self) -> MetadataStore:
        if not self.clustered:
            return LocalMetadataStore(self.config.log_dirs[0] / METADATA_FILE)
        from strom.controller.zk_store import ZooKeeperMetadataStore  # kazoo only when clustered

        session_ms = self.config["zookeeper.session.timeout.ms"]
        self._store_thread = ThreadPoolExecutor(1, thread_name_prefix="zookeeper-io")
        store = ZooKeeperMetadataStore(self.config["zookeeper.connect"], session_ms,
                                       self.config["zookeeper.connection.timeout.ms"] or session_ms,
                                       self.config["zookeeper.digest.auth"], self.config["zookeeper.set.acl"])
        for path in znodes.PERSISTENT_PATHS:
            try:
                store.create(path)
            except NodeExists:
                pass
        return store

    async def store_io(self, fn: Callable, *args, **kwargs):
        """Run a metadata-store call: ZooKeeper round trips go to a worker thread so the loop
        keeps serving; the local file store is memory plus an fsync, done in place."""
        if self._store_thread is None:
            return fn(*args, **kwargs)
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
        name = self.config["authorizer.class.name"].strip()
        if not name:
            return None
        if name not in AUTHORIZERS:
            raise ValueError(f"authorizer.class.name={name} is not an authorizer Strom has; use one of "
                             f"{', '.join(sorted(AUTHORIZERS))} (all mean ACLs), or leave it empty")
        return Authorizer(self.store, self.store_io, self.config["super.users"],
                          self.config["allow.everyone.if.no.acl.found"])

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
        body = build(REQUESTS[api_key], version, fields)
        header = RequestHeader(api_key, version, 0, f"controller-{self.broker_id}",
                               is_flexible(api_key, version))
        ctx = RequestContext(header, self.inter_broker_listener, "controller", INTERNAL)
        response = await self.apis.handle(ctx, body)
        return build(RESPONSES[api_key], version, response)

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

    def _auto_leader_rebalance(self) -> None:
        if self.config["auto.leader.rebalance.enable"] and self.controller.is_active:
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

    def _check_disk_space(self) -> None:
        """Refuse writes to a dir short of space and accept them again once it has room;
        meanwhile retention runs every check and deleted segments go at once."""
        low = self.log_manager.check_free_space()
        if low:
            self._retention()  # first: what it deletes is then unlinked at once
            self.log_manager.free_space(low)
            self.log_manager.check_free_space()

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
                                      self.producer_id_manager.generate, self.send_txn_markers,
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

    def send_txn_markers(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                         committed: bool, partitions) -> dict:
        """The transaction coordinator's marker channel: markers for partitions led here are
        written at once; the others go to their leaders as WriteTxnMarkers, and stay pending
        (retried) until the answer arrives, which finishes the transaction."""
        by_leader: dict[int, list] = {}
        for tp in partitions:
            state = self.metadata_cache.partition(*tp)
            # A partition gone from the cluster is answered here: UNKNOWN_TOPIC_OR_PARTITION.
            by_leader.setdefault(state.leader if state is not None else self.broker_id, []).append(tp)
        errors = self.write_txn_markers(producer_id, producer_epoch, coordinator_epoch, committed,
                                        by_leader.pop(self.broker_id, []))
        key = (producer_id, producer_epoch, committed)
        for leader, tps in by_leader.items():
            waiting = []
            for tp in tps:
                done = self._marker_results.pop((key, tp), None)
                if done is not None:
                    errors[tp] = done
                else:
                    errors[tp] = ErrorCode.NOT_LEADER_OR_FOLLOWER if leader < 0 else _MARKER_PENDING
                    waiting.append(tp)
            if leader >= 0 and waiting and (leader, key) not in self._markers_in_flight:
                self._markers_in_flight.add((leader, key))
                self._loop.create_task(self._send_remote_markers(leader, key, coordinator_epoch, waiting))
        return errors

    async def _send_remote_markers(self, leader: int, key: tuple, coordinator_epoch: int, tps) -> None:
        producer_id, producer_epoch, committed = key
        topics: dict[str, list[int]] = {}
        for topic, index in tps:
            topics.setdefault(topic, []).append(index)
        try:
            response = await self.connections.call(leader, WRITE_TXN_MARKERS, 1, {"markers": [{
                "producer_id": producer_id, "producer_epoch": producer_epoch,
                "transaction_result": committed, "coordinator_epoch": coordinator_epoch,
                "topics": [{"name": t, "partition_indexes": ps} for t, ps in topics.items()]}]})
            for marker in response.markers:
                for t in marker.topics:
                    for p in t.partitions:
                        self._marker_results[(key, (t.name, p.partition_index))] = ErrorCode(p.error_code)
        except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError, LookupError) as e:
            log.warning("transaction markers to broker %d not sent: %s", leader, e or type(e).__name__)
            await asyncio.sleep(0.5)
        finally:
            self._markers_in_flight.discard((leader, key))
        if self.txn_coordinator is not None:
            self.txn_coordinator.retry_markers(producer_id)

    async def add_to_transaction(self, transactional_id: str, producer_id: int, producer_epoch: int,
                                 partitions: list[tuple[str, int]], transaction_version: int = 0) -> ErrorCode:
        """This broker's coordinator adds the partitions; done once its ISR has the new state."""
        error = self.txn_coordinator.add_partitions(transactional_id, producer_id, producer_epoch, partitions,
                                                    transaction_version=transaction_version)
        if error == ErrorCode.NONE:
            error = await self.await_internal_replication(TRANSACTION_STATE_TOPIC, transactional_id)
        return error

    async def transaction_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                                     partitions: list[tuple[str, int]], add: bool = False
                                     ) -> dict[tuple[str, int], ErrorCode]:
        """Are these partitions part of the producer's open transaction (KIP-890 part 1), or,
        with `add`, make them part (part 2: transactions version 2 producers do not add
        partitions themselves)? Asked of the transaction coordinator with AddPartitionsToTxn
        v5, here or on the broker that leads the transactional id's `__transaction_state`
        partition."""
        coordinator = self._txn_coordinator_id(transactional_id)
        if coordinator == self.broker_id:
            if not add:
                return self.txn_coordinator.verify_partitions(transactional_id, producer_id, producer_epoch,
                                                              partitions)
            error = await self.add_to_transaction(transactional_id, producer_id, producer_epoch, partitions,
                                                  transaction_version=2)
            return dict.fromkeys(partitions, error)
        if coordinator < 0:
            return dict.fromkeys(partitions, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        topics: dict[str, list[int]] = {}
        for topic, index in partitions:
            topics.setdefault(topic, []).append(index)
        try:
            response = await self.connections.call(coordinator, ADD_PARTITIONS_TO_TXN, 5, {"transactions": [{
                "transactional_id": transactional_id, "producer_id": producer_id,
                "producer_epoch": producer_epoch, "verify_only": not add,
                "topics": [{"name": t, "partitions": p} for t, p in topics.items()]}]})
        except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError, LookupError):
            return dict.fromkeys(partitions, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if response.error_code != ErrorCode.NONE:
            return dict.fromkeys(partitions, ErrorCode(response.error_code))
        answers = dict.fromkeys(partitions, ErrorCode.COORDINATOR_NOT_AVAILABLE)  # unless answered
        for txn in response.results_by_transaction:
            for t in txn.topic_results:
                for p in t.results_by_partition:
                    if (t.name, p.partition_index) in answers:
                        answers[(t.name, p.partition_index)] = ErrorCode(p.partition_error_code)
        return answers

    def _txn_coordinator_id(self, transactional_id: str) -> int:
        topic = self.metadata_cache.topics.get(TRANSACTION_STATE_TOPIC)
        if topic is None:
            return -1
        state = topic.partitions.get(partition_for(transactional_id, len(topic.partitions)))
        return state.leader if state is not None else -1

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
        return self.metadata_cache.controller_id

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
        """Live brokers reachable on `listener_name`, as the controller last said."""
        return self.metadata_cache.brokers(listener_name)

    def require_controller(self) -> None:
        """CreateTopics, DeleteTopics and CreatePartitions go to the controller, as in Kafka:
        clients find it in Metadata and retry there on NOT_CONTROLLER."""
        if self.controller is None or not self.controller.is_active:
            raise KafkaError("This is not the correct controller for this cluster.",
                             ErrorCode.NOT_CONTROLLER)

    def _has_leaders(self, name: str, partitions: int) -> bool:
        topic = self.metadata_cache.topics.get(name)
        return topic is not None and len(topic.partitions) >= partitions and all(
            s.leader >= 0 for s in topic.partitions.values())

    async def wait_for_topic(self, name: str, partitions: int, timeout_s: float) -> TopicMetadata | None:
        """The topic once this broker's metadata shows `partitions` partitions, all with a leader
        (Kafka's DelayedCreatePartitions), or None at the timeout."""
        await self.metadata_cache.wait_for(lambda: self._has_leaders(name, partitions), timeout_s)
        return self.metadata_cache.topics.get(name) if self._has_leaders(name, partitions) else None

    async def wait_for_deletion(self, name: str, timeout_s: float) -> bool:
        return await self.metadata_cache.wait_for(lambda: name not in self.metadata_cache.topics, timeout_s)

    async def create_topic(self, name: str, partitions: int, factor: int, configs: Mapping[str, str],
                           wait_s: float) -> TopicMetadata | None:
        """Record a topic in the metadata store and wait (at most `wait_s`) for the controller
        to give every partition a leader."""
        _, assignment = await self.store_io(self.admin.create_topic, name, partitions, factor, None, configs)
        self.config_repository.topics[name] = dict(configs)
        return await self.wait_for_topic(name, len(assignment), wait_s)

    async def auto_create_topic(self, name: str) -> TopicMetadata | None:
        """Metadata's auto-creation: None when the topic's leaders are not known yet (the client
        gets LEADER_NOT_AVAILABLE and asks again, as with Kafka)."""
        try:
            topic = await self.create_topic(name, self.config["num.partitions"],
                                            self.config["default.replication.factor"], {},
                                            AUTO_CREATE_WAIT_S)
        except KafkaError as e:
            if e.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                raise
            topic = await self.wait_for_topic(name, 1, AUTO_CREATE_WAIT_S)
        else:
            log.info("auto-created topic %s", name)
        return topic

    def internal_partitions(self, name: str) -> int:
        """Partitions of an internal topic: as created, or as configured until it exists."""
        topic = self.metadata_cache.topics.get(name)
        if topic is not None:
            return len(topic.partitions)
        return self.config[f"{_INTERNAL_CONFIG_PREFIX[name]}.num.partitions"]

    async def ensure_internal_topic(self, name: str) -> TopicMetadata:
        """`__consumer_offsets` or `__transaction_state`, created on first use as Kafka creates
        them: compacted, with the configured partition count and replication factor. A cluster
        with fewer live brokers than that factor cannot create them yet (Kafka's check); the
        embedded broker caps the factor at its one broker so that it can coordinate alone."""
        topic = self.metadata_cache.topics.get(name)
        if topic is not None:
            return topic
        prefix = _INTERNAL_CONFIG_PREFIX[name]
        factor, live = self.config[f"{prefix}.replication.factor"], len(self.metadata_cache.live_brokers)
        if live < factor:
            if self.clustered:
                raise KafkaError(f"Number of alive brokers '{live}' does not meet the required "
                                 f"replication factor '{factor}' for the internal topic {name} "
                                 f"(configured via '{prefix}.replication.factor')",
                                 ErrorCode.COORDINATOR_NOT_AVAILABLE)
            factor = max(live, 1)
        configs = {"cleanup.policy": "compact", "segment.bytes": str(self.config[f"{prefix}.segment.bytes"])}
        try:
            topic = await self.create_topic(name, self.config[f"{prefix}.num.partitions"], factor,
                                            configs, 30)
            log.info("created internal topic %s", name)
        except KafkaError as e:
            if e.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                raise
            topic = await self.wait_for_topic(name, 1, 30)
        if topic is None:
            raise KafkaError(f"{name} has no leaders yet", ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return topic

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

    async def refresh_topic_configs(self, topic: str) -> None:
        """A LeaderAndIsr for a topic this broker hosts nothing of yet: read its configs before
        creating its logs (it may have been created, or re-created, a moment ago)."""
        if not any(t == topic for t, _ in self.replica_manager.partitions):
            self.config_repository.topics[topic] = await self.store_io(read_configs, self.store, "topics", topic)

    # --- the controller's requests ------------------------------------------------------------
    def become_leader_or_follower(self, topic: str, topic_id, p) -> ErrorCode:
        """One partition of a LeaderAndIsr request (Kafka's becomeLeaderOrFollower)."""
        current = self.replica_manager.get_partition(topic, p.partition_index)
        was_leader = current is not None and current.is_leader
        if current is not None and p.leader_epoch < current.leader_epoch:
            log.warning("ignoring LeaderAndIsr for %s-%d: leader epoch %d is older than %d", topic,
                        p.partition_index, p.leader_epoch, current.leader_epoch)
            return ErrorCode.STALE_CONTROLLER_EPOCH
        if current is not None and p.leader_epoch == current.leader_epoch and p.leader == current.leader_id:
            return ErrorCode.NONE  # already in this state (a new controller repeats it)
        try:
            partition = self.replica_manager.become_leader_or_follower(
                topic, p.partition_index, topic_id, p.leader, p.leader_epoch, list(p.replicas),
                list(p.isr), self.log_config_for(topic), p.partition_epoch)
        except OSError as e:
            log.error("cannot open the log of %s-%d: %s", topic, p.partition_index, e)
            return ErrorCode.KAFKA_STORAGE_ERROR
        if p.leader == self.broker_id or p.leader < 0:
            self.replica_fetchers.remove_partition((topic, p.partition_index))
        else:
            self.replica_fetchers.add_partition(partition)
        if znodes.is_internal(topic):
            if p.leader == self.broker_id and not was_leader:
                self._load_coordinator_partition(topic, p.partition_index)
            elif p.leader != self.broker_id and was_leader:
                self._unload_coordinator_partition(topic, p.partition_index)
        return ErrorCode.NONE

    def _load_coordinator_partition(self, topic: str, index: int) -> None:
        """This broker now leads a partition of an internal topic: its coordinator takes over
        the groups or transactional ids stored there. (At start-up the coordinators are not
        running yet and load every led partition themselves.)"""
        if topic == GROUP_METADATA_TOPIC and self.group_coordinator is not None:
            self.group_coordinator.startup(self.group_coordinator.store.load(only=index))
        elif topic == TRANSACTION_STATE_TOPIC and self.txn_coordinator is not None:
            self.txn_coordinator.startup(self.txn_coordinator.store.load(only=index))

    async def await_internal_replication(self, topic: str, key: str) -> ErrorCode:
        """Coordinators write with acks=all: before a commit, a transaction state change or
        a new producer id is answered, the ISR must have what was written to the key's
        partition of `topic` (COORDINATOR_NOT_AVAILABLE if not in time, as Kafka answers), and
        the fsync that flush.messages asks for must be done."""
        tp = (topic, partition_for(key, self.internal_partitions(topic)))
        partition = self.replica_manager.get_partition(*tp)
        if partition is None or not partition.is_leader:
            return ErrorCode.NOT_COORDINATOR
        lg, end = partition.log, partition.log.log_end_offset
        if end - lg.recovery_point >= lg.config.flush_messages:
            # flush.messages applies to coordinators' writes as to a producer's: the commit is
            # answered once the fsync its append started is done.
            try:
                await self.log_manager.flusher.wait_durable(lg, end)
            except OSError as e:
                log.error("%s-%d: a coordinator write could not be flushed: %s", *tp, e)
                return ErrorCode.COORDINATOR_NOT_AVAILABLE
        error = await self.replica_manager.await_high_watermark(
            tp, partition.log.log_end_offset, self.config["offsets.commit.timeout.ms"] / 1000)
        if error == ErrorCode.NONE:
            return error
        log.warning("%s-%d: a coordinator write was not replicated: %s", *tp, error.name)
        return ErrorCode.NOT_COORDINATOR if error == ErrorCode.NOT_LEADER_OR_FOLLOWER else \
            ErrorCode.COORDINATOR_NOT_AVAILABLE

    def _unload_coordinator_partition(self, topic: str, index: int) -> None:
        if topic == GROUP_METADATA_TOPIC and self.group_coordinator is not None:
            self.group_coordinator.unload_partition(index)
        elif topic == TRANSACTION_STATE_TOPIC and self.txn_coordinator is not None:
            self.txn_coordinator.unload_partition(index)

    def update_metadata(self, request) -> None:
        deleted = self.metadata_cache.update(request)
        if deleted:
            for topic in {t for t, _ in deleted}:
                if topic not in self.metadata_cache.topics:
                    self.config_repository.topics.pop(topic, None)
            if self.group_coordinator is not None:
                # Kafka's handleDeletedPartitions: committed offsets of deleted partitions go.
                self.group_coordinator.on_partitions_deleted(deleted)

    def stop_replica(self, topic: str, partition: int, delete: bool) -> ErrorCode:
        self.replica_fetchers.remove_partition((topic, partition))
        current = self.replica_manager.get_partition(topic, partition)
        if znodes.is_internal(topic) and current is not None and current.is_leader:
            self._unload_coordinator_partition(topic, partition)
        try:
            self.replica_manager.stop_replica(topic, partition, delete)
        except OSError as e:
            log.error("cannot delete the log of %s-%d: %s", topic, partition, e)
            return ErrorCode.KAFKA_STORAGE_ERROR
        return ErrorCode.NONE
