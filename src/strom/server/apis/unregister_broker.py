"""UnregisterBroker (64) on a broker: a KRaft broker passes it to the active controller as the
client's (in an Envelope, where the controller checks ALTER on the cluster as Kafka's does), as
Kafka's brokers forward it, so that `strom cluster unregister` may name any broker. Only KRaft
brokers advertise it: in ZooKeeper mode no controller keeps registrations this way.
"""

from __future__ import annotations

from strom.protocol.errors import ErrorCode, KafkaError
from strom.security.authorizer import ALTER, CLUSTER, allowed
from strom.server.apis import RequestContext, api

UNREGISTER_BROKER = 64


@api(UNREGISTER_BROKER, 0, 0)
async def handle_unregister_broker(broker, ctx: RequestContext, request) -> dict:
    def answer(code: int, message: str | None = None) -> dict:
        return {"throttle_time_ms": 0, "error_code": code, "error_message": message}

    if not broker.forwards_admin:  # not advertised there; a client that sends it anyway
        return answer(ErrorCode.UNSUPPORTED_VERSION, "UnregisterBroker is served by KRaft brokers only")
    if not allowed(broker, ctx, ALTER, CLUSTER):  # what the controller would answer, without asking it
        return answer(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed.")
    try:
        return await broker.forward(ctx, request)
    except KafkaError as e:  # refused whole, or no controller answered (REQUEST_TIMED_OUT)
        return answer(e.code, str(e))
