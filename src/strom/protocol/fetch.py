"""Fetch responses laid out by hand, so record bytes can go out with sendfile.

Every other response is encoded by the codec tables; Fetch is the one hot path where the
records must not pass through Python. `encode_fetch_response` returns a list of parts: bytes
the broker writes as they are, and the caller's region objects (anything with a `size`)
that it sends from the segment file. Layout per Kafka's FetchResponse v4-v17 schema: topic
names up to v12, topic ids from v13 (KIP-516); from v16 a partition that moved may carry its
current leader, and the response the endpoints of those leaders (KIP-951).
"""

from __future__ import annotations

import dataclasses
import struct
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from strom.protocol.varint import write_uvarint

_I16, _I32 = struct.Struct(">h"), struct.Struct(">i")
_PARTITION_HEAD = struct.Struct(">ihqqq")  # index, error, high watermark, last stable, log start
_ABORTED = struct.Struct(">qq")  # producer id, first offset
# Partition tagged fields: DivergingEpoch (tag 0: epoch, end offset, no tags; 13 bytes) and
# CurrentLeader (tag 1: leader id, leader epoch, no tags; 9 bytes).
_DIVERGING = struct.Struct(">BBiqB")
_CURRENT_LEADER = struct.Struct(">BBiiB")
FLEXIBLE_FROM, TOPIC_IDS_FROM, LEADER_DISCOVERY_FROM, MAX_VERSION = 12, 13, 16, 18


# --- the request, as the compiled parser makes it (_requests.c) ------------------------------
# The same fields, names and defaults as the codec's objects (a field a version lacks holds the
# schema's default), so handlers read either alike; the codec parses what the compiled parser
# leaves to it (unknown tagged fields, malformed requests, which it names).

@dataclass(slots=True)
class FetchPartition:
    partition: int
    current_leader_epoch: int  # v9+, else -1
    fetch_offset: int
    last_fetched_epoch: int  # v12+, else -1
    log_start_offset: int  # v5+, else -1
    partition_max_bytes: int
    replica_directory_id: uuid.UUID | None  # v17+, tagged
    high_watermark: int  # v18+, tagged; (1 << 63) - 1: not sent


@dataclass(slots=True)
class FetchTopic:
    topic: str  # up to v12; "" from v13
    topic_id: uuid.UUID | None  # v13+
    partitions: list[FetchPartition]


@dataclass(slots=True)
class ForgottenTopic:
    topic: str
    topic_id: uuid.UUID | None
    partitions: list[int]


@dataclass(slots=True)
class ReplicaState:  # v15+ (KIP-903), tagged
    replica_id: int
    replica_epoch: int


@dataclass(slots=True)
class FetchRequest:
    cluster_id: str | None  # v12+, tagged
    replica_id: int  # up to v14, else -1
    replica_state: ReplicaState | None
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int
    session_id: int  # v7+, else 0
    session_epoch: int  # v7+, else -1
    topics: list[FetchTopic]
    forgotten_topics_data: list[ForgottenTopic]  # v7+, else empty
    rack_id: str  # v11+, else ""

    def to_dict(self, json: bool = False) -> dict[str, Any]:
        """Plain dicts of the fields, as the codec's objects give them (the Raft core reads
        those)."""
        return dataclasses.asdict(self)


def fetch_replica_id(request: Any) -> int:
    """The replica a Fetch request comes from: >= 0 a follower replicating (in ReplicaState from
    v15, KIP-903), -1 a consumer."""
    state = getattr(request, "replica_state", None)
    if state is not None and getattr(state, "replica_id", -1) >= 0:
        return state.replica_id
    rid = getattr(request, "replica_id", -1)
    return -1 if rid is None else rid


@dataclass(slots=True)
class PartitionData:
    index: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    records: Any = None  # a region with .size, or None for an empty record set
    # (producer id, first offset) of aborted transactions, for read_committed; None -> null
    aborted_transactions: Sequence[tuple[int, int]] | None = None
    # (epoch, end offset) where a follower's log diverges from the leader's (KIP-320, v12)
    diverging_epoch: tuple[int, int] | None = None
    # (leader id, leader epoch) for a client that fetched from the wrong broker (KIP-951, v16)
    current_leader: tuple[int, int] | None = None
    # the replica a consumer should fetch from instead (KIP-392, v11); -1: none
    preferred_read_replica: int = -1


