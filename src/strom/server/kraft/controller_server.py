"""ControllerServer: a KRaft node's controller side (Kafka's ControllerServer + KafkaRaftManager).

On a thread of its own with its own event loop (controller/loop_thread.py): the Raft driver of
`__cluster_metadata-0` (in metadata.log.dir), the QuorumController replaying it, and a socket
server on the controller listeners (controller.listener.names) that hands requests to
ControllerApis. A combined node's broker runs beside it on the main loop and never waits for
the controller's work.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from strom.config.broker import DEFINITIONS, BrokerConfig, Listener
from strom.config.describe import LIST_CONFIGS
from strom.config.dynamic import DynamicBrokerConfig
from strom.controller.loop_thread import LoopThread
from strom.controller.quorum_controller import ControllerSettings, QuorumController
from strom.controller.replication_control import Limits
from strom.controller.token_control import TokenControl
from strom.metadata.image import BROKER_RESOURCE, TOPIC_RESOURCE
from strom.metadata.storage import (
    METADATA_PARTITION_DIR,
    MetaProperties,
    parse_kafka_uuid,
    read_bootstrap,
)
from strom.network.socket_server import SocketServer
from strom.protocol.errors import ErrorCode, KafkaError
from strom.raft.config import QuorumConfig, parse_bootstrap_servers, parse_voters
from strom.raft.driver import RaftDriver
from strom.security.authorizer import authorizer_from_config
from strom.security.delegation_tokens import QuorumTokens, secret_of
from strom.security.sasl import broker_security
from strom.server.kraft.controller_apis import ControllerApis
from strom.server.kraft.raft_transport import RaftTransport

log = logging.getLogger(__name__)

# How long a stopping controller watches for another broker that began to stop at the same time.
SETTLE_S = 0.5
NODE_LOCAL_CONFIGS = frozenset({"cordoned.log.dirs"})  # per-broker values that name the broker's own dirs


def quorum_config(config: BrokerConfig, cluster_id: str | None) -> QuorumConfig:
    listener = config.controller_listener_names[0]
    return QuorumConfig(
        node_id=config.broker_id,
        voters=parse_voters(config["controller.quorum.voters"], listener),
        bootstrap_servers=parse_bootstrap_servers(config["controller.quorum.bootstrap.servers"]),
        cluster_id=cluster_id,
        election_timeout_ms=config["controller.quorum.election.timeout.ms"],
        fetch_timeout_ms=config["controller.quorum.fetch.timeout.ms"],
        election_backoff_max_ms=config["controller.quorum.election.backoff.max.ms"],
        append_linger_ms=config["controller.quorum.append.linger.ms"],
        request_timeout_ms=config["controller.quorum.request.timeout.ms"],
        retry_backoff_ms=config["controller.quorum.retry.backoff.ms"],
        max_bytes_between_snapshots=config["metadata.log.max.record.bytes.between.snapshots"],
        max_snapshot_interval_ms=config["metadata.log.max.snapshot.interval.ms"] or 2**62,
    )


class ControllerView:
    """broker_security's question (how to reach another node's listener, as whom) asked of the
    controller listener and sasl.mechanism.controller.protocol instead of the inter-broker ones."""

    def __init__(self, config: BrokerConfig) -> None:
        self._config = config
        self.inter_broker_listener = config.controller_listener_names[0]

    def protocol_of(self, listener: str) -> str:
        return self._config.protocol_of(listener)

    def listener_setting(self, listener: str, key: str) -> Any:
        return self._config.listener_setting(listener, key)

    def __getitem__(self, key: str) -> Any:
        if key == "sasl.mechanism.inter.broker.protocol":
            return self._config["sasl.mechanism.controller.protocol"]
        if key == "zookeeper.connect":
            return "kraft"  # controllers always talk over the wire
        return self._config[key]


class _ImageCredentials:
    """What the socket server asks of SCRAM users: the controller's metadata image holds them
    (UserScramCredentialRecord), read when a client authenticates. No client quotas here."""

    clients: dict[str, dict[str, str]] = {}

    def __init__(self, server: ControllerServer) -> None:
        self.server = server

    def user(self, name: str) -> dict[str, str]:
        controller = self.server.controller
        if controller is None:
            return {}
        return {mechanism: credential.encode() for _, mechanism, credential in controller.image.scram_credentials(name)}


class ControllerServer:
    def __init__(self, config: BrokerConfig, meta: MetaProperties) -> None:
        self.config = config
        self.node_id = config.broker_id
        self.cluster_id = meta.cluster_id
        self.directory_id = parse_kafka_uuid(meta.directory_id) if meta.directory_id else uuid.uuid4()
        self.config_repository = _ImageCredentials(self)  # for the socket server's SASL/SCRAM
        self.metrics_server = None  # metrics.endpoint.MetricsServer of a dedicated controller
        # SASL with a delegation token on this listener checks the image's tokens, as Kafka's
        # controllers publish them to a token cache of their own.
        self.delegation_tokens = QuorumTokens(config)
        # Controllers talk Raft on the controller listener; no broker user to exempt from the
        # socket server's SASL guess limit.
        self.inter_broker_security = None
        # What `allowed` asks (authorizer.class.name): ACLs from this controller's image, which
        # can grant nothing before the log is read, so the nodes' own principals (brokers' and
        # controllers' on the controller listener) belong in super.users, as in Kafka.
        self.authorizer = authorizer_from_config(config)
        # The image and its acl_version / token_version last handed over.
        self._acls_of: tuple[Any, int] | None = None
        self._tokens_of: tuple[Any, int] | None = None
        self.thread: LoopThread | None = None
        self.driver: RaftDriver | None = None
        self.controller: QuorumController | None = None
        self.transport: RaftTransport | None = None
        self.socket_server: SocketServer | None = None
        self.advertised: list[Listener] = []
        self._dynamic = DynamicBrokerConfig(config)
        self.metadata_listeners: list[Callable[[Any], None]] = []
        self._applying: asyncio.Lock | None = None

    @property
    def metadata_dir(self) -> Path:
        return self.config.metadata_log_dir / METADATA_PARTITION_DIR

    async def startup(self) -> None:
        self.thread = LoopThread(f"controller-{self.node_id}")
        await self.thread.call(self._startup())

    async def _raft_send(self, node: int, api_key: int, version: int, fields: dict,
                         address: tuple[str, int] | None = None) -> Any:
        if address is not None:  # a voter being added: where its AddRaftVoter says it listens
            self.transport.learned[node] = address
        return await self.transport(node, api_key, version, fields)

    async def _startup(self) -> None:
        config = self.config
        self._applying = asyncio.Lock()
        qc = quorum_config(config, self.cluster_id)
        security = broker_security(ControllerView(config))
        features, extra = read_bootstrap(config.metadata_log_dir)
        self.transport = RaftTransport(qc, config.controller_listener_names[0], lambda: self.driver.core.voters,
                                       security)
        self.driver = RaftDriver(qc, self.metadata_dir, self._raft_send, rng=random.Random(),
                                 directory_id=self.directory_id, segment_bytes=config["metadata.log.segment.bytes"])
        limits = Limits(default_partitions=config["num.partitions"],
                        default_replication_factor=config["default.replication.factor"],
                        max_broker_partitions=config["max.broker.partitions"],
                        delete_topic_enable=config["delete.topic.enable"],
                        validate_topic_configs=self._validate_topic_configs,
                        unclean_default=config["unclean.leader.election.enable"],
                        min_insync_default=config["min.insync.replicas"])
        rebalance = config["leader.imbalance.check.interval.seconds"] if config["auto.leader.rebalance.enable"] else 0
        tokens = TokenControl(secret_of(config), config["delegation.token.max.lifetime.ms"],
                              config["delegation.token.expiry.time.ms"])
        settings = ControllerSettings(self.node_id, self.cluster_id, limits, config["broker.session.timeout.ms"],
                                      features, extra, self._validate_configs, lambda key: key in LIST_CONFIGS,
                                      rebalance, tokens,
                                      config["delegation.token.expiry.check.interval.ms"] / 1000)
        self.controller = QuorumController(settings, self.driver)
        self.driver.listener = self._on_raft
        self.controller.start()
        await self.driver.start()
        listeners = [x for x in config.listeners if x.name in config.controller_listener_names]
        self.socket_server = SocketServer(self, ControllerApis(self, self.controller, self.driver),
                                          config["socket.request.max.bytes"], config["queued.max.request.bytes"])
        serve_metrics = "broker" not in config.process_roles and config["metrics.port"] >= 0
        if serve_metrics:  # a dedicated controller's own endpoint (a combined node's is its broker's)
            self.socket_server.enable_metrics()
        await self.socket_server.start(listeners, config["socket.send.buffer.bytes"],
                                       config["socket.receive.buffer.bytes"])
        if serve_metrics:
            from strom.metrics.endpoint import (  # loads prometheus-client
                MetricsServer,
                controller_sections,
            )

            self.metrics_server = MetricsServer(self, controller_sections)
            self.metrics_server.start(config["metrics.host"], config["metrics.port"])
        self.socket_server.ready.set()
        self.advertised = [Listener(x.name, x.host or "127.0.0.1", self.socket_server.bound[x.name][1])
                           for x in listeners]
        log.info("controller %d listening on %s (metadata log %s)", self.node_id,
                 ", ".join(str(x) for x in self.advertised), self.metadata_dir)

    def _validate_topic_configs(self, configs) -> None:
        self.config.default_log_config().with_overrides(configs)

    def _validate_configs(self, resource_type: int, name: str, configs: dict[str, str]) -> None:
        if resource_type == TOPIC_RESOURCE:
            try:
                self._validate_topic_configs(configs)
            except ValueError as e:
                raise KafkaError(str(e), ErrorCode.INVALID_CONFIG) from None
        elif resource_type == BROKER_RESOURCE:
            if name and not name.isdigit():
                raise KafkaError(f"Unexpected broker id {name!r}", ErrorCode.INVALID_REQUEST)
            unknown = sorted(k for k in configs if k not in DEFINITIONS)
            if unknown:
                raise KafkaError(f"Unknown broker config: {', '.join(unknown)}", ErrorCode.INVALID_CONFIG)
            if name and name != str(self.node_id) and NODE_LOCAL_CONFIGS & configs.keys():
                # Another node's dirs: only that broker knows its log.dirs, and checks the value
                # before it forwards the change (a stored value it cannot take, it leaves out).
                configs = {k: v for k, v in configs.items() if k not in NODE_LOCAL_CONFIGS}
            self._dynamic.validate(name == "", configs)

    async def shutdown(self) -> None:
        if self.thread is None:
            return
        try:
            await self.thread.call(self._shutdown())
        finally:
            self.thread.stop()

    async def _shutdown(self) -> None:
        if self.metrics_server is not None:
            await asyncio.to_thread(self.metrics_server.stop)
        await self._keep_vote_for_controlled_shutdowns()
        if self.socket_server is not None:
            await self.socket_server.stop_accepting()
        if self.controller is not None:
            await self.controller.close()
        if self.driver is not None and self.driver.core is not None:
            await self.driver.close()
        if self.transport is not None:
            self.transport.close()
        if self.socket_server is not None:
            await self.socket_server.drain(timeout=2)

    async def _keep_vote_for_controlled_shutdowns(self) -> None:
        """Nodes stopped together (Ctrl-C on a local cluster, a fleet stopped at once): a broker
        half-way through its controlled shutdown needs the quorum to commit its last step, and
        a controller that left first could take the majority with it. So a controller asked to
        stop keeps its vote while another broker is in controlled shutdown and not yet fenced,
        as long as some controller leads, and at most broker.session.timeout.ms (by then the
        broker is fenced anyway). While other brokers are live it first waits SETTLE_S for one
        that began to stop a moment later: a rolling restart, where nobody else stops, pays
        only that."""
        if self.controller is None or self.driver is None or self.driver.core is None:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        settled, end = now + SETTLE_S, now + self.config["broker.session.timeout.ms"] / 1000
        said = False
        while loop.time() < end and self.driver.core.leader_id >= 0:
            others = [b for b in self.controller.image.brokers.values() if b.id != self.node_id and not b.fenced]
            stopping = sorted(b.id for b in others if b.in_controlled_shutdown)
            if stopping and not said:
                log.info("controller %d keeps its vote until broker(s) %s finish their controlled shutdown",
                         self.node_id, ",".join(map(str, stopping)))
                said = True
            if not stopping and (not others or loop.time() >= settled):
                return
            await asyncio.sleep(0.05)

    async def _on_raft(self, e: Any) -> None:
        """The quorum controller applies each effect first; then this node's broker hears of
        it. Under a lock, so that a broker that attaches sees the image between two effects."""
        async with self._applying:
            await self.controller._on_raft(e)
            self._refresh_from_image()
            for listener in self.metadata_listeners:
                listener(e)

    def _refresh_from_image(self) -> None:
        """What this listener checks clients against (ACLs, delegation tokens) is the image's:
        handed over again when the image or its copy of them changed."""
        image = self.controller.image
        acls, tokens = (image, image.acl_version), (image, image.token_version)
        if self.authorizer is not None and self._acls_of != acls:
            self.authorizer.replace_acls(image.acls.values())
            self._acls_of = acls
        if self.delegation_tokens.enabled and self._tokens_of != tokens:
            self.delegation_tokens.publish(image.delegation_tokens.values())
            self._tokens_of = tokens

    async def attach_broker(self, feed: Any) -> None:
        """A combined node's broker follows the metadata from here: `feed` (its MetadataFeed)
        gets a copy of the image as applied so far, and then every effect after it. Both are
        handed over on this thread under the lock, so they reach the broker's loop in that
        order: an effect that overtook the copy would be replayed on the broker's empty image,
        and the copy loaded after it would then look like the deletion of every topic the
        effect named (the broker deleted its logs of them)."""
        async def attach() -> None:
            async with self._applying:
                feed.start_from(self.controller.image.copy())
                self.metadata_listeners.append(feed.on_effect)

        await self.thread.call(attach())

    def call(self, coro) -> Any:
        """Run `coro` on the controller's loop from another loop (a combined node's broker)."""
        return self.thread.call(coro)

    async def wait_active_leader(self, timeout: float) -> int:
        """Until some controller leads the quorum; its id (-1 at the timeout)."""
        async def wait() -> int:
            loop = asyncio.get_running_loop()
            end = loop.time() + timeout
            while loop.time() < end and self.driver.core.leader_id < 0:
                await asyncio.sleep(0.02)
            return self.driver.core.leader_id

        return await self.thread.call(wait())
