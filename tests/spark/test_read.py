"""Batch reads through the `strom` source: what was produced comes back, column for column."""

from __future__ import annotations

import datetime
import json

import pytest
from confluent_kafka import Producer

from strom.testing import TIMESTAMP_BASE_MS, create_topic

from .conftest import produce, read

KAFKA_COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]


def test_batch_read_equals_produced(spark, broker, topic):
    create_topic(broker.bootstrap, topic, partitions=3)
    base = TIMESTAMP_BASE_MS
    records = [dict(value=b"value-%d" % i, key=b"key-%d" % i if i % 3 else None, partition=i % 3,
                    timestamp=base + i, headers=[("h", b"%d" % i), ("k2", b"")] if i % 2 else None)
               for i in range(600)]
    # Two producers, two compression codecs: batches of both kinds end up in every partition.
    reports = produce(broker.bootstrap, topic, records[:300], **{"compression.type": "lz4"})
    reports += produce(broker.bootstrap, topic, records[300:], **{"compression.type": "zstd"})

    df = read(spark, broker.bootstrap, subscribe=topic, includeHeaders="true")
    assert df.columns == KAFKA_COLUMNS + ["headers"]
    got = {(r.partition, r.offset): r for r in df.collect()}
    assert len(got) == 600
    for rec, msg in zip(records, reports, strict=True):
        row = got[(msg.partition(), msg.offset())]
        assert (row.key, row.value, row.topic) == (rec["key"], rec["value"], topic)
        headers = [(h.key, h.value) for h in row.headers] if row.headers else None
        assert headers == rec["headers"]
        expected_ts = datetime.datetime.fromtimestamp(rec["timestamp"] / 1000, datetime.UTC)
        assert row.timestamp.astimezone(datetime.UTC) == expected_ts
        assert row.timestampType == 0  # CreateTime

    plain = read(spark, broker.bootstrap, subscribe=topic)
    assert plain.columns == KAFKA_COLUMNS
    assert plain.count() == 600


def test_starting_and_ending_offsets_json(spark, broker, topic):
    create_topic(broker.bootstrap, topic, partitions=2)
    produce(broker.bootstrap, topic, [dict(value=b"%d" % i, partition=i % 2) for i in range(40)])
    df = read(spark, broker.bootstrap, subscribe=topic,
              startingOffsets=json.dumps({topic: {"0": 5, "1": -2}}),
              endingOffsets=json.dumps({topic: {"0": 9, "1": -1}}))
    got = sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())
    assert got == [(0, o) for o in range(5, 9)] + [(1, o) for o in range(20)]


def test_assign_and_subscribe_pattern(spark, broker, topic):
    create_topic(broker.bootstrap, topic + "-a", partitions=2)
    create_topic(broker.bootstrap, topic + "-b", partitions=1)
    produce(broker.bootstrap, topic + "-a", [dict(value=b"a", partition=i % 2) for i in range(10)])
    produce(broker.bootstrap, topic + "-b", [dict(value=b"b") for _ in range(3)])

    assigned = read(spark, broker.bootstrap, assign=json.dumps({topic + "-a": [1]}))
    assert sorted((r.topic, r.partition) for r in assigned.collect()) == [(topic + "-a", 1)] * 5
    matched = read(spark, broker.bootstrap, subscribePattern=topic.replace("-", "[-]") + "-.*")
    counts = {r.topic: r["count"] for r in matched.groupBy("topic").count().collect()}
    assert counts == {topic + "-a": 10, topic + "-b": 3}
    listed = read(spark, broker.bootstrap, subscribe=f"{topic}-b, {topic}-a")
    assert listed.count() == 13


def test_min_partitions_splits_ranges(spark, broker, topic):
    create_topic(broker.bootstrap, topic, partitions=2)
    produce(broker.bootstrap, topic, [dict(value=b"%d" % i, partition=i % 2) for i in range(1000)])
    df = read(spark, broker.bootstrap, subscribe=topic, minPartitions="7")
    assert df.rdd.getNumPartitions() >= 7
    got = sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())
    assert got == sorted((p, o) for p in (0, 1) for o in range(500))