def _array_len(n: int, flexible: bool) -> bytes:
    return write_uvarint(n + 1) if flexible else _I32.pack(n)


def _string(s: str, flexible: bool) -> bytes:
    b = s.encode()
    return (write_uvarint(len(b) + 1) if flexible else _I16.pack(len(b))) + b


def _partition_tags(p: PartitionData, version: int) -> bytes:
    if p.diverging_epoch is None and p.current_leader is None:
        return b"\x00"  # the usual: no tagged field
    fields = []
    if p.diverging_epoch is not None:
        fields.append(_DIVERGING.pack(0, 13, p.diverging_epoch[0], p.diverging_epoch[1], 0))
    if p.current_leader is not None and version >= LEADER_DISCOVERY_FROM:
        fields.append(_CURRENT_LEADER.pack(1, 9, p.current_leader[0], p.current_leader[1], 0))
    return write_uvarint(len(fields)) + b"".join(fields)


def _node_endpoints(endpoints: Sequence[tuple[int, str, int, str | None]]) -> bytes:
    """The response's tagged field 0 (v16+): the nodes named by partitions' current leaders."""
    body = bytearray(write_uvarint(len(endpoints) + 1))
    for node_id, host, port, rack in endpoints:
        body += _I32.pack(node_id) + _string(host, True) + _I32.pack(port)
        body += b"\x00" if rack is None else _string(rack, True)
        body += b"\x00"
    return b"\x01" + write_uvarint(0) + write_uvarint(len(body)) + bytes(body)


def encode_fetch_response(
    version: int,
    topics: Sequence[tuple[str, Sequence[PartitionData]]],
    *,
    throttle_time_ms: int = 0,
    error_code: int = 0,
    session_id: int = 0,
    topic_ids: Mapping[str, uuid.UUID] | None = None,
    node_endpoints: Sequence[tuple[int, str, int, str | None]] = (),
) -> tuple[list[Any], int]:
    """(parts, total size in bytes) of a FetchResponse body of `version` (4..17). From v13 each
    topic goes out as its id from `topic_ids`; from v16 `node_endpoints` (node id, host, port,
    rack) are the leaders that partitions' `current_leader` name."""
    if not 4 <= version <= MAX_VERSION:
        raise ValueError(f"hand-written Fetch response supports v4-v{MAX_VERSION}, not v{version}")
    flexible = version >= FLEXIBLE_FROM
    tags = b"\x00" if flexible else b""
    parts: list[Any] = []
    head = bytearray(_I32.pack(throttle_time_ms))
    if version >= 7:
        head += _I16.pack(error_code) + _I32.pack(session_id)
    head += _array_len(len(topics), flexible)
    size = 0
    for name, partitions in topics:
        if version >= TOPIC_IDS_FROM:
            head += (topic_ids or {})[name].bytes
        else:
            head += _string(name, flexible)
        head += _array_len(len(partitions), flexible)
        for p in partitions:
            head += _PARTITION_HEAD.pack(p.index, p.error_code, p.high_watermark,
                                         p.last_stable_offset, p.log_start_offset)[
                : 22 if version < 5 else None]  # log_start_offset arrives in v5
            aborted = p.aborted_transactions
            if aborted is None:
                head += b"\x00" if flexible else _I32.pack(-1)
            else:
                head += _array_len(len(aborted), flexible)
                for producer_id, first_offset in aborted:
                    head += _ABORTED.pack(producer_id, first_offset) + tags
            if version >= 11:
                head += _I32.pack(p.preferred_read_replica)
            n = 0 if p.records is None else p.records.size
            head += write_uvarint(n + 1) if flexible else _I32.pack(n)
            if n:
                parts.append(bytes(head))
                size += len(head) + n
                parts.append(p.records)
                head = bytearray()
            if flexible:
                head += _partition_tags(p, version)
        head += tags  # topic
    if version >= LEADER_DISCOVERY_FROM and node_endpoints:
        head += _node_endpoints(node_endpoints)
    else:
        head += tags  # response
    parts.append(bytes(head))
    size += len(head)
    return parts, size
