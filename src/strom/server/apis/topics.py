"""CreateTopics, DeleteTopics, CreatePartitions: admin requests carried out by the controller."""

from __future__ import annotations

import logging
from collections import Counter

from strom.protocol.errors import ErrorCode, KafkaError
from strom.server.apis import RequestContext, api
from strom.server.topic_configs import created_topic_configs

log = logging.getLogger(__name__)

CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS = 19, 20, 37


def _failure(e: KafkaError) -> tuple[ErrorCode, str]:
    return e.code, str(e) or e.code.name


@api(CREATE_TOPICS, 2, 7)
async def handle_create_topics(broker, ctx: RequestContext, request) -> dict:
    counts = Counter(t.name for t in request.topics)
    results = []
    for t in request.topics:
        result = {"name": t.name, "error_code": ErrorCode.NONE, "error_message": None}
        try:
            if counts[t.name] > 1:
                raise KafkaError(f"Create topics request from client `{ctx.header.client_id}` contains "
                                 f"multiple entries for the following topics: {t.name}",
                                 ErrorCode.INVALID_REQUEST)
            configs = {c.name: c.value for c in t.configs}
            assignment = {a.partition_index: list(a.broker_ids) for a in t.assignments}
            topic = broker.controller.create_topic(
                t.name, t.num_partitions, t.replication_factor, assignment, configs,
                validate_only=request.validate_only,
                default_partitions=broker.config["num.partitions"],
                default_replication_factor=broker.config["default.replication.factor"],
            )
            if ctx.header.api_version >= 5:  # the created topic's details arrive in v5
                result.update(
                    topic_id=topic.topic_id,
                    num_partitions=len(topic.partitions),
                    replication_factor=len(topic.partitions[0].replicas),
                    configs=created_topic_configs(broker.default_log_config, topic.configs,
                                                  broker.dynamic_config.layers()),
                )
            if not request.validate_only:
                log.info("created topic %s with %d partitions", t.name, len(topic.partitions))
        except KafkaError as e:
            result["error_code"], result["error_message"] = _failure(e)
        results.append(result)
    return {"throttle_time_ms": 0, "topics": results}


@api(DELETE_TOPICS, 1, 6)
async def handle_delete_topics(broker, ctx: RequestContext, request) -> dict:
    if ctx.header.api_version >= 6:
        by_id = {t.topic_id: name for name, t in broker.controller.topics.items()}
        wanted = [(t.name or by_id.get(t.topic_id), t.topic_id) for t in request.topics]
    else:
        wanted = [(name, None) for name in request.topic_names]
    responses = []
    for name, topic_id in wanted:
        entry = {"name": name, "topic_id": topic_id, "error_code": ErrorCode.NONE, "error_message": None}
        try:
            if name is None:
                raise KafkaError("unknown topic id", ErrorCode.UNKNOWN_TOPIC_ID)
            if not broker.config["delete.topic.enable"]:
                raise KafkaError("topic deletion is disabled", ErrorCode.TOPIC_DELETION_DISABLED)
            topic = broker.controller.delete_topic(name)
            entry["topic_id"] = topic.topic_id
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
            assignment = None if t.assignments is None else [list(a.broker_ids) for a in t.assignments]
            broker.controller.create_partitions(t.name, t.count, assignment, validate_only=request.validate_only)
        except KafkaError as e:
            entry["error_code"], entry["error_message"] = _failure(e)
        results.append(entry)
    return {"throttle_time_ms": 0, "results": results}
