"""Task planning as Spark's Kafka source does it (KafkaOffsetRangeCalculator), without Spark
or a broker: the same tasks for the same offsets and options."""

from __future__ import annotations

from strom.spark.ranges import Range, split


def sizes(ranges: list[Range]) -> list[tuple[int, int]]:
    return [(r.partition, r.size) for r in ranges]


def test_min_partitions_rounds_half_up():
    four = [Range("t", p, 0, 100) for p in range(4)]
    assert len(split(four, 10, None)) == 12  # 2.5 tasks per partition: Math.round -> 3
    assert sizes(split([Range("t", 0, 0, 10)], 3, None)) == [(0, 3), (0, 3), (0, 4)]  # remainder last
    assert split(four, 4, None) == four  # enough partitions already
    assert split(four, None, None) == four


def test_small_ranges_stay_whole_and_the_rest_share_the_tasks():
    ranges = [Range("t", 0, 0, 1000), Range("t", 1, 0, 10), Range("t", 2, 0, 0)]
    out = split(ranges, 5, None)
    assert (1, 10) in sizes(out) and all(p != 2 for p, _ in sizes(out))  # tiny one whole, empty one gone
    assert [s for p, s in sizes(out) if p == 0] == [250] * 4  # the other four tasks


def test_max_records_first_then_min_partitions():
    assert sizes(split([Range("t", 0, 0, 100)], None, 30)) == [(0, 25)] * 4  # ceil(100 / 30) = 4 pieces
    assert len(split([Range("t", p, 0, 100) for p in range(4)], 20, 30)) == 16
    out = split([Range("t", 0, 0, 100)], 8, 50)  # 2 pieces of 50, then 8 tasks over them
    assert [s for _, s in sizes(out)] == [12, 12, 13, 13] * 2
    assert all(a.end == b.start for a, b in zip(out, out[1:], strict=False))  # contiguous, in offset order
