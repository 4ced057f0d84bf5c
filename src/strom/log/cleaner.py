"""Log compaction for `cleanup.policy=compact` (and `compact,delete`): Kafka's LogCleaner.

Each pass over a log keeps, below the first uncleanable offset, only the latest record of
every key:

1. Pick the filthiest log (`LogCleaner.grab_filthiest`, on the event loop): the compacted log
   whose dirty bytes (from the cleaner checkpoint up to the first uncleanable segment) over its
   total bytes is largest and above `min.cleanable.dirty.ratio`, or one whose oldest dirty
   record is older than `max.compaction.lag.ms`, or one with tombstones whose delete horizon
   has passed (a Strom addition: Kafka waits for the ratio even then). The active segment,
   segments with records younger than `min.compaction.lag.ms`, and anything at or above the
   high watermark (Kafka's last stable offset) are never cleaned.
2. In a worker thread (`Cleaner.clean`): build the key -> latest offset map of the dirty
   section, then re-copy every segment from the start of the log up to the end of the map,
   in groups whose original sizes fit `segment.bytes`, into `<base>.log.cleaned` files with
   their indexes, fsynced. Offsets never change (gaps are what compaction leaves).
3. Back on the loop, each group is swapped in (`Log.replace_segments`: `.cleaned` -> `.swap`
   -> old segments `.deleted` -> final names), so a crash leaves either the old segments or
   the new one. The cleaner checkpoint (`cleaner-offset-checkpoint`) then records where the
   next pass starts.

Record-level rules (Kafka's): a record survives if it is past the end of the offset map, or it
is the latest for its key and either has a value or is a tombstone whose batch's delete
horizon has not passed. The first pass that keeps a tombstone stamps its batch with a delete
horizon (`now + delete.retention.ms`, attribute bit 6 and the base timestamp, as KIP-534),
so consumers that read up to the dirty section have that long to see the delete. Records
without a key cannot be compacted and are dropped, as Kafka does. Aborted transactional data
is dropped; a transaction marker stays until no batch of its transaction is left and its own
delete horizon has passed; the batch holding an active idempotent producer's last sequence is
kept, if need be with no records.

A batch whose records all survive is copied byte for byte. Otherwise it is re-encoded with
`build_batch`, keeping the base offset, last offset delta, producer id/epoch/sequence,
leader epoch, timestamp type, record timestamps and the source batch's compression codec.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from crc32c import crc32c

from strom.log.checkpoint import read_checkpoint
from strom.log.config import LogConfig
from strom.log.index import OffsetIndex, TimeIndex, fsync_path
from strom.log.log import CLEANED_SUFFIX, Log, wall_clock_ms
from strom.log.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SEGMENT_FILE_SUFFIXES,
    TIME_INDEX_SUFFIX,
    LogSegment,
    scan_headers,
    segment_name,
)
from strom.protocol import compression
from strom.protocol.records import (
    COMPRESSION_MASK,
    CONTROL_ABORT,
    CONTROL_COMMIT,
    CONTROL_MASK,
    CRC_START,
    HEADER_SIZE,
    LOG_OVERHEAD,
    NO_TIMESTAMP,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    BatchHeader,
    Record,
    build_batch,
    control_type,
    iter_records,
    read_header,
)

log = logging.getLogger(__name__)

CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
DELETE_HORIZON_MASK = 0x40  # attribute bit 6: the base timestamp is the delete horizon

# Bytes one offset-map entry is charged against log.cleaner.dedupe.buffer.size: the key itself
# plus Python's dict slot, key object and offset int. Kafka charges 24 (MD5 + offset); Strom
# keeps exact keys, so there is no hash-collision risk, at a few times the memory per key.
MAP_ENTRY_OVERHEAD = 100
_READ_CHUNK = 1 << 20
_WRITE_CHUNK = 1 << 20
_PATCH = struct.Struct(">hiqq")  # attributes, lastOffsetDelta, baseTimestamp, maxTimestamp
_EPOCH = struct.Struct(">i")
_CRC = struct.Struct(">I")
# Fields of the HEADER tuples scan_headers yields.
_BASE, _LENGTH, _ATTRIBUTES, _PRODUCER_ID = 0, 1, 5, 9

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class CleanerConfig:
    """The broker's log.cleaner.* settings (Kafka's CleanerConfig)."""

    enable: bool = True  # log.cleaner.enable
    threads: int = 1  # log.cleaner.threads
    dedupe_buffer_size: int = 134217728  # log.cleaner.dedupe.buffer.size, shared by all threads
    io_buffer_load_factor: float = 0.9  # log.cleaner.io.buffer.load.factor
    backoff_ms: int = 15000  # log.cleaner.backoff.ms: sleep when no log needs cleaning

    @property
    def map_capacity_bytes(self) -> int:
        return int(self.dedupe_buffer_size / max(1, self.threads) * self.io_buffer_load_factor)


class CleaningAborted(Exception):
    """The log went away (deleted, truncated, offline, retention) or the broker is stopping."""


# --- the offset map -------------------------------------------------------------------------


class OffsetMap:
    """Key -> offset of its latest record in the dirty section, bounded in memory."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self.latest_offset = -1  # last offset of the last batch read into the map
        self._map: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._map)

    @property
    def full(self) -> bool:
        return self.used_bytes >= self.capacity_bytes

    def put(self, key: bytes, offset: int) -> None:
        if key not in self._map:
            self.used_bytes += len(key) + MAP_ENTRY_OVERHEAD
        self._map[key] = offset

    def get(self, key: bytes) -> int:
        return self._map.get(key, -1)


