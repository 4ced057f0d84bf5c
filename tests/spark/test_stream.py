"""Streaming reads: offsets journaled in Spark's checkpoint, so a query stopped and restarted
reads every record exactly once; rate limits, new partitions and lost data as Spark's Kafka
source handles them."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from strom.testing import create_topic

from .conftest import finished, produce, read


def run_available_now(spark, bootstrap: str, out, checkpoint, **options):
    """One Trigger.AvailableNow run into a Parquet sink (itself exactly-once); the finished query."""
    df = (spark.readStream.format("strom").option("kafka.bootstrap.servers", bootstrap)
          .options(**{"startingOffsets": "earliest", **options}).load())
    query = (df.selectExpr("topic", "partition", "offset", "cast(value as string) as value").writeStream
             .format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    return finished(query)


def parquet_rows(spark, out) -> list[tuple]:
    return sorted(tuple(r) for r in spark.read.parquet(str(out)).collect())


def test_restart_from_checkpoint_reads_exactly_once(spark, broker, topic, tmp_path):
    create_topic(broker.bootstrap, topic, partitions=2)
    produce(broker.bootstrap, topic, [dict(value=b"%d" % i, partition=i % 2) for i in range(100)])
    run_available_now(spark, broker.bootstrap, tmp_path / "out", tmp_path / "ckpt", subscribe=topic)
    assert len(parquet_rows(spark, tmp_path / "out")) == 100

    produce(broker.bootstrap, topic, [dict(value=b"%d" % i, partition=i % 2) for i in range(100, 150)])
    query = run_available_now(spark, broker.bootstrap, tmp_path / "out", tmp_path / "ckpt", subscribe=topic)
    rows = parquet_rows(spark, tmp_path / "out")
    assert sorted(int(r[3]) for r in rows) == list(range(150))  # nothing lost, nothing twice
    assert sorted((r[1], r[2]) for r in rows) == sorted((p, o) for p in (0, 1) for o in range(75))
    assert sum(p["numInputRows"] for p in query.recentProgress) == 50
    end = json.loads(query.lastProgress["sources"][0]["endOffset"])
    assert end == {topic: {"0": 75, "1": 75}}


def test_max_offsets_per_trigger(spark, broker, topic, tmp_path):
    create_topic(broker.bootstrap, topic, partitions=2)
    produce(broker.bootstrap, topic, [dict(value=b"%d" % i, partition=i % 2) for i in range(100)])
    query = run_available_now(spark, broker.bootstrap, tmp_path / "out", tmp_path / "ckpt",
                              subscribe=topic, maxOffsetsPerTrigger="30")
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [30, 30, 30, 10]
    assert len(parquet_rows(spark, tmp_path / "out")) == 100


def test_pattern_picks_up_new_topics(spark, broker, topic, tmp_path):
    create_topic(broker.bootstrap, topic + "-a", partitions=2)
    produce(broker.bootstrap, topic + "-a", [dict(value=b"a%d" % i) for i in range(10)])
    pattern = topic.replace("-", "[-]") + "-.*"
    run_available_now(spark, broker.bootstrap, tmp_path / "out", tmp_path / "ckpt", subscribePattern=pattern)
    create_topic(broker.bootstrap, topic + "-b", partitions=1)
    produce(broker.bootstrap, topic + "-b", [dict(value=b"b%d" % i) for i in range(5)])
    produce(broker.bootstrap, topic + "-a", [dict(value=b"a%d" % i) for i in range(10, 13)])
    run_available_now(spark, broker.bootstrap, tmp_path / "out", tmp_path / "ckpt", subscribePattern=pattern)
    values = sorted(r[3] for r in parquet_rows(spark, tmp_path / "out"))
    assert values == sorted([f"a{i}" for i in range(13)] + [f"b{i}" for i in range(5)])


def delete_records(bootstrap: str, topic: str, partition: int, before: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tp = TopicPartition(topic, partition, before)
    assert admin.delete_records([tp])[tp].result(timeout=15).low_watermark == before


def test_fail_on_data_loss_batch(spark, broker, topic):
    create_topic(broker.bootstrap, topic)
    produce(broker.bootstrap, topic, [dict(value=b"%d" % i) for i in range(100)])
    delete_records(broker.bootstrap, topic, 0, 30)
    from_zero = json.dumps({topic: {"0": 0}})
    with pytest.raises(Exception, match=f"Offsets 0-29 of {topic}-0 were to be read but the log now starts at 30"):
        read(spark, broker.bootstrap, subscribe=topic, startingOffsets=from_zero).collect()
    df = read(spark, broker.bootstrap, subscribe=topic, startingOffsets=from_zero, failOnDataLoss="false")
    assert sorted(r.offset for r in df.collect()) == list(range(30, 100))
    # "earliest" is where the log starts now: nothing is lost.
    assert read(spark, broker.bootstrap, subscribe=topic).count() == 70


def test_fail_on_data_loss_stream(spark, broker, topic, tmp_path):
    create_topic(broker.bootstrap, topic)
    produce(broker.bootstrap, topic, [dict(value=b"%d" % i) for i in range(100)])
    run_available_now(spark, broker.bootstrap, tmp_path / "out", tmp_path / "ckpt", subscribe=topic)
    produce(broker.bootstrap, topic, [dict(value=b"%d" % i) for i in range(100, 200)])
    delete_records(broker.bootstrap, topic, 0, 150)  # offsets 100-149 go before the query read them
    with pytest.raises(Exception, match=f"Offsets 100-149 of {topic}-0 were to be read"):
        run_available_now(spark, broker.bootstrap, tmp_path / "out", tmp_path / "ckpt", subscribe=topic)
    run_available_now(spark, broker.bootstrap, tmp_path / "out", tmp_path / "ckpt", subscribe=topic,
                      failOnDataLoss="false")
    values = sorted(int(r[3]) for r in parquet_rows(spark, tmp_path / "out"))
    assert values == list(range(100)) + list(range(150, 200))


def test_streams_start_at_latest_by_default(spark, broker, topic, tmp_path):
    create_topic(broker.bootstrap, topic, partitions=2)
    produce(broker.bootstrap, topic, [dict(value=b"old-%d" % i, partition=i % 2) for i in range(10)])
    run_available_now(spark, broker.bootstrap, tmp_path / "out", tmp_path / "ckpt", subscribe=topic,
                      startingOffsets="latest")
    produce(broker.bootstrap, topic, [dict(value=b"new-%d" % i, partition=i % 2) for i in range(4)])
    run_available_now(spark, broker.bootstrap, tmp_path / "out", tmp_path / "ckpt", subscribe=topic,
                      startingOffsets="latest")
    assert sorted(r[3] for r in parquet_rows(spark, tmp_path / "out")) == [f"new-{i}" for i in range(4)]
