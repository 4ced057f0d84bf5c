"""InitProducerId: a producer id and epoch for idempotent and transactional producers.

Without a transactional id Kafka always hands out a fresh id at epoch 0, and so does Strom.
With one, the transaction coordinator answers: the id's producer id with its epoch bumped,
which fences every older producer of the same transactional id.
"""

from __future__ import annotations

from strom.coordinator import TRANSACTION_STATE_TOPIC
from strom.protocol.errors import ErrorCode, KafkaError
from strom.security.authorizer import (
    CLUSTER,
    IDEMPOTENT_WRITE,
    TOPIC,
    TRANSACTIONAL_ID,
    WRITE,
    allowed,
    allowed_any,
)
from strom.server.apis import RequestContext, api

INIT_PRODUCER_ID = 22
PRODUCER_FENCED_FROM = 4  # older versions report a fenced producer as INVALID_PRODUCER_EPOCH


def fenced_code(error: ErrorCode, version: int, since: int) -> ErrorCode:
    """PRODUCER_FENCED for clients that know it (KIP-588), INVALID_PRODUCER_EPOCH for older."""
    if error == ErrorCode.PRODUCER_FENCED and version < since:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return error


@api(INIT_PRODUCER_ID, 0, 5)  # v5 only allows TRANSACTION_ABORTABLE (KIP-890)
async def handle_init_producer_id(broker, ctx: RequestContext, request) -> dict:
    version = ctx.header.api_version
    if request.transactional_id is None and not (
            allowed(broker, ctx, IDEMPOTENT_WRITE, CLUSTER) or allowed_any(broker, ctx, WRITE, TOPIC)):
        return {"throttle_time_ms": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                "producer_id": -1, "producer_epoch": -1}
    if request.transactional_id is not None and not allowed(broker, ctx, WRITE, TRANSACTIONAL_ID,
                                                            request.transactional_id):
        return {"throttle_time_ms": 0, "error_code": ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                "producer_id": -1, "producer_epoch": -1}
    expected = (request.producer_id, request.producer_epoch) if version >= 3 else (-1, -1)
    try:
        if request.transactional_id is None:  # "" is a transactional id: INVALID_REQUEST
            return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE,
                    "producer_id": broker.producer_id_manager.generate(), "producer_epoch": 0}
        result = broker.txn_coordinator.init_producer_id(request.transactional_id,
                                                         request.transaction_timeout_ms, *expected)
    except KafkaError as e:  # no id to give yet (a KRaft broker's block has not come): retriable
        return {"throttle_time_ms": 0, "error_code": e.code, "producer_id": -1, "producer_epoch": -1}
    error = result.error
    if error == ErrorCode.NONE:
        error = await broker.coordinators.await_internal_replication(TRANSACTION_STATE_TOPIC, request.transactional_id)
    return {"throttle_time_ms": 0,
            "error_code": fenced_code(error, version, PRODUCER_FENCED_FROM),
            "producer_id": result.producer_id, "producer_epoch": result.producer_epoch}