# --- transactions -----------------------------------------------------------------------------


class _Transactions:
    """Which transactional batches were aborted, found from the markers in the log (the
    transaction index lists aborts only, and a cleaned segment no longer has its entries),
    and which markers still have data of their transaction left (Kafka's
    CleanedTransactionMetadata)."""

    def __init__(self) -> None:
        self.markers: dict[int, tuple[list[int], list[int]]] = {}  # pid -> (offsets, types)
        self.open_first: dict[int, int] = {}  # pid -> first offset of its undecided transaction
        self._read_committed: set[int] = set()  # pids with data read since their last marker
        self._read_aborted: set[int] = set()

    def scan(self, source: SourceSegment) -> None:
        """Feed every segment of the log, in offset order, before cleaning. Reads batch headers;
        only transaction markers (a few bytes each) are decoded."""
        for pos, h in scan_headers(source.fd, 0, source.size):
            attributes = h[_ATTRIBUTES]
            if attributes & CONTROL_MASK:
                pid = h[_PRODUCER_ID]
                offsets, types = self.markers.setdefault(pid, ([], []))
                offsets.append(h[_BASE])
                types.append(control_type(os.pread(source.fd, h[_LENGTH] + LOG_OVERHEAD, pos)))
                self.open_first.pop(pid, None)
            elif attributes & TRANSACTIONAL_MASK:
                self.open_first.setdefault(h[_PRODUCER_ID], h[_BASE])

    @property
    def last_stable_offset(self) -> int | None:
        """First offset of the earliest undecided transaction (Kafka's LSO), if any."""
        return min(self.open_first.values(), default=None)

    def aborted(self, header: BatchHeader) -> bool:
        offsets, types = self.markers.get(header.producer_id, ((), ()))
        i = bisect_right(offsets, header.base_offset)
        return i < len(offsets) and types[i] == CONTROL_ABORT

    def on_data_batch(self, header: BatchHeader) -> bool:
        """While cleaning: note a transactional batch; True if it is aborted (drop it)."""
        if not header.attributes & TRANSACTIONAL_MASK:
            return False
        if self.aborted(header):
            self._read_aborted.add(header.producer_id)
            return True
        self._read_committed.add(header.producer_id)
        return False

    def on_marker(self, header: BatchHeader, kind: int) -> bool:
        """While cleaning: True if the marker's transaction has no batch left before it."""
        pid = header.producer_id
        if kind == CONTROL_ABORT:
            had_data = pid in self._read_aborted
            self._read_aborted.discard(pid)
            return not had_data
        if kind == CONTROL_COMMIT:
            had_data = pid in self._read_committed
            self._read_committed.discard(pid)
            return not had_data
        return False


# --- reading and writing segments -------------------------------------------------------------


@dataclass(slots=True)
class SourceSegment:
    """A segment as the cleaner thread sees it: its own duplicate descriptor (the loop may
    close the segment's) and the size it had when the job was planned."""

    segment: LogSegment
    base_offset: int
    size: int
    fd: int


