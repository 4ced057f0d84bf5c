"""RecordBatch v2: a view of the 61-byte header, validation, and offset assignment in place.

The broker's produce and fetch paths only ever touch batch headers. Records are decoded
(`iter_records`) only where semantics need them, e.g. to find an exact offset by timestamp.

Layout (big endian): baseOffset i64 | batchLength i32 | partitionLeaderEpoch i32 | magic i8 |
crc u32 | attributes i16 | lastOffsetDelta i32 | baseTimestamp i64 | maxTimestamp i64 |
producerId i64 | producerEpoch i16 | baseSequence i32 | recordCount i32. The CRC32C covers
everything from `attributes` to the end of the batch, so baseOffset and partitionLeaderEpoch
can be rewritten without recomputing it.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from crc32c import crc32c

from strom.protocol import compression
from strom.protocol.errors import CorruptRecordError, InvalidRecordError, RecordTooLargeError
from strom.protocol.varint import VarintError, read_varint, write_varint

try:  # the compiled record walks (built by the project's set-up); the Python ones below otherwise
    from strom.protocol._records import CRC_HERE_MAX as _CRC_IN_C_MAX
    from strom.protocol._records import batch_header_type as _batch_header_type
    from strom.protocol._records import check_records as _check_records
    from strom.protocol._records import crc32c as _crc32c
    from strom.protocol._records import schema_ids as _schema_ids
    from strom.protocol._records import validate_batches as _validate_batches
except ImportError:  # pragma: no cover - exercised by the tests directly
    _check_records = _schema_ids = _validate_batches = _batch_header_type = _crc32c = None
    _CRC_IN_C_MAX = 0  # unused: the compiled check is what leaves large batches' CRCs here

HEADER = struct.Struct(">qiiBIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the part of a batch not counted in batchLength
CRC_START = 21
MAGIC_OFFSET = 16
ATTRIBUTES_OFFSET = 21
MAX_TIMESTAMP_OFFSET = 35
CURRENT_MAGIC = 2

_OFFSET_AND_LENGTH = struct.Struct(">qi")
_LEADER_EPOCH = struct.Struct(">i")
_CRC = struct.Struct(">I")
_ATTRIBUTES = struct.Struct(">h")
_TIMESTAMP = struct.Struct(">q")

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20

NO_TIMESTAMP = -1
KEYLESS_IN_COMPACTED = "Compacted topic cannot accept message without key"


@dataclass(slots=True)  # not frozen: a frozen one cost ~1.5 µs to build, once per batch of every request
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes the batch takes in a log or a request."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_MASK)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)


if _batch_header_type is not None:
    _batch_header_type(BatchHeader)


def read_header(buf, pos: int = 0) -> BatchHeader:
    return BatchHeader(*HEADER.unpack_from(buf, pos))


def peek_offset_and_size(buf, pos: int = 0) -> tuple[int, int]:
    """(baseOffset, total size) of the batch at `pos`, reading only 12 bytes."""
    base_offset, length = _OFFSET_AND_LENGTH.unpack_from(buf, pos)
    return base_offset, length + LOG_OVERHEAD


def crc_ok(buf, pos: int, header: BatchHeader) -> bool:
    end = pos + header.size
    return crc32c(memoryview(buf)[pos + CRC_START : end]) == header.crc


def scan_valid_prefix(buf) -> tuple[list[tuple[int, BatchHeader]], int]:
    """The well-formed batches at the start of `buf` and the byte length they cover.

    Used by log recovery: everything after the first torn or corrupt batch is to be truncated.
    """
    view = memoryview(buf)
    batches: list[tuple[int, BatchHeader]] = []
    pos, end = 0, len(view)
    while end - pos >= HEADER_SIZE:
        header = read_header(view, pos)
        if (
            header.magic != CURRENT_MAGIC
            or header.batch_length < HEADER_SIZE - LOG_OVERHEAD
            or pos + header.size > end
            or not crc_ok(view, pos, header)
        ):
            break
        batches.append((pos, header))
        pos += header.size
    return batches, pos


def validate_batches(buf, max_batch_bytes: int, *, check_records: bool = False,
                     require_keys: bool = False) -> list[tuple[int, BatchHeader]]:
    """Check a produce request's record set; return (position, header) of each batch. What
    `validate_batches_py` says, in one compiled call where the set passes."""
    if _validate_batches is None:
        return validate_batches_py(buf, max_batch_bytes, check_records=check_records, require_keys=require_keys)
    batches = _validate_batches(buf, max_batch_bytes, check_records, require_keys)
    if batches is None:  # refused: the Python checks name why
        return validate_batches_py(buf, max_batch_bytes, check_records=check_records, require_keys=require_keys)
    if len(buf) > _CRC_IN_C_MAX:  # the CRCs of batches above it are the crc32c library's (faster there)
        view = memoryview(buf)
        for pos, header in batches:
            size = header.batch_length + LOG_OVERHEAD
            if size > _CRC_IN_C_MAX and crc32c(view[pos + CRC_START : pos + size]) != header.crc:
                return validate_batches_py(buf, max_batch_bytes, check_records=check_records,
                                           require_keys=require_keys)
    if check_records:  # the compiled walk leaves compressed records to Python
        records_before = 0
        for pos, header in batches:
            if header.attributes & COMPRESSION_MASK:
                check_batch_records(memoryview(buf), pos, header, require_keys, records_before)
            records_before += header.record_count
    return batches


def validate_batches_py(buf, max_batch_bytes: int, *, check_records: bool = False,
                        require_keys: bool = False) -> list[tuple[int, BatchHeader]]:
    """Check a produce request's record set; return (position, header) of each batch.

    Raises the error Kafka returns for the record set: CORRUPT_MESSAGE for a torn set or a CRC
    mismatch, MESSAGE_TOO_LARGE for a batch over `max_batch_bytes`, INVALID_RECORD for a batch
    that is not magic v2 or whose count disagrees with its offsets. With `check_records` (what
    clients send) also INVALID_RECORD for records that do not fill the batch exactly, are badly
    framed, or (with `require_keys`: compacted topics) have no key.
    """
    view = memoryview(buf)
    end = len(view)
    if end == 0:
        raise InvalidRecordError("empty record set")
    batches: list[tuple[int, BatchHeader]] = []
    pos = records_before = 0
    while pos < end:  # per batch, not per record; properties and helpers spelled out (hot)
        if end - pos < HEADER_SIZE:
            raise CorruptRecordError(f"truncated batch header at byte {pos}")
        header = BatchHeader(*HEADER.unpack_from(view, pos))
        if header.magic != CURRENT_MAGIC:
            raise InvalidRecordError(f"record batch magic {header.magic} is not 2")
        if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
            raise CorruptRecordError(f"batch length {header.batch_length} below the header size")
        size = header.batch_length + LOG_OVERHEAD
        if pos + size > end:
            raise CorruptRecordError("record batch runs past the end of the record set")
        if size > max_batch_bytes:
            raise RecordTooLargeError(
                f"record batch of {size} bytes exceeds the limit of {max_batch_bytes}"
            )
        if header.record_count <= 0 or header.last_offset_delta != header.record_count - 1:
            raise InvalidRecordError("record count does not match last offset delta")
        if crc32c(view[pos + CRC_START : pos + size]) != header.crc:
            raise CorruptRecordError(f"CRC mismatch in batch at byte {pos}")
        if check_records:
            check_batch_records(view, pos, header, require_keys, records_before)
        batches.append((pos, header))
        pos += size
        records_before += header.record_count
    return batches


def check_batch_records(view: memoryview, pos: int, header: BatchHeader, require_keys: bool = False,
                        first_index: int = 0) -> None:
    """Walk the batch's records (decompressed, where they are) as Kafka's LogValidator does:
    exactly `record_count` well-framed records filling the batch. Raises InvalidRecordError
    naming the refused records by their index in the record set (`record_errors`, KIP-467's
    batch_index)."""
    if header.attributes & COMPRESSION_MASK:
        body, start, end = _body(view, pos, header)
    else:  # most batches of small requests: the records are where they are
        body, start, end = view, pos + HEADER_SIZE, pos + header.batch_length + LOG_OVERHEAD
    walk = _check_records or check_records_py
    bad = walk(body, start, end, header.record_count, require_keys)
    if bad is not None:
        index, reason = bad
        named = [index]
        if reason == KEYLESS_IN_COMPACTED and walk(body, start, end, header.record_count, False) is None:
            # Well framed otherwise: name every keyless record (KIP-467), as Kafka does, so
            # that clients fail those and tell the others they went down with them.
            named = _keyless_records(body, start, end, header.record_count)
        raise InvalidRecordError(f"record {index} of the batch: {reason}", record_errors=[
            (first_index + i, f"record {i} of the batch: {reason}") for i in named])


def batch_schema_ids(view: memoryview, pos: int, header: BatchHeader, value: bool
                     ) -> tuple[tuple[int, ...], list[int]] | None:
    """The schema ids the batch's record values (or keys) are framed with (the registry's magic
    byte 0 and a 4-byte id), distinct, and the indexes in the batch of the records whose
    non-null field is not framed so; None if the batch does not decompress or its records are
    malformed (the framing checks refuse those)."""
    try:
        body, start, end = _body(view, pos, header)
    except InvalidRecordError:
        return None
    found = _schema_ids(body, start, end, header.record_count, value) if _schema_ids else None
    if found is None:  # not built, or more distinct ids than the C walk keeps
        ids = record_schema_ids(body, start, end, header.record_count, value)
        if ids is None:
            return None
        return tuple(dict.fromkeys(i for i in ids if i is not None and i >= 0)), \
            [n for n, i in enumerate(ids) if i == -1]
    return found


def batch_records_with_schema_id(view: memoryview, pos: int, header: BatchHeader, value: bool,
                                 schema_id: int) -> list[int]:
    """Indexes in the batch of the records whose value (or key) is framed with `schema_id`."""
    try:
        body, start, end = _body(view, pos, header)
    except InvalidRecordError:
        return []
    ids = record_schema_ids(body, start, end, header.record_count, value)
    return [n for n, i in enumerate(ids or ()) if i == schema_id]


def _body(view: memoryview, pos: int, header: BatchHeader) -> tuple[Any, int, int]:
    """The batch's records, decompressed where they are, and where they lie in that buffer."""
    start, end = pos + HEADER_SIZE, pos + header.size
    if not header.compression:
        return view, start, end
    try:
        body = compression.decompress(header.compression, view[start:end])
    except Exception as e:  # each codec raises its own type on garbage
        raise InvalidRecordError(f"cannot decompress the batch at offset delta 0: {e}") from None
    return body, 0, len(body)


