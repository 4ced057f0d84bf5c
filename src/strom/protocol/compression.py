"""Record batch compression codecs (attributes bits 0-2), backed by cramjam.

The broker passes compressed batches through untouched, unless a topic's compression.type
names a codec (then batches in another codec are recompressed); the rest is for the few places
that must read records (timestamp lookups, tools) and for producing test data.
"""

from __future__ import annotations

import struct

import cramjam

NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)
NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
# KIP-390's levels: (lowest, highest, Kafka's default) per codec that has them.
LEVELS = {GZIP: (1, 9, 6), LZ4: (1, 17, 9), ZSTD: (-131072, 22, 3)}

# The Java client frames snappy the way xerial's snappy-java does; librdkafka writes raw blocks.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_BLOCK_LEN = struct.Struct(">i")


def _snappy_decompress(data) -> bytes:
    data = bytes(data)
    if not data.startswith(_XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(data))
    out, pos = [], 16  # magic, version, min-compatible version
    while pos < len(data):
        (n,) = _BLOCK_LEN.unpack_from(data, pos)
        pos += 4
        out.append(bytes(cramjam.snappy.decompress_raw(data[pos : pos + n])))
        pos += n
    return b"".join(out)


def decompress(codec: int, data) -> bytes | memoryview:
    if codec == NONE:
        return data
    if codec == GZIP:
        return bytes(cramjam.gzip.decompress(bytes(data)))
    if codec == SNAPPY:
        return _snappy_decompress(data)
    if codec == LZ4:
        return bytes(cramjam.lz4.decompress(bytes(data)))
    if codec == ZSTD:
        return bytes(cramjam.zstd.decompress(bytes(data)))
    raise ValueError(f"unknown compression codec {codec}")


def compress(codec: int, data: bytes, level: int | None = None) -> bytes:
    """`level`: KIP-390's compression.<codec>.level (None: Kafka's default for the codec)."""
    if codec == NONE:
        return data
    if level is None and codec in LEVELS:
        level = LEVELS[codec][2]
    if codec == GZIP:
        return bytes(cramjam.gzip.compress(data, level=level))
    if codec == SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == LZ4:
        return bytes(cramjam.lz4.compress(data, level=level))
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data, level=level))
    raise ValueError(f"unknown compression codec {codec}")
