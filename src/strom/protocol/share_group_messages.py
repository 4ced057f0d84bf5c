"""Codecs for KIP-932's share group APIs: ShareGroupHeartbeat (76), ShareGroupDescribe (77),
ShareFetch (78) and ShareAcknowledge (79), at v1, the first stable version (Kafka 4.1; v0 was
4.0's early access and is not served), and the share group offsets admin APIs
DescribeShareGroupOffsets (90), AlterShareGroupOffsets (91), DeleteShareGroupOffsets (92) at v0.

kafka-python ships none of them; their field layouts are in `strom/protocol/schemas/` and go
through kafka-python's generator like the built-in ones.
"""

from __future__ import annotations

from kafka.protocol.api_message import ApiMessage

from strom.protocol import schemas


class ShareGroupHeartbeatRequest(ApiMessage, load_json=schemas):
    pass


class ShareGroupHeartbeatResponse(ApiMessage, load_json=schemas):
    pass


class ShareGroupDescribeRequest(ApiMessage, load_json=schemas):
    pass


class ShareGroupDescribeResponse(ApiMessage, load_json=schemas):
    pass


class ShareFetchRequest(ApiMessage, load_json=schemas):
    pass


class ShareFetchResponse(ApiMessage, load_json=schemas):
    pass


class ShareAcknowledgeRequest(ApiMessage, load_json=schemas):
    pass


class ShareAcknowledgeResponse(ApiMessage, load_json=schemas):
    pass


# The admin side (v0, as Kafka 4.1 serves them).
class DescribeShareGroupOffsetsRequest(ApiMessage, load_json=schemas):
    pass


class DescribeShareGroupOffsetsResponse(ApiMessage, load_json=schemas):
    pass


class AlterShareGroupOffsetsRequest(ApiMessage, load_json=schemas):
    pass


class AlterShareGroupOffsetsResponse(ApiMessage, load_json=schemas):
    pass


class DeleteShareGroupOffsetsRequest(ApiMessage, load_json=schemas):
    pass


class DeleteShareGroupOffsetsResponse(ApiMessage, load_json=schemas):
    pass