def record_schema_ids(buf, start: int, end: int, count: int, value: bool) -> list[int | None] | None:
    """Per record: the schema id its value (or key) is framed with, None if null, -1 if not
    framed; None for malformed records. The rules of `_records.c`'s schema_ids, in Python."""
    out: list[int | None] = []
    pos = start
    try:
        for _ in range(count):
            size, pos = _varint(buf, pos, end, 5)
            if size < 1 or size > end - pos:
                return None
            record_end = pos + size
            _, p = _varint(buf, pos + 1, record_end, 10)
            _, p = _varint(buf, p, record_end, 5)
            for _which in range(2 if value else 1):
                length, p = _varint(buf, p, record_end, 5)
                field = p
                if length > 0:
                    if length > record_end - p:
                        return None
                    p += length
            if length < 0:
                out.append(None)
            elif length < 5 or buf[field] != 0:
                out.append(-1)
            else:
                out.append(int.from_bytes(bytes(buf[field + 1:field + 5]), "big"))
            pos = record_end
    except VarintError:
        return None
    return out if pos == end else None


def _keyless_records(buf, pos: int, end: int, count: int) -> list[int]:
    """Indexes of the records without a key, in records already known to be well framed."""
    out = []
    for index in range(count):
        size, pos = _varint(buf, pos, end, 5)
        record_end = pos + size
        _, p = _varint(buf, pos + 1, record_end, 10)  # after the attributes: timestamp delta
        _, p = _varint(buf, p, record_end, 5)  # offset delta
        key_length, _ = _varint(buf, p, record_end, 5)
        if key_length < 0:
            out.append(index)
        pos = record_end
    return out


