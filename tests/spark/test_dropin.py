"""`format("kafka")` -> `format("strom")` in code written for Spark's Kafka connector: each
thing such code does, as Spark's guide and examples write it, with real PySpark and a broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kafka.partitioner.default import murmur2
from pyspark.sql.functions import col, window

import strom.spark
from strom.testing import consume_all, create_topic, wait_for

from .conftest import finished, produce, read

EXAMPLE = Path(sys.modules["pyspark"].__file__).parent / "examples/src/main/python/sql/streaming/structured_kafka_wordcount.py"


def strom_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strom", *args], capture_output=True, text=True, timeout=60)


# --- 1. the source is found without registering it ------------------------------------------

def test_sparks_kafka_wordcount_example_with_only_the_format_changed(broker, topic, tmp_path):
    """Spark's own structured_kafka_wordcount.py, from the installed PySpark, in a fresh
    interpreter that never imports strom: PySpark's data source lookup finds `strom`."""
    source = EXAMPLE.read_text()
    assert source.count('.format("kafka")') == 1
    script = tmp_path / "wordcount.py"
    script.write_text(source.replace('.format("kafka")', '.format("strom")'))
    create_topic(broker.bootstrap, topic)
    # Two shuffle partitions, as spark-submit --conf would set them: with Spark's 200 each
    # micro-batch of the example's aggregation is 200 tasks (half this test's time).
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PYSPARK_SUBMIT_ARGS": "--conf spark.sql.shuffle.partitions=2 pyspark-shell"}
    proc = subprocess.Popen([sys.executable, str(script), broker.bootstrap, "subscribe", topic],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    lines: list[str] = []
    try:
        import threading

        threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
        # startingOffsets defaults to latest: produce once the first (empty) batch is out.
        wait_for(lambda: any("Batch: 0" in line for line in lines) or proc.poll() is not None,
                 timeout=300, what="the example's first micro-batch")
        assert proc.poll() is None, "".join(lines[-40:])
        produce(broker.bootstrap, topic, [dict(value=b"to be or not to be")])
        wait_for(lambda: any(line.replace(" ", "") == "|to|2|\n" for line in lines), timeout=120,
                 what="the word counts on the console:\n" + "".join(lines[-40:]))
        assert any(line.replace(" ", "") == "|be|2|\n" for line in lines)
        assert any(line.replace(" ", "") == "|or|1|\n" for line in lines)
    finally:
        proc.kill()
        proc.wait(30)


# --- 2. save modes -------------------------------------------------------------------------

def test_the_default_save_mode_appends_as_in_sparks_guide(spark, broker, topic):
    create_topic(broker.bootstrap, topic)
    df = spark.createDataFrame([("k1", "v1"), ("k2", "v2")], "key string, value string")
    writer = df.write.format("strom").option("kafka.bootstrap.servers", broker.bootstrap).option("topic", topic)
    writer.save()  # no mode: Spark's default, ErrorIfExists, appends for Kafka
    df.write.format("strom").option("kafka.bootstrap.servers", broker.bootstrap).option("topic", topic) \
        .mode("errorifexists").save()
    df.write.save(format="strom", mode="append", topic=topic, **{"kafka.bootstrap.servers": broker.bootstrap})
    assert sorted(m.value() for m in consume_all(broker.bootstrap, topic)) == [b"v1"] * 3 + [b"v2"] * 3
    with pytest.raises(Exception, match="Save mode Ignore is not allowed"):
        writer.mode("ignore").save()
    with pytest.raises(Exception, match="Save mode Overwrite is not allowed"):
        writer.mode("overwrite").save()
    assert len(consume_all(broker.bootstrap, topic)) == 6


# --- 3. output modes -----------------------------------------------------------------------

def _windowed_counts(spark, bootstrap: str, topic: str):
    events = (spark.readStream.format("strom").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest").load())
    return (events.groupBy(window(col("timestamp"), "1 hour"), col("key")).count()
            .selectExpr("key", "cast(count as string) as value"))


def test_update_mode_through_foreach_batch(spark, broker, topic, tmp_path):
    """PySpark's Python streaming writers take append and complete only; a windowed
    aggregation in update mode goes through foreachBatch with strom.spark.foreach_batch."""
    create_topic(broker.bootstrap, topic)
    create_topic(broker.bootstrap, topic + "-counts")
    produce(broker.bootstrap, topic, [dict(key=b"a", value=b"x")] * 3 + [dict(key=b"b", value=b"y")])
    counts = _windowed_counts(spark, broker.bootstrap, topic)
    sink = strom.spark.foreach_batch(**{"kafka.bootstrap.servers": broker.bootstrap, "topic": topic + "-counts"})
    query = (counts.writeStream.outputMode("update").foreachBatch(sink)
             .option("checkpointLocation", str(tmp_path / "update")).trigger(availableNow=True).start())
    finished(query)
    assert query.exception() is None
    got = {m.key(): m.value() for m in consume_all(broker.bootstrap, topic + "-counts")}
    assert got == {b"a": b"3", b"b": b"1"}
    # Straight to format("strom"), update mode is refused by start() itself, with the recipe.
    direct = (counts.writeStream.outputMode("update").format("strom")
              .option("kafka.bootstrap.servers", broker.bootstrap).option("topic", topic + "-counts")
              .option("checkpointLocation", str(tmp_path / "direct")).trigger(availableNow=True))
    with pytest.raises(ValueError, match="(?s)Output mode update is not supported by the strom sink.*"
                                         f"foreach_batch.*{broker.bootstrap}.*{topic}-counts"):
        direct.start()
    assert not any(q.isActive for q in spark.streams.active)


def test_complete_mode_writes_every_count_each_batch(spark, broker, topic, tmp_path):
    create_topic(broker.bootstrap, topic)
    create_topic(broker.bootstrap, topic + "-counts")
    produce(broker.bootstrap, topic, [dict(key=b"a", value=b"x")] * 2)
    query = (_windowed_counts(spark, broker.bootstrap, topic).writeStream.outputMode("complete")
             .format("strom").option("kafka.bootstrap.servers", broker.bootstrap).option("topic", topic + "-counts")
             .option("checkpointLocation", str(tmp_path / "complete")).trigger(availableNow=True).start())
    finished(query)
    assert [(m.key(), m.value()) for m in consume_all(broker.bootstrap, topic + "-counts")] == [(b"a", b"2")]


# --- 4. options Spark's guide lists ----------------------------------------------------------

def test_min_offsets_per_trigger_waits_for_enough_records(spark, broker, topic, tmp_path):
    """minOffsetsPerTrigger holds micro-batches back until that many records are there, or
    maxTriggerDelay has passed since the last one."""
    create_topic(broker.bootstrap, topic)
    produce(broker.bootstrap, topic, [dict(value=b"%d" % i) for i in range(5)])

    def start(name: str, delay: str):
        df = (spark.readStream.format("strom").option("kafka.bootstrap.servers", broker.bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("minOffsetsPerTrigger", "10").option("maxTriggerDelay", delay).load())
        return (df.writeStream.format("memory").queryName(name).trigger(processingTime="500 milliseconds")
                .option("checkpointLocation", str(tmp_path / name)).start())

    # A delay no test waits for: only the count can release a batch.
    counted = "min_offsets_count_" + topic.replace("-", "_")
    query = start(counted, "10m")
    try:
        time.sleep(3)
        assert spark.table(counted).count() == 0  # 5 < 10
        produce(broker.bootstrap, topic, [dict(value=b"%d" % i) for i in range(5, 12)])
        wait_for(lambda: spark.table(counted).count() == 12, timeout=60, what="a batch of 12 records")
    finally:
        query.stop()
    # A short delay: one more record (1 < 10) is released by it alone.
    delayed = "min_offsets_delay_" + topic.replace("-", "_")
    query = start(delayed, "3s")
    try:
        wait_for(lambda: spark.table(delayed).count() == 12, timeout=60, what="the 12 records")
        produce(broker.bootstrap, topic, [dict(value=b"late")])
        wait_for(lambda: spark.table(delayed).count() == 13, timeout=60, what="the delayed batch")
    finally:
        query.stop()


def test_sink_include_headers_and_fetch_offset_options(spark, broker, topic):
    create_topic(broker.bootstrap, topic)
    df = spark.createDataFrame([("v", [("h", b"1")])], "value string, headers array<struct<key:string,value:binary>>")
    df.write.format("strom").option("kafka.bootstrap.servers", broker.bootstrap).option("topic", topic) \
        .option("includeHeaders", "true").save()
    back = read(spark, broker.bootstrap, subscribe=topic, includeHeaders="true",
                **{"fetchOffset.numRetries": "5", "fetchOffset.retryIntervalMs": "20"}).collect()
    assert [(r.value, [(h.key, h.value) for h in r.headers]) for r in back] == [(b"v", [("h", b"1")])]
    for key, value in (("fetchOffset.numRetries", "abc"), ("fetchOffset.retryIntervalMs", "abc")):
        with pytest.raises(Exception, match=f"'{key.lower()}' must be"):
            read(spark, broker.bootstrap, subscribe=topic, **{key: value}).collect()


def test_group_id_names_the_readers(spark, broker, topic):
    """kafka.group.id (or groupIdPrefix) names the readers as Java consumers are named,
    consumer-<group>-1, which is what client-id quotas and the request log see."""
    create_topic(broker.bootstrap, topic)
    produce(broker.bootstrap, topic, [dict(value=b"x")])
    server = ("--bootstrap-server", broker.bootstrap)
    assert strom_cli("configs", "alter", *server, "--broker-logger", "0", "--add-config",
                     "strom.request=DEBUG").returncode == 0
    try:
        seen = len(broker.stderr_lines)
        group = "analytics-" + topic
        assert read(spark, broker.bootstrap, subscribe=topic, **{"kafka.group.id": group}).count() == 1
        assert read(spark, broker.bootstrap, subscribe=topic, groupIdPrefix="etl").count() == 1
        fetches = [line for line in broker.stderr_lines[seen:] if "strom.request: Fetch v" in line]
        assert any(f"from client 'consumer-{group}-1'" in line for line in fetches), fetches[-3:]
        assert any("from client 'consumer-etl-" in line for line in fetches), fetches[-3:]
    finally:
        strom_cli("configs", "alter", *server, "--broker-logger", "0", "--delete-config", "strom.request")


def test_java_consumer_timeouts_and_poll_size_are_taken(spark, broker, topic):
    create_topic(broker.bootstrap, topic)
    produce(broker.bootstrap, topic, [dict(value=b"%d" % i) for i in range(50)])
    df = read(spark, broker.bootstrap, subscribe=topic, **{
        "kafka.max.poll.records": "7", "kafka.request.timeout.ms": "20000", "kafka.fetch.max.wait.ms": "50",
        "kafka.receive.buffer.bytes": "65536", "kafka.default.api.timeout.ms": "20000"})
    assert sorted(int(r.value) for r in df.collect()) == list(range(50))
    with pytest.raises(Exception, match="kafka.request.timeout.ms must be a non-negative integer"):
        read(spark, broker.bootstrap, subscribe=topic, **{"kafka.request.timeout.ms": "soon"}).collect()


# --- 5. and 6. Java producer settings, acks --------------------------------------------------

def _write(df, bootstrap: str, topic: str, **kafka: str) -> None:
    df.write.format("strom").option("kafka.bootstrap.servers", bootstrap).option("topic", topic) \
        .options(**{f"kafka.{k}": v for k, v in kafka.items()}).mode("append").save()


def test_java_producer_settings_map_to_librdkafka(spark, broker, topic):
    create_topic(broker.bootstrap, topic, partitions=4)
    rows = [(f"key-{i}", f"value-{i}") for i in range(100)]
    _write(spark.createDataFrame(rows, "key string, value string"), broker.bootstrap, topic, **{
        "partitioner.class": "org.apache.kafka.clients.producer.internals.DefaultPartitioner",
        "buffer.memory": "33554432", "max.block.ms": "60000", "max.request.size": "1048576",
        "send.buffer.bytes": "131072", "linger.ms": "5", "compression.type": "lz4"})
    got = consume_all(broker.bootstrap, topic)
    assert sorted(m.value().decode() for m in got) == sorted(v for _, v in rows)
    assert all(m.partition() == (murmur2(m.key()) & 0x7FFFFFFF) % 4 for m in got)
    # max.request.size is librdkafka's message.max.bytes: a larger record is refused.
    big = spark.createDataFrame([("x" * 5000,)], "value string")
    with pytest.raises(Exception, match="(?i)too large"):
        _write(big, broker.bootstrap, topic, **{"max.request.size": "2000"})
    with pytest.raises(Exception, match="partitioner.class=org.example.Mine has no librdkafka equivalent"):
        _write(big, broker.bootstrap, topic, **{"partitioner.class": "org.example.Mine"})
    with pytest.raises(Exception, match="ssl.truststore.type=JKS: librdkafka reads PEM"):
        _write(big, broker.bootstrap, topic, **{"security.protocol": "SSL", "ssl.truststore.type": "JKS",
                                                "ssl.truststore.location": "/nowhere.jks"})


@pytest.mark.parametrize("acks", ["1", "0"])
def test_weaker_acks_turn_idempotence_off_as_the_java_producer_does(spark, broker, topic, acks):
    create_topic(broker.bootstrap, topic)
    _write(spark.createDataFrame([("v",)], "value string"), broker.bootstrap, topic, acks=acks)
    assert [m.value() for m in consume_all(broker.bootstrap, topic)] == [b"v"]
    with pytest.raises(Exception, match="(?i)idempotence"):  # asked for both: a contradiction
        _write(spark.createDataFrame([("v",)], "value string"), broker.bootstrap, topic,
               acks=acks, **{"enable.idempotence": "true"})


# --- 7. offsets that do not fit the topics ---------------------------------------------------

def test_offset_json_must_name_exactly_the_partitions_read(spark, broker, topic):
    create_topic(broker.bootstrap, topic, partitions=2)
    produce(broker.bootstrap, topic, [dict(value=b"x", partition=i % 2) for i in range(10)])
    cases = [
        ({"startingOffsets": json.dumps({topic + "-typo": {"0": 0, "1": 0}})},
         f"startingOffsets must give an offset for every partition .*topic\\(s\\) '{topic}-typo' that the query does not read"),
        ({"startingOffsets": json.dumps({topic: {"0": 0, "1": 0, "7": 0}})},
         f"partition\\(s\\) that do not exist: {topic}-7"),
        ({"startingOffsets": json.dumps({topic: {"0": 0}})}, f"no offset for {topic}-1"),
        ({"endingOffsets": json.dumps({topic: {"0": 3}})}, f"endingOffsets must give .*no offset for {topic}-1"),
        ({"startingOffsetsByTimestamp": json.dumps({topic: {"0": 0}})},
         f"startingOffsetsByTimestamp must give .*no offset for {topic}-1"),
        ({"endingOffsets": json.dumps({topic: {"0": 3, "1": 99}})},
         f"endingOffsets is beyond the end of the log of {topic}-1 \\(asked 99, ends at 5\\)"),
    ]
    for options, message in cases:
        with pytest.raises(Exception, match=message):
            read(spark, broker.bootstrap, subscribe=topic, **options).collect()
    ok = read(spark, broker.bootstrap, subscribe=topic, startingOffsets=json.dumps({topic: {"0": 1, "1": -2}}),
              endingOffsets=json.dumps({topic: {"0": 5, "1": -1}}))
    assert ok.count() == 9


# --- 8. mistakes in a stream surface when it is defined --------------------------------------

def test_stream_option_mistakes_fail_at_load(spark, broker, topic):
    stream = spark.readStream.format("strom").option("kafka.bootstrap.servers", broker.bootstrap)
    with pytest.raises(Exception, match=r"Unknown option.*: startingoffset \(did you mean startingoffsets\?\)"):
        stream.option("subscribe", topic).option("startingOffset", "earliest").load()
    with pytest.raises(Exception, match="'127.0.0.1:59092x' is not a host:port address"):
        spark.readStream.format("strom").option("kafka.bootstrap.servers", "127.0.0.1:59092x") \
            .option("subscribe", topic).load()
    with pytest.raises(Exception, match="'127.0.0.1:59092x' is not a host:port address"):
        spark.createDataFrame([("v",)], "value string").write.format("strom") \
            .option("kafka.bootstrap.servers", "127.0.0.1:59092x").option("topic", topic).save()


# --- beyond Spark's connector: a compacted topic as a table ----------------------------------

def test_latest_by_key_reads_a_compacted_topic_as_a_table(spark, broker, topic, tmp_path):
    create_topic(broker.bootstrap, topic, partitions=2, config={"cleanup.policy": "compact"})
    updates = [(b"k1", b"a"), (b"k2", b"b"), (b"k1", b"c"), (b"k3", b"d"), (b"k2", None), (b"k4", b"e"),
               (b"k4", b"f")]
    produce(broker.bootstrap, topic, [dict(key=k, value=v) for k, v in updates])
    table = read(spark, broker.bootstrap, subscribe=topic, latestByKey="true", minPartitions="8")
    assert sorted((r.key, r.value) for r in table.collect()) == [(b"k1", b"c"), (b"k3", b"d"), (b"k4", b"f")]
    assert read(spark, broker.bootstrap, subscribe=topic).count() == len(updates)  # the log itself
    with pytest.raises(Exception, match="latestByKey is for batch queries only"):
        spark.readStream.format("strom").option("kafka.bootstrap.servers", broker.bootstrap) \
            .option("subscribe", topic).option("latestByKey", "true").load().writeStream.format("noop") \
            .option("checkpointLocation", str(tmp_path / "stream")).start().awaitTermination(60)
