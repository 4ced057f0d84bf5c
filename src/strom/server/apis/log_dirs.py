"""DeleteRecords (move a partition's log start offset up), DescribeLogDirs (partition sizes
per log dir, which dirs are offline, and, v5, which are cordoned: KIP-1066) and
AlterReplicaLogDirs (move a replica to another log dir of this broker)."""

from __future__ import annotations

import os

from strom.controller.znodes import is_internal
from strom.protocol.errors import ErrorCode, KafkaError
from strom.security.authorizer import ALTER, CLUSTER, DELETE, DESCRIBE, TOPIC, allowed
from strom.server.apis import RequestContext, api

DELETE_RECORDS, ALTER_REPLICA_LOG_DIRS, DESCRIBE_LOG_DIRS = 21, 34, 35
HIGH_WATERMARK = -1  # DeleteRecords offset meaning "up to the high watermark"


def _delete_records(broker, topic: str, index: int, offset: int) -> tuple[ErrorCode, int]:
    # Only the leader moves a log start offset (its followers follow it): a follower, or a
    # broker without a replica of a partition the cluster has, answers NOT_LEADER_OR_FOLLOWER.
    partition, error = broker.replica_manager.leader_partition((topic, index))
    if error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        return error, -1
    if is_internal(topic):
        # As Kafka: committed offsets and transaction states are not the client's to delete.
        return ErrorCode.INVALID_TOPIC_EXCEPTION, -1
    if partition is None:
        return error, -1
    hw = partition.high_watermark
    target = hw if offset == HIGH_WATERMARK else offset
    if target < 0 or target > hw:
        # Kafka: only records below the high watermark can be deleted.
        return ErrorCode.OFFSET_OUT_OF_RANGE, -1
    try:
        partition.log.increment_log_start_offset(target)
    except KafkaError as e:
        return e.code, -1
    broker.replica_manager.high_watermark_moved((topic, index))  # followers learn the new start now
    return ErrorCode.NONE, partition.log.log_start_offset


@api(DELETE_RECORDS, 0, 2)
async def handle_delete_records(broker, ctx: RequestContext, request) -> dict:
    topics = []
    moved = False
    for t in request.topics:
        partitions = []
        for p in t.partitions:
            if not allowed(broker, ctx, DELETE, TOPIC, t.name):
                partitions.append({"partition_index": p.partition_index, "low_watermark": -1,
                                   "error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED})
                continue
            error, low = _delete_records(broker, t.name, p.partition_index, p.offset)
            moved |= error == ErrorCode.NONE
            partitions.append({"partition_index": p.partition_index, "low_watermark": low,
                               "error_code": error})
        topics.append({"name": t.name, "partitions": partitions})
    if moved:
        # Kafka leaves this to the periodic checkpoint; writing it now means a crash right
        # after the answer cannot bring the deleted records back.
        # Requests arriving together share one write (a flood costs two writes, not one each).
        await broker.log_manager.log_start_offsets_checkpointed()
    return {"throttle_time_ms": 0, "topics": topics}


def _space(path) -> tuple[int, int]:
    try:
        st = os.statvfs(path)
    except OSError:
        return -1, -1
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


@api(DESCRIBE_LOG_DIRS, 1, 5)
async def handle_describe_log_dirs(broker, ctx: RequestContext, request) -> dict:
    if not allowed(broker, ctx, DESCRIBE, CLUSTER):  # Kafka answers with no dirs at all
        return {"throttle_time_ms": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "results": []}
    manager = broker.log_manager
    wanted: dict[str, set[int]] | None = None
    if request.topics is not None:
        wanted = {}
        for t in request.topics:
            wanted.setdefault(t.topic, set()).update(t.partitions)
    results = []
    for d in manager.log_dirs:
        offline = d in manager.offline_dirs
        by_topic: dict[str, list[dict]] = {}
        if not offline:
            for (topic, index), lg in manager.logs():
                if manager.dir_of((topic, index)) != d:
                    continue
                if wanted is not None and index not in wanted.get(topic, ()):
                    continue
                by_topic.setdefault(topic, []).append({
                    "partition_index": index, "partition_size": lg.size_in_bytes,
                    "offset_lag": 0, "is_future_key": False,
                })
        total, usable = (-1, -1) if offline else _space(d)
        results.append({
            "error_code": ErrorCode.KAFKA_STORAGE_ERROR if offline else ErrorCode.NONE,
            "log_dir": str(d.absolute()),
            "topics": [{"name": name, "partitions": sorted(ps, key=lambda x: x["partition_index"])}
                       for name, ps in sorted(by_topic.items())],
            "total_bytes": total,
            "usable_bytes": usable,
            "is_cordoned": d in manager.cordoned_dirs,
        })
    return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "results": results}


def _move(broker, path: str, topic: str, index: int) -> ErrorCode:
    manager = broker.log_manager
    target = next((d for d in manager.log_dirs if str(d.absolute()) == path or str(d) == path), None)
    if target is None:
        return ErrorCode.LOG_DIR_NOT_FOUND
    if target in manager.offline_dirs:
        return ErrorCode.KAFKA_STORAGE_ERROR
    if broker.replica_manager.get_partition(topic, index) is None:
        return ErrorCode.REPLICA_NOT_AVAILABLE
    if manager.dir_of((topic, index)) != target:
        broker.log_dir_mover.start((topic, index), target)
    return ErrorCode.NONE


@api(ALTER_REPLICA_LOG_DIRS, 1, 2)
async def handle_alter_replica_log_dirs(broker, ctx: RequestContext, request) -> dict:
    """Replicas of this broker move, while serving, to the log dir named for them."""
    permitted = allowed(broker, ctx, ALTER, CLUSTER)
    results: dict[str, list[dict]] = {}
    for d in request.dirs:
        for t in d.topics:
            for index in t.partitions:
                results.setdefault(t.name, []).append(
                    {"partition_index": index, "error_code": _move(broker, d.path, t.name, index) if permitted
                     else ErrorCode.CLUSTER_AUTHORIZATION_FAILED})
    return {"throttle_time_ms": 0, "results": [{"topic_name": name, "partitions": ps}
                                               for name, ps in results.items()]}
