"""Metadata, DescribeCluster and DescribeTopicPartitions: who the brokers are and where
partition leaders live."""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections.abc import Iterator

from strom.controller.admin import validate_topic_name
from strom.controller.znodes import TopicMetadata, partition_state_path
from strom.network.request import RawResponse
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.messages import StreamedResponse
from strom.protocol.metadata import NOT_REQUESTED as NOT_REQUESTED_INT32
from strom.protocol.metadata import (
    DescribeTopicPartitionsRequest,
    MetadataRequest,
    MetadataResponseWriter,
    PartitionEntry,
    undescribed_topic_entry,
)
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


def _leader(leader: int, live) -> tuple[ErrorCode, int]:
    """(error, leader id) as Kafka answers them: a leader that is not a live broker (dead, its
    partition not re-elected yet or with no live replica to elect) is LEADER_NOT_AVAILABLE
    with no leader id, so that clients do not go looking for it."""
    if leader >= 0 and leader in live:
        return ErrorCode.NONE, leader
    return ErrorCode.LEADER_NOT_AVAILABLE, -1


def _topic_entry(topic: TopicMetadata, live) -> dict:
    return {
        "error_code": ErrorCode.NONE,
        "name": topic.name,
        "topic_id": topic.topic_id,
        "is_internal": topic.internal,
        "partitions": [
            {
                "error_code": error,
                "partition_index": index,
                "leader_id": leader,
                "leader_epoch": state.leader_epoch,
                "replica_nodes": state.replicas,
                "isr_nodes": state.isr,
                "offline_replicas": [r for r in state.replicas if r not in live],
            }
            for index, state in sorted(topic.partitions.items())
            for error, leader in [_leader(state.leader, live)]
        ],
    }


def _partitions(topic: TopicMetadata, live) -> Iterator[PartitionEntry]:
    for index, state in sorted(topic.partitions.items()):
        error, leader = _leader(state.leader, live)
        yield PartitionEntry(error, index, leader, state.leader_epoch, state.replicas, state.isr,
                             [r for r in state.replicas if r not in live])


@api(METADATA, 0, 13)
async def handle_metadata(broker, ctx: RequestContext, request: MetadataRequest) -> RawResponse:
    """Written entry by entry (protocol/metadata.py): what it holds is the response's bytes,
    whatever the request names (a million unknown topics included)."""
    version = ctx.header.api_version
    topics = broker.metadata_cache.topics
    live = broker.metadata_cache.live_brokers
    allow_create = (version < 4 or request.allow_auto_topic_creation) and broker.config[
        "auto.create.topics.enable"
    ]
    out = MetadataResponseWriter(version)
    wanted = ((None, name) for name in sorted(topics)) if request.all_topics else request.topics()
    for i, (topic_id, name) in enumerate(wanted):
        if i and not i % _YIELD_EVERY:
            await asyncio.sleep(0)  # a request naming a million topics shares the loop
        if name is None and topic_id is not None:
            name = broker.metadata_cache.names_by_id.get(topic_id)
        if name is not None and not allowed(broker, ctx, DESCRIBE, TOPIC, name):
            # Kafka leaves topics a client may not describe out of a full listing.
            if not request.all_topics:
                out.error(ErrorCode.TOPIC_AUTHORIZATION_FAILED, name)
            continue
        topic = topics.get(name) if name is not None else None
        if topic is None and name is not None and allow_create and not (
                allowed(broker, ctx, CREATE, CLUSTER) or allowed(broker, ctx, CREATE, TOPIC, name)):
            out.error(ErrorCode.TOPIC_AUTHORIZATION_FAILED, name)
            continue
        if topic is None and name is not None and allow_create:
            try:
                topic = await broker.auto_topics.auto_create(name)
            except KafkaError as e:
                log.info("auto-creation of topic %r refused: %s", name, e)
                out.error(e.code, name)
                continue
            if topic is None:
                out.error(ErrorCode.LEADER_NOT_AVAILABLE, name)
                continue
        if topic is None:
            code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if name is not None else ErrorCode.UNKNOWN_TOPIC_ID
            try:
                validate_topic_name(name) if name is not None else None
            except KafkaError as e:
                code = e.code
            out.error(code, name)
            continue
        operations = (as_int32(authorized_operations(broker, ctx, TOPIC, topic.name))
                      if request.include_topic_authorized_operations else NOT_REQUESTED_INT32)
        out.topic(ErrorCode.NONE, topic.name, topic.topic_id, topic.internal, _partitions(topic, live),
                  operations, len(topic.partitions))
    brokers = [(b["node_id"], b["host"], b["port"], b["rack"]) for b in broker.endpoints(ctx.listener)]
    cluster_operations = as_int32(_cluster_operations(broker, ctx, request))
    return RawResponse(out.parts(brokers, broker.cluster_id, broker.controller_id, cluster_operations),
                       throttle_at=0 if version >= 3 else None)


