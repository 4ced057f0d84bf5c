"""What this broker knows of the cluster: the controller's UpdateMetadata, applied in order.

Metadata, DescribeCluster and FindCoordinator answer from here on every broker, so all
brokers tell clients the same leaders, replicas and ISR once the controller has told them.
Handlers that change metadata through the controller wait here until the change arrives
(Kafka's DelayedCreatePartitions and DelayedDeleteTopics).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

from strom.metadata import model
from strom.metadata.model import BrokerInfo, EndPoint, PartitionState, TopicMetadata

_PROTOCOL_NAMES = {v: k for k, v in model.SECURITY_PROTOCOLS.items()}


class MetadataCache:
    def __init__(self, broker_id: int) -> None:
        self.broker_id = broker_id
        self.topics: dict[str, TopicMetadata] = {}
        self.names_by_id: dict[uuid.UUID, str] = {}  # Fetch v13+ and Metadata v12+ name topics by id
        self.live_brokers: dict[int, BrokerInfo] = {}
        self.controller_id = -1
        self.controller_epoch = -1  # the newest controller heard from (stale ones are refused)
        self.initialized = False
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future]] = []

    # -- UpdateMetadata

    def update(self, request) -> list[tuple[str, int]]:
        """Apply an UpdateMetadata request; returns the partitions it deleted."""
        self.controller_id = request.controller_id
        self.controller_epoch = request.controller_epoch
        self.live_brokers = {
            b.id: BrokerInfo(b.id, [EndPoint(e.listener, e.host, e.port,
                                              _PROTOCOL_NAMES.get(e.security_protocol, "PLAINTEXT"))
                                     for e in b.endpoints], b.rack)
            for b in request.live_brokers}
        deleted = []
        for t in request.topic_states:
            topic = self.topics.get(t.topic_name)
            if topic is None or topic.topic_id != t.topic_id:
                topic = TopicMetadata(t.topic_name, t.topic_id, internal=model.is_internal(t.topic_name))
            for p in t.partition_states:
                if p.leader == model.LEADER_DURING_DELETE:
                    if topic.partitions.pop(p.partition_index, None) is not None:
                        deleted.append((t.topic_name, p.partition_index))
                    continue
                topic.partitions[p.partition_index] = PartitionState(
                    p.leader, p.leader_epoch, list(p.isr), list(p.replicas), p.controller_epoch,
                    p.zk_version)
            old = self.topics.get(t.topic_name)
            if old is not None and old is not topic:
                self.names_by_id.pop(old.topic_id, None)
            if topic.partitions:
                self.topics[t.topic_name] = topic
                self.names_by_id[topic.topic_id] = t.topic_name
            else:
                self.topics.pop(t.topic_name, None)
                self.names_by_id.pop(topic.topic_id, None)
        self.initialized = True
        self._wake()
        return deleted

    # -- reads

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicMetadata | None:
        name = self.names_by_id.get(topic_id)
        return None if name is None else self.topics.get(name)

    def replica_counts(self) -> dict[int, int]:
        """Partition replicas per broker, over every topic known (max.broker.partitions)."""
        counts: dict[int, int] = {}
        for topic in self.topics.values():
            for state in topic.partitions.values():
                for b in state.replicas:
                    counts[b] = counts.get(b, 0) + 1
        return counts

    def partition(self, topic: str, index: int) -> PartitionState | None:
        meta = self.topics.get(topic)
        return None if meta is None else meta.partitions.get(index)

    def brokers(self, listener: str) -> list[dict]:
        """Live brokers with their endpoint on `listener` (the one the request came in on)."""
        out = []
        for broker in sorted(self.live_brokers.values(), key=lambda b: b.id):
            endpoint = broker.endpoint(listener)
            if endpoint is not None:
                out.append({"node_id": broker.id, "host": endpoint.host, "port": endpoint.port,
                            "rack": broker.rack})
        return out

    def broker_racks(self) -> dict[int, str | None]:
        return {b.id: b.rack for b in self.live_brokers.values()}

    # -- waiting for the controller

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """True once `predicate()` holds after some update, False at the timeout."""
        if predicate():
            return True
        future = asyncio.get_running_loop().create_future()
        entry = (predicate, future)
        self._waiters.append(entry)
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            return False
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)

    def _wake(self) -> None:
        for predicate, future in list(self._waiters):
            if not future.done() and predicate():
                future.set_result(True)
