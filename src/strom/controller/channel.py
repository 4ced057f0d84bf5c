"""ControllerChannelManager: how the controller's requests reach brokers.

One queue and one sender task per broker, so each broker sees the controller's requests in
the order they were made; a request that fails on the wire is retried on a new connection
until it gets through or the broker leaves the cluster. The controller's own broker is
reached through the same queue, handing the request to its handler in-process instead of
over a socket; everything else about it is identical.

`RequestBatch` is Kafka's ControllerBrokerRequestBatch: an event collects every partition
change it makes, then sends one LeaderAndIsr, one UpdateMetadata and one StopReplica per
broker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from strom.client import AsyncConnection, ClientSecurity
from strom.controller import znodes
from strom.controller.znodes import BrokerInfo, PartitionState, TopicMetadata
from strom.heap import collections_paused

log = logging.getLogger(__name__)

LEADER_AND_ISR, STOP_REPLICA, UPDATE_METADATA = 4, 5, 6
VERSIONS = {LEADER_AND_ISR: 7, STOP_REPLICA: 4, UPDATE_METADATA: 8}
NAMES = {LEADER_AND_ISR: "LeaderAndIsr", STOP_REPLICA: "StopReplica", UPDATE_METADATA: "UpdateMetadata"}
_RETRY_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)

Callback = Callable[[Any], None]
LocalDelivery = Callable[[int, int, dict], Awaitable[Any]]


@dataclass(slots=True)
class _Item:
    api_key: int
    fields: dict
    callback: Callback | None


class _BrokerSender:
    def __init__(self, manager: ControllerChannelManager, broker: BrokerInfo) -> None:
        self.manager = manager
        self.broker = broker
        self.queue: asyncio.Queue[_Item] = asyncio.Queue()
        self.conn: AsyncConnection | None = None
        self.busy = 0  # requests queued or in flight
        self.idle = asyncio.Event()
        self.idle.set()
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"controller-to-{broker.id}")

    async def _send(self, item: _Item) -> Any:
        version = VERSIONS[item.api_key]
        if self.broker.id == self.manager.local_broker_id:
            return await self.manager.local_delivery(item.api_key, version, item.fields)
        if self.conn is None:
            endpoint = self.broker.endpoint(self.manager.listener) or self.broker.endpoints[0]
            self.conn = await AsyncConnection.open(endpoint.host, endpoint.port,
                                                   f"controller-{self.manager.local_broker_id}",
                                                   security=self.manager.security)
        return await self.conn.call(item.api_key, version, item.fields)

    async def _run(self) -> None:
        while True:
            item = await self.queue.get()
            attempt = 0
            while True:
                try:
                    response = await self._send(item)
                    break
                except (TimeoutError, OSError, ConnectionError, asyncio.IncompleteReadError) as e:
                    if self.conn is not None:
                        self.conn.close()
                        self.conn = None
                    if attempt == 0:
                        log.warning("controller could not send %s to broker %d (%s); retrying",
                                    NAMES[item.api_key], self.broker.id, e or type(e).__name__)
                    await asyncio.sleep(_RETRY_BACKOFF_S[min(attempt, len(_RETRY_BACKOFF_S) - 1)])
                    attempt += 1
                except Exception:
                    log.exception("controller failed sending %s to broker %d; dropped",
                                  NAMES[item.api_key], self.broker.id)
                    response = None
                    break
            if item.callback is not None and response is not None:
                try:
                    item.callback(response)
                except Exception:
                    log.exception("controller callback for %s to broker %d failed",
                                  NAMES[item.api_key], self.broker.id)
            self.busy -= 1
            if not self.busy:
                self.idle.set()

    def stop(self) -> None:
        self.task.cancel()
        self.idle.set()  # the broker left: what is queued for it is dropped, not waited for
        if self.conn is not None:
            self.conn.close()


class ControllerChannelManager:
    def __init__(self, local_broker_id: int, listener: str, local_delivery: LocalDelivery,
                 security: ClientSecurity | None = None) -> None:
        self.local_broker_id = local_broker_id
        self.listener = listener
        self.security = security  # how brokers' inter-broker listener is reached (TLS, SASL)
        self.local_delivery = local_delivery
        self.senders: dict[int, _BrokerSender] = {}

    def add_broker(self, broker: BrokerInfo) -> None:
        old = self.senders.pop(broker.id, None)
        if old is not None:
            old.stop()
        self.senders[broker.id] = _BrokerSender(self, broker)

    def remove_broker(self, broker_id: int) -> None:
        sender = self.senders.pop(broker_id, None)
        if sender is not None:
            sender.stop()

    def send(self, broker_id: int, api_key: int, fields: dict, callback: Callback | None = None) -> None:
        sender = self.senders.get(broker_id)
        if sender is None:
            log.debug("not sending %s to broker %d: not live", NAMES[api_key], broker_id)
            return
        sender.busy += 1
        sender.idle.clear()
        sender.queue.put_nowait(_Item(api_key, fields, callback))

    async def drain(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) until every queued request was delivered: a controller
        that stops must not take the last leadership changes it decided with it."""
        waits = [s.idle.wait() for s in self.senders.values() if s.broker.id != self.local_broker_id]
        if waits:
            try:
                await asyncio.wait_for(asyncio.gather(*waits), timeout_s)
            except TimeoutError:
                log.warning("controller stopping with requests to brokers still undelivered")

    def shutdown(self) -> None:
        for broker_id in list(self.senders):
            self.remove_broker(broker_id)


