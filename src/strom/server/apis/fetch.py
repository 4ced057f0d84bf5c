"""Fetch: read from leader logs up to the high watermark (read_committed: the last stable
offset, with the aborted transactions in range), long-polling through the purgatory.

The first read happens at once; if it brings fewer than `min_bytes` and `max_wait_ms` allows,
the request waits until an append to one of its partitions or the deadline, then reads again.
Record bytes are never copied into Python: the response carries file regions.
"""

from __future__ import annotations

import time

from strom.protocol.errors import ErrorCode
from strom.protocol.fetch import PartitionData, encode_fetch_response
from strom.server.apis import RawResponse, RequestContext, api
from strom.server.authorizer import CLUSTER, CLUSTER_ACTION, READ, TOPIC, allowed
from strom.server.fetch_session import new_context
from strom.server.metrics import BYTES_OUT, FAILED_FETCH_REQUESTS, FETCH_REQUESTS, BrokerTopicStats

FETCH = 1
READ_COMMITTED = 1  # isolation_level: read up to the last stable offset, skip aborted data
_UNKNOWN = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.UNKNOWN_TOPIC_ID)


def _read_all(broker, request, wanted, denied: dict[str, ErrorCode]) -> tuple[list[tuple[str, list[PartitionData]]], int, bool]:
    rm = broker.replica_manager
    remaining = request.max_bytes
    topics, total, errors = [], 0, False
    read_committed = request.isolation_level == READ_COMMITTED
    replica_id = getattr(request, "replica_id", -1)  # >= 0: a follower replicating
    for topic, partitions in wanted:
        out = []
        for p in partitions:
            if topic in denied:
                out.append(PartitionData(p.partition, denied[topic], -1, -1, -1))
                continue
            tp = (topic, p.partition)
            limit = max(0, min(p.partition_max_bytes, remaining))
            # Kafka returns at least one whole batch, once per response, so that a batch larger
            # than the limits cannot stall a consumer.
            result = rm.read(tp, p.fetch_offset, limit, min_one_message=total == 0,
                             read_committed=read_committed,
                             current_leader_epoch=getattr(p, "current_leader_epoch", -1),
                             replica_id=replica_id,
                             last_fetched_epoch=getattr(p, "last_fetched_epoch", -1))
            records = result.records if result.records is not None and result.records.size else None
            size = records.size if records is not None else 0
            total += size
            remaining -= size
            errors |= result.error != ErrorCode.NONE
            aborted = None if result.aborted is None else [
                (t.producer_id, t.first_offset) for t in result.aborted]
            out.append(PartitionData(p.partition, result.error, result.high_watermark,
                                     result.last_stable_offset, result.log_start_offset, records,
                                     aborted, result.diverging_epoch))
        topics.append((topic, out))
    return topics, total, errors


@api(FETCH, 4, 12)
async def handle_fetch(broker, ctx: RequestContext, request) -> RawResponse:
    version = ctx.header.api_version
    follower = getattr(request, "replica_id", -1) >= 0
    context = new_context(broker.fetch_sessions, request, version, follower)
    if context.error:
        parts, _ = encode_fetch_response(version, [], error_code=context.error)
        return RawResponse(parts)
    wanted = context.wanted
    denied = _denied(broker, ctx, request, wanted)
    deadline = time.monotonic() + max(0, request.max_wait_ms) / 1000
    keys = [(topic, p.partition) for topic, ps in wanted for p in ps if topic not in denied]
    while True:
        topics, total, errors = _read_all(broker, request, wanted, denied)
        remaining = deadline - time.monotonic()
        if total >= request.min_bytes or errors or remaining <= 0 or not keys or broker.stopping:
            break
        await broker.replica_manager.fetch_purgatory.wait_any(keys, remaining)
    _count(broker.replica_manager.topic_stats, topics, follower)
    parts, _ = encode_fetch_response(version, context.respond(topics), session_id=context.session_id)
    return RawResponse(parts)


def _denied(broker, ctx: RequestContext, request, wanted) -> dict[str, ErrorCode]:
    """Topics this fetch may not read: consumers need READ on each topic, followers
    CLUSTER_ACTION on the cluster (Kafka's checks)."""
    if broker.authorizer is None:
        return {}
    if getattr(request, "replica_id", -1) >= 0:
        if allowed(broker, ctx, CLUSTER_ACTION, CLUSTER):
            return {}
        return {topic: ErrorCode.CLUSTER_AUTHORIZATION_FAILED for topic, _ in wanted}
    return {topic: ErrorCode.TOPIC_AUTHORIZATION_FAILED for topic, _ in wanted
            if not allowed(broker, ctx, READ, TOPIC, topic)}


def _count(stats: BrokerTopicStats, topics: list[tuple[str, list[PartitionData]]], follower: bool) -> None:
    """BytesOutPerSec and the fetch request rates per topic; followers' bytes count as
    replication traffic instead. Topics the broker does not have get no series, so a client
    cannot grow the metrics by naming made-up topics."""
    for topic, partitions in topics:
        sent = sum(p.records.size for p in partitions if p.records is not None)
        if follower:
            stats.replication_bytes_out += sent
            continue
        known = [p for p in partitions if p.error_code not in _UNKNOWN]
        if known:
            counts = stats.topics[topic]
            counts[BYTES_OUT] += sent
            counts[FETCH_REQUESTS] += len(known)
            counts[FAILED_FETCH_REQUESTS] += sum(p.error_code != ErrorCode.NONE for p in known)
