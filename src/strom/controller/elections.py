"""The controller's decisions about partitions, apart from where their state is kept.

Given a partition's state and which brokers are live (and which are in controlled shutdown),
these functions say what its new leader and ISR should be: elections for new, offline and
unclean partitions (seed 002's strategies), the ISR after brokers fail or shut down, preferred
and on-demand elections (ElectLeaders), AlterPartition's checks, and the two phases of a
reassignment (KIP-455). The ZooKeeper controller writes the answer into the partition's state
node; the quorum controller as a PartitionChangeRecord. Every change decided here starts a new
leader epoch, except an ISR a leader asked for (AlterPartition).

Eligible leader replicas (KIP-966, on at eligible.leader.replicas.version 1): while the ISR is
below the topic's min.insync.replicas the leaders' high watermark stands still, so a replica
that leaves the ISR then still has every acknowledged record. Such replicas are kept as the
partition's ELR (`next_elr`, Kafka's PartitionChangeBuilder rules): the ISR may become empty,
and then a live ELR member leads (with an ISR of itself) rather than nobody. A replica that
shut down uncleanly may have lost unflushed records and leaves the ELR. When the ISR empties,
its last leader is kept as the last-known ELR, elected when no ISR or ELR member is left (the
only unclean recovery Kafka ships: `unclean.recovery.strategy` is not a Kafka config yet).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field, replace

from strom.metadata.model import NO_LEADER, PartitionState
from strom.protocol.errors import ErrorCode

PREFERRED, UNCLEAN = 0, 1  # ElectLeaders' election types

Refusal = tuple[ErrorCode, str | None]


@dataclass(frozen=True, slots=True)
class ElrPolicy:
    """KIP-966 for one partition: whether the cluster keeps ELRs, and the topic's effective
    min.insync.replicas (at most its replication factor, as Kafka's getTopicEffectiveMinIsr)."""

    enabled: bool = False
    min_isr: int = 1


ELR_OFF = ElrPolicy()


def elr_policy(enabled: bool, min_insync: int, replicas: Collection[int]) -> ElrPolicy:
    return ElrPolicy(enabled, max(1, min(min_insync, len(replicas)))) if enabled else ELR_OFF


@dataclass(frozen=True, slots=True)
class LeaderAndIsr:
    leader: int
    isr: list[int]
    unclean: bool = False  # an out-of-sync replica leads: records only the old ISR had are lost
    elr: list[int] = field(default_factory=list)
    last_known_elr: list[int] = field(default_factory=list)


def next_elr(state: PartitionState, leader: int, isr: list[int], policy: ElrPolicy, unclean: bool = False,
             unclean_shutdown: Collection[int] = ()) -> tuple[list[int], list[int]]:
    """The ELR and last-known ELR once the partition has `leader` and `isr` (Kafka's
    PartitionChangeBuilder with the last known leader kept for balanced recovery). Off, or
    after an unclean election, both are empty."""
    if not policy.enabled or unclean:
        return [], []
    if len(isr) >= policy.min_isr:
        elr: list[int] = []
    else:  # the old ISR joins the ELR; who is in the ISR now or shut down uncleanly is not in it
        candidates = [*state.elr, *(r for r in state.isr if r not in state.elr)]
        elr = [r for r in candidates if r not in isr and r not in unclean_shutdown and r in state.replicas]
    last_known = list(state.last_known_elr)
    if not isr and state.isr and state.leader >= 0:
        last_known = [state.leader]  # the ISR empties now: remember who led last
    elif leader >= 0:
        last_known = []
    return elr, last_known


def _decided(state: PartitionState, leader: int, isr: list[int], policy: ElrPolicy, unclean: bool = False,
             unclean_shutdown: Collection[int] = ()) -> LeaderAndIsr:
    elr, last_known = next_elr(state, leader, isr, policy, unclean, unclean_shutdown)
    return LeaderAndIsr(leader, isr, unclean, elr, last_known)


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
                  unclean_allowed: Callable[[], bool], controlled: bool = False, policy: ElrPolicy = ELR_OFF,
                  unclean_shutdown: Collection[int] = ()) -> LeaderAndIsr | None:
    """OfflinePartition -> Online when the leader is gone or shutting down: the first live ISR
    member in assignment order leads. With no live ISR member the partition goes offline (no
    leader, its last ISR kept), unless unclean.leader.election.enable lets a live replica lead;
    during a controlled shutdown it keeps its leader instead. With ELRs kept, the ISR empties
    instead and a live ELR member (else the last known leader) leads. `unclean_shutdown`:
    replicas known to have shut down uncleanly. None: nothing to change."""
    if state.leader in live and state.leader not in shutting_down:
        return None
    alive = eligible(state.replicas, live, shutting_down)
    candidates = [r for r in alive if r in state.isr and r not in unclean_shutdown]
    if candidates:
        return _decided(state, candidates[0], [r for r in state.isr if r in live and r not in shutting_down
                                               and r not in unclean_shutdown], policy, False, unclean_shutdown)
    if controlled:
        return None  # a stopping broker keeps what nobody else can lead
    if policy.enabled:
        return _elect_from_elr(state, alive, unclean_allowed, policy, unclean_shutdown)
    if alive and unclean_allowed():
        return _decided(state, alive[0], [alive[0]], policy, True)
    if state.leader != NO_LEADER:
        return _decided(state, NO_LEADER, list(state.isr), policy)
    return None


