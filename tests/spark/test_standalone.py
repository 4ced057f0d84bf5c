"""The `strom` source, sink and exactly-once writers on Spark as a distributed engine: a
standalone cluster (a master and two workers started from the installed PySpark, one core
each), whose executors run in JVMs of their own and start their own Python workers. One
cluster and one session for the module; the last test kills a worker mid-batch (and starts a
new one for whatever runs after it)."""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

import strom.spark
from strom.spark.standalone import StandaloneCluster, executors
from strom.testing import consume_all, create_topic

from .conftest import end_offsets, finished, one_row_batches, produce, read, release, spark_on
from .test_exactly_once_faults import (
    LANDED,
    TRIGGER,
    check_exactly_once,
    copy_through,
    fault_at,
    prepare,
)

pytestmark = pytest.mark.timeout(600)
# Executors cannot import this test module: its functions travel by value to their Python workers.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster():
    with StandaloneCluster(workers=2, cores=1, memory="1g", executor_memory="512m") as c:
        yield c
        release("standalone")  # before its master and workers go


@pytest.fixture
def spark(cluster):
    return spark_on("standalone", lambda: cluster.session("strom-standalone-tests"))


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def executor_jvm() -> int:
    """The pid of the executor JVM whose Python worker calls this (its nearest JVM ancestor)."""
    pid = os.getpid()
    while b"CoarseGrainedExecutorBackend" not in _cmdline(pid):
        pid = _parent(pid)
    return pid


def worker_of(executor: int) -> int:
    return _parent(executor)


def test_reads_run_in_both_executors(spark, cluster, broker, topic, tmp_path):
    """Batch and stream reads: every record once, read by tasks in both workers' executors
    (each its own JVM, a child of its worker) and their Python workers."""
    create_topic(broker.bootstrap, topic, partitions=4)
    produce(broker.bootstrap, topic, [dict(value=b"%d" % i, partition=i % 4) for i in range(400)])
    jvm = F.udf(lambda _: executor_jvm(), LongType())

    rows = read(spark, broker.bootstrap, subscribe=topic).select("value", jvm("value").alias("jvm")).collect()
    assert sorted(int(r.value) for r in rows) == list(range(400))
    jvms = {r.jvm for r in rows}
    assert {worker_of(p) for p in jvms} == {w.proc.pid for w in cluster.workers}
    assert os.getpid() not in {_parent(p) for p in jvms}  # not the driver's

    stream = (spark.readStream.format("strom").option("kafka.bootstrap.servers", broker.bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "150")
              .load().select("value", jvm("value").alias("jvm")))
    name = "standalone_" + topic.replace("-", "_")
    finished(stream.writeStream.format("memory").queryName(name).trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    got = spark.table(name).collect()
    assert Counter(int(r.value) for r in got) == Counter(range(400))
    assert {worker_of(r.jvm) for r in got} == {w.proc.pid for w in cluster.workers}


def test_batch_and_stream_writes(spark, broker, topic, tmp_path):
    """The sink from executors: a batch write of four partitions, and an at-least-once
    streaming copy."""
    create_topic(broker.bootstrap, topic + "-batch", partitions=2)
    rows = [(f"k{i}", f"v{i}") for i in range(300)]
    df = spark.createDataFrame(rows, "key string, value string").repartition(4)
    df.write.format("strom").option("kafka.bootstrap.servers", broker.bootstrap).option("topic", topic + "-batch") \
        .save()
    got = consume_all(broker.bootstrap, topic + "-batch")
    assert sorted((m.key().decode(), m.value().decode()) for m in got) == sorted(rows)

    query = (spark.readStream.format("strom").option("kafka.bootstrap.servers", broker.bootstrap)
             .option("subscribe", topic + "-batch").option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", "100").load().select("key", "value").writeStream.format("strom")
             .option("kafka.bootstrap.servers", broker.bootstrap).option("topic", topic + "-copy")
             .option("checkpointLocation", str(tmp_path / "copy")).trigger(availableNow=True).start())
    finished(query)
    copied = consume_all(broker.bootstrap, topic + "-copy")
    assert sorted((m.key().decode(), m.value().decode()) for m in copied) == sorted(rows)


def test_exactly_once_update_mode_through_foreach_batch(spark, broker, topic, tmp_path):
    """An aggregation in update mode, written by strom.spark.foreach_batch with a
    transactionalIdPrefix: each micro-batch's counts committed once, in transactions."""
    create_topic(broker.bootstrap, topic, partitions=2)
    create_topic(broker.bootstrap, topic + "-counts")
    produce(broker.bootstrap, topic, [dict(key=b"k%d" % (i % 5), value=b"x", partition=i % 2) for i in range(100)])
    counts = (spark.readStream.format("strom").option("kafka.bootstrap.servers", broker.bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "40")
              .load().groupBy("key").count().selectExpr("key", "cast(count as string) as value"))
    write = strom.spark.foreach_batch(**{"kafka.bootstrap.servers": broker.bootstrap, "topic": topic + "-counts",
                                         "transactionalIdPrefix": "eos-" + topic})
    query = finished(counts.writeStream.outputMode("update").foreachBatch(write)
                     .option("checkpointLocation", str(tmp_path / "counts")).trigger(availableNow=True).start())
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [40, 40, 20]
    committed = consume_all(broker.bootstrap, topic + "-counts", **{"isolation.level": "read_committed"})
    latest = {m.key(): int(m.value()) for m in committed}
    assert latest == {b"k%d" % k: 20 for k in range(5)}
    assert len(committed) == 15  # five keys updated in each of three batches
    assert all(lso == hw for lso, hw in end_offsets(broker.bootstrap, topic + "-counts"))


def kill_my_worker(record: Path) -> None:
    """kill -9 the Spark worker whose executor runs this Python worker, then the executor: a
    machine lost mid-task. Their pids go to `record`."""
    executor = executor_jvm()
    worker = worker_of(executor)
    record.write_text(f"{worker} {executor}")
    os.kill(worker, 9)
    os.kill(executor, 9)


def test_exactly_once_copy_through_a_worker_killed_mid_batch(spark, cluster, broker, topic, tmp_path):
    """A worker and its executor are killed (kill -9) while a task of the exactly-once copy has
    written part of its batch into its open transaction. Spark runs the task again on the
    other worker, whose producer fences the lost one's transaction; the query finishes and the
    committed output is the input once."""
    bs = broker.bootstrap
    source, target, values = prepare(bs, topic)
    marker, victims = tmp_path / "killed", tmp_path / "victims"
    with one_row_batches(spark):
        try:
            query = copy_through(spark, bs, source, target, tmp_path / "ckpt", "eos-" + topic,
                                 fault_at(TRIGGER, LANDED, bs, target, marker, lambda: kill_my_worker(victims)))
            assert query.exception() is None
            worker, executor = map(int, victims.read_text().split())
            lost = [i for i, w in enumerate(cluster.workers) if w.proc.pid == worker]
            assert len(lost) == 1 and cluster.workers[lost[0]].proc.poll() is not None, "no worker was killed"
            assert not Path(f"/proc/{executor}").exists()
            everything = check_exactly_once(bs, target, values, marker)
            assert everything[LANDED] == 2  # the lost attempt's copy is in the log, aborted
        finally:
            for i, w in enumerate(cluster.workers):
                if w.proc.poll() is not None:
                    cluster.replace_worker(i)
    # The cluster is whole again for whatever runs next on it.
    assert all(w.proc.poll() is None for w in cluster.workers)
    spark.range(4).repartition(2).count()
    assert len(executors(spark)) >= 1
