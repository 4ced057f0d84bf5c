"""Clusters of real `strom serve` processes on one real ZooKeeper per test module.

Each test gets a `cluster` of its own (three brokers under a fresh chroot, so tests never see
each other's metadata) on the module's ZooKeeper, unless it is marked `shares_cluster`: a test
that stops, kills, adds or reconfigures no broker and whose checks hold whatever other tests
made before it (their own uniquely named topics and groups) shares one cluster with the other
such tests of its module; starting a cluster is most of such a test's time. Sessions time
out after 4 s so that a kill -9 is noticed in seconds.
"""

from __future__ import annotations

import pytest

from strom.testing import Cluster, report_broker_logs
from strom.zookeeper_server import ZooKeeperServer

pytest_runtest_makereport = pytest.hookimpl(hookwrapper=True)(report_broker_logs)

CLUSTER_OVERRIDES = {
    "offsets.topic.num.partitions": "6",
    "transaction.state.log.num.partitions": "6",
    "group.initial.rebalance.delay.ms": "0",
    "num.partitions": "3",
    "default.replication.factor": "3",
}


@pytest.fixture(scope="module")
def zookeeper():
    with ZooKeeperServer(fsync=False) as zk:
        yield zk


@pytest.fixture(scope="module")
def shared_cluster(zookeeper):
    with Cluster(3, zookeeper=zookeeper, overrides=CLUSTER_OVERRIDES) as c:
        yield c


@pytest.fixture
def cluster(request, zookeeper):
    if request.node.get_closest_marker("shares_cluster"):
        yield request.getfixturevalue("shared_cluster")
        return
    with Cluster(3, zookeeper=zookeeper, overrides=CLUSTER_OVERRIDES) as c:
        yield c
