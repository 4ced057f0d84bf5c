"""AutoTopicCreationManager: topics this broker creates, as Kafka's manager of that name and
its DelayedCreatePartitions: CreateTopics' topics, Metadata's auto-created ones, and the
internal topics `__consumer_offsets` and `__transaction_state` on first use. Each is recorded
in the metadata store; the answer waits until this broker's metadata shows every partition
with a leader (the controller's doing)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from strom.controller.znodes import TopicMetadata
from strom.coordinator import GROUP_METADATA_TOPIC, TRANSACTION_STATE_TOPIC
from strom.protocol.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

AUTO_CREATE_WAIT_S = 1.0
INTERNAL_CREATE_WAIT_S = 30.0
# Where each internal topic's settings are (offsets.topic.num.partitions, ...).
_INTERNAL_CONFIG_PREFIX = {GROUP_METADATA_TOPIC: "offsets.topic", TRANSACTION_STATE_TOPIC: "transaction.state.log"}


class AutoTopicCreationManager:
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.metadata_cache = broker.metadata_cache

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

    async def create(self, name: str, partitions: int, factor: int, configs: Mapping[str, str],
                     wait_s: float) -> TopicMetadata | None:
        """Record a topic in the metadata store and wait (at most `wait_s`) for the controller
        to give every partition a leader."""
        broker = self.broker
        _, assignment = await broker.store_io(broker.admin.create_topic, name, partitions, factor, None, configs)
        broker.config_repository.topics[name] = dict(configs)
        return await self.wait_for_topic(name, len(assignment), wait_s)

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
        them: compacted, with the configured partition count and replication factor. A cluster
        with fewer live brokers than that factor cannot create them yet (Kafka's check); the
        embedded broker caps the factor at its one broker so that it can coordinate alone."""
        topic = self.metadata_cache.topics.get(name)
        if topic is not None:
            return topic
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
