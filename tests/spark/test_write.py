"""The `strom` sink: Spark's Kafka sink columns, batch and streaming, read back by a plain
consumer. Streaming writes are at-least-once: a replayed micro-batch is written again."""

from __future__ import annotations

from collections import Counter

import pytest
from kafka.partitioner.default import murmur2

import strom.spark
from strom.testing import consume_all, create_topic

from .conftest import end_offsets, finished, produce


def write(df, bootstrap: str, **options) -> None:
    df.write.format("strom").option("kafka.bootstrap.servers", bootstrap).options(**options).mode("append").save()


def test_batch_write_all_columns(spark, broker, topic):
    create_topic(broker.bootstrap, topic, partitions=3)
    rows = [(f"k{i}" if i % 4 else None, b"v%d" % i, i % 3, [("h", b"%d" % i)] if i % 2 else None)
            for i in range(300)]
    df = spark.createDataFrame(rows, "key string, value binary, partition int, "
                                     "headers array<struct<key:string,value:binary>>").repartition(4)
    write(df, broker.bootstrap, topic=topic)
    got = consume_all(broker.bootstrap, topic)
    as_read = Counter((m.key().decode() if m.key() else None, m.value(), m.partition(), tuple(m.headers() or ()))
                      for m in got)
    assert as_read == Counter((k, v, p, tuple(h or ())) for k, v, p, h in rows)


def test_topic_column_and_default_partitioner(spark, broker, topic):
    create_topic(broker.bootstrap, topic + "-x", partitions=4)
    create_topic(broker.bootstrap, topic + "-y", partitions=4)
    rows = [(f"{topic}-{'xy'[i % 2]}", f"key-{i}", f"value-{i}") for i in range(200)]
    write(spark.createDataFrame(rows, "topic string, key string, value string"), broker.bootstrap)
    for name in ("x", "y"):
        got = consume_all(broker.bootstrap, f"{topic}-{name}")
        assert sorted(m.value().decode() for m in got) == sorted(v for t, _, v in rows if t.endswith(name))
        # Keys land where the Java client (and so Spark's Kafka sink) puts them: murmur2.
        assert all(m.partition() == (murmur2(m.key()) & 0x7FFFFFFF) % 4 for m in got)
    # The topic option wins over the column.
    write(spark.createDataFrame(rows[:10], "topic string, key string, value string"), broker.bootstrap,
          topic=topic + "-z")
    assert len(consume_all(broker.bootstrap, topic + "-z")) == 10


def stream_copy(spark, bootstrap: str, source: str, target: str, checkpoint, where: str = "true",
                **sink_options):
    """readStream source -> writeStream target, 20 offsets per micro-batch, AvailableNow."""
    df = (spark.readStream.format("strom").option("kafka.bootstrap.servers", bootstrap)
          .option("subscribe", source).option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", "20").load().where(where))
    query = (df.select("key", "value").writeStream.format("strom")
             .option("kafka.bootstrap.servers", bootstrap).option("topic", target)
             .option("checkpointLocation", str(checkpoint)).options(**sink_options)
             .trigger(availableNow=True).start())
    return finished(query)


def forget_last_commit(checkpoint) -> None:
    """What Spark finds after a crash between the sink's commit and its own commit log entry:
    on restart it runs the last batch again."""
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)


def test_stream_write_and_replayed_batch(spark, broker, topic, tmp_path):
    create_topic(broker.bootstrap, topic + "-in")
    produce(broker.bootstrap, topic + "-in", [dict(key=b"k%d" % i, value=b"v%d" % i) for i in range(60)])
    query = stream_copy(spark, broker.bootstrap, topic + "-in", topic + "-out", tmp_path / "ckpt")
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [20, 20, 20]
    first = consume_all(broker.bootstrap, topic + "-out")
    assert sorted(m.value() for m in first) == sorted(b"v%d" % i for i in range(60))
    assert all(m.key() == b"k" + m.value()[1:] for m in first)

    # Without transactionalIdPrefix the sink is at-least-once: a replayed batch is written again.
    forget_last_commit(tmp_path / "ckpt")
    stream_copy(spark, broker.bootstrap, topic + "-in", topic + "-out", tmp_path / "ckpt")
    again = consume_all(broker.bootstrap, topic + "-out")
    assert len(again) == 80
    counts = Counter(m.value() for m in again)
    assert set(counts) == {b"v%d" % i for i in range(60)}
    assert sorted(v for v, n in counts.items() if n == 2) == sorted(b"v%d" % i for i in range(40, 60))


