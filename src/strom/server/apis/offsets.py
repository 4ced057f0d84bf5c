"""OffsetCommit, OffsetFetch and OffsetDelete: committed offsets of groups.

The coordinator validates the group and member (generation for classic groups, member epoch
for KIP-848 ones) and persists accepted offsets in `__consumer_offsets` before answering.
From v10 OffsetCommit and OffsetFetch name topics by id (KIP-848): each id is read as the name
the metadata has for it, and answered under its id; an id the metadata does not know gets
UNKNOWN_TOPIC_ID.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from strom.coordinator import GROUP_METADATA_TOPIC
from strom.coordinator.group.consumer_group import ConsumerGroup
from strom.coordinator.group.records import OffsetAndMetadata
from strom.protocol.errors import ErrorCode
from strom.security.authorizer import (
    DELETE,
    DESCRIBE,
    GROUP,
    READ,
    TOPIC,
    TRANSACTIONAL_ID,
    WRITE,
    allowed,
)
from strom.server.apis import RequestContext, api, by_topic
from strom.server.apis.transactions import check_answer

OFFSET_COMMIT, OFFSET_FETCH, TXN_OFFSET_COMMIT, OFFSET_DELETE = 8, 9, 28, 47
NO_METADATA = ""  # what OffsetFetch returns as metadata for a partition without a commit
MAX_TIMESTAMP = (1 << 63) - 1  # an int64 on disk: a retention that long never expires
TOPIC_IDS_FROM = 10  # OffsetCommit and OffsetFetch
NO_TOPIC_ID = uuid.UUID(int=0)


@dataclass(slots=True)
class _ById:
    """A v10 request topic read by name: the fields the handlers read of a named one."""

    name: str
    topic_id: uuid.UUID
    partitions: Any = None  # OffsetCommit's
    partition_indexes: Any = None  # OffsetFetch's


def _by_name(broker, topics) -> tuple[list[_ById], set[str]]:
    """v10 topics under the names their ids have here, and the names standing for unknown ids
    (an id's own text)."""
    names = broker.metadata_cache.names_by_id
    out, unknown = [], set()
    for t in topics:
        name = names.get(t.topic_id)
        if name is None:
            name = str(t.topic_id)
            unknown.add(name)
        out.append(_ById(name, t.topic_id, getattr(t, "partitions", None), getattr(t, "partition_indexes", None)))
    return out, unknown


def _with_ids(broker, topics: list[dict], asked: list[_ById] | None) -> list[dict]:
    """Response topics (by name) with the topic_id v10 answers under: the one asked for, else
    the metadata's; a topic the metadata no longer has cannot be named by id and is left out."""
    ids = {t.name: t.topic_id for t in asked or ()}
    out = []
    for t in topics:
        topic_id = ids.get(t["name"])
        if topic_id is None:
            meta = broker.metadata_cache.topics.get(t["name"])
            if meta is None:
                continue
            topic_id = meta.topic_id
        out.append({**t, "topic_id": topic_id})
    return out


def _partition_exists(broker, topic: str, partition: int) -> bool:
    meta = broker.metadata_cache.topics.get(topic)
    return meta is not None and partition in meta.partitions


def _requested_commits(broker, ctx: RequestContext, group_id: str, topics, leader_epochs: bool,
                       retention_ms: int = -1
                       ) -> tuple[dict[tuple[str, int], ErrorCode], dict[tuple[str, int], OffsetAndMetadata]]:
    """The offsets an OffsetCommit or TxnOffsetCommit asks for; GROUP_AUTHORIZATION_FAILED
    everywhere without READ on the group, TOPIC_AUTHORIZATION_FAILED for topics without READ,
    UNKNOWN_TOPIC_OR_PARTITION for partitions that do not exist."""
    now = int(time.time() * 1000)
    errors: dict[tuple[str, int], ErrorCode] = {}
    commits: dict[tuple[str, int], OffsetAndMetadata] = {}
    group_allowed = allowed(broker, ctx, READ, GROUP, group_id)
    for topic in topics:
        topic_allowed = group_allowed and allowed(broker, ctx, READ, TOPIC, topic.name)
        for p in topic.partitions:
            tp = (topic.name, p.partition_index)
            if not topic_allowed:
                errors[tp] = (ErrorCode.TOPIC_AUTHORIZATION_FAILED if group_allowed
                              else ErrorCode.GROUP_AUTHORIZATION_FAILED)
                continue
            if not _partition_exists(broker, *tp):
                errors[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            commits[tp] = OffsetAndMetadata(
                offset=p.committed_offset,
                leader_epoch=p.committed_leader_epoch if leader_epochs else -1,
                metadata=p.committed_metadata or NO_METADATA,
                commit_timestamp=now,
                expire_timestamp=min(now + retention_ms, MAX_TIMESTAMP) if retention_ms != -1 else None,
            )
    return errors, commits


def _commit_response(topics, errors: dict[tuple[str, int], ErrorCode]) -> dict:
    """Per partition, in the order asked."""
    ordered = {(t.name, p.partition_index): {"partition_index": p.partition_index,
                                             "error_code": errors[(t.name, p.partition_index)]}
               for t in topics for p in t.partitions}
    return {"throttle_time_ms": 0, "topics": by_topic(ordered)}


@api(OFFSET_COMMIT, 2, 10)
async def handle_offset_commit(broker, ctx: RequestContext, request) -> dict:
    version = ctx.header.api_version
    # v2-v4 may ask for a retention of their own; later versions use the broker's.
    retention = request.retention_time_ms if version <= 4 else -1
    topics, unknown = (_by_name(broker, request.topics) if version >= TOPIC_IDS_FROM
                       else (request.topics, set()))
    errors, commits = _requested_commits(broker, ctx, request.group_id, [t for t in topics if t.name not in unknown],
                                         version >= 6, retention)
    if unknown:
        error = (ErrorCode.UNKNOWN_TOPIC_ID if allowed(broker, ctx, READ, GROUP, request.group_id)
                 else ErrorCode.GROUP_AUTHORIZATION_FAILED)
        errors.update({(t.name, p.partition_index): error for t in topics if t.name in unknown for p in t.partitions})
    if commits:
        errors.update(broker.group_coordinator.commit_offsets(
            request.group_id, request.member_id,
            request.group_instance_id if version >= 7 else None,
            request.generation_id_or_member_epoch, commits))
        await _replicated(broker, request.group_id, errors)
    response = _commit_response(topics, errors)
    if version >= TOPIC_IDS_FROM:
        response["topics"] = _with_ids(broker, response["topics"], topics)
    return response


async def _replicated(broker, group_id: str, errors: dict) -> None:
    """Offsets count as committed once the ISR of the group's partition has them."""
    if any(e == ErrorCode.NONE for e in errors.values()):
        error = await broker.coordinators.await_internal_replication(GROUP_METADATA_TOPIC, group_id)
        if error != ErrorCode.NONE:
            errors.update({tp: error for tp, e in errors.items() if e == ErrorCode.NONE})


def _fetch_group(broker, ctx: RequestContext, group_id: str, topics, member_id: str | None, member_epoch: int,
                 with_epoch: bool, require_stable: bool = False) -> tuple[ErrorCode, list[dict]]:
    """One group's committed offsets as response topics; `topics` None means all (those the
    principal may describe)."""
    if not allowed(broker, ctx, DESCRIBE, GROUP, group_id):
        return ErrorCode.GROUP_AUTHORIZATION_FAILED, []
    coordinator = broker.group_coordinator
    if coordinator.share_groups is not None and group_id in coordinator.share_groups.groups:
        # A share group keeps no committed offsets (its state is the share coordinator's):
        # Kafka answers that it is not a consumer group.
        return ErrorCode.GROUP_ID_NOT_FOUND, []
    group = coordinator.groups.get(group_id)
    if isinstance(group, ConsumerGroup) and (member_id is not None or member_epoch >= 0):
        # KIP-848 members fetch with their epoch; stale members are told so.
        error = coordinator.consumer_groups.validate_member(group, member_id, member_epoch)
        if error is not None:
            return error, []
    wanted = None if topics is None else [(t.name, p) for t in topics for p in t.partition_indexes]
    error, offsets = coordinator.fetch_offsets(group_id, wanted)
    if error != ErrorCode.NONE:
        return error, []
    entries = {}
    for tp in (sorted(offsets) if wanted is None else wanted):
        if not allowed(broker, ctx, DESCRIBE, TOPIC, tp[0]):
            if wanted is not None:
                entries[tp] = {"partition_index": tp[1], "error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                               "committed_offset": -1, "metadata": NO_METADATA}
            continue
        committed = offsets.get(tp)
        entry = {"partition_index": tp[1], "error_code": ErrorCode.NONE,
                 "committed_offset": committed.offset if committed else -1,
                 "metadata": committed.metadata if committed else NO_METADATA}
        if with_epoch:
            entry["committed_leader_epoch"] = committed.leader_epoch if committed else -1
        if require_stable and coordinator.has_pending_txn_offsets(group_id, tp):
            # An open transaction committed an offset here: read_committed consumers wait.
            entry.update(error_code=ErrorCode.UNSTABLE_OFFSET_COMMIT, committed_offset=-1)
        entries[tp] = entry
    return ErrorCode.NONE, by_topic(entries)


async def _in_transaction(broker, request, version: int) -> ErrorCode:
    """KIP-890: the group's offsets partition must be in the producer's transaction (added by
    AddOffsetsToTxn); from v5 (transactions version 2) it is added here instead."""
    tp = (GROUP_METADATA_TOPIC, broker.group_coordinator.store.partition_for(request.group_id))
    answer = (await broker.add_partitions_to_txn.verify(request.transactional_id, request.producer_id,
                                                  request.producer_epoch, [tp], add=version >= 5))[tp]
    # "Not now" as a coordinator still loading, which this API's clients retry.
    return check_answer(answer, version, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, abortable_from=4)


@api(TXN_OFFSET_COMMIT, 0, 5)
async def handle_txn_offset_commit(broker, ctx: RequestContext, request) -> dict:
    """Offsets committed as part of a transaction: written now, visible once it commits."""
    version = ctx.header.api_version
    if not allowed(broker, ctx, WRITE, TRANSACTIONAL_ID, request.transactional_id):
        return _commit_response(request.topics, {
            (t.name, p.partition_index): ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            for t in request.topics for p in t.partitions})
    errors, commits = _requested_commits(broker, ctx, request.group_id, request.topics, version >= 2)
    if commits and (error := await _in_transaction(broker, request, version)) != ErrorCode.NONE:
        errors.update(dict.fromkeys(commits, error))
        commits = {}
    if commits:
        v3 = version >= 3
        errors.update(broker.group_coordinator.commit_txn_offsets(
            request.group_id, request.producer_id, request.producer_epoch,
            request.member_id if v3 else "", request.group_instance_id if v3 else None,
            request.generation_id if v3 else -1, commits))
        await _replicated(broker, request.group_id, errors)
    return _commit_response(request.topics, errors)


@api(OFFSET_FETCH, 1, 10)
async def handle_offset_fetch(broker, ctx: RequestContext, request) -> dict:
    version = ctx.header.api_version
    if version >= 8:
        groups = []
        for g in request.groups:
            asked, unknown = g.topics, set()
            if version >= TOPIC_IDS_FROM and asked is not None:
                asked, unknown = _by_name(broker, asked)
            error, topics = _fetch_group(broker, ctx, g.group_id, asked,
                                         g.member_id if version >= 9 else None,
                                         g.member_epoch if version >= 9 else -1, True,
                                         request.require_stable)
            if version >= TOPIC_IDS_FROM:
                topics = _with_ids(broker, _unknown_ids(topics, unknown), asked)
            groups.append({"group_id": g.group_id, "topics": topics, "error_code": error})
        return {"throttle_time_ms": 0, "groups": groups}
    error, topics = _fetch_group(broker, ctx, request.group_id, request.topics, None, -1, version >= 5,
                                 version >= 7 and request.require_stable)
    if version == 1 and error != ErrorCode.NONE:
        # v1 has no group-level error: every requested partition carries it.
        topics = [{"name": t.name, "partitions": [
            {"partition_index": p, "committed_offset": -1, "metadata": NO_METADATA,
             "error_code": error} for p in t.partition_indexes]} for t in request.topics or ()]
    return {"throttle_time_ms": 0, "topics": topics, "error_code": error}


def _unknown_ids(topics: list[dict], unknown: set[str]) -> list[dict]:
    """UNKNOWN_TOPIC_ID for each partition asked of a topic id the metadata does not know."""
    if not unknown:
        return topics
    return [{**t, "partitions": [{**p, "error_code": ErrorCode.UNKNOWN_TOPIC_ID, "committed_offset": -1}
                                 for p in t["partitions"]]} if t["name"] in unknown else t for t in topics]


@api(OFFSET_DELETE, 0, 0)
async def handle_offset_delete(broker, ctx: RequestContext, request) -> dict:
    if not allowed(broker, ctx, DELETE, GROUP, request.group_id):
        return {"error_code": ErrorCode.GROUP_AUTHORIZATION_FAILED, "throttle_time_ms": 0, "topics": []}
    errors: dict[tuple[str, int], ErrorCode] = {}
    known = []
    for topic in request.topics:
        for p in topic.partitions:
            tp = (topic.name, p.partition_index)
            if not allowed(broker, ctx, READ, TOPIC, topic.name):
                errors[tp] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif _partition_exists(broker, *tp):
                known.append(tp)
            else:
                errors[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    group_error, results = broker.group_coordinator.delete_offsets(request.group_id, known)
    if group_error != ErrorCode.NONE:
        return {"error_code": group_error, "throttle_time_ms": 0, "topics": []}
    errors.update(results)
    ordered = {(t.name, p.partition_index): {"partition_index": p.partition_index,
                                             "error_code": errors[(t.name, p.partition_index)]}
               for t in request.topics for p in t.partitions}
    return {"error_code": ErrorCode.NONE, "throttle_time_ms": 0, "topics": by_topic(ordered)}
