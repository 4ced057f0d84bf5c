"""The broker side of a KRaft node (Kafka's BrokerServer): a broker on the metadata quorum.

- It follows `__cluster_metadata` (its node's own quorum when combined, else as an observer of
  the quorum) into a MetadataImage, and each change reaches the replica manager, the metadata
  cache and the topic configs through the handlers a ZooKeeper controller's requests reach
  (publisher.py): one code path downstream of the metadata, whichever mode.
- It registers with the active controller, heartbeats, is unfenced once its metadata has caught
  up, and shuts down through the heartbeat (lifecycle.py). It runs no controller of its own.
- Requests that change metadata go to the active controller: topic admin through
  ForwardingTopicAdmin (where the handlers call TopicAdmin), AlterPartition, producer id
  blocks (AllocateProducerIds), and ElectLeaders, reassignments, UpdateFeatures, ACLs, client
  quotas and SCRAM users in an Envelope (authorized by the controller as the client's).
- Its log manager leaves `__cluster_metadata-0` to the Raft driver (as Kafka's LogManager skips
  the metadata partition) and keeps meta.properties as `strom storage format` wrote it
  (version 1 with node.id and directory.id) instead of writing its own version 0.
- Its listeners are those not named by controller.listener.names.
- It answers DescribeQuorum (as Kafka 4 brokers do, for kafka-metadata-quorum and admin
  clients) by asking the quorum's leader over the controller listener.

- Delegation tokens are the metadata image's (published into a QuorumTokens store, which SCRAM
  with a token and DescribeDelegationToken read); Create/Renew/ExpireDelegationToken go to the
  active controller in an Envelope, after the broker's own checks, so that the controller
  knows the client's principal (`forward`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from pathlib import Path
from typing import Any

from strom.client import ConnectionCache
from strom.config.broker import BrokerConfig
from strom.log.manager import LogManager
from strom.metadata.loader import MetadataLoader
from strom.metadata.storage import ensure_formatted, parse_kafka_uuid, read_meta
from strom.network.request import API_VERSIONS, RequestContext
from strom.protocol.errors import ErrorCode, KafkaError
from strom.raft.config import (
    METADATA_PARTITION,
    METADATA_TOPIC,
    parse_bootstrap_servers,
    parse_voters,
)
from strom.raft.core import DESCRIBE_QUORUM
from strom.raft.driver import to_fields
from strom.security.authorizer import CLUSTER, DESCRIBE, allowed
from strom.security.delegation_tokens import QuorumTokens
from strom.security.sasl import broker_security
from strom.server.apis import KafkaApis
from strom.server.broker import FIRST_METADATA_TIMEOUT_S, Broker, BrokerState
from strom.server.kraft import envelope
from strom.server.kraft.controller_apis import CLUSTER_OPERATION, error_answer
from strom.server.kraft.controller_channel import ControllerChannel, ControllerUnavailable
from strom.server.kraft.controller_server import ControllerView
from strom.server.kraft.forwarding import (
    CREATE_ACLS,
    DELETE_ACLS,
    ENVELOPED,
    ControllerProducerIds,
    ForwardingTopicAdmin,
)
from strom.server.kraft.lifecycle import BrokerLifecycleManager, read_clean_shutdown_epoch
from strom.server.kraft.metadata_source import MetadataFeed, MetadataObserver
from strom.server.kraft.publisher import BrokerMetadataPublisher

log = logging.getLogger(__name__)

METADATA_KEY = (METADATA_TOPIC, METADATA_PARTITION)
DESCRIBE_QUORUM_VERSIONS = (0, 2)
_NEED_AUTHORIZER = (CREATE_ACLS, DELETE_ACLS)  # without one, the broker answers SECURITY_DISABLED


async def _wait(event: asyncio.Event, timeout_s: float) -> bool:
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
        return True
    except TimeoutError:
        return False


class KRaftLogManager(LogManager):
    """A LogManager that does not open the metadata partition nor rewrite meta.properties."""

    metadata_log_dir: Path | None = None
    clean_shutdown_epoch = -1  # the broker epoch a clean shutdown left, read before start-up removes it
    node_id = -1

    def _check_meta(self, broker_id: int, cluster_id: str | None) -> str:
        meta = ensure_formatted([d for d in self.log_dirs if d in self.live_dirs], self.metadata_log_dir or
                                self.live_dirs[0], broker_id)
        if cluster_id is not None and cluster_id != meta.cluster_id:
            raise ValueError(f"cluster id {cluster_id} does not match {meta.cluster_id} in meta.properties")
        self.clean_shutdown_epoch = read_clean_shutdown_epoch(self.log_dirs, self.live_dirs)
        return meta.cluster_id

    def _recover_logs(self, d, todo, clean) -> None:
        super()._recover_logs(d, [item for item in todo if item[0] != METADATA_KEY], clean)


class KRaftBrokerApis(KafkaApis):
    """The broker's APIs plus DescribeQuorum, answered by the quorum's leader."""

    def supports(self, api_key: int, version: int) -> bool:
        if api_key == DESCRIBE_QUORUM:
            return DESCRIBE_QUORUM_VERSIONS[0] <= version <= DESCRIBE_QUORUM_VERSIONS[1]
        return super().supports(api_key, version)

    async def handle(self, ctx: RequestContext, body: Any) -> Any:
        key, version = ctx.header.api_key, ctx.header.api_version
        if key == DESCRIBE_QUORUM:
            if not allowed(self.broker, ctx, DESCRIBE, CLUSTER):  # Kafka's check, on every node
                return error_answer(key, version, body, ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                    "Cluster authorization failed.")
            return await self.broker.describe_quorum(version, to_fields(body))
        if (key in ENVELOPED and allowed(self.broker, ctx, CLUSTER_OPERATION[key], CLUSTER)
                and (key not in _NEED_AUTHORIZER or self.broker.authorizer is not None)):
            try:  # in an Envelope: the controller checks it as the client's, as Kafka's does
                return await self.broker.forward(ctx, body)
            except KafkaError as e:  # refused whole, or REQUEST_TIMED_OUT: no controller answered
                return error_answer(key, version, body, e.code, str(e))
        response = await super().handle(ctx, body)
        if ctx.header.api_key == API_VERSIONS and isinstance(response, dict):
            response["api_keys"] = _with_describe_quorum(response["api_keys"])
        return response

    def unsupported_version_response(self) -> dict:
        response = super().unsupported_version_response()
        response["api_keys"] = _with_describe_quorum(response["api_keys"])
        return response


def _with_describe_quorum(keys: list[dict]) -> list[dict]:
    lo, hi = DESCRIBE_QUORUM_VERSIONS
    return sorted([*keys, {"api_key": DESCRIBE_QUORUM, "min_version": lo, "max_version": hi}],
                  key=lambda k: k["api_key"])


class KRaftBroker(Broker):
    log_manager_class = KRaftLogManager
    apis_class = KRaftBrokerApis
    forwards_admin = True

    def __init__(self, config: BrokerConfig, controller_server: Any = None) -> None:
        super().__init__(config)
        self.log_manager.metadata_log_dir = config.metadata_log_dir
        self.controller_server = controller_server  # this node's own controller, if combined
        self.metadata_loader = MetadataLoader()
        self.metadata_loader.publishers.append(BrokerMetadataPublisher(self).publish)
        self.lifecycle: BrokerLifecycleManager | None = None
        self.controller_channel: ControllerChannel | None = None  # AlterPartition's
        self._describe_quorum_conns: ConnectionCache | None = None  # DescribeQuorum forwarded to the leader
        self._feed: MetadataFeed | None = None
        self._observer: MetadataObserver | None = None
        self.quorum_controller_view = QuorumControllerView(self)

    def isr_eligible(self, replica: int) -> bool:
        """KIP-841: neither fenced nor in controlled shutdown, which the controller would refuse."""
        registration = self.metadata_loader.image.brokers.get(replica)
        return registration is not None and not (registration.fenced or registration.in_controlled_shutdown)

    def fenced_endpoints(self, listener_name: str) -> list[dict]:
        return [{"node_id": b.id, "host": e.host, "port": e.port, "rack": b.rack}
                for b in sorted(self.metadata_loader.image.brokers.values(), key=lambda b: b.id) if b.fenced
                for e in b.endpoints if e.listener == listener_name]

    def _delegation_tokens(self) -> QuorumTokens:
        return QuorumTokens(self.config)

    async def forward(self, ctx: RequestContext, body: Any) -> Any:
        """A client's request answered by the active controller, as the client's (an Envelope
        with its principal and address). KafkaError with the envelope's error when the
        controller refused it, REQUEST_TIMED_OUT when no controller answered (as Kafka's
        ForwardingManager)."""
        try:
            answer = await self.admin.channel.call(envelope.ENVELOPE, 0, envelope.wrap(ctx, to_fields(body)))
        except ControllerUnavailable as e:
            log.warning("api %d not forwarded: %s", ctx.header.api_key, e)
            raise KafkaError(str(e), ErrorCode.REQUEST_TIMED_OUT) from None
        if answer.error_code or answer.response_data is None:
            raise KafkaError("the controller refused the forwarded request",
                             ErrorCode(answer.error_code or ErrorCode.UNKNOWN_SERVER_ERROR))
        return to_fields(envelope.unwrap_response(ctx, bytes(answer.response_data)))

    def _channel(self, purpose: str) -> ControllerChannel:
        return ControllerChannel(self.config, f"broker-{self.broker_id}-{purpose}",
                                 broker_security(ControllerView(self.config)), self._quorum_leader)

    def _quorum_leader(self) -> tuple[str, int] | None:
        """Where the quorum's leader listens on the controller listener, as this node's Raft
        driver (its controller's, or its observer's) last heard; None when it knows no leader.
        Read from the driver's thread without a lock: a hint, re-checked by the answer."""
        source = self.controller_server if self.controller_server is not None else self._observer
        core = getattr(getattr(source, "driver", None), "core", None)
        voter = None if core is None or core.leader_id < 0 else core.voters.get(core.leader_id)
        listener = self.config.controller_listener_names[0]
        return next(((e.host, e.port) for e in (voter.endpoints if voter else ()) if e.name == listener), None)

    async def _register(self) -> None:
        """Follow the metadata log, then register with the active controller and heartbeat."""
        self._feed = MetadataFeed(self.metadata_loader)
        if self.controller_server is not None:
            await self.controller_server.attach_broker(self._feed)
        else:
            meta = ensure_formatted([self.config.metadata_log_dir], self.config.metadata_log_dir, self.broker_id)
            self._observer = MetadataObserver(self.config, self.cluster_id, meta.directory_id, self._feed)
            await self._observer.start()
        self.controller_channel = self._channel("alter-partition")
        self.lifecycle = BrokerLifecycleManager(self.config, self.cluster_id, self._channel("lifecycle"),
                                                lambda: self.metadata_loader.published_offset, self._log_dir_ids(),
                                                previous_broker_epoch=self.log_manager.clean_shutdown_epoch,
                                                cordoned_log_dirs=lambda: self.config.cordoned_log_dirs)
        await self.lifecycle.start(self.advertised)
        self.broker_epoch = self.lifecycle.broker_epoch
        ids = ControllerProducerIds(self._channel("producer-ids"), self.broker_id, lambda: self.lifecycle.broker_epoch)
        self.producer_id_manager = ids
        self.admin = ForwardingTopicAdmin(self._channel("forwarding"), asyncio.get_running_loop(),
                                          lambda: self.metadata_loader.image)

    def _log_dir_ids(self) -> list[uuid.UUID]:
        """The directory.id of each online log dir, from its meta.properties (checked at start-up
        by the log manager), as BrokerRegistration carries them (KIP-858)."""
        ids = []
        for d in self.log_manager.live_dirs:
            meta = read_meta(d)
            if meta is not None and meta.directory_id:
                ids.append(parse_kafka_uuid(meta.directory_id))
        return ids

    async def _start_controller(self) -> None:
        """A KRaft broker runs no controller of its own: it waits until the quorum's has
        unfenced it (its metadata has caught up), and takes its first producer ids."""
        if not await _wait(self.lifecycle.unfenced, FIRST_METADATA_TIMEOUT_S):
            log.warning("broker %d not unfenced by the controller after %.0f s", self.broker_id,
                        FIRST_METADATA_TIMEOUT_S)
        self.broker_epoch = self.lifecycle.broker_epoch
        try:
            await self.producer_id_manager.reserve()
        except (KafkaError, ConnectionError) as e:
            log.warning("no producer id block from the controller yet: %s", e)

    @property
    def controller_id(self) -> int:
        """What Metadata and DescribeCluster name as the controller: a live broker picked at
        random each time, as Kafka 4's KRaft brokers answer (the controllers are not reachable
        on a broker listener; an admin client's requests reach them through the broker it
        picks, which forwards them), so admin traffic spreads over the brokers."""
        live = list(self.metadata_cache.live_brokers)
        return random.choice(live) if live else -1

    def require_controller(self) -> None:
        """Any broker takes admin requests: it forwards them to the active controller."""

    async def read_topic_configs(self, topic: str) -> dict[str, str]:
        return self.metadata_loader.image.topic_configs(topic)

    async def _delete_orphan_logs(self) -> None:
        """Logs of topics the metadata no longer has (deleted while this broker was down).
        Decided once this broker is unfenced: its metadata is then past its registration, and
        so past every deletion before it."""
        if self.lifecycle is None or not self.lifecycle.unfenced.is_set():
            return
        topics = self.metadata_loader.image.topics
        for (name, index), _ in list(self.log_manager.logs()):
            if name not in topics and (name, index) != METADATA_KEY:
                log.info("deleting log %s-%d of a topic that no longer exists", name, index)
                self.log_manager.delete_log(name, index)

    async def shutdown(self) -> None:
        """Controlled shutdown through the heartbeat (want_shut_down), then the broker's own."""
        if self.lifecycle is not None and self.config["controlled.shutdown.enable"] and self.state is \
                BrokerState.RUNNING:
            self.state = BrokerState.PENDING_CONTROLLED_SHUTDOWN
            if await self.lifecycle.controlled_shutdown(self.config["broker.session.timeout.ms"] / 1000):
                log.info("controlled shutdown succeeded: this broker leads nothing more")
            else:
                log.warning("controlled shutdown incomplete; shutting down anyway")
            self.state = BrokerState.RUNNING
        await super().shutdown()
        if self.lifecycle is not None:
            await self.lifecycle.close()
        for channel in (self.controller_channel, getattr(self.admin, "channel", None),
                        getattr(getattr(self, "producer_id_manager", None), "channel", None),
                        self._describe_quorum_conns):
            if channel is not None:
                channel.close()
        if self._observer is not None:
            await self._observer.close()
        if self._feed is not None:
            await self._feed.close()

    async def describe_quorum(self, version: int, fields: dict) -> dict:
        """DescribeQuorum from the leader of the quorum: this node's controller when it leads,
        else the leader it names, else each known controller in turn."""
        response = None
        if self.controller_server is not None:
            server = self.controller_server
            response = await server.call(server.driver.handle_request(DESCRIBE_QUORUM, version, fields))
            if _ok(response):
                return response
        if self._describe_quorum_conns is None:  # authenticated as the node's other controller requests
            self._describe_quorum_conns = ConnectionCache(f"broker-{self.broker_id}-describe-quorum",
                                                          broker_security(ControllerView(self.config)), 2.0)
        for address in self._controller_addresses(response):
            host, port = address
            try:
                answer = to_fields(await self._describe_quorum_conns.call(address, address, DESCRIBE_QUORUM, version,
                                                                          fields, 5.0, 2.0))
            except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError) as e:
                log.debug("DescribeQuorum to %s:%d failed: %s", host, port, e)
                continue
            if _ok(answer):
                return answer
            response = answer
        if response is not None:
            return response
        return {"error_code": ErrorCode.NOT_LEADER_OR_FOLLOWER, "error_message": "no controller answered",
                "topics": [], "nodes": []}

    def _controller_addresses(self, hint: dict | None) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        if hint:  # the leader a controller named, where the answer says it listens
            leader = next((p["leader_id"] for t in hint.get("topics", []) for p in t.get("partitions", [])), -1)
            for node in hint.get("nodes", []):
                if node["node_id"] == leader and node["listeners"]:
                    out.append((node["listeners"][0]["host"], node["listeners"][0]["port"]))
        voters = parse_voters(self.config["controller.quorum.voters"])
        out += [(v.endpoints[0].host, v.endpoints[0].port) for v in voters]
        out += list(parse_bootstrap_servers(self.config["controller.quorum.bootstrap.servers"]))
        return list(dict.fromkeys(out))


class QuorumControllerView:
    """What the metrics endpoint reads of a controller, for a KRaft node: whether this node's
    quorum controller is the active one, and the cluster as the broker's metadata image has it
    (read on the broker's loop, never the controller's structures from another thread)."""

    def __init__(self, broker: KRaftBroker) -> None:
        self.broker = broker
        self.ctx = self

    @property
    def is_active(self) -> bool:
        server = self.broker.controller_server
        return server is not None and server.controller is not None and server.controller.active

    @property
    def topics(self) -> dict:
        return self.broker.metadata_loader.image.topics

    @property
    def live_brokers(self) -> set[int]:
        return {b.id for b in self.broker.metadata_loader.image.brokers.values() if not b.fenced}


def _ok(response: dict) -> bool:
    if response.get("error_code"):
        return False
    parts = [p for t in response.get("topics", []) for p in t.get("partitions", [])]
    return bool(parts) and all(p.get("error_code", 0) == 0 for p in parts)
