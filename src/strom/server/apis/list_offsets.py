"""ListOffsets: earliest (local), latest, latest tiered, max timestamp, or the first offset at or
after a timestamp.

Offsets stop at the high watermark, or for read_committed (isolation_level 1) at the last
stable offset, as in Kafka."""

from __future__ import annotations

from collections import Counter

from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.records import HEADER_SIZE, read_header
from strom.security.authorizer import DESCRIBE, TOPIC, allowed
from strom.server.apis import RequestContext, api

LIST_OFFSETS = 2
LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -1, -2, -3, -4, -5


def _epoch_of(partition, offset: int) -> int:
    """The leader epoch of the batch holding `offset`, as Kafka answers for lookups that find a
    record (its leader-epoch cache); -1 when there is no such batch."""
    try:
        found = partition.log.read(offset, 1, min_one_message=True)
    except KafkaError:
        return -1
    if found.size < HEADER_SIZE:
        return -1
    return read_header(found.head(HEADER_SIZE)).partition_leader_epoch


def _lookup(partition, timestamp: int, read_committed: bool) -> tuple[int, int, int]:
    """(timestamp, offset, leader epoch) as Kafka answers; offset -1 where no record qualifies."""
    log = partition.log
    hw = partition.last_stable_offset if read_committed else partition.high_watermark
    if timestamp == LATEST:
        return -1, hw, partition.leader_epoch
    if timestamp == LATEST_TIERED:  # (v9, KIP-1005) nothing is tiered: Kafka's answer without remote storage
        return -1, -1, -1
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        start = log.log_start_offset
        return -1, start, _epoch_of(partition, start) if start < hw else partition.leader_epoch
    if timestamp == MAX_TIMESTAMP:
        found = log.offset_of_max_timestamp()
        if found is None or found[1] >= hw:
            return -1, -1, -1
        ts, offset = found
    else:
        found = log.fetch_offset_by_timestamp(timestamp)
        if found is None or found[0] >= hw:
            return -1, -1, -1
        offset, ts = found
    return ts, offset, _epoch_of(partition, offset)


@api(LIST_OFFSETS, 1, 10)
async def handle_list_offsets(broker, ctx: RequestContext, request) -> dict:
    # v10's timeout_ms bounds reads from remote storage, which Strom has none of.
    # Kafka answers INVALID_REQUEST for a partition named more than once in one request.
    counts = Counter((t.name, p.partition_index) for t in request.topics for p in t.partitions)
    topics = []
    for t in request.topics:
        partitions = []
        for p in t.partitions:
            partition, error = broker.replica_manager.leader_partition((t.name, p.partition_index))
            entry = {"partition_index": p.partition_index, "error_code": ErrorCode.NONE,
                     "timestamp": -1, "offset": -1, "leader_epoch": -1}
            if not allowed(broker, ctx, DESCRIBE, TOPIC, t.name):
                entry["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif counts[(t.name, p.partition_index)] > 1:
                entry["error_code"] = ErrorCode.INVALID_REQUEST
            elif partition is None:
                entry["error_code"] = error
            elif (epoch_error := partition.check_leader_epoch(
                    getattr(p, "current_leader_epoch", -1))) != ErrorCode.NONE:
                entry["error_code"] = epoch_error
            else:
                entry["timestamp"], entry["offset"], entry["leader_epoch"] = _lookup(partition, p.timestamp, getattr(request, "isolation_level", 0) == 1)
            partitions.append(entry)
        topics.append({"name": t.name, "partitions": partitions})
    return {"throttle_time_ms": 0, "topics": topics}