def _partition_state(state: PartitionState, index: int, **more: Any) -> dict:
    return {"partition_index": index, "controller_epoch": state.controller_epoch,
            "leader": state.leader, "leader_epoch": state.leader_epoch, "isr": list(state.isr),
            "replicas": list(state.replicas), **more}


def _topic_entry(topics: dict[str, dict], name: str, topic_id: Any) -> list[dict]:
    """The partition list of `name`'s entry in a request's topics, made on first use (one
    entry per topic, not one dict made and thrown away per partition)."""
    entry = topics.get(name)
    if entry is None:
        entry = topics[name] = {"topic_name": name, "partition_states": []}
        if topic_id is not None:
            entry["topic_id"] = topic_id
    return entry["partition_states"]


@dataclass
class RequestBatch:
    """The requests one controller event produces, grouped per broker (Kafka's
    ControllerBrokerRequestBatch)."""

    controller_id: int
    controller_epoch: int
    leader_and_isr: dict[int, dict[tuple[str, int], tuple[TopicMetadata, PartitionState, bool]]] = field(
        default_factory=dict)
    update_metadata_brokers: set[int] = field(default_factory=set)
    update_metadata_partitions: dict[tuple[str, int], tuple[TopicMetadata, PartitionState]] = field(
        default_factory=dict)
    stop_replica: dict[int, dict[tuple[str, int], tuple[int, bool]]] = field(default_factory=dict)
    # Who gets the UpdateMetadata; None: every live broker when any partition changed.
    update_metadata_only: set[int] | None = None

    def add_leader_and_isr(self, brokers: list[int], topic: TopicMetadata, index: int,
                           state: PartitionState, is_new: bool = False) -> None:
        for b in brokers:
            self.leader_and_isr.setdefault(b, {})[(topic.name, index)] = (topic, state, is_new)
        self.update_metadata_partitions[(topic.name, index)] = (topic, state)

    def add_update_metadata(self, brokers, partitions: list[tuple[TopicMetadata, int, PartitionState]]) -> None:
        self.update_metadata_brokers.update(brokers)
        for topic, index, state in partitions:
            self.update_metadata_partitions[(topic.name, index)] = (topic, state)

    def add_stop_replica(self, broker: int, topic: str, index: int, leader_epoch: int, delete: bool) -> None:
        self.stop_replica.setdefault(broker, {})[(topic, index)] = (leader_epoch, delete)

    def send(self, channel: ControllerChannelManager, live: dict[int, BrokerInfo],
             stop_replica_callback: Callable[[int], Callback] | None = None) -> None:
        """Send LeaderAndIsr first, then UpdateMetadata (to every live broker when any partition
        changed), then StopReplica, as Kafka orders them."""
        if len(self.update_metadata_partitions) + sum(map(len, self.stop_replica.values())) < MAX_PARTITIONS_PER_REQUEST:
            self._send(channel, live, stop_replica_callback)
            return
        with collections_paused():  # a request object per partition and broker, all kept
            self._send(channel, live, stop_replica_callback)

    def _send(self, channel: ControllerChannelManager, live: dict[int, BrokerInfo],
              stop_replica_callback: Callable[[int], Callback] | None) -> None:
        # A partition's entry, built once for all its replicas' requests (the state objects are
        # held by the batch, so their ids stay theirs meanwhile).
        built: dict[tuple[str, int, int, bool], dict] = {}
        for broker_id, entries in self.leader_and_isr.items():
            if broker_id not in live:
                continue
            for chunk in _chunks(list(entries.items())):
                topics: dict[str, dict] = {}
                for key, (topic, state, is_new) in chunk:
                    if (fields := built.get(shared := (*key, id(state), is_new))) is None:
                        fields = built[shared] = _partition_state(
                            state, key[1], partition_epoch=state.zk_version, adding_replicas=list(state.adding),
                            removing_replicas=list(state.removing), is_new=is_new)
                    _topic_entry(topics, key[0], topic.topic_id).append(fields)
                leaders = {state.leader for _, (_, state, _) in chunk if state.leader in live}
                channel.send(broker_id, LEADER_AND_ISR, {
                    "controller_id": self.controller_id, "controller_epoch": self.controller_epoch,
                    "broker_epoch": live[broker_id].epoch, "request_type": 0,
                    "topic_states": list(topics.values()),
                    "live_leaders": [_live_leader(live[b], channel.listener) for b in sorted(leaders)]})
        if self.update_metadata_partitions and self.update_metadata_only is None:
            self.update_metadata_brokers.update(live)
        if self.update_metadata_brokers:
            brokers = [_live_broker(b) for b in live.values()]
            requests = []
            for chunk in _chunks(list(self.update_metadata_partitions.items())) or [[]]:
                topics = {}
                for (name, index), (topic, state) in chunk:
                    _topic_entry(topics, name, topic.topic_id).append(_partition_state(
                        state, index, zk_version=state.zk_version,
                        offline_replicas=[r for r in state.replicas if r not in live]))
                requests.append(list(topics.values()))
            for broker_id in sorted(self.update_metadata_brokers):
                if broker_id in live:
                    for topic_states in requests:
                        channel.send(broker_id, UPDATE_METADATA, {
                            "controller_id": self.controller_id, "controller_epoch": self.controller_epoch,
                            "broker_epoch": live[broker_id].epoch, "topic_states": topic_states,
                            "live_brokers": brokers})
        for broker_id, entries in self.stop_replica.items():
            if broker_id not in live:
                continue
            callback = stop_replica_callback(broker_id) if stop_replica_callback else None
            for chunk in _chunks(list(entries.items())):
                topics = {}
                for (name, index), (epoch, delete) in chunk:
                    _topic_entry(topics, name, None).append(
                        {"partition_index": index, "leader_epoch": epoch, "delete_partition": delete})
                channel.send(broker_id, STOP_REPLICA, {
                    "controller_id": self.controller_id, "controller_epoch": self.controller_epoch,
                    "broker_epoch": live[broker_id].epoch, "topic_states": list(topics.values())},
                    callback)


# Partitions per LeaderAndIsr / UpdateMetadata / StopReplica: a broker decodes and applies one
# request in one go, so a change of 100,000 partitions goes as many requests, each a bounded
# piece of work on the receiving broker's loop (Kafka sends one; its handlers are threads).
MAX_PARTITIONS_PER_REQUEST = 2000


def _chunks(items: list, size: int = MAX_PARTITIONS_PER_REQUEST) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _live_leader(broker: BrokerInfo, listener: str) -> dict:
    endpoint = broker.endpoint(listener) or broker.endpoints[0]
    return {"broker_id": broker.id, "host_name": endpoint.host, "port": endpoint.port}


def _live_broker(broker: BrokerInfo) -> dict:
    return {"id": broker.id, "rack": broker.rack, "endpoints": [
        {"port": e.port, "host": e.host, "listener": e.listener,
         "security_protocol": znodes.SECURITY_PROTOCOLS.get(e.security_protocol, 0)}
        for e in broker.endpoints]}
