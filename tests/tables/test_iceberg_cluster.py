"""An Iceberg topic on a 3-node KRaft cluster sharing one catalog (a SQLite file) and one file://
warehouse: the leader of a partition is killed (kill -9) while producers write; its successor
resumes from the table's own offsets, and the table ends up holding every committed offset of
every partition exactly once."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from strom.testing import (
    KRAFT,
    Cluster,
    consume_all,
    create_topic,
    report_broker_logs,
    unique_name,
    wait_for,
)

from .iceberg_table import catalog as open_catalog
from .iceberg_table import duplicates, expected_row, rows

pytest_runtest_makereport = pytest.hookimpl(hookwrapper=True)(report_broker_logs)


@pytest.fixture(scope="module")
def shared():
    with tempfile.TemporaryDirectory(prefix="strom-iceberg-") as directory:
        yield Path(directory)


@pytest.fixture(scope="module")
def cluster(shared):
    overrides = {
        "iceberg.enabled": "true",
        "iceberg.commit.interval.ms": "200",
        "iceberg.catalog.uri": f"sqlite:///{shared / 'catalog.db'}",
        "iceberg.warehouse": (shared / "warehouse").as_uri(),
        "offsets.topic.num.partitions": "2",
        "transaction.state.log.num.partitions": "2",
        "default.replication.factor": "3",
    }
    with Cluster(3, zookeeper=KRAFT, overrides=overrides, session_timeout_ms=3000) as started:
        yield started


def leader_of(bootstrap: str, topic: str, partition: int) -> int:
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return meta.topics[topic].partitions[partition].leader


def test_leader_killed_while_producing_leaves_no_duplicate_and_no_gap(cluster, shared):
    catalog = open_catalog(shared / "catalog.db", shared / "warehouse")
    topic = unique_name("kv-cluster")
    create_topic(cluster.bootstrap, topic, 3, replication_factor=3,
                 config={"iceberg.mode": "key_value", "min.insync.replicas": "2"})
    stop = threading.Event()
    failures: list = []

    def produce() -> None:
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True, "acks": "all",
                             "linger.ms": 5, "message.timeout.ms": 60000, "reconnect.backoff.max.ms": 200})
        i = 0
        while not stop.is_set():
            producer.produce(topic, value=b"v-%06d" % i, key=b"%d" % (i % 11),
                             on_delivery=lambda err, _m: err and failures.append(err))
            i += 1
            if i % 100 == 0:
                producer.flush(30)
        producer.flush(60)

    writer = threading.Thread(target=produce)
    writer.start()
    try:
        wait_for(lambda: len(rows(catalog, topic)) > 0, 30, what="a first commit")
        victim = leader_of(cluster.bootstrap, topic, 0)
        cluster.brokers[victim].kill()
        wait_for(lambda: leader_of(cluster.bootstrap, topic, 0) not in (victim, -1), 30, what="a new leader")
        before = {r["offset"] for r in rows(catalog, topic) if r["partition"] == 0}
        wait_for(lambda: len({r["offset"] for r in rows(catalog, topic) if r["partition"] == 0} - before) > 50, 60,
                 what="partition 0 translated by its new leader")
    finally:
        stop.set()
        writer.join(90)
    assert not failures, failures[:3]
    expected = [expected_row(m) for m in consume_all(cluster.bootstrap, topic, **{"isolation.level": "read_committed"})]
    wanted = {(r["partition"], r["offset"]) for r in expected}

    def complete() -> list[dict] | None:
        table_rows = rows(catalog, topic)
        return table_rows if {(r["partition"], r["offset"]) for r in table_rows} >= wanted else None

    table_rows = wait_for(complete, 60, interval=0.2, what=f"the table holding all {len(wanted)} records")
    assert not duplicates(table_rows)
    assert {(r["partition"], r["offset"]) for r in table_rows} == wanted
    by_offset = {(r["partition"], r["offset"]): r["value"] for r in expected}
    assert all(by_offset[(r["partition"], r["offset"])] == r["value"] for r in table_rows)
