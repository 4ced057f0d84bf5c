"""The controller's decisions about partitions, apart from where their state is kept.

Given a partition's state and which brokers are live (and which are in controlled shutdown),
these functions say what its new leader and ISR should be: elections for new, offline and
unclean partitions (seed 002's strategies), the ISR after brokers fail or shut down, preferred
and on-demand elections (ElectLeaders), AlterPartition's checks, and the two phases of a
reassignment (KIP-455). The ZooKeeper controller writes the answer into the partition's state
node; the quorum controller as a PartitionChangeRecord. Every change decided here starts a new
leader epoch, except an ISR a leader asked for (AlterPartition).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from strom.metadata.model import NO_LEADER, PartitionState
from strom.protocol.errors import ErrorCode

PREFERRED, UNCLEAN = 0, 1  # ElectLeaders' election types

Refusal = tuple[ErrorCode, str | None]


@dataclass(frozen=True, slots=True)
class LeaderAndIsr:
    leader: int
    isr: list[int]
    unclean: bool = False  # an out-of-sync replica leads: records only the old ISR had are lost


@dataclass(frozen=True, slots=True)
class ReassignmentStep:
    """A reassignment's new replicas (target first), those being added and removed, and the
    replicas it drops at once (a cancelled addition)."""

    replicas: list[int]
    adding: list[int]
    removing: list[int]
    dropped: list[int]


@dataclass(frozen=True, slots=True)
class ReassignmentDone:
    replicas: list[int]
    leader: int
    isr: list[int]


def eligible(replicas: Iterable[int], live: Collection[int], shutting_down: Collection[int]) -> list[int]:
    """Replicas that may lead, in assignment order: live and not shutting down."""
    return [r for r in replicas if r in live and r not in shutting_down]


def elect_new(replicas: list[int], live: Collection[int]) -> LeaderAndIsr | None:
    """NewPartition -> Online: the first live replica leads, the live replicas are the ISR."""
    alive = [r for r in replicas if r in live]
    return LeaderAndIsr(alive[0], alive) if alive else None


def elect_offline(state: PartitionState, live: Collection[int], shutting_down: Collection[int],
                  unclean_allowed: Callable[[], bool], controlled: bool = False) -> LeaderAndIsr | None:
    """OfflinePartition -> Online when the leader is gone or shutting down: the first live ISR
    member in assignment order leads. With no live ISR member the partition goes offline (no
    leader, its last ISR kept), unless unclean.leader.election.enable lets a live replica lead;
    during a controlled shutdown it keeps its leader instead. None: nothing to change."""
    if state.leader in live and state.leader not in shutting_down:
        return None
    alive = eligible(state.replicas, live, shutting_down)
    candidates = [r for r in alive if r in state.isr]
    if candidates:
        return LeaderAndIsr(candidates[0], [r for r in state.isr if r in live and r not in shutting_down])
    if controlled:
        return None  # a stopping broker keeps what nobody else can lead
    if alive and unclean_allowed():
        return LeaderAndIsr(alive[0], [alive[0]], unclean=True)
    if state.leader != NO_LEADER:
        return LeaderAndIsr(NO_LEADER, list(state.isr))
    return None


def isr_after_failure(state: PartitionState, dead: Collection[int], live: Collection[int]) -> list[int] | None:
    """A partition whose leader survived drops the failed brokers from its ISR."""
    if state.leader in live and any(r in dead for r in state.isr):
        return [r for r in state.isr if r not in dead]
    return None


def isr_after_shutdown(state: PartitionState, broker: int) -> list[int] | None:
    """A broker in controlled shutdown leaves the ISR of the partitions it follows."""
    if state.leader != broker and broker in state.isr and state.leader >= 0:
        return [r for r in state.isr if r != broker]
    return None


def elect_on_demand(name: str, index: int, state: PartitionState, election_type: int,
                    live: Collection[int], shutting_down: Collection[int]) -> LeaderAndIsr | Refusal:
    """ElectLeaders for one partition. Preferred: the first assigned replica leads if it is
    live and in sync. Unclean: a partition without a live leader gets one, in sync if it can."""
    if election_type == PREFERRED:
        preferred = state.replicas[0]
        if state.leader == preferred:
            return ErrorCode.ELECTION_NOT_NEEDED, None
        if not eligible([preferred], live, shutting_down) or preferred not in state.isr:
            return (ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
                    f"Failed to elect leader for partition {name}-{index} under strategy "
                    "PreferredReplicaPartitionLeaderElectionStrategy")
        return LeaderAndIsr(preferred, list(state.isr))
    if state.leader in live:
        return ErrorCode.ELECTION_NOT_NEEDED, None
    alive = eligible(state.replicas, live, shutting_down)
    if not alive:
        return ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE, None
    in_sync = [r for r in alive if r in state.isr]
    leader = (in_sync or alive)[0]
    return LeaderAndIsr(leader, [r for r in state.isr if r in alive] or [leader], unclean=not in_sync)


def check_alter_partition(state: PartitionState | None, deleting: bool, leader: int, leader_epoch: int,
                          partition_epoch: int, new_isr: list[int], live: Collection[int],
                          shutting_down: Collection[int]) -> ErrorCode:
    """Whether a leader's AlterPartition for one partition may be applied (ErrorCode.NONE)."""
    if state is None or deleting:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if state.leader != leader:
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    if leader_epoch != state.leader_epoch:
        return ErrorCode.FENCED_LEADER_EPOCH
    if partition_epoch != state.zk_version:
        return ErrorCode.INVALID_UPDATE_VERSION
    if leader not in new_isr or any(
            r not in state.replicas or (r not in state.isr and (r not in live or r in shutting_down))
            for r in new_isr):
        return ErrorCode.INELIGIBLE_REPLICA
    return ErrorCode.NONE


