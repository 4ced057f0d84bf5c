"""A combined node (process.roles=broker,controller) as a real process: formatted with `strom
storage format --standalone`, it serves clients on its broker listener and only controller
traffic on its controller listener, keeps the metadata log apart from the broker's logs, and
comes back from a restart with its directories as formatted."""

from __future__ import annotations

import subprocess
import sys

import pytest
from kafka.admin import KafkaAdminClient

from strom.client import Connection
from strom.metadata.storage import METADATA_PARTITION_DIR, read_meta
from strom.testing import (
    BrokerProcess,
    create_topic,
    free_ports,
    produce_acked,
    read_values,
    unique_name,
)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    data = tmp_path_factory.mktemp("combined")
    port = free_ports(1)[0]
    settings = {"process.roles": "broker,controller", "node.id": "1",
                "controller.quorum.bootstrap.servers": f"127.0.0.1:{port}",
                "listeners": f"PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:{port}",
                "controller.listener.names": "CONTROLLER", "inter.broker.listener.name": "PLAINTEXT",
                "log.dirs": str(data / "logs"), "offsets.topic.num.partitions": "1",
                "offsets.topic.replication.factor": "1", "group.initial.rebalance.delay.ms": "0"}
    props = data / "server.properties"
    props.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    cluster_id = subprocess.run([sys.executable, "-m", "strom", "storage", "random-uuid"], capture_output=True,
                                text=True, check=True).stdout.strip()
    formatted = subprocess.run([sys.executable, "-m", "strom", "storage", "format", "--cluster-id", cluster_id,
                                "--config", str(props), "--standalone"], capture_output=True, text=True)
    assert formatted.returncode == 0, formatted.stderr
    assert "dynamic metadata voter directory" in formatted.stdout
    with BrokerProcess(data, settings) as broker:
        broker.cluster_id = cluster_id
        yield broker


def test_clients_use_the_broker_listener_and_describe_the_quorum(node):
    assert set(node.ports) == {"PLAINTEXT", "CONTROLLER"} and node.port == node.ports["PLAINTEXT"]
    topic = unique_name("combined")
    create_topic(node.bootstrap, topic, 1)
    assert produce_acked(node.bootstrap, topic, [b"a", b"b"]) == [0, 1]
    assert read_values(node.bootstrap, topic, 2) == [b"a", b"b"]
    admin = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=10000)
    try:
        part = admin.describe_metadata_quorum()["topics"][0]["partitions"][0]
    finally:
        admin.close()
    assert part["leader_id"] == 1 and [v["replica_id"] for v in part["current_voters"]] == [1]


def test_no_topic_takes_the_metadata_partitions_place(node):
    from confluent_kafka.admin import AdminClient, NewTopic

    client = AdminClient({"bootstrap.servers": node.bootstrap})
    future = client.create_topics([NewTopic("__cluster_metadata", 1, 1)])["__cluster_metadata"]
    with pytest.raises(Exception, match="prohibited"):
        future.result(30)


def test_the_controller_listener_serves_controller_apis_only(node):
    with Connection("127.0.0.1", node.ports["CONTROLLER"]) as conn:
        versions = conn.call(18, 3, {"client_software_name": "t", "client_software_version": "1"})
        keys = {k.api_key for k in versions.api_keys}
        assert {52, 53, 54, 55, 1, 59, 80, 81, 19, 62, 63} <= keys and not keys & {0, 3, 8, 10, 11}
        assert {f.name: f.max_version_level for f in versions.finalized_features}["metadata.version"] == 25
        with pytest.raises(ConnectionError):  # Metadata is not enabled here: Kafka closes the connection
            conn.call(3, 12, {"topics": [], "allow_auto_topic_creation": False,
                              "include_topic_authorized_operations": False})


def test_a_restart_keeps_the_metadata_log_and_the_formatted_directories(node):
    logs = node.data_dir / "logs"
    segments = sorted((logs / METADATA_PARTITION_DIR).glob("*.log"))
    assert segments and segments[0].stat().st_size > 0
    assert node.stop() == 0
    meta = read_meta(logs)  # still version 1 with node.id and directory.id: the broker did not rewrite it
    assert meta.node_id == 1 and meta.cluster_id == node.cluster_id and meta.directory_id
    node.start()
    assert (logs / METADATA_PARTITION_DIR / segments[0].name).exists()
    assert "deleting log __cluster_metadata" not in node.log_text()
    with Connection("127.0.0.1", node.ports["CONTROLLER"]) as conn:
        body = conn.call(55, 2, {"topics": [{"topic_name": "__cluster_metadata", "partitions": [{"partition_index": 0}]}]})
    part = body.topics[0].partitions[0]
    assert part.error_code == 0 and part.leader_id == 1 and part.leader_epoch >= 2
