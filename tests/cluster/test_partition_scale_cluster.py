"""3,000 partitions on three brokers, in ZooKeeper and in KRaft mode (more than one 2,000-partition
chunk of each controller request, and of the KRaft publisher's slices): their leaders are
elected again (a broker killed and brought back) and moved (every partition's replica order
reversed, then a preferred election of all of them) while an idempotent acks=all producer writes; not one acknowledged record is
lost or reordered, none is written twice under one producer epoch, and every broker ends up
agreeing on every leader."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import Producer

from strom.client import Connection
from strom.testing import Cluster, consume_all, unique_name

from .conftest import CLUSTER_OVERRIDES
from .idempotence import log_batches, values_of, written_once
from .test_cluster import partition_view

CLUSTER_MODES = ("zookeeper", "kraft")

PARTITIONS = 3_000
WRITTEN = range(0, PARTITIONS, 100)  # the partitions the producer writes to
# Waits that read every partition's state from the brokers poll twice a second, not twenty times:
# each read costs the brokers and the test CPU that the work waited on needs.
WIDE_POLL = 0.5
ALTER_REASSIGNMENTS, LIST_REASSIGNMENTS, ELECT_LEADERS, CREATE_TOPICS = 45, 46, 43, 19

pytestmark = pytest.mark.timeout(900)


@pytest.fixture
def cluster(zookeeper):
    overrides = {**CLUSTER_OVERRIDES, "max.broker.partitions": str(PARTITIONS + 1000)}
    with Cluster(3, zookeeper=zookeeper, overrides=overrides) as c:
        yield c


def view(cluster: Cluster, broker_id: int, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
    return partition_view(cluster.brokers[broker_id], topic)


def all_led(cluster: Cluster, topic: str, brokers=(1, 2, 3)) -> bool:
    for b in brokers:
        v = view(cluster, b, topic)
        if len(v) != PARTITIONS or any(leader < 0 for leader, _, _ in v.values()):
            return False
    return True


def test_thousands_of_partitions_elected_and_moved_under_load(cluster):
    topic = unique_name("many")
    cid = cluster.controller_id()
    controller = cluster.brokers[cid]
    with Connection("127.0.0.1", controller.port, timeout_s=600) as client:
        body = client.call(CREATE_TOPICS, 5, {"topics": [{
            "name": topic, "num_partitions": PARTITIONS, "replication_factor": 2, "assignments": [],
            "configs": [{"name": "min.insync.replicas", "value": "1"}]}], "timeout_ms": 300_000,
            "validate_only": False})
    assert body.topics[0].error_code == 0, body
    cluster.wait_for(lambda: all_led(cluster, topic), 300, "every partition led, on every broker", WIDE_POLL)

    stop = threading.Event()
    acked: dict[int, list[bytes]] = {p: [] for p in WRITTEN}
    failed: list = []

    def produce() -> None:
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                             "enable.idempotence": True, "linger.ms": 5})

        def report(err, msg) -> None:
            if err is not None:
                failed.append(err)
            else:
                acked[msg.partition()].append(msg.value())

        i = 0
        while not stop.is_set():
            try:
                producer.produce(topic, b"%07d" % i, partition=WRITTEN[i % len(WRITTEN)], on_delivery=report)
                i += 1
            except BufferError:
                pass
            producer.poll(0.002)
        assert producer.flush(120) == 0
        producer.close()

    writer = threading.Thread(target=produce)
    writer.start()
    try:
        def total() -> int:
            return sum(len(v) for v in acked.values())

        cluster.wait_for(lambda: total() > 2000, 60, "records before the elections")
        # Elections: the broker that is not the controller and leads the most goes down hard.
        leaders = [leader for leader, _, _ in view(cluster, cid, topic).values()]
        victim = max((b for b in (1, 2, 3) if b != cid), key=leaders.count)
        assert leaders.count(victim) > PARTITIONS // 4
        cluster.brokers[victim].kill()
        cluster.wait_for(lambda: all(leader not in (victim, -1) for leader, _, _ in view(cluster, cid, topic).values()),
                         120, "new leaders for every partition the killed broker led", WIDE_POLL)
        cluster.brokers[victim].start(timeout=300)
        cluster.wait_for(lambda: all(sorted(isr) == sorted(replicas) for _, replicas, isr
                                     in view(cluster, cid, topic).values()), 300,
                         "the restarted broker back in every ISR", WIDE_POLL)
        mark = total()
        cluster.wait_for(lambda: total() > mark + 1000, 60, "records after the elections")

        # Moves: every partition's replicas reversed, then the preferred leader elected everywhere.
        before = view(cluster, cid, topic)
        with Connection("127.0.0.1", controller.port, timeout_s=600) as client:
            response = client.call(ALTER_REASSIGNMENTS, 0, {"timeout_ms": 300_000, "topics": [
                {"name": topic, "partitions": [{"partition_index": p, "replicas": list(reversed(replicas))}
                                               for p, (_, replicas, _) in before.items()]}]})
            assert response.error_code == 0
            assert all(p.error_code == 0 for t in response.responses for p in t.partitions)
            cluster.wait_for(lambda: not client.call(LIST_REASSIGNMENTS, 0, {"timeout_ms": 30_000,
                                                                             "topics": None}).topics,
                             300, "the reassignments to complete", WIDE_POLL)
            elected = client.call(ELECT_LEADERS, 2, {"election_type": 0, "timeout_ms": 300_000,
                                                     "topic_partitions": None})
            assert elected.error_code == 0
        cluster.wait_for(lambda: all(leader == replicas[0] == before[p][1][-1]
                                     for p, (leader, replicas, _) in view(cluster, cid, topic)
                                     .items()), 300, "every partition led by its new preferred replica", WIDE_POLL)
        mark = total()
        cluster.wait_for(lambda: total() > mark + 1000, 60, "records after the moves")
    finally:
        stop.set()
        writer.join(180)
    assert not failed, failed[:3]
    # Every broker agrees on every leader.
    cluster.wait_for(lambda: len({tuple(sorted((p, v[0]) for p, v in view(cluster, b, topic).items()))
                                  for b in (1, 2, 3)}) == 1, 60, "the same leaders on every broker", WIDE_POLL)
    leaders = view(cluster, cid, topic)
    logs = {p: log_batches(cluster, topic, p, leaders[p][0]) for p in WRITTEN}
    read: dict[int, list[bytes]] = {p: [] for p in WRITTEN}
    for m in consume_all(cluster.bootstrap, topic, list(WRITTEN), count=sum(len(values_of(log)) for log in logs.values())):
        read[m.partition()].append(m.value())
    for p, values in acked.items():
        assert read[p] == values_of(logs[p]), f"partition {p}: a consumer reads otherwise"
        written_once(p, values, logs[p])
