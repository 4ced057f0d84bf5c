"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics, dynamic broker
configs, broker loggers and client metrics subscriptions.

Topic overrides live at /config/topics/<name>, dynamic broker configs at /config/brokers/<id>
and /config/brokers/<default> (the cluster default, resource name ""), as in Kafka's ZooKeeper
mode. Every change is validated completely before it is stored (INVALID_CONFIG with the
reason otherwise) and then applied to the live logs at once. Logger levels (BROKER_LOGGER,
`kafka-configs --entity-type broker-loggers`) change this broker's logging at once and, as in
Kafka, are not stored. CLIENT_METRICS resources (KIP-714's telemetry subscriptions) are at
/config/client-metrics/<name>; `strom.metrics.client_telemetry` validates and applies them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable

from strom.config import log_levels
from strom.config.broker import DEFINITIONS
from strom.config.describe import LIST_CONFIGS, describe_broker, describe_topic
from strom.config.dynamic import DEFAULT_ENTITY
from strom.log.config import TOPIC_CONFIG_KEYS, check_remote_storage_change
from strom.metrics import client_telemetry
from strom.protocol.errors import ErrorCode, KafkaError
from strom.security import authorizer as acl
from strom.server import group_configs
from strom.server.apis import RequestContext, api

DESCRIBE_CONFIGS, ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 33, 44
TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS = 2, 4, 8, 16  # ConfigResource types
DYNAMIC_BROKER_LOGGER_CONFIG = 6  # config source
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3  # IncrementalAlterConfigs operations


def _broker_entity(broker, name: str) -> bool:
    """True for the cluster default (""), False for this broker; anything else is refused."""
    if name == "":
        return True
    if name != str(broker.broker_id):
        raise KafkaError(f"Unexpected broker id, expected {broker.broker_id} or empty string, "
                         f"but received {name}", ErrorCode.INVALID_REQUEST)
    return False


def _logger_entity(broker, name: str) -> None:
    if name != str(broker.broker_id):
        raise KafkaError(f"Unexpected broker id, expected {broker.broker_id}, but received {name}",
                         ErrorCode.INVALID_REQUEST)


def _describe_loggers(keys) -> list[dict]:
    levels = log_levels.current_levels()
    names = levels if keys is None else [k for k in keys if k in levels]
    return [{"name": name, "value": levels[name], "read_only": False,
             "config_source": DYNAMIC_BROKER_LOGGER_CONFIG, "is_sensitive": False, "synonyms": [],
             "config_type": 2, "documentation": None} for name in names]  # 2: STRING


def _alter_loggers(broker, name: str, configs, validate_only: bool) -> None:
    """SET gives a logger a level, DELETE makes it inherit its parent's again."""
    _logger_entity(broker, name)
    changes = []
    for c in configs:
        if c.config_operation not in (SET, DELETE):
            raise KafkaError(f"{('APPEND', 'SUBTRACT')[c.config_operation == SUBTRACT]} operation is "
                             "not allowed for the BROKER_LOGGER resource", ErrorCode.INVALID_REQUEST)
        level = c.value if c.config_operation == SET else None
        try:
            if level is not None:
                log_levels.level_of(level)
        except log_levels.LevelError as e:
            raise KafkaError(str(e), ErrorCode.INVALID_CONFIG) from None
        changes.append((c.name, level))
    if validate_only:
        return
    for logger, level in changes:
        try:
            log_levels.set_level(logger, level)
        except log_levels.LevelError as e:
            raise KafkaError(str(e), ErrorCode.INVALID_CONFIG) from None


def authorize_config_resource(broker, ctx: RequestContext, operation: int, resource_type: int, name: str) -> None:
    """DESCRIBE_CONFIGS / ALTER_CONFIGS on the topic, or on the cluster for broker (and broker
    logger) resources, as Kafka checks them."""
    if resource_type == TOPIC:
        if not acl.allowed(broker, ctx, operation, acl.TOPIC, name):
            raise KafkaError("Topic authorization failed.", ErrorCode.TOPIC_AUTHORIZATION_FAILED)
    elif resource_type == group_configs.GROUP_RESOURCE:
        if not acl.allowed(broker, ctx, operation, acl.GROUP, name):
            raise KafkaError("Group authorization failed.", ErrorCode.GROUP_AUTHORIZATION_FAILED)
    elif not acl.allowed(broker, ctx, operation, acl.CLUSTER):
        raise KafkaError("Cluster authorization failed.", ErrorCode.CLUSTER_AUTHORIZATION_FAILED)


def _topic_configs(broker, name: str) -> dict[str, str]:
    if name not in broker.metadata_cache.topics:
        raise KafkaError(f"Topic {name} does not exist.", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    return dict(broker.topic_configs(name))


@api(DESCRIBE_CONFIGS, 1, 4)
async def handle_describe_configs(broker, ctx: RequestContext, request) -> dict:
    version = ctx.header.api_version
    include_synonyms = bool(request.include_synonyms)
    include_docs = version >= 3 and bool(request.include_documentation)
    layers = broker.dynamic_config.layers()
    results = []
    for resource in request.resources:
        result = {"error_code": ErrorCode.NONE, "error_message": None,
                  "resource_type": resource.resource_type, "resource_name": resource.resource_name,
                  "configs": []}
        keys = resource.configuration_keys
        try:
            authorize_config_resource(broker, ctx, acl.DESCRIBE_CONFIGS, resource.resource_type, resource.resource_name)
            if resource.resource_type == TOPIC:
                result["configs"] = describe_topic(
                    broker.default_log_config, _topic_configs(broker, resource.resource_name), layers, keys,
                    include_synonyms=include_synonyms, include_docs=include_docs)
            elif resource.resource_type == BROKER:
                is_default = _broker_entity(broker, resource.resource_name)
                result["configs"] = describe_broker(
                    broker.config.values, layers, keys, per_broker=not is_default,
                    include_synonyms=include_synonyms, include_docs=include_docs)
            elif resource.resource_type == BROKER_LOGGER:
                _logger_entity(broker, resource.resource_name)
                result["configs"] = _describe_loggers(keys)
            elif resource.resource_type == CLIENT_METRICS:
                result["configs"] = await client_telemetry.describe_subscription(
                    broker, resource.resource_name, keys, include_docs)
            elif resource.resource_type == group_configs.GROUP_RESOURCE:
                result["configs"] = group_configs.describe(broker, resource.resource_name, keys, include_docs)
            else:
                raise KafkaError(f"unsupported resource type {resource.resource_type}",
                                 ErrorCode.INVALID_REQUEST)
        except KafkaError as e:
            result["error_code"], result["error_message"] = e.code, str(e)
        results.append(result)
    return {"throttle_time_ms": 0, "results": results}


async def _alter(broker, resource_type: int, name: str,
                 new_configs: Callable[[dict[str, str]], dict[str, str]], validate_only: bool) -> None:
    """Apply `new_configs(current)` as the full override set of one resource: stored, announced
    to every broker through /config/changes, and applied here at once."""
    if resource_type == TOPIC:
        current = _topic_configs(broker, name)
        configs = new_configs(dict(current))  # a copy: an incremental change edits what it is given
        try:
            check_remote_storage_change(current, configs)
        except ValueError as e:
            raise KafkaError(str(e), ErrorCode.INVALID_CONFIG) from None
        await broker.store_io(broker.admin.change_topic_config, name, configs, validate_only=validate_only)
        if not validate_only:
            broker.config_repository.topics[name] = configs
            broker.log_services.topic_config_changed(name)
    elif resource_type == BROKER:
        is_default = _broker_entity(broker, name)
        dynamic = broker.dynamic_config
        configs = new_configs(dict(dynamic.entity(is_default)))
        if validate_only:
            dynamic.validate(is_default, configs)
            return
        effective = dynamic.validate(is_default, configs)
        entity = DEFAULT_ENTITY if is_default else str(broker.broker_id)
        await broker.store_io(broker.admin.change_broker_config, entity, configs)
        broker.config_repository.brokers[entity] = dict(configs)
        dynamic.update(is_default, configs)
        broker.log_services.apply_broker_config(effective)
    elif resource_type == CLIENT_METRICS:
        await client_telemetry.alter_subscription(broker, name, new_configs, validate_only)
    elif resource_type == group_configs.GROUP_RESOURCE:
        await group_configs.alter(broker, name, new_configs, validate_only)
    else:
        raise KafkaError(f"unsupported resource type {resource_type}", ErrorCode.INVALID_REQUEST)


def _check_names(configs) -> None:
    counts = Counter(c.name for c in configs)
    duplicates = sorted(n for n, k in counts.items() if k > 1)
    if duplicates:
        raise KafkaError(f"Error due to duplicate config keys: {', '.join(duplicates)}",
                         ErrorCode.INVALID_REQUEST)


async def _responses(broker, ctx: RequestContext, request, alter_one: Callable[[object], Awaitable[None]]) -> dict:
    responses = []
    for resource in request.resources:
        entry = {"error_code": ErrorCode.NONE, "error_message": None,
                 "resource_type": resource.resource_type, "resource_name": resource.resource_name}
        try:
            authorize_config_resource(broker, ctx, acl.ALTER_CONFIGS, resource.resource_type, resource.resource_name)
            _check_names(resource.configs)
            await alter_one(resource)
        except KafkaError as e:
            entry["error_code"], entry["error_message"] = e.code, str(e)
        responses.append(entry)
    return {"throttle_time_ms": 0, "responses": responses}


@api(ALTER_CONFIGS, 0, 2)
async def handle_alter_configs(broker, ctx: RequestContext, request) -> dict:
    """The legacy AlterConfigs: the given configs replace every override of the resource."""

    async def alter_one(resource) -> None:
        configs = {}
        for c in resource.configs:
            if c.value is None:
                raise KafkaError(f"Null value not supported for : {c.name}", ErrorCode.INVALID_REQUEST)
            configs[c.name] = c.value
        await _alter(broker, resource.resource_type, resource.resource_name, lambda _current: configs,
                     request.validate_only)

    return await _responses(broker, ctx, request, alter_one)


def _list_value(broker, resource_type: int, name: str, current: dict[str, str]) -> list[str]:
    """The current value of list config `name`: the override, else the default it inherits."""
    if name in current:
        raw = current[name]
    elif resource_type == CLIENT_METRICS:
        raw = ""
    elif resource_type == TOPIC:
        raw = broker.default_log_config.to_topic_configs()[name]
    else:
        raw = broker.config.props.get(name, DEFINITIONS[name][1] or "")
    return [v.strip() for v in str(raw).split(",") if v.strip()]


@api(INCREMENTAL_ALTER_CONFIGS, 0, 1)
async def handle_incremental_alter_configs(broker, ctx: RequestContext, request) -> dict:
    async def alter_one(resource) -> None:
        if resource.resource_type == BROKER_LOGGER:
            _alter_loggers(broker, resource.resource_name, resource.configs, request.validate_only)
            return
        known = TOPIC_CONFIG_KEYS if resource.resource_type == TOPIC else DEFINITIONS
        lists = LIST_CONFIGS
        if resource.resource_type == CLIENT_METRICS:
            known = lists = client_telemetry.LIST_KEYS

        def new_configs(current: dict[str, str]) -> dict[str, str]:
            for c in resource.configs:
                op = c.config_operation
                if op == SET:
                    if c.value is None:
                        raise KafkaError(f"Null value not supported for : {c.name}",
                                         ErrorCode.INVALID_REQUEST)
                    current[c.name] = c.value
                elif op == DELETE:
                    current.pop(c.name, None)
                elif op in (APPEND, SUBTRACT):
                    if c.name not in lists or c.name not in known:
                        verb = "append" if op == APPEND else "subtract"
                        raise KafkaError(f"Config value {verb} is not allowed for config key: {c.name}",
                                         ErrorCode.INVALID_CONFIG)
                    values = _list_value(broker, resource.resource_type, c.name, current)
                    given = [v.strip() for v in (c.value or "").split(",") if v.strip()]
                    if op == APPEND:
                        values += [v for v in given if v not in values]
                    else:
                        values = [v for v in values if v not in given]
                    current[c.name] = ",".join(values)
                else:
                    raise KafkaError(f"unknown config operation {op}", ErrorCode.INVALID_REQUEST)
            return current

        await _alter(broker, resource.resource_type, resource.resource_name, new_configs,
                     request.validate_only)

    return await _responses(broker, ctx, request, alter_one)
