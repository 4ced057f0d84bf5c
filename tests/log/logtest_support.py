"""Helpers for the storage engine tests: a fake clock, record set builders, readers."""

from __future__ import annotations

import hashlib
from pathlib import Path

from crc32c import crc32c

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




def keyed_batch(pairs: list[tuple[bytes | None, bytes | None]], *, ts: int = T0, codec: int = 0,
                producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                attributes: int = 0) -> bytearray:
    """One batch of (key, value) records; `attributes` adds bits such as transactional."""
    data = bytearray(build_batch(pairs, timestamp=ts, codec=codec, producer_id=producer_id,
                                 producer_epoch=producer_epoch, base_sequence=base_sequence))
    if attributes:
        data[21:23] = (int.from_bytes(data[21:23], "big") | attributes).to_bytes(2, "big")
        data[17:21] = crc32c(bytes(data[21:])).to_bytes(4, "big")
    return data


def read_records(log: Log, start: int | None = None) -> list[Record]:
    """Every record from `start` to the log end, with keys, fetching like a consumer."""
    offset = log.log_start_offset if start is None else start
    out: list[Record] = []
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20).read_bytes()
        if not data:
            break
        batches, _ = scan_valid_prefix(data)
        got = [r for pos, _h in batches for r in iter_records(data, pos) if r.offset >= offset]
        if not got:
            # a batch left with no records by compaction: skip past it
            offset = max(h.last_offset for _, h in batches) + 1
            continue
        out.extend(got)
        offset = got[-1].offset + 1
    return out