def check_records_py(buf, start: int, end: int, count: int, require_keys: bool) -> tuple[int, str] | None:
    """The record framing rules of `_records.c`, in Python (same answers)."""
    for index in range(count):
        if start >= end:
            return index, "fewer records than the batch header counts"
        try:
            reason, start = _check_one(buf, start, end, require_keys)
        except VarintError as e:
            reason = f"malformed varint ({e})"
        if reason is not None:
            return index, reason
    if start != end:
        return count - 1, "bytes left after the last record the batch header counts"
    return None


def _varint(buf, pos: int, end: int, max_bytes: int) -> tuple[int, int]:
    """A zig-zag varint of at most `max_bytes` bytes that may not pass `end` (5 bytes: an int32)."""
    raw = 0
    for i in range(max_bytes):
        if pos >= end:
            raise VarintError("truncated varint")
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            if max_bytes == 5:
                raw &= 0xFFFFFFFF
                value = (raw >> 1) ^ -(raw & 1)
                return (value + 2**31) % 2**32 - 2**31, pos
            return (raw >> 1) ^ -(raw & 1), pos
    raise VarintError("varint too long")


def _skip(buf, pos: int, end: int) -> tuple[int, int, str | None]:
    length, pos = _varint(buf, pos, end, 5)
    if length > 0:
        if length > end - pos:
            return length, pos, "field runs past the end of the record"
        pos += length
    return length, pos, None


