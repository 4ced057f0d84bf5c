"""Metadata, DescribeCluster and DescribeTopicPartitions: who the brokers are and where
partition leaders live."""

from __future__ import annotations

import asyncio
import logging

from strom.controller.admin import validate_topic_name
from strom.controller.znodes import TopicMetadata
from strom.protocol.errors import ErrorCode, KafkaError
from strom.security.authorizer import (
    CLUSTER,
    CREATE,
    DESCRIBE,
    NOT_REQUESTED,
    TOPIC,
    allowed,
    as_int32,
    authorized_operations,
)
from strom.server.apis import RequestContext, api

log = logging.getLogger(__name__)

METADATA, DESCRIBE_CLUSTER, DESCRIBE_TOPIC_PARTITIONS = 3, 60, 75
_YIELD_EVERY = 5000


def _topic_entry(topic: TopicMetadata, live) -> dict:
    return {
        "error_code": ErrorCode.NONE,
        "name": topic.name,
        "topic_id": topic.topic_id,
        "is_internal": topic.internal,
        "partitions": [
            {
                "error_code": ErrorCode.NONE if state.leader >= 0 else ErrorCode.LEADER_NOT_AVAILABLE,
                "partition_index": index,
                "leader_id": state.leader,
                "leader_epoch": state.leader_epoch,
                "replica_nodes": state.replicas,
                "isr_nodes": state.isr,
                "offline_replicas": [r for r in state.replicas if r not in live],
            }
            for index, state in sorted(topic.partitions.items())
        ],
    }


def _error_entry(name: str | None, code: ErrorCode) -> dict:
    return {"error_code": code, "name": name, "is_internal": False, "partitions": []}


def _requested_names(broker, version: int, request) -> list[str | None] | None:
    """None means every topic; v0 says so with an empty list, later versions with null."""
    if request.topics is None or (version == 0 and not request.topics):
        return None
    by_id = broker.metadata_cache.names_by_id
    names = []
    for t in request.topics:
        if t.name is None and getattr(t, "topic_id", None) is not None:
            names.append(by_id.get(t.topic_id))
        else:
            names.append(t.name)
    return names


