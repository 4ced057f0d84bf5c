"""Mistakes get one clear message, on the driver, in bounded time."""

from __future__ import annotations

import pytest

from .conftest import read


def _load(spark, **options):
    return spark.read.format("strom").options(**options).load().collect()


@pytest.mark.parametrize("options, message", [
    ({"subscribe": "t"}, "'kafka.bootstrap.servers' must be specified"),
    ({"kafka.bootstrap.servers": "127.0.0.1:1"}, "One of the options 'subscribe', 'subscribePattern', 'assign' must be"),
    ({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", "assign": '{"t":[0]}'}, "Only one of the options"),
    ({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", "startingOfsets": "earliest"},
     "Unknown option.*startingofsets"),
    ({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", "startingOffsets": "{nope"},
     "'startingOffsets' is not valid JSON"),
    ({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", "startingOffsets": "latest"},
     "startingOffsets=latest .* not allowed for batch"),
    ({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", "kafka.auto.offset.reset": "earliest"},
     "'kafka.auto.offset.reset' is not supported.*startingOffsets"),
    ({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", "failOnDataLoss": "maybe"}, "must be true or false"),
])
def test_bad_source_options(spark, options, message):
    with pytest.raises(Exception, match=message):
        _load(spark, **options)


def test_unreachable_broker_fails_in_bounded_time(spark):
    # The message names the bound that ended the wait (a hang would trip the test's timeout).
    with pytest.raises(Exception, match=r"Could not fetch metadata from Kafka brokers 127.0.0.1:1 .*within 15 s"):
        read(spark, "127.0.0.1:1", subscribe="t").collect()


def test_ending_offsets_on_a_stream(spark, broker):
    query = (spark.readStream.format("strom").option("kafka.bootstrap.servers", broker.bootstrap)
             .option("subscribe", "t").option("endingOffsets", "latest").load().writeStream
             .format("memory").queryName("never").trigger(availableNow=True).start())
    with pytest.raises(Exception, match="Ending offsets are for batch queries only"):
        query.awaitTermination(60)


def _write(df, **options):
    df.write.format("strom").options(**options).mode("append").save()


def test_bad_sink_input(spark, broker):
    values = spark.createDataFrame([(b"v",)], "value binary")
    with pytest.raises(Exception, match="needs a topic: set the 'topic' option, or write a 'topic' column"):
        _write(values, **{"kafka.bootstrap.servers": broker.bootstrap})
    with pytest.raises(Exception, match="Required attribute 'value' not found"):
        _write(spark.createDataFrame([(b"k",)], "key binary"),
               **{"kafka.bootstrap.servers": broker.bootstrap, "topic": "t"})
    with pytest.raises(Exception, match="The partition column must be of type int, not string"):
        _write(spark.createDataFrame([(b"v", "0")], "value binary, partition string"),
               **{"kafka.bootstrap.servers": broker.bootstrap, "topic": "t"})
    with pytest.raises(Exception, match=r"Unknown option.*subscrib \(did you mean subscribe\?\)"):
        _write(values, **{"kafka.bootstrap.servers": broker.bootstrap, "topic": "t", "subscrib": "x"})
    with pytest.raises(Exception, match="Overwrite is not allowed"):
        values.write.format("strom").options(**{"kafka.bootstrap.servers": broker.bootstrap, "topic": "t"}) \
            .mode("overwrite").save()
    with pytest.raises(Exception, match=r"Could not fetch metadata from Kafka brokers 127.0.0.1:1 .*within 15 s"):
        _write(values, **{"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "t"})