def _check_one(buf, pos: int, end: int, require_keys: bool) -> tuple[str | None, int]:
    size, pos = _varint(buf, pos, end, 5)
    if size < 1 or size > end - pos:
        return "record length runs past the end of the batch", pos
    record_end = pos + size
    pos += 1  # attributes
    _, pos = _varint(buf, pos, record_end, 10)  # timestamp delta
    _, pos = _varint(buf, pos, record_end, 5)  # offset delta
    key_length, pos, error = _skip(buf, pos, record_end)
    if error is None and require_keys and key_length < 0:
        error = KEYLESS_IN_COMPACTED
    if error is None:
        _, pos, error = _skip(buf, pos, record_end)
    if error is None:
        headers, pos = _varint(buf, pos, record_end, 5)
        if headers < 0:
            error = "negative header count"
        for _h in range(max(headers, 0)):
            key_length, pos, error = _skip(buf, pos, record_end)
            if error is None and key_length < 0:
                error = "null header key"
            if error is None:
                _, pos, error = _skip(buf, pos, record_end)
            if error is not None:
                break
    if error is None and pos != record_end:
        error = "record length does not match its fields"
    return error, pos


def assign_offsets(
    buf: bytearray,
    batches: list[tuple[int, BatchHeader]],
    base_offset: int,
    leader_epoch: int,
    log_append_time_ms: int | None = None,
) -> int:
    """Rewrite base offsets and leader epochs in place; return the next offset after the set.

    With `log_append_time_ms`, each batch is stamped LogAppendTime: maxTimestamp set and the
    timestamp-type bit raised, which moves the CRC, so only then it is recomputed.
    """
    next_offset = base_offset
    for pos, header in batches:
        _OFFSET_AND_LENGTH.pack_into(buf, pos, next_offset, header.batch_length)
        _LEADER_EPOCH.pack_into(buf, pos + 12, leader_epoch)
        if log_append_time_ms is not None:
            _ATTRIBUTES.pack_into(buf, pos + ATTRIBUTES_OFFSET, header.attributes | TIMESTAMP_TYPE_MASK)
            _TIMESTAMP.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, log_append_time_ms)
            end = pos + header.size
            _CRC.pack_into(buf, pos + 17, crc32c(memoryview(buf)[pos + CRC_START : end]))
        next_offset += header.last_offset_delta + 1
    return next_offset


@dataclass(slots=True, frozen=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]



def _varbytes(buf, pos: int) -> tuple[bytes | None, int]:
    n, pos = read_varint(buf, pos)
    if n < 0:
        return None, pos
    return bytes(buf[pos : pos + n]), pos + n


def iter_records(batch, pos: int = 0) -> Iterator[Record]:
    """Decode the records of the batch at `pos` (decompressing if needed). Slow path only."""
    try:
        yield from _decode_records(batch, pos)
    except (VarintError, IndexError) as e:
        raise CorruptRecordError(f"malformed record: {e}") from None


