"""UpdateFeatures (KIP-584): the controller changes the cluster's finalized feature levels.

As a ZooKeeper-mode Kafka broker does, only the active controller answers; the others say
NOT_CONTROLLER and clients (kafka-python's `update_features`, Kafka's admin tools) send it on.
An unsafe downgrade is a safe one here: no feature Strom has loses data when lowered, and
metadata.version, the one that could, is never lowered.
"""

from __future__ import annotations

from strom.controller.features import SAFE_DOWNGRADE, UPGRADE, FeatureUpdate
from strom.controller.store import BadVersion, StoreUnavailable
from strom.protocol.errors import ErrorCode
from strom.security.authorizer import ALTER, CLUSTER, allowed
from strom.server.apis import RequestContext, api

UPDATE_FEATURES = 57


def _response(version: int, updates: list[FeatureUpdate], error: ErrorCode, message: str | None,
              results: dict[str, tuple[ErrorCode, str | None]] | None = None) -> dict:
    """v0-1 carry a result per feature; v2 only the top-level error, which is then the first
    failure's."""
    if version >= 2:
        if error == ErrorCode.NONE and results:
            error, message = next(((c, m) for c, m in results.values() if c != ErrorCode.NONE),
                                  (ErrorCode.NONE, None))
        return {"throttle_time_ms": 0, "error_code": error, "error_message": message, "results": []}
    outcome = {u.feature: (results or {}).get(u.feature, (error, message)) for u in updates}
    per_feature = [{"feature": name, "error_code": code, "error_message": text}
                   for name, (code, text) in outcome.items()]
    return {"throttle_time_ms": 0, "error_code": error, "error_message": message, "results": per_feature}


@api(UPDATE_FEATURES, 0, 2)
async def handle_update_features(broker, ctx: RequestContext, request) -> dict:
    version = ctx.header.api_version
    updates = [FeatureUpdate(u.feature, u.max_version_level,
                             u.upgrade_type if version >= 1 else
                             (SAFE_DOWNGRADE if u.allow_downgrade else UPGRADE))
               for u in request.feature_updates]
    if not allowed(broker, ctx, ALTER, CLUSTER):
        return _response(version, updates, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, None)
    if not updates:
        return _response(version, updates, ErrorCode.INVALID_REQUEST, "No feature updates were given.")
    if broker.controller is None or not broker.controller.is_active:
        return _response(version, updates, ErrorCode.NOT_CONTROLLER, None)
    try:
        results = await broker.controller.update_features(updates, version >= 1 and request.validate_only)
    except (BadVersion, StoreUnavailable) as e:  # the node changed under us or the store is away: nothing applied
        return _response(version, updates, ErrorCode.FEATURE_UPDATE_FAILED, str(e))
    return _response(version, updates, ErrorCode.NONE, None, results)
