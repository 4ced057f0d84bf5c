"""The replicated log as the Raft core reasons about it: batches after the latest snapshot,
their epochs (a leader-epoch cache), the start, end and flushed offsets.

The core keeps the batches it has not snapshotted yet in memory (a metadata log between two
snapshots is bounded by metadata.log.max.record.bytes.between.snapshots); the driver mirrors
every change to disk through the core's effects.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from strom.protocol.raft_records import BatchInfo, iter_batches


@dataclass(frozen=True, slots=True, order=True)
class OffsetAndEpoch:
    offset: int
    epoch: int


@dataclass(frozen=True, slots=True)
class LogBatch:
    base_offset: int
    last_offset: int
    epoch: int
    is_control: bool
    data: bytes

    @property
    def end_offset(self) -> int:
        return self.last_offset + 1

    @classmethod
    def from_info(cls, buf, info: BatchInfo) -> LogBatch:
        return cls(info.base_offset, info.last_offset, info.epoch, info.is_control,
                   bytes(buf[info.pos:info.pos + info.size]))


def split_batches(buf) -> list[LogBatch]:
    return [LogBatch.from_info(buf, info) for info in iter_batches(buf)]


class RaftLog:
    def __init__(self, snapshot_id: OffsetAndEpoch | None = None) -> None:
        self.snapshot_id = snapshot_id  # the latest snapshot: the log starts at its end offset
        self.start_offset = snapshot_id.offset if snapshot_id else 0
        self.batches: list[LogBatch] = []
        self._bases: list[int] = []
        self._epochs: list[tuple[int, int]] = []  # (epoch, start offset), epochs ascending
        self.flushed_offset = self.start_offset
        self.bytes_since_snapshot = 0

    @property
    def end_offset(self) -> int:
        return self.batches[-1].end_offset if self.batches else self.start_offset

    @property
    def last_epoch(self) -> int:
        if self._epochs:
            return self._epochs[-1][0]
        return self.snapshot_id.epoch if self.snapshot_id else 0

    def last_offset_and_epoch(self) -> OffsetAndEpoch:
        return OffsetAndEpoch(self.end_offset, self.last_epoch)

    def append(self, batch: LogBatch) -> None:
        if batch.base_offset != self.end_offset:
            raise ValueError(f"batch at {batch.base_offset} does not follow end offset {self.end_offset}")
        if batch.epoch < self.last_epoch:
            raise ValueError(f"batch epoch {batch.epoch} is below the log's last epoch {self.last_epoch}")
        if not self._epochs or batch.epoch > self._epochs[-1][0]:
            self._epochs.append((batch.epoch, batch.base_offset))
        self.batches.append(batch)
        self._bases.append(batch.base_offset)
        self.bytes_since_snapshot += len(batch.data)

    def truncate(self, end_offset: int) -> None:
        """Drop every batch at or after `end_offset` (a batch boundary)."""
        i = bisect.bisect_left(self._bases, end_offset)
        del self.batches[i:]
        del self._bases[i:]
        while self._epochs and self._epochs[-1][1] >= end_offset:
            self._epochs.pop()
        self.flushed_offset = min(self.flushed_offset, self.end_offset)

    def delete_before_snapshot(self, snapshot_id: OffsetAndEpoch) -> None:
        """The snapshot covers everything before its end offset: drop those batches."""
        i = bisect.bisect_left(self._bases, snapshot_id.offset)
        del self.batches[:i]
        del self._bases[:i]
        self.snapshot_id = snapshot_id
        self.start_offset = snapshot_id.offset
        # Epochs that start before the snapshot still name the batches right after it.
        keep = [e for e in self._epochs if e[1] >= snapshot_id.offset]
        first_kept = self._bases[0] if self._bases else None
        older = [e for e in self._epochs if e[1] < snapshot_id.offset]
        if older and first_kept is not None and (not keep or keep[0][1] > first_kept):
            keep.insert(0, (older[-1][0], first_kept))
        self._epochs = keep
        self.flushed_offset = max(self.flushed_offset, self.start_offset)
        self.bytes_since_snapshot = sum(len(b.data) for b in self.batches)

    def reset_to_snapshot(self, snapshot_id: OffsetAndEpoch) -> None:
        """A snapshot fetched from the leader replaces the whole log."""
        self.batches.clear()
        self._bases.clear()
        self._epochs.clear()
        self.snapshot_id = snapshot_id
        self.start_offset = snapshot_id.offset
        self.flushed_offset = snapshot_id.offset
        self.bytes_since_snapshot = 0

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        """The largest epoch <= `epoch` this log knows, and the offset where it ends (Kafka's
        endOffsetForEpoch): what a leader answers a follower whose last fetched epoch is `epoch`.
        Epoch -1 when `epoch` is older than every batch after the start offset."""
        i = bisect.bisect_right(self._epochs, (epoch, float("inf"))) - 1
        if i < 0:
            return OffsetAndEpoch(self.start_offset, -1)
        found_epoch = self._epochs[i][0]
        end = self._epochs[i + 1][1] if i + 1 < len(self._epochs) else self.end_offset
        return OffsetAndEpoch(end, found_epoch)

    def epoch_of(self, offset: int) -> int:
        """Epoch of the record at `offset - 1`, i.e. of a snapshot that ends at `offset`."""
        if offset <= self.start_offset:
            return self.snapshot_id.epoch if self.snapshot_id else 0
        i = bisect.bisect_right([start for _, start in self._epochs], offset - 1) - 1
        return self._epochs[i][0] if i >= 0 else (self.snapshot_id.epoch if self.snapshot_id else 0)

    def is_batch_boundary(self, offset: int) -> bool:
        if offset in (self.start_offset, self.end_offset):
            return True
        i = bisect.bisect_left(self._bases, offset)
        return i < len(self._bases) and self._bases[i] == offset

    def read(self, offset: int, max_bytes: int) -> list[LogBatch]:
        """Whole batches from `offset` (a batch boundary), at least one, up to `max_bytes`."""
        i = bisect.bisect_left(self._bases, offset)
        out: list[LogBatch] = []
        size = 0
        while i < len(self.batches):
            b = self.batches[i]
            if out and size + len(b.data) > max_bytes:
                break
            out.append(b)
            size += len(b.data)
            i += 1
        return out

    def batches_between(self, start: int, end: int) -> list[LogBatch]:
        """Batches with base offset in [start, end)."""
        i = bisect.bisect_left(self._bases, start)
        j = bisect.bisect_left(self._bases, end)
        return self.batches[i:j]