def _decode_records(batch, pos: int) -> Iterator[Record]:
    header = read_header(batch, pos)
    body = memoryview(batch)[pos + HEADER_SIZE : pos + header.size]
    data = compression.decompress(header.compression, body)
    p = 0
    for _ in range(header.record_count):
        length, p = read_varint(data, p)
        end = p + length
        p += 1  # record attributes, unused
        ts_delta, p = read_varint(data, p)
        off_delta, p = read_varint(data, p)
        key, p = _varbytes(data, p)
        value, p = _varbytes(data, p)
        n_headers, p = read_varint(data, p)
        headers = []
        for _h in range(n_headers):
            hkey, p = _varbytes(data, p)
            hval, p = _varbytes(data, p)
            headers.append(((hkey or b"").decode("utf-8", "replace"), hval))
        if p != end:
            raise CorruptRecordError("record length does not match its fields")
        timestamp = header.max_timestamp if header.log_append_time else header.base_timestamp + ts_delta
        yield Record(header.base_offset + off_delta, timestamp, key, value, tuple(headers))


def _encode_bytes(b: bytes | None) -> bytes:
    return write_varint(-1) if b is None else write_varint(len(b)) + b


def build_batch(
    records: list[tuple[bytes | None, bytes | None]] | list[Record],
    *,
    base_offset: int = 0,
    timestamp: int = 0,
    codec: int = compression.NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    control: bool = False,
) -> bytes:
    """Encode one RecordBatch v2 (for tools and tests; the broker never builds batches).

    `records` are (key, value) pairs or `Record`s whose offsets and timestamps are taken as
    absolute and made relative to the batch.
    """
    body = bytearray()
    max_ts = timestamp
    for i, rec in enumerate(records):
        if isinstance(rec, Record):
            key, value, headers = rec.key, rec.value, rec.headers
            delta, ts_delta = rec.offset - base_offset, rec.timestamp - timestamp
        else:
            (key, value), headers, delta, ts_delta = rec, (), i, 0
        max_ts = max(max_ts, timestamp + ts_delta)
        fields = bytearray(b"\x00")
        fields += write_varint(ts_delta) + write_varint(delta) + _encode_bytes(key) + _encode_bytes(value)
        fields += write_varint(len(headers))
        for hkey, hval in headers:
            fields += _encode_bytes(hkey.encode()) + _encode_bytes(hval)
        body += write_varint(len(fields)) + fields
    payload = compression.compress(codec, bytes(body))
    last_delta = (records[-1].offset - base_offset) if records and isinstance(records[-1], Record) else len(records) - 1
    attributes = codec | (TRANSACTIONAL_MASK if transactional else 0) | (CONTROL_MASK if control else 0)
    return _framed(payload, base_offset, attributes, last_delta, timestamp, max_ts, producer_id, producer_epoch,
                   base_sequence, len(records))


def _framed(payload: bytes, base_offset: int, attributes: int, last_delta: int, timestamp: int, max_ts: int,
            producer_id: int, producer_epoch: int, base_sequence: int, count: int) -> bytes:
    """A batch's header around its (compressed) records."""
    tail = struct.pack(">hiqqqhii", attributes, last_delta, timestamp, max_ts, producer_id, producer_epoch,
                       base_sequence, count) + payload
    return _OFFSET_AND_LENGTH.pack(base_offset, HEADER_SIZE - LOG_OVERHEAD + len(payload)) + struct.pack(
        ">iBI", 0, CURRENT_MAGIC, crc32c(tail)) + tail


@functools.cache
def _small_varints() -> list[bytes]:
    """Zig-zag varints of 0..65535: the offset deltas and value lengths of value-only batches.
    Made on first use, from their byte patterns (write_varint on each would add 0.1 s to every
    start of a process that imports this module)."""
    return ([bytes((2 * i,)) for i in range(64)]
            + [bytes((2 * i & 0x7F | 0x80, 2 * i >> 7)) for i in range(64, 8192)]
            + [bytes((2 * i & 0x7F | 0x80, 2 * i >> 7 & 0x7F | 0x80, 2 * i >> 14)) for i in range(8192, 1 << 16)])


