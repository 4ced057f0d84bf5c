"""What `strom topics describe` shows of a tiered topic (KIP-405): each partition's local size
(DescribeLogDirs at its leader), its log start and local log start offsets (ListOffsets
EARLIEST and EARLIEST_LOCAL) and its remote size.

Kafka has no API that answers a partition's remote size, so it is read where brokers keep it:
`__remote_log_metadata`, fetched from its start to its end at each of its partition leaders,
each record applied to a RemoteLogMetadataCache of its user partition as a broker applies it;
a partition's remote size is the sum of its COPY_SEGMENT_FINISHED segments (a copy that a later
one of the same offsets replaced counted once), its deleted ones no longer listed."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from strom.cli.common import EARLIEST, LATEST, Cluster, CommandError, error_name
from strom.log.remote import (
    RemoteLogMetadataCache,
    RemoteLogMetadataStateError,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
)
from strom.log.remote.records import deserialize
from strom.protocol.errors import CorruptRecordError, ErrorCode
from strom.protocol.remote_log_metadata import RemoteLogMetadataError
from strom.remote.metadata_manager import TOPIC as METADATA_TOPIC
from strom.remote.metadata_manager import key_of

FETCH, DESCRIBE_LOG_DIRS = 1, 35
EARLIEST_LOCAL = -4  # ListOffsets v8 (KIP-405): a tiered log's first local offset
_FETCH_MAX_BYTES = 4 << 20


@dataclass
class TieredPartition:
    local_size: int = -1  # -1: not answered
    remote_size: int = 0
    remote_segments: int = 0
    log_start: int = -1
    local_log_start: int = -1

    def describe(self) -> str:
        return (f"\tLocalSize: {self.local_size}\tRemoteSize: {self.remote_size}"
                f"\tRemoteSegments: {self.remote_segments}\tLogStartOffset: {self.log_start}"
                f"\tLocalLogStartOffset: {self.local_log_start}")


def tiered_partitions(cluster: Cluster, topics: list) -> dict[tuple[str, int], TieredPartition]:
    """What describe shows of the partitions of `topics` (Metadata v12 topic entries)."""
    out = {(t.name, p.partition_index): TieredPartition() for t in topics for p in t.partitions}
    if not out:
        return out
    for tp, size in local_sizes(cluster, topics).items():
        if tp in out:
            out[tp].local_size = size
    for timestamp, attr in ((EARLIEST, "log_start"), (EARLIEST_LOCAL, "local_log_start")):
        for tp, listed in cluster.list_offsets(dict.fromkeys(out, timestamp), version=8).items():
            if listed.error_code == ErrorCode.NONE:
                setattr(out[tp], attr, listed.offset)
    ids = {t.topic_id: t.name for t in topics}
    for (topic_id, index), segments in remote_segments(cluster, set(ids)).items():
        tp = (ids[topic_id], index)
        if tp in out:
            out[tp].remote_size = sum(m.size_bytes for m in segments)
            out[tp].remote_segments = len(segments)
    return out


def local_sizes(cluster: Cluster, topics: list) -> dict[tuple[str, int], int]:
    """Each partition's size in its leader's log dir (DescribeLogDirs at the leader)."""
    by_leader: dict[int, dict[str, list[int]]] = {}
    for t in topics:
        for p in t.partitions:
            if p.leader_id in cluster.brokers:
                by_leader.setdefault(p.leader_id, {}).setdefault(t.name, []).append(p.partition_index)
    out: dict[tuple[str, int], int] = {}
    for leader, wanted in by_leader.items():
        body = cluster.broker(leader).call(DESCRIBE_LOG_DIRS, 4, {
            "topics": [{"topic": name, "partitions": ps} for name, ps in wanted.items()]})
        for d in body.results:
            if d.error_code != ErrorCode.NONE:
                continue
            for t in d.topics:
                for p in t.partitions:
                    if p.partition_index in wanted.get(t.name, ()) and not p.is_future_key:
                        out[(t.name, p.partition_index)] = p.partition_size
    return out


def remote_segments(cluster: Cluster, topic_ids: set[uuid.UUID]) -> dict[tuple[uuid.UUID, int],
                                                                           list[RemoteLogSegmentMetadata]]:
    """The segments in remote storage of each partition of the topics `topic_ids`, as
    `__remote_log_metadata` says now (no entry: none, or the topic is not there yet)."""
    meta = cluster.metadata([METADATA_TOPIC])
    topic = next((t for t in meta.topics if t.name == METADATA_TOPIC), None)
    if topic is None or topic.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        return {}
    if topic.error_code != ErrorCode.NONE:
        raise CommandError(f"cannot read {METADATA_TOPIC}: {error_name(topic.error_code)}")
    partitions = [(METADATA_TOPIC, p.partition_index) for p in topic.partitions]
    starts = cluster.list_offsets(dict.fromkeys(partitions, EARLIEST))
    ends = cluster.list_offsets(dict.fromkeys(partitions, LATEST))
    leaders = {p.partition_index: p.leader_id for p in topic.partitions}
    caches: dict[tuple[uuid.UUID, int], RemoteLogMetadataCache] = {}
    for tp in partitions:
        for listed in (starts[tp], ends[tp]):
            if listed.error_code != ErrorCode.NONE:
                raise CommandError(f"cannot read {tp[0]}-{tp[1]}: {error_name(listed.error_code)}")
        _read_partition(cluster, leaders[tp[1]], tp[1], starts[tp].offset, ends[tp].offset, topic_ids, caches)
    out = {}
    for key, cache in caches.items():
        finished: list[RemoteLogSegmentMetadata] = []
        for m in cache.all_segments():  # by start offset
            if m.state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED and \
                    not (finished and m.end_offset <= finished[-1].end_offset):
                finished.append(m)
        out[key] = finished
    return out


def _read_partition(cluster: Cluster, leader: int, index: int, position: int, end: int,
                    topic_ids: set[uuid.UUID], caches: dict) -> None:
    from strom.protocol.records import iter_records, scan_valid_prefix

    if leader not in cluster.brokers:
        raise CommandError(f"{METADATA_TOPIC}-{index} has no leader")
    conn = cluster.broker(leader)
    while position < end:
        body = conn.call(FETCH, 12, {
            "replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": _FETCH_MAX_BYTES,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": METADATA_TOPIC, "partitions": [{
                "partition": index, "current_leader_epoch": -1, "fetch_offset": position,
                "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": _FETCH_MAX_BYTES}]}],
            "forgotten_topics_data": [], "rack_id": ""})
        answer = next((p for t in body.responses for p in t.partitions if p.partition_index == index), None)
        error = body.error_code or (answer.error_code if answer is not None else ErrorCode.UNKNOWN_SERVER_ERROR)
        if error != ErrorCode.NONE:
            raise CommandError(f"cannot read {METADATA_TOPIC}-{index}: {error_name(error)}")
        data = answer.records or b""
        batches, _ = scan_valid_prefix(data)
        if not batches:
            raise CommandError(f"cannot read {METADATA_TOPIC}-{index} at offset {position}: no whole batch")
        for pos, header in batches:
            if not header.is_control and header.last_offset >= position:
                try:
                    records = list(iter_records(data, pos))
                except CorruptRecordError as e:
                    raise CommandError(f"{METADATA_TOPIC}-{index}: the batch at offset "
                                       f"{header.base_offset} does not decode: {e}") from None
                for record in records:
                    if record.offset >= position and record.value is not None:
                        _apply(record.value, topic_ids, caches)
            position = max(position, header.last_offset + 1)


def _apply(value: bytes, topic_ids: set[uuid.UUID], caches: dict) -> None:
    try:
        metadata = deserialize(value)
    except RemoteLogMetadataError:
        return  # the brokers skip it too
    topic_id, _, partition = key_of(metadata)
    if topic_id not in topic_ids:
        return
    try:
        caches.setdefault((topic_id, partition), RemoteLogMetadataCache()).apply(metadata)
    except RemoteLogMetadataStateError:
        pass  # refused by the brokers' caches as well
