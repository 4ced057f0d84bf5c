"""Kafka's variable-length integers: unsigned varints (flexible-version lengths and tagged
fields) and zig-zag varints (inside records). One implementation for every codec here."""

from __future__ import annotations


class VarintError(ValueError):
    """Truncated or over-long varint."""


def read_uvarint(buf, pos: int, max_bits: int = 35) -> tuple[int, int]:
    """(value, next position) of the unsigned varint at `pos`."""
    shift = result = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise VarintError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= max_bits:
            raise VarintError("varint too long")


def read_varint(buf, pos: int) -> tuple[int, int]:
    """(value, next position) of the zig-zag varint (up to 64 bits) at `pos`."""
    raw, pos = read_uvarint(buf, pos, max_bits=70)
    return (raw >> 1) ^ -(raw & 1), pos


_ONE_BYTE = [bytes((n,)) for n in range(0x80)]  # most lengths and counts: one byte, made once


def write_uvarint(n: int) -> bytes:
    if 0 <= n < 0x80:
        return _ONE_BYTE[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def write_varint(n: int) -> bytes:
    return write_uvarint((n << 1) ^ (n >> 63))


def skip_tagged_fields(buf, pos: int) -> int:
    """Position after a tagged-field section (count, then tag, size, bytes for each)."""
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
    if pos > len(buf):
        raise VarintError("tagged field runs past the end")
    return pos
