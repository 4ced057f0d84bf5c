"""A broker's metadata store side: ZooKeeper, or the embedded broker's local file.

- The store is opened on a thread of its own, and every call to it runs there (`io`): ZooKeeper
  round trips and the local store's journal fsyncs, never on the event loop.
- The cluster id in /cluster/id: read, or written by the first broker of a new cluster.
- Registration under /brokers/ids (ephemeral; its creation zxid is the broker epoch), after
  waiting out the registration of a process killed with -9; again after a session expired.
- The /feature watch: the finalized features ApiVersions advertises.
- The ZooKeeper-mode KafkaController (the embedded broker's too), which runs for election at
  once, and the requests it sends to this broker.
- The embedded broker's deletion of logs of topics the store no longer has.
- Seed 001's controlled shutdown: the controller asked to move leadership off this broker.

Broker (broker.py) orders these steps among the others. A KRaft broker (kraft/broker.py)
registers, follows the controller and deletes orphan logs through the quorum instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from strom.client import AsyncConnection
from strom.controller import znodes
from strom.controller.channel import ControllerChannelManager
from strom.controller.controller import KafkaController
from strom.controller.features import NONE_FINALIZED, FinalizedFeatures
from strom.controller.store import LocalMetadataStore, MetadataStore, NodeExists, StoreUnavailable
from strom.controller.znodes import BrokerInfo, EndPoint
from strom.log.manager import new_cluster_id
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import REQUESTS, build

log = logging.getLogger(__name__)

METADATA_FILE = "strom-metadata.json"
CONTROLLED_SHUTDOWN = 7


class StoreLifecycle:
    def __init__(self, broker: Any) -> None:
        self.broker = broker  # the Broker whose store this is
        self._thread: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the broker's
        self._feature_watch: Any = None

    async def open(self) -> MetadataStore:
        self._loop = asyncio.get_running_loop()
        return await asyncio.to_thread(self._open)

    def _open(self) -> MetadataStore:
        # Every store call runs on this thread: ZooKeeper round trips, and the local store's
        # journal fsyncs, never on the event loop.
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="metadata-io")
        config = self.broker.config
        if not self.broker.clustered:
            return LocalMetadataStore(config.log_dirs[0] / METADATA_FILE)
        from strom.controller.zk_store import ZooKeeperMetadataStore  # kazoo only when clustered

        session_ms = config["zookeeper.session.timeout.ms"]
        connect = config["zookeeper.connect"]
        timeout_ms = config["zookeeper.connection.timeout.ms"] or session_ms
        log.info("connecting to ZooKeeper at %s (up to %d ms: zookeeper.connection.timeout.ms)",
                 connect, timeout_ms)
        # kazoo logs every refused attempt (ten a second); the outcome is said in one line.
        kazoo_log = logging.getLogger("kazoo.client")
        kazoo_log.disabled = True
        try:
            store = ZooKeeperMetadataStore(connect, session_ms, timeout_ms, config["zookeeper.digest.auth"],
                                           config["zookeeper.set.acl"])
            for path in znodes.PERSISTENT_PATHS:
                try:
                    store.create(path)
                except NodeExists:
                    pass
        except StoreUnavailable as e:  # a start-up failure like any other: one line, exit 1
            raise ConnectionError(str(e)) from None
        kazoo_log.disabled = False  # a session lost later is worth its log lines
        return store

    async def io(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run a metadata-store call on the store's thread, so the calling loop keeps serving."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, partial(fn, *args, **kwargs))

    async def close(self) -> None:
        if self._feature_watch is not None:
            self._feature_watch.cancel()
        if self.broker.store is not None:
            await asyncio.to_thread(self.broker.store.close)  # a clustered broker's znode goes at once
        if self._thread is not None:
            self._thread.shutdown(wait=False)

    # --- the cluster id and the finalized features ---------------------------------------------
    async def cluster_id(self) -> str | None:
        """The id in /cluster/id; the first broker of a new cluster names it. None when an
        embedded broker's store has none yet (its meta.properties decides, then `record_cluster_id`)."""
        cluster_id = await self.io(self._stored_cluster_id)
        if cluster_id is None and self.broker.clustered:
            cluster_id = await self.record_cluster_id(new_cluster_id())
        return cluster_id

    async def record_cluster_id(self, cluster_id: str) -> str:
        """Create /cluster/id unless another broker did first; the id that is stored."""
        return await self.io(self._record_cluster_id, cluster_id)

    def _stored_cluster_id(self) -> str | None:
        node = self.broker.store.get(znodes.CLUSTER_ID)
        return node[0]["id"] if node and isinstance(node[0], dict) else None

    def _record_cluster_id(self, cluster_id: str) -> str:
        try:
            self.broker.store.create(znodes.CLUSTER_ID, {"version": "1", "id": cluster_id})
        except NodeExists:
            return self._stored_cluster_id()
        return cluster_id

    async def watch_features(self) -> None:
        self._feature_watch = await self.io(self.broker.store.watch_data, znodes.FEATURE, self._features_changed)

    def _features_changed(self, data: Any, version: int) -> None:
        # The store's thread: one assignment of an immutable value, read by the event loop.
        broker = self.broker
        if data is None:
            broker.finalized_features = NONE_FINALIZED
        elif version >= broker.finalized_features.epoch:  # never back to an older read
            broker.finalized_features = FinalizedFeatures(znodes.decode_features(data), version)

    # --- registration and the controller -------------------------------------------------------
    async def register(self) -> None:
        """Create /brokers/ids/<id> (ephemeral); its creation zxid is the broker's epoch. After
        a kill -9 the old registration lives until its session times out: wait for that."""
        broker, config = self.broker, self.broker.config
        info = BrokerInfo(broker.broker_id, [EndPoint(a.name, a.host, a.port, config.protocol_of(a.name))
                                             for a in broker.advertised], config["broker.rack"])
        path = f"{znodes.BROKER_IDS}/{broker.broker_id}"
        deadline = time.monotonic() + config["zookeeper.session.timeout.ms"] / 1000 * 2 + 5
        while True:
            try:
                await self.io(broker.store.create, path, info.encode(), ephemeral=True)
                break
            except NodeExists:
                if time.monotonic() > deadline:
                    raise ValueError(f"broker id {broker.broker_id} is already registered at {path} "
                                     "by a running broker") from None
                log.info("waiting for the previous registration of broker %d to expire", broker.broker_id)
                await asyncio.sleep(0.5)
        node = await self.io(broker.store.get_stat, path)
        broker.broker_epoch = node[1].czxid
        log.info("registered broker %d at %s with broker epoch %d", broker.broker_id, path, broker.broker_epoch)

    def _session_event(self, event: str) -> None:
        """From the store's thread: the ZooKeeper session expired (our ephemeral nodes are gone)
        or a new one began (register again, run for controller again)."""
        loop, broker = self._loop, self.broker
        if event == "expired":
            log.warning("ZooKeeper session expired")
            loop.call_soon_threadsafe(broker.controller.session_expired)
        elif event == "reconnected":
            async def rejoin() -> None:
                await self.register()
                broker.controller.session_reconnected()

            loop.call_soon_threadsafe(lambda: loop.create_task(rejoin()))

    async def start_controller(self) -> None:
        """This broker's candidate for controller of a ZooKeeper cluster (or the embedded
        broker's controller); it runs for election at once."""
        broker = self.broker
        broker.store.add_session_listener(self._session_event)
        broker.controller = KafkaController(
            broker.store, self.io, broker.broker_id,
            lambda: ControllerChannelManager(broker.broker_id, broker.inter_broker_listener,
                                             self._deliver_from_controller, broker.inter_broker_security),
            lambda topic: broker.log_config_for(topic).unclean_leader_election_enable,
            found_intact=broker.log_manager.found_intact,
            min_insync=lambda topic: broker.log_config_for(topic).min_insync_replicas)
        await broker.controller.startup()
        if (node := await self.io(broker.store.get, znodes.FEATURE)) is not None:
            self._features_changed(*node)  # made by this controller just now: known before serving

    def auto_leader_rebalance(self) -> None:
        """The scheduled job: the active controller moves leadership back to preferred replicas."""
        config, controller = self.broker.config, self.broker.controller
        if config["auto.leader.rebalance.enable"] and controller is not None and controller.is_active:
            controller.events.put("auto_rebalance", config["leader.imbalance.per.broker.percentage"])

    async def _deliver_from_controller(self, api_key: int, version: int, fields: dict) -> Any:
        """The controller's requests to this broker: built on the controller's loop (a
        LeaderAndIsr of 10,000 partitions is not cheap), handled on this broker's."""
        body = build(REQUESTS[api_key], version, fields)
        future = asyncio.run_coroutine_threadsafe(self.broker.handle_local(api_key, version, body), self._loop)
        return await asyncio.wrap_future(future)

    # --- the embedded broker's orphan logs -----------------------------------------------------
    async def delete_orphan_logs(self) -> None:
        """The embedded broker: logs on disk of partitions the metadata store no longer has (a
        deletion the broker stopped in the middle of). Decided by the store, not by what is
        hosted yet: the controller's LeaderAndIsr of a large topic arrives in chunks and may
        still be applying when the first UpdateMetadata lets start-up go on (hosted-so-far once
        deleted the last 2,000 partitions of a 20,000-partition topic at a restart)."""
        if self.broker.clustered:
            return
        stored = await self.io(self._stored_partitions)
        log_manager = self.broker.log_manager
        for tp, _ in list(log_manager.logs()):
            if tp not in stored:
                log.info("deleting log %s-%d of a topic that no longer exists", *tp)
                log_manager.delete_log(*tp)

    def _stored_partitions(self) -> set[tuple[str, int]]:
        """Every partition of every topic in the metadata store (blocking: `io`)."""
        store = self.broker.store
        names = store.children(znodes.TOPICS)
        out: set[tuple[str, int]] = set()
        for name, node in zip(names, store.get_many([znodes.topic_path(n) for n in names]), strict=True):
            if node is not None:
                out.update((name, index) for index in znodes.decode_assignment(node[0])[1])
        return out

    # --- controlled shutdown ---------------------------------------------------------------------
    async def controlled_shutdown(self) -> None:
        """Seed 001's controlled shutdown: ask the controller to move leadership off this broker
        (and out of every ISR) while it still serves, so clients and followers move over
        before it goes. Retried `controlled.shutdown.max.retries` times."""
        broker = self.broker
        retries = broker.config["controlled.shutdown.max.retries"]
        fields = {"broker_id": broker.broker_id, "broker_epoch": broker.broker_epoch}
        for attempt in range(retries + 1):
            unreachable: int | None = None
            try:
                controller = broker.metadata_cache.controller_id
                if controller == broker.broker_id:
                    response = await broker.deliver_local(CONTROLLED_SHUTDOWN, 3, fields)
                else:
                    host, port = broker.broker_endpoint(controller)
                    conn = await AsyncConnection.open(host, port, f"broker-{broker.broker_id}-shutdown",
                                                      security=broker.inter_broker_security)
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
                backoff = broker.config["controlled.shutdown.retry.backoff.ms"] / 1000
                if unreachable is None:
                    await asyncio.sleep(backoff)
                else:  # the controller is gone (stopping too, say): ask its successor once known
                    await broker.metadata_cache.wait_for(
                        lambda gone=unreachable: broker.metadata_cache.controller_id not in (gone, -1),
                        backoff)
        log.warning("controlled shutdown incomplete after %d retries; shutting down anyway", retries)
