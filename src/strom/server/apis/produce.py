"""Produce: append each partition's record set to its leader log; answer per acks.

Record sets stay opaque: the log validates batch headers and CRCs and assigns offsets in
place. acks=0 gets no response, as in Kafka.
"""

from __future__ import annotations

from strom.controller.controller import validate_topic_name
from strom.protocol.errors import ErrorCode, KafkaError
from strom.server.apis import CloseConnection, RequestContext, api
from strom.server.replica_manager import ProduceResult

PRODUCE = 0


def _topic_error(name: str) -> ErrorCode:
    try:
        validate_topic_name(name)
    except KafkaError as e:
        return e.code
    return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


@api(PRODUCE, 3, 11)
async def handle_produce(broker, ctx: RequestContext, request) -> dict | None:
    acks = request.acks
    entries, results = [], {}
    for topic in request.topic_data:
        for p in topic.partition_data:
            tp = (topic.name, p.index)
            if acks not in (0, 1, -1):
                results[tp] = ProduceResult(ErrorCode.INVALID_REQUIRED_ACKS)
            elif broker.replica_manager.get_partition(*tp) is None:
                results[tp] = ProduceResult(_topic_error(topic.name))
            elif p.records is None:
                results[tp] = ProduceResult(ErrorCode.CORRUPT_MESSAGE, message="no records")
            else:
                entries.append((tp, p.records))
    results.update(broker.replica_manager.append_records(acks, entries))
    if acks == 0:
        failed = [f"{t}-{p}: {r.error.name}" for (t, p), r in results.items() if r.error]
        if failed:
            raise CloseConnection(f"acks=0 produce failed ({', '.join(failed)})")
        return None
    await broker.replica_manager.await_flushes(results)
    by_topic: dict[str, list[dict]] = {}
    for (name, index), r in results.items():
        by_topic.setdefault(name, []).append({
            "index": index,
            "error_code": r.error,
            "base_offset": r.base_offset,
            "log_append_time_ms": r.log_append_time,
            "log_start_offset": r.log_start_offset,
            "record_errors": [],
            "error_message": r.message,
        })
    return {
        "responses": [{"name": n, "partition_responses": ps} for n, ps in by_topic.items()],
        "throttle_time_ms": 0,
    }
