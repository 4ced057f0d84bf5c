"""Replica selectors (KIP-392): which replica a consumer should fetch from.

A leader asked by a consumer that says where it is (Fetch v11+, `rack_id`) may name a follower
as the partition's preferred read replica; the consumer then fetches from that follower, up to
the follower's high watermark, until its metadata refresh or an error sends it back. The
selector decides, given the replicas that could serve the consumer's fetch offset: the ISR
members whose log covers it, and the leader, always among them.

`replica.selector.class` names the selector: unset (Kafka's default) means none, every
consumer reads from the leader. Kafka's class name of its rack-aware selector, or this module's
`RackAwareReplicaSelector`, picks the one below; any other value is a Python class
`package.module.Class` whose instances have a `select` method like it.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

KAFKA_RACK_AWARE = "org.apache.kafka.common.replica.RackAwareReplicaSelector"
RACK_AWARE = f"{__name__}.RackAwareReplicaSelector"


@dataclass(frozen=True, slots=True)
class ClientMetadata:
    """What a consumer's Fetch tells of it (Kafka's ClientMetadata)."""

    rack_id: str
    client_id: str
    client_address: str
    listener: str


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """One replica as the leader sees it (Kafka's ReplicaView): the leader's own log end, or
    what a follower's last fetch said, and how long ago it last had all the leader had."""

    broker_id: int
    rack: str | None
    log_end_offset: int
    time_since_last_caught_up_ms: int


class ReplicaSelector(Protocol):
    def select(self, topic: str, partition: int, client: ClientMetadata, leader: ReplicaView,
               replicas: Sequence[ReplicaView]) -> ReplicaView | None:
        """The replica the client should read from (the leader, or one of `replicas`, which
        include it), or None for no preference."""


class RackAwareReplicaSelector:
    """Kafka's rack-aware rule: the leader if it shares the client's rack, or the client names
    none, or no replica is in its rack; otherwise the most caught-up replica of its rack (the
    largest log end, then the most recently caught up)."""

    def select(self, topic: str, partition: int, client: ClientMetadata, leader: ReplicaView,
               replicas: Sequence[ReplicaView]) -> ReplicaView | None:
        rack = client.rack_id
        if not rack or leader.rack == rack:
            return leader
        same_rack = [r for r in replicas if r.rack == rack]
        if not same_rack:
            return leader
        return max(same_rack, key=lambda r: (r.log_end_offset, -r.time_since_last_caught_up_ms))


@functools.cache
def replica_selector(name: str | None) -> ReplicaSelector | None:
    """The selector `replica.selector.class` names, made once per name (None: no selector)."""
    if name is None or not name.strip():
        return None
    name = name.strip()
    if name in (KAFKA_RACK_AWARE, RACK_AWARE):
        return RackAwareReplicaSelector()
    module_name, _, class_name = name.rpartition(".")
    if not module_name:
        raise ValueError(f"{name!r} is not a class name (package.module.Class)")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot load replica selector {name!r}: {e}") from e
    selector = cls()
    if not callable(getattr(selector, "select", None)):
        raise ValueError(f"{name!r} has no select method")
    return selector


@dataclass(frozen=True, slots=True)
class ReadPreference:
    """What a leader needs to name a preferred read replica for one consumer Fetch: who asks,
    the selector, and the racks of the live brokers the consumer can reach on its listener
    (a replica on no such broker is never named)."""

    client: ClientMetadata
    selector: ReplicaSelector
    racks: dict[int, str | None]
