"""The election state a node persists (Kafka's `quorum-state` file) and the roles it can be in.

The file is one line of JSON as Kafka's FileQuorumStateStore writes it: data_version 0 (static
voters, with clusterId/appliedOffset/currentVoters) or 1 (KIP-853, with votedDirectoryId).
"""

from __future__ import annotations

import base64
import enum
import json
import uuid
from dataclasses import dataclass

NO_ID = -1


class Role(enum.Enum):
    UNATTACHED = "Unattached"  # knows the epoch, maybe voted, no leader yet
    PROSPECTIVE = "Prospective"  # KIP-996: asking for pre-votes without bumping the epoch
    CANDIDATE = "Candidate"  # bumped the epoch and voted for itself
    LEADER = "Leader"
    FOLLOWER = "Follower"  # knows the leader of its epoch and fetches from it
    RESIGNED = "Resigned"  # a leader that gave up its epoch (shutdown or lost check-quorum)


@dataclass(frozen=True, slots=True)
class ElectionState:
    epoch: int = 0
    leader_id: int = NO_ID
    voted_id: int = NO_ID
    voted_directory_id: uuid.UUID | None = None

    def to_json(self, kraft_version: int, voters: list[int]) -> str:
        if kraft_version >= 1:
            doc = {"leaderId": self.leader_id, "leaderEpoch": self.epoch, "votedId": self.voted_id,
                   "votedDirectoryId": uuid_to_kafka(self.voted_directory_id), "data_version": 1}
        else:
            doc = {"clusterId": "", "leaderId": self.leader_id, "leaderEpoch": self.epoch,
                   "votedId": self.voted_id, "appliedOffset": 0,
                   "currentVoters": [{"voterId": v} for v in sorted(voters)], "data_version": 0}
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ElectionState:
        doc = json.loads(text)
        version = doc.get("data_version")
        if version not in (0, 1):
            raise ValueError(f"quorum-state data_version {version!r} is not 0 or 1")
        directory = doc.get("votedDirectoryId")
        return cls(int(doc.get("leaderEpoch", 0)), int(doc.get("leaderId", NO_ID)),
                   int(doc.get("votedId", NO_ID)), uuid_from_kafka(directory) if directory else None)


_ZERO_UUID = uuid.UUID(int=0)


def uuid_to_kafka(u: uuid.UUID | None) -> str:
    """Kafka's Uuid.toString: URL-safe base64 of the 16 bytes, unpadded."""
    return base64.urlsafe_b64encode((u or _ZERO_UUID).bytes).rstrip(b"=").decode()


def uuid_from_kafka(text: str) -> uuid.UUID | None:
    u = uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    return None if u == _ZERO_UUID else u
