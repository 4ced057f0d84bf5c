"""ApiVersions: advertise exactly what the handler table implements, and from v3 the features
this broker supports and the levels the cluster has finalized (KIP-584)."""

from __future__ import annotations

from strom.controller.features import SUPPORTED
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
    response = {"error_code": ErrorCode.NONE, "api_keys": supported_versions(), "throttle_time_ms": 0}
    if ctx.header.api_version >= 3:
        finalized = broker.finalized_features
        response |= {
            "supported_features": [{"name": name, "min_version": f.min_level, "max_version": f.max_level}
                                   for name, f in SUPPORTED.items()],
            "finalized_features_epoch": finalized.epoch,
            # Kafka reports a finalized level as both bounds of the range (KIP-778).
            "finalized_features": [{"name": name, "max_version_level": level, "min_version_level": level}
                                   for name, level in sorted(finalized.levels.items())],
        }
    return response
