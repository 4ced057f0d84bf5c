"""ApiVersions: advertise exactly what the handler table implements."""

from __future__ import annotations

from strom.protocol.errors import ErrorCode
from strom.server.apis import HANDLERS, RequestContext, api

API_VERSIONS = 18


def supported_versions() -> list[dict]:
    return [
        {"api_key": a.key, "min_version": a.min_version, "max_version": a.max_version}
        for a in sorted(HANDLERS.values(), key=lambda a: a.key)
    ]


def unsupported_version_response() -> dict:
    """What Kafka answers, at v0, to an ApiVersions request of a version it does not know."""
    return {"error_code": ErrorCode.UNSUPPORTED_VERSION, "api_keys": supported_versions()}


@api(API_VERSIONS, 0, 4)
async def handle_api_versions(broker, ctx: RequestContext, request) -> dict:
    return {"error_code": ErrorCode.NONE, "api_keys": supported_versions(), "throttle_time_ms": 0}
