"""Codecs for the inter-broker APIs: LeaderAndIsr (4), StopReplica (5) and UpdateMetadata (6)
from the controller, AlterPartition (56) and ControlledShutdown (7) to it, as Kafka 3.x
ZooKeeper-mode brokers speak them.

kafka-python ships no schemas for inter-broker APIs; the ones in `strom/protocol/schemas/`
describe Kafka's layouts and go through kafka-python's generator like the built-in ones.
"""

from __future__ import annotations

from kafka.protocol.api_message import ApiMessage

from strom.protocol import schemas


class LeaderAndIsrRequest(ApiMessage, load_json=schemas):
    pass


class LeaderAndIsrResponse(ApiMessage, load_json=schemas):
    pass


class StopReplicaRequest(ApiMessage, load_json=schemas):
    pass


class StopReplicaResponse(ApiMessage, load_json=schemas):
    pass


class UpdateMetadataRequest(ApiMessage, load_json=schemas):
    pass


class UpdateMetadataResponse(ApiMessage, load_json=schemas):
    pass


class AlterPartitionRequest(ApiMessage, load_json=schemas):
    pass


class AlterPartitionResponse(ApiMessage, load_json=schemas):
    pass


class ControlledShutdownRequest(ApiMessage, load_json=schemas):
    pass


class ControlledShutdownResponse(ApiMessage, load_json=schemas):
    pass