def _iter_batches(fd: int, size: int) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Every whole batch of a segment file, read in large chunks."""
    pos = 0
    while pos < size:
        chunk = os.pread(fd, min(_READ_CHUNK, size - pos), pos)
        if len(chunk) < HEADER_SIZE:
            return
        view = memoryview(chunk)
        off = 0
        while len(chunk) - off >= HEADER_SIZE:
            header = read_header(view, off)
            if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
                return
            if off + header.size > len(chunk):
                if off == 0:  # one batch bigger than the chunk
                    batch = os.pread(fd, header.size, pos)
                    if len(batch) < header.size:
                        return
                    yield header, memoryview(batch)
                    off = header.size
                break
            yield header, view[off : off + header.size]
            off += header.size
        if off == 0:
            return
        pos += off


class _CleanedSegment:
    """`<base>.log.cleaned` and its `.index.cleaned` / `.timeindex.cleaned`, written the way
    LogSegment.append indexes batches."""

    def __init__(self, dir: Path, base_offset: int, config: LogConfig) -> None:
        stem = dir / segment_name(base_offset)
        self.paths = [stem.with_name(stem.name + s + CLEANED_SUFFIX) for s in SEGMENT_FILE_SUFFIXES]
        for path in self.paths:
            path.unlink(missing_ok=True)  # a leftover of an aborted pass
        self.base_offset = base_offset
        self.config = config
        self.fd = os.open(stem.with_name(stem.name + LOG_SUFFIX + CLEANED_SUFFIX),
                          os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.size = 0
        self._buf = bytearray()
        self._since_index = 0
        self._entries: list[tuple[int, int]] = []
        self._time_entries: list[tuple[int, int]] = []
        self._max_ts, self._max_off = NO_TIMESTAMP, base_offset
        self._last_time_ts = NO_TIMESTAMP
        self._index_room = config.segment_index_bytes // OffsetIndex.entry_size
        self._time_room = config.segment_index_bytes // TimeIndex.entry_size

    def append(self, batch, base_offset: int, max_timestamp: int) -> None:
        if max_timestamp > self._max_ts:
            self._max_ts, self._max_off = max_timestamp, base_offset
        if self._since_index > self.config.index_interval_bytes:
            self._since_index = 0
            if len(self._entries) < self._index_room:
                self._entries.append((base_offset, self.size))
            if self._max_ts > self._last_time_ts and len(self._time_entries) < self._time_room:
                self._time_entries.append((self._max_ts, self._max_off))
                self._last_time_ts = self._max_ts
        self._buf += batch
        self.size += len(batch)
        self._since_index += len(batch)
        if len(self._buf) >= _WRITE_CHUNK:
            self._write()

    def _write(self) -> None:
        view = memoryview(self._buf)
        while view:
            view = view[os.write(self.fd, view) :]
        self._buf = bytearray()

    def finish(self) -> None:
        """Write what is buffered and both indexes, and fsync all three files."""
        self._write()
        os.fsync(self.fd)
        os.close(self.fd)
        self.fd = -1
        if self._max_ts > self._last_time_ts:
            self._time_entries.append((self._max_ts, self._max_off))
        for cls, suffix, entries in ((OffsetIndex, INDEX_SUFFIX, self._entries),
                                     (TimeIndex, TIME_INDEX_SUFFIX, self._time_entries)):
            stem = segment_name(self.base_offset)
            index = cls(self.paths[0].with_name(stem + suffix + CLEANED_SUFFIX), self.base_offset, new=True)
            index.ensure_file()  # even without entries: the swap renames all three files
            index.append_many(entries)
            index.flush()
            index.close()

    def discard(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        for path in self.paths:
            path.unlink(missing_ok=True)


def rebuild_batch(header: BatchHeader, records: list[Record], delete_horizon: int | None) -> bytes:
    """Re-encode a batch with only `records`, keeping what Kafka's filterTo keeps: base offset,
    last offset delta, producer fields, leader epoch, timestamp type, transactional/control
    bits and record timestamps. The codec stays the source batch's (none if no record is left).
    With `delete_horizon` the batch is stamped (KIP-534); an existing stamp is kept."""
    attributes = header.attributes
    base_ts = header.base_timestamp
    if delete_horizon is not None:
        attributes |= DELETE_HORIZON_MASK
        base_ts = delete_horizon
    codec = header.compression if records else compression.NONE
    if not records:
        max_ts = header.max_timestamp
    elif attributes & TIMESTAMP_TYPE_MASK:
        max_ts = header.max_timestamp  # LogAppendTime: every record carries the batch's time
    else:
        max_ts = max(r.timestamp for r in records)
    data = bytearray(build_batch(
        records, base_offset=header.base_offset, timestamp=base_ts, codec=codec,
        producer_id=header.producer_id, producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
    ))
    _EPOCH.pack_into(data, 12, header.partition_leader_epoch)
    attributes = (attributes & ~COMPRESSION_MASK) | codec
    _PATCH.pack_into(data, 21, attributes, header.last_offset_delta, base_ts, max_ts)
    _CRC.pack_into(data, 17, crc32c(memoryview(data)[CRC_START:]))
    return bytes(data)


def _plain(header: BatchHeader) -> BatchHeader:
    """The header without transactional/control bits: an empty filler batch means nothing."""
    return replace(header, attributes=header.attributes & ~(CONTROL_MASK | TRANSACTIONAL_MASK))


def group_segments_by_size(sources: list[SourceSegment], max_size: int, max_index_size: int,
                           end_offset: int) -> list[list[SourceSegment]]:
    """Kafka's groupSegmentsBySize: consecutive segments whose original sizes (and index sizes)
    add up to at most `segment.bytes` / `segment.index.bytes` become one cleaned segment, as
    long as their offsets stay within 2^31 of the group's base."""
    groups: list[list[SourceSegment]] = []
    i = 0
    while i < len(sources):
        group = [sources[i]]
        size = sources[i].size
        index_size = sources[i].segment.offset_index.size_in_bytes
        time_size = sources[i].segment.time_index.size_in_bytes
        i += 1
        while i < len(sources):
            nxt = sources[i]
            upper = sources[i + 1].base_offset if i + 1 < len(sources) else end_offset
            if (
                size + nxt.size > max_size
                or index_size + nxt.segment.offset_index.size_in_bytes > max_index_size
                or time_size + nxt.segment.time_index.size_in_bytes > max_index_size
                or (nxt.size and upper - 1 - group[0].base_offset > 2**31 - 1)
            ):
                break
            group.append(nxt)
            size += nxt.size
            index_size += nxt.segment.offset_index.size_in_bytes
            time_size += nxt.segment.time_index.size_in_bytes
            i += 1
        groups.append(group)
    return groups


