"""ApiVersions: advertise what the handler table implements, at the ranges a Kafka 4.3 broker
advertises (tests/server/test_kafka_43.py keeps 4.3's table and names each API Strom leaves
out), and from v3 the features this broker supports and the levels the cluster has finalized
(KIP-584).

Two exceptions, both Kafka's since 4.0: Produce is advertised from v0 although only v3 and up are
served (v0-v2 close the connection), because librdkafka releases from before the fix of its
issue #4956 decide whether they may compress from that range and send gzip, snappy, lz4 and
zstd batches uncompressed when v0 is missing (KAFKA-18659); and the client telemetry APIs are advertised only where pushed
metrics have somewhere to go (Kafka needs a telemetry receiver plugin; here, the metrics
endpoint, `metrics.port`), so clients do not collect and push metrics nobody reads."""

from __future__ import annotations

from strom.controller.features import SUPPORTED
from strom.network.request import API_VERSIONS
from strom.protocol.errors import ErrorCode
from strom.server.apis import RequestContext, api, supported_versions


@api(API_VERSIONS, 0, 4)
async def handle_api_versions(broker, ctx: RequestContext, request) -> dict:
    response = {"error_code": ErrorCode.NONE, "api_keys": supported_versions(broker), "throttle_time_ms": 0}
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
