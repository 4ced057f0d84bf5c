"""Which partition of `__remote_log_metadata` holds a user partition's records: Kafka's
RemoteLogMetadataTopicPartitioner, so that Strom and Kafka brokers sharing a cluster's metadata
topic read and write each partition's records in the same place.

Kafka hashes the topic id and partition with Java's Objects.hash(leastSignificantBits,
mostSignificantBits, partition) (not the Uuid's own hashCode, which it does not want to depend
on), writes that int as 4 big-endian bytes and takes toPositive(murmur2(bytes)) % partitions.
The topic's name plays no part."""

from __future__ import annotations

import uuid

_MASK32 = 0xFFFFFFFF
_MASK64 = 0xFFFFFFFFFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's Utils.murmur2 (seed 0x9747b28c), as the signed 32-bit int Java returns."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK32
    whole = length & ~3
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & _MASK32
        k ^= k >> r
        k = (k * m) & _MASK32
        h = (h * m) & _MASK32
        h ^= k
    rest = length & 3
    if rest:
        if rest == 3:
            h ^= data[whole + 2] << 16
        if rest >= 2:
            h ^= data[whole + 1] << 8
        h ^= data[whole]
        h = (h * m) & _MASK32
    h ^= h >> 13
    h = (h * m) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(n: int) -> int:
    """Kafka's Utils.toPositive: the int with its sign bit cleared (not its absolute value)."""
    return n & 0x7FFFFFFF


def _long_hash(bits: int) -> int:
    """Java's Long.hashCode of a 64-bit value, as an unsigned 32-bit int."""
    bits &= _MASK64
    return (bits ^ (bits >> 32)) & _MASK32


def topic_partition_hash(topic_id: uuid.UUID, partition: int) -> int:
    """Java's Objects.hash(topicId.leastSignificantBits, topicId.mostSignificantBits, partition),
    as the unsigned 32-bit int of its bits."""
    h = 1
    for part in (_long_hash(topic_id.int), _long_hash(topic_id.int >> 64), partition & _MASK32):
        h = (31 * h + part) & _MASK32
    return h


def metadata_partition(topic_id: uuid.UUID, partition: int, num_partitions: int) -> int:
    """The partition of `__remote_log_metadata` (of `num_partitions`) that holds the records of
    user partition `partition` of the topic with id `topic_id`."""
    if num_partitions <= 0:
        raise ValueError(f"the metadata topic has {num_partitions} partitions")
    key = topic_partition_hash(topic_id, partition).to_bytes(4, "big")
    return to_positive(murmur2(key)) % num_partitions