# --- one cleaning pass (thread side) ------------------------------------------------------------


@dataclass(slots=True)
class CleanJob:
    """Everything a pass needs, captured on the event loop so the thread reads no live state."""

    tp: TopicPartition
    log: Log
    config: LogConfig
    first_dirty_offset: int
    first_uncleanable_offset: int
    sources: list[SourceSegment]  # every inactive segment below the first uncleanable offset
    tail: list[SourceSegment]  # segments above it, read only for transaction markers
    now_ms: int
    producer_last_offsets: Mapping[int, int] = field(default_factory=dict)

    def close(self) -> None:
        for source in (*self.sources, *self.tail):
            if source.fd >= 0:
                os.close(source.fd)
                source.fd = -1


@dataclass(slots=True)
class CleanResult:
    end_offset: int  # the next pass starts here (the cleaner checkpoint)
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_retained: int = 0
    segments_swapped: int = 0
    elapsed_s: float = 0.0
    min_delete_horizon: int | None = None  # earliest horizon of a kept tombstone or marker


# swap(base offset, old segments) -> False when the swap could not be done (log changed).
SwapFn = Callable[[int, list[LogSegment]], bool]


class Cleaner:
    """One pass over one log. Blocking: run it in a worker thread. `aborted` is polled between
    batches (Kafka's checkDone); `swap` installs a cleaned group on the event loop."""

    def __init__(self, map_capacity_bytes: int) -> None:
        self.map_capacity_bytes = map_capacity_bytes

    def clean(self, job: CleanJob, swap: SwapFn, aborted: Callable[[], bool]) -> CleanResult:
        started = time.monotonic()
        txns = _Transactions()
        for source in (*job.sources, *job.tail):
            txns.scan(source)
        upper = job.first_uncleanable_offset
        lso = txns.last_stable_offset
        if lso is not None:
            upper = min(upper, lso)  # never clean into an undecided transaction
        offset_map = OffsetMap(self.map_capacity_bytes)
        # Everything below the first dirty offset is compared with the map (and so re-copied,
        # dropping tombstones past their horizon) even when the dirty section is empty.
        offset_map.latest_offset = job.first_dirty_offset - 1
        self._build_offset_map(job, offset_map, txns, upper, aborted)
        end = offset_map.latest_offset + 1
        result = CleanResult(end_offset=end)
        sources = [s for s in job.sources if s.base_offset < end]
        if not sources:
            return result
        groups = group_segments_by_size(sources, job.config.segment_bytes,
                                        job.config.segment_index_bytes, end)
        cleaning = _Transactions()
        cleaning.markers = txns.markers
        for group in groups:
            self._clean_group(job, group, offset_map, cleaning, result, swap, aborted)
        result.elapsed_s = time.monotonic() - started
        return result

    def _build_offset_map(self, job: CleanJob, offset_map: OffsetMap, txns: _Transactions,
                          upper: int, aborted: Callable[[], bool]) -> None:
        first_dirty = job.first_dirty_offset
        for i, source in enumerate(job.sources):
            next_base = job.sources[i + 1].base_offset if i + 1 < len(job.sources) else upper
            if next_base <= first_dirty:
                continue
            for header, batch in _iter_batches(source.fd, source.size):
                if header.base_offset >= upper:
                    return
                if header.last_offset < first_dirty:
                    continue
                if aborted():
                    raise CleaningAborted(job.log.name)
                if offset_map.full and offset_map.latest_offset >= first_dirty:
                    return  # the rest waits for the next pass
                if not header.attributes & CONTROL_MASK and not (
                    header.attributes & TRANSACTIONAL_MASK and txns.aborted(header)
                ):
                    for record in iter_records(batch):
                        if record.key is not None:
                            offset_map.put(record.key, record.offset)
                offset_map.latest_offset = header.last_offset

    def _clean_group(self, job: CleanJob, group: list[SourceSegment], offset_map: OffsetMap,
                     txns: _Transactions, result: CleanResult, swap: SwapFn,
                     aborted: Callable[[], bool]) -> None:
        log_ = job.log
        out = _CleanedSegment(log_.dir, group[0].base_offset, job.config)
        try:
            next_offset = group[0].base_offset  # after the last batch written
            last: BatchHeader | None = None
            for source in group:
                for header, batch in _iter_batches(source.fd, source.size):
                    if aborted():
                        raise CleaningAborted(log_.name)
                    result.bytes_read += header.size
                    last = header
                    kept = self._filter_batch(job, header, batch, offset_map, txns, result)
                    if kept is not None:
                        data, max_ts = kept
                        out.append(data, header.base_offset, max_ts)
                        next_offset = header.last_offset + 1
            if last is not None and len(group) > 1 and next_offset <= group[-1].base_offset:
                # The cleaned segment must reach into the group's last segment, or a crash
                # recovery could not tell that segment was replaced (it reads the swap's range
                # from its batches). Kafka keeps the round's last batch, empty, for the same
                # reason; this keeps one only when needed.
                filler = rebuild_batch(_plain(last), [], None)
                out.append(filler, last.base_offset, last.max_timestamp)
            out.finish()
            if aborted() or not swap(group[0].base_offset, [s.segment for s in group]):
                raise CleaningAborted(log_.name)
        except BaseException:
            out.discard()
            raise
        result.bytes_written += out.size
        result.segments_swapped += len(group)

    def _filter_batch(self, job: CleanJob, header: BatchHeader, batch, offset_map: OffsetMap,
                      txns: _Transactions, result: CleanResult) -> tuple[bytes, int] | None:
        """The bytes to keep of one batch and its max timestamp, or None to drop it."""
        now = job.now_ms
        horizon = header.base_timestamp if header.attributes & DELETE_HORIZON_MASK else None
        past_horizon = horizon is not None and horizon <= now
        keep_empty = (header.producer_id >= 0
                      and job.producer_last_offsets.get(header.producer_id) == header.last_offset)
        result.records_read += header.record_count
        if header.attributes & CONTROL_MASK:
            empty_txn = txns.on_marker(header, control_type(batch))
            if empty_txn and past_horizon and not keep_empty:
                return None
            self._note_horizon(result, horizon)
            result.records_retained += header.record_count
            if empty_txn and horizon is None:
                # The marker may go once this horizon passes (Kafka piggy-backs on tombstones).
                stamped = now + job.config.delete_retention_ms
                self._note_horizon(result, stamped)
                return rebuild_batch(header, list(iter_records(batch)), stamped), header.max_timestamp
            return bytes(batch), header.max_timestamp
        discard_all = txns.on_data_batch(header)  # aborted transactional data
        if discard_all and not keep_empty:
            return None
        if header.base_offset > offset_map.latest_offset and not discard_all:
            result.records_retained += header.record_count
            return bytes(batch), header.max_timestamp  # past the map: nothing to compare with
        kept: list[Record] = []
        tombstones = False
        count = 0
        for record in iter_records(batch):
            count += 1
            if discard_all:
                continue
            if record.offset > offset_map.latest_offset:
                kept.append(record)
                tombstones |= record.value is None
                continue
            if record.key is None or offset_map.get(record.key) > record.offset:
                continue  # no key: cannot be compacted (Kafka drops it); or superseded
            if record.value is None:
                if past_horizon:
                    continue
                tombstones = True
            kept.append(record)
        result.records_retained += len(kept)
        if not kept and not keep_empty:
            return None
        if tombstones:
            self._note_horizon(result, horizon)
        if len(kept) == count and (horizon is not None or not tombstones):
            return bytes(batch), header.max_timestamp
        stamp = now + job.config.delete_retention_ms if tombstones and horizon is None else None
        if stamp is not None:
            self._note_horizon(result, stamp)
        data = rebuild_batch(header, kept, stamp)
        return data, read_header(data).max_timestamp

    @staticmethod
    def _note_horizon(result: CleanResult, horizon: int | None) -> None:
        if horizon is not None and (result.min_delete_horizon is None or horizon < result.min_delete_horizon):
            result.min_delete_horizon = horizon