def _cluster_operations(broker, ctx: RequestContext, request) -> set[int] | None:
    if getattr(request, "include_cluster_authorized_operations", False):
        return authorized_operations(broker, ctx, CLUSTER)
    return NOT_REQUESTED


BROKER_ENDPOINT, CONTROLLER_ENDPOINT = 1, 2  # DescribeCluster's endpoint types (KIP-919)


def endpoint_type_error(request, version: int, expected: int) -> dict | None:
    """DescribeCluster asked of the wrong kind of listener (a broker's answers endpoint type 1,
    a controller's type 2): the error answer, as Kafka gives it; None when it is the right one."""
    asked = getattr(request, "endpoint_type", BROKER_ENDPOINT)  # v0 has no field: a broker's
    names = {BROKER_ENDPOINT: "BROKER", CONTROLLER_ENDPOINT: "CONTROLLER"}
    if asked not in names:
        code, message = ErrorCode.UNSUPPORTED_ENDPOINT_TYPE, f"Unsupported endpoint type {asked}"
    elif asked != expected:
        code, message = ErrorCode.MISMATCHED_ENDPOINT_TYPE, (
            f"The request was sent to an endpoint of type {names[expected]}, but we wanted an endpoint of type "
            f"{names[asked]}")
    else:
        return None
    return {"throttle_time_ms": 0, "error_code": ErrorCode.INVALID_REQUEST if version == 0 else code,
            "error_message": message, "endpoint_type": expected, "cluster_id": "", "controller_id": -1,
            "brokers": [], "authorized_operations": NOT_REQUESTED}


@api(DESCRIBE_CLUSTER, 0, 2)
async def handle_describe_cluster(broker, ctx: RequestContext, request) -> dict:
    """The live brokers, and the controller as this broker names it (ZooKeeper: the controller;
    KRaft: a live broker, which forwards what a client sends it). v2 (KIP-1073): with
    include_fenced_brokers, the brokers the controller has fenced too, marked is_fenced."""
    wrong = endpoint_type_error(request, ctx.header.api_version, BROKER_ENDPOINT)
    if wrong is not None:
        return wrong
    listed = [(b, False) for b in broker.endpoints(ctx.listener)]
    if ctx.header.api_version >= 2 and request.include_fenced_brokers:
        live = {b["node_id"] for b, _ in listed}
        listed += [(b, True) for b in broker.fenced_endpoints(ctx.listener) if b["node_id"] not in live]
    brokers = [{"broker_id": b["node_id"], "host": b["host"], "port": b["port"], "rack": b["rack"], "is_fenced": fenced}
               for b, fenced in sorted(listed, key=lambda entry: entry[0]["node_id"])]
    controller_id = broker.controller_id
    return {
        "throttle_time_ms": 0,
        "error_code": ErrorCode.NONE,
        "endpoint_type": BROKER_ENDPOINT,
        "cluster_id": broker.cluster_id,
        # Kafka names no controller it does not list (a client would look for it in vain).
        "controller_id": controller_id if any(b["broker_id"] == controller_id for b in brokers) else -1,
        "brokers": brokers,
        "authorized_operations": _cluster_operations(broker, ctx, request),
    }


