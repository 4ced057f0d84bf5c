"""The `strom` data source against a 3-broker cluster (ZooKeeper, then KRaft): tasks read each partition from its
leader (leaders on three different brokers, the source told of one broker only), the sink
writes to leaders across the cluster, and an exactly-once copy goes through a broker kill."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from strom.testing import KRAFT, Cluster, consume_all, create_topic, unique_name
from strom.zookeeper_server import ZooKeeperServer

from .conftest import read
from .test_exactly_once_faults import ROWS, check_exactly_once, copy_through_a_kill, value

ASSIGNMENT = [[1, 2, 3], [2, 3, 1], [3, 1, 2]]  # partition p led by broker p + 1


@pytest.fixture(scope="module", params=["zookeeper", KRAFT])
def cluster(request):
    """The same tests on a ZooKeeper cluster and on a KRaft quorum of combined nodes."""
    if request.param == KRAFT:
        with Cluster(3, zookeeper=KRAFT) as c:
            yield c
        return
    with ZooKeeperServer(fsync=False) as zk, Cluster(3, zookeeper=zk) as c:
        yield c


def create(cluster: Cluster, topic: str) -> None:
    create_topic(cluster.bootstrap, topic, assignment=ASSIGNMENT)
    metadata = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(topic, timeout=10).topics[topic]
    assert {p.leader for p in metadata.partitions.values()} == {1, 2, 3}


def test_batch_read_from_each_partitions_leader(spark, cluster):
    topic = unique_name("spark-cluster-read")
    create(cluster, topic)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(300):
        producer.produce(topic, b"v%d" % i, key=b"k%d" % i, partition=i % 3)
    assert producer.flush(30) == 0
    one_broker = cluster.brokers[1].bootstrap  # the others are found through Metadata
    rows = read(spark, one_broker, subscribe=topic).select("value", "partition").collect()
    assert sorted(bytes(r.value) for r in rows) == sorted(b"v%d" % i for i in range(300))
    assert {r.partition for r in rows} == {0, 1, 2}


def test_batch_write_across_leaders(spark, cluster):
    topic = unique_name("spark-cluster-write")
    create(cluster, topic)
    rows = [(f"k{i}", f"v{i}", i % 3) for i in range(300)]
    df = spark.createDataFrame(rows, "key string, value string, partition int").repartition(3)
    (df.write.format("strom").option("kafka.bootstrap.servers", cluster.brokers[2].bootstrap)
     .option("topic", topic).mode("append").save())
    got = consume_all(cluster.bootstrap, topic)
    assert sorted((m.value().decode(), m.partition()) for m in got) == sorted((v, p) for _, v, p in rows)


def test_exactly_once_stream_copy_survives_a_broker_kill(spark, cluster, tmp_path, row_at_a_time):
    """transactionalIdPrefix across three brokers: a broker that leads a source and a target
    partition is killed while a task has written part of its batch, and restarted; the
    committed output is the input once."""
    source, target = unique_name("eos-in"), unique_name("eos-out")
    create(cluster, source)
    create(cluster, target)
    values = [value(i) for i in range(ROWS)]
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i, v in enumerate(values):
        producer.produce(source, v, partition=i % 3)
    assert producer.flush(30) == 0
    victim = next(b for b in (3, 2) if b != cluster.controller_id())
    one_broker = cluster.brokers[1].bootstrap
    marker = copy_through_a_kill(spark, cluster.brokers[victim], one_broker, source, target, tmp_path,
                                 "eos-" + source)
    check_exactly_once(cluster.bootstrap, target, values, marker)
