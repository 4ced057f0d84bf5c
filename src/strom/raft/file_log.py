"""The metadata partition on disk, laid out as Kafka lays out `__cluster_metadata-0`: segment
files `<base offset>.log` of RecordBatch v2, `<offset>-<epoch>.checkpoint` snapshots and the
`quorum-state` file. It carries out the core's disk effects; the core never touches it.

Blocking calls: a driver runs them off its event loop (`driver.RaftDriver` uses a thread).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from strom.log.checkpoint import write_atomically
from strom.raft.log import LogBatch, OffsetAndEpoch, split_batches
from strom.raft.snapshots import SUFFIX, filename, parse_filename
from strom.raft.state import ElectionState

QUORUM_STATE = "quorum-state"
SEGMENT_SUFFIX = ".log"
# Kafka's metadata.log.segment.bytes default: a new segment past this size.
DEFAULT_SEGMENT_BYTES = 1024 * 1024 * 1024


@dataclass
class Loaded:
    election: ElectionState | None
    batches: list[LogBatch]
    snapshot: tuple[OffsetAndEpoch, bytes] | None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileMetadataLog:
    def __init__(self, directory: Path, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self._segments: list[int] = sorted(int(p.stem) for p in self.dir.glob("*" + SEGMENT_SUFFIX))
        self._active_size = 0
        self._end_offset = 0
        self._fd: int | None = None

    # --- reading at start ----------------------------------------------------------------------

    def load(self) -> Loaded:
        """What the disk holds; a torn batch at the end (a crash mid-write) is cut off."""
        election = None
        state = self.dir / QUORUM_STATE
        if state.exists():
            election = ElectionState.from_json(state.read_text(encoding="utf-8").strip())
        snapshot = None
        ids = sorted(s for p in self.dir.glob("*" + SUFFIX) if (s := parse_filename(p.name)) is not None)
        if ids:
            snapshot = (ids[-1], (self.dir / filename(ids[-1])).read_bytes())
        batches: list[LogBatch] = []
        for base in self._segments:
            path = self._path(base)
            data = path.read_bytes()
            seg = split_batches(data)
            good = sum(len(b.data) for b in seg)
            if good < len(data):
                os.truncate(path, good)
            batches.extend(seg)
        if snapshot is not None:
            batches = [b for b in batches if b.end_offset > snapshot[0].offset]
        self._end_offset = batches[-1].end_offset if batches else (snapshot[0].offset if snapshot else 0)
        if self._segments:
            self._active_size = self._path(self._segments[-1]).stat().st_size
        return Loaded(election, batches, snapshot)

    # --- effects --------------------------------------------------------------------------------

    def write_election(self, text: str) -> None:
        write_atomically(self.dir / QUORUM_STATE, text + "\n")

    def append(self, batch: LogBatch) -> None:
        if not self._segments or self._active_size >= self.segment_bytes:
            self._roll(batch.base_offset)
        os.write(self._active_fd(), batch.data)
        self._active_size += len(batch.data)
        self._end_offset = batch.end_offset

    def flush(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def truncate(self, end_offset: int) -> None:
        """Remove batches at or after `end_offset`, durably."""
        for base in [b for b in self._segments if b >= end_offset]:
            self._delete_segment(base)
        if self._segments:
            path = self._path(self._segments[-1])
            keep = sum(len(b.data) for b in split_batches(path.read_bytes()) if b.base_offset < end_offset)
            self._close()
            os.truncate(path, keep)
            fd = os.open(path, os.O_WRONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self._active_size = keep
        _fsync_dir(self.dir)
        self._end_offset = end_offset

    def write_snapshot(self, snapshot_id: OffsetAndEpoch, data: bytes) -> None:
        final = self.dir / filename(snapshot_id)
        part = final.with_name(final.name + ".part")
        with open(part, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, final)
        _fsync_dir(self.dir)
        for p in self.dir.glob("*" + SUFFIX):
            sid = parse_filename(p.name)
            if sid is not None and sid < snapshot_id:
                p.unlink()
        # The next append starts a segment, so that this one can go once a later snapshot covers it.
        self._active_size = self.segment_bytes

    def delete_prefix(self, start_offset: int, reset: bool = False) -> None:
        """Delete segments wholly before `start_offset` (all of them with `reset`)."""
        if reset:
            for base in list(self._segments):
                self._delete_segment(base)
            self._end_offset = start_offset
            return
        for i, base in enumerate(list(self._segments)):
            following = self._segments[i + 1] if i + 1 < len(self._segments) else None
            if following is not None and following <= start_offset:
                self._delete_segment(base)

    def close(self) -> None:
        self._close()

    # --- segments -------------------------------------------------------------------------------

    def _path(self, base: int) -> Path:
        return self.dir / f"{base:020d}{SEGMENT_SUFFIX}"

    def _roll(self, base: int) -> None:
        self.flush()
        self._close()
        self._segments.append(base)
        self._path(base).touch()
        _fsync_dir(self.dir)
        self._active_size = 0

    def _active_fd(self) -> int:
        if self._fd is None:
            self._fd = os.open(self._path(self._segments[-1]), os.O_WRONLY | os.O_APPEND)
        return self._fd

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _delete_segment(self, base: int) -> None:
        if self._segments and base == self._segments[-1]:
            self._close()
        self._segments.remove(base)
        self._path(base).unlink(missing_ok=True)
