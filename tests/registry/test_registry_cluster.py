"""The schema registry on three real brokers, on ZooKeeper and on KRaft: one writer (the leader
of `_schemas` partition 0), writes sent to another broker forwarded to it, every broker serving
reads from its own store; after a kill -9 of the writer, registrations through a survivor go on
with no id given twice and nothing acknowledged lost."""

from __future__ import annotations

import json

import pytest
import requests
from confluent_kafka.admin import AdminClient

from strom.testing import KRAFT, Cluster, free_ports, report_broker_logs, unique_name, wait_for
from strom.zookeeper_server import ZooKeeperServer

pytest_runtest_makereport = pytest.hookimpl(hookwrapper=True)(report_broker_logs)

CT = {"Content-Type": "application/vnd.schemaregistry.v1+json"}


@pytest.fixture(params=["zookeeper", KRAFT])
def cluster(request):
    zookeeper = ZooKeeperServer(fsync=False) if request.param == "zookeeper" else None
    if zookeeper is not None:
        zookeeper.start()
    try:
        c = Cluster(3, zookeeper=zookeeper or KRAFT, overrides={"group.initial.rebalance.delay.ms": "0"})
        c.registry_urls = {}
        for broker_id, port in zip(sorted(c.brokers), free_ports(len(c.brokers)), strict=True):
            url = f"http://127.0.0.1:{port}"
            c.brokers[broker_id].overrides["schema.registry.listeners"] = url
            c.registry_urls[broker_id] = url
        with c:
            yield c
    finally:
        if zookeeper is not None:
            zookeeper.stop()


def writer(cluster: Cluster) -> int:
    return partition(cluster).leader


def partition(cluster: Cluster):
    metadata = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics("_schemas", timeout=10)
    return metadata.topics["_schemas"].partitions[0]


def schema(n: int) -> dict:
    return {"schema": json.dumps({"type": "record", "name": f"V{n}", "fields": [{"name": "f", "type": "int"}]})}


def register(url: str, subject: str, n: int) -> int | None:
    try:
        answer = requests.post(f"{url}/subjects/{subject}/versions", headers=CT, json=schema(n), timeout=30)
    except requests.RequestException:
        return None
    return answer.json()["id"] if answer.status_code == 200 else None


def ids_seen(url: str, subjects: list[str]) -> dict[str, int]:
    out = {}
    for subject in subjects:
        answer = requests.get(f"{url}/subjects/{subject}/versions/latest", timeout=10)
        if answer.status_code == 200:
            out[subject] = answer.json()["id"]
    return out


def test_one_writer_forwarding_and_failover(cluster):
    urls = cluster.registry_urls
    acknowledged: dict[str, int] = {}
    first = unique_name("first")
    acknowledged[first] = wait_for(lambda: register(urls[1], first, 0), what="the first registration")
    leader = writer(cluster)
    assert len(partition(cluster).replicas) == 3  # made once every broker was up: min(3, live)
    others = [b for b in sorted(urls) if b != leader]
    # through each non-writer: forwarded, one id sequence
    for n, broker_id in enumerate(others * 2, start=1):
        subject = unique_name(f"via{broker_id}")
        schema_id = register(urls[broker_id], subject, n)
        assert schema_id is not None
        acknowledged[subject] = schema_id
        # read-your-writes at the broker asked: it answered once it had read the write too
        assert ids_seen(urls[broker_id], [subject]) == {subject: schema_id}
    assert len(set(acknowledged.values())) == len(acknowledged)
    # every broker serves them from its own store
    for url in urls.values():
        wait_for(lambda url=url: ids_seen(url, list(acknowledged)) == acknowledged, what=f"{url} caught up")
    # kill -9 the writer; register through a survivor until a new writer takes it
    cluster.brokers[leader].kill()
    survivor = urls[others[0]]
    for n in range(10, 14):
        subject = unique_name("after")
        acknowledged[subject] = wait_for(lambda subject=subject, n=n: register(survivor, subject, n), timeout=60,
                                         what="a registration after the failover")
    assert writer(cluster) != leader
    assert len(set(acknowledged.values())) == len(acknowledged), acknowledged  # no id given twice
    for broker_id in others:
        wait_for(lambda url=urls[broker_id]: ids_seen(url, list(acknowledged)) == acknowledged,
                 what=f"broker {broker_id} has every acknowledged schema")
