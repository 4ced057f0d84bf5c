"""AutoTopicCreationManager: topics this broker creates, as Kafka's manager of that name and
its DelayedCreatePartitions: CreateTopics' topics, Metadata's auto-created ones, and the
internal topics `__consumer_offsets` and `__transaction_state` on first use. Each is recorded
in the metadata store; the answer waits until this broker's metadata shows every partition
with a leader (the controller's doing), then until every leader serves its partition.

Creation is all or nothing: a partition whose log its leader could not make (out of file
descriptors, a failed disk) would leave a topic that exists for CreateTopics and not for
clients. Such a topic is deleted again and the creation answered KAFKA_STORAGE_ERROR."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from strom.controller.znodes import TopicMetadata
from strom.coordinator import GROUP_METADATA_TOPIC, SHARE_GROUP_STATE_TOPIC, TRANSACTION_STATE_TOPIC
from strom.protocol.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

AUTO_CREATE_WAIT_S = 1.0
LIST_OFFSETS, LIST_OFFSETS_VERSION, LATEST = 2, 7, -1
SERVED_CHECK_INTERVAL_S = 0.05
INTERNAL_CREATE_WAIT_S = 30.0
INTERNAL_ANSWER_WAIT_S = 1.0  # how long a request waits on an internal topic's creation
# Where each internal topic's settings are (offsets.topic.num.partitions, ...).
_INTERNAL_CONFIG_PREFIX = {GROUP_METADATA_TOPIC: "offsets.topic", TRANSACTION_STATE_TOPIC: "transaction.state.log",
                           SHARE_GROUP_STATE_TOPIC: "share.coordinator.state.topic"}


class AutoTopicCreationManager:
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.metadata_cache = broker.metadata_cache
        self._internal_creations: dict[str, asyncio.Task[TopicMetadata]] = {}

    def _has_leaders(self, name: str, partitions: int) -> bool:
        topic = self.metadata_cache.topics.get(name)
        return topic is not None and len(topic.partitions) >= partitions and all(
            s.leader >= 0 for s in topic.partitions.values())

    async def wait_for_topic(self, name: str, partitions: int, timeout_s: float) -> TopicMetadata | None:
        """The topic once this broker's metadata shows `partitions` partitions, all with a leader
        (Kafka's DelayedCreatePartitions), or None at the timeout."""
        await self.metadata_cache.wait_for(lambda: self._has_leaders(name, partitions), timeout_s)
        return self.metadata_cache.topics.get(name) if self._has_leaders(name, partitions) else None

    async def wait_until_created(self, name: str, partitions: int, timeout_s: float) -> TopicMetadata | None:
        """`wait_for_topic`, then until each partition's leader serves it. A partition whose
        log could not be made undoes the creation: the topic is deleted and KafkaError
        (KAFKA_STORAGE_ERROR) raised. None at the timeout, as `wait_for_topic`."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        topic = await self.wait_for_topic(name, partitions, timeout_s)
        if topic is None:
            return None
        served, why = await self._served(topic, deadline)
        if served:
            return topic
        if why is None:
            return None
        log.error("creating topic %s failed: %s; deleting it again", name, why)
        broker = self.broker
        try:
            await broker.store_io(broker.admin.delete_topic, name)
            await self._wait_until_forgotten(name, max(deadline, asyncio.get_running_loop().time() + 1.0))
        except KafkaError as e:
            log.warning("topic %s could not be deleted after its failed creation: %s", name, e)
        raise KafkaError(f"Topic {name} was not created: {why}", ErrorCode.KAFKA_STORAGE_ERROR)

    async def _served(self, topic: TopicMetadata, deadline: float) -> tuple[bool, str | None]:
        """(True, None) once every partition of a new topic is served by its leader; (False,
        why) when one cannot be (its log was not made); (False, None) at the deadline."""
        pending = {index: state.leader for index, state in topic.partitions.items()}
        loop = asyncio.get_running_loop()
        while True:
            leaders: dict[int, list[int]] = {}
            for index, leader in pending.items():
                leaders.setdefault(leader, []).append(index)
            for leader, indexes in leaders.items():
                errors = (self._local_errors(topic.name, indexes) if leader == self.broker.broker_id
                          else await self._remote_errors(leader, topic.name, indexes, deadline - loop.time()))
                for index, code in errors.items():
                    if code == ErrorCode.NONE:
                        del pending[index]
                    elif code == ErrorCode.KAFKA_STORAGE_ERROR:
                        return False, f"broker {leader} could not make the log of partition {index}"
            if not pending:
                return True, None
            if loop.time() >= deadline:
                return False, None
            await asyncio.sleep(SERVED_CHECK_INTERVAL_S)

    def _local_errors(self, name: str, indexes: list[int]) -> dict[int, ErrorCode]:
        replicas = self.broker.replica_manager
        out = {}
        for index in indexes:
            partition = replicas.get_partition(name, index)
            if partition is None:
                out[index] = replicas.missing_partition_error((name, index))
            elif partition.log.offline:
                out[index] = ErrorCode.KAFKA_STORAGE_ERROR
            else:
                out[index] = ErrorCode.NONE if partition.is_leader else ErrorCode.NOT_LEADER_OR_FOLLOWER
        return out

    async def _remote_errors(self, leader: int, name: str, indexes: list[int], timeout_s: float) -> dict[int, ErrorCode]:
        """What leader `leader` answers ListOffsets for the partitions: served, or why not."""
        try:
            body = await self.broker.connections.call(leader, LIST_OFFSETS, LIST_OFFSETS_VERSION, {
                "replica_id": -1, "isolation_level": 0, "topics": [{"name": name, "partitions": [
                    {"partition_index": i, "current_leader_epoch": -1, "timestamp": LATEST} for i in indexes]}]},
                max(0.1, timeout_s))
        except (OSError, ConnectionError, TimeoutError, LookupError, asyncio.IncompleteReadError):
            return {}  # not reachable now: asked again
        return {p.partition_index: p.error_code for t in body.topics for p in t.partitions}

    async def _wait_until_forgotten(self, name: str, deadline: float) -> None:
        """Until the metadata store holds no trace of the topic, so that the same name can be
        created again at once: brokers' metadata drops a deleted topic before the controller
        has removed it from the store."""
        loop = asyncio.get_running_loop()
        await self.wait_for_deletion(name, deadline - loop.time())
        while await self.broker.store_io(self.broker.admin.is_recorded, name) and loop.time() < deadline:
            await asyncio.sleep(SERVED_CHECK_INTERVAL_S)

    async def wait_for_deletion(self, name: str, timeout_s: float) -> bool:
        return await self.metadata_cache.wait_for(lambda: name not in self.metadata_cache.topics, timeout_s)

    async def create(self, name: str, partitions: int, factor: int, configs: Mapping[str, str],
                     wait_s: float) -> TopicMetadata | None:
        """Record a topic in the metadata store and wait (at most `wait_s`) for the controller
        to give every partition a leader."""
        broker = self.broker
        _, assignment = await broker.store_io(broker.admin.create_topic, name, partitions, factor, None, configs)
        broker.config_repository.topics[name] = dict(configs)
        return await self.wait_until_created(name, len(assignment), wait_s)

    async def auto_create(self, name: str) -> TopicMetadata | None:
        """Metadata's auto-creation: None when the topic's leaders are not known yet (the client
        gets LEADER_NOT_AVAILABLE and asks again, as with Kafka)."""
        config = self.broker.config
        try:
            topic = await self.create(name, config["num.partitions"], config["default.replication.factor"], {},
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
        return self.broker.config[f"{_INTERNAL_CONFIG_PREFIX[name]}.num.partitions"]

    async def ensure_internal_topic(self, name: str) -> TopicMetadata:
        """`__consumer_offsets` or `__transaction_state`, created on first use as Kafka creates
        them: compacted, with the configured partition count and replication factor.

        The creation runs on its own, one per topic, and a caller waits for it only briefly:
        a client's connection answers in order, so a FindCoordinator held until a slow
        controller answered would hold every request the client sent after it (Kafka answers
        COORDINATOR_NOT_AVAILABLE at once and the client asks again)."""
        topic = self.metadata_cache.topics.get(name)
        if topic is not None:
            return topic
        creation = self._internal_creations.get(name)
        if creation is None:
            creation = asyncio.create_task(self._create_internal(name), name=f"create {name}")
            self._internal_creations[name] = creation
            creation.add_done_callback(lambda done: self._internal_created(name, done))
        done, _ = await asyncio.wait([creation], timeout=INTERNAL_ANSWER_WAIT_S)
        if not done:
            raise KafkaError(f"{name} is being created", ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return creation.result()

    def _internal_created(self, name: str, creation: asyncio.Task[TopicMetadata]) -> None:
        self._internal_creations.pop(name, None)
        if not creation.cancelled() and creation.exception() is not None:
            log.warning("cannot create %s: %s", name, creation.exception())

    async def _create_internal(self, name: str) -> TopicMetadata:
        """Create an internal topic. A cluster with fewer live brokers than its replication
        factor cannot create it yet (Kafka's check); the embedded broker caps the factor at its
        one broker so that it can coordinate alone."""
        config, prefix = self.broker.config, _INTERNAL_CONFIG_PREFIX[name]
        factor, live = config[f"{prefix}.replication.factor"], len(self.metadata_cache.live_brokers)
        if live < factor:
            if self.broker.clustered:
                raise KafkaError(f"Number of alive brokers '{live}' does not meet the required "
                                 f"replication factor '{factor}' for the internal topic {name} "
                                 f"(configured via '{prefix}.replication.factor')",
                                 ErrorCode.COORDINATOR_NOT_AVAILABLE)
            factor = max(live, 1)
        configs = {"cleanup.policy": "compact", "segment.bytes": str(config[f"{prefix}.segment.bytes"])}
        if name == SHARE_GROUP_STATE_TOPIC:  # as Kafka makes it: share state survives a replica's loss
            configs["min.insync.replicas"] = str(min(config[f"{prefix}.min.isr"], factor))
        try:
            topic = await self.create(name, config[f"{prefix}.num.partitions"], factor, configs,
                                      INTERNAL_CREATE_WAIT_S)
            log.info("created internal topic %s", name)
        except KafkaError as e:
            if e.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                raise
            topic = await self.wait_for_topic(name, 1, INTERNAL_CREATE_WAIT_S)
        if topic is None:
            raise KafkaError(f"{name} has no leaders yet", ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return topic