def build_value_batch(values: list[bytes], *, base_offset: int = 0, timestamp: int = 0) -> bytes:
    """build_batch for records with a null key, no headers and no compression (a metadata log's
    records), about ten times faster: a snapshot of 100,000 partitions is 100,000 of them."""
    varints = _small_varints()
    parts = []
    for i, value in enumerate(values):
        n = len(value)
        head = b"\x00\x00" + (varints[i] if i < 65536 else write_varint(i)) + b"\x01" + (
            varints[n] if n < 65536 else write_varint(n))
        size = len(head) + n + 1
        parts += (varints[size] if size < 65536 else write_varint(size), head, value, b"\x00")
    return _framed(b"".join(parts), base_offset, 0, len(values) - 1, timestamp, timestamp, -1, -1, -1, len(values))


def iter_values(batch, pos: int = 0) -> list[bytes | None]:
    """The values of the records of the batch at `pos`, in order (iter_records' values, read
    without building Records where the batch is uncompressed)."""
    header = read_header(batch, pos)
    if header.compression != compression.NONE:
        return [r.value for r in iter_records(batch, pos)]
    data = memoryview(batch)[pos + HEADER_SIZE:pos + header.size]
    out: list[bytes | None] = []
    p = 0
    try:
        for _ in range(header.record_count):
            length, p = read_varint(data, p)
            end = p + length
            p += 1  # attributes
            _ts, p = read_varint(data, p)
            _off, p = read_varint(data, p)
            key_len, p = read_varint(data, p)
            if key_len > 0:
                p += key_len
            n, p = read_varint(data, p)
            out.append(None if n < 0 else bytes(data[p:p + n]))
            p = end
            if p > len(data):
                raise CorruptRecordError("record runs past the end of its batch")
    except (VarintError, IndexError) as e:
        raise CorruptRecordError(f"malformed record: {e}") from None
    return out


def recompress(buf, batches: list[tuple[int, BatchHeader]], codec: int,
               level: int | None = None) -> bytearray | None:
    """The record set with every batch not already in `codec` recompressed into it (a topic's
    compression.type): the records' bytes change codec, the header its attributes, length and
    CRC, nothing else. None when every batch is already in `codec`."""
    if all(h.compression == codec for _, h in batches):
        return None
    view = memoryview(buf)
    out = bytearray()
    for pos, h in batches:
        end = pos + h.size
        if h.compression == codec:
            out += view[pos:end]
            continue
        payload = compression.compress(codec, bytes(compression.decompress(h.compression, view[pos + HEADER_SIZE:end])),
                                       level)
        attributes = (h.attributes & ~COMPRESSION_MASK) | codec
        tail = bytearray(view[pos + ATTRIBUTES_OFFSET:pos + HEADER_SIZE]) + payload
        _ATTRIBUTES.pack_into(tail, 0, attributes)
        out += _OFFSET_AND_LENGTH.pack(h.base_offset, HEADER_SIZE - LOG_OVERHEAD + len(payload))
        out += _LEADER_EPOCH.pack(h.partition_leader_epoch) + bytes([h.magic]) + _CRC.pack(crc32c(tail)) + tail
    return out


# --- transaction markers ------------------------------------------------------------------------
# A control batch holds one record: key = version i16 (0) + type i16, value = version i16 (0) +
# coordinator epoch i32 (Kafka's EndTransactionMarker).
CONTROL_ABORT, CONTROL_COMMIT = 0, 1
_CONTROL_KEY = struct.Struct(">hh")
_MARKER_VALUE = struct.Struct(">hi")


def build_marker_batch(producer_id: int, producer_epoch: int, committed: bool,
                       coordinator_epoch: int, timestamp: int) -> bytes:
    """The control batch that ends a transaction in one partition."""
    key = _CONTROL_KEY.pack(0, CONTROL_COMMIT if committed else CONTROL_ABORT)
    value = _MARKER_VALUE.pack(0, coordinator_epoch)
    return build_batch([(key, value)], timestamp=timestamp, producer_id=producer_id,
                       producer_epoch=producer_epoch, transactional=True, control=True)


def control_type(batch, pos: int = 0) -> int:
    """CONTROL_ABORT or CONTROL_COMMIT for the control batch at `pos` (-1 if unreadable)."""
    for record in iter_records(batch, pos):
        if record.key is not None and len(record.key) >= _CONTROL_KEY.size:
            return _CONTROL_KEY.unpack_from(record.key)[1]
    return -1
