"""A segment's sparse offset index (`.index`) and time index (`.timeindex`) in Kafka's layout.

`.index` holds 8-byte entries (offset relative to the segment base: int32 BE, file position:
int32 BE); `.timeindex` holds 12-byte entries (timestamp: int64 BE, relative offset: int32 BE).
Unlike Kafka the files are not preallocated or memory-mapped: entries live in compact arrays
in memory for bisect lookups and are appended to the file, one write per append call. The
write descriptor is opened lazily and closed when the segment stops being active, so an idle
log holds no index descriptors at all.
"""

from __future__ import annotations

import operator
import os
import struct
import sys
import threading
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from itertools import islice
from pathlib import Path
from typing import TypeVar

from strom.log.open_files import OPEN_FILES

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
_LITTLE_ENDIAN = sys.byteorder == "little"
T = TypeVar("T")


def _strictly_increasing(values: Sequence[int]) -> bool:
    return all(map(operator.lt, values, islice(values, 1, None)))


def _non_decreasing(values: Sequence[int]) -> bool:
    return all(map(operator.le, values, islice(values, 1, None)))


def fsync_path(path: Path) -> None:
    """fsync a file through a fresh descriptor (Linux syncs the inode whatever fd is used), so a
    flush thread never races the event loop over a descriptor it may close."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return  # deleted meanwhile: nothing left to make durable
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# fsyncs issued together: the filesystem commits concurrent ones in one journal write, so many
# small files become durable several times faster than one after the other.
FSYNC_THREADS = 16
# Reads of many small files (directories of lazily opened logs, leader epoch files): each is
# mostly a wait on the kernel, but parsing holds the GIL, so a few threads, not sixteen.
READ_THREADS = 4
_NONE_LEFT = object()


def in_parallel(fn: Callable[[T], object], items: Sequence[T], threads: int = FSYNC_THREADS) -> None:
    """fn(item) for each item, `threads` at a time (blocking I/O: fsyncs, small file writes).
    The first exception fn raises is raised here, once the items already begun are done.

    Each thread takes the next item itself: a future per item (an executor's map) cost the
    caller 35-50 us each, most of a shutdown's 100,000 logs that need only a close."""
    if len(items) <= 1 or threads <= 1:
        for item in items:
            fn(item)
        return
    todo = iter(items)
    lock = threading.Lock()
    failed: list[BaseException] = []

    def work() -> None:
        while not failed:
            with lock:
                item = next(todo, _NONE_LEFT)
            if item is _NONE_LEFT:
                return
            try:
                fn(item)
            except BaseException as e:
                failed.append(e)

    workers = [threading.Thread(target=work, name=f"fsync_{i}", daemon=True)
               for i in range(min(threads, len(items)))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if failed:
        raise failed[0]


class _IndexFile:
    entry_size = 0

    def __init__(self, path: Path, base_offset: int, new: bool = False) -> None:
        self.path = Path(path)
        self.base_offset = base_offset
        self._dirty = False  # written since the last flush
        data = b""
        self.existed = False
        if not new:  # a new segment's index cannot exist yet: spare the failing open
            try:
                data = self.path.read_bytes()
                self.existed = True
            except FileNotFoundError:
                pass
        tail = len(data) % self.entry_size
        # A torn last entry means the file is damaged; sanity_check reports it.
        self._whole = tail == 0
        self._load(memoryview(data)[: len(data) - tail])
        # The file itself is made by the first write (or `ensure_file`): an empty segment, as
        # most of 100,000 partitions' segments are, costs one file instead of three.

    # -- subclass hooks
    def _load(self, data: memoryview) -> None:
        raise NotImplementedError

    def _columns(self) -> tuple[array, array]:
        """The two in-memory arrays that hold the entries, one per field."""
        raise NotImplementedError

    def append_many(self, entries: Sequence[tuple[int, int]]) -> None:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._columns()[0])

    # -- shared operations
    def drop_from(self, keep: int) -> None:
        """Forget entries from index `keep` on, in memory and in the file."""
        if keep < len(self):
            for column in self._columns():
                del column[keep:]
            self._truncate_file(keep)

    def reset(self, entries: Sequence[tuple[int, int]]) -> None:
        """Replace the whole index (recovery, rebuild)."""
        self._load(memoryview(b""))
        if self.existed or self._dirty:  # no file yet: the first entry makes it
            self._truncate_file(0)
        self._whole = True
        self.append_many(entries)

    # -- file handling
    def ensure_file(self) -> None:
        """Create the (empty) file if no write has yet: a segment with data keeps its index
        files, so that a restart trusts them instead of rebuilding them."""
        if not self.existed and not self._dirty:
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644))
            self.existed = True
            self._dirty = True  # the next flush makes it durable

    def _open_for_write(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)

    def _writable(self):
        """The write descriptor, from the process's bounded cache of open files."""
        return OPEN_FILES.use(self, self._open_for_write)

    def _write_at(self, data: bytes, entry_index: int) -> None:
        self._dirty = True
        pos = entry_index * self.entry_size
        view = memoryview(data)
        with self._writable() as fd:
            while view:
                n = os.pwrite(fd, view, pos)
                pos += n
                view = view[n:]

    def _truncate_file(self, entries: int) -> None:
        self._dirty = True
        with self._writable() as fd:
            os.ftruncate(fd, entries * self.entry_size)

    def is_full(self, max_index_bytes: int) -> bool:
        return len(self) >= max_index_bytes // self.entry_size

    @property
    def size_in_bytes(self) -> int:
        return len(self) * self.entry_size

    def flush(self) -> None:
        if self._dirty:
            # Cleared first: a write racing this flush sets it again or is covered by the fsync.
            self._dirty = False
            fsync_path(self.path)

    def close(self) -> None:
        """Close the write descriptor; entries stay available for lookups."""
        OPEN_FILES.close(self)

    def rename(self, path: Path) -> None:
        try:
            os.rename(self.path, path)
        except FileNotFoundError:
            pass
        self.path = Path(path)

    def delete(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class OffsetIndex(_IndexFile):
    """Sparse map offset -> file position of the batch holding it."""

    entry_size = _OFFSET_ENTRY.size

    def _load(self, data: memoryview) -> None:
        flat = array("i")
        flat.frombytes(data)
        if _LITTLE_ENDIAN:
            flat.byteswap()
        self._rel = flat[0::2]
        self._pos = flat[1::2]

    def _columns(self) -> tuple[array, array]:
        return self._rel, self._pos

    def __len__(self) -> int:
        return len(self._rel)

    def is_full(self, max_index_bytes: int) -> bool:  # asked at every append: no __len__ call
        return len(self._rel) >= max_index_bytes // self.entry_size

    def entries(self) -> list[tuple[int, int]]:
        base = self.base_offset
        return [(base + r, p) for r, p in zip(self._rel, self._pos, strict=True)]

    def entry(self, i: int) -> tuple[int, int]:
        return self.base_offset + self._rel[i], self._pos[i]

    @property
    def last_entry(self) -> tuple[int, int]:
        """(offset, position) of the last entry, or (base offset, 0) when empty."""
        if not self._rel:
            return self.base_offset, 0
        return self.base_offset + self._rel[-1], self._pos[-1]

    def append(self, offset: int, position: int) -> None:
        self.append_many([(offset, position)])

    def append_many(self, entries: Sequence[tuple[int, int]]) -> None:
        """Add (absolute offset, position) entries, increasing, with one write to the file."""
        if not entries:
            return
        base = self.base_offset
        last = self._rel[-1] if self._rel else -1
        last_pos = self._pos[-1] if self._pos else -1
        data = bytearray()
        rels, poss = [], []
        for offset, position in entries:
            rel = offset - base
            if rel <= last or position <= last_pos:
                raise ValueError(f"index entry ({offset}, {position}) is not after the last one")
            last, last_pos = rel, position
            rels.append(rel)
            poss.append(position)
            data += _OFFSET_ENTRY.pack(rel, position)
        self._write_at(bytes(data), len(self._rel))
        self._rel.extend(rels)
        self._pos.extend(poss)

    def lookup(self, target: int) -> tuple[int, int]:
        """(offset, position) of the largest entry with offset <= target, else (base, 0)."""
        i = bisect_right(self._rel, target - self.base_offset) - 1
        if i < 0:
            return self.base_offset, 0
        return self.base_offset + self._rel[i], self._pos[i]

    def truncate_to(self, offset: int) -> None:
        """Drop entries for offsets >= `offset`."""
        self.drop_from(bisect_left(self._rel, offset - self.base_offset))

    def truncate_to_position(self, position: int) -> None:
        """Drop entries pointing at or beyond `position` of the log."""
        self.drop_from(bisect_left(self._pos, position))

    def sanity_check(self, log_size: int) -> bool:
        """False when the file is damaged: torn entry, entries out of order, or past the log."""
        if not self._whole:
            return False
        if not self._rel:
            return True
        return (
            self._rel[0] >= 0
            and self._pos[0] >= 0
            and self._pos[-1] < log_size
            and _strictly_increasing(self._rel)
            and _strictly_increasing(self._pos)
        )


class TimeIndex(_IndexFile):
    """Sparse map max-timestamp-so-far -> offset of the batch that reached it."""

    entry_size = _TIME_ENTRY.size

    def _load(self, data: memoryview) -> None:
        rows = list(_TIME_ENTRY.iter_unpack(data))
        self._ts = array("q", [r[0] for r in rows])
        self._rel = array("i", [r[1] for r in rows])

    def _columns(self) -> tuple[array, array]:
        return self._ts, self._rel

    def __len__(self) -> int:
        return len(self._ts)

    def is_full(self, max_index_bytes: int) -> bool:
        return len(self._ts) >= max_index_bytes // self.entry_size

    def entries(self) -> list[tuple[int, int]]:
        base = self.base_offset
        return [(t, base + r) for t, r in zip(self._ts, self._rel, strict=True)]

    @property
    def last_entry(self) -> tuple[int, int]:
        """(timestamp, offset) of the last entry, or (-1, base offset) when empty."""
        if not self._ts:
            return -1, self.base_offset
        return self._ts[-1], self.base_offset + self._rel[-1]

    def append(self, timestamp: int, offset: int) -> None:
        self.append_many([(timestamp, offset)])

    def append_many(self, entries: Sequence[tuple[int, int]]) -> None:
        """Add (timestamp, absolute offset) entries with one write; entries whose timestamp does
        not grow past the last one are skipped (Kafka's maybeAppend)."""
        base = self.base_offset
        last_ts = self._ts[-1] if self._ts else -1
        last_rel = self._rel[-1] if self._rel else 0
        data = bytearray()
        tss, rels = [], []
        for timestamp, offset in entries:
            rel = offset - base
            if timestamp <= last_ts:
                continue
            if rel < last_rel:
                raise ValueError(f"time index entry ({timestamp}, {offset}) goes back in offset")
            last_ts, last_rel = timestamp, rel
            tss.append(timestamp)
            rels.append(rel)
            data += _TIME_ENTRY.pack(timestamp, rel)
        if not data:
            return
        self._write_at(bytes(data), len(self._ts))
        self._ts.extend(tss)
        self._rel.extend(rels)

    def lookup(self, timestamp: int) -> tuple[int, int]:
        """(timestamp, offset) of the largest entry with timestamp <= target, else (-1, base).

        Every batch before the one holding the returned offset has timestamps <= that entry's,
        so a search for `timestamp` can start at that offset.
        """
        i = bisect_right(self._ts, timestamp) - 1
        if i < 0:
            return -1, self.base_offset
        return self._ts[i], self.base_offset + self._rel[i]

    def truncate_to(self, offset: int) -> None:
        """Drop entries for offsets >= `offset`."""
        self.drop_from(bisect_left(self._rel, offset - self.base_offset))

    def sanity_check(self, log_size: int) -> bool:
        """False when the file is damaged: torn entry or entries out of order."""
        if not self._whole:
            return False
        if not self._ts:
            return True
        if log_size == 0:
            return False  # entries for an empty log
        return self._rel[0] >= 0 and _non_decreasing(self._ts) and _non_decreasing(self._rel)