def start_reassignment(state: PartitionState, target: list[int] | None,
                       live: Collection[int]) -> ReassignmentStep | Refusal:
    """Phase one of a reassignment (or its cancellation, target None): the replicas become
    target + original, the new ones start fetching."""
    if target is None:
        if not (state.adding or state.removing):
            return ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, None
        target = state.original_replicas
    elif not target or len(set(target)) != len(target) or any(b not in live for b in target):
        return ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"replicas {target} must be distinct live brokers"
    original = state.original_replicas
    union = list(target) + [r for r in original if r not in target]
    return ReassignmentStep(union, [r for r in target if r not in original],
                            [r for r in original if r not in target],
                            [r for r in state.replicas if r not in union])


def complete_reassignment(state: PartitionState, live: Collection[int],
                          shutting_down: Collection[int]) -> ReassignmentDone | None:
    """Phase two, once every target replica is in the ISR: a target replica leads and the
    replicas become the target. None while that cannot happen yet."""
    target = state.target_replicas
    if not (state.adding or state.removing) or not set(target) <= set(state.isr):
        return None
    leader = state.leader
    if leader not in target or not eligible([leader], live, shutting_down):
        candidates = [r for r in eligible(target, live, shutting_down) if r in state.isr]
        if not candidates:
            return None
        leader = candidates[0]
    return ReassignmentDone(list(target), leader, [r for r in state.isr if r in target])


def imbalanced_brokers(partitions: Iterable[tuple[str, int, PartitionState]], live: Collection[int],
                       shutting_down: Collection[int], percentage: int
                       ) -> dict[int, tuple[float, list[tuple[str, int]]]]:
    """Kafka's checkAndTriggerAutoLeaderRebalance: brokers whose share (in percent) of the
    partitions they prefer to lead but do not is above `percentage`, with those partitions."""
    by_preferred: dict[int, int] = {}
    imbalanced: dict[int, list[tuple[str, int]]] = {}
    for name, index, state in partitions:
        if not state.replicas:
            continue
        preferred = state.replicas[0]
        by_preferred[preferred] = by_preferred.get(preferred, 0) + 1
        if state.leader != preferred:
            imbalanced.setdefault(preferred, []).append((name, index))
    out = {}
    for broker, tps in imbalanced.items():
        ratio = 100 * len(tps) / by_preferred[broker]
        if eligible([broker], live, shutting_down) and ratio > percentage:
            out[broker] = (ratio, tps)
    return out
