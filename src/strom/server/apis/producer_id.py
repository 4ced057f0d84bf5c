"""InitProducerId: a producer id and epoch for idempotent producers.

Without a transactional id Kafka always hands out a fresh id at epoch 0, and so does Strom.
Transactional ids need the transaction coordinator, which Strom does not have yet: those
requests get COORDINATOR_NOT_AVAILABLE, the answer Kafka gives while it has none.
"""

from __future__ import annotations

from strom.protocol.errors import ErrorCode
from strom.server.apis import RequestContext, api

INIT_PRODUCER_ID = 22


@api(INIT_PRODUCER_ID, 0, 4)
async def handle_init_producer_id(broker, ctx: RequestContext, request) -> dict:
    if request.transactional_id:
        return {"throttle_time_ms": 0, "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE,
                "producer_id": -1, "producer_epoch": -1}
    return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE,
            "producer_id": broker.producer_id_manager.generate(), "producer_epoch": 0}
