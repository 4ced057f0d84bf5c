"""GroupConfig: the broker configs the group coordinator reads, under Kafka's names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CLASSIC, CONSUMER = "classic", "consumer"


@dataclass(frozen=True, slots=True)
class GroupConfig:
    min_session_timeout_ms: int = 6000  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1800000  # group.max.session.timeout.ms
    initial_rebalance_delay_ms: int = 3000  # group.initial.rebalance.delay.ms
    max_size: int = 2**31 - 1  # group.max.size
    offset_metadata_max_bytes: int = 4096  # offset.metadata.max.bytes
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000  # offsets.retention.minutes
    # Kafka's GroupCoordinator.NewMemberJoinTimeoutMs: how long a member that has never been
    # part of a generation may wait in a rebalance before it is dropped.
    new_member_join_timeout_ms: int = 5 * 60 * 1000
    # KIP-848 consumer groups (group.consumer.*) and which protocols are enabled.
    consumer_session_timeout_ms: int = 45000
    consumer_heartbeat_interval_ms: int = 5000
    consumer_max_size: int = 2**31 - 1
    consumer_assignors: tuple[str, ...] = ("uniform", "range")
    rebalance_protocols: tuple[str, ...] = (CLASSIC, CONSUMER)

    @classmethod
    def from_broker_config(cls, config: Any) -> GroupConfig:
        def protocols(text: str) -> tuple[str, ...]:
            return tuple(p.strip().lower() for p in text.split(",") if p.strip())

        for name in ("session.timeout.ms", "heartbeat.interval.ms"):
            low, value, high = (config[f"group.consumer.{bound}{name}"] for bound in ("min.", "", "max."))
            if not low <= value <= high:
                raise ValueError(f"group.consumer.{name}={value} must be within "
                                 f"group.consumer.min.{name}={low} and group.consumer.max.{name}={high}")
        return cls(
            min_session_timeout_ms=config["group.min.session.timeout.ms"],
            max_session_timeout_ms=config["group.max.session.timeout.ms"],
            initial_rebalance_delay_ms=config["group.initial.rebalance.delay.ms"],
            max_size=config["group.max.size"],
            offset_metadata_max_bytes=config["offset.metadata.max.bytes"],
            offsets_retention_ms=config["offsets.retention.minutes"] * 60_000,
            consumer_session_timeout_ms=config["group.consumer.session.timeout.ms"],
            consumer_heartbeat_interval_ms=config["group.consumer.heartbeat.interval.ms"],
            consumer_max_size=config["group.consumer.max.size"],
            consumer_assignors=protocols(config["group.consumer.assignors"]),
            rebalance_protocols=protocols(config["group.coordinator.rebalance.protocols"]),
        )
