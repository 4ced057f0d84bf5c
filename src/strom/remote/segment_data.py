"""What a copy uploads for one rolled segment of a tiered log (Kafka's LogSegmentData): the
segment file, its indexes as they are in memory (written to their files lazily), its
transaction index, the producer state as of its end and the leader epochs up to its end."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from strom.log import Log, LogSegment
from strom.log.leader_epoch import EpochEntry, format_checkpoint, parse_checkpoint
from strom.log.producer_state import ProducerStateManager
from strom.log.remote import LogSegmentData

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")


def epoch_entries(log: Log, start: int | None, end: int) -> tuple[tuple[int, int], ...]:
    """The (epoch, start offset) entries of the log's epoch cache covering [start, end) (start
    None: from the first), the first moved up to `start` (Kafka's epochEntriesInRange)."""
    entries = [(e.epoch, e.start_offset) for e in log.leader_epoch_cache.entries if e.start_offset < end]
    if start is None:
        return tuple(entries)
    below = [e for e in entries if e[1] <= start]
    inside = [e for e in entries if e[1] > start]
    return tuple(([(below[-1][0], start)] if below else []) + inside)


def epoch_checkpoint(entries: tuple[tuple[int, int], ...]) -> bytes:
    """The entries as a leader-epoch-checkpoint file's bytes."""
    return format_checkpoint(EpochEntry(epoch, start) for epoch, start in entries).encode()


def parse_epoch_checkpoint(data: bytes) -> list[tuple[int, int]]:
    return [(e.epoch, e.start_offset) for e in parse_checkpoint(data.decode())]


class _NoAbortIndex:
    """A replay for a snapshot indexes nothing: the log's own index has its aborts already."""

    def add_aborted_txn(self, _txn: object) -> None:
        pass


@dataclass(slots=True)
class ProducerReplay:
    """The producer state as of `offset`, carried from one copy to the next, so that each copy
    replays only its own segment's batch headers (not the local log from its start again)."""

    offset: int
    state: ProducerStateManager


def producer_snapshot_at(log: Log, end: int, carried: ProducerReplay | None = None) -> tuple[bytes, ProducerReplay]:
    """The producer state as of offset `end` (the next segment's base), and the replay to carry
    to the next copy: from `carried` when it is at or below `end` within the local log, else
    from the newest snapshot file at or below `end`, then the batch headers up to it. Blocking:
    a worker thread's."""
    start = log.local_log_start_offset
    if carried is not None and start <= carried.offset <= end:
        state, offset = carried.state, carried.offset
    else:
        state = ProducerStateManager(log.dir)
        offset = max(state.load(end, drop_newer=False), start)
    offset = state.replay(log, offset, end, _NoAbortIndex())
    return state.encode_snapshot(), ProducerReplay(offset, state)


def segment_data(log: Log, segment: LogSegment, end: int,
                 carried: ProducerReplay | None = None) -> tuple[LogSegmentData, ProducerReplay]:
    """What a copy of `segment` ([base, end)) uploads, and the producer replay to carry to the
    next. Blocking (reads the segment's batch headers): a worker thread's."""
    base = segment.base_offset
    offsets = b"".join(_OFFSET_ENTRY.pack(o - base, p) for o, p in segment.offset_index.entries())
    times = b"".join(_TIME_ENTRY.pack(t, o - base) for t, o in segment.time_index.entries())
    txn = segment.txn_index.path
    snapshot, replay = producer_snapshot_at(log, end, carried)
    return LogSegmentData(
        log_segment=Path(segment.log_path),
        offset_index=offsets,
        time_index=times,
        transaction_index=txn if segment.txn_index.entries else None,
        producer_snapshot=snapshot,
        leader_epoch_index=epoch_checkpoint(epoch_entries(log, None, end)),
    ), replay
