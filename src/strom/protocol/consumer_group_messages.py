"""Codecs for KIP-848's ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69).

kafka-python 3.0 generates its codecs from Kafka's JSON schemas but ships none for these two
APIs; the schemas in `strom/protocol/schemas/` (Kafka's, as of 4.0) go through the same
generator, and `messages` picks the classes up like the built-in ones.
"""

from __future__ import annotations

from kafka.protocol.api_message import ApiMessage

from strom.protocol import schemas


class ConsumerGroupHeartbeatRequest(ApiMessage, load_json=schemas):
    pass


class ConsumerGroupHeartbeatResponse(ApiMessage, load_json=schemas):
    pass


class ConsumerGroupDescribeRequest(ApiMessage, load_json=schemas):
    pass


class ConsumerGroupDescribeResponse(ApiMessage, load_json=schemas):
    pass
