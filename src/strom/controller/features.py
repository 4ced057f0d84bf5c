"""Feature versioning (KIP-584): which levels of cluster-wide features this broker software
supports, which levels the cluster has finalized, and how UpdateFeatures moves them.

The finalized levels live in the `/feature` node (Kafka's FeatureZNode), written only by the
controller; every broker follows the node and reports it in ApiVersions, its version being
the finalized-features epoch. Clients read it to decide what to speak: a producer uses
transactions version 2 (KIP-890 part 2: Produce v12, EndTxn v5 with an epoch bump per
transaction) only when `transaction.version` is finalized at 2 or more, and a consumer may use
the KIP-848 protocol only when `group.version` is at least 1, and share groups (KIP-932) are
served only when `share.version` is at least 1. At `eligible.leader.replicas.version` 1 the
controller keeps each partition's eligible leader replicas (KIP-966, controller/elections.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from strom.protocol.errors import ErrorCode


@dataclass(frozen=True, slots=True)
class SupportedFeature:
    min_level: int
    max_level: int
    default_level: int  # what a new cluster finalizes, as a Kafka 4.0 cluster formatted today
    downgradable: bool = True


METADATA_VERSION = "metadata.version"
TRANSACTION_VERSION = "transaction.version"
GROUP_VERSION = "group.version"
SHARE_VERSION = "share.version"
ELR_VERSION = "eligible.leader.replicas.version"

# metadata.version levels are Kafka's MetadataVersion feature levels: 7 is 3.3-IV3, the oldest
# Kafka 4.0 still runs, and 25 is 4.0-IV3. Strom speaks 4.0's protocol whatever the level, so
# the level is recorded and reported, and never lowered (Kafka refuses most such downgrades).
SUPPORTED: dict[str, SupportedFeature] = {
    METADATA_VERSION: SupportedFeature(7, 25, 25, downgradable=False),
    TRANSACTION_VERSION: SupportedFeature(0, 2, 2),
    GROUP_VERSION: SupportedFeature(0, 1, 1),
    # KIP-932: level 1 turns share groups on (ShareGroupHeartbeat, ShareFetch, ...). Kafka 4.1
    # formats new clusters with it off (share groups were a preview there); Strom, whose
    # share groups are what it serves, finalizes it at 1 as Kafka 4.2 does. (Kafka makes level
    # 1 depend on metadata.version 4.1-IV1; Strom's metadata.version levels stop at 4.0's and
    # do not gate protocol, so that dependency is not modelled.)
    SHARE_VERSION: SupportedFeature(0, 1, 1),
    # KIP-966: level 1 has the controller keep eligible leader replicas, and elect from them
    # when the ISR is empty. New clusters finalize it at 1, as Kafka 4.1 formats them; an older
    # cluster raises it with UpdateFeatures. (Kafka makes it depend on metadata.version
    # 4.0-IV1, level 23, below Strom's default level.)
    ELR_VERSION: SupportedFeature(0, 1, 1),
}

# UpdateFeatures v1+ upgrade types; v0 says allow_downgrade instead.
UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE = 1, 2, 3


@dataclass(frozen=True, slots=True)
class FinalizedFeatures:
    levels: dict[str, int]
    epoch: int = -1  # the /feature node's version; -1 while there is none

    def level(self, name: str) -> int:
        return self.levels.get(name, 0)


NONE_FINALIZED = FinalizedFeatures({})


def default_levels() -> dict[str, int]:
    return {name: f.default_level for name, f in SUPPORTED.items() if f.default_level > 0}


@dataclass(frozen=True, slots=True)
class FeatureUpdate:
    feature: str
    max_version_level: int
    upgrade_type: int  # UPGRADE, SAFE_DOWNGRADE or UNSAFE_DOWNGRADE


FeatureErrors = dict[str, tuple[ErrorCode, str | None]]


def plan_updates(current: dict[str, int], updates: Iterable[FeatureUpdate]) -> tuple[dict[str, int], FeatureErrors]:
    """The levels after `updates` and each update's outcome. All or nothing, as Kafka's
    controller applies them: when any update fails, the caller keeps `current`."""
    levels = dict(current)
    results: FeatureErrors = {}
    for u in updates:
        if u.feature in results:
            return current, {**results, u.feature: (ErrorCode.INVALID_REQUEST,
                                                    f"Feature {u.feature} appears more than once in the request.")}
        error = _check(u, current.get(u.feature, 0))
        results[u.feature] = (ErrorCode.NONE, None) if error is None else (ErrorCode.INVALID_UPDATE_VERSION, error)
        if error is None:
            if u.max_version_level == 0:
                levels.pop(u.feature, None)
            else:
                levels[u.feature] = u.max_version_level
    if any(code != ErrorCode.NONE for code, _ in results.values()):
        return current, results
    return levels, results


def _check(u: FeatureUpdate, current: int) -> str | None:
    supported = SUPPORTED.get(u.feature)
    if supported is None:
        return f"Feature {u.feature} is not supported by this cluster's brokers."
    if u.upgrade_type not in (UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE):
        return f"Unknown upgrade type {u.upgrade_type} for feature {u.feature}."
    level = u.max_version_level
    if level < 0:
        return f"Feature level {level} of {u.feature} is negative."
    if level != 0 and not supported.min_level <= level <= supported.max_level:
        return (f"Feature {u.feature} level {level} is outside the range this cluster's brokers "
                f"support ({supported.min_level} to {supported.max_level}).")
    if level < current:
        if u.upgrade_type == UPGRADE:
            return (f"Feature {u.feature} would go down from level {current} to {level}, which needs "
                    "the upgrade type to be SAFE_DOWNGRADE or UNSAFE_DOWNGRADE.")
        if not supported.downgradable or level == 0 and supported.min_level > 0:
            return f"Feature {u.feature} cannot be downgraded from level {current} to {level}."
    return None
