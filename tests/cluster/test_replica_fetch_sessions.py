"""Followers replicate through incremental fetch sessions (KIP-227) on three real brokers: a
leader's failure moves partitions between the survivors' sessions without opening new ones,
and no record acknowledged with acks=all is lost."""

from __future__ import annotations

import threading

from confluent_kafka import Producer

from strom.testing import Cluster, consume_all, metric_value, scrape, unique_name

from .conftest import CLUSTER_OVERRIDES
from .test_cluster import create, live_brokers, partition_view

CLUSTER_MODES = ("zookeeper", "kraft")
PARTITIONS = 12


def sessions(broker) -> float:
    return metric_value(scrape(broker.metrics_url), "strom_incremental_fetch_sessions")


def in_sync(cluster: Cluster, topic: str, replicas: set[int]) -> bool:
    for broker in live_brokers(cluster):
        view = partition_view(broker, topic)
        if len(view) != PARTITIONS or any(leader not in replicas or set(isr) != replicas
                                          for leader, _, isr in view.values()):
            return False
    return True


def test_follower_sessions_outlive_a_leader_failure(zookeeper):
    overrides = {**CLUSTER_OVERRIDES, "metrics.port": "0"}
    with Cluster(3, zookeeper=zookeeper, overrides=overrides) as cluster:
        topic = unique_name("sessions")
        create(cluster, topic, PARTITIONS, configs={"min.insync.replicas": "2"})
        cluster.wait_for(lambda: in_sync(cluster, topic, {1, 2, 3}), 60, "every replica in sync")

        acked: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
        failed: list = []
        stop = threading.Event()

        def write() -> None:
            producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                                 "enable.idempotence": True, "linger.ms": 5,
                                 "message.timeout.ms": 120_000})

            def report(err, msg):
                (failed.append(err) if err else acked[msg.partition()].append(msg.value()))
            i = 0
            while not stop.is_set():
                try:
                    producer.produce(topic, b"%08d" % i, partition=i % PARTITIONS, on_delivery=report)
                    i += 1
                except BufferError:
                    pass
                producer.poll(0.001)
            producer.flush(120)

        writer = threading.Thread(target=write)
        writer.start()
        try:
            cluster.wait_for(lambda: sum(map(len, acked.values())) >= 2_000, 60, "records written")
            # Every broker leads some partitions and follows the others' in a session each.
            controller = cluster.controller_id()
            victim = next(i for i in cluster.brokers if i != controller)
            survivors = sorted(set(cluster.brokers) - {victim})
            led = {leader for leader, _, _ in partition_view(cluster.brokers[survivors[0]], topic).values()}
            assert victim in led
            before = {i: sessions(cluster.brokers[i]) for i in survivors}
            assert all(count >= 1 for count in before.values()), before
            cluster.brokers[victim].kill()
            cluster.wait_for(lambda: in_sync(cluster, topic, set(survivors)), 60,
                             "the victim's partitions led by survivors, both in every ISR")
            written = sum(map(len, acked.values()))
            cluster.wait_for(lambda: sum(map(len, acked.values())) >= written + 2_000, 60,
                             "records written after the failure")
        finally:
            stop.set()
            writer.join()
        assert not failed, failed[:3]
        # The partitions the victim led joined the survivors' existing sessions with each
        # other: no survivor was asked to open a new one.
        assert {i: sessions(cluster.brokers[i]) for i in survivors} == before
        for partition, values in acked.items():
            got = [m.value() for m in consume_all(cluster.bootstrap, topic, [partition], timeout=60)]
            assert got == values, f"partition {partition}: acknowledged records lost, repeated or reordered"
