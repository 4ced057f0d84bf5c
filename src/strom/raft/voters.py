"""Voter sets: the static `controller.quorum.voters` and KIP-853's sets stored in the log.

Like Kafka, the set in force is the latest VotersRecord in the log, committed or not (Raft's
single-server membership change), so a truncation of the log can bring an older set back.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from strom.protocol.raft_records import VoterEntry


@dataclass(frozen=True)
class VoterSet:
    voters: tuple[VoterEntry, ...]

    @property
    def ids(self) -> frozenset[int]:
        return frozenset(v.voter_id for v in self.voters)

    def __contains__(self, node_id: object) -> bool:
        return any(v.voter_id == node_id for v in self.voters)

    def get(self, node_id: int) -> VoterEntry | None:
        for v in self.voters:
            if v.voter_id == node_id:
                return v
        return None

    def majority(self) -> int:
        return len(self.voters) // 2 + 1

    def adding(self, voter: VoterEntry) -> VoterSet:
        return VoterSet(tuple(sorted((*self.voters, voter), key=lambda v: v.voter_id)))

    def removing(self, node_id: int) -> VoterSet:
        return VoterSet(tuple(v for v in self.voters if v.voter_id != node_id))

    def replacing(self, voter: VoterEntry) -> VoterSet:
        return VoterSet(tuple(voter if v.voter_id == voter.voter_id else v for v in self.voters))


class VoterSetHistory:
    """(offset, voter set) pairs read from the log, over a static or snapshot base set."""

    def __init__(self, base: VoterSet) -> None:
        self.base = base
        self._offsets: list[int] = []
        self._sets: list[VoterSet] = []

    def add(self, offset: int, voters: VoterSet) -> None:
        if self._offsets and offset <= self._offsets[-1]:
            raise ValueError(f"voter set at {offset} is not after {self._offsets[-1]}")
        self._offsets.append(offset)
        self._sets.append(voters)

    def latest(self) -> VoterSet:
        return self._sets[-1] if self._sets else self.base

    def latest_offset(self) -> int:
        """Offset of the latest VotersRecord, -1 when the base set is in force."""
        return self._offsets[-1] if self._offsets else -1

    def truncate(self, end_offset: int) -> None:
        """Forget sets at or after `end_offset` (the log was truncated there)."""
        i = bisect.bisect_left(self._offsets, end_offset)
        del self._offsets[i:]
        del self._sets[i:]

    def reset(self, base: VoterSet) -> None:
        self.base = base
        self._offsets.clear()
        self._sets.clear()
