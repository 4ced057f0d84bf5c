"""Exactly-once stream copies (sink option transactionalIdPrefix) through real faults injected
in the middle of a micro-batch, after the failing task has already written part of it into its
open transaction: the task fails and Spark runs it again, or the broker is killed with kill -9
and restarted. The committed output must be the input once, and the records of the attempt that
was cut short must be there, aborted, where the fault made a task fail."""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from strom.testing import BrokerProcess, consume_all, create_topic, wait_for

from .conftest import end_offsets, finished, produce

pytestmark = pytest.mark.timeout(300)

ROWS = 80  # over 2 input partitions, 40 offsets per micro-batch: 20 rows per task
# Spark's pipes between the JVM and Python workers carry 64 KB at a time: rows this large get
# through to the sink's task a few at a time, not only when the task's input ends.
PAD = b"." * 16_000


def value(i: int) -> bytes:
    return b"v%d-" % i + PAD


# The row the fault waits for (the first of input partition 1 in the first micro-batch) and the
# row it strikes at (the sixteenth of that same task): the task has written the first by then.
LANDED, TRIGGER = value(1), value(31)


def fault_at(trigger: bytes, landed: bytes, bootstrap: str, target: str, marker: Path,
             act: Callable[[], None]) -> Callable[[bytes], None]:
    """A check run on every row on its way to the sink (in Spark's Python worker): at `trigger`,
    once per test (the first to create `marker`), wait until the task's earlier row `landed` is
    in `target` (uncommitted: its transaction is still open), note in `marker` that it was, then
    `act`."""

    def fault(value: bytes) -> None:
        if value != trigger:
            return
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "fault", "enable.auto.commit": False,
                      "isolation.level": "read_uncommitted"})
        try:
            partitions = c.list_topics(target, timeout=30).topics[target].partitions
            c.assign([TopicPartition(target, p, 0) for p in partitions])
            for _ in range(600):  # 60 s at most; the test sees in `marker` whether it landed
                msg = c.poll(0.1)
                if msg is not None and msg.error() is None and msg.value() == landed:
                    marker.write_text("landed")
                    break
        finally:
            c.close()
        act()

    return fault


def copy_through(spark, bootstrap: str, source: str, target: str, checkpoint: Path, prefix: str,
                 fault: Callable[[bytes], None]):
    """readStream source -> `fault` on each value -> exactly-once writeStream target, 40 offsets
    per micro-batch, AvailableNow."""
    from pyspark.sql.functions import col, udf
    from pyspark.sql.types import BinaryType

    def checked(value):  # no type hints: Spark would read them as a pandas UDF's
        fault(value)
        return value

    df = (spark.readStream.format("strom").option("kafka.bootstrap.servers", bootstrap)
          .option("subscribe", source).option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", "40").load())
    query = (df.select("key", udf(checked, BinaryType())(col("value")).alias("value")).writeStream
             .format("strom").option("kafka.bootstrap.servers", bootstrap).option("topic", target)
             .option("transactionalIdPrefix", prefix).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    return finished(query)


def prepare(bootstrap: str, topic: str) -> tuple[str, str, list[bytes]]:
    source, target = topic + "-in", topic + "-out"
    create_topic(bootstrap, source, partitions=2)
    create_topic(bootstrap, target)
    values = [value(i) for i in range(ROWS)]
    produce(bootstrap, source, [dict(value=v, partition=i % 2) for i, v in enumerate(values)])
    return source, target, values


def check_exactly_once(bootstrap: str, target: str, values: list[bytes], marker: Path) -> Counter:
    """The committed output is `values` once, every transaction is decided, and the fault struck
    after its task had written part of its batch; what the topic holds, aborted records too."""
    assert marker.read_text() == "landed", "the fault did not hit a task that had written part of its batch"
    committed = consume_all(bootstrap, target, **{"isolation.level": "read_committed"})
    assert Counter(m.value() for m in committed) == Counter(values)
    assert all(lso == hw for lso, hw in end_offsets(bootstrap, target))
    return Counter(m.value() for m in consume_all(bootstrap, target))


def test_exactly_once_through_a_task_that_fails_mid_write(spark, broker, topic, tmp_path, row_at_a_time):
    """The task fails after writing some of its rows; Spark runs it again (local[2,2] allows
    one retry), whose producer fences the first attempt's transaction and aborts it."""
    bs = broker.bootstrap
    source, target, values = prepare(bs, topic)

    def fail() -> None:
        raise RuntimeError("injected task failure")

    marker = tmp_path / "failed"
    copy_through(spark, bs, source, target, tmp_path / "ckpt", "eos-" + topic,
                 fault_at(TRIGGER, LANDED, bs, target, marker, fail))
    everything = check_exactly_once(bs, target, values, marker)
    # The failed attempt's copy of LANDED is in the log, aborted.
    assert everything[LANDED] == 2


def copy_through_a_kill(spark, victim: BrokerProcess, bootstrap: str, source: str, target: str,
                        tmp_path: Path, prefix: str) -> Path:
    """`copy_through` with a fault that kills `victim` (kill -9) mid-batch, while a thread
    restarts it on its port as soon as it is dead. A query that fails meanwhile is run again
    from its checkpoint, as an operator would (three runs at most). The fault's marker."""
    pid = victim.proc.pid
    stop = threading.Event()

    def restart_when_killed() -> None:
        while not stop.is_set():
            if victim.proc.poll() is not None:
                victim.start()
                return
            stop.wait(0.05)

    restarter = threading.Thread(target=restart_when_killed, daemon=True)
    restarter.start()
    marker = tmp_path / "killed"
    fault = fault_at(TRIGGER, LANDED, bootstrap, target, marker, lambda: os.kill(pid, 9))
    failures: list[BaseException] = []
    try:
        for _ in range(3):
            try:
                copy_through(spark, bootstrap, source, target, tmp_path / "ckpt", prefix, fault)
                break
            except Exception as e:  # noqa: BLE001 - the query failed: run it again
                failures.append(e)
        else:
            raise AssertionError(f"the query failed three times: {failures}")
    finally:
        stop.set()
        restarter.join(60)
    wait_for(lambda: victim.proc.pid != pid and victim.proc.poll() is None, 60, what="the restarted broker")
    return marker


def test_exactly_once_through_a_broker_kill_mid_batch(spark, topic, tmp_path, row_at_a_time):
    """kill -9 of the (only) broker while a task has written part of its batch; it comes back
    on the same port. Whatever failed meanwhile, the committed output is the input once."""
    with BrokerProcess() as broker:
        bs = broker.bootstrap
        source, target, values = prepare(bs, topic)
        marker = copy_through_a_kill(spark, broker, bs, source, target, tmp_path, "eos-" + topic)
        check_exactly_once(bs, target, values, marker)
