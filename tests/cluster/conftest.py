"""Clusters of real `strom serve` processes on one real ZooKeeper per test module.

Each test gets a `cluster` of its own (three brokers under a fresh chroot, so tests never see
each other's metadata) on the module's ZooKeeper, unless it is marked `shares_cluster`: a test
that stops, kills, adds or reconfigures no broker and whose checks hold whatever other tests
made before it (their own uniquely named topics and groups) shares one cluster with the other
such tests of its module; starting a cluster is most of such a test's time. Sessions time
out after 4 s so that a kill -9 is noticed in seconds.

A module that sets `CLUSTER_MODES = ("zookeeper", "kraft")` runs every test twice: once on
ZooKeeper, once on a KRaft quorum of combined nodes (no JVM), the same test code both times:
its `zookeeper` fixture is then `KRAFT`, which Cluster takes to mean a KRaft cluster. A test
marked `zookeeper_only(why)` runs on ZooKeeper alone, saying why: one that takes down two of
three nodes and expects the controller to act on it, which a quorum of three combined nodes
cannot (two of three controllers down is a quorum lost; Kafka decides nothing then either),
or one of what KRaft mode does not have yet (delegation tokens). One marked `kraft_only(why)`
tests what only KRaft has (its controller listener, say).
"""

from __future__ import annotations

import pytest

from strom.testing import KRAFT, Cluster, report_broker_logs
from strom.zookeeper_server import ZooKeeperServer

pytest_runtest_makereport = pytest.hookimpl(hookwrapper=True)(report_broker_logs)

CLUSTER_OVERRIDES = {
    "offsets.topic.num.partitions": "6",
    "transaction.state.log.num.partitions": "6",
    "group.initial.rebalance.delay.ms": "0",
    "num.partitions": "3",
    "default.replication.factor": "3",
}


def pytest_generate_tests(metafunc):
    if "cluster_mode" in metafunc.fixturenames:
        modes = getattr(metafunc.module, "CLUSTER_MODES", ("zookeeper",))
        if metafunc.definition.get_closest_marker("zookeeper_only"):
            modes = ("zookeeper",)
        elif metafunc.definition.get_closest_marker("kraft_only"):
            modes = ("kraft",)
        metafunc.parametrize("cluster_mode", modes, indirect=True, scope="module")


@pytest.fixture(scope="module")
def cluster_mode(request):
    return request.param


@pytest.fixture(scope="module")
def zookeeper(cluster_mode):
    if cluster_mode == KRAFT:
        yield KRAFT
        return
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
