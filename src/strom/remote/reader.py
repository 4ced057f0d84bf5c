"""Reads of remote segments for Fetch (Kafka's RemoteLogReader and its index cache): the
offset index locates a position, a ranged GET brings whole batches from there, each checked
against its CRC before it is served. Called in the remote log manager's reader threads."""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict

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


class RemoteReader:
    def __init__(self, storage, index_cache: IndexCache) -> None:
        self.storage = storage
        self.indexes = index_cache

    def read(self, metadata: RemoteLogSegmentMetadata, offset: int, max_bytes: int, min_one_message: bool) -> bytes:
        """Whole batches of the segment from the one holding `offset`, up to `max_bytes` (at
        least one batch with `min_one_message`)."""
        max_bytes = min(max_bytes, READ_CAP)
        index = self.indexes.get(self.storage, metadata, IndexType.OFFSET)
        position = index_position(index, metadata.start_offset, offset)
        size = metadata.size_bytes
        out = bytearray()
        chunk, chunk_at = b"", position
        pos = position
        while pos < size:
            if pos + HEADER_SIZE > chunk_at + len(chunk):
                chunk_at = pos
                chunk = self._get(metadata, pos, min(size, pos + max(max_bytes - len(out), HEADER_SIZE) + _LOOKAHEAD))
            header = read_header(chunk, pos - chunk_at)
            end = pos + header.size
            if header.magic != MAGIC or header.size < HEADER_SIZE or end > size or not (
                    metadata.start_offset <= header.base_offset <= header.last_offset <= metadata.end_offset):
                raise CorruptRemoteData(f"no record batch at position {pos} of remote segment "
                                        f"{metadata.segment_id.id} ({metadata.segment_id.topic}-{metadata.segment_id.partition})")
            if header.last_offset < offset:
                pos = end
                continue
            if len(out) + header.size > max_bytes and (out or not min_one_message):
                break
            if end > chunk_at + len(chunk):
                chunk_at = pos
                chunk = self._get(metadata, pos, min(size, max(end, pos + max_bytes - len(out))))
            at = pos - chunk_at
            if not crc_ok(chunk, at, header):
                raise CorruptRemoteData(f"CRC mismatch in the batch at offset {header.base_offset} of remote "
                                        f"segment {metadata.segment_id.id}")
            out += chunk[at:at + header.size]
            pos = end
        return bytes(out)

    def _get(self, metadata: RemoteLogSegmentMetadata, start: int, end: int) -> bytes:
        data = self.storage.fetch_log_segment(metadata, start, end)
        if len(data) != end - start:
            raise CorruptRemoteData(f"remote segment {metadata.segment_id.id} returned {len(data)} bytes "
                                    f"for [{start}, {end})")
        return data

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