def test_exactly_once_stream_write(spark, broker, topic, tmp_path):
    create_topic(broker.bootstrap, topic + "-in", partitions=2)
    produce(broker.bootstrap, topic + "-in", [dict(value=b"v%d" % i, partition=i % 2) for i in range(60)])
    prefix = "eos-" + topic
    stream_copy(spark, broker.bootstrap, topic + "-in", topic + "-out", tmp_path / "ckpt",
                transactionalIdPrefix=prefix)
    committed = consume_all(broker.bootstrap, topic + "-out", **{"isolation.level": "read_committed"})
    assert sorted(m.value() for m in committed) == sorted(b"v%d" % i for i in range(60))

    # The replayed batch's tasks see it committed and write nothing; more input goes on normally.
    forget_last_commit(tmp_path / "ckpt")
    produce(broker.bootstrap, topic + "-in", [dict(value=b"v%d" % i, partition=i % 2) for i in range(60, 70)])
    stream_copy(spark, broker.bootstrap, topic + "-in", topic + "-out", tmp_path / "ckpt",
                transactionalIdPrefix=prefix)
    committed = consume_all(broker.bootstrap, topic + "-out", **{"isolation.level": "read_committed"})
    assert Counter(m.value() for m in committed) == Counter(b"v%d" % i for i in range(70))
    # Everything is decided: the last stable offset is the end of the log.
    assert all(lso == hw for lso, hw in end_offsets(broker.bootstrap, topic + "-out"))


def test_exactly_once_with_tasks_that_write_nothing(spark, broker, topic, tmp_path):
    create_topic(broker.bootstrap, topic + "-in", partitions=2)
    produce(broker.bootstrap, topic + "-in", [dict(value=b"v%d" % i, partition=i % 2) for i in range(20)])
    stream_copy(spark, broker.bootstrap, topic + "-in", topic + "-out", tmp_path / "ckpt", where="partition = 0",
                transactionalIdPrefix="eos-" + topic)
    committed = consume_all(broker.bootstrap, topic + "-out", **{"isolation.level": "read_committed"})
    assert sorted(m.value() for m in committed) == sorted(b"v%d" % i for i in range(0, 20, 2))


def test_a_new_query_reusing_a_prefix_writes_everything(spark, broker, topic, tmp_path):
    """A second query (new checkpoint, so its batch ids start again at 0) with the prefix of a
    first one that ran 3 batches: it takes the prefix over and writes all its records, once."""
    create_topic(broker.bootstrap, topic + "-in", partitions=2)
    produce(broker.bootstrap, topic + "-in", [dict(value=b"v%d" % i, partition=i % 2) for i in range(60)])
    prefix = "eos-" + topic
    first = stream_copy(spark, broker.bootstrap, topic + "-in", topic + "-a", tmp_path / "a",
                        transactionalIdPrefix=prefix)
    assert len([p for p in first.recentProgress if p["numInputRows"]]) == 3
    second = stream_copy(spark, broker.bootstrap, topic + "-in", topic + "-b", tmp_path / "b",
                         transactionalIdPrefix=prefix)
    assert second.exception() is None
    for target in (topic + "-a", topic + "-b"):
        committed = consume_all(broker.bootstrap, target, **{"isolation.level": "read_committed"})
        assert Counter(m.value() for m in committed) == Counter(b"v%d" % i for i in range(60)), target
        assert all(lso == hw for lso, hw in end_offsets(broker.bootstrap, target))


def test_transactional_id_prefix_outside_a_stream_is_refused(spark, broker, topic):
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(ValueError, match="transactionalIdPrefix makes a write exactly-once per micro-batch"):
        df.write.format("strom").option("kafka.bootstrap.servers", broker.bootstrap).option("topic", topic) \
            .option("transactionalIdPrefix", "p").save()


def test_exactly_once_foreach_batch_is_not_written_twice_on_replay(spark, broker, topic, tmp_path):
    """Update-mode counts through strom.spark.foreach_batch with a transactionalIdPrefix; the
    last batch replayed (Spark's commit log entry lost in a crash) writes nothing again."""
    create_topic(broker.bootstrap, topic, partitions=2)
    produce(broker.bootstrap, topic, [dict(key=b"k%d" % (i % 3), value=b"x", partition=i % 2) for i in range(60)])

    def run():
        counts = (spark.readStream.format("strom").option("kafka.bootstrap.servers", broker.bootstrap)
                  .option("subscribe", topic).option("startingOffsets", "earliest")
                  .option("maxOffsetsPerTrigger", "20").load()
                  .groupBy("key").count().selectExpr("key", "cast(count as string) as value"))
        write = strom.spark.foreach_batch(**{"kafka.bootstrap.servers": broker.bootstrap, "topic": topic + "-counts",
                                             "transactionalIdPrefix": "eos-" + topic})
        return finished(counts.writeStream.outputMode("update").foreachBatch(write)
                        .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())

    run()
    first = consume_all(broker.bootstrap, topic + "-counts", **{"isolation.level": "read_committed"})
    assert len(first) == 9  # three keys, three batches
    forget_last_commit(tmp_path / "ckpt")
    replay = run()
    assert [p["batchId"] for p in replay.recentProgress if p["numInputRows"]] == [2]
    again = consume_all(broker.bootstrap, topic + "-counts", **{"isolation.level": "read_committed"})
    assert sorted((m.key(), m.value()) for m in again) == sorted((m.key(), m.value()) for m in first)
    assert {m.key(): m.value() for m in again} == {b"k0": b"20", b"k1": b"20", b"k2": b"20"}
