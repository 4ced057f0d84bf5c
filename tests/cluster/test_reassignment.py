"""Partition reassignment (KIP-455) on real brokers: a partition under load moves from
brokers {1,2,3} to {2,3,4} without losing or repeating a record."""

from __future__ import annotations

import os
import signal
import threading
import time

from confluent_kafka import Producer

from strom.protocol.errors import ErrorCode
from strom.testing import RawClient, consume_all, unique_name

from .replicas import wait_fully_replicated
from .test_cluster import create, partition_view, topic_dirs
from .test_replication import segment_bytes

CLUSTER_MODES = ("zookeeper", "kraft")

ALTER_REASSIGNMENTS, LIST_REASSIGNMENTS, INCREMENTAL_ALTER_CONFIGS = 45, 46, 44


def reassign(controller, topic: str, replicas: list[int] | None):
    with RawClient(controller) as client:
        return client.call(ALTER_REASSIGNMENTS, 0, {"timeout_ms": 30000, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "replicas": replicas}]}]})


def ongoing(controller) -> list:
    with RawClient(controller) as client:
        response = client.call(LIST_REASSIGNMENTS, 0, {"timeout_ms": 30000, "topics": None})
    return [(t.name, p.partition_index, list(p.adding_replicas), list(p.removing_replicas))
            for t in response.topics for p in t.partitions]


def test_reassignment_under_load_loses_nothing(cluster):
    topic = unique_name("move")
    create(cluster, topic, assignment=[[1, 2, 3]], configs={"min.insync.replicas": "2"})
    new = cluster.add_broker(4)
    # A broker new to the cluster knows the topics made before it (and a client asking it
    # for them is not told to wait for a leader).
    cluster.wait_for(lambda: partition_view(new, topic), 30, "the new broker to know the older topic")
    controller = cluster.brokers[cluster.controller_id()]
    stop = threading.Event()
    acked, failed = [], []

    def produce() -> None:
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                             "enable.idempotence": True, "linger.ms": 5})
        i = 0
        while not stop.is_set():
            try:
                producer.produce(topic, b"%07d" % i, on_delivery=lambda err, msg: (
                    failed if err else acked).append(err or msg.value()))
                i += 1
            except BufferError:
                pass
            producer.poll(0.001)
        producer.flush(60)

    writer = threading.Thread(target=produce)
    writer.start()
    try:
        cluster.wait_for(lambda: len(acked) > 5000, 30, "records before the move")
        response = reassign(controller, topic, [2, 3, 4])
        assert response.error_code == 0
        assert response.responses[0].partitions[0].error_code == ErrorCode.NONE
        cluster.wait_for(lambda: partition_view(controller, topic)[0][1] == [2, 3, 4] and not ongoing(controller),
                         60, "the reassignment to complete")
        mark = len(acked)
        cluster.wait_for(lambda: len(acked) > mark + 2000, 30, "records after the move")
    finally:
        stop.set()
        writer.join(120)
    assert not failed, failed[:3]
    leader, replicas, isr = partition_view(controller, topic)[0]
    assert replicas == [2, 3, 4] and leader in (2, 3, 4) and sorted(isr) == [2, 3, 4]
    got = consume_all(cluster.bootstrap, topic, count=len(acked))
    assert [m.value() for m in got] == sorted(acked) == [b"%07d" % i for i in range(len(acked))]
    cluster.wait_for(lambda: topic_dirs(cluster.brokers[1], topic) == [], 30, "the old replica deleted")
    cluster.wait_for(lambda: len({segment_bytes(cluster.brokers[b], topic, 0) for b in (2, 3, 4)}) == 1, 30,
                     "the new replica identical")
    wait_fully_replicated(cluster, 30)  # and every other partition, internal ones included


def test_cancel_and_errors(cluster):
    c = cluster.controller_id()
    a, b = [x for x in cluster.brokers if x != c]
    topic = unique_name("cancel")
    create(cluster, topic, assignment=[[c, a]])
    controller = cluster.brokers[c]
    first = reassign(controller, topic, [c, a, 9]).responses[0].partitions[0]
    assert first.error_code == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert reassign(controller, topic, None).responses[0].partitions[0].error_code == (
        ErrorCode.NO_REASSIGNMENT_IN_PROGRESS)
    # A move onto a paused broker (not the controller) cannot finish: it cannot catch up.
    paused = cluster.brokers[b]
    os.kill(paused.proc.pid, signal.SIGSTOP)
    try:
        assert reassign(controller, topic, [c, b]).responses[0].partitions[0].error_code == ErrorCode.NONE
        assert ongoing(controller) == [(topic, 0, [b], [a])]
        assert partition_view(controller, topic)[0][1] == [c, b, a]
        assert reassign(controller, topic, None).responses[0].partitions[0].error_code == ErrorCode.NONE
        assert ongoing(controller) == []
        assert partition_view(controller, topic)[0][1] == [c, a]
    finally:
        os.kill(paused.proc.pid, signal.SIGCONT)


def _alter(broker, resource_type: int, name: str, configs: dict[str, str]) -> None:
    with RawClient(broker) as client:
        response = client.call(INCREMENTAL_ALTER_CONFIGS, 1, {"validate_only": False, "resources": [{
            "resource_type": resource_type, "resource_name": name, "configs": [
                {"name": k, "config_operation": 0, "value": v} for k, v in configs.items()]}]})
    assert response.responses[0].error_code == 0, response.responses[0].error_message


def test_throttled_reassignment_moves_at_the_throttle_rate(cluster):
    """follower.replication.throttled.rate bounds how fast a new replica catches up; the
    move still completes and loses nothing."""
    topic = unique_name("throttled")
    create(cluster, topic, assignment=[[1, 2, 3]])
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 20})
    for i in range(2000):
        producer.produce(topic, b"%04d" % i + b"x" * 1000)
    assert producer.flush(60) == 0
    size = len(segment_bytes(cluster.brokers[1], topic, 0))
    rate = 400_000
    controller = cluster.brokers[cluster.controller_id()]
    _alter(controller, 4, "", {"follower.replication.throttled.rate": str(rate)})  # cluster default
    _alter(controller, 2, topic, {"follower.replication.throttled.replicas": "*"})
    new = cluster.add_broker(4)
    begin = time.monotonic()
    assert reassign(controller, topic, [2, 3, 4]).responses[0].partitions[0].error_code == ErrorCode.NONE
    cluster.wait_for(lambda: not ongoing(controller), 60, "the throttled move to complete")
    took = time.monotonic() - begin
    # Never faster than the throttle allows (slower machines only make it slower).
    assert took >= 0.5 * size / rate, f"{size} bytes in {took:.1f} s at a {rate} B/s throttle"
    assert segment_bytes(new, topic, 0) == segment_bytes(cluster.brokers[2], topic, 0)
    print(f"throttled move: {size} bytes in {took:.1f} s at {rate} B/s")
