"""Eligible leader replicas (KIP-966) on real brokers, in both modes: a partition of three
replicas with min.insync.replicas=2 loses every ISR member (one killed, one stopped cleanly while
the ISR was already at its minimum, the last one, its leader, killed) and goes leaderless; the
cleanly stopped replica, an ELR member, comes back and leads alone, and no acknowledged record
is lost. Broker 1 is the controller (ZooKeeper) or the one-node quorum (KRaft) and stays up; the
replicas are on brokers 2, 3 and 4.

Two topics go through it side by side: one with min.insync.replicas as a topic config, one
without, whose 2 is the brokers' static config (server.properties), which the controller of
either mode must take for its ELR rules as the brokers take it for acks=all. On KRaft the clean
stop leaves the broker's epoch in its clean-shutdown marker, the kill -9 no marker."""

from __future__ import annotations

import json
from pathlib import Path

from confluent_kafka import Producer

from strom.client import Connection
from strom.log.manager import CLEAN_SHUTDOWN_FILE
from strom.testing import Cluster, consume_all, unique_name

from .test_cluster import create

CLUSTER_MODES = ("zookeeper", "kraft")
DESCRIBE_TOPIC_PARTITIONS = 75
OVERRIDES = {"num.partitions": "1", "default.replication.factor": "1", "offsets.topic.replication.factor": "1",
             "group.initial.rebalance.delay.ms": "0", "replica.lag.time.max.ms": "3000",
             "min.insync.replicas": "2"}  # static, on every broker and the controller


def describe(cluster: Cluster, topic: str) -> dict:
    """Partition 0 as DescribeTopicPartitions shows it, asked of broker 1."""
    broker = cluster.brokers[1]
    with Connection("127.0.0.1", broker.port) as conn:
        body = conn.call(DESCRIBE_TOPIC_PARTITIONS, 0, {"topics": [{"name": topic}], "response_partition_limit": 10,
                                                        "cursor": None})
    (t,) = body.topics
    if t.error_code or not t.partitions:
        return {"leader": -2, "isr": [], "elr": [], "last_known_elr": []}
    p = t.partitions[0]
    return {"leader": p.leader_id, "isr": sorted(p.isr_nodes), "elr": sorted(p.eligible_leader_replicas or []),
            "last_known_elr": list(p.last_known_elr or [])}


def log_dir(cluster: Cluster, broker_id: int) -> Path:
    return Path(cluster.brokers[broker_id].overrides["log.dirs"])


def produce_acked(bootstrap: str, topic: str, values: list[bytes], **conf) -> tuple[list[bytes], list]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 2, **conf})
    acked, failed = [], []
    for v in values:
        producer.produce(topic, v, partition=0,
                         on_delivery=lambda err, msg: (failed if err else acked).append(err or msg.value()))
    producer.flush(60)
    return acked, failed


def test_an_eligible_replica_leads_after_the_isr_is_gone(zookeeper):
    with Cluster(1, zookeeper=zookeeper, overrides=OVERRIDES, session_timeout_ms=2000) as cluster:
        for broker_id in (2, 3, 4):
            cluster.add_broker(broker_id)
        own, static = unique_name("elr"), unique_name("elr-static")
        topics = (own, static)
        create(cluster, own, assignment=[[2, 3, 4]], configs={"min.insync.replicas": "2"})
        create(cluster, static, assignment=[[2, 3, 4]])  # min.insync.replicas from server.properties
        bootstrap = cluster.brokers[1].bootstrap

        def view_is(what: str, **expected):
            cluster.wait_for(lambda: all(describe(cluster, t)[k] == v for t in topics for k, v in expected.items()),
                             30, what)

        view_is("the partitions led by broker 2 with a full ISR", leader=2, isr=[2, 3, 4])
        first = {t: [b"a-%03d" % i for i in range(100)] for t in topics}
        for t in topics:
            acked, failed = produce_acked(bootstrap, t, first[t])
            assert acked == first[t] and not failed

        cluster.brokers[4].kill()  # kill -9: the ISR is still at min ISR, nobody is eligible
        view_is("broker 4 out of the ISRs", isr=[2, 3], elr=[])
        second = {t: [b"b-%03d" % i for i in range(100)] for t in topics}
        for t in topics:
            acked, failed = produce_acked(bootstrap, t, second[t])
            assert acked == second[t] and not failed

        assert cluster.brokers[3].stop() == 0  # clean: below min ISR now, so it is eligible
        view_is("broker 3 eligible", leader=2, isr=[2], elr=[3])
        if cluster.kraft:  # the clean stop left its broker epoch in the marker (KIP-966); the kill none
            marker = json.loads((log_dir(cluster, 3) / CLEAN_SHUTDOWN_FILE).read_text())
            assert marker["version"] == 0 and marker["brokerEpoch"] > 0, marker
            assert not (log_dir(cluster, 4) / CLEAN_SHUTDOWN_FILE).exists()
        for t in topics:
            _, refused = produce_acked(bootstrap, t, [b"refused"], **{"message.timeout.ms": 3000, "retries": 0,
                                                                      "enable.idempotence": False})
            assert refused and refused[0].name() == "NOT_ENOUGH_REPLICAS", t
            # acks=1 is written on the leader alone, but under min ISR the high watermark stands still.
            only_leader = Producer({"bootstrap.servers": bootstrap, "acks": "1"})
            only_leader.produce(t, b"uncommitted", partition=0)
            assert only_leader.flush(30) == 0
            got = consume_all(bootstrap, t, timeout=30)
            assert [m.value() for m in got] == first[t] + second[t]

        cluster.brokers[2].kill()  # the last ISR member: the partitions go leaderless
        view_is("the partitions leaderless with an empty ISR", leader=-1, isr=[], last_known_elr=[2])
        assert all(3 in describe(cluster, t)["elr"] for t in topics)

        cluster.brokers[3].start()  # the eligible replica comes back and leads alone
        view_is("broker 3 leading from the ELR", leader=3, isr=[3])
        assert all(3 not in describe(cluster, t)["elr"] for t in topics)
        for broker_id in (2, 4):  # back after an unclean shutdown: they follow broker 3
            cluster.brokers[broker_id].start()
        view_is("every replica back in the ISRs", leader=3, isr=[2, 3, 4], elr=[], last_known_elr=[])
        for t in topics:
            got = consume_all(cluster.bootstrap, t, count=len(first[t]) + len(second[t]), timeout=60)
            assert [m.value() for m in got] == first[t] + second[t], f"{t}: every acknowledged record, once, in order"
