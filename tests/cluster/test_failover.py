"""Failure handling on three real brokers: controlled shutdown under load, unclean election
off and on, preferred-leader election on demand and by the periodic rebalance."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import ElectionType, Producer
from confluent_kafka import TopicPartition as Partition
from confluent_kafka.admin import AdminClient

from strom.protocol.errors import ErrorCode
from strom.testing import Cluster, RawClient, consume_all, unique_name

from .conftest import CLUSTER_OVERRIDES
from .replicas import wait_fully_replicated
from .test_cluster import create, partition_view
from .test_replication import isr_of, leader_of

CLUSTER_MODES = ("zookeeper", "kraft")

ELECT_LEADERS = 43


def elect(broker, election_type: int, topic: str, partition: int = 0):
    with RawClient(broker) as client:
        response = client.call(ELECT_LEADERS, 2, {
            "election_type": election_type, "timeout_ms": 30000,
            "topic_partitions": [{"topic": topic, "partitions": [partition]}]})
    assert response.error_code == 0
    return response.replica_election_results[0].partition_result[0]


def test_controlled_shutdown_of_a_leader_under_load(cluster):
    """SIGTERM on the leader: it hands leadership over before it stops, so an idempotent
    acks=all producer sees no failure and nothing is lost; the longest stall is reported."""
    topic = unique_name("controlled")
    controller = cluster.controller_id()
    victim = next(b for b in cluster.brokers if b != controller)
    others = [b for b in cluster.brokers if b != victim]
    create(cluster, topic, assignment=[[victim, *others]], configs={"min.insync.replicas": "2"})
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 2, "message.timeout.ms": 60000})
    acked, failed, stamps = [], [], []

    def report(err, msg):
        if err:
            failed.append(err)
        else:
            acked.append(msg.value())
            stamps.append(time.monotonic())

    stopped = None
    deadline = time.monotonic() + 8
    i = 0
    while time.monotonic() < deadline:
        producer.produce(topic, b"%07d" % i, on_delivery=report)
        i += 1
        producer.poll(0.001)
        if stopped is None and time.monotonic() > deadline - 6:
            stopped = time.monotonic()
            assert cluster.brokers[victim].stop() == 0  # SIGTERM: controlled shutdown first
    assert producer.flush(60) == 0
    assert not failed, failed[:3]
    assert len(acked) == i
    assert "controlled shutdown succeeded" in cluster.brokers[victim].log_text()
    assert leader_of(cluster, topic) in others
    stall = max(b - a for a, b in zip(stamps, stamps[1:], strict=False))
    print(f"controlled shutdown: {i} records, longest stall between acknowledgements {stall * 1000:.0f} ms")
    got = consume_all(cluster.bootstrap, topic, count=i)
    assert [m.value() for m in got] == [b"%07d" % n for n in range(i)]


def _offline_partition(cluster: Cluster, topic: str, configs: dict) -> tuple[int, int]:
    """A 2-replica partition whose follower died first, then its leader: returns (old leader,
    out-of-sync follower), both down."""
    controller = cluster.controller_id()
    leader, follower = [b for b in cluster.brokers if b != controller]
    create(cluster, topic, assignment=[[leader, follower]], configs=configs)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    producer.produce(topic, b"in-sync")
    assert producer.flush(30) == 0
    cluster.brokers[follower].kill()
    cluster.wait_for(lambda: isr_of(cluster, topic) == [leader], 30, "the follower out of the ISR")
    producer.produce(topic, b"only-on-the-leader")
    assert producer.flush(30) == 0
    cluster.brokers[leader].kill()
    ctl = cluster.brokers[controller]
    cluster.wait_for(lambda: partition_view(ctl, topic)[0][0] == -1, 30, "the partition offline")
    return leader, follower


@pytest.mark.zookeeper_only("kills two of three nodes; with combined KRaft nodes that is the quorum")
def test_unclean_election_off_keeps_the_partition_offline(cluster):
    topic = unique_name("clean")
    leader, follower = _offline_partition(cluster, topic, {})
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "message.timeout.ms": 3000})
    errors = []
    producer.produce(topic, b"nowhere", on_delivery=lambda err, msg: errors.append(err))
    producer.flush(30)
    assert errors and errors[0] is not None, "the producer gets an error, not silent loss"
    cluster.brokers[follower].start()  # out of sync: must not lead
    # The controller handles events one at a time: once a topic created now is known
    # everywhere, the follower's start-up (and any election it allowed) has been handled.
    create(cluster, unique_name("barrier"), 1, 1)
    ctl = cluster.brokers[cluster.controller_id()]
    assert partition_view(ctl, topic)[0][0] == -1
    # An unclean election on demand brings it back on the out-of-sync replica.
    result = elect(ctl, 1, topic)
    assert result.error_code == ErrorCode.NONE
    cluster.wait_for(lambda: partition_view(ctl, topic)[0][0] == follower, 10, "the unclean leader")
    got = consume_all(cluster.bootstrap, topic, count=1)
    assert [m.value() for m in got] == [b"in-sync"]  # what only the old leader had is lost


@pytest.mark.zookeeper_only("kills two of three nodes; with combined KRaft nodes that is the quorum")
def test_unclean_election_on_brings_the_partition_back(cluster):
    topic = unique_name("unclean")
    leader, follower = _offline_partition(cluster, topic, {"unclean.leader.election.enable": "true"})
    cluster.brokers[follower].start()
    ctl = cluster.brokers[cluster.controller_id()]
    cluster.wait_for(lambda: partition_view(ctl, topic)[0][0] == follower, 30, "the out-of-sync replica leading")
    assert "unclean election" in cluster.brokers[cluster.controller_id()].log_text()
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    producer.produce(topic, b"back")
    assert producer.flush(30) == 0
    cluster.brokers[leader].start()  # the old leader truncates to the unclean one's log and follows
    wait_fully_replicated(cluster, 60)


def test_preferred_leader_election_on_demand(cluster):
    topic = unique_name("preferred")
    controller = cluster.controller_id()
    preferred = next(b for b in cluster.brokers if b != controller)
    create(cluster, topic, assignment=[[preferred, *[b for b in cluster.brokers if b != preferred]]])
    ctl = cluster.brokers[controller]
    assert elect(ctl, 0, topic).error_code == ErrorCode.ELECTION_NOT_NEEDED
    cluster.brokers[preferred].kill()
    cluster.wait_for(lambda: leader_of(cluster, topic) not in (-1, preferred), 30, "another leader")
    cluster.brokers[preferred].start()
    cluster.wait_for(lambda: preferred in isr_of(cluster, topic), 30, "the preferred replica in sync")
    assert elect(ctl, 0, topic).error_code == ErrorCode.NONE
    cluster.wait_for(lambda: leader_of(cluster, topic) == preferred, 10, "the preferred leader back")


def test_auto_leader_rebalance(zookeeper):
    overrides = {**CLUSTER_OVERRIDES, "leader.imbalance.check.interval.seconds": "1"}
    with Cluster(3, zookeeper=zookeeper, overrides=overrides) as cluster:
        topic = unique_name("rebalance")
        controller = cluster.controller_id()
        preferred = next(b for b in cluster.brokers if b != controller)
        create(cluster, topic, assignment=[[preferred, *[b for b in cluster.brokers if b != preferred]]])
        cluster.brokers[preferred].kill()
        cluster.wait_for(lambda: leader_of(cluster, topic) not in (-1, preferred), 30, "another leader")
        cluster.brokers[preferred].start()
        cluster.wait_for(lambda: leader_of(cluster, topic) == preferred, 30,
                         "the periodic rebalance giving leadership back")


def _write(bootstrap: str, topic: str, partitions: int, transactions: int) -> None:
    """A record to each partition of `topic`, acks=all, and `transactions` transactional
    producers committing one record each (so __transaction_state has data)."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for p in range(partitions):
        producer.produce(topic, b"plain", partition=p)
    assert producer.flush(30) == 0
    for n in range(transactions):
        txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique_name(f"txn-{n}")})
        txn.init_transactions(30)
        txn.begin_transaction()
        txn.produce(topic, b"txn", partition=n % partitions)
        txn.commit_transaction(30)


