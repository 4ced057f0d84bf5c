"""One log segment: `<base offset>.log` plus its `.index` and `.timeindex`, as Kafka lays them out.

Writes go straight to an `os.open` descriptor with `pwrite`, so an acknowledged append is in the
page cache (and survives kill -9) before `append` returns; durability against power loss is
`flush()`'s job. Reads never decode records: they bisect the sparse offset index and then hop
over batch headers (`pread` of small chunks) to the batch that holds the wanted offset.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

from strom.log.config import INT_MAX, LogConfig
from strom.log.index import OffsetIndex, TimeIndex
from strom.log.open_files import OPEN_FILES, Pin
from strom.log.txn_index import TransactionIndex
from strom.protocol.errors import StorageError
from strom.protocol.records import (
    CURRENT_MAGIC,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    NO_TIMESTAMP,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    iter_records,
    peek_offset_and_size,
    scan_valid_prefix,
)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
DELETED_SUFFIX = ".deleted"
SEGMENT_FILE_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)

# Fields of a HEADER tuple (see strom.protocol.records): the scan loops use raw tuples, which
# are several times cheaper than building BatchHeader objects.
_BASE, _LENGTH, _MAGIC, _ATTRIBUTES, _LAST_DELTA, _MAX_TS = 0, 1, 3, 5, 6, 8
_MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD

# Header scans read this much at a time: enough for several small batches per syscall.
_SCAN_CHUNK = 16 * 1024
# Recovery reads the log in chunks this big rather than the whole segment at once.
_RECOVER_CHUNK = 8 * 1024 * 1024


def segment_name(base_offset: int) -> str:
    """Kafka's file stem: the base offset as 20 zero-padded digits."""
    return f"{base_offset:020d}"


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def scan_headers(fd: int, start: int, end: int, read: list | None = None) -> Iterator[tuple[int, tuple]]:
    """(position, HEADER tuple) of each batch of file `fd` from `start` up to `end`, stopping at
    the first header that is not a plausible v2 batch or runs past `end`. `read`, when given,
    holds [bytes, position] of the chunk last read (a small fetch's batches may be in it)."""
    pos = start
    buf = b""
    buf_pos = start
    while end - pos >= HEADER_SIZE:
        off = pos - buf_pos
        if off + HEADER_SIZE > len(buf):
            buf = os.pread(fd, min(_SCAN_CHUNK, end - pos), pos)
            buf_pos, off = pos, 0
            if read is not None:
                read[:] = buf, pos
            if len(buf) < HEADER_SIZE:
                return
        h = HEADER.unpack_from(buf, off)
        length = h[_LENGTH]
        if h[_MAGIC] != CURRENT_MAGIC or length < _MIN_BATCH_LENGTH or pos + length + LOG_OVERHEAD > end:
            return
        yield pos, h
        pos += length + LOG_OVERHEAD


