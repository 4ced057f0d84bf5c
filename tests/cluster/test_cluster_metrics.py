"""Replication metrics of a real three-broker cluster, on ZooKeeper and on a KRaft quorum of
combined nodes, scraped while a follower stalls, a broker dies and comes back, and the
controller dies: under-replicated partitions, ISR shrinks and expansions, replication traffic,
the one active controller and its offline-partition count. At most one node is down at a time,
so a KRaft quorum of three keeps its majority throughout."""

from __future__ import annotations

import signal

import pytest

from strom.testing import (
    Cluster,
    create_topic,
    metric_value,
    produce_acked,
    scrape,
    unique_name,
    wait_for,
)

from .conftest import CLUSTER_OVERRIDES

CLUSTER_MODES = ("zookeeper", "kraft")


@pytest.fixture
def cluster(zookeeper):
    overrides = {**CLUSTER_OVERRIDES, "metrics.port": "0", "replica.lag.time.max.ms": "1000"}
    with Cluster(3, zookeeper=zookeeper, overrides=overrides) as c:
        yield c


def test_replication_metrics_follow_a_stalled_follower_and_a_dead_broker(cluster):
    controller = cluster.controller_id()
    leader = cluster.brokers[controller]  # the controller leads, so stopping others keeps it
    stalled_id, doomed_id = sorted(set(cluster.brokers) - {controller})
    stalled, doomed = cluster.brokers[stalled_id], cluster.brokers[doomed_id]
    topic = unique_name("replicated")
    create_topic(cluster.bootstrap, topic, replication_factor=3,
                 assignment=[[controller, stalled_id, doomed_id]])
    produce_acked(cluster.bootstrap, topic, [b"x" * 100] * 50, acks="all")
    # A partition the stalled broker leads: its follower sees its own fetches stop.
    behind = unique_name("behind")
    create_topic(cluster.bootstrap, behind, replication_factor=2, assignment=[[stalled_id, doomed_id]])
    produce_acked(cluster.bootstrap, behind, [b"y"] * 5, acks="all")

    def stalled_on_doomed() -> float:
        return metric_value(scrape(doomed.metrics_url), "strom_follower_stalled_partitions")

    def leader_metric(name: str, **labels: str) -> float:
        return metric_value(scrape(leader.metrics_url), name, **labels)

    active = [metric_value(scrape(b.metrics_url), "strom_active_controller") for b in cluster.brokers.values()]
    assert sorted(active) == [0, 0, 1]
    assert leader_metric("strom_replication_bytes_out_total") >= 50 * 100
    wait_for(lambda: metric_value(scrape(stalled.metrics_url), "strom_replication_bytes_in_total") >= 50 * 100,
             timeout=10, what="the follower's replication bytes")
    assert leader_metric("strom_under_replicated_partitions") == 0
    shrinks, expands = leader_metric("strom_isr_shrinks_total"), leader_metric("strom_isr_expands_total")

    wait_for(lambda: stalled_on_doomed() == 0, timeout=10, what="every followed partition fetched")
    stalled.proc.send_signal(signal.SIGSTOP)  # behind for replica.lag.time.max.ms: out of the ISR
    try:
        wait_for(lambda: leader_metric("strom_under_replicated_partitions") >= 1, timeout=15,
                 what="an under-replicated partition")
        assert leader_metric("strom_isr_shrinks_total") > shrinks
        # The follower of `behind` counts and says that it cannot fetch from the stopped leader.
        wait_for(lambda: stalled_on_doomed() >= 1, timeout=15, what="the follower's stall counted")
        wait_for(lambda: f"not fetched from broker {stalled_id}" in doomed.log_text(), timeout=5,
                 what="the follower's stall logged")
    finally:
        stalled.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: leader_metric("strom_under_replicated_partitions") == 0, timeout=30,
             what="the follower back in the ISR")
    assert leader_metric("strom_isr_expands_total") > expands
    wait_for(lambda: stalled_on_doomed() == 0, timeout=30, what="the follower fetching again")

    # A partition whose only replica dies has no leader: the controller counts it offline.
    lonely = unique_name("lonely")
    create_topic(cluster.bootstrap, lonely, assignment=[[doomed_id]])
    assert leader_metric("strom_offline_partitions") == 0
    doomed.kill()
    wait_for(lambda: leader_metric("strom_offline_partitions") >= 1, timeout=30,
             what="an offline partition on the controller")
    assert leader_metric("strom_global_partitions") >= 2

    # Back again, the broker leads its partition: nothing is offline any more.
    doomed.start()
    wait_for(lambda: leader_metric("strom_offline_partitions") == 0, timeout=30,
             what="the lonely partition led again")

    # The controller dies: exactly one of the others becomes the active controller, and counts
    # the whole cluster (the dead controller's partitions have new leaders: none offline).
    leader.kill()
    survivors = [b for i, b in cluster.brokers.items() if i != controller]

    def new_controller():
        active = [b for b in survivors if metric_value(scrape(b.metrics_url), "strom_active_controller") == 1]
        return active[0] if len(active) == 1 and cluster.controller_id() not in (-1, controller) else None

    successor = wait_for(new_controller, timeout=30, what="one new active controller")
    assert successor is cluster.brokers[cluster.controller_id()]
    assert sorted(metric_value(scrape(b.metrics_url), "strom_active_controller") for b in survivors) == [0, 1]

    def successor_metric(name: str) -> float:
        return metric_value(scrape(successor.metrics_url), name)

    wait_for(lambda: successor_metric("strom_global_partitions") >= 2 and successor_metric("strom_offline_partitions") == 0,
             timeout=30, what="the new controller counting every partition, none offline")
