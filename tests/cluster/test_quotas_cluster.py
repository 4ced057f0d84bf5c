"""Quotas in a cluster: set through one broker, they apply on every broker; and replication
is never held back by client quotas, however low they are."""

from __future__ import annotations

import subprocess
import sys

import pytest
from confluent_kafka import Producer

from strom.testing import Cluster, create_topic, metric_value, scrape, unique_name, wait_for

from .conftest import CLUSTER_OVERRIDES

CLUSTER_MODES = ("zookeeper", "kraft")


@pytest.fixture
def cluster(zookeeper):
    with Cluster(3, zookeeper=zookeeper, overrides={**CLUSTER_OVERRIDES, "metrics.port": "0",
                                                    "quota.window.num": "2"}) as c:
        yield c


def test_quotas_reach_every_broker_and_spare_replication(cluster):
    first, second = cluster.brokers[1], cluster.brokers[2]
    # Every client (followers included, were they clients) limited to 1 KB/s each way.
    done = subprocess.run([sys.executable, "-m", "strom", "quotas", "set", "--client-default",
                           "consumer_byte_rate=1000", "producer_byte_rate=1000000",
                           "--bootstrap-server", first.bootstrap], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: "client-id=<default> are consumer_byte_rate=1000" in subprocess.run(
        [sys.executable, "-m", "strom", "quotas", "describe", "--bootstrap-server", second.bootstrap],
        capture_output=True, text=True, timeout=60).stdout, timeout=15, what="the quota on another broker")
    topic = unique_name("replicated-under-quota")
    create_topic(cluster.bootstrap, topic, replication_factor=3)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "message.timeout.ms": 30_000})
    failures = []
    for _ in range(20):  # 200 KB: 200 s at 1 KB/s, were replication throttled
        producer.produce(topic, value=b"r" * 10_000, on_delivery=lambda err, _m: err and failures.append(err))
    assert producer.flush(60) == 0 and not failures
    fetched = sum(metric_value(scrape(b.metrics_url), "strom_replication_bytes_in_total") for b in cluster.brokers.values())
    assert fetched >= 2 * 200_000
    key = ("strom_request_throttle_time_seconds_count", frozenset({("request", "Fetch")}))
    served = [scrape(b.metrics_url) for b in cluster.brokers.values()]
    assert sum(s.get(key, 0) for s in served) > 0  # the leader answered followers' fetches...
    zero = ("strom_request_throttle_time_seconds_bucket", frozenset({("request", "Fetch"), ("le", "0.0005")}))
    assert all(s.get(zero, 0) == s.get(key, 0) for s in served)  # ...and held none of them back
