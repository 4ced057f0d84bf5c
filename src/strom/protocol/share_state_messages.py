"""Codecs for KIP-932's share-state RPCs, the inter-broker calls between a share partition's
leader (or a group coordinator) and the share coordinator that owns the share partition's
record in `__share_group_state`: InitializeShareGroupState (83), ReadShareGroupState (84),
WriteShareGroupState (85), DeleteShareGroupState (86) and ReadShareGroupStateSummary (87), v0
as Kafka 4.1 defines them (its ReadShareGroupStateSummary response carries the leader epoch).
"""

from __future__ import annotations

from kafka.protocol.api_message import ApiMessage

from strom.protocol import schemas


class InitializeShareGroupStateRequest(ApiMessage, load_json=schemas):
    pass


class InitializeShareGroupStateResponse(ApiMessage, load_json=schemas):
    pass


class ReadShareGroupStateRequest(ApiMessage, load_json=schemas):
    pass


class ReadShareGroupStateResponse(ApiMessage, load_json=schemas):
    pass


class WriteShareGroupStateRequest(ApiMessage, load_json=schemas):
    pass


class WriteShareGroupStateResponse(ApiMessage, load_json=schemas):
    pass


class DeleteShareGroupStateRequest(ApiMessage, load_json=schemas):
    pass


class DeleteShareGroupStateResponse(ApiMessage, load_json=schemas):
    pass


class ReadShareGroupStateSummaryRequest(ApiMessage, load_json=schemas):
    pass


class ReadShareGroupStateSummaryResponse(ApiMessage, load_json=schemas):
    pass