# --- choosing logs and running passes (event loop side) -----------------------------------------


@dataclass(slots=True)
class LogToClean:
    tp: TopicPartition
    log: Log
    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    cleanable_bytes: int
    need_compaction_now: bool = False
    horizon_passed: bool = False

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def cleanable_ratio(self) -> float:
        return self.cleanable_bytes / self.total_bytes if self.total_bytes else 0.0


def cleanable_offsets(log_: Log, checkpoint: int | None, now_ms: int,
                      stable_offset: int | None = None) -> tuple[int, int]:
    """(first dirty offset, first uncleanable offset) as Kafka's cleanableOffsets computes them;
    the second is always a segment base offset."""
    start = log_.log_start_offset
    if checkpoint is None or checkpoint < start or checkpoint > log_.log_end_offset:
        first_dirty = start
    else:
        first_dirty = checkpoint
    segments = log_.segments
    limit = segments[-1].base_offset  # the active segment is never cleaned
    if stable_offset is not None:
        limit = min(limit, stable_offset)
    lag = log_.config.min_compaction_lag_ms
    if lag > 0:
        for i, segment in enumerate(segments[:-1]):
            if segment.base_offset >= limit:
                break
            dirty = segments[i + 1].base_offset > first_dirty
            if dirty and segment.largest_timestamp > now_ms - lag:
                limit = min(limit, segment.base_offset)
                break
    # Round down to the base of the segment holding `limit`: whole segments only.
    uncleanable = segments[-1].base_offset
    for i, segment in enumerate(segments):
        upper = segments[i + 1].base_offset if i + 1 < len(segments) else log_.log_end_offset + 1
        if upper > limit:
            uncleanable = segment.base_offset
            break
    return first_dirty, uncleanable


