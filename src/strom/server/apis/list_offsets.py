"""ListOffsets: earliest, latest, max timestamp, or the first offset at or after a timestamp."""

from __future__ import annotations

from strom.protocol.errors import ErrorCode
from strom.server.apis import RequestContext, api

LIST_OFFSETS = 2
LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL = -1, -2, -3, -4


def _lookup(partition, timestamp: int) -> tuple[int, int]:
    """(timestamp, offset) as Kafka answers; (-1, -1) where no record qualifies."""
    log = partition.log
    hw = partition.high_watermark
    if timestamp == LATEST:
        return -1, hw
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        return -1, log.log_start_offset
    if timestamp == MAX_TIMESTAMP:
        found = log.offset_of_max_timestamp()
        return found if found is not None and found[1] < hw else (-1, -1)
    found = log.fetch_offset_by_timestamp(timestamp)
    if found is None or found[0] >= hw:
        return -1, -1
    offset, ts = found
    return ts, offset


@api(LIST_OFFSETS, 1, 8)
async def handle_list_offsets(broker, ctx: RequestContext, request) -> dict:
    topics = []
    for t in request.topics:
        partitions = []
        for p in t.partitions:
            partition = broker.replica_manager.get_partition(t.name, p.partition_index)
            entry = {"partition_index": p.partition_index, "error_code": ErrorCode.NONE,
                     "timestamp": -1, "offset": -1, "leader_epoch": -1}
            if partition is None:
                entry["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                entry["timestamp"], entry["offset"] = _lookup(partition, p.timestamp)
                entry["leader_epoch"] = partition.leader_epoch
            partitions.append(entry)
        topics.append({"name": t.name, "partitions": partitions})
    return {"throttle_time_ms": 0, "topics": topics}
