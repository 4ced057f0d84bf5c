"""The group coordinator: classic consumer groups (JoinGroup/SyncGroup), KIP-848 consumer
groups (ConsumerGroupHeartbeat) and committed offsets, persisted in `__consumer_offsets`.

Modules: `metadata` and `member` (the classic state machine's data), `coordinator` (the
classic protocol and offsets), `consumer_group` and `assignors` (KIP-848), `records` (Kafka's
key/value schemas of `__consumer_offsets`), `manager` (writing and replaying that topic),
`consumer_protocol` (the subscription/assignment bytes consumers exchange), `share_group`
(KIP-932 share group membership and assignment).
"""

from __future__ import annotations

from typing import Any

from strom.coordinator import GROUP_METADATA_TOPIC
from strom.coordinator.group.config import GroupConfig
from strom.coordinator.group.consumer_group import ConsumerGroupCoordinator
from strom.coordinator.group.coordinator import GroupCoordinator
from strom.coordinator.group.manager import GroupMetadataManager
from strom.coordinator.group.share_group import ShareGroupCoordinator, ShareGroupSettings

__all__ = ["GroupConfig", "GroupCoordinator", "GroupMetadataManager", "create_group_coordinator"]


def create_group_coordinator(broker: Any) -> GroupCoordinator:
    """A coordinator wired to a broker's replica manager and topic metadata (not started)."""

    manager = GroupMetadataManager(broker.replica_manager,
                                   lambda: broker.internal_partitions(GROUP_METADATA_TOPIC))
    coordinator = GroupCoordinator(GroupConfig.from_broker_config(broker.config), manager)
    coordinator.consumer_groups = ConsumerGroupCoordinator(coordinator, lambda: broker.metadata_cache.topics)
    coordinator.share_groups = ShareGroupCoordinator(coordinator, lambda: broker.metadata_cache.topics,
                                                     ShareGroupSettings.from_broker_config(broker.config))
    return coordinator
