"""Codecs for the KRaft quorum APIs (KIP-595, KIP-996, KIP-630, KIP-853) at the versions Kafka
4.0/4.1 controllers speak: Vote (52) v0-2, BeginQuorumEpoch (53) v0-1, EndQuorumEpoch (54) v0-1,
FetchSnapshot (59) v0-1, AddRaftVoter (80) v0, RemoveRaftVoter (81) v0, UpdateRaftVoter (82) v0.

kafka-python ships DescribeQuorum (55) v0-2 and Fetch up to v18 (with KIP-595's
last_fetched_epoch, diverging_epoch, current_leader and snapshot_id), so only the others come
from `strom/protocol/schemas/`. The control record values of the metadata log
(LeaderChangeMessage, SnapshotHeader/Footer, KRaftVersion, Voters) are "data" schemas that go
through the same generator; `strom.protocol.raft_records` frames them into record batches.
Their leading int16 "Version" field is called RecordVersion in these schemas: the generated
classes take `version` as the message version, and the two would collide (the bytes are equal).
"""

from __future__ import annotations

from kafka.protocol.admin import cluster  # noqa: F401  (registers DescribeQuorum)
from kafka.protocol.api_data import ApiData
from kafka.protocol.api_message import ApiMessage

from strom.protocol import schemas


class VoteRequest(ApiMessage, load_json=schemas):
    pass


class VoteResponse(ApiMessage, load_json=schemas):
    pass


class BeginQuorumEpochRequest(ApiMessage, load_json=schemas):
    pass


class BeginQuorumEpochResponse(ApiMessage, load_json=schemas):
    pass


class EndQuorumEpochRequest(ApiMessage, load_json=schemas):
    pass


class EndQuorumEpochResponse(ApiMessage, load_json=schemas):
    pass


class FetchSnapshotRequest(ApiMessage, load_json=schemas):
    pass


class FetchSnapshotResponse(ApiMessage, load_json=schemas):
    pass


class AddRaftVoterRequest(ApiMessage, load_json=schemas):
    pass


class AddRaftVoterResponse(ApiMessage, load_json=schemas):
    pass


class RemoveRaftVoterRequest(ApiMessage, load_json=schemas):
    pass


class RemoveRaftVoterResponse(ApiMessage, load_json=schemas):
    pass


class UpdateRaftVoterRequest(ApiMessage, load_json=schemas):
    pass


class UpdateRaftVoterResponse(ApiMessage, load_json=schemas):
    pass


# --- control record values (no api key; serialized without a version header) ---


class LeaderChangeMessage(ApiData, load_json=schemas):
    pass


class SnapshotHeaderRecord(ApiData, load_json=schemas):
    pass


class SnapshotFooterRecord(ApiData, load_json=schemas):
    pass


class KRaftVersionRecord(ApiData, load_json=schemas):
    pass


class VotersRecord(ApiData, load_json=schemas):
    pass
