"""Fetch responses laid out by hand, so record bytes can go out with sendfile.

Every other response is encoded by the codec tables; Fetch is the one hot path where the
records must not pass through Python. `encode_fetch_response` returns a list of parts: bytes
the broker writes as they are, and the caller's region objects (anything with a `size`)
that it sends from the segment file. Layout per Kafka's FetchResponse v4-v12 schema.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from strom.protocol.varint import write_uvarint

_I16, _I32 = struct.Struct(">h"), struct.Struct(">i")
_PARTITION_HEAD = struct.Struct(">ihqqq")  # index, error, high watermark, last stable, log start
_ABORTED = struct.Struct(">qq")  # producer id, first offset
# Partition tagged field 0 (DivergingEpoch): 1 field, tag 0, 13 bytes of epoch, end offset, no tags.
_DIVERGING = struct.Struct(">BBBiqB")
FLEXIBLE_FROM = 12


@dataclass(slots=True)
class PartitionData:
    index: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    records: Any = None  # a region with .size, or None for an empty record set
    # (producer id, first offset) of aborted transactions, for read_committed; None -> null
    aborted_transactions: Sequence[tuple[int, int]] | None = None
    # (epoch, end offset) where a follower's log diverges from the leader's (KIP-320, v12)
    diverging_epoch: tuple[int, int] | None = None


def _array_len(n: int, flexible: bool) -> bytes:
    return write_uvarint(n + 1) if flexible else _I32.pack(n)


def _string(s: str, flexible: bool) -> bytes:
    b = s.encode()
    return (write_uvarint(len(b) + 1) if flexible else _I16.pack(len(b))) + b


def encode_fetch_response(
    version: int,
    topics: Sequence[tuple[str, Sequence[PartitionData]]],
    *,
    throttle_time_ms: int = 0,
    error_code: int = 0,
    session_id: int = 0,
) -> tuple[list[Any], int]:
    """(parts, total size in bytes) of a FetchResponse body of `version` (4..12)."""
    if not 4 <= version <= FLEXIBLE_FROM:
        raise ValueError(f"hand-written Fetch response supports v4-v12, not v{version}")
    flexible = version >= FLEXIBLE_FROM
    tags = b"\x00" if flexible else b""
    parts: list[Any] = []
    head = bytearray(_I32.pack(throttle_time_ms))
    if version >= 7:
        head += _I16.pack(error_code) + _I32.pack(session_id)
    head += _array_len(len(topics), flexible)
    size = 0
    for name, partitions in topics:
        head += _string(name, flexible) + _array_len(len(partitions), flexible)
        for p in partitions:
            head += _PARTITION_HEAD.pack(p.index, p.error_code, p.high_watermark,
                                         p.last_stable_offset, p.log_start_offset)[
                : 22 if version < 5 else None]  # log_start_offset arrives in v5
            aborted = p.aborted_transactions
            if aborted is None:
                head += b"\x00" if flexible else _I32.pack(-1)
            else:
                head += _array_len(len(aborted), flexible)
                for producer_id, first_offset in aborted:
                    head += _ABORTED.pack(producer_id, first_offset) + tags
            if version >= 11:
                head += _I32.pack(-1)  # preferred_read_replica
            n = 0 if p.records is None else p.records.size
            head += write_uvarint(n + 1) if flexible else _I32.pack(n)
            if n:
                parts.append(bytes(head))
                size += len(head) + n
                parts.append(p.records)
                head = bytearray()
            if flexible and p.diverging_epoch is not None:
                head += _DIVERGING.pack(1, 0, 13, p.diverging_epoch[0], p.diverging_epoch[1], 0)
            else:
                head += tags  # partition
        head += tags  # topic
    head += tags  # response
    parts.append(bytes(head))
    size += len(head)
    return parts, size
