"""An at-least-once sink task without Spark: it closes its producer when it ends, whether it
wrote everything or failed midway (a Python worker outlives its tasks, and a producer kept
alive by a failed task's traceback would go on connecting to its brokers)."""

from __future__ import annotations

import pyarrow as pa
import pytest

import strom.spark.produce as produce
from strom.spark.options import sink_options
from strom.testing import consume_all, create_topic


def closed(p) -> bool:
    try:
        p.poll(0)
    except RuntimeError:
        return True
    return False


@pytest.fixture
def made(monkeypatch) -> list:
    out: list = []
    real = produce.producer

    def remembered(*args, **kwargs):
        out.append(real(*args, **kwargs))
        return out[-1]

    monkeypatch.setattr(produce, "producer", remembered)
    return out


def test_a_task_closes_its_producer_when_it_succeeds_or_fails(broker, topic, made):
    create_topic(broker.bootstrap, topic)
    opts = sink_options({"kafka.bootstrap.servers": broker.bootstrap, "topic": topic})
    batch = pa.RecordBatch.from_pydict({"value": [b"a", b"b"]})
    assert produce.write_task(opts, iter([batch])) == 2
    assert closed(made[-1])
    assert sorted(m.value() for m in consume_all(broker.bootstrap, topic)) == [b"a", b"b"]

    untargeted = sink_options({"kafka.bootstrap.servers": broker.bootstrap})  # no topic option
    rows = pa.RecordBatch.from_pydict({"value": [b"c"], "topic": pa.array([None], pa.string())})
    with pytest.raises(ValueError, match="null topic"):
        produce.write_task(untargeted, iter([rows]))
    assert closed(made[-1])
