"""Codecs for KIP-714's client telemetry APIs: GetTelemetrySubscriptions (71) and
PushTelemetry (72).

kafka-python 3.0 ships no codecs for them; their field layouts (Kafka's, v0) are in
`strom/protocol/schemas/` and go through kafka-python's generator like the built-in ones.
"""

from __future__ import annotations

from kafka.protocol.api_message import ApiMessage

from strom.protocol import schemas


class GetTelemetrySubscriptionsRequest(ApiMessage, load_json=schemas):
    pass


class GetTelemetrySubscriptionsResponse(ApiMessage, load_json=schemas):
    pass


class PushTelemetryRequest(ApiMessage, load_json=schemas):
    pass


class PushTelemetryResponse(ApiMessage, load_json=schemas):
    pass
