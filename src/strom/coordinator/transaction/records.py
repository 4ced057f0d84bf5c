"""The records of `__transaction_state`, in Kafka's key and value schemas.

Key: version i16 (0), transactional id. Value v0 (what Kafka 3.x writes, and Strom too):
producer id i64, producer epoch i16, transaction timeout ms i32, status i8, the partitions in
the transaction (nullable array of topic + int32 array), last update ms i64, start ms i64.
v1 is the flexible form of the same fields (compact lengths, tagged fields), read only. A
null value is a tombstone: the transactional id expired.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from strom.coordinator.schema import Reader, RecordFormatError, Writer

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


def key(transactional_id: str) -> bytes:
    return bytes(Writer().int16(KEY_VERSION).string(transactional_id).buf)


def value(v: TransactionLogValue) -> bytes:
    w = Writer().int16(VALUE_VERSION).int64(v.producer_id).int16(v.producer_epoch)
    w.int32(v.timeout_ms).int8(v.state)
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(v.partitions):
        by_topic.setdefault(topic, []).append(partition)
    w.int32(len(by_topic))
    for topic, partitions in by_topic.items():
        w.string(topic).int32(len(partitions))
        for p in partitions:
            w.int32(p)
    w.int64(v.last_update_ms).int64(v.start_ms)
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
    r.tagged_fields()
    return TransactionLogValue(producer_id, epoch, timeout, state, partitions, last_update, start)
