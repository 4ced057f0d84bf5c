"""Coordinators: the broker-side owners of consumer groups (`group`) and transactions.

A coordinator's state lives in an internal compacted topic; the coordinator for a key is the
leader of one partition of that topic. The partition is chosen exactly as Kafka chooses it
(`Utils.abs(key.hashCode()) % partitions` over Java's String.hashCode), so a client, a tool or a
Kafka broker reading the same `__consumer_offsets` agrees on where each group lives.
"""

from __future__ import annotations

import functools
import struct

GROUP_METADATA_TOPIC = "__consumer_offsets"
TRANSACTION_STATE_TOPIC = "__transaction_state"
SHARE_GROUP_STATE_TOPIC = "__share_group_state"

_INT_MIN = -(2**31)


def java_string_hash(text: str) -> int:
    """Java's String.hashCode: s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units, in int32."""
    data = text.encode("utf-16-be", "surrogatepass")
    h = 0
    for (unit,) in struct.iter_unpack(">H", data):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def java_abs(n: int) -> int:
    """Kafka's Utils.abs: like Math.abs, but Integer.MIN_VALUE maps to 0 rather than itself."""
    return 0 if n == _INT_MIN else abs(n)


@functools.lru_cache(maxsize=65536)  # asked on every group request; the answer never changes
def partition_for(key: str, num_partitions: int) -> int:
    """The internal-topic partition that owns `key` (a group id or a transactional id)."""
    return java_abs(java_string_hash(key)) % num_partitions
