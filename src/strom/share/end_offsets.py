"""The end offsets KIP-1226's share-partition lag is computed from, as Kafka's
PartitionMetadataClient finds them: each partition's high watermark (the offset a consumer's
ListOffsets LATEST answers), read here for the partitions this broker leads and asked of their
leaders with one ListOffsets per leader for the others, all leaders at once. A partition whose
leader is unknown, unreachable or answers an error gets that error instead.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from strom.client.topic_io import NETWORK_ERRORS, error_code
from strom.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

LIST_OFFSETS, _VERSION = 2, 7
LATEST = -1
_TIMEOUT_S = 10.0

TopicPartition = tuple[str, int]


async def end_offsets(broker: Any, pool: Any, partitions: set[TopicPartition]) -> dict[TopicPartition, int | ErrorCode]:
    """The high watermark of each of `partitions` (names known to the metadata), or its error."""
    out: dict[TopicPartition, int | ErrorCode] = {}
    by_leader: dict[int, list[TopicPartition]] = {}
    topics = broker.metadata_cache.topics
    for tp in partitions:
        local = broker.replica_manager.get_partition(*tp)
        if local is not None and local.is_leader:
            out[tp] = local.high_watermark
            continue
        meta = topics.get(tp[0])
        leader = meta.partitions[tp[1]].leader if meta is not None and tp[1] in meta.partitions else -1
        if leader < 0:
            out[tp] = ErrorCode.LEADER_NOT_AVAILABLE
        else:
            by_leader.setdefault(leader, []).append(tp)
    answers = await asyncio.gather(*(_ask(pool, leader, tps) for leader, tps in by_leader.items()))
    for answer in answers:
        out.update(answer)
    return out


async def _ask(pool: Any, leader: int, tps: list[TopicPartition]) -> dict[TopicPartition, int | ErrorCode]:
    by_topic: dict[str, list[dict]] = {}
    for name, p in tps:
        by_topic.setdefault(name, []).append({"partition_index": p, "current_leader_epoch": -1, "timestamp": LATEST})
    request = {"replica_id": -1, "isolation_level": 0,
               "topics": [{"name": name, "partitions": ps} for name, ps in by_topic.items()]}
    try:
        body = await pool.call(leader, LIST_OFFSETS, _VERSION, request, _TIMEOUT_S)
    except NETWORK_ERRORS as e:
        log.info("partition leader %d not reached for end offsets: %s", leader, e or type(e).__name__)
        return dict.fromkeys(tps, ErrorCode.LEADER_NOT_AVAILABLE)
    out: dict[TopicPartition, int | ErrorCode] = dict.fromkeys(tps, ErrorCode.LEADER_NOT_AVAILABLE)
    for topic in body.topics:
        for p in topic.partitions:
            tp = (topic.name, p.partition_index)
            if tp in out:
                out[tp] = p.offset if p.error_code == ErrorCode.NONE else error_code(p.error_code)
    return out

