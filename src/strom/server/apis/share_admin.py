"""KIP-932's share group offsets admin: DescribeShareGroupOffsets (the share-partition start
offset of each partition a share group reads), AlterShareGroupOffsets (start over at given
offsets) and DeleteShareGroupOffsets (forget a group's state for whole topics).
DescribeShareGroupOffsets v1 (KIP-1226) adds each partition's lag: its high watermark less the
start offset less the records past it already done with (the share coordinator's
delivery-complete count); -1 where the group has no state there. Altering and
deleting need the group to have no members (NON_EMPTY_GROUP), as in Kafka; a partition the
group never read describes as start offset -1. The state is the share coordinators' (any
broker's): read with ReadShareGroupStateSummary, started over with InitializeShareGroupState,
deleted with DeleteShareGroupState, through this broker's Persister. A group is known if this
broker has it (members, or state led here) or a share coordinator has state for it.
"""

from __future__ import annotations

import uuid

from strom.coordinator.share.coordinator import StateResult
from strom.coordinator.share.state_store import SharePartitionKey
from strom.protocol.errors import ErrorCode
from strom.security.authorizer import DELETE, DESCRIBE, GROUP, READ, TOPIC, allowed
from strom.server.apis import RequestContext, api
from strom.share.end_offsets import end_offsets

DESCRIBE_SHARE_GROUP_OFFSETS, ALTER_SHARE_GROUP_OFFSETS, DELETE_SHARE_GROUP_OFFSETS = 90, 91, 92
_ZERO = uuid.UUID(int=0)


def _group_error(broker, group_id: str, api_key: int) -> ErrorCode | None:
    """Why `group_id` cannot be answered here as a share group, if it cannot."""
    coordinator = broker.group_coordinator
    error = coordinator.validate_group_status(group_id, api_key)
    if error is not None:
        return error
    other = coordinator.groups.get(group_id)
    if other is not None and not other.is_dead:
        return ErrorCode.GROUP_ID_NOT_FOUND  # a classic or consumer group
    return None


def _known(broker, group_id: str) -> bool:
    return group_id in broker.group_coordinator.share_groups.groups or group_id in broker.share_partitions.group_ids()


def _has_members(broker, group_id: str) -> bool:
    group = broker.group_coordinator.share_groups.groups.get(group_id)
    return group is not None and bool(group.members)


@api(DESCRIBE_SHARE_GROUP_OFFSETS, 0, 1)
async def handle_describe_share_group_offsets(broker, ctx: RequestContext, request) -> dict:
    topics = broker.metadata_cache.topics
    names = broker.metadata_cache.names_by_id
    with_lag = ctx.header.api_version >= 1
    groups = []
    for g in request.groups:
        out = {"group_id": g.group_id, "topics": [], "error_code": ErrorCode.NONE, "error_message": None}
        groups.append(out)
        error = ErrorCode.GROUP_AUTHORIZATION_FAILED if not allowed(broker, ctx, DESCRIBE, GROUP, g.group_id) \
            else _group_error(broker, g.group_id, DESCRIBE_SHARE_GROUP_OFFSETS)
        summaries: dict[tuple[uuid.UUID, int], StateResult] = {}
        if error is None:
            manager = broker.share_partitions
            topic_ids = None if g.topics is None else [topics[t.topic_name].topic_id for t in g.topics
                                                       if t.topic_name in topics]
            summaries = await manager.summaries(manager.candidate_keys(g.group_id, topic_ids))
            if not summaries and not _known(broker, g.group_id):
                error = ErrorCode.GROUP_ID_NOT_FOUND
        if error is not None:
            out["error_code"], out["error_message"] = error, f"{error.name}: {g.group_id}"
            continue
        if g.topics is None:  # every partition the group has state for
            wanted: dict[str, list[int]] = {}
            for (topic_id, p) in sorted(summaries, key=lambda tp: (names.get(tp[0], ""), tp[1])):
                if topic_id in names:
                    wanted.setdefault(names[topic_id], []).append(p)
        else:
            wanted = {t.topic_name: list(t.partitions) for t in g.topics}
        rows: dict[str, list[dict]] = {}
        lagging: dict[tuple[str, int], tuple[dict, int]] = {}  # row and start + delivered, of each with a lag
        for name, partitions in wanted.items():
            meta = topics.get(name)
            topic_id = meta.topic_id if meta is not None else _ZERO
            rows.setdefault(name, [])
            for p in partitions:
                if not allowed(broker, ctx, DESCRIBE, TOPIC, name):  # before telling it exists
                    code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                elif meta is None or p not in meta.partitions:
                    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                else:
                    code = ErrorCode.NONE
                epoch = meta.partitions[p].leader_epoch if code == ErrorCode.NONE else -1
                summary = summaries.get((topic_id, p)) if code == ErrorCode.NONE else None
                row = {"partition_index": p, "start_offset": -1 if summary is None else summary.state.start_offset,
                       "leader_epoch": epoch, "lag": -1, "error_code": code, "error_message": None}
                rows[name].append(row)
                if with_lag and summary is not None and summary.state.start_offset >= 0 \
                        and summary.delivery_complete_count >= 0:
                    lagging[(name, p)] = (row, summary.state.start_offset + summary.delivery_complete_count)
        await _fill_lags(broker, lagging)
        out["topics"] = [{"topic_name": name, "topic_id": topics[name].topic_id if name in topics else _ZERO,
                          "partitions": ps} for name, ps in rows.items()]
    return {"throttle_time_ms": 0, "groups": groups}


