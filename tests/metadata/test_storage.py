"""`strom storage format` and the start-up check of a KRaft node's directories."""

from __future__ import annotations

import uuid

import pytest

from strom.config.broker import BrokerConfig, ConfigError
from strom.metadata import records as r
from strom.metadata.storage import (
    BOOTSTRAP_CHECKPOINT,
    METADATA_PARTITION_DIR,
    StorageError,
    ensure_formatted,
    format_storage,
    kafka_uuid,
    parse_initial_controllers,
    read_bootstrap,
    read_meta,
)
from strom.raft.snapshots import read_snapshot

FEATURES = {"metadata.version": 25, "transaction.version": 2}


def test_format_writes_meta_properties_and_the_bootstrap_checkpoint(tmp_path):
    cluster = kafka_uuid()
    logs, meta_dir = [tmp_path / "a", tmp_path / "b"], tmp_path / "meta"
    with pytest.raises(StorageError, match="strom storage format"):
        ensure_formatted(logs, meta_dir, 1)
    lines = format_storage(cluster_id=cluster, node_id=1, log_dirs=logs, metadata_dir=meta_dir,
                           controller_listener="CONTROLLER", features=FEATURES)
    assert len(lines) == 3 and "metadata directory" in lines[-1]
    ids = set()
    for d in [*logs, meta_dir]:
        text = (d / "meta.properties").read_text()
        assert "version=1" in text and "node.id=1" in text and f"cluster.id={cluster}" in text
        ids.add(read_meta(d).directory_id)
        features, others = read_bootstrap(d)
        assert features == FEATURES and others == []
    assert len(ids) == 3  # a directory id of its own each
    first = read_snapshot((meta_dir / BOOTSTRAP_CHECKPOINT).read_bytes()).values[0]
    assert r.decode(first).name == "metadata.version"
    assert ensure_formatted(logs, meta_dir, 1).cluster_id == cluster
    with pytest.raises(StorageError, match="formatted for node 1"):
        ensure_formatted(logs, meta_dir, 2)
    with pytest.raises(StorageError, match="already formatted"):
        format_storage(cluster_id=cluster, node_id=1, log_dirs=logs, metadata_dir=meta_dir,
                       controller_listener="CONTROLLER", features=FEATURES)
    assert not (meta_dir / METADATA_PARTITION_DIR).exists()  # a static quorum: no voter snapshot


def test_initial_controllers_become_the_first_voter_set(tmp_path):
    dirs = [uuid.uuid4() for _ in range(3)]
    text = ",".join(f"{i}@127.0.0.1:{9090 + i}:{kafka_uuid(d)}" for i, d in zip((1, 2, 3), dirs, strict=True))
    controllers = parse_initial_controllers(text)
    format_storage(cluster_id=kafka_uuid(), node_id=2, log_dirs=[tmp_path], metadata_dir=tmp_path,
                   controller_listener="CONTROLLER", features=FEATURES, initial_controllers=controllers)
    assert read_meta(tmp_path).directory_id == kafka_uuid(dirs[1])  # this voter's formatted dir id
    snapshot = read_snapshot((tmp_path / METADATA_PARTITION_DIR / ("0" * 20 + "-" + "0" * 10 + ".checkpoint")).read_bytes())
    assert snapshot.kraft_version == 1
    assert [(v.voter_id, v.directory_id, v.endpoints[0].port) for v in snapshot.voters] == [
        (1, dirs[0], 9091), (2, dirs[1], 9092), (3, dirs[2], 9093)]
    for bad in ("1@host:9090", "x@h:1:" + kafka_uuid(), f"1@h:1:{kafka_uuid()},1@h:2:{kafka_uuid()}"):
        with pytest.raises(StorageError):
            parse_initial_controllers(bad)


@pytest.mark.parametrize(("props", "message"), [
    ({"process.roles": "broker,zk"}, "expected broker, controller"),
    ({"process.roles": "controller", "controller.quorum.voters": "1@h:1", "controller.listener.names": "CONTROLLER",
      "listeners": "CONTROLLER://:9093"}, "node.id is required"),
    ({"process.roles": "controller", "node.id": "1", "controller.quorum.voters": "1@h:1",
      "listeners": "CONTROLLER://:9093"}, "controller.listener.names is required"),
    ({"process.roles": "controller", "node.id": "1", "controller.listener.names": "CONTROLLER",
      "listeners": "CONTROLLER://:9093"}, "controller.quorum.voters or controller.quorum.bootstrap.servers"),
    ({"process.roles": "controller", "node.id": "1", "controller.quorum.voters": "1@h:1",
      "controller.listener.names": "CONTROLLER", "listeners": "PLAINTEXT://:9092"}, "must be one of listeners"),
    ({"process.roles": "controller", "node.id": "1", "controller.quorum.voters": "1@h:1",
      "controller.listener.names": "CONTROLLER", "listeners": "PLAINTEXT://:9092,CONTROLLER://:9093"},
     "may only have the listeners"),
    ({"process.roles": "broker", "node.id": "1", "controller.quorum.voters": "1@h:1",
      "controller.listener.names": "CONTROLLER", "listeners": "PLAINTEXT://:9092,CONTROLLER://:9093"},
     "must not listen on the controller listener"),
    ({"process.roles": "broker", "node.id": "1", "controller.quorum.voters": "1@h:1",
      "controller.listener.names": "CONTROLLER", "zookeeper.connect": "zk:2181"}, "zookeeper.connect cannot"),
])
def test_kraft_settings_are_checked_as_kafka_checks_them(props, message):
    with pytest.raises(ConfigError, match=message):
        BrokerConfig(props)


def test_a_combined_nodes_settings_pass():
    cfg = BrokerConfig({"process.roles": "controller,broker", "node.id": "3", "controller.listener.names": "CONTROLLER",
                        "controller.quorum.voters": "3@localhost:9093", "log.dirs": "/x,/y",
                        "listeners": "PLAINTEXT://:9092,CONTROLLER://:9093"})
    assert cfg.process_roles == ("broker", "controller") and cfg.inter_broker_listener == "PLAINTEXT"
    assert str(cfg.metadata_log_dir) == "/x"