def _elect_from_elr(state: PartitionState, alive: list[int], unclean_allowed: Callable[[], bool],
                    policy: ElrPolicy, unclean_shutdown: Collection[int]) -> LeaderAndIsr | None:
    """No live ISR member, ELRs kept: the ISR empties and its members join the ELR; a live ELR
    member leads (in assignment order, as Kafka's electAnyLeader), else the last known leader
    when the ELR is empty too, else an unclean election if the topic allows it, else nobody."""
    none = _decided(state, NO_LEADER, [], policy, False, unclean_shutdown)
    from_elr = [r for r in alive if r in none.elr]
    if from_elr:
        leader = from_elr[0]
        return LeaderAndIsr(leader, [leader], False, [r for r in none.elr if r != leader], [])
    last = none.last_known_elr
    if not none.elr and len(last) == 1 and last[0] in alive:
        # The last leader back, as without ELRs (it was the last ISR member): not counted as
        # unclean, though Kafka's builder marks it so; it may have lost what it had not flushed.
        return LeaderAndIsr(last[0], [last[0]])
    if alive and unclean_allowed():
        return LeaderAndIsr(alive[0], [alive[0]], True)
    unchanged = (state.leader == NO_LEADER and not state.isr and state.elr == none.elr
                 and state.last_known_elr == none.last_known_elr)
    return None if unchanged else none


def forget_unclean(state: PartitionState, broker: int, live: Collection[int], shutting_down: Collection[int],
                   unclean_allowed: Callable[[], bool], policy: ElrPolicy) -> LeaderAndIsr | None:
    """A broker that shut down uncleanly (it registers again without its clean-shutdown epoch)
    may have lost unflushed records: it leaves the partition's ISR and ELR, and a partition it
    led gets another leader. None: it is in neither."""
    if broker not in state.isr and broker not in state.elr:
        return None
    if state.leader == broker:
        return elect_offline(state, set(live) - {broker}, shutting_down, unclean_allowed, False, policy, {broker})
    isr = [r for r in state.isr if r != broker]
    if not isr and policy.enabled and state.leader == NO_LEADER:
        return _elect_from_elr(replace(state, isr=isr), eligible(state.replicas, live, shutting_down),
                               unclean_allowed, policy, {broker})
    return _decided(state, state.leader, isr, policy, False, {broker})


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
                    live: Collection[int], shutting_down: Collection[int],
                    policy: ElrPolicy = ELR_OFF) -> LeaderAndIsr | Refusal:
    """ElectLeaders for one partition. Preferred: the first assigned replica leads if it is
    live and in sync. Unclean: a partition without a live leader gets one, in sync if it can
    (with ELRs kept and the ISR empty, an ELR member is as good)."""
    if election_type == PREFERRED:
        preferred = state.replicas[0]
        if state.leader == preferred:
            return ErrorCode.ELECTION_NOT_NEEDED, None
        if not eligible([preferred], live, shutting_down) or preferred not in state.isr:
            return (ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
                    f"Failed to elect leader for partition {name}-{index} under strategy "
                    "PreferredReplicaPartitionLeaderElectionStrategy")
        return _decided(state, preferred, list(state.isr), policy)
    if state.leader in live:
        return ErrorCode.ELECTION_NOT_NEEDED, None
    alive = eligible(state.replicas, live, shutting_down)
    if not alive:
        return ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE, None
    in_sync = [r for r in alive if r in state.isr]
    if not in_sync and policy.enabled and not state.isr:
        eligible_now = [r for r in alive if r in state.elr]
        if eligible_now:
            leader = eligible_now[0]
            return LeaderAndIsr(leader, [leader], False, [r for r in state.elr if r != leader], [])
    leader = (in_sync or alive)[0]
    return _decided(state, leader, [r for r in state.isr if r in alive] or [leader], policy, not in_sync)


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
