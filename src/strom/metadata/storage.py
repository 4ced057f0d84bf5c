"""A KRaft node's storage, formatted before its first start as Kafka 4's `kafka-storage format`
formats it (`strom storage format`):

- `meta.properties` version 1 in every log dir and in metadata.log.dir: node.id, cluster.id and
  a directory.id of its own;
- `bootstrap.checkpoint` in each of them: the feature levels a new cluster starts with
  (FeatureLevelRecords, metadata.version first), which the first active controller writes to
  the metadata log;
- with a dynamic quorum (KIP-853: --standalone or --initial-controllers), the snapshot
  `__cluster_metadata-0/00000000000000000000-0000000000.checkpoint` holding the first voter set
  (KRaftVersion 1 and Voters control records).

A node whose directories are not formatted (or formatted for another node or cluster) refuses
to start with one line that says what to run.
"""

from __future__ import annotations

import base64
import os
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from strom.log.manager import read_properties, write_properties
from strom.metadata import records as r
from strom.protocol.raft_records import Endpoint, VoterEntry
from strom.raft.config import METADATA_PARTITION, METADATA_TOPIC
from strom.raft.log import OffsetAndEpoch
from strom.raft.snapshots import build_snapshot, filename, read_snapshot

META_PROPERTIES = "meta.properties"
BOOTSTRAP_CHECKPOINT = "bootstrap.checkpoint"
METADATA_PARTITION_DIR = f"{METADATA_TOPIC}-{METADATA_PARTITION}"
BOOTSTRAP_SNAPSHOT_ID = OffsetAndEpoch(0, 0)
FORMAT_COMMAND = "strom storage format --cluster-id <id> --config <server.properties>"


class StorageError(ValueError):
    """A directory is not formatted, or not for this node: one line saying what to do."""


def kafka_uuid(u: uuid.UUID | None = None) -> str:
    """Kafka's Uuid text: url-safe base64 of the 16 bytes, unpadded; never starting with '-'
    (it would read as a command-line flag), as Kafka's Uuid.randomUuid avoids."""
    while True:
        text = base64.urlsafe_b64encode((u or uuid.uuid4()).bytes).rstrip(b"=").decode()
        if not text.startswith("-") or u is not None:
            return text


def parse_kafka_uuid(text: str) -> uuid.UUID:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        raw = b""
    if len(raw) != 16:
        raise StorageError(f"{text!r} is not a Kafka uuid (22 characters of url-safe base64)")
    return uuid.UUID(bytes=raw)


@dataclass(frozen=True)
class MetaProperties:
    node_id: int
    cluster_id: str
    directory_id: str

    def as_props(self) -> dict[str, str]:
        return {"node.id": str(self.node_id), "directory.id": self.directory_id, "version": "1",
                "cluster.id": self.cluster_id}


@dataclass(frozen=True)
class InitialController:
    node_id: int
    host: str
    port: int
    directory_id: uuid.UUID


_CONTROLLER = re.compile(r"^(\d+)@(\[[^\]]+\]|[^:]+):(\d+):([A-Za-z0-9_-]{22})$")


def parse_initial_controllers(text: str) -> list[InitialController]:
    """--initial-controllers: `id@host:port:directoryId`, comma-separated (Kafka's format)."""
    out = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        m = _CONTROLLER.match(item)
        if not m:
            raise StorageError(f"--initial-controllers entry {item!r} is not id@host:port:directoryId")
        out.append(InitialController(int(m[1]), m[2].strip("[]"), int(m[3]), parse_kafka_uuid(m[4])))
    if not out:
        raise StorageError("--initial-controllers names no controller")
    if len({c.node_id for c in out}) != len(out):
        raise StorageError("--initial-controllers names a controller twice")
    return out


def storage_dirs(log_dirs: Iterable[Path], metadata_dir: Path) -> list[Path]:
    out: list[Path] = []
    for d in [*log_dirs, metadata_dir]:
        if Path(d) not in out:
            out.append(Path(d))
    return out


def read_meta(directory: Path) -> MetaProperties | None:
    path = Path(directory) / META_PROPERTIES
    if not path.exists():
        return None
    props = read_properties(path)
    if props.get("version") != "1" or "node.id" not in props or "cluster.id" not in props:
        raise StorageError(f"{path} is not a KRaft meta.properties (version 1 with node.id and cluster.id): "
                           f"this directory belongs to a ZooKeeper-mode broker or an older format")
    return MetaProperties(int(props["node.id"]), props["cluster.id"], props.get("directory.id", ""))


