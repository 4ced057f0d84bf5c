"""Schemas of record values, as a schema registry keeps them (Avro, Protobuf, JSON Schema).

Pure: nothing here imports the broker side, so that the broker's produce validation, the
schema registry service and the Spark connector all use one implementation. What is here
today is the registry's wire framing of a value: magic byte 0, then the schema id as a
4-byte big-endian integer, then the encoded payload.
"""

from __future__ import annotations

import struct

MAGIC_BYTE = 0
_HEADER = struct.Struct(">bI")
HEADER_SIZE = _HEADER.size  # 5


class NotFramed(ValueError):
    """A value that does not start with the registry's framing (too short or another magic)."""


def frame(schema_id: int, payload: bytes) -> bytes:
    """`payload` framed for `schema_id` as registry serializers write it."""
    return _HEADER.pack(MAGIC_BYTE, schema_id) + payload


def schema_id_of(value: bytes | memoryview) -> int:
    """The schema id a framed value names; NotFramed if it is not framed."""
    if len(value) < HEADER_SIZE:
        raise NotFramed(f"a framed value has at least {HEADER_SIZE} bytes, this one {len(value)}")
    magic, schema_id = _HEADER.unpack_from(value)
    if magic != MAGIC_BYTE:
        raise NotFramed(f"magic byte {magic}, not {MAGIC_BYTE}")
    return schema_id


def payload_of(value: bytes | memoryview) -> memoryview:
    """The encoded payload after the framing (checked as schema_id_of checks it)."""
    schema_id_of(value)
    return memoryview(value)[HEADER_SIZE:]
