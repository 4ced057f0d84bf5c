"""The task-side fetch paths, without Spark: the raw Fetch client (plain TCP) and the librdkafka
consumer (everything else) must give the same rows, gaps and data-loss verdicts."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from strom.spark import fetch
from strom.spark.fetch import (
    StromDataLossError,
    raw_fetch_ok,
    read_librdkafka,
    read_range,
    read_raw,
)
from strom.spark.options import source_options
from strom.spark.ranges import Range
from strom.spark.wire import PartitionClient
from strom.testing import TIMESTAMP_BASE_MS, create_topic

from .conftest import produce
from .test_stream import delete_records

PATHS = pytest.mark.parametrize("read", [read_raw, read_librdkafka], ids=["raw", "librdkafka"])


def rows(read, bootstrap: str, r: Range, **options) -> list[dict]:
    opts = source_options({"kafka.bootstrap.servers": bootstrap, "subscribe": r.topic, **options}, batch=True)
    return [row for batch in read(opts, r) for row in batch.to_pylist()]


@pytest.mark.parametrize(("conf", "raw"), [
    ({}, True),
    ({"isolation.level": "read_committed", "client.id": "x"}, True),
    ({"security.protocol": "PLAINTEXT"}, True),
    ({"security.protocol": "SSL"}, False),
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}, False),
    ({"ssl.ca.location": "/ca.pem"}, True),  # TLS settings without TLS: nothing to honour
])
def test_raw_path_serves_plain_brokers_only(conf, raw):
    assert raw_fetch_ok(conf) is raw


def test_plain_brokers_are_read_raw_after_a_lost_connection(broker, topic, monkeypatch):
    create_topic(broker.bootstrap, topic)
    produce(broker.bootstrap, topic, [dict(value=b"%d" % i) for i in range(30)])
    monkeypatch.setattr(fetch, "read_librdkafka", None)  # would fail if chosen
    monkeypatch.setattr(fetch, "RETRY_BACKOFF_S", 0)
    real_fetch, calls = PartitionClient.fetch, []

    def flaky(self, *args):
        calls.append(args[0])
        if len(calls) == 1:
            raise ConnectionResetError("lost")
        return real_fetch(self, *args)

    monkeypatch.setattr(PartitionClient, "fetch", flaky)
    got = [row for batch in read_range(source_options({"kafka.bootstrap.servers": broker.bootstrap,
                                                       "subscribe": topic}, batch=True), Range(topic, 0, 0, 30))
           for row in batch.to_pylist()]
    assert [r["offset"] for r in got] == list(range(30))
    assert calls[:2] == [0, 0]  # retried from the same offset


@PATHS
def test_paths_read_the_same_rows(broker, topic, read):
    create_topic(broker.bootstrap, topic)
    produce(broker.bootstrap, topic, [dict(value=b"v%d" % i, key=b"k" if i % 2 else None, timestamp=TIMESTAMP_BASE_MS + i,
                                           headers=[("h", b"%d" % i)] if i % 3 else None) for i in range(300)],
            **{"compression.type": "zstd", "batch.num.messages": 7})
    got = rows(read, broker.bootstrap, Range(topic, 0, 5, 250), includeheaders="true")
    assert [r["offset"] for r in got] == list(range(5, 250))
    assert [(r["key"], r["value"]) for r in got[:2]] == [(b"k", b"v5"), (None, b"v6")]
    assert got[0]["headers"] == [{"key": "h", "value": b"5"}] and got[1]["headers"] is None
    assert got[0]["timestamp"].timestamp() == (TIMESTAMP_BASE_MS + 5) / 1000 and got[0]["timestampType"] == 0


@PATHS
def test_aborted_transaction_interleaved_with_a_committed_one(broker, topic, read):
    create_topic(broker.bootstrap, topic)
    aborting, committing = (Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"{topic}-{n}"})
                            for n in ("a", "c"))
    for p in (aborting, committing):
        p.init_transactions(15)
        p.begin_transaction()
    for i in range(3):  # the two transactions' batches alternate in the log
        for p, value in ((aborting, b"x%d" % i), (committing, b"c%d" % i)):
            p.produce(topic, value)
            assert p.flush(15) == 0
    aborting.abort_transaction(15)
    committing.commit_transaction(15)
    produce(broker.bootstrap, topic, [dict(value=b"plain")])
    # Offsets 0-5 data, 6-7 markers, 8 plain.
    committed = rows(read, broker.bootstrap, Range(topic, 0, 0, 9), **{"kafka.isolation.level": "read_committed"})
    assert [r["value"] for r in committed] == [b"c0", b"c1", b"c2", b"plain"]
    everything = rows(read, broker.bootstrap, Range(topic, 0, 0, 9))
    assert len(everything) == 7


@PATHS
def test_data_loss_verdicts(broker, topic, read):
    create_topic(broker.bootstrap, topic)
    produce(broker.bootstrap, topic, [dict(value=b"%d" % i) for i in range(50)])
    delete_records(broker.bootstrap, topic, 0, 20)
    with pytest.raises(StromDataLossError, match=f"Offsets 0-19 of {topic}-0 were to be read"):
        rows(read, broker.bootstrap, Range(topic, 0, 0, 50))
    lenient = rows(read, broker.bootstrap, Range(topic, 0, 0, 50), failondataloss="false")
    assert [r["offset"] for r in lenient] == list(range(20, 50))
    with pytest.raises(StromDataLossError, match=f"{topic}-0 ends at offset 50, before offset 60"):
        rows(read, broker.bootstrap, Range(topic, 0, 30, 60))
    assert len(rows(read, broker.bootstrap, Range(topic, 0, 30, 60), failondataloss="false")) == 20


def test_raw_fetch_honours_the_consumers_fetch_settings(broker, topic, monkeypatch):
    """kafka.fetch.max.bytes, kafka.max.partition.fetch.bytes, kafka.fetch.min.bytes and
    kafka.fetch.max.wait.ms go into the raw client's Fetch requests; kafka.max.poll.records
    bounds the rows of each batch handed over."""
    create_topic(broker.bootstrap, topic)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(40):  # one record batch each, of about 1 KB
        producer.produce(topic, b"%03d" % i + b"." * 1000)
        producer.flush(15)
    asked, answered = [], []
    original = PartitionClient.fetch

    def spy(self, offset, level, wait_ms, max_bytes, partition_bytes=None, min_bytes=1):
        asked.append((wait_ms, max_bytes, partition_bytes, min_bytes))
        got = original(self, offset, level, wait_ms, max_bytes, partition_bytes, min_bytes)
        answered.append(len(got.records))
        return got

    monkeypatch.setattr(PartitionClient, "fetch", spy)
    opts = source_options({"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic,
                           "kafka.fetch.max.bytes": "8192", "kafka.max.partition.fetch.bytes": "3000",
                           "kafka.fetch.min.bytes": "1", "kafka.fetch.max.wait.ms": "40",
                           "kafka.max.poll.records": "7"}, batch=True)
    batches = list(read_range(opts, Range(topic, 0, 0, 40)))
    assert [r["value"][:3] for b in batches for r in b.to_pylist()] == [b"%03d" % i for i in range(40)]
    assert set(asked) == {(40, 8192, 3000, 1)}
    assert max(answered) <= 3000 and len(answered) >= 40 * 1000 // 3000
    assert max(b.num_rows for b in batches) == 7
    with pytest.raises(ValueError, match="kafka.max.partition.fetch.bytes must be a non-negative integer"):
        source_options({"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic,
                        "kafka.max.partition.fetch.bytes": "lots"}, batch=True)