def format_storage(*, cluster_id: str, node_id: int, log_dirs: list[Path], metadata_dir: Path,
                   controller_listener: str | None, features: Mapping[str, int],
                   initial_controllers: list[InitialController] | None = None,
                   extra_records: list | None = None, ignore_formatted: bool = False) -> list[str]:
    """Format every directory not formatted yet; returns the lines to print. StorageError when a
    directory is formatted already (unless `ignore_formatted`) or for another cluster or node."""
    parse_kafka_uuid(cluster_id)
    lines: list[str] = []
    dirs = storage_dirs(log_dirs, metadata_dir)
    todo = []
    for d in dirs:
        meta = read_meta(d)
        if meta is None:
            todo.append(d)
            continue
        if meta.cluster_id != cluster_id or meta.node_id != node_id:
            raise StorageError(f"log directory {d} is formatted for node {meta.node_id} of cluster "
                               f"{meta.cluster_id}, not node {node_id} of cluster {cluster_id}")
        if not ignore_formatted:
            raise StorageError(f"log directory {d} is already formatted. Use --ignore-formatted to ignore "
                               "this directory and format the others.")
    if not todo:
        return ["All of the log directories are already formatted."]
    voter_dir = None
    if initial_controllers is not None:
        voter_dir = next((c.directory_id for c in initial_controllers if c.node_id == node_id), None)
    bootstrap = build_snapshot(BOOTSTRAP_SNAPSHOT_ID, bootstrap_values(features, extra_records or []),
                               kraft_version=0, voters=None, last_contained_timestamp=0)
    for d in todo:
        d.mkdir(parents=True, exist_ok=True)
        is_metadata = d == Path(metadata_dir)
        directory_id = voter_dir if is_metadata and voter_dir is not None else uuid.uuid4()
        kind = "metadata directory" if is_metadata else "log directory"
        if is_metadata and initial_controllers is not None:
            kind = "dynamic metadata voter directory" if voter_dir is not None else "dynamic metadata directory"
        lines.append(f"Formatting {kind} {d} with metadata.version {features.get('metadata.version', 0)}.")
        _write_durably(d / BOOTSTRAP_CHECKPOINT, bootstrap)
        if is_metadata and initial_controllers is not None:
            _write_voters_snapshot(d, initial_controllers, controller_listener or "CONTROLLER")
        write_properties(d / META_PROPERTIES, MetaProperties(node_id, cluster_id, kafka_uuid(directory_id)).as_props())
    return lines


def bootstrap_values(features: Mapping[str, int], extra_records: list) -> list[bytes]:
    names = sorted(features, key=lambda n: (n != "metadata.version", n))
    records = [r.FeatureLevelRecord(name=n, feature_level=features[n]) for n in names if features[n] > 0]
    return [r.encode(x) for x in [*records, *extra_records]]


def _write_voters_snapshot(metadata_dir: Path, controllers: list[InitialController], listener: str) -> None:
    partition = metadata_dir / METADATA_PARTITION_DIR
    partition.mkdir(parents=True, exist_ok=True)
    voters = [VoterEntry(c.node_id, c.directory_id, (Endpoint(listener, c.host, c.port),)) for c in controllers]
    data = build_snapshot(BOOTSTRAP_SNAPSHOT_ID, [], kraft_version=1, voters=voters,
                          last_contained_timestamp=0)
    _write_durably(partition / filename(BOOTSTRAP_SNAPSHOT_ID), data)


def _write_durably(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_formatted(log_dirs: list[Path], metadata_dir: Path, node_id: int) -> MetaProperties:
    """The metadata dir's meta.properties, once every directory was checked: formatted (version
    1), for this node, and all for one cluster. StorageError naming the command otherwise."""
    found: dict[Path, MetaProperties] = {}
    for d in storage_dirs(log_dirs, metadata_dir):
        meta = read_meta(d)
        if meta is None:
            raise StorageError(f"no meta.properties in {d}: format it first ({FORMAT_COMMAND})")
        if meta.node_id != node_id:
            raise StorageError(f"{d} is formatted for node {meta.node_id}, but node.id is {node_id}")
        found[d] = meta
    clusters = {m.cluster_id for m in found.values()}
    if len(clusters) > 1:
        raise StorageError(f"the log directories belong to different clusters: {sorted(clusters)}")
    return found[Path(metadata_dir)]


def read_bootstrap(metadata_dir: Path) -> tuple[dict[str, int], list]:
    """The feature levels and other records of bootstrap.checkpoint (empty when there is none)."""
    path = Path(metadata_dir) / BOOTSTRAP_CHECKPOINT
    if not path.exists():
        return {}, []
    features, others = {}, []
    for value in read_snapshot(path.read_bytes()).values:
        rec = r.decode(value)
        if isinstance(rec, r.FeatureLevelRecord):
            features[rec.name] = rec.feature_level
        else:
            others.append(rec)
    return features, others
