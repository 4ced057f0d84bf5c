"""KIP-932's share-state RPCs, served by the share coordinator: InitializeShareGroupState,
ReadShareGroupState, WriteShareGroupState, DeleteShareGroupState and
ReadShareGroupStateSummary (Kafka 4.3's versions: v1 of Write and ReadSummary carry
KIP-1226's delivery-complete count). Brokers send them (a share partition's leader, a
group coordinator's admin side) through their Persister, so each needs CLUSTER_ACTION on the
cluster, as in Kafka; every partition of a refused request is CLUSTER_AUTHORIZATION_FAILED. A
key whose state partition this broker does not lead is NOT_COORDINATOR.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from strom.coordinator.share.coordinator import StateResult
from strom.protocol.errors import ErrorCode
from strom.security.authorizer import CLUSTER, CLUSTER_ACTION, allowed
from strom.server.apis import RequestContext, api
from strom.share.coordinator_service import (
    DELETE,
    INITIALIZE,
    READ,
    READ_SUMMARY,
    WRITE,
    request_items,
    response_fields,
)


def _handler(api_key: int) -> Callable[..., Awaitable[dict]]:
    """The handler of one share-state RPC: they differ only in what the coordinator does."""

    async def serve(broker, ctx: RequestContext, request) -> dict:
        items = request_items(api_key, request)
        if not allowed(broker, ctx, CLUSTER_ACTION, CLUSTER):
            results = {k: StateResult(ErrorCode.CLUSTER_AUTHORIZATION_FAILED) for k in items}
        else:
            results = await broker.share_partitions.coordinator.call(api_key, items)
        return response_fields(api_key, results)

    return serve


# Kafka 4.3's versions: WriteShareGroupState and ReadShareGroupStateSummary v1 carry KIP-1226's
# delivery-complete count (a write's is accepted and not needed: the coordinator derives it).
for _key in (INITIALIZE, READ, DELETE):
    api(_key, 0, 0)(_handler(_key))
for _key in (WRITE, READ_SUMMARY):
    api(_key, 0, 1)(_handler(_key))