@api(METADATA, 0, 13)
async def handle_metadata(broker, ctx: RequestContext, request) -> dict:
    version = ctx.header.api_version
    topics = broker.metadata_cache.topics
    live = broker.metadata_cache.live_brokers
    names = _requested_names(broker, version, request)
    allow_create = (version < 4 or request.allow_auto_topic_creation) and broker.config[
        "auto.create.topics.enable"
    ]
    entries = []
    for i, name in enumerate(sorted(topics) if names is None else names):
        if i and not i % _YIELD_EVERY:
            await asyncio.sleep(0)  # a request naming a million topics shares the loop
        if name is not None and not allowed(broker, ctx, DESCRIBE, TOPIC, name):
            # Kafka leaves topics a client may not describe out of a full listing.
            if names is not None:
                entries.append(_error_entry(name, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
            continue
        topic = topics.get(name) if name is not None else None
        if topic is None and name is not None and allow_create and not (
                allowed(broker, ctx, CREATE, CLUSTER) or allowed(broker, ctx, CREATE, TOPIC, name)):
            entries.append(_error_entry(name, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
            continue
        if topic is None and name is not None and allow_create:
            try:
                topic = await broker.auto_topics.auto_create(name)
            except KafkaError as e:
                log.info("auto-creation of topic %r refused: %s", name, e)
                entries.append(_error_entry(name, e.code))
                continue
            if topic is None:
                entries.append(_error_entry(name, ErrorCode.LEADER_NOT_AVAILABLE))
                continue
        if topic is None:
            code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if name is not None else ErrorCode.UNKNOWN_TOPIC_ID
            try:
                validate_topic_name(name) if name is not None else None
            except KafkaError as e:
                code = e.code
            entries.append(_error_entry(name, code))
            continue
        entry = _topic_entry(topic, live)
        if getattr(request, "include_topic_authorized_operations", False):
            entry["authorized_operations"] = authorized_operations(broker, ctx, TOPIC, topic.name)
        entries.append(entry)
    return {
        "throttle_time_ms": 0,
        "error_code": ErrorCode.NONE,  # v13: a request-level error (none Strom gives)
        "brokers": broker.endpoints(ctx.listener),
        "cluster_id": broker.cluster_id,
        "controller_id": broker.controller_id,
        "topics": entries,
        "authorized_operations": _cluster_operations(broker, ctx, request),
    }


def _cluster_operations(broker, ctx: RequestContext, request) -> set[int] | None:
    if getattr(request, "include_cluster_authorized_operations", False):
        return authorized_operations(broker, ctx, CLUSTER)
    return NOT_REQUESTED


@api(DESCRIBE_CLUSTER, 0, 2)
async def handle_describe_cluster(broker, ctx: RequestContext, request) -> dict:
    """The registered brokers. v2 (KIP-1073) adds include_fenced_brokers and is_fenced: Strom's
    cluster is ZooKeeper-mode, where a broker is either registered (alive) or absent and there is
    no fenced state, so every broker listed is unfenced and the flag changes nothing."""
    return {
        "throttle_time_ms": 0,
        "error_code": ErrorCode.NONE,
        "endpoint_type": 1,
        "cluster_id": broker.cluster_id,
        "controller_id": broker.controller_id,
        "brokers": [
            {"broker_id": b["node_id"], "host": b["host"], "port": b["port"], "rack": b["rack"], "is_fenced": False}
            for b in broker.endpoints(ctx.listener)
        ],
        "authorized_operations": _cluster_operations(broker, ctx, request),
    }


@api(DESCRIBE_TOPIC_PARTITIONS, 0, 0)
async def handle_describe_topic_partitions(broker, ctx: RequestContext, request) -> dict:
    """KIP-966: topics' partitions a page at a time. The named topics (all, when none are named)
    in name order from the cursor's, at most `response_partition_limit` partitions (and at most
    max.request.partition.size.limit), with a next cursor where the page ended. Topics the
    client may not describe are refused when named and left out of a full listing."""
    topics = broker.metadata_cache.topics
    live = broker.metadata_cache.live_brokers
    everything = not request.topics
    names = sorted(topics) if everything else sorted({t.name for t in request.topics})
    cursor = request.cursor
    if cursor is not None:
        if cursor.topic_name not in names:  # as Kafka: every requested topic gets the error
            return {"throttle_time_ms": 0, "next_cursor": None, "topics": [
                {**_error_entry(name, ErrorCode.INVALID_REQUEST), "topic_id": None} for name in names]}
        names = [n for n in names if n >= cursor.topic_name]
    limit = max(1, min(request.response_partition_limit, broker.config["max.request.partition.size.limit"]))
    entries, next_cursor = [], None
    for name in names:
        if not allowed(broker, ctx, DESCRIBE, TOPIC, name):
            if not everything:
                entries.append({**_error_entry(name, ErrorCode.TOPIC_AUTHORIZATION_FAILED), "topic_id": None})
            continue
        topic = topics.get(name)
        if topic is None:
            entries.append({**_error_entry(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), "topic_id": None})
            continue
        if limit == 0:  # the page is full and another topic is waiting
            next_cursor = {"topic_name": name, "partition_index": 0}
            break
        entry = _topic_entry(topic, live)
        first = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
        partitions = [p for p in entry["partitions"] if p["partition_index"] >= first]
        if len(partitions) > limit:
            next_cursor = {"topic_name": name, "partition_index": partitions[limit]["partition_index"]}
            partitions = partitions[:limit]
        limit -= len(partitions)
        for p in partitions:
            p.update(eligible_leader_replicas=None, last_known_elr=None)
        entry.update(partitions=partitions,
                     topic_authorized_operations=as_int32(authorized_operations(broker, ctx, TOPIC, name)))
        entries.append(entry)
        if next_cursor is not None:
            break
    return {"throttle_time_ms": 0, "topics": entries, "next_cursor": next_cursor}