def test_every_follower_fetches_again_after_a_restart_and_a_preferred_election(zookeeper):
    """kill -9 of a broker that is not the controller, writes while it is down, its restart and
    a preferred election that gives it its leaderships back: every partition, internal and
    idle ones included, has every replica in sync again and every log end equal.

    A partition that took no write while the broker was away reaches the restarted leader with
    followers whose last epoch (the one they led in meanwhile, writing nothing) the leader never
    had; they must drop it rather than fetch into the same divergence for ever."""
    lag_ms = 4000
    overrides = {**CLUSTER_OVERRIDES, "replica.lag.time.max.ms": str(lag_ms)}
    with Cluster(3, zookeeper=zookeeper, overrides=overrides) as cluster:
        busy, idle = unique_name("busy"), unique_name("idle")
        create(cluster, busy, 12)
        create(cluster, idle, 6)
        _write(cluster.bootstrap, busy, 12, 20)
        _write(cluster.bootstrap, idle, 6, 0)
        controller = cluster.controller_id()
        victim = next(b for b in cluster.brokers if b != controller)
        cluster.brokers[victim].kill()
        cluster.wait_for(lambda: victim not in partition_view(cluster.brokers[controller], busy)[0][2], 30,
                         "the killed broker out of the ISR")
        _write(cluster.bootstrap, busy, 12, 5)  # the idle topic takes nothing meanwhile
        cluster.brokers[victim].start()
        wait_fully_replicated(cluster, 60)
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        topics = admin.list_topics(timeout=10).topics
        wanted = [Partition(t, p) for t in topics for p in topics[t].partitions]
        results = admin.elect_leaders(ElectionType.PREFERRED, wanted).result(30)
        moved = [tp for tp, error in results.items() if error is None]
        assert moved, results  # the restarted broker led something again
        _write(cluster.bootstrap, busy, 12, 5)
        time.sleep(lag_ms / 1000 + 2)  # a follower not fetching has left the ISR by now
        wait_fully_replicated(cluster, 30)
