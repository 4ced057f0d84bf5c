"""Logs of many segments, and retention deleting them, as clients see it: offsets, timestamp
lookups, low watermarks and offset resets."""

from __future__ import annotations

import pytest

from strom.testing import create_topic, wait_for

from .conftest import Rec, ck_consume, ck_produce, offsets_for_times, roundtrip, watermarks

pytestmark = pytest.mark.timeout(60)

T0 = 1_500_000_000_000  # long past any retention.ms used here


def test_many_segments(broker, topic):
    create_topic(broker.bootstrap, topic, config={"segment.bytes": "16384", "index.interval.bytes": "512"})
    records = [Rec(b"seg-%05d" % i * 4, b"%d" % i, (), T0 + i, 0) for i in range(3000)]
    roundtrip(broker.bootstrap, topic, records, **{"linger.ms": 1, "batch.num.messages": 37})
    assert len(list((broker.data_dir / "logs" / f"{topic}-0").glob("*.log"))) >= 8  # Kafka's layout
    for start in (1234, 2999, 0):
        got = ck_consume(broker.bootstrap, [(topic, 0, start)], 3000 - start)
        assert [m.offset() for m in got] == list(range(start, 3000))
    assert offsets_for_times(broker.bootstrap, topic, [T0 + 5, T0 + 1777, T0 + 2999, T0 + 3000]) == \
        [5, 1777, 2999, -1]


@pytest.mark.parametrize("config", [{"retention.ms": "60000"}, {"retention.bytes": "8192"}])
def test_retention_moves_the_log_start_and_consumers_reset(retention_broker, topic, config):
    bootstrap = retention_broker.bootstrap
    create_topic(bootstrap, topic, config={"segment.bytes": "2048", **config})
    old = [Rec(b"old-%03d" % i * 10, partition=0, timestamp=T0 + i) for i in range(100)]
    new = [Rec(b"new-%03d" % i * 10, partition=0) for i in range(50)]  # stamped now
    ck_produce(bootstrap, topic, old + new, **{"linger.ms": 0, "batch.num.messages": 5})
    low, high = wait_for(lambda: (marks := watermarks(bootstrap, topic, 0))[0] > 0 and marks,
                         timeout=60, what="retention to delete something")
    assert high == 150
    if "retention.ms" in config:
        assert low <= 100  # only the old records could go
    # Offset 0 is gone: the consumer is told so and resets to the new log start.
    got = ck_consume(bootstrap, [(topic, 0, 0)], high - low, **{"auto.offset.reset": "earliest"})
    assert [m.offset() for m in got] == list(range(low, high))
    assert [m.value() for m in got] == [r.value for r in (old + new)[low:]]
    # The log start survives a restart, and appends go on after the end.
    assert retention_broker.stop() == 0
    retention_broker.start()
    assert watermarks(bootstrap, topic, 0)[0] >= low
    assert [m.offset() for m in ck_produce(bootstrap, topic, [Rec(b"later", partition=0)])] == [150]