def test_starting_timestamps(spark, broker, topic):
    create_topic(broker.bootstrap, topic, partitions=2)
    base = TIMESTAMP_BASE_MS
    produce(broker.bootstrap, topic, [dict(value=b"%d" % i, partition=i % 2, timestamp=base + i * 1000)
                                      for i in range(20)])
    # Partition 0 holds timestamps base+0, +2000, ...; partition 1 base+1000, +3000, ...
    df = read(spark, broker.bootstrap, subscribe=topic, startingTimestamp=str(base + 10_500))
    assert sorted(int(r.value) for r in df.collect()) == list(range(11, 20))
    by_partition = read(spark, broker.bootstrap, subscribe=topic, startingOffsetsByTimestamp=json.dumps(
        {topic: {"0": base + 16_000, "1": base}}))
    assert sorted(int(r.value) for r in by_partition.collect()) == [1, 3, 5, 7, 9, 11, 13, 15, 16, 17, 18, 19]


def test_empty_and_missing_topics(spark, broker, topic):
    """An empty topic reads as no rows; one that does not exist is an error for subscribe and
    assign, as in Spark's Kafka source (a pattern that matches nothing is just empty)."""
    create_topic(broker.bootstrap, topic)
    assert read(spark, broker.bootstrap, subscribe=topic).count() == 0
    assert read(spark, broker.bootstrap, subscribePattern=topic + "-never-.*").count() == 0
    missing = topic + "-never-created"
    with pytest.raises(Exception, match=f"subscribe: topic\\(s\\) '{missing}' do not exist"):
        read(spark, broker.bootstrap, subscribe=f"{topic},{missing}").count()
    with pytest.raises(Exception, match=f"assign: topic '{missing}' does not exist"):
        read(spark, broker.bootstrap, assign=json.dumps({missing: [0]})).count()
    with pytest.raises(Exception, match=r"has no partition\(s\) \[3\] \(it has \[0\]\)"):
        read(spark, broker.bootstrap, assign=json.dumps({topic: [0, 3]})).count()


def test_transaction_markers_and_aborted_data_are_not_data_loss(spark, broker, topic):
    create_topic(broker.bootstrap, topic)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "txn-" + topic})
    producer.init_transactions(15)
    for values, commit in (([b"a", b"b", b"c"], True), ([b"x", b"y"], False), ([b"d", b"e"], True)):
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value)
        assert producer.flush(15) == 0  # in the log before the transaction ends
        producer.commit_transaction(15) if commit else producer.abort_transaction(15)
    # Offsets: 0-2 data, 3 commit marker, 4-5 aborted data, 6 abort marker, 7-8 data, 9 marker.
    committed = read(spark, broker.bootstrap, subscribe=topic, **{"kafka.isolation.level": "read_committed"})
    assert [(r.offset, r.value) for r in committed.orderBy("offset").collect()] == [
        (0, b"a"), (1, b"b"), (2, b"c"), (7, b"d"), (8, b"e")]
    everything = read(spark, broker.bootstrap, subscribe=topic)
    assert [r.value for r in everything.orderBy("offset").collect()] == [b"a", b"b", b"c", b"x", b"y", b"d", b"e"]


def test_spark_reads_an_iceberg_topics_parquet_files(spark, tmp_path):
    """Iceberg topics (strom.tables): the Parquet files of a key_value topic's table, as Spark
    reads them without an Iceberg runtime, hold the topic's records."""
    from pyiceberg.catalog.sql import SqlCatalog

    from strom.testing import BrokerProcess, consume_all, unique_name, wait_for

    with BrokerProcess(overrides={"iceberg.enabled": "true", "iceberg.commit.interval.ms": "200",
                                  "iceberg.catalog.uri": f"sqlite:///{tmp_path / 'catalog.db'}",
                                  "iceberg.warehouse": (tmp_path / "warehouse").as_uri()}) as proc:
        topic = unique_name("iceberg")
        create_topic(proc.bootstrap, topic, partitions=2, config={"iceberg.mode": "key_value"})
        produce(proc.bootstrap, topic, [dict(value=b"v-%d" % i, key=b"k-%d" % i, partition=i % 2) for i in range(60)])
        expected = {(m.partition(), m.offset(), m.key(), m.value()) for m in consume_all(proc.bootstrap, topic)}
        catalog = SqlCatalog("strom", uri=f"sqlite:///{tmp_path / 'catalog.db'}",
                             warehouse=(tmp_path / "warehouse").as_uri())

        def files() -> list[str] | None:
            if not catalog.table_exists(("strom", topic)):
                return None
            table = catalog.load_table(("strom", topic))
            return table.inspect.files()["file_path"].to_pylist() if len(table.scan().to_arrow()) == 60 else None

        paths = wait_for(files, 30, what="the table holding the 60 records")
    got = {(r.partition, r.offset, bytes(r.key), bytes(r.value))
           for r in spark.read.parquet(*paths).select("partition", "offset", "key", "value").collect()}
    assert len(expected) == 60 and got == expected
