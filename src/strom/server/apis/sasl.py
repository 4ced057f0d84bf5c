"""SaslHandshake and SaslAuthenticate where no SASL is spoken.

On SASL listeners the socket server's authenticator answers both (security/sasl.py); a request
that reaches these handlers came on a listener without SASL, which Kafka answers with
ILLEGAL_SASL_STATE.
"""

from __future__ import annotations

from strom.protocol.errors import ErrorCode
from strom.security.sasl import SASL_AUTHENTICATE, SASL_HANDSHAKE
from strom.server.apis import RequestContext, api


@api(SASL_HANDSHAKE, 0, 1)
async def handle_sasl_handshake(broker, ctx: RequestContext, request) -> dict:
    return {"error_code": ErrorCode.ILLEGAL_SASL_STATE, "mechanisms": []}


@api(SASL_AUTHENTICATE, 0, 2)
async def handle_sasl_authenticate(broker, ctx: RequestContext, request) -> dict:
    return {"error_code": ErrorCode.ILLEGAL_SASL_STATE, "auth_bytes": b"", "session_lifetime_ms": 0,
            "error_message": f"listener {ctx.listener} does not use SASL"}
