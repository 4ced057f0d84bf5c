"""Tiered storage's place in the broker: with remote.log.storage.system.enable, the remote store
named by the rsm.config.* keys, the remote log metadata manager over __remote_log_metadata,
and the RemoteLogManager that copies, expires and reads the broker's tiered partitions."""

from __future__ import annotations

from functools import partial
from typing import Any

from strom.config.broker import ConfigError
from strom.log.remote import RemoteStorageError
from strom.protocol.errors import ErrorCode
from strom.remote.config import RemoteStorageConfigError, storage_from_config
from strom.remote.manager import RemoteLogManager

LIST_OFFSETS, LIST_OFFSETS_VERSION, EARLIEST_LOCAL = 2, 8, -4


def start_remote_log_manager(broker: Any) -> RemoteLogManager | None:
    config = broker.config
    if not config["remote.log.storage.system.enable"]:
        return None
    try:
        storage = storage_from_config(config.remote_storage_props(), config["remote.log.storage.manager.impl.prefix"])
    except RemoteStorageConfigError as e:
        raise ConfigError(f"remote.log.storage.system.enable is true but {e}") from None
    from strom.remote.metadata_manager import RemoteLogMetadataManager

    manager = RemoteLogManager(broker.broker_id, config, storage, RemoteLogMetadataManager(broker),
                               lambda: broker.replica_manager.partitions.values())
    manager.start()
    if broker.replica_fetchers is not None:
        broker.replica_fetchers.tiered_state_builder = partial(build_follower_state, broker, manager)
    return manager


async def build_follower_state(broker: Any, manager: RemoteLogManager, partition: Any, leader: int,
                               leader_log_start: int) -> None:
    """A follower answered OFFSET_MOVED_TO_TIERED_STORAGE: ask the leader where its local log
    starts (ListOffsets EARLIEST_LOCAL_TIMESTAMP), then start there from remote storage."""
    body = await broker.connections.call(leader, LIST_OFFSETS, LIST_OFFSETS_VERSION, {
        "replica_id": broker.broker_id, "isolation_level": 0, "topics": [{"name": partition.topic, "partitions": [
            {"partition_index": partition.index, "current_leader_epoch": partition.leader_epoch,
             "timestamp": EARLIEST_LOCAL}]}]}, 10.0)
    answer = body.topics[0].partitions[0]
    if answer.error_code != ErrorCode.NONE:
        raise RemoteStorageError(f"the leader answered {ErrorCode(answer.error_code).name}")
    await manager.build_follower_state(partition, answer.offset, leader_log_start)


def topic_deleted(broker: Any, partition: Any) -> bool:
    """StopReplica deletes `partition` because its topic is gone (not a replica moved away):
    its remote data goes too, in the background."""
    rlm = broker.remote_log_manager
    if rlm is None or not partition.log.tiered:
        return False
    if broker.metadata_cache.partition(partition.topic, partition.index) is not None:
        return False  # the topic is there: this replica moved
    rlm.partition_deleted(partition.topic_id, partition.topic, partition.index)
    return True
