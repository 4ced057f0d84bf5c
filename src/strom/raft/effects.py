"""What the Raft core asks its driver to do. The driver runs effects in the order given: a
PersistElectionState or WriteSnapshot must be durable before any later effect (a vote is never
sent before it is on disk)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strom.raft.log import LogBatch, OffsetAndEpoch
from strom.raft.state import ElectionState


@dataclass(frozen=True, slots=True)
class Send:
    """A request to another node; its answer comes back as `handle_response(request_id, ...)`
    or, if none arrives, `request_failed(request_id)`."""

    dest: int
    api_key: int
    version: int
    body: dict[str, Any]
    request_id: int
    address: tuple[str, int] | None = None  # where `dest` listens, when its id alone does not say


@dataclass(frozen=True, slots=True)
class Respond:
    """The answer to the request the driver handed in with `ref`."""

    ref: Any
    api_key: int
    version: int
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PersistElectionState:
    state: ElectionState
    text: str  # the quorum-state file's content


@dataclass(frozen=True, slots=True)
class AppendLog:
    batch: LogBatch


@dataclass(frozen=True, slots=True)
class TruncateLog:
    """Remove every batch at or after `end_offset`; durable before the next effect."""

    end_offset: int


@dataclass(frozen=True, slots=True)
class FlushLog:
    """fsync the log up to `end_offset`, then call `on_flushed(end_offset, generation)`."""

    end_offset: int
    generation: int  # bumped by every truncation: a flush from before one proves nothing


@dataclass(frozen=True, slots=True)
class WriteSnapshot:
    """Write `<offset>-<epoch>.checkpoint` durably (temp file, fsync, rename)."""

    snapshot_id: OffsetAndEpoch
    data: bytes


@dataclass(frozen=True, slots=True)
class DeleteLogPrefix:
    """Segments wholly before `start_offset` are behind a snapshot: delete them, and older
    snapshots. With `reset`, the log is emptied and starts at `start_offset` (a snapshot
    fetched from the leader replaced it)."""

    start_offset: int
    reset: bool = False


@dataclass(frozen=True, slots=True)
class Committed:
    """The high watermark moved: `batches` (in offset order) are committed, to be applied."""

    high_watermark: int
    batches: tuple[LogBatch, ...]


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """Replace the applied state with the snapshot's (fetched from the leader, or at start)."""

    snapshot_id: OffsetAndEpoch
    data: bytes


@dataclass(frozen=True, slots=True)
class LeaderChanged:
    leader_id: int  # -1 when unknown
    epoch: int


@dataclass(frozen=True, slots=True)
class SnapshotDue:
    """metadata.log.max.record.bytes.between.snapshots or .max.snapshot.interval.ms passed:
    the state machine should call `create_snapshot` at an offset up to `committed_offset`."""

    committed_offset: int


Effect = (Send | Respond | PersistElectionState | AppendLog | TruncateLog | FlushLog | WriteSnapshot
          | DeleteLogPrefix | Committed | LoadSnapshot | LeaderChanged | SnapshotDue)
