"""confluent-kafka AdminClient: CreateTopics, DeleteTopics, CreatePartitions, Metadata,
DescribeCluster, with the error codes Kafka answers."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewPartitions, NewTopic

from strom.testing import create_topic, unique_name

from .conftest import Rec, admin, roundtrip, watermarks

pytestmark = pytest.mark.timeout(60)


def create(bootstrap: str, *topics: NewTopic, **options) -> dict[str, KafkaError | None]:
    """Topic name -> None on success, else the error the broker answered with."""
    client = admin(bootstrap)  # must outlive the futures
    futures = client.create_topics(list(topics), operation_timeout=10, **options)
    return {name: _error(f) for name, f in futures.items()}


def _error(future) -> KafkaError | None:
    try:
        future.result(timeout=15)
    except KafkaException as e:
        return e.args[0]
    return None


def code(err: KafkaError | None) -> int | None:
    return None if err is None else err.code()


def describe(bootstrap: str, topic: str):
    return admin(bootstrap).list_topics(timeout=10).topics.get(topic)


def test_create_topic_with_configs(broker, topic):
    config = {"retention.ms": "3600000", "segment.bytes": "1048576", "cleanup.policy": "delete"}
    assert create(broker.bootstrap, NewTopic(topic, 3, 1, config=config)) == {topic: None}
    meta = describe(broker.bootstrap, topic)
    assert meta.error is None and sorted(meta.partitions) == [0, 1, 2]
    for p in meta.partitions.values():
        assert (p.leader, p.replicas, p.isrs, p.error) == (0, [0], [0], None)
    roundtrip(broker.bootstrap, topic, [Rec(b"x%d" % i, partition=i % 3) for i in range(9)])


def test_validate_only_creates_nothing(broker, topic):
    assert create(broker.bootstrap, NewTopic(topic, 2, 1), validate_only=True) == {topic: None}
    assert describe(broker.bootstrap, topic) is None
    bad = NewTopic(topic, 2, 1, config={"retention.ms": "soon"})
    assert code(create(broker.bootstrap, bad, validate_only=True)[topic]) == KafkaError.INVALID_CONFIG
    assert create(broker.bootstrap, NewTopic(topic, 2, 1)) == {topic: None}  # the name is still free


def test_create_with_replica_assignment(broker, topic):
    assert create(broker.bootstrap, NewTopic(topic, 4, replica_assignment=[[0], [0], [0], [0]])) == {topic: None}
    meta = describe(broker.bootstrap, topic)
    assert sorted(meta.partitions) == [0, 1, 2, 3]
    assert all(p.replicas == [0] and p.leader == 0 for p in meta.partitions.values())
    unknown_broker = unique_name("unknown-broker")
    err = create(broker.bootstrap, NewTopic(unknown_broker, 1, replica_assignment=[[7]]))[unknown_broker]
    assert code(err) == KafkaError.INVALID_REPLICA_ASSIGNMENT


@pytest.mark.parametrize("config", [{"retention.ms": "abc"}, {"message.timestamp.type": "Sometimes"},
                                    {"segment.bytes": "1"}, {"no.such.config": "1"}])
def test_bad_config_is_invalid_config(broker, topic, config):
    err = create(broker.bootstrap, NewTopic(topic, 1, 1, config=config))[topic]
    assert code(err) == KafkaError.INVALID_CONFIG, err
    assert describe(broker.bootstrap, topic) is None


def test_existing_topic(broker, topic):
    create_topic(broker.bootstrap, topic + ".dotted")
    assert code(create(broker.bootstrap, NewTopic(topic + ".dotted", 1, 1))[topic + ".dotted"]) == \
        KafkaError.TOPIC_ALREADY_EXISTS
    # '.' and '_' collide in metric names, so Kafka refuses names that differ only there.
    assert code(create(broker.bootstrap, NewTopic(topic + "_dotted", 1, 1))[topic + "_dotted"]) == \
        KafkaError.TOPIC_EXCEPTION


@pytest.mark.parametrize("name", ["has space", "slash/topic", "..", "x" * 250, "ünïcode"])
def test_invalid_topic_name(broker, name):
    assert code(create(broker.bootstrap, NewTopic(name, 1, 1))[name]) == KafkaError.TOPIC_EXCEPTION


def test_bad_partition_count_and_replication_factor(broker, topic):
    assert code(create(broker.bootstrap, NewTopic(topic, 1, 3))[topic]) == KafkaError.INVALID_REPLICATION_FACTOR
    assert code(create(broker.bootstrap, NewTopic(topic, 0, 1))[topic]) == KafkaError.INVALID_PARTITIONS
    assert describe(broker.bootstrap, topic) is None


def test_delete_topics(broker, topic):
    create_topic(broker.bootstrap, topic, partitions=2)
    roundtrip(broker.bootstrap, topic, [Rec(b"old", partition=0)])
    client = admin(broker.bootstrap)
    assert _error(client.delete_topics([topic], operation_timeout=10)[topic]) is None
    assert describe(broker.bootstrap, topic) is None
    again = client.delete_topics([topic], operation_timeout=10)
    assert code(_error(again[topic])) == KafkaError.UNKNOWN_TOPIC_OR_PART
    # The name is free again and the new topic starts empty.
    create_topic(broker.bootstrap, topic, partitions=1)
    assert watermarks(broker.bootstrap, topic, 0) == (0, 0)
    roundtrip(broker.bootstrap, topic, [Rec(b"new", partition=0)])


def test_create_partitions(broker, topic):
    create_topic(broker.bootstrap, topic, partitions=1)
    client = admin(broker.bootstrap)
    assert _error(client.create_partitions([NewPartitions(topic, 3)], validate_only=True)[topic]) is None
    assert sorted(describe(broker.bootstrap, topic).partitions) == [0]
    assert _error(client.create_partitions([NewPartitions(topic, 3)])[topic]) is None
    assert sorted(describe(broker.bootstrap, topic).partitions) == [0, 1, 2]
    shrink = client.create_partitions([NewPartitions(topic, 2)])[topic]
    assert code(_error(shrink)) == KafkaError.INVALID_PARTITIONS
    missing = unique_name("missing")
    assert code(_error(client.create_partitions([NewPartitions(missing, 2)])[missing])) == \
        KafkaError.UNKNOWN_TOPIC_OR_PART
    roundtrip(broker.bootstrap, topic, [Rec(b"p%d" % i, partition=i) for i in range(3)])


def test_list_topics_and_describe_cluster(broker, topic):
    create_topic(broker.bootstrap, topic, partitions=2)
    client = admin(broker.bootstrap)
    meta = client.list_topics(timeout=10)
    assert meta.cluster_id and meta.controller_id == 0
    assert {b.id: (b.host, b.port) for b in meta.brokers.values()} == {0: ("127.0.0.1", broker.port)}
    assert sorted(meta.topics[topic].partitions) == [0, 1]
    cluster = client.describe_cluster(request_timeout=10).result(timeout=15)
    assert cluster.cluster_id == meta.cluster_id
    assert cluster.controller.id == 0
    assert [(n.id, n.host, n.port) for n in cluster.nodes] == [(0, "127.0.0.1", broker.port)]
