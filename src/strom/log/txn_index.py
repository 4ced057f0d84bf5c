"""A segment's transaction index (`.txnindex`): the aborted transactions whose abort marker is
in that segment, in Kafka's layout.

Each entry is 34 bytes, big endian: version i16 (0), producer id i64, first offset i64, last
offset i64 (the abort marker's offset), last stable offset i64. A read_committed fetch asks
for the entries that overlap the offsets it returns, so the client can drop aborted batches.

The file exists only for segments that saw an abort (Kafka creates it lazily too). Entries
are few, so they are read into memory on first use and appended with one write each.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from strom.log.index import fsync_path

_ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = _ENTRY.size
_VERSION = 0


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class TransactionIndex:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: list[AbortedTxn] | None = None
        self._dirty = False

    @property
    def entries(self) -> list[AbortedTxn]:
        if self._entries is None:
            self._entries = _read(self.path)
        return self._entries

    def append(self, txn: AbortedTxn) -> bool:
        """Add `txn` unless an entry at or after its marker is already there (recovery replays
        markers the index may hold already). True if it was written."""
        entries = self.entries
        if entries and txn.last_offset <= entries[-1].last_offset:
            return False
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, _ENTRY.pack(_VERSION, txn.producer_id, txn.first_offset, txn.last_offset,
                                     txn.last_stable_offset))
        finally:
            os.close(fd)
        entries.append(txn)
        self._dirty = True
        return True

    def collect(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        return collect(self.entries, fetch_offset, upper_bound)

    def truncate_to(self, offset: int) -> None:
        """Forget transactions whose marker is at or after `offset` (the log was cut there)."""
        entries = self.entries
        keep = [t for t in entries if t.last_offset < offset]
        if len(keep) == len(entries):
            return
        self._entries = keep
        if keep:
            os.truncate(self.path, len(keep) * ENTRY_SIZE)
        else:
            self.path.unlink(missing_ok=True)
        self._dirty = True

    def flush(self) -> None:
        if self._dirty:
            self._dirty = False
            fsync_path(self.path)


def collect(entries: list[AbortedTxn], fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
    """Entries whose transaction overlaps [fetch_offset, upper_bound), up to and including the
    first whose stable offset reached the bound (a local index's, or a remote segment's)."""
    out = []
    for t in entries:
        if t.last_offset >= fetch_offset and t.first_offset < upper_bound:
            out.append(t)
            if t.last_stable_offset >= upper_bound:
                break
    return out


def _read(path: Path) -> list[AbortedTxn]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    return parse_entries(data)


def parse_entries(data: bytes) -> list[AbortedTxn]:
    """The entries of a `.txnindex` file's bytes; a torn last entry (crash mid-write) is
    ignored, recovery re-adds it from the log."""
    out = []
    for pos in range(0, len(data) - ENTRY_SIZE + 1, ENTRY_SIZE):
        version, pid, first, last, lso = _ENTRY.unpack_from(data, pos)
        if version != _VERSION:
            break
        out.append(AbortedTxn(pid, first, last, lso))
    return out