class LogSegment:
    """A `.log` file of whole batches and its two sparse indexes.

    `LogSegment(dir, base_offset, config)` opens the segment's files, creating missing ones
    (`create=True` insists the log file is new; `unmade=True` is a new segment whose file is
    made at its first use, see Log.create). Loaded indexes are trusted only after
    `sanity_check()`; otherwise call `recover()`.
    """

    def __init__(
        self,
        dir: Path,
        base_offset: int,
        config: LogConfig,
        *,
        now_ms: int | None = None,
        create: bool = False,
        unmade: bool = False,
    ) -> None:
        self.dir = Path(dir)
        self.base_offset = base_offset
        self.config = config
        stem = segment_name(base_offset)
        self.log_path = self.dir / (stem + LOG_SUFFIX)
        self._path = self.log_path  # where the file is now (`delete` renames it)
        self._made = not unmade  # the log file exists
        flags = os.O_RDWR | os.O_CREAT | (os.O_EXCL if create else 0)
        try:
            if unmade:
                self.size = 0
            else:
                with OPEN_FILES.use(self, lambda: os.open(self.log_path, flags, 0o644)) as fd:
                    self.size = os.fstat(fd).st_size
            self.offset_index = OffsetIndex(self.dir / (stem + INDEX_SUFFIX), base_offset, new=create)
            self.time_index = TimeIndex(self.dir / (stem + TIME_INDEX_SUFFIX), base_offset, new=create)
            self.txn_index = TransactionIndex(self.dir / (stem + TXN_INDEX_SUFFIX))
        except BaseException:
            OPEN_FILES.close(self)
            raise
        # Segment age for segment.ms counts from creation, or from loading (as Kafka's `created`).
        self.created_ms = now_ms if now_ms is not None else _wall_ms()
        # segment.jitter.ms: each segment rolls up to this much before segment.ms, so that
        # many partitions' segments do not all roll at once (Kafka's rollJitterMs).
        jitter = min(config.segment_jitter_ms, config.segment_ms)
        self.roll_jitter_ms = random.randrange(jitter) if jitter > 0 else 0
        self.max_timestamp, self.offset_of_max_timestamp = self.time_index.last_entry
        self._next_offset: int | None = base_offset if self.size == 0 else None
        self._bytes_since_index = self.size - self.offset_index.last_entry[1]
        # (position, base offset) of the batch appended last since this segment was loaded or
        # cut: reading at or past it starts there, not at its index entry (see _scan_start).
        self._last_appended: tuple[int, int] | None = None
        self.deleted = False
        self.closed = False
        self.created_here = False  # a log's first segment, made when the log was

    def __repr__(self) -> str:
        return f"LogSegment({self.log_path}, size={self.size})"

    # -- the log file's descriptor: opened on use, kept in the process's bounded cache

    def _open(self) -> int:
        if self.closed:
            raise StorageError(f"segment {self._path} is closed")
        if self._made:
            return os.open(self._path, os.O_RDWR)
        # An unmade segment's first use: its log writes it (Log.make_files made the directory).
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        self._made = True
        return fd

    def _file(self):
        """`with segment._file() as fd:` the log file, open (and kept open) for the block."""
        return OPEN_FILES.use(self, self._open)

    def pin(self) -> Pin:
        """The log file's descriptor, held open until the pin is released or collected (a
        fetch region sent after the handler returns)."""
        return OPEN_FILES.pin(self, self._open)

    @property
    def fd(self) -> int:
        """The cached descriptor, unpinned: valid only until another file is opened in this
        process (for tests and tools; the broker uses `_file()`, `pin()` or `dup_fd()`)."""
        with self._file() as fd:
            return fd

    def dup_fd(self) -> int:
        """A descriptor of the caller's own (the cleaner reads segments in a thread)."""
        with self._file() as fd:
            return os.dup(fd)

    # -- state

    @property
    def next_offset(self) -> int:
        """Offset after the last batch (the base offset when empty)."""
        if self._next_offset is None:
            self.load_tail()
        assert self._next_offset is not None
        return self._next_offset

    @property
    def largest_timestamp(self) -> int:
        """Max record timestamp, or the file's mtime when no batch carries one (retention)."""
        if self.max_timestamp >= 0:
            return self.max_timestamp
        return self.last_modified_ms

    @property
    def last_modified_ms(self) -> int:
        if not self._made:
            return self.created_ms
        with self._file() as fd:
            return os.fstat(fd).st_mtime_ns // 1_000_000

    def _small_unindexed(self) -> bool:
        """Too small for an index entry, and no index file made yet."""
        return (self.size <= self.config.index_interval_bytes and not self.offset_index.existed
                and not self.time_index.existed)

    def index_full(self) -> bool:
        max_bytes = self.config.segment_index_bytes
        return self.offset_index.is_full(max_bytes) or self.time_index.is_full(max_bytes)

    def sanity_check(self, next_base_offset: int | None = None, last: bool = False) -> bool:
        """Whether the loaded indexes can be trusted for this log file (no re-scan needed).

        `next_base_offset` (the following segment's base) bounds the offsets entries may name;
        `last`: the log's last segment, whose end load_tail finds by scanning past the last
        offset index entry.
        """
        if self.size == 0:
            return len(self.offset_index) == 0 and len(self.time_index) == 0
        if not (self.offset_index.existed and self.time_index.existed):
            return last and self._small_unindexed()  # closed so (see seal): load_tail scans it all
        if not (self.offset_index.sanity_check(self.size) and self.time_index.sanity_check(self.size)):
            return False
        index = self.offset_index
        if len(index):
            # The first and last entries must point at the batch holding their offset; this
            # catches plausible-looking garbage that passed the ordering checks.
            for i in (0, len(index) - 1):
                offset, position = index.entry(i)
                with self._file() as fd:
                    head = os.pread(fd, HEADER_SIZE, position)
                if len(head) < HEADER_SIZE:
                    return False
                h = HEADER.unpack_from(head)
                if h[_MAGIC] != CURRENT_MAGIC or not h[_BASE] <= offset <= h[_BASE] + h[_LAST_DELTA]:
                    return False
        if next_base_offset is not None:
            if max(self.offset_index.last_entry[0], self.time_index.last_entry[1]) >= next_base_offset:
                return False
        return True

    def load_tail(self) -> bool:
        """Find the next offset and exact max timestamp by scanning from the last index entry.

        Returns False if the batches do not end exactly at the end of the file (torn tail).
        """
        _, start = self.offset_index.last_entry
        next_offset = self.base_offset
        max_ts, max_off = self.time_index.last_entry
        end = start
        for pos, h in self._headers(start, self.size):
            if h[_MAX_TS] > max_ts:
                max_ts, max_off = h[_MAX_TS], h[_BASE]
            next_offset = h[_BASE] + h[_LAST_DELTA] + 1
            end = pos + h[_LENGTH] + LOG_OVERHEAD
        self._next_offset = next_offset
        self.max_timestamp, self.offset_of_max_timestamp = max_ts, max_off
        self._bytes_since_index = self.size - start
        return end == self.size

    # -- writing

    def append(
        self,
        buf,
        batches: list[tuple[int, BatchHeader]],
        first_offset: int,
        log_append_time: int | None = None,
        keep_offsets: bool = False,
    ) -> tuple[int, int, int]:
        """Write an offset-assigned record set in one write and index it.

        `batches` are (position in buf, header) from validation (offsets in those headers are
        stale; they are recomputed from `first_offset`). Returns (last offset, max timestamp of
        the set, base offset of the batch holding it). Cost is per batch, never per record.
        `keep_offsets`: the headers' own base offsets are right (a follower copying its leader,
        whose compacted batches may leave gaps).
        """
        start = self.size
        self._write(buf, start)
        self.size = start + len(buf)

        config = self.config
        interval = config.index_interval_bytes
        since = self._bytes_since_index
        max_ts, max_off = self.max_timestamp, self.offset_of_max_timestamp
        set_max, set_off = NO_TIMESTAMP, first_offset
        entries: list[tuple[int, int]] = []
        time_entries: list[tuple[int, int]] = []
        index_room = -1  # the indexes' room, read only when an entry is due (most small appends add none)
        offset = first_offset
        last_pos = last_base = -1
        for pos, header in batches:
            if keep_offsets:
                offset = header.base_offset
            last_pos, last_base = pos, offset
            ts = header.max_timestamp if log_append_time is None else log_append_time
            if ts > set_max:
                set_max, set_off = ts, offset
            if ts > max_ts:
                max_ts, max_off = ts, offset
            if since > interval:
                since = 0
                if index_room < 0:
                    index_room = config.segment_index_bytes // OffsetIndex.entry_size - len(self.offset_index)
                    time_room = config.segment_index_bytes // TimeIndex.entry_size - len(self.time_index)
                    last_time_ts = self.time_index.last_entry[0]
                if len(entries) < index_room:
                    entries.append((offset, start + pos))
                if max_ts > last_time_ts and len(time_entries) < time_room:
                    time_entries.append((max_ts, max_off))
                    last_time_ts = max_ts
            since += header.batch_length + LOG_OVERHEAD
            offset += header.last_offset_delta + 1
        indexed = len(self.offset_index), len(self.time_index)
        try:
            if entries:
                self.offset_index.append_many(entries)
            if time_entries:
                self.time_index.append_many(time_entries)
        except OSError as e:
            self._undo_append(start, *indexed)
            raise StorageError(f"index write for {self.log_path} failed: {e}") from e
        self._bytes_since_index = since
        self.max_timestamp, self.offset_of_max_timestamp = max_ts, max_off
        if last_pos >= 0:
            self._last_appended = (start + last_pos, last_base)
        self._next_offset = offset
        return offset - 1, set_max, set_off

    def _undo_append(self, start: int, offset_entries: int, time_entries: int) -> None:
        """Take back a record set whose indexing failed (a full disk): the log may not hold
        batches its owner did not count."""
        self.offset_index.drop_from(offset_entries)
        self.time_index.drop_from(time_entries)
        with self._file() as fd:
            os.ftruncate(fd, start)
        self.size = start
        self._last_appended = None

    def _write(self, buf, position: int) -> None:
        # The descriptor is pinned by hand, not with `_file()`: once per append, the generator
        # context manager cost as much as the write's bookkeeping.
        fd = OPEN_FILES.acquire(self, self._open)
        try:
            n = os.pwrite(fd, buf, position)
            if n < len(buf):  # a short write: the rest, piece by piece
                view = memoryview(buf)[n:]
                position += n
                while view:
                    n = os.pwrite(fd, view, position)
                    position += n
                    view = view[n:]
        except OSError as e:
            # Never leave half a record set behind: readers and recovery would see a torn batch.
            try:
                os.ftruncate(fd, self.size)
            except OSError:
                pass
            raise StorageError(f"write to {self.log_path} failed: {e}") from e
        finally:
            OPEN_FILES.release(self)

    def seal(self, closing: bool = False) -> None:
        """Stop being the active segment: record the final max timestamp in the time index (so
        a reload knows it without a scan) and release the index write descriptors.

        `closing`: the log's active segment, at the log's close. One too small for an index
        entry that has no index files yet is left without them: the next start scans it whole
        to find its end anyway (load_tail), which yields all the files would hold, and making
        two files per log was most of a clean stop of 20,000 logs holding a record each."""
        if self.deleted or self.closed:
            return
        if not (closing and self._small_unindexed()):
            if self.max_timestamp > self.time_index.last_entry[0]:
                self.time_index.append(self.max_timestamp, self.offset_of_max_timestamp)
            if self.size:
                self.offset_index.ensure_file()
                self.time_index.ensure_file()
        self.offset_index.close()
        self.time_index.close()

    def flush(self) -> None:
        """fsync the log and both indexes (blocking; safe to run in a thread)."""
        if self.closed or not self._made:
            return
        with self._file() as fd:
            os.fsync(fd)
        self.offset_index.flush()
        self.time_index.flush()
        self.txn_index.flush()

    # -- reading

    def _headers(self, start: int, end: int) -> Iterator[tuple[int, tuple]]:
        if end - start < HEADER_SIZE:
            return  # nothing to read (an empty segment's file is not even opened)
        with self._file() as fd:
            yield from scan_headers(fd, start, end)

    def _scan_start(self, offset: int) -> int:
        """Where the batches to look through for `offset` start: at its index entry, or at the
        batch appended last when that starts at or before `offset` (no batch before it can
        hold `offset`): a consumer or follower at the end of the log reads one header, not
        the walk from the entry up to index.interval.bytes back."""
        _, start = self.offset_index.lookup(offset)
        last = self._last_appended
        if last is not None and last[1] <= offset and last[0] > start:
            return last[0]
        return start

    def _first_batch(self, offset: int, by_last: bool, read: list | None = None) -> tuple[int, tuple] | None:
        """(position, header tuple) of the first batch whose last offset (`by_last`) or base
        offset is >= `offset` (`read`: see scan_headers). Every fetch asks: the descriptor is
        pinned by hand, not with the generator context manager `_headers` uses."""
        start, end = self._scan_start(offset), self.size
        if end - start < HEADER_SIZE:
            return None
        fd = OPEN_FILES.acquire(self, self._open)
        try:
            for pos, h in scan_headers(fd, start, end, read):
                if (h[_BASE] + h[_LAST_DELTA] if by_last else h[_BASE]) >= offset:
                    return pos, h
        finally:
            OPEN_FILES.release(self)
        return None

    def locate(self, offset: int) -> tuple[int, tuple] | None:
        """(position, header tuple) of the first batch whose last offset is >= `offset`."""
        return self._first_batch(offset, True)

    def position_of(self, offset: int) -> int:
        """Position of the first batch with base offset >= `offset` (the size if none)."""
        found = self._first_batch(offset, False)
        return self.size if found is None else found[0]

    def read(
        self,
        start_offset: int,
        max_size: int,
        max_position: int | None = None,
        min_one_message: bool = True,
    ) -> tuple[int, int] | None:
        """(position, size) of the bytes to return for a fetch at `start_offset`, or None when
        no batch here holds an offset >= `start_offset`.

        Starts at the batch holding `start_offset`; ends at `max_size` bytes (possibly cutting a
        batch, as Kafka does) but never past `max_position`. With `min_one_message` the first
        batch is returned whole even above `max_size`; without it a first batch that does not
        fit gives an empty slice (Kafka replaces such an incomplete set with an empty one).
        """
        found = self.read_region(start_offset, max_size, max_position, min_one_message)
        return None if found is None else found[:2]

    def read_region(self, start_offset: int, max_size: int, max_position: int | None = None,
                    min_one_message: bool = True) -> tuple[int, int, bytes | None] | None:
        """As `read`, plus the region's bytes when looking for its first batch read them all
        already (a consumer at the end of the log: one read of the file, not two)."""
        read: list = []
        found = self._first_batch(start_offset, True, read)
        if found is None:
            return None
        pos, h = found
        end = self.size if max_position is None else min(max_position, self.size)
        if pos >= end:
            return pos, 0, None
        first_size = h[_LENGTH] + LOG_OVERHEAD
        if first_size > max_size:
            size = min(end - pos, first_size) if min_one_message else 0
        else:
            size = min(end - pos, max_size)
        data = None
        if read and size:
            chunk, at = read
            if pos + size <= at + len(chunk):
                data = chunk[pos - at:pos - at + size]
        return pos, size, data

    def read_batch(self, position: int, size: int) -> bytes:
        with self._file() as fd:
            return os.pread(fd, size, position)

    def find_offset_by_timestamp(self, timestamp: int, start_offset: int = 0) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after `start_offset` with a timestamp
        >= `timestamp`, or None. Decodes only the one batch that holds the answer."""
        start_offset = max(start_offset, self.base_offset)
        _, from_offset = self.time_index.lookup(timestamp)
        _, start = self.offset_index.lookup(max(from_offset, start_offset))
        for pos, h in self._headers(start, self.size):
            if h[_BASE] + h[_LAST_DELTA] < start_offset or h[_MAX_TS] < timestamp:
                continue
            if h[_ATTRIBUTES] & TIMESTAMP_TYPE_MASK:
                return max(h[_BASE], start_offset), h[_MAX_TS]  # every record has that time
            batch = self.read_batch(pos, h[_LENGTH] + LOG_OVERHEAD)
            for record in iter_records(batch):
                if record.offset >= start_offset and record.timestamp >= timestamp:
                    return record.offset, record.timestamp
        return None

    def max_timestamp_record(self) -> tuple[int, int] | None:
        """(timestamp, offset) of the first record carrying this segment's max timestamp."""
        if self.max_timestamp < 0:
            return None
        found = self.locate(self.offset_of_max_timestamp)
        if found is not None:
            pos, h = found
            if h[_ATTRIBUTES] & TIMESTAMP_TYPE_MASK:
                return h[_MAX_TS], h[_BASE]
            for record in iter_records(self.read_batch(pos, h[_LENGTH] + LOG_OVERHEAD)):
                if record.timestamp == self.max_timestamp:
                    return record.timestamp, record.offset
        return self.max_timestamp, self.offset_of_max_timestamp

    # -- recovery and truncation

    def recover(self, max_message_bytes: int) -> int:
        """Re-validate every batch (CRC included), cut a torn or corrupt tail and rebuild both
        indexes. Returns the number of bytes truncated."""
        with self._file() as fd:
            return self._recover(fd, max_message_bytes)

    def _recover(self, fd: int, max_message_bytes: int) -> int:
        file_size = os.fstat(fd).st_size
        base = self.base_offset
        config = self.config
        interval = config.index_interval_bytes
        index_room = config.segment_index_bytes // OffsetIndex.entry_size
        time_room = config.segment_index_bytes // TimeIndex.entry_size
        # A length field beyond this is corruption, not a batch to read into memory.
        limit = max(max_message_bytes, _RECOVER_CHUNK)
        entries: list[tuple[int, int]] = []
        time_entries: list[tuple[int, int]] = []
        since = 0
        max_ts, max_off = NO_TIMESTAMP, base
        last_time_ts = NO_TIMESTAMP
        next_offset = base
        pos = 0
        need = _RECOVER_CHUNK
        while pos < file_size:
            chunk = os.pread(fd, min(need, file_size - pos), pos)
            if not chunk:
                break
            batches, valid = scan_valid_prefix(chunk)
            bad = False
            for p, h in batches:
                if (
                    h.base_offset < next_offset
                    or h.last_offset_delta < 0
                    or h.last_offset - base > INT_MAX
                ):
                    valid, bad = p, True
                    break
                if h.max_timestamp > max_ts:
                    max_ts, max_off = h.max_timestamp, h.base_offset
                if since > interval:
                    since = 0
                    if len(entries) < index_room:
                        entries.append((h.base_offset, pos + p))
                    if max_ts > last_time_ts and len(time_entries) < time_room:
                        time_entries.append((max_ts, max_off))
                        last_time_ts = max_ts
                since += h.size
                next_offset = h.last_offset + 1
            reaches_eof = pos + len(chunk) >= file_size
            pos += valid
            need = _RECOVER_CHUNK
            if bad or valid == len(chunk):
                if bad:
                    break
                continue
            if reaches_eof:
                break  # what is left up to the end of the file is torn or corrupt
            if valid:
                continue  # re-read from the batch the chunk boundary cut
            # Nothing valid at the start of a chunk that does not reach EOF: a batch bigger
            # than the chunk, or corruption.
            if len(chunk) >= HEADER_SIZE and chunk[MAGIC_OFFSET] == CURRENT_MAGIC:
                _, size = peek_offset_and_size(chunk)
                if len(chunk) < size <= limit:
                    need = size
                    continue
            break
        truncated = file_size - pos
        if truncated:
            os.ftruncate(fd, pos)
        self.size = pos
        self._last_appended = None
        if max_ts > last_time_ts:
            time_entries.append((max_ts, max_off))
        self.offset_index.reset(entries)
        self.time_index.reset(time_entries)
        self.txn_index.truncate_to(next_offset)  # markers past the cut are gone too
        self.max_timestamp, self.offset_of_max_timestamp = max_ts, max_off
        self._next_offset = next_offset
        self._bytes_since_index = since
        return truncated

    def truncate_to(self, offset: int) -> int:
        """Remove the batch holding `offset` and everything after it; returns bytes removed."""
        found = self.locate(offset)
        if found is None:
            return 0
        pos, h = found
        removed = self.size - pos
        with self._file() as fd:
            os.ftruncate(fd, pos)
        self.size = pos
        self._last_appended = None
        self.offset_index.truncate_to_position(pos)
        self.time_index.truncate_to(h[_BASE])
        self.txn_index.truncate_to(h[_BASE])
        # Rare path (follower truncation): recompute the max timestamp exactly.
        max_ts, max_off = NO_TIMESTAMP, self.base_offset
        next_offset = self.base_offset
        for _, hh in self._headers(0, self.size):
            if hh[_MAX_TS] > max_ts:
                max_ts, max_off = hh[_MAX_TS], hh[_BASE]
            next_offset = hh[_BASE] + hh[_LAST_DELTA] + 1
        self.max_timestamp, self.offset_of_max_timestamp = max_ts, max_off
        self._next_offset = next_offset
        self._bytes_since_index = self.size - self.offset_index.last_entry[1]
        return removed

    # -- lifecycle

    def _paths(self) -> list[Path]:
        stem = self.dir / segment_name(self.base_offset)
        return [stem.with_name(stem.name + suffix) for suffix in SEGMENT_FILE_SUFFIXES]

    def delete(self) -> None:
        """Rename the files to `*.deleted` (Kafka's first step of deletion). In-flight fetch
        regions hold pins of the log descriptor, so they keep working until they are sent."""
        if self.deleted:
            return
        self.deleted = True
        self.offset_index.close()
        self.time_index.close()
        for path in self._paths():
            try:
                os.rename(path, path.with_name(path.name + DELETED_SUFFIX))
                if path == self.log_path:
                    self._path = path.with_name(path.name + DELETED_SUFFIX)
            except FileNotFoundError:
                pass
            except OSError:
                # A full disk can refuse even a rename; the space is what is wanted back, so
                # unlink at once (open descriptors keep serving in-flight reads).
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)

    def purge(self) -> None:
        """Close the descriptor and unlink the (renamed) files."""
        if not self.deleted:
            self.delete()
        self._close_fd()
        for path in self._paths():
            try:
                os.unlink(path.with_name(path.name + DELETED_SUFFIX))
            except FileNotFoundError:
                pass

    def close(self, active: bool = False) -> None:
        if self.closed:
            return
        self.seal(closing=active)
        self._close_fd()

    def _close_fd(self) -> None:
        if not self.closed:
            self.closed = True
            self.offset_index.close()
            self.time_index.close()
            OPEN_FILES.close(self)