def _bytes_between(log_: Log, start: int, end: int) -> int:
    """Sizes of the segments overlapping [start, end) (Kafka's logSegments(from, to))."""
    segments = log_.segments
    total = 0
    for i, segment in enumerate(segments):
        upper = segments[i + 1].base_offset if i + 1 < len(segments) else log_.log_end_offset + 1
        if segment.base_offset < end and upper > start:
            total += segment.size
    return total


class LogCleaner:
    """The cleaner threads of a LogManager, driven from the event loop.

    `config` is read on every round, so dynamic changes of log.cleaner.* and of topic configs
    apply without restart. `stable_offset(tp)` bounds cleaning (the high watermark);
    `producer_last_offsets(tp)` names each active producer's last data offset, whose batch is
    kept so its sequence survives compaction.
    """

    def __init__(
        self,
        log_manager,
        config: Callable[[], CleanerConfig],
        *,
        now_ms: Callable[[], int] = wall_clock_ms,
        stable_offset: Callable[[TopicPartition], int | None] | None = None,
        producer_last_offsets: Callable[[TopicPartition], Mapping[int, int]] | None = None,
    ) -> None:
        self.log_manager = log_manager
        self.config = config
        self._now_ms = now_ms
        self._stable_offset = stable_offset or (lambda _tp: None)
        self._producer_last_offsets = producer_last_offsets or (lambda _tp: {})
        self.checkpoints: dict[TopicPartition, int] = {}
        self.horizons: dict[TopicPartition, int] = {}  # earliest delete horizon kept per log
        self.in_progress: set[TopicPartition] = set()
        self.uncleanable: set[TopicPartition] = set()  # failed with an unexpected error
        self.last_result: CleanResult | None = None
        self.passes = 0
        # What metrics report (Kafka's LogCleaner and LogCleanerManager gauges).
        self.bytes_read = 0
        self.bytes_written = 0
        self.max_dirty_ratio = 0.0  # over the compacted logs at the last look
        self.last_run = 0.0  # monotonic time a pass last ended
        self._stopping = threading.Event()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._executor: ThreadPoolExecutor | None = None

    # -- lifecycle

    def load_checkpoints(self) -> None:
        for d in self.log_manager.live_dirs:
            try:
                self.checkpoints.update(read_checkpoint(d / CLEANER_CHECKPOINT))
            except (OSError, ValueError) as e:
                log.warning("ignoring %s: %s", d / CLEANER_CHECKPOINT, e)

    def startup(self) -> None:
        """Start the cleaner tasks (on the running loop)."""
        self.load_checkpoints()
        self._executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="log-cleaner")
        self.reconfigure()

    def reconfigure(self) -> None:
        """Run as many cleaner tasks as log.cleaner.threads asks for (dynamic config)."""
        if self._executor is None or self._stopping.is_set():
            return
        config = self.config()
        wanted = config.threads if config.enable else 0
        self._tasks = [t for t in self._tasks if not t.done()]
        loop = asyncio.get_running_loop()
        for i in range(len(self._tasks), wanted):
            self._tasks.append(loop.create_task(self._run(i), name=f"log-cleaner-{i}"))
        self._wake.set()

    async def shutdown(self) -> None:
        """Abort passes in progress (their `.cleaned` files are removed) and stop the tasks."""
        self._stopping.set()
        self._wake.set()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def wake(self) -> None:
        self._wake.set()

    async def _run(self, index: int) -> None:
        while not self._stopping.is_set():
            config = self.config()
            if index >= (config.threads if config.enable else 0):
                return  # log.cleaner.threads was lowered
            cleaned = False
            try:
                cleaned = await self.clean_filthiest()
            except Exception:
                log.exception("log cleaner round failed")
            if not cleaned and not self._stopping.is_set():
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), config.backoff_ms / 1000)
                except TimeoutError:
                    pass

    # -- choosing

    def grab_filthiest(self, now_ms: int | None = None) -> LogToClean | None:
        """The log to clean next (marked in progress), or None."""
        now = self._now_ms() if now_ms is None else now_ms
        best: LogToClean | None = None
        max_ratio = 0.0
        for tp, lg in self.log_manager.compacted_logs():  # not all 100,000 every backoff
            config = lg.config
            if not config.compact or tp in self.in_progress or tp in self.uncleanable:
                continue
            if lg.closed or lg.offline:
                continue
            ltc = self._log_to_clean(tp, lg, now)
            if ltc.total_bytes == 0:
                continue
            max_ratio = max(max_ratio, ltc.cleanable_ratio)
            if not (
                ltc.cleanable_ratio > config.min_cleanable_dirty_ratio
                or (ltc.need_compaction_now and ltc.cleanable_bytes > 0)
                or ltc.horizon_passed
            ):
                continue
            if best is None or ltc.cleanable_ratio > best.cleanable_ratio:
                best = ltc
        self.max_dirty_ratio = max_ratio
        if best is not None:
            self.in_progress.add(best.tp)
        return best

    def _log_to_clean(self, tp: TopicPartition, lg: Log, now: int) -> LogToClean:
        first_dirty, uncleanable = cleanable_offsets(
            lg, self.checkpoints.get(tp), now, self._stable_offset(tp))
        clean = _bytes_between(lg, -1, first_dirty)
        cleanable = _bytes_between(lg, min(first_dirty, uncleanable), uncleanable)
        ltc = LogToClean(tp, lg, first_dirty, uncleanable, clean, cleanable)
        max_lag = lg.config.max_compaction_lag_ms
        if max_lag < 2**63 - 1 and cleanable:
            segments = lg.segments
            first = next((s for i, s in enumerate(segments[:-1])
                          if segments[i + 1].base_offset > first_dirty), None)
            if first is not None and first.size:
                # Kafka's maxCompactionDelay: the first dirty segment's first batch timestamp.
                head = read_header(first.read_batch(0, HEADER_SIZE))
                ltc.need_compaction_now = head.base_timestamp < now - max_lag
        horizon = self.horizons.get(tp)
        ltc.horizon_passed = horizon is not None and horizon <= now and uncleanable > lg.segments[0].base_offset
        return ltc

    # -- cleaning

    def plan(self, ltc: LogToClean, now_ms: int) -> CleanJob:
        """Capture a pass over `ltc.log` (on the loop): duplicate descriptors, sizes, configs."""
        lg = ltc.log
        sources, tail = [], []
        for segment in lg.segments[:-1]:
            target = sources if segment.base_offset < ltc.first_uncleanable_offset else tail
            target.append(SourceSegment(segment, segment.base_offset, segment.size, segment.dup_fd()))
        active = lg.active_segment
        tail.append(SourceSegment(active, active.base_offset, active.size, active.dup_fd()))
        return CleanJob(ltc.tp, lg, lg.config, ltc.first_dirty_offset, ltc.first_uncleanable_offset,
                        sources, tail, now_ms, dict(self._producer_last_offsets(ltc.tp)))

    async def clean_filthiest(self) -> bool:
        """Clean the filthiest log, if one needs it; True if a pass ran."""
        if self._stopping.is_set():
            return False
        ltc = self.grab_filthiest()
        if ltc is None:
            return False
        tp, lg = ltc.tp, ltc.log
        loop = asyncio.get_running_loop()
        config = self.config()
        try:
            job = self.plan(ltc, self._now_ms())
        except OSError as e:
            self.in_progress.discard(tp)
            log.error("cannot start cleaning %s: %s", lg.name, e)
            return False
        log.info("beginning cleaning of %s (dirty %d..%d, ratio %.2f)", lg.name,
                 ltc.first_dirty_offset, ltc.first_uncleanable_offset, ltc.cleanable_ratio)

        def swap(base: int, old: list[LogSegment]) -> bool:
            return asyncio.run_coroutine_threadsafe(self._swap(lg, base, old), loop).result()

        def aborted() -> bool:
            return self._stopping.is_set() or lg.closed or lg.offline

        def run() -> CleanResult:
            try:
                return Cleaner(config.map_capacity_bytes).clean(job, swap, aborted)
            finally:
                job.close()

        try:
            result = await loop.run_in_executor(self._executor, run)
        except CleaningAborted:
            log.info("cleaning of %s aborted", lg.name)
            return True
        except OSError as e:
            if aborted():  # e.g. the topic was deleted under the pass: not a disk failure
                log.info("cleaning of %s aborted: %s", lg.name, e)
                return True
            log.error("cleaning of %s failed: %s", lg.name, e)
            self.log_manager.handle_io_error(lg, e)
            return True
        except Exception:
            log.exception("cleaning of %s failed; it will not be cleaned again until restart", lg.name)
            self.uncleanable.add(tp)
            return True
        finally:
            self.in_progress.discard(tp)
            self.last_run = time.monotonic()
        self.passes += 1
        self.last_result = result
        self.bytes_read += result.bytes_read
        self.bytes_written += result.bytes_written
        self.checkpoints[tp] = result.end_offset
        if result.min_delete_horizon is None:
            self.horizons.pop(tp, None)
        else:
            self.horizons[tp] = result.min_delete_horizon
        mb = result.bytes_read / 1e6
        log.info(
            "cleaned %s up to offset %d: %d of %d records kept, %.1f MB read, %.1f MB written, "
            "%d segment(s) in %.2f s (%.1f MB/s)",
            lg.name, result.end_offset, result.records_retained, result.records_read, mb,
            result.bytes_written / 1e6, result.segments_swapped, result.elapsed_s,
            mb / result.elapsed_s if result.elapsed_s else 0.0,
        )
        await self.write_checkpoints(self.log_manager.dir_of(tp))
        return True

    async def _swap(self, lg: Log, base: int, old: list[LogSegment]) -> bool:
        if lg.closed or lg.offline or self._stopping.is_set():
            return False
        try:
            lg.replace_segments(base, old)
        except ValueError as e:  # retention or truncation removed a source segment meanwhile
            log.info("not swapping cleaned segment into %s: %s", lg.name, e)
            return False
        await asyncio.to_thread(fsync_path, lg.dir)
        return True

    async def write_checkpoints(self, only_dir: Path | None = None) -> None:
        """Write cleaner-offset-checkpoint in each live log dir (or just `only_dir`), through
        the log manager, the one writer of every checkpoint: cleaner threads finishing
        together write in turn, each what is newest when its turn comes."""
        checkpoints = self.checkpoints
        await asyncio.to_thread(self.log_manager.write_per_dir, CLEANER_CHECKPOINT,
                                lambda tp, _lg: checkpoints.get(tp), only_dir)
