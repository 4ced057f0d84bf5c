"""Delayed delivery, a Strom extension to share groups: the not-before times a record batch's
records carry.

A record with the header `strom.not-before`, its value the time as decimal epoch milliseconds
in ASCII (e.g. b"1767225600000"), is not acquired by any member of a share group before that
time. A value that is not such a number is ignored (the record is delivered as any other).

Reading record headers is not free, so a batch is looked into only when it may hold one: the
bytes of an uncompressed batch are searched for the header's name first (one C-level search
over bytes the fetch already holds), a compressed batch is decompressed for that search, and
only a batch that holds the name has its records parsed.
"""

from __future__ import annotations

from strom.protocol import compression
from strom.protocol.errors import CorruptRecordError
from strom.protocol.records import HEADER_SIZE, BatchHeader, iter_records

NOT_BEFORE_HEADER = "strom.not-before"
_NAME = NOT_BEFORE_HEADER.encode()
_MAX_DIGITS = 19  # an int64 of milliseconds


def parse_not_before(value: bytes | None) -> int | None:
    """The epoch milliseconds a header value names, or None if it names none."""
    if not value or len(value) > _MAX_DIGITS or not value.isdigit():
        return None
    return int(value)


def batch_not_before(data: bytes, pos: int, header: BatchHeader) -> dict[int, int] | None:
    """offset -> not-before of the records of the batch at `pos` that carry the header, or
    None when none does (or the batch does not parse: the fetch serves it as it is)."""
    end = pos + header.size
    if header.compression:
        try:
            body = memoryview(data)[pos + HEADER_SIZE:end]
            if bytes(compression.decompress(header.compression, body)).find(_NAME) < 0:
                return None
        except Exception:  # a codec's own error: the batch is served as is
            return None
    elif data.find(_NAME, pos + HEADER_SIZE, end) < 0:
        return None
    found: dict[int, int] = {}
    try:
        for record in iter_records(data, pos):
            for name, value in record.headers:
                if name == NOT_BEFORE_HEADER:
                    at = parse_not_before(value)
                    if at is not None:
                        found[record.offset] = max(found.get(record.offset, 0), at)
    except CorruptRecordError:
        return None
    return found or None
