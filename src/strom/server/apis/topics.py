"""CreateTopics, DeleteTopics, CreatePartitions: admin requests carried out by the controller."""

from __future__ import annotations

import logging
from collections import Counter

from strom.config.describe import created_topic_configs
from strom.controller.znodes import is_internal
from strom.protocol.errors import ErrorCode, KafkaError
from strom.security.authorizer import ALTER, CLUSTER, CREATE, DELETE, TOPIC, allowed
from strom.server.apis import RequestContext, api

log = logging.getLogger(__name__)

CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS = 19, 20, 37


def _failure(e: KafkaError) -> tuple[ErrorCode, str]:
    return e.code, str(e) or e.code.name


def _timeout_s(request) -> float:
    return max(getattr(request, "timeout_ms", 30000), 0) / 1000


@api(CREATE_TOPICS, 2, 7)
async def handle_create_topics(broker, ctx: RequestContext, request) -> dict:
    counts = Counter(t.name for t in request.topics)
    results = []
    for t in request.topics:
        result = {"name": t.name, "error_code": ErrorCode.NONE, "error_message": None}
        try:
            if not (allowed(broker, ctx, CREATE, CLUSTER) or allowed(broker, ctx, CREATE, TOPIC, t.name)):
                raise KafkaError("Authorization failed.", ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            broker.require_controller()
            if is_internal(t.name):
                # As Kafka: the broker makes them, compacted, with the configured partition
                # count; one made by a client could be neither.
                raise KafkaError(f"Creation of internal topic {t.name} is prohibited.", ErrorCode.INVALID_REQUEST)
            if counts[t.name] > 1:
                raise KafkaError(f"Create topics request from client `{ctx.header.client_id}` contains "
                                 f"multiple entries for the following topics: {t.name}",
                                 ErrorCode.INVALID_REQUEST)
            configs = {c.name: c.value for c in t.configs}
            assignment = {a.partition_index: list(a.broker_ids) for a in t.assignments}
            topic_id, replicas = await broker.store_io(
                broker.admin.create_topic, t.name, t.num_partitions, t.replication_factor, assignment,
                configs, validate_only=request.validate_only,
                default_partitions=broker.config["num.partitions"],
                default_replication_factor=broker.config["default.replication.factor"])
            if not request.validate_only:
                broker.config_repository.topics[t.name] = configs
                if await broker.auto_topics.wait_until_created(t.name, len(replicas), _timeout_s(request)) is None:
                    raise KafkaError(f"Topic {t.name} was created but not all its partitions have a "
                                     "leader yet", ErrorCode.REQUEST_TIMED_OUT)
                log.info("created topic %s with %d partitions", t.name, len(replicas))
            if ctx.header.api_version >= 5:  # the created topic's details arrive in v5
                result.update(
                    topic_id=topic_id,
                    num_partitions=len(replicas),
                    replication_factor=len(replicas[0]),
                    configs=created_topic_configs(broker.default_log_config, configs,
                                                  broker.dynamic_config.layers()),
                )
        except KafkaError as e:
            result["error_code"], result["error_message"] = _failure(e)
        results.append(result)
    return {"throttle_time_ms": 0, "topics": results}


@api(DELETE_TOPICS, 1, 6)
async def handle_delete_topics(broker, ctx: RequestContext, request) -> dict:
    topics = broker.metadata_cache.topics
    if ctx.header.api_version >= 6:
        by_id = {t.topic_id: name for name, t in topics.items()}
        wanted = [(t.name or by_id.get(t.topic_id), t.topic_id) for t in request.topics]
    else:
        wanted = [(name, None) for name in request.topic_names]
    responses = []
    for name, topic_id in wanted:
        entry = {"name": name, "topic_id": topic_id, "error_code": ErrorCode.NONE, "error_message": None}
        try:
            if name is not None and not allowed(broker, ctx, DELETE, TOPIC, name):
                raise KafkaError("Authorization failed.", ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            broker.require_controller()
            if name is None:
                raise KafkaError("unknown topic id", ErrorCode.UNKNOWN_TOPIC_ID)
            if name not in topics and not broker.forwards_admin:
                # As Kafka's brokers: a topic this broker's metadata no longer has (one whose
                # deletion is answered but not yet finished everywhere) is unknown.
                raise KafkaError("This server does not host this topic-partition.",
                                 ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            if not broker.config["delete.topic.enable"]:
                raise KafkaError("topic deletion is disabled", ErrorCode.TOPIC_DELETION_DISABLED)
            if name in topics:
                entry["topic_id"] = topics[name].topic_id
            await broker.store_io(broker.admin.delete_topic, name)
            if not await broker.auto_topics.wait_for_deletion(name, _timeout_s(request)):
                raise KafkaError(f"Topic {name} is being deleted", ErrorCode.REQUEST_TIMED_OUT)
            log.info("deleted topic %s", name)
        except KafkaError as e:
            entry["error_code"], entry["error_message"] = _failure(e)
        responses.append(entry)
    return {"throttle_time_ms": 0, "responses": responses}


@api(CREATE_PARTITIONS, 0, 3)
async def handle_create_partitions(broker, ctx: RequestContext, request) -> dict:
    results = []
    for t in request.topics:
        entry = {"name": t.name, "error_code": ErrorCode.NONE, "error_message": None}
        try:
            if not allowed(broker, ctx, ALTER, TOPIC, t.name):
                raise KafkaError("Authorization failed.", ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            broker.require_controller()
            assignment = None if t.assignments is None else [list(a.broker_ids) for a in t.assignments]
            await broker.store_io(broker.admin.create_partitions, t.name, t.count, assignment,
                                  validate_only=request.validate_only)
            if not request.validate_only and await broker.auto_topics.wait_for_topic(
                    t.name, t.count, _timeout_s(request)) is None:
                raise KafkaError(f"Not all new partitions of {t.name} have a leader yet",
                                 ErrorCode.REQUEST_TIMED_OUT)
        except KafkaError as e:
            entry["error_code"], entry["error_message"] = _failure(e)
        results.append(entry)
    return {"throttle_time_ms": 0, "results": results}
