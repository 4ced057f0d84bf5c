"""Tiered storage on three real brokers and a real S3 server, in both cluster modes: only the
leader copies; after a kill -9 of the leader the new one carries on from the remote log
metadata; a replica whose log is lost rebuilds below the leader's local log start from remote
storage (OFFSET_MOVED_TO_TIERED_STORAGE, KIP-405); consumers read every acknowledged record
once and in order, the part in remote storage included."""

from __future__ import annotations

import shutil
import uuid

import pytest
from confluent_kafka import Producer

from strom.s3_server import S3Server
from strom.testing import (
    Cluster,
    consume_all,
    free_ports,
    list_offset,
    tiered_overrides,
    unique_name,
    wait_for,
)

from .conftest import CLUSTER_OVERRIDES
from .replicas import wait_fully_replicated
from .test_cluster import create, log_dir, partition_view

CLUSTER_MODES = ("zookeeper", "kraft")
EARLIEST, EARLIEST_LOCAL = -2, -4


@pytest.fixture(scope="module")
def s3():
    with S3Server(ports=free_ports) as server:
        yield server


def tiered_cluster(zookeeper, s3: S3Server) -> Cluster:
    return Cluster(3, zookeeper=zookeeper, overrides={**CLUSTER_OVERRIDES, **tiered_overrides(
        s3.rsm_config(key_prefix=f"{uuid.uuid4().hex[:8]}/"), **{"rlmm.config.remote.log.metadata.topic.num.partitions": "3"})})


def produce_acked(cluster: Cluster, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                         "batch.size": 1024, "linger.ms": 0, "message.timeout.ms": 60000})
    failed = []
    for i, value in enumerate(values):
        producer.produce(topic, value, on_delivery=lambda err, _m: err and failed.append(err))
        if i % 10 == 9:
            producer.flush(30)
    assert producer.flush(60) == 0 and not failed, failed




def test_leader_failover_and_a_lost_replica_rebuilt_from_remote_storage(zookeeper, s3):
    with tiered_cluster(zookeeper, s3) as cluster:
        topic = unique_name("tiered")
        create(cluster, topic, assignment=[[1, 2, 3]], configs={
            "remote.storage.enable": "true", "segment.bytes": "4096", "local.retention.ms": "1",
            "min.insync.replicas": "2"})
        first = [b"first-%04d-" % i + b"a" * 200 for i in range(500)]
        produce_acked(cluster, topic, first)
        wait_for(lambda: list_offset(cluster.bootstrap, topic, EARLIEST_LOCAL) >= 300, timeout=60)
        # followers keep local segments by the same rule: none deleted before it is in remote storage
        cluster.brokers[1].kill()
        cluster.wait_for(lambda: partition_view(cluster.brokers[2], topic).get(0, (1,))[0] in (2, 3),
                         30, "a new leader")
        second = [b"second-%04d-" % i + b"b" * 200 for i in range(500)]
        produce_acked(cluster, topic, second)
        # the new leader copies on from where the remote log metadata says copying got to
        wait_for(lambda: list_offset(cluster.bootstrap, topic, EARLIEST_LOCAL) >= len(first) + 300, timeout=60)
        # broker 1 comes back without its replica: it rebuilds from remote storage
        shutil.rmtree(log_dir(cluster.brokers[1]) / f"{topic}-0")
        cluster.brokers[1].restart()
        wait_fully_replicated(cluster, timeout=90)
        assert "log restarted at the leader's local log start" in cluster.brokers[1].log_text()
        assert list_offset(cluster.bootstrap, topic, EARLIEST) == 0
        values = [m.value() for m in consume_all(cluster.bootstrap, topic, [0], start=0,
                                                 count=len(first) + len(second))]
        assert values == first + second
        # the leader goes too: whichever replica follows it serves the whole history
        leader = partition_view(cluster.brokers[1], topic)[0][0]
        cluster.brokers[leader].kill()
        cluster.wait_for(lambda: partition_view(cluster.brokers[1], topic).get(0, (leader,))[0] not in (leader, -1),
                         30, "another leader")
        values = [m.value() for m in consume_all(cluster.bootstrap, topic, [0], start=0,
                                                 count=len(first) + len(second))]
        assert values == first + second
