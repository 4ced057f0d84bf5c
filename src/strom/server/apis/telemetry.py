"""GetTelemetrySubscriptions (71), PushTelemetry (72) and ListConfigResources (74, v0 was
ListClientMetricsResources): KIP-714's client metrics, as `strom.metrics.client_telemetry`
keeps them, and from v1 (KIP-1142) the names of every kind of config resource.

No ACL guards the first two (as in Kafka); listing the subscriptions takes DESCRIBE_CONFIGS on
the cluster. A client's software name and version, which subscriptions
may match on, are what it said in its connection's ApiVersions request: the ApiVersions
handler is wrapped to note them.
"""

from __future__ import annotations

import asyncio
import logging

from strom.metrics import client_telemetry
from strom.metrics.client_telemetry import (
    GET_TELEMETRY_SUBSCRIPTIONS,
    PUSH_TELEMETRY,
    TELEMETRY_TOO_LARGE,
    InvalidPayload,
    PayloadTooLarge,
)
from strom.protocol.errors import ErrorCode
from strom.security.authorizer import CLUSTER, DESCRIBE_CONFIGS, allowed
from strom.server.apis import HANDLERS, Api, RequestContext, api
from strom.server.apis.api_versions import API_VERSIONS

log = logging.getLogger("strom.metrics.client_telemetry")

LIST_CONFIG_RESOURCES = 74
TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP = 2, 4, 8, 16, 32  # ConfigResource types
# What v1 lists when asked for no type in particular, and the only types it may be asked for;
# v0 lists client metrics alone.
LISTED_TYPES = frozenset({TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP})


@api(GET_TELEMETRY_SUBSCRIPTIONS, 0, 0)
async def handle_get_telemetry_subscriptions(broker, ctx: RequestContext, request) -> dict:
    manager = client_telemetry.manager(broker)
    await manager.start(broker)
    return manager.get_subscriptions(request.client_instance_id, ctx.header.client_id, ctx.client)


@api(PUSH_TELEMETRY, 0, 0)
async def handle_push_telemetry(broker, ctx: RequestContext, request) -> dict:
    manager = client_telemetry.manager(broker)
    await manager.start(broker)
    error, inst = manager.check_push(request, ctx.header.client_id, ctx.client)
    payload = request.metrics or b""
    if error:
        log.debug("telemetry push from %s (client %s, instance %s): error %d", ctx.client,
                  ctx.header.client_id, request.client_instance_id, error)
        return {"throttle_time_ms": 0, "error_code": error}
    if payload:
        try:
            if len(payload) > client_telemetry.OFFLOAD_BYTES:
                points = await asyncio.to_thread(client_telemetry.read_payload, request.compression_type, payload)
            else:
                points = client_telemetry.read_payload(request.compression_type, payload)
        except (InvalidPayload, PayloadTooLarge) as e:
            code = TELEMETRY_TOO_LARGE if isinstance(e, PayloadTooLarge) else ErrorCode.INVALID_RECORD
            inst.last_error = code
            manager.push_errors[code] = manager.push_errors.get(code, 0) + 1
            log.debug("telemetry push from %s (client %s, instance %s): %d bytes refused: %s", ctx.client,
                      ctx.header.client_id, inst.instance_id, len(payload), e)
            return {"throttle_time_ms": 0, "error_code": code}
        manager.store_metrics(inst, points)
    else:
        points = []
        manager.store_metrics(inst, points)
    log.debug("telemetry push from %s (client %s, instance %s%s): %d bytes, %d data points", ctx.client,
              ctx.header.client_id, inst.instance_id, ", terminating" if request.terminating else "",
              len(payload), len(points))
    return {"throttle_time_ms": 0, "error_code": 0}


@api(LIST_CONFIG_RESOURCES, 0, 1)
async def handle_list_config_resources(broker, ctx: RequestContext, request) -> dict:
    """The config resources, as Kafka lists them: groups with configs, client metrics
    subscriptions (this broker's view, which follows /config/client-metrics), each live broker
    with an endpoint on this listener (as BROKER_LOGGER and as BROKER) and every topic. A type
    outside KIP-1142's five fails the whole request with UNSUPPORTED_VERSION."""
    def answer(error: ErrorCode, resources: list[dict]) -> dict:
        return {"throttle_time_ms": 0, "error_code": error, "config_resources": resources}

    if not allowed(broker, ctx, DESCRIBE_CONFIGS, CLUSTER):
        return answer(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, [])
    wanted = set(getattr(request, "resource_types", None) or ()) if ctx.header.api_version >= 1 else {CLIENT_METRICS}
    if not wanted <= LISTED_TYPES:
        return answer(ErrorCode.UNSUPPORTED_VERSION, [])
    wanted = wanted or LISTED_TYPES
    resources: list[dict] = []

    def add(resource_type: int, names) -> None:
        resources.extend({"resource_name": name, "resource_type": resource_type} for name in names)

    if GROUP in wanted:
        add(GROUP, sorted(group for group, configs in broker.group_configs.items() if configs))
    if CLIENT_METRICS in wanted:
        manager = client_telemetry.manager(broker)
        await manager.start(broker)
        add(CLIENT_METRICS, sorted(manager.subscriptions))
    brokers = [str(b["node_id"]) for b in broker.metadata_cache.brokers(ctx.listener)]
    if BROKER_LOGGER in wanted:
        add(BROKER_LOGGER, brokers)
    if BROKER in wanted:
        add(BROKER, brokers)
    if TOPIC in wanted:  # every topic: sorted and laid out off the loop
        topics = list(broker.metadata_cache.topics)
        resources += await asyncio.to_thread(
            lambda: [{"resource_name": name, "resource_type": TOPIC} for name in sorted(topics)])
    return answer(ErrorCode.NONE, resources)


def _note_software(versions: Api) -> None:
    """Wrap the ApiVersions handler so that client_software_name/version are known per peer."""
    inner = versions.handler
    if getattr(inner, "notes_client_software", False):
        return

    async def handle_api_versions(broker, ctx: RequestContext, request):
        name = getattr(request, "client_software_name", None)
        if name is not None:
            client_telemetry.manager(broker).note_software(
                ctx.client, name, getattr(request, "client_software_version", None))
        return await inner(broker, ctx, request)

    handle_api_versions.notes_client_software = True
    HANDLERS[API_VERSIONS] = Api(versions.key, versions.min_version, versions.max_version, handle_api_versions)


if API_VERSIONS in HANDLERS:
    _note_software(HANDLERS[API_VERSIONS])
