"""Codecs for the delegation token APIs (KIP-48): CreateDelegationToken (38),
RenewDelegationToken (39), ExpireDelegationToken (40), DescribeDelegationToken (41).

kafka-python 3.0 ships no codecs for them; their field layouts (Kafka's, v0-3 / v0-2) are in
`strom/protocol/schemas/` and go through kafka-python's generator like the built-in ones.
"""

from __future__ import annotations

from kafka.protocol.api_message import ApiMessage

from strom.protocol import schemas


class CreateDelegationTokenRequest(ApiMessage, load_json=schemas):
    pass


class CreateDelegationTokenResponse(ApiMessage, load_json=schemas):
    pass


class RenewDelegationTokenRequest(ApiMessage, load_json=schemas):
    pass


class RenewDelegationTokenResponse(ApiMessage, load_json=schemas):
    pass


class ExpireDelegationTokenRequest(ApiMessage, load_json=schemas):
    pass


class ExpireDelegationTokenResponse(ApiMessage, load_json=schemas):
    pass


class DescribeDelegationTokenRequest(ApiMessage, load_json=schemas):
    pass


class DescribeDelegationTokenResponse(ApiMessage, load_json=schemas):
    pass
