"""Reads of remote segments for Fetch (Kafka's RemoteLogReader and its index cache): the
offset index locates a position, a ranged GET brings whole batches from there, each checked
against its CRC before it is served. Called in the remote log manager's reader threads."""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass

from strom.log.remote import (
    IndexType,
    RemoteLogSegmentMetadata,
    RemoteResourceNotFound,
    RemoteStorageError,
)
from strom.log.txn_index import AbortedTxn, collect, parse_entries
from strom.protocol.records import HEADER_SIZE, crc_ok, iter_records, read_header

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
READ_CAP = 8 << 20  # the most one remote read brings, whatever max bytes a fetch asks
READ_AHEAD_BYTES = 64 << 20  # fetched ahead for consumers reading on, all partitions together
READ_AHEAD_CHUNK = 16 << 20  # one GET ahead: a few fetches' worth (fewer, larger GETs go faster)
_LOOKAHEAD = 64 << 10  # read past max bytes to reach the batch holding the offset (index.interval.bytes)
MAGIC = 2


class CorruptRemoteData(RemoteStorageError):
    """What the store returned is not the segment's batches (truncated, corrupt)."""


class IndexCache:
    """Remote indexes by (segment, kind), least recently used first out past `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self._items: OrderedDict[tuple, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, storage, metadata: RemoteLogSegmentMetadata, kind: IndexType) -> bytes:
        key = (metadata.segment_id.id, kind)
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
                return found
        try:
            data = storage.fetch_index(metadata, kind)
        except RemoteResourceNotFound:
            if kind is not IndexType.TRANSACTION:
                raise
            data = b""  # the segment had no aborted transaction
        with self._lock:
            if key not in self._items:
                self._items[key] = data
                self.size += len(data)
            while self.size > self.max_bytes and len(self._items) > 1:
                _, dropped = self._items.popitem(last=False)
                self.size -= len(dropped)
        return data


def index_position(index: bytes, base_offset: int, offset: int) -> int:
    """The file position of the last index entry at or below `offset` (0 before the first)."""
    count = len(index) // _OFFSET_ENTRY.size
    lo, hi, position = 0, count - 1, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        relative, pos = _OFFSET_ENTRY.unpack_from(index, mid * _OFFSET_ENTRY.size)
        if base_offset + relative <= offset:
            position, lo = pos, mid + 1
        else:
            hi = mid - 1
    return position


class _Bounded(OrderedDict):
    """A small LRU map of bytes (or positions), bounded by the bytes it holds or its length."""

    def __init__(self, max_bytes: int = 0, max_items: int = 0) -> None:
        super().__init__()
        self.max_bytes, self.max_items, self.size = max_bytes, max_items, 0
        self.lock = threading.Lock()

    def take(self, key):
        with self.lock:
            found = self.pop(key, None)
            if isinstance(found, bytes):
                self.size -= len(found)
            return found

    def keep(self, key, value) -> None:
        with self.lock:
            old = self.pop(key, None)
            self.size -= len(old) if isinstance(old, bytes) else 0
            self[key] = value
            self.size += len(value) if isinstance(value, bytes) else 0
            while self and ((self.max_bytes and self.size > self.max_bytes) or
                            (self.max_items and len(self) > self.max_items)):
                _, dropped = self.popitem(last=False)
                self.size -= len(dropped) if isinstance(dropped, bytes) else 0


@dataclass(frozen=True, slots=True)
class RemoteRead:
    data: bytes
    next_offset: int  # the offset after the last batch read
    next_position: int  # where the next batch starts in the segment (its size: none left)


class RemoteReader:
    """Reads of remote segments. A consumer reading on asks next for the offset this read ended
    at: where that is in the segment is remembered (no index lookup, which would go back to an
    index entry), and the bytes there can be fetched ahead (`prefetch`), so that its next fetch
    finds them in memory while this one is being sent."""

    def __init__(self, storage, index_cache: IndexCache, read_ahead_bytes: int = READ_AHEAD_BYTES) -> None:
        self.storage = storage
        self.indexes = index_cache
        self._ahead = _Bounded(max_bytes=read_ahead_bytes)  # (segment id, position) -> bytes there
        self._resume = _Bounded(max_items=4096)  # (segment id, offset) -> position of its batch

    def read(self, metadata: RemoteLogSegmentMetadata, offset: int, max_bytes: int, min_one_message: bool) -> bytes:
        """Whole batches of the segment from the one holding `offset`, up to `max_bytes` (at
        least one batch with `min_one_message`)."""
        return self.read_at(metadata, offset, max_bytes, min_one_message).data

    def read_at(self, metadata: RemoteLogSegmentMetadata, offset: int, max_bytes: int,
                min_one_message: bool) -> RemoteRead:
        max_bytes = min(max_bytes, READ_CAP)
        sid = metadata.segment_id.id
        position = self._resume.take((sid, offset))
        if position is None:
            index = self.indexes.get(self.storage, metadata, IndexType.OFFSET)
            position = index_position(index, metadata.start_offset, offset)
        size = metadata.size_bytes
        parts: list[memoryview] = []  # runs of whole batches, joined once at the end
        taken = 0
        chunk, chunk_at = memoryview(b""), position
        run_start = None
        pos, next_offset = position, offset
        while pos < size:
            if pos + HEADER_SIZE > chunk_at + len(chunk):
                if run_start is not None:
                    parts.append(chunk[run_start:pos - chunk_at])
                chunk_at, run_start = pos, None
                chunk = self._get(metadata, pos, min(size, pos + max(max_bytes - taken, HEADER_SIZE) + _LOOKAHEAD))
            header = read_header(chunk, pos - chunk_at)
            end = pos + header.size
            if header.magic != MAGIC or header.size < HEADER_SIZE or end > size or not (
                    metadata.start_offset <= header.base_offset <= header.last_offset <= metadata.end_offset):
                raise CorruptRemoteData(f"no record batch at position {pos} of remote segment "
                                        f"{sid} ({metadata.segment_id.topic}-{metadata.segment_id.partition})")
            if header.last_offset < offset:
                pos = end
                continue
            if taken + header.size > max_bytes and (taken or not min_one_message):
                break
            if end > chunk_at + len(chunk):
                if run_start is not None:
                    parts.append(chunk[run_start:pos - chunk_at])
                chunk_at, run_start = pos, None
                chunk = self._get(metadata, pos, min(size, max(end, pos + max_bytes - taken)))
            at = pos - chunk_at
            if not crc_ok(chunk, at, header):
                raise CorruptRemoteData(f"CRC mismatch in the batch at offset {header.base_offset} of remote "
                                        f"segment {sid}")
            if run_start is None:
                run_start = at
            taken += header.size
            pos, next_offset = end, header.last_offset + 1
        if run_start is not None:
            parts.append(chunk[run_start:pos - chunk_at])
        if taken and pos < size:
            self._resume.keep((sid, next_offset), pos)
        return RemoteRead(b"".join(parts), next_offset, pos)

    def prefetch(self, metadata: RemoteLogSegmentMetadata, position: int, length: int) -> None:
        """Fetch the segment's bytes from `position` (READ_AHEAD_CHUNK of them, at least `length`)
        ahead of the reads that will want them, unless fetched already."""
        end = min(metadata.size_bytes, position + max(length, READ_AHEAD_CHUNK))
        if end <= position or self._ahead_covering(metadata.segment_id.id, position, min(end, position + length)):
            return
        data = self.storage.fetch_log_segment(metadata, position, end)
        if len(data) == end - position:
            self._ahead.keep((metadata.segment_id.id, position), data)

    def _ahead_covering(self, sid, start: int, end: int) -> memoryview | None:
        """[start, end) of the segment from a chunk fetched ahead, if one holds it."""
        with self._ahead.lock:
            for (chunk_sid, at), data in reversed(self._ahead.items()):
                if chunk_sid == sid and at <= start and end <= at + len(data):
                    self._ahead.move_to_end((chunk_sid, at))
                    return memoryview(data)[start - at:end - at]
        return None

    def _get(self, metadata: RemoteLogSegmentMetadata, start: int, end: int) -> memoryview:
        ahead = self._ahead_covering(metadata.segment_id.id, start, end)
        if ahead is not None:
            return ahead
        data = self.storage.fetch_log_segment(metadata, start, end)
        if len(data) != end - start:
            raise CorruptRemoteData(f"remote segment {metadata.segment_id.id} returned {len(data)} bytes "
                                    f"for [{start}, {end})")
        return memoryview(data)

    def find_offset_by_timestamp(self, metadata: RemoteLogSegmentMetadata, timestamp: int,
                                 start_offset: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the segment's first record at or after `start_offset` whose
        timestamp is >= `timestamp`, or None: from the time index's last entry below the
        timestamp, batch headers first, decoding only the batch that holds the answer."""
        index = self.indexes.get(self.storage, metadata, IndexType.TIMESTAMP)
        offset = max(start_offset, metadata.start_offset)
        for i in range(len(index) // _TIME_ENTRY.size):
            ts, relative = _TIME_ENTRY.unpack_from(index, i * _TIME_ENTRY.size)
            if ts >= timestamp:
                break
            offset = max(offset, metadata.start_offset + relative)
        while offset <= metadata.end_offset:
            data = self.read(metadata, offset, READ_CAP, True)
            if not data:
                return None
            pos = 0
            while pos < len(data):
                header = read_header(data, pos)
                if header.last_offset >= start_offset and header.max_timestamp >= timestamp:
                    if header.log_append_time:
                        return max(header.base_offset, start_offset), header.max_timestamp
                    for record in iter_records(data, pos):
                        if record.offset >= start_offset and record.timestamp >= timestamp:
                            return record.offset, record.timestamp
                offset = header.last_offset + 1
                pos += header.size
        return None

    def aborted(self, metadata: RemoteLogSegmentMetadata, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        return collect(parse_entries(self.indexes.get(self.storage, metadata, IndexType.TRANSACTION)),
                       fetch_offset, upper_bound)
