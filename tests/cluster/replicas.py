"""Is every replica back? What a cluster test checks once its faults are over: every partition of
every topic, internal ones included, has its whole replica set in sync, and every live replica's
log ends where its leader's does (read from the replicas' own segment files)."""

from __future__ import annotations

from pathlib import Path

from strom.protocol.records import HEADER_SIZE, LOG_OVERHEAD, read_header
from strom.testing import Cluster, wait_for

from .test_cluster import live_brokers, log_dir, metadata


def replica_log_end(broker, topic: str, partition: int) -> int:
    """The log end offset of `broker`'s replica, from its newest segment file: past its last
    whole batch, or the segment's base offset when it holds none (0: no files yet)."""
    directory = log_dir(broker) / f"{topic}-{partition}"
    segments = sorted(directory.glob("*.log"), key=lambda p: int(p.stem)) if directory.is_dir() else []
    for segment in reversed(segments):
        end = _end_of_batches(segment)
        if end is not None or segment is segments[0]:
            return int(segment.stem) if end is None else end
    return 0


def _end_of_batches(segment: Path) -> int | None:
    data, pos, end = segment.read_bytes(), 0, None
    while len(data) - pos >= HEADER_SIZE:
        header = read_header(data, pos)
        if header.batch_length < HEADER_SIZE - LOG_OVERHEAD or pos + header.size > len(data):
            break  # the end of what was written (or a write still under way)
        end, pos = header.last_offset + 1, pos + header.size
    return end


def replication_gaps(cluster: Cluster) -> list[str]:
    """Every partition, as the first live broker answers Metadata for all topics, whose ISR is
    short of its replicas, or one of whose live replicas' log ends elsewhere than its leader's."""
    live = {b.port: b for b in live_brokers(cluster)}
    by_id = {i: b for i, b in cluster.brokers.items() if b.port in live}
    gaps = []
    for t in metadata(next(iter(live.values()))).topics:
        for p in t.partitions:
            name = f"{t.name}-{p.partition_index}"
            if sorted(p.isr_nodes) != sorted(p.replica_nodes):
                gaps.append(f"{name}: replicas {list(p.replica_nodes)}, ISR {list(p.isr_nodes)}")
                continue
            if p.leader_id not in by_id:
                gaps.append(f"{name}: leader {p.leader_id}")
                continue
            ends = {r: replica_log_end(by_id[r], t.name, p.partition_index) for r in p.replica_nodes if r in by_id}
            if len(set(ends.values())) > 1:
                gaps.append(f"{name}: log ends {ends} (leader {p.leader_id})")
    return gaps


def wait_fully_replicated(cluster: Cluster, timeout: float) -> None:
    """Until every partition is whole again (see replication_gaps), else fail naming those
    that are not."""
    last: list[list[str]] = [[]]

    def whole() -> bool:
        last[0] = replication_gaps(cluster)
        return not last[0]

    try:
        wait_for(whole, timeout, interval=0.5, what="every replica in sync")
    except (AssertionError, TimeoutError) as e:
        raise AssertionError(f"not fully replicated after {timeout} s: {last[0][:10]}") from e
