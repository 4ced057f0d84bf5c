"""What the KRaft process tests share: a client that speaks to controllers as a Kafka 4 broker
does (BrokerRegistration, BrokerHeartbeat, and admin requests sent to the active controller),
and a reader of a controller's metadata log files, replayed into a MetadataImage."""

from __future__ import annotations

import uuid
from pathlib import Path

from strom.client import Connection
from strom.metadata import records as r
from strom.metadata.image import MetadataImage
from strom.metadata.storage import METADATA_PARTITION_DIR
from strom.protocol.raft_records import data_values
from strom.raft.log import split_batches
from strom.raft.snapshots import parse_filename, read_snapshot
from strom.testing import KRaftQuorum, wait_for

NOT_CONTROLLER = 41
CREATE_TOPICS, BROKER_REGISTRATION, BROKER_HEARTBEAT = 19, 62, 63


def call_active(quorum: KRaftQuorum, api_key: int, version: int, fields: dict, timeout: float = 30.0):
    """Send to the active controller, following NOT_CONTROLLER to the new one."""
    def attempt():
        leader = quorum.leader(timeout)
        try:
            with Connection("127.0.0.1", quorum.ports[leader], timeout_s=10) as conn:
                body = conn.call(api_key, version, fields)
        except (OSError, ConnectionError):
            return None
        if getattr(body, "error_code", 0) == NOT_CONTROLLER or any(
                getattr(t, "error_code", 0) == NOT_CONTROLLER for t in getattr(body, "topics", None) or ()):
            return None  # not active (yet, or any more): ask again who is
        return body

    return wait_for(attempt, timeout, interval=0.1, what=f"an answer to api {api_key} from the active controller")


def register_brokers(quorum: KRaftQuorum, ids: list[int]) -> dict[int, int]:
    """Register brokers `ids` with the quorum and heartbeat each until it is unfenced: their
    epochs. (Nothing else of a broker: these ids only hold replicas in the metadata.)"""
    epochs = {}
    for b in ids:
        body = call_active(quorum, BROKER_REGISTRATION, 4, {
            "broker_id": b, "cluster_id": quorum.cluster_id, "incarnation_id": uuid.uuid4(),
            "listeners": [{"name": "PLAINTEXT", "host": "127.0.0.1", "port": 19000 + b, "security_protocol": 0}],
            "features": [{"name": "metadata.version", "min_supported_version": 7, "max_supported_version": 25}],
            "rack": None, "is_migrating_zk_broker": False, "log_dirs": [uuid.uuid4()], "previous_broker_epoch": -1})
        assert body.error_code == 0, body
        epochs[b] = body.broker_epoch
    for b, epoch in epochs.items():
        def unfenced(b=b, epoch=epoch):
            body = call_active(quorum, BROKER_HEARTBEAT, 1, {
                "broker_id": b, "broker_epoch": epoch, "current_metadata_offset": 1 << 40,
                "want_fence": False, "want_shut_down": False, "offline_log_dirs": []})
            assert body.error_code == 0, body
            return not body.is_fenced
        wait_for(unfenced, 30, interval=0.1, what=f"broker {b} unfenced")
    return epochs


def create_topics(quorum: KRaftQuorum, topics: list[tuple[str, int, int, dict]]) -> list:
    body = call_active(quorum, CREATE_TOPICS, 7, {"timeout_ms": 30000, "validate_only": False, "topics": [
        {"name": n, "num_partitions": p, "replication_factor": rf, "assignments": [],
         "configs": [{"name": k, "value": v} for k, v in cfg.items()]} for n, p, rf, cfg in topics]})
    return body.topics


def metadata_dir(quorum: KRaftQuorum, node_id: int) -> Path:
    return quorum.nodes[node_id].data_dir / "logs" / METADATA_PARTITION_DIR


def read_log(directory: Path) -> tuple[int, bytes | None, list]:
    """What a controller's metadata partition holds, read without touching it: the latest
    snapshot's end offset and bytes, and every whole batch of its segments."""
    snapshots = sorted(s for p in directory.glob("*.checkpoint") if (s := parse_filename(p.name)) is not None)
    snap = snapshots[-1] if snapshots else None
    batches = []
    for seg in sorted(directory.glob("*.log")):
        batches += split_batches(seg.read_bytes())
    data = (directory / f"{snap.offset:020d}-{snap.epoch:010d}.checkpoint").read_bytes() if snap else None
    return (snap.offset if snap else 0), data, batches


def replay(directory: Path, up_to: int) -> MetadataImage:
    """The image a controller replays from its files, up to offset `up_to` (exclusive)."""
    start, snapshot, batches = read_log(directory)
    image = MetadataImage()
    if snapshot is not None:
        image.replay_values(read_snapshot(snapshot).values)
    for b in batches:
        if b.base_offset >= start and b.end_offset <= up_to and not b.is_control:
            image.replay_values(data_values(b.data))
    image.end_offset = up_to
    return image


def image_state(image: MetadataImage) -> tuple:
    return (image.features, image.brokers, {n: (t.topic_id, t.partitions) for n, t in image.topics.items()},
            image.configs)


def log_end(quorum: KRaftQuorum, node_id: int) -> int:
    d = quorum.describe()
    for v in (d or {}).get("current_voters", []) + (d or {}).get("observers", []):
        if v["replica_id"] == node_id:
            return v["log_end_offset"]
    return -1


def wait_caught_up(quorum: KRaftQuorum, nodes, timeout: float = 60.0) -> int:
    """Until every node in `nodes` has fetched up to the leader's high watermark: that offset."""
    def caught_up():
        d = quorum.describe()
        if d is None:
            return None
        ends = {v["replica_id"]: v["log_end_offset"] for v in d["current_voters"] + d["observers"]}
        hw = d["high_watermark"]
        return hw if all(ends.get(n, -1) >= hw for n in nodes) else None

    return wait_for(caught_up, timeout, what=f"controllers {list(nodes)} caught up")


def topic_names_in(directory: Path) -> set[str]:
    """Every topic name a TopicRecord in the node's segment files names (committed or not)."""
    _, _, batches = read_log(directory)
    names = set()
    for b in batches:
        if not b.is_control:
            for value in data_values(b.data):
                rec = r.decode(value)
                if isinstance(rec, r.TopicRecord):
                    names.add(rec.name)
    return names
