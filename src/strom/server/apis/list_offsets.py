"""ListOffsets: earliest (local), latest, latest tiered, earliest pending upload, max timestamp,
or the first offset at or after a timestamp.

Offsets stop at the high watermark, or for read_committed (isolation_level 1) at the last
stable offset, as in Kafka."""

from __future__ import annotations

import asyncio
from array import array

from strom.log.remote import RemoteStorageError
from strom.network.request import RawResponse
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.list_offsets import ListOffsetsRequest, ListOffsetsResponseWriter
from strom.protocol.records import HEADER_SIZE, read_header
from strom.security.authorizer import DESCRIBE, TOPIC, allowed
from strom.server.apis import RequestContext, api

LIST_OFFSETS = 2
LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -1, -2, -3, -4, -5
EARLIEST_PENDING_UPLOAD = -6
# KIP-1023's timestamp came with v11: an older request asking for it gets UNSUPPORTED_VERSION,
# as Kafka answers. (The older special timestamps are served at any version, as Strom always has.)
_SENTINEL_FROM = {EARLIEST_PENDING_UPLOAD: 11}
_YIELD_EVERY = 5000  # partitions answered between two turns of the event loop


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
    if timestamp == LATEST_TIERED:  # (v9, KIP-1005) the last offset in remote storage; -1: none
        highest = log.highest_offset_in_remote_storage if log.tiered else -1
        return -1, highest, log.leader_epoch_cache.epoch_for(highest) if highest >= 0 else -1
    if timestamp == EARLIEST_PENDING_UPLOAD:  # (v11, KIP-1023)
        return _earliest_pending_upload(partition, read_committed)
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        # a tiered log starts in remote storage; EARLIEST_LOCAL (KIP-405) is its first local offset
        start = log.log_start_offset if timestamp == EARLIEST else log.local_log_start_offset
        if start >= hw:
            return -1, start, partition.leader_epoch
        return -1, start, log.leader_epoch_cache.epoch_for(start) if start < log.local_log_start_offset \
            else _epoch_of(partition, start)
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


def _earliest_pending_upload(partition, read_committed: bool) -> tuple[int, int, int]:
    """The first offset not yet copied to remote storage: the one after the highest remote
    offset; the log start while nothing was copied and no local segment was dropped for
    being remote (else this leader has not learnt what was copied yet: -1); -1 for a topic
    that is not tiered."""
    log = partition.log
    if not log.tiered:
        return -1, -1, -1
    highest = log.highest_offset_in_remote_storage
    if highest < 0:
        if log.local_log_start_offset != log.log_start_offset:
            return -1, -1, -1
        return _lookup(partition, EARLIEST, read_committed)
    offset = max(highest + 1, log.log_start_offset)
    return -1, offset, log.leader_epoch_cache.epoch_for(offset)


async def _remote_lookup(broker, partition, timestamp: int, read_committed: bool) -> tuple[int, int, int] | None:
    """A timestamp's first offset in a tiered log's remote segments (looked at before the local
    log, as Kafka does), or None to look locally. Off the loop, in the remote reader threads."""
    rlm, log = broker.remote_log_manager, partition.log
    if timestamp < 0 or rlm is None or not log.tiered or log.log_start_offset >= log.local_log_start_offset:
        return None
    try:
        found = await asyncio.wait_for(rlm.find_offset_by_timestamp(partition, timestamp),
                                       broker.config["remote.list.offsets.request.timeout.ms"] / 1000)
    except (TimeoutError, RemoteStorageError) as e:
        raise KafkaError(f"remote storage did not answer the timestamp lookup: {e}", ErrorCode.REQUEST_TIMED_OUT) from e
    if found is None:
        return None
    offset, ts = found
    hw = partition.last_stable_offset if read_committed else partition.high_watermark
    return (ts, offset, partition.log.leader_epoch_cache.epoch_for(offset)) if offset < hw else (-1, -1, -1)


def _duplicates(request: ListOffsetsRequest) -> set[tuple[str, int]]:
    """The partitions a request names more than once (Kafka answers each INVALID_REQUEST),
    found with four bytes per partition named."""
    indexes: dict[str, array] = {}
    for name, _, partitions in request.topics():
        named = indexes.setdefault(name, array("i"))
        named.extend(p.partition_index for p in partitions)
    duplicates = set()
    for name, named in indexes.items():
        ordered = sorted(named)
        duplicates.update((name, a) for a, b in zip(ordered, ordered[1:], strict=False) if a == b)
    return duplicates


@api(LIST_OFFSETS, 1, 11)
async def handle_list_offsets(broker, ctx: RequestContext, request: ListOffsetsRequest) -> RawResponse:
    """Written partition by partition (protocol/list_offsets.py), a turn of the loop given
    back every few thousand partitions."""
    duplicates = _duplicates(request)
    read_committed = request.isolation_level == 1
    out = ListOffsetsResponseWriter(ctx.header.api_version)
    done = 0
    for name, count, partitions in request.topics():
        described = allowed(broker, ctx, DESCRIBE, TOPIC, name)
        out.topic(name, count)
        for p in partitions:
            done += 1
            if not done % _YIELD_EVERY:
                await asyncio.sleep(0)
            if not described:
                out.partition(p.partition_index, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                continue
            if (name, p.partition_index) in duplicates:
                out.partition(p.partition_index, ErrorCode.INVALID_REQUEST)
                continue
            if _SENTINEL_FROM.get(p.timestamp, 0) > ctx.header.api_version:
                out.partition(p.partition_index, ErrorCode.UNSUPPORTED_VERSION)
                continue
            partition, error = broker.replica_manager.leader_partition((name, p.partition_index))
            if partition is None:
                out.partition(p.partition_index, error)
            elif (epoch_error := partition.check_leader_epoch(p.current_leader_epoch)) != ErrorCode.NONE:
                out.partition(p.partition_index, epoch_error)
            else:
                try:
                    found = await _remote_lookup(broker, partition, p.timestamp, read_committed)
                except KafkaError as e:
                    out.partition(p.partition_index, e.code)
                    continue
                timestamp, offset, epoch = found or _lookup(partition, p.timestamp, read_committed)
                out.partition(p.partition_index, ErrorCode.NONE, timestamp, offset, epoch)
    return RawResponse(out.parts(), throttle_at=0 if ctx.header.api_version >= 2 else None)
