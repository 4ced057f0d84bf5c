"""OffsetForLeaderEpoch: where a leader epoch ends in the leader's log (KIP-101, KIP-279).

A follower asks with the latest epoch it has and truncates to the answer; consumers use it to
detect that their position lies past a log that was truncated (KIP-320).
"""

from __future__ import annotations

from strom.protocol.errors import ErrorCode
from strom.security.authorizer import CLUSTER, CLUSTER_ACTION, DESCRIBE, TOPIC, allowed
from strom.server.apis import RequestContext, api

OFFSET_FOR_LEADER_EPOCH = 23


def _end_offset(broker, topic: str, p, denied: ErrorCode | None) -> dict:
    entry = {"partition": p.partition, "error_code": ErrorCode.NONE, "leader_epoch": -1, "end_offset": -1}
    if denied is not None:
        entry["error_code"] = denied
        return entry
    partition, error = broker.replica_manager.leader_partition((topic, p.partition))
    if partition is None:
        entry["error_code"] = error
        return entry
    error = partition.check_leader_epoch(getattr(p, "current_leader_epoch", -1))
    if error != ErrorCode.NONE:
        entry["error_code"] = error
        return entry
    entry["leader_epoch"], entry["end_offset"] = partition.log.end_offset_for_epoch(p.leader_epoch)
    return entry


@api(OFFSET_FOR_LEADER_EPOCH, 2, 4)
async def handle_offset_for_leader_epoch(broker, ctx: RequestContext, request) -> dict:
    follower = getattr(request, "replica_id", -1) >= 0
    cluster_denied = follower and not allowed(broker, ctx, CLUSTER_ACTION, CLUSTER)
    topics = []
    for t in request.topics:
        denied = (ErrorCode.CLUSTER_AUTHORIZATION_FAILED if cluster_denied else
                  ErrorCode.TOPIC_AUTHORIZATION_FAILED if not follower and not allowed(broker, ctx, DESCRIBE, TOPIC, t.topic)
                  else None)
        topics.append({"topic": t.topic, "partitions": [_end_offset(broker, t.topic, p, denied) for p in t.partitions]})
    return {"throttle_time_ms": 0, "topics": topics}
