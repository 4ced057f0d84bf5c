"""Offset ranges, the unit of a read task, and offsets as Spark's Kafka source writes them in
checkpoints ({"topic": {"0": 123}}): plain values, no Kafka client needed."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

Partition = tuple[str, int]
Offsets = dict[Partition, int]


def to_json(offsets: Offsets) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def from_json(value: dict | str) -> Offsets:
    if isinstance(value, str):
        value = json.loads(value)
    return {(t, int(p)): int(o) for t, parts in value.items() for p, o in parts.items()}


@dataclass(frozen=True)
class Range:
    """Offsets [start, end) of one partition: one Spark task's work."""
    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def split(ranges: list[Range], min_partitions: int | None, max_records: int | None) -> list[Range]:
    """Spark's Kafka source's task planning (KafkaOffsetRangeCalculator), to the task: ranges
    over `max_records` offsets are cut into ceil(size / max_records) pieces; then, while there
    are fewer pieces than `min_partitions`, the large ones are cut again in proportion to
    their size (rounded half up, as Java's Math.round; a piece whose share rounds to one task
    stays whole and its topic-partition is not cut). Empty ranges are dropped; the pieces of
    one partition stay in offset order."""
    ranges = [r for r in ranges if r.size > 0]
    if (min_partitions is None or len(ranges) >= min_partitions) and max_records is None:
        return ranges
    if max_records is not None:
        ranges = [piece for r in ranges for piece in _divide(r, -(-r.size // max_records))]
    if min_partitions is None or min_partitions <= len(ranges):
        return ranges
    total = sum(r.size for r in ranges)
    whole = [r for r in ranges if _share(r.size, total, min_partitions) == 1]
    whole_tps = {(r.topic, r.partition) for r in whole}
    rest_size = total - sum(r.size for r in whole)
    rest_tasks = max(min_partitions - len(whole), 1)
    out = []
    for r in ranges:
        pieces = 1 if (r.topic, r.partition) in whole_tps else _share(r.size, rest_size, rest_tasks)
        out += _divide(r, pieces)
    return out


def _share(size: int, total: int, tasks: int) -> int:
    """max(Math.round(size / total * tasks), 1): Java rounds halves up, Python's round() to even."""
    return max(math.floor(size / total * tasks + 0.5), 1)


def _divide(r: Range, pieces: int) -> list[Range]:
    """`r` in `pieces` consecutive ranges, the remainder of the division going to the last ones."""
    out, start, left = [], r.start, r.size
    for i in range(pieces):
        size = left // (pieces - i)
        left -= size
        if size:
            out.append(Range(r.topic, r.partition, start, start + size))
        start += size
    return out