@api(DESCRIBE_TOPIC_PARTITIONS, 0, 0)
async def handle_describe_topic_partitions(broker, ctx: RequestContext,
                                           request: DescribeTopicPartitionsRequest) -> RawResponse:
    """KIP-966: topics' partitions a page at a time. The named topics (all, when none are named)
    in name order from the cursor's, at most `response_partition_limit` partitions (and at most
    max.request.partition.size.limit), with a next cursor where the page ended. Topics the
    client may not describe are refused when named and left out of a full listing. Entries are
    encoded as they are made (StreamedResponse): a million names cost their bytes."""
    topics = broker.metadata_cache.topics
    live = broker.metadata_cache.live_brokers
    everything = request.topic_count == 0
    names = sorted(topics) if everything else sorted(request.names())  # duplicates are adjacent
    out = StreamedResponse(DESCRIBE_TOPIC_PARTITIONS, 0, "topics")
    cursor = request.cursor
    if cursor is not None:
        position = bisect.bisect_left(names, cursor[0])
        if position == len(names) or names[position] != cursor[0]:
            # As Kafka: every requested topic gets the error.
            for i, name in enumerate(names):
                if not i or name != names[i - 1]:
                    out.add_encoded(undescribed_topic_entry(ErrorCode.INVALID_REQUEST, name))
            return _streamed(out, None)
        del names[:position]
    limit = max(1, min(request.response_partition_limit, broker.config["max.request.partition.size.limit"]))
    next_cursor = None
    for i, name in enumerate(names):
        if i and name == names[i - 1]:
            continue
        if i and not i % _YIELD_EVERY:
            await asyncio.sleep(0)
        if not allowed(broker, ctx, DESCRIBE, TOPIC, name):
            if not everything:
                out.add_encoded(undescribed_topic_entry(ErrorCode.TOPIC_AUTHORIZATION_FAILED, name))
            continue
        topic = topics.get(name)
        if topic is None:
            out.add_encoded(undescribed_topic_entry(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name))
            continue
        if limit == 0:  # the page is full and another topic is waiting
            next_cursor = {"topic_name": name, "partition_index": 0}
            break
        entry = _topic_entry(topic, live)
        first = cursor[1] if cursor is not None and name == cursor[0] else 0
        partitions = [p for p in entry["partitions"] if p["partition_index"] >= first]
        if len(partitions) > limit:
            next_cursor = {"topic_name": name, "partition_index": partitions[limit]["partition_index"]}
            partitions = partitions[:limit]
        limit -= len(partitions)
        eligible = await _eligible_replicas(broker, name, [p["partition_index"] for p in partitions])
        for p in partitions:
            elr, last_known = eligible.get(p["partition_index"], ([], []))
            p.update(eligible_leader_replicas=elr, last_known_elr=last_known)
        entry.update(partitions=partitions,
                     topic_authorized_operations=as_int32(authorized_operations(broker, ctx, TOPIC, name)))
        out.add(entry)
        if next_cursor is not None:
            break
    return _streamed(out, next_cursor)


async def _eligible_replicas(broker, name: str, indexes: list[int]) -> dict[int, tuple[list[int], list[int]]]:
    """KIP-966's ELR and last-known ELR of a page of partitions. A KRaft broker has them in its
    metadata image; UpdateMetadata does not carry them, so a ZooKeeper broker reads the
    partitions' state nodes (one pipelined read per page)."""
    loader = getattr(broker, "metadata_loader", None)
    if loader is not None:
        topic = loader.image.topics.get(name)
        states = topic.partitions if topic is not None else {}
        return {i: (list(states[i].elr), list(states[i].last_known_elr)) for i in indexes if i in states}
    if getattr(broker, "store", None) is None or not indexes:
        return {}
    try:
        nodes = await broker.store_io(broker.store.get_many, [partition_state_path(name, i) for i in indexes])
    except Exception as e:  # the store unreachable: the rest of the answer still stands
        log.info("ELRs of %s not read: %s", name, e)
        return {}
    out = {}
    for index, node in zip(indexes, nodes, strict=True):
        data = node[0] if node is not None and isinstance(node[0], dict) else {}
        out[index] = (list(data.get("eligible_leader_replicas") or []), list(data.get("last_known_elr") or []))
    return out


def _streamed(out: StreamedResponse, next_cursor: dict | None) -> RawResponse:
    return RawResponse(out.parts({"throttle_time_ms": 0, "next_cursor": next_cursor}))
