"""Codecs for the broker-to-controller APIs of KRaft (KIP-631): BrokerRegistration (62) v0-4,
BrokerHeartbeat (63) v0-2 (v2: the cordoned log dirs of KIP-1066), UnregisterBroker (64) v0, AllocateProducerIds (67) v0 and Envelope
(58) v0, from Kafka's field layouts in `strom/protocol/schemas/` through kafka-python's
generator, as the other schemas it lacks."""

from __future__ import annotations

from kafka.protocol.api_data import ApiData
from kafka.protocol.api_message import ApiMessage

from strom.protocol import schemas


class BrokerRegistrationRequest(ApiMessage, load_json=schemas):
    pass


class BrokerRegistrationResponse(ApiMessage, load_json=schemas):
    pass


class BrokerHeartbeatRequest(ApiMessage, load_json=schemas):
    pass


class BrokerHeartbeatResponse(ApiMessage, load_json=schemas):
    pass


class UnregisterBrokerRequest(ApiMessage, load_json=schemas):
    pass


class UnregisterBrokerResponse(ApiMessage, load_json=schemas):
    pass


class AllocateProducerIdsRequest(ApiMessage, load_json=schemas):
    pass


class AllocateProducerIdsResponse(ApiMessage, load_json=schemas):
    pass


class EnvelopeRequest(ApiMessage, load_json=schemas):
    """Envelope (58, KIP-590): a broker passes a client's request to the controller with the
    client's principal and address."""


class EnvelopeResponse(ApiMessage, load_json=schemas):
    pass


class DefaultPrincipalData(ApiData, load_json=schemas):
    """An Envelope's principal, as Kafka's DefaultKafkaPrincipalBuilder serializes it
    (version-prefixed)."""
