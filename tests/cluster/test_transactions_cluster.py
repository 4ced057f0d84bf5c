"""Transactions whose partitions are led by several brokers: markers travel to other
brokers' leaders, the KIP-890 check asks the coordinator wherever it is, and a transaction
coordinator that dies hands its transactional ids to the next leader of its partition."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from integration.test_transactions_v2 import Tv2Producer
from strom.coordinator import TRANSACTION_STATE_TOPIC, partition_for
from strom.testing import Cluster, RawClient, unique_name

from .test_cluster import create, partition_view

CLUSTER_MODES = ("zookeeper", "kraft")


def read_committed(cluster: Cluster, topic: str, partitions: int, expected: int, timeout: float = 60) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": unique_name("rc"),
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    values: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while len(values) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 1):
                if msg.error() is None:
                    values.append(msg.value())
        # Nothing more may arrive: an aborted or unfinished transaction stays invisible.
        values += [m.value() for m in consumer.consume(1000, 2) if m.error() is None]
    finally:
        consumer.close()
    return values


def transactional(cluster: Cluster, txn_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": txn_id,
                         "transaction.timeout.ms": 60000})
    producer.init_transactions(60)
    return producer


@pytest.mark.shares_cluster
def test_commit_and_abort_across_leaders(cluster):
    topic = unique_name("txn-spread")
    create(cluster, topic, 3, 3)
    leaders = {v[0] for v in partition_view(cluster.brokers[1], topic).values()}
    assert leaders == set(cluster.brokers), "each broker leads one partition"
    producer = transactional(cluster, unique_name("txn"))
    producer.begin_transaction()
    for i in range(30):
        producer.produce(topic, b"committed-%d" % i, partition=i % 3)
    producer.commit_transaction(60)
    producer.begin_transaction()
    for i in range(30):
        producer.produce(topic, b"aborted-%d" % i, partition=i % 3)
    producer.abort_transaction(60)
    producer.begin_transaction()
    producer.produce(topic, b"last", partition=1)
    producer.commit_transaction(60)
    values = read_committed(cluster, topic, 3, 31)
    assert sorted(values) == sorted([b"committed-%d" % i for i in range(30)] + [b"last"])


def test_transactions_go_on_after_the_coordinator_dies(cluster):
    topic = unique_name("txn-coordinator")
    create(cluster, topic, 3, 3)
    txn_id = unique_name("survivor")
    producer = transactional(cluster, txn_id)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, b"before-%d" % i, partition=i % 3)
    producer.commit_transaction(60)
    state = partition_view(cluster.brokers[1], TRANSACTION_STATE_TOPIC)
    coordinator = state[partition_for(txn_id, len(state))][0]
    cluster.brokers[coordinator].kill()
    survivor = next(b for i, b in cluster.brokers.items() if i != coordinator)
    cluster.wait_for(lambda: partition_view(survivor, TRANSACTION_STATE_TOPIC)[
        partition_for(txn_id, len(state))][0] not in (-1, coordinator), 30, "a new transaction coordinator")
    # The same producer goes on; if its coordinator changed mid-call it may have to start over.
    for _attempt in range(3):
        try:
            producer.begin_transaction()
            for i in range(10):
                producer.produce(topic, b"after-%d" % i, partition=i % 3)
            producer.commit_transaction(60)
            break
        except KafkaException as e:
            if not e.args[0].txn_requires_abort() and not e.args[0].retriable():
                raise
            producer.abort_transaction(60)
    else:
        raise AssertionError("no transaction committed after the coordinator died")
    values = read_committed(cluster, topic, 3, 20)
    assert sorted(values) == sorted([b"before-%d" % i for i in range(10)] + [b"after-%d" % i for i in range(10)])


@pytest.mark.shares_cluster
def test_a_tv2_producer_whose_coordinator_is_another_broker(cluster):
    """Produce v12 to leaders that are not the transaction coordinator: each leader adds its
    partition to the transaction over AddPartitionsToTxn v5, and the bumped-epoch markers
    reach them."""
    topic = unique_name("tv2-spread")
    create(cluster, topic, 3, 3)
    leaders = {p: v[0] for p, v in partition_view(cluster.brokers[1], topic).items()}
    txn_id = unique_name("tv2")
    with RawClient(cluster.brokers[1]) as any_broker:
        found = any_broker.call(10, 4, {"key_type": 1, "coordinator_keys": [txn_id]})
        coordinator = found.coordinators[0].node_id
    assert coordinator > 0
    clients = {b: RawClient(cluster.brokers[b]) for b in cluster.brokers}
    try:
        producer = Tv2Producer(clients[coordinator], txn_id)
        remote = [p for p, leader in leaders.items() if leader != coordinator]
        assert remote, "some partition is led elsewhere"
        for p in leaders:
            assert producer.produce(topic, p, [b"one-%d" % p], leader=clients[leaders[p]]) == 0
        assert producer.end(committed=True).error_code == 0
        for p in remote:
            assert producer.produce(topic, p, [b"two-%d" % p], leader=clients[leaders[p]]) == 0
        assert producer.end(committed=False).error_code == 0
        assert producer.produce(topic, remote[0], [b"three"], leader=clients[leaders[remote[0]]]) == 0
        assert producer.end(committed=True).error_code == 0
    finally:
        for c in clients.values():
            c.close()
    values = read_committed(cluster, topic, 3, 4)
    assert sorted(values) == sorted([b"one-%d" % p for p in leaders] + [b"three"])
