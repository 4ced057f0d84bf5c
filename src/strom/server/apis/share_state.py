"""KIP-932's share-state RPCs, served by the share coordinator: InitializeShareGroupState,
ReadShareGroupState, WriteShareGroupState, DeleteShareGroupState and
ReadShareGroupStateSummary (v0, Kafka 4.1). Brokers send them (a share partition's leader, a
group coordinator's admin side) through their Persister, so each needs CLUSTER_ACTION on the
cluster, as in Kafka; every partition of a refused request is CLUSTER_AUTHORIZATION_FAILED. A
key whose state partition this broker does not lead is NOT_COORDINATOR.
"""

from __future__ import annotations

from strom.coordinator.share.coordinator import StateResult
from strom.protocol.errors import ErrorCode
from strom.security.authorizer import CLUSTER, CLUSTER_ACTION, allowed
from strom.server.apis import RequestContext, api
from strom.server.share_coordinator import (
    DELETE,
    INITIALIZE,
    READ,
    READ_SUMMARY,
    WRITE,
    request_items,
    response_fields,
)


async def _serve(broker, ctx: RequestContext, request, api_key: int) -> dict:
    items = request_items(api_key, request)
    if not allowed(broker, ctx, CLUSTER_ACTION, CLUSTER):
        results = {k: StateResult(ErrorCode.CLUSTER_AUTHORIZATION_FAILED) for k in items}
    else:
        results = await broker.share_partitions.coordinator.call(api_key, items)
    return response_fields(api_key, results)


@api(INITIALIZE, 0, 0)
async def handle_initialize_share_group_state(broker, ctx: RequestContext, request) -> dict:
    return await _serve(broker, ctx, request, INITIALIZE)


@api(READ, 0, 0)
async def handle_read_share_group_state(broker, ctx: RequestContext, request) -> dict:
    return await _serve(broker, ctx, request, READ)


@api(WRITE, 0, 0)
async def handle_write_share_group_state(broker, ctx: RequestContext, request) -> dict:
    return await _serve(broker, ctx, request, WRITE)


@api(DELETE, 0, 0)
async def handle_delete_share_group_state(broker, ctx: RequestContext, request) -> dict:
    return await _serve(broker, ctx, request, DELETE)


@api(READ_SUMMARY, 0, 0)
async def handle_read_share_group_state_summary(broker, ctx: RequestContext, request) -> dict:
    return await _serve(broker, ctx, request, READ_SUMMARY)
