"""A cluster whose inter-broker listener (and, on KRaft, controller listener) is SASL with a
short connections.max.reauth.ms: the brokers' own connections to each other (replica fetchers,
the controller's channel, the quorum's and the brokers' heartbeats) renew their sessions as
Kafka's brokers do (KIP-368), so no node drops another's connection when a session ends."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from strom.client import Connection
from strom.testing import KRAFT, Cluster, create_topic, unique_name, wait_for

from .conftest import CLUSTER_OVERRIDES

CLUSTER_MODES = ("zookeeper", "kraft")
LIFETIME_MS = 2000
JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="broker" '
        'password="broker-secret" user_broker="broker-secret";')
DROPPED = ("SASL session expired", "cannot fetch from broker")


@pytest.fixture(scope="module")
def cluster(zookeeper):
    overrides = {**CLUSTER_OVERRIDES, "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
                 "inter.broker.listener.name": "SASL_PLAINTEXT", "sasl.mechanism.inter.broker.protocol": "PLAIN",
                 "sasl.enabled.mechanisms": "PLAIN", "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
                 "connections.max.reauth.ms": str(LIFETIME_MS), "min.insync.replicas": "3"}
    if zookeeper == KRAFT:
        overrides |= {"listener.security.protocol.map":
                      "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT",
                      "sasl.mechanism.controller.protocol": "PLAIN",
                      "listener.name.controller.plain.sasl.jaas.config": JAAS}
    with Cluster(3, zookeeper=zookeeper, overrides=overrides) as c:
        yield c


def full_isr(cluster, topics: list[str]) -> bool:
    broker = next(iter(cluster.brokers.values()))
    with Connection("127.0.0.1", broker.ports["PLAINTEXT"]) as conn:
        answer = conn.call(3, 1, {"topics": [{"name": t} for t in topics]})
    partitions = [p for t in answer.topics for p in t.partitions]
    return bool(partitions) and all(len(p.isr_nodes) == 3 for p in partitions)


def test_brokers_renew_their_sessions(cluster):
    """Writes with acks=all (min.insync.replicas=3: every one waits for both followers' fetches)
    and a new topic (the controller reaches every broker) each second, over five session
    lifetimes: no node closes another's connection, no fetcher loses its leader, the ISR stays full."""
    brokers = list(cluster.brokers.values())
    topics = [unique_name("reauth")]
    create_topic(cluster.bootstrap, topics[0], 3, replication_factor=3)
    wait_for(lambda: full_isr(cluster, topics), timeout=30, what="the first topic fully replicated")
    seen = {b: len(b.stderr_lines) for b in brokers}
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    deadline = time.monotonic() + 5 * LIFETIME_MS / 1000
    sent = 0
    while time.monotonic() < deadline:
        for _ in range(20):
            producer.produce(topics[0], value=b"r%d" % sent)
            sent += 1
        assert producer.flush(30) == 0
        topics.append(unique_name("reauth"))
        create_topic(cluster.bootstrap, topics[-1], 1, replication_factor=3)
        time.sleep(0.5)
    wait_for(lambda: full_isr(cluster, topics), timeout=30, what="every topic fully replicated")
    dropped = [line for b in brokers for line in b.stderr_lines[seen[b]:] if any(d in line for d in DROPPED)]
    assert not dropped, dropped[:10]
