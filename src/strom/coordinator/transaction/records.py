"""The records of `__transaction_state`, in Kafka's key and value schemas.

Key: version i16 (0), transactional id. Value v0 (what Kafka 3.x writes): producer id i64,
producer epoch i16, transaction timeout ms i32, status i8, the partitions in the transaction
(nullable array of topic + int32 array), last update ms i64, start ms i64. v1 is the flexible
form of the same fields plus three tagged ones (0: previous producer id, 1: next producer id,
2: the client's transaction version); Strom writes it, as Kafka 4.0 does, for transactions of
version 1 and up, so that a coordinator taking over knows which rules a transaction follows.
A null value is a tombstone: the transactional id expired.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from strom.protocol.record_schema import Reader, RecordFormatError, Writer

KEY_VERSION = 0
VALUE_VERSION = 0

TopicPartition = tuple[str, int]


class TxnState(enum.IntEnum):
    """Kafka's transaction states, numbered as the status byte of the log value."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def display(self) -> str:
        """The name Kafka's admin APIs use (DescribeTransactions, ListTransactions)."""
        return "".join(part.capitalize() for part in self.name.split("_"))


@dataclass(slots=True)
class TransactionLogValue:
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: set[TopicPartition] = field(default_factory=set)
    last_update_ms: int = -1
    start_ms: int = -1
    previous_producer_id: int = -1
    next_producer_id: int = -1
    client_transaction_version: int = 0


def key(transactional_id: str) -> bytes:
    return bytes(Writer().int16(KEY_VERSION).string(transactional_id).buf)


def _int64_tag(n: int) -> bytes:
    return n.to_bytes(8, "big", signed=True)


def value(v: TransactionLogValue) -> bytes:
    flexible = v.client_transaction_version >= 1
    w = Writer(flexible).int16(1 if flexible else VALUE_VERSION).int64(v.producer_id).int16(v.producer_epoch)
    w.int32(v.timeout_ms).int8(v.state)
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(v.partitions):
        by_topic.setdefault(topic, []).append(partition)
    w.array_length(len(by_topic))
    for topic, partitions in by_topic.items():
        w.string(topic).array_length(len(partitions))
        for p in partitions:
            w.int32(p)
        if flexible:
            w.tagged_fields()
    w.int64(v.last_update_ms).int64(v.start_ms)
    if flexible:
        tags = {2: v.client_transaction_version.to_bytes(2, "big", signed=True)}
        if v.previous_producer_id >= 0:
            tags[0] = _int64_tag(v.previous_producer_id)
        if v.next_producer_id >= 0:
            tags[1] = _int64_tag(v.next_producer_id)
        w.tagged_fields(tags)
    return bytes(w.buf)


def read_key(data: bytes) -> str:
    r = Reader(data)
    version = r.int16()
    if version != KEY_VERSION:
        raise RecordFormatError(f"unknown transaction log key version {version}")
    transactional_id = r.string()
    if transactional_id is None:
        raise RecordFormatError("transaction log key without a transactional id")
    return transactional_id


def read_value(data: bytes) -> TransactionLogValue:
    r = Reader(data)
    version = r.int16()
    if version not in (0, 1):
        raise RecordFormatError(f"unknown transaction log value version {version}")
    r.flexible = version >= 1
    producer_id, epoch, timeout = r.int64(), r.int16(), r.int32()
    try:
        state = TxnState(r.int8())
    except ValueError as e:
        raise RecordFormatError(str(e)) from None
    partitions: set[TopicPartition] = set()
    for _ in range(max(r.array_length(), 0)):
        topic = r.string() or ""
        for _ in range(max(r.array_length(), 0)):
            partitions.add((topic, r.int32()))
        r.tagged_fields()
    last_update, start = r.int64(), r.int64()
    tags = r.tagged_fields()

    def tag(number: int, size: int, default: int) -> int:
        raw = tags.get(number)
        if raw is None:
            return default
        if len(raw) != size:
            raise RecordFormatError(f"tagged field {number} has {len(raw)} bytes, not {size}")
        return int.from_bytes(raw, "big", signed=True)

    return TransactionLogValue(producer_id, epoch, timeout, state, partitions, last_update, start,
                               previous_producer_id=tag(0, 8, -1), next_producer_id=tag(1, 8, -1),
                               client_transaction_version=tag(2, 2, 0))