async def _fill_lags(broker, lagging: dict[tuple[str, int], tuple[dict, int]]) -> None:
    """KIP-1226's lag of each row: the partition's end offset (its high watermark), less the
    start offset, less the records past it whose delivery is complete, as Kafka computes it. A
    partition whose end offset is not found answers that error."""
    if not lagging:
        return
    manager = broker.share_partitions
    for tp, end in (await end_offsets(broker, manager.persister.pool, set(lagging))).items():
        row, done = lagging[tp]
        if isinstance(end, ErrorCode):
            row["error_code"], row["error_message"] = end, end.name
        else:
            row["lag"] = end - done


@api(ALTER_SHARE_GROUP_OFFSETS, 0, 0)
async def handle_alter_share_group_offsets(broker, ctx: RequestContext, request) -> dict:
    group_id = request.group_id
    topics = broker.metadata_cache.topics
    # Kafka's order: the group's authorization, each topic's, whether the topic exists, and only
    # then the group's state (whether it has members), which a user who may not read the topic
    # does not learn.
    group_denied = not allowed(broker, ctx, READ, GROUP, group_id)
    error = None if group_denied else _group_error(broker, group_id, ALTER_SHARE_GROUP_OFFSETS)
    if error is None and not group_denied and _has_members(broker, group_id):
        error = ErrorCode.NON_EMPTY_GROUP
    results: dict[tuple[str, int], ErrorCode] = {}
    starts: dict[SharePartitionKey, int] = {}
    where: dict[SharePartitionKey, tuple[str, int]] = {}
    for t in request.topics:
        meta = topics.get(t.topic_name)
        for p in t.partitions:
            tp = (t.topic_name, p.partition_index)
            if group_denied:
                results[tp] = ErrorCode.GROUP_AUTHORIZATION_FAILED
            elif not allowed(broker, ctx, READ, TOPIC, t.topic_name):
                results[tp] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif meta is None or p.partition_index not in meta.partitions:
                results[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif error is not None:
                results[tp] = error
            elif p.start_offset < 0:
                results[tp] = ErrorCode.INVALID_REQUEST
            else:
                key = SharePartitionKey(group_id, meta.topic_id, p.partition_index)
                starts[key], where[key] = p.start_offset, tp
    for key, code in (await broker.share_partitions.set_start_offsets(starts)).items():
        results[where[key]] = code
    return {"throttle_time_ms": 0, "responses": _by_topic(broker, results)}


@api(DELETE_SHARE_GROUP_OFFSETS, 0, 0)
async def handle_delete_share_group_offsets(broker, ctx: RequestContext, request) -> dict:
    group_id = request.group_id
    error = ErrorCode.GROUP_AUTHORIZATION_FAILED if not allowed(broker, ctx, DELETE, GROUP, group_id) \
        else _group_error(broker, group_id, DELETE_SHARE_GROUP_OFFSETS)
    manager = broker.share_partitions
    names = broker.metadata_cache.names_by_id
    topics = broker.metadata_cache.topics
    wanted = [topics[t.topic_name].topic_id for t in request.topics if t.topic_name in topics]
    keys = manager.candidate_keys(group_id, wanted)
    if error is None and not _known(broker, group_id) and not await manager.start_offsets(keys):
        error = ErrorCode.GROUP_ID_NOT_FOUND
    if error is None and _has_members(broker, group_id):
        error = ErrorCode.NON_EMPTY_GROUP
    if error is not None:
        return {"throttle_time_ms": 0, "error_code": error, "error_message": f"{error.name}: {group_id}",
                "responses": []}
    results = {(names[k.topic_id], k.partition): code
               for k, code in (await manager.delete_partitions(keys)).items()}
    return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "error_message": None,
            "responses": _by_topic(broker, results)}


def _by_topic(broker, results: dict[tuple[str, int], ErrorCode]) -> list[dict]:
    topics = broker.metadata_cache.topics
    out: dict[str, list[dict]] = {}
    for (name, p), code in sorted(results.items()):
        out.setdefault(name, []).append({"partition_index": p, "error_code": code,
                                         "error_message": None if code == ErrorCode.NONE else code.name})
    return [{"topic_name": name, "topic_id": topics[name].topic_id if name in topics else _ZERO,
             "partitions": rows} for name, rows in out.items()]
