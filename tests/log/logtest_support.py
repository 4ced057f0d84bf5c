"""Helpers for the storage engine tests: a fake clock, record set builders, readers."""

from __future__ import annotations

import hashlib
from pathlib import Path

from strom.log import Log
from strom.protocol.records import Record, build_batch, iter_records, scan_valid_prefix

T0 = 1_700_000_000_000


class Clock:
    """Injectable now_ms: tests move time by assigning `now`."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def batch(n: int = 3, *, ts: int = T0, value_size: int = 10, codec: int = 0, tag: bytes = b"") -> bytearray:
    """One batch of `n` records with distinct values (offsets are assigned by the log)."""
    pad = b"x" * value_size
    return bytearray(build_batch([(b"k%d" % i, tag + b"%d" % i + pad) for i in range(n)], timestamp=ts, codec=codec))


def timed_batch(timestamps: list[int], *, codec: int = 0) -> bytearray:
    """One batch whose records carry the given timestamps (in order)."""
    base = timestamps[0]
    records = [Record(i, ts, None, b"v%d" % i, ()) for i, ts in enumerate(timestamps)]
    return bytearray(build_batch(records, timestamp=base, codec=codec))


def decode(data: bytes) -> list[tuple[int, int, bytes | None]]:
    """(offset, timestamp, value) of every record in the complete batches of `data`."""
    batches, _ = scan_valid_prefix(data)
    out = []
    for pos, _h in batches:
        out.extend((r.offset, r.timestamp, r.value) for r in iter_records(data, pos))
    return out


def read_all(log: Log, start: int | None = None, max_bytes: int = 1 << 20) -> list[tuple[int, int, bytes | None]]:
    """Every record from `start` to the log end, fetching like a consumer does."""
    offset = log.log_start_offset if start is None else start
    out: list[tuple[int, int, bytes | None]] = []
    while offset < log.log_end_offset:
        records = [r for r in decode(log.read(offset, max_bytes).read_bytes()) if r[0] >= offset]
        assert records, f"no progress at offset {offset}"
        out.extend(records)
        offset = records[-1][0] + 1
    return out


def dir_digest(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir()) if p.is_file()}


