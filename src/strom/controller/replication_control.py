"""What the quorum controller writes for topics and partitions (Kafka's ReplicationControlManager).

Each function reads the committed MetadataImage and returns the records that carry out a
request, with the answer to give once they are committed. The decisions are the ZooKeeper
controller's (`admin.plan_topic`, `admin.plan_partitions`, `controller/elections.py`); only
where they are kept differs: TopicRecord, PartitionRecord and PartitionChangeRecord instead of
znodes. A decision that starts a new leader epoch names the leader in its PartitionChangeRecord
(even an unchanged one: Kafka's rule for bumping the epoch); an ISR a leader asked for does not.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from strom.controller import admin, elections
from strom.controller.features import ELR_VERSION
from strom.metadata import records as r
from strom.metadata.image import (
    BROKER_RESOURCE,
    NO_LEADER_CHANGE,
    TOPIC_RESOURCE,
    MetadataImage,
    merge_change,
    partition_record,
)
from strom.metadata.model import PartitionState, is_internal
from strom.protocol.errors import ErrorCode, KafkaError

METADATA_TOPIC = "__cluster_metadata"


@dataclass
class Limits:
    """The broker settings the controller applies to admin requests (Kafka's names)."""

    default_partitions: int = 1  # num.partitions
    default_replication_factor: int = 1  # default.replication.factor
    max_broker_partitions: int = 20000  # max.broker.partitions
    delete_topic_enable: bool = True  # delete.topic.enable
    validate_topic_configs: Callable[[Mapping[str, str]], None] = lambda _configs: None
    unclean_default: bool = False  # unclean.leader.election.enable
    min_insync_default: int = 1  # min.insync.replicas (a cluster-wide dynamic value overrides it)


@dataclass
class Change:
    """Records to append, and what to answer once they are committed."""

    records: list[Any] = field(default_factory=list)
    result: Any = None


class Brokers:
    """Which registered brokers may hold and lead replicas: unfenced, and (to lead or take new
    replicas) not in controlled shutdown; new replicas go only where some log dir is not
    cordoned (KIP-1066, Kafka's usableBrokers)."""

    def __init__(self, image: MetadataImage, also_gone: Collection[int] = ()) -> None:
        self.live = {b for b, reg in image.brokers.items() if not reg.fenced and b not in also_gone}
        self.shutting_down = {b for b, reg in image.brokers.items() if reg.in_controlled_shutdown}
        self.racks = {b: image.brokers[b].rack for b in sorted(self.live) if b not in self.shutting_down}
        self.usable = {b: rack for b, rack in self.racks.items() if not image.brokers[b].cordoned}

    def placing(self, manual: bool) -> dict[int, str | None]:
        """Where new replicas may go: a manual assignment may name any live broker."""
        return self.racks if manual else self.usable


def replica_counts(image: MetadataImage) -> dict[int, int]:
    return dict(image.replica_counts)


def unclean_allowed(image: MetadataImage, limits: Limits, topic: str) -> bool:
    value = image.configs.get((TOPIC_RESOURCE, topic), {}).get("unclean.leader.election.enable")
    return limits.unclean_default if value is None else value.strip().lower() == "true"


def elr_enabled(image: MetadataImage) -> bool:
    return image.features.get(ELR_VERSION, 0) >= 1


def elr_policy(image: MetadataImage, limits: Limits, topic: str, replicas: list[int]) -> elections.ElrPolicy:
    """KIP-966 for a partition of `topic`: min.insync.replicas from the topic, else the
    cluster-wide dynamic default, else the controller's own."""
    if not elr_enabled(image):
        return elections.ELR_OFF
    value = (image.configs.get((TOPIC_RESOURCE, topic), {}).get("min.insync.replicas")
             or image.configs.get((BROKER_RESOURCE, ""), {}).get("min.insync.replicas"))
    try:
        min_insync = int(value) if value is not None else limits.min_insync_default
    except ValueError:
        min_insync = limits.min_insync_default
    return elections.elr_policy(True, min_insync, replicas)


def change_record(topic_id: uuid.UUID, index: int, state: PartitionState, *, leader: int | None = None,
                  isr: list[int] | None = None, replicas: list[int] | None = None,
                  adding: list[int] | None = None, removing: list[int] | None = None,
                  elr: list[int] | None = None, last_known_elr: list[int] | None = None) -> Any:
    """A PartitionChangeRecord; `leader` (the same one to only start a new leader epoch) or
    None for an ISR change that keeps the leader epoch. ELR fields only where they change."""
    return r.PartitionChangeRecord(
        partition_id=index, topic_id=topic_id, isr=None if isr is None or isr == state.isr else list(isr),
        leader=NO_LEADER_CHANGE if leader is None else leader,
        replicas=None if replicas is None else list(replicas),
        adding_replicas=None if adding is None else list(adding),
        removing_replicas=None if removing is None else list(removing),
        directories=None if replicas is None else [None] * len(replicas),
        eligible_leader_replicas=None if elr is None or elr == state.elr else list(elr),
        last_known_elr=None if last_known_elr is None or last_known_elr == state.last_known_elr
        else list(last_known_elr))


def _elected(topic_id: uuid.UUID, index: int, state: PartitionState, decision: elections.LeaderAndIsr) -> Any:
    return change_record(topic_id, index, state, leader=decision.leader, isr=decision.isr, elr=decision.elr,
                         last_known_elr=decision.last_known_elr)


def _isr_change(topic_id: uuid.UUID, index: int, state: PartitionState, isr: list[int],
                policy: elections.ElrPolicy, leader: int | None = None,
                unclean_shutdown: Collection[int] = ()) -> Any:
    """An ISR change (a new leader epoch when `leader` is named), with the ELR it implies."""
    elr, last_known = elections.next_elr(state, state.leader, isr, policy, unclean_shutdown=unclean_shutdown)
    return change_record(topic_id, index, state, leader=leader, isr=isr, elr=elr, last_known_elr=last_known)


# --- topics ----------------------------------------------------------------------------------------

@dataclass
class NewTopic:
    name: str
    num_partitions: int
    replication_factor: int
    assignment: dict[int, list[int]]
    configs: dict[str, str]


def create_topics(image: MetadataImage, topics: list[NewTopic], limits: Limits, validate_only: bool,
                  counts: Mapping[int, int] | None = None) -> Change:
    """CreateTopics: TopicRecord, its ConfigRecords and a PartitionRecord per partition, each
    partition led by its first live replica. Result: {name: (topic id, replicas) | KafkaError}."""
    brokers = Brokers(image)
    counts = dict(replica_counts(image) if counts is None else counts)
    existing = set(image.topics)
    out = Change(result={})
    for t in topics:
        try:
            if t.name == METADATA_TOPIC:
                raise KafkaError(f"Creation of internal topic {METADATA_TOPIC} is prohibited.",
                                 ErrorCode.INVALID_REQUEST)
            replicas = admin.plan_topic(
                t.name, t.num_partitions, t.replication_factor, t.assignment, t.configs, existing=existing,
                live=brokers.placing(bool(t.assignment)), validate_configs=limits.validate_topic_configs,
                replica_counts=counts,
                max_broker_partitions=limits.max_broker_partitions, default_partitions=limits.default_partitions,
                default_replication_factor=limits.default_replication_factor)
            states = {}
            for index, assigned in replicas.items():
                first = elections.elect_new(assigned, brokers.live - brokers.shutting_down)
                if first is None:
                    raise KafkaError(f"All brokers specified in the manual partition assignment for partition "
                                     f"{index} are fenced or in controlled shutdown.",
                                     ErrorCode.INVALID_REPLICA_ASSIGNMENT)
                states[index] = PartitionState(first.leader, 0, first.isr, assigned, -1, 0)
        except KafkaError as e:
            out.result[t.name] = e
            continue
        topic_id = uuid.uuid4()
        out.result[t.name] = (topic_id, replicas)
        existing.add(t.name)
        for assigned in replicas.values():
            for b in assigned:
                counts[b] = counts.get(b, 0) + 1
        if validate_only:
            continue
        out.records.append(r.TopicRecord(name=t.name, topic_id=topic_id))
        for key, value in t.configs.items():
            out.records.append(r.ConfigRecord(resource_type=TOPIC_RESOURCE, resource_name=t.name, name=key,
                                              value=value))
        out.records += [partition_record(topic_id, index, state) for index, state in states.items()]
    return out


def delete_topics(image: MetadataImage, names: Iterable[str], limits: Limits) -> Change:
    """DeleteTopics: a RemoveTopicRecord each (brokers delete the logs when they replay it).
    Result: {name: topic id | KafkaError}."""
    out = Change(result={})
    for name in names:
        topic = image.topics.get(name)
        try:
            if not limits.delete_topic_enable:
                raise KafkaError("topic deletion is disabled", ErrorCode.TOPIC_DELETION_DISABLED)
            if topic is None:
                raise KafkaError("This server does not host this topic-partition.",
                                 ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            admin.check_deletable(name)
        except KafkaError as e:
            out.result[name] = e
            continue
        if not any(isinstance(x, r.RemoveTopicRecord) and x.topic_id == topic.topic_id for x in out.records):
            out.records.append(r.RemoveTopicRecord(topic_id=topic.topic_id))
        out.result[name] = topic.topic_id
    return out


def create_partitions(image: MetadataImage, name: str, count: int, assignment: list[list[int]] | None,
                      limits: Limits, counts: Mapping[int, int]) -> Change:
    topic = image.topics.get(name)
    if topic is None:
        raise KafkaError("This server does not host this topic-partition.", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    brokers = Brokers(image)
    current = {i: s.replicas for i, s in topic.partitions.items()}
    new = admin.plan_partitions(count, assignment, current, brokers.placing(bool(assignment)), counts,
                                limits.max_broker_partitions)
    out = Change(result=new)
    for index, assigned in new.items():
        first = elections.elect_new(assigned, brokers.live - brokers.shutting_down)
        if first is None:
            raise KafkaError(f"All brokers specified in the manual partition assignment for partition {index} "
                             "are fenced or in controlled shutdown.", ErrorCode.INVALID_REPLICA_ASSIGNMENT)
        out.records.append(partition_record(topic.topic_id, index, PartitionState(first.leader, 0, first.isr,
                                                                                   assigned, -1, 0)))
    return out


# --- elections -------------------------------------------------------------------------------------

def _partitions(image: MetadataImage, wanted: Iterable[tuple[str, int]] | None):
    if wanted is None:
        for topic, index, state in image.partitions():
            yield topic.name, index, topic, state
        return
    for name, index in wanted:
        topic = image.topics.get(name)
        yield name, index, topic, topic.partitions.get(index) if topic is not None else None


def elect_leaders(image: MetadataImage, election_type: int, wanted: list[tuple[str, int]] | None,
                  limits: Limits | None = None) -> Change:
    """ElectLeaders. Result: {(topic, partition): (error, message)}."""
    limits = limits or Limits()
    brokers = Brokers(image)
    out = Change(result={})
    for name, index, topic, state in _partitions(image, wanted):
        if state is None:
            out.result[(name, index)] = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None)
            continue
        decision = elections.elect_on_demand(name, index, state, election_type, brokers.live,
                                             brokers.shutting_down, elr_policy(image, limits, name, state.replicas))
        if isinstance(decision, elections.LeaderAndIsr):
            out.records.append(_elected(topic.topic_id, index, state, decision))
            out.result[(name, index)] = (ErrorCode.NONE, None)
        else:
            out.result[(name, index)] = decision
    return out


def fence_changes(image: MetadataImage, broker: int, limits: Limits) -> list[Any]:
    """A broker is fenced (session expired, or it asked): partitions it led get a new leader
    from the ISR (or go offline), and it leaves every other ISR."""
    brokers = Brokers(image, also_gone={broker})
    out = []
    for topic, index, state in image.partitions():
        if broker not in state.replicas:
            continue
        policy = elr_policy(image, limits, topic.name, state.replicas)
        if state.leader == broker:
            decision = elections.elect_offline(state, brokers.live, brokers.shutting_down,
                                               lambda name=topic.name: unclean_allowed(image, limits, name),
                                               policy=policy)
            if decision is not None:
                out.append(_elected(topic.topic_id, index, state, decision))
            continue
        isr = elections.isr_after_failure(state, {broker}, brokers.live)
        if isr is not None:
            out.append(_isr_change(topic.topic_id, index, state, isr, policy, leader=state.leader))
    return out


def unclean_shutdown_changes(image: MetadataImage, broker: int, limits: Limits) -> list[Any]:
    """A broker registers again after an unclean shutdown (Kafka's handleBrokerUncleanShutdown):
    with ELRs kept, it leaves every ISR and ELR, for it may have lost unflushed records."""
    if not elr_enabled(image):
        return []
    brokers = Brokers(image, also_gone={broker})
    out = []
    for topic, index, state in image.partitions():
        if broker not in state.replicas:
            continue
        decision = elections.forget_unclean(state, broker, brokers.live, brokers.shutting_down,
                                            lambda name=topic.name: unclean_allowed(image, limits, name),
                                            elr_policy(image, limits, topic.name, state.replicas))
        if decision is not None:
            leader = decision.leader if decision.leader != state.leader else None
            out.append(change_record(topic.topic_id, index, state, leader=leader, isr=decision.isr,
                                     elr=decision.elr, last_known_elr=decision.last_known_elr))
    return out


def shutdown_changes(image: MetadataImage, broker: int, limits: Limits) -> list[Any]:
    """A broker in controlled shutdown: leadership moves to another in-sync replica where there
    is one, and it leaves the ISR of the partitions it follows."""
    brokers = Brokers(image)
    shutting_down = brokers.shutting_down | {broker}
    out = []
    for topic, index, state in image.partitions():
        if broker not in state.replicas:
            continue
        policy = elr_policy(image, limits, topic.name, state.replicas)
        if state.leader == broker:
            if len(state.replicas) > 1:
                decision = elections.elect_offline(state, brokers.live, shutting_down, lambda: False, controlled=True,
                                                   policy=policy)
                if decision is not None:
                    out.append(_elected(topic.topic_id, index, state, decision))
            continue
        isr = elections.isr_after_shutdown(state, broker)
        if isr is not None:
            out.append(_isr_change(topic.topic_id, index, state, isr, policy, leader=state.leader))
    return out


def leaders_for_returning(image: MetadataImage, broker: int, limits: Limits) -> list[Any]:
    """A broker is being unfenced: partitions without a leader that it can lead get one (those
    whose last in-sync replica it was, say, when it was fenced or the whole cluster stopped)."""
    brokers = Brokers(image)
    live = brokers.live | {broker}
    out = []
    for topic, index, state in image.partitions():
        if state.leader < 0 and broker in state.replicas:
            decision = elections.elect_offline(state, live, brokers.shutting_down,
                                               lambda name=topic.name: unclean_allowed(image, limits, name),
                                               policy=elr_policy(image, limits, topic.name, state.replicas))
            if decision is not None and decision.leader >= 0:
                out.append(_elected(topic.topic_id, index, state, decision))
    return out


def led_by(image: MetadataImage, broker: int) -> list[tuple[str, int]]:
    """Partitions `broker` leads that another in-sync replica, live and not shutting down, could
    lead instead: controlled shutdown waits for these. What nobody could take (every other
    replica gone or stopping too) does not hold the broker back; fenced, it leaves them without
    a leader, as Kafka's controller does."""
    brokers = Brokers(image)
    return [(t.name, i) for t, i, s in image.partitions()
            if s.leader == broker and any(r != broker for r in elections.eligible(
                s.isr, brokers.live, brokers.shutting_down))]


# --- AlterPartition and reassignments --------------------------------------------------------------

def alter_partition(image: MetadataImage, leader: int, topic_name: str, p: Any,
                    limits: Limits | None = None) -> tuple[list[Any], dict]:
    """One partition of a leader's AlterPartition: its new ISR (and the ELR it implies), and the
    reassignment it may complete. Returns the records and the partition's answer."""
    limits = limits or Limits()
    brokers = Brokers(image)
    topic = image.topics.get(topic_name)
    state = topic.partitions.get(p.partition_index) if topic is not None else None
    answer = {"partition_index": p.partition_index, "error_code": ErrorCode.NONE, "leader_id": -1,
              "leader_epoch": -1, "isr": [], "leader_recovery_state": 0, "partition_epoch": -1}
    new_isr = list(p.new_isr)
    answer["error_code"] = elections.check_alter_partition(state, False, leader, p.leader_epoch, p.partition_epoch,
                                                           new_isr, brokers.live, brokers.shutting_down)
    if answer["error_code"] != ErrorCode.NONE:
        return [], answer
    policy = elr_policy(image, limits, topic_name, state.replicas)
    out = [_isr_change(topic.topic_id, p.partition_index, state, new_isr, policy)]
    new = merge_change(state, out[0])
    done = elections.complete_reassignment(new, brokers.live, brokers.shutting_down)
    if done is not None:
        out.append(_reassigned(topic.topic_id, p.partition_index, new, done,
                               elr_policy(image, limits, topic_name, done.replicas)))
        new = merge_change(new, out[-1])
    return out, {**answer, "leader_id": new.leader, "leader_epoch": new.leader_epoch, "isr": new.isr,
                 "partition_epoch": new.zk_version}


def alter_reassignments(image: MetadataImage, changes: list[tuple[str, int, list[int] | None]],
                        limits: Limits | None = None) -> Change:
    """AlterPartitionReassignments: phase one (replicas = target + original) for each, and phase
    two at once where the ISR already holds the target. Result: {(topic, partition): (error, msg)}."""
    brokers = Brokers(image)
    out = Change(result={})
    for name, index, target in changes:
        topic = image.topics.get(name)
        state = topic.partitions.get(index) if topic is not None else None
        if state is None:
            out.result[(name, index)] = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None)
            continue
        step = elections.start_reassignment(state, target, brokers.live)
        if not isinstance(step, elections.ReassignmentStep):
            out.result[(name, index)] = step
            continue
        first = change_record(topic.topic_id, index, state, leader=state.leader, replicas=step.replicas,
                              adding=step.adding, removing=step.removing)
        out.records.append(first)
        new = merge_change(state, first)
        done = elections.complete_reassignment(new, brokers.live, brokers.shutting_down)
        if done is not None:
            out.records.append(_reassigned(topic.topic_id, index, new, done,
                                           elr_policy(image, limits or Limits(), name, done.replicas)))
        out.result[(name, index)] = (ErrorCode.NONE, None)
    return out


def _reassigned(topic_id: uuid.UUID, index: int, state: PartitionState, done: elections.ReassignmentDone,
                policy: elections.ElrPolicy) -> Any:
    """Phase two of a reassignment; the ELR keeps only replicas that stay."""
    elr, last_known = elections.next_elr(replace(state, replicas=done.replicas), done.leader, done.isr, policy)
    return change_record(topic_id, index, state, leader=done.leader, isr=done.isr, replicas=done.replicas,
                         adding=[], removing=[], elr=elr, last_known_elr=last_known)


def list_reassignments(image: MetadataImage, wanted: list[tuple[str, int]] | None) -> dict[tuple[str, int], Any]:
    return {(name, index): state for name, index, _topic, state in _partitions(image, wanted)
            if state is not None and (state.adding or state.removing)}


def internal(name: str) -> bool:
    return is_internal(name) or name == METADATA_TOPIC
