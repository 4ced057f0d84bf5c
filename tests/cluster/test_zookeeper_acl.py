"""zookeeper.set.acl: brokers authenticate to ZooKeeper (digest) and create nodes others may
read but not change, and sensitive ones (SCRAM credentials, broker configs, tokens) others may
not even read, as Kafka's secure ZooKeeper mode does."""

from __future__ import annotations

import subprocess
import sys

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from strom.testing import Cluster, create_topic, unique_name

from .conftest import CLUSTER_OVERRIDES


@pytest.fixture
def cluster(zookeeper):
    overrides = {**CLUSTER_OVERRIDES, "default.replication.factor": "1", "zookeeper.set.acl": "true",
                 "zookeeper.digest.auth": "strom:zk-secret"}
    with Cluster(1, zookeeper=zookeeper, overrides=overrides) as c:
        yield c


def kazoo(cluster, auth: str | None) -> KazooClient:
    client = KazooClient(hosts=cluster.zk_connect, auth_data=[("digest", auth)] if auth else None)
    client.start(timeout=10)
    return client


def test_nodes_are_the_brokers_to_change(cluster):
    broker = next(iter(cluster.brokers.values()))
    topic = unique_name("guarded")
    create_topic(broker.bootstrap, topic)
    done = subprocess.run([sys.executable, "-m", "strom", "users", "scram-set", "bob", "--password", "pw",
                           "--bootstrap-server", broker.bootstrap], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    anyone, owner = kazoo(cluster, None), kazoo(cluster, "strom:zk-secret")
    try:
        assert topic in anyone.get_children("/brokers/topics")  # readable by all
        assert anyone.get("/brokers/ids/1")[0]
        with pytest.raises(NoAuthError):
            anyone.create(f"/brokers/topics/{topic}/forged", b"x")
        with pytest.raises(NoAuthError):
            anyone.set(f"/brokers/topics/{topic}", b"{}")
        with pytest.raises(NoAuthError):
            anyone.get("/config/users/bob")  # credentials: not even readable
        assert b"SCRAM-SHA-256" in owner.get("/config/users/bob")[0]
    finally:
        for client in (anyone, owner):
            client.stop()
            client.close()
