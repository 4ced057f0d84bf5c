"""FindCoordinator: answered, until Strom has group and transaction coordinators, with
COORDINATOR_NOT_AVAILABLE, which clients treat as "retry later".

Advertising the API matters beyond groups: librdkafka enables LZ4 only for brokers that list
FindCoordinator (its marker for Kafka >= 0.8.2) and otherwise sends lz4 batches uncompressed.
"""

from __future__ import annotations

from strom.protocol.errors import ErrorCode
from strom.server.apis import RequestContext, api

FIND_COORDINATOR = 10
_MESSAGE = "The coordinator is not available."


@api(FIND_COORDINATOR, 0, 4)
async def handle_find_coordinator(broker, ctx: RequestContext, request) -> dict:
    unavailable = {"error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE, "error_message": _MESSAGE,
                   "node_id": -1, "host": "", "port": -1}
    if ctx.header.api_version < 4:
        return {"throttle_time_ms": 0, **unavailable}
    return {"throttle_time_ms": 0,
            "coordinators": [{"key": key, **unavailable} for key in request.coordinator_keys]}
