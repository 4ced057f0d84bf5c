"""The controller: owner of topic and partition state (seed 000's KafkaController, reduced).

It validates and records topic creation, deletion and partition growth in the metadata
store, picks replicas with Kafka's rack-unaware assignment, elects leaders, and tells brokers
what to serve through `BrokerChannel` (LeaderAndIsr and StopReplica in Kafka's terms). A
single `strom serve` is a cluster of one: its controller talks to its own replica manager.
"""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from strom.controller.store import MetadataStore
from strom.protocol.errors import ErrorCode, KafkaError

MAX_TOPIC_NAME = 249
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")


def validate_topic_name(name: str | None) -> None:
    if not name:
        raise KafkaError("topic name is empty", ErrorCode.INVALID_TOPIC_EXCEPTION)
    if name in (".", ".."):
        raise KafkaError(f"topic name cannot be {name!r}", ErrorCode.INVALID_TOPIC_EXCEPTION)
    if len(name) > MAX_TOPIC_NAME:
        raise KafkaError(
            f"topic name is longer than {MAX_TOPIC_NAME} characters", ErrorCode.INVALID_TOPIC_EXCEPTION
        )
    if not _LEGAL_TOPIC.match(name):
        raise KafkaError(
            f"topic name {name!r} has characters other than ASCII alphanumerics, '.', '_' and '-'",
            ErrorCode.INVALID_TOPIC_EXCEPTION,
        )


def assign_replicas(
    num_partitions: int,
    replication_factor: int,
    brokers: list[int],
    *,
    start_partition: int = 0,
    start_index: int | None = None,
    replica_shift: int | None = None,
) -> dict[int, list[int]]:
    """Kafka's rack-unaware assignment: spread leaders round-robin from a random broker, and
    place followers at a shift that grows every full round so replicas do not pile up."""
    n = len(brokers)
    if replication_factor > n:
        raise KafkaError(
            f"replication factor {replication_factor} larger than available brokers {n}",
            ErrorCode.INVALID_REPLICATION_FACTOR,
        )
    brokers = sorted(brokers)
    start = random.randrange(n) if start_index is None else start_index
    shift = random.randrange(n) if replica_shift is None else replica_shift
    assignment: dict[int, list[int]] = {}
    for partition in range(start_partition, start_partition + num_partitions):
        if partition > 0 and partition % n == 0:
            shift += 1
        first = (partition + start) % n
        replicas = [brokers[first]]
        for j in range(replication_factor - 1):
            replicas.append(brokers[(first + 1 + (shift + j) % (n - 1)) % n])
        assignment[partition] = replicas
    return assignment


@dataclass
class PartitionState:
    leader: int
    leader_epoch: int
    isr: list[int]
    replicas: list[int]


@dataclass
class TopicMetadata:
    name: str
    topic_id: uuid.UUID
    partitions: dict[int, PartitionState] = field(default_factory=dict)
    configs: dict[str, str] = field(default_factory=dict)
    internal: bool = False


class BrokerChannel(Protocol):
    """How the controller tells brokers to lead, follow or stop serving a partition, and that
    a topic's configs changed (Kafka's config change notification)."""

    def leader_and_isr(self, topic: TopicMetadata, partition: int) -> None: ...
    def stop_replica(self, topic: str, partition: int, delete: bool) -> None: ...
    def topic_config_changed(self, topic: TopicMetadata) -> None: ...


class Controller:
    def __init__(
        self,
        store: MetadataStore,
        broker_id: int,
        live_brokers: Callable[[], list[int]],
        channel: BrokerChannel,
        validate_configs: Callable[[Mapping[str, str]], None],
    ) -> None:
        self.store = store
        self.broker_id = broker_id
        self.live_brokers = live_brokers
        self.channel = channel
        self.validate_configs = validate_configs
        self.topics: dict[str, TopicMetadata] = {}

    def startup(self) -> None:
        """Load topic state and (re-)elect leaders among live replicas."""
        with self.store.batch():
            self._load_topics()

    def _load_topics(self) -> None:
        for name in self.store.children("/brokers/topics"):
            node = self.store.get(f"/brokers/topics/{name}")
            if node is None:
                continue
            data, _ = node
            config_node = self.store.get(f"/config/topics/{name}")
            topic = TopicMetadata(
                name, uuid.UUID(data["topic_id"]),
                configs=dict(config_node[0]["config"]) if config_node else {},
                internal=name.startswith("__"),
            )
            for p, replicas in data["partitions"].items():
                state = self.store.get(f"/brokers/topics/{name}/partitions/{p}/state")
                epoch = state[0]["leader_epoch"] + 1 if state else 0
                topic.partitions[int(p)] = self._elect(replicas, epoch)
                self._write_partition_state(name, int(p), topic.partitions[int(p)])
            self.topics[name] = topic
            for p in topic.partitions:
                self.channel.leader_and_isr(topic, p)

    def _elect(self, replicas: list[int], epoch: int) -> PartitionState:
        live = set(self.live_brokers())
        alive = [r for r in replicas if r in live]
        leader = alive[0] if alive else -1
        return PartitionState(leader, epoch, alive, list(replicas))

    def _write_partition_state(self, topic: str, partition: int, state: PartitionState) -> None:
        self.store.set(
            f"/brokers/topics/{topic}/partitions/{partition}/state",
            {"leader": state.leader, "leader_epoch": state.leader_epoch, "isr": state.isr},
        )

    def _write_assignment(self, topic: TopicMetadata) -> None:
        self.store.set(
            f"/brokers/topics/{topic.name}",
            {
                "version": 3,
                "topic_id": str(topic.topic_id),
                "partitions": {str(p): s.replicas for p, s in topic.partitions.items()},
            },
        )

    def _check_name_free(self, name: str) -> None:
        if name in self.topics:
            raise KafkaError(f"Topic '{name}' already exists.", ErrorCode.TOPIC_ALREADY_EXISTS)
        folded = name.replace(".", "_")
        for existing in self.topics:
            if existing.replace(".", "_") == folded:
                raise KafkaError(
                    f"Topic '{name}' collides with existing topic '{existing}'",
                    ErrorCode.INVALID_TOPIC_EXCEPTION,
                )

    def _check_assignment(self, assignment: Mapping[int, list[int]], first_partition: int) -> None:
        live = set(self.live_brokers())
        sizes = {len(r) for r in assignment.values()}
        if len(sizes) != 1 or 0 in sizes:
            raise KafkaError("all partitions need the same, non-zero number of replicas",
                             ErrorCode.INVALID_REPLICA_ASSIGNMENT)
        if sorted(assignment) != list(range(first_partition, first_partition + len(assignment))):
            raise KafkaError("partitions in the assignment must be consecutive from "
                             f"{first_partition}", ErrorCode.INVALID_REPLICA_ASSIGNMENT)
        for p, replicas in assignment.items():
            if len(set(replicas)) != len(replicas):
                raise KafkaError(f"duplicate replicas for partition {p}", ErrorCode.INVALID_REPLICA_ASSIGNMENT)
            unknown = set(replicas) - live
            if unknown:
                raise KafkaError(f"unknown broker ids {sorted(unknown)} for partition {p}",
                                 ErrorCode.INVALID_REPLICA_ASSIGNMENT)

    def create_topic(
        self,
        name: str,
        num_partitions: int,
        replication_factor: int,
        assignment: Mapping[int, list[int]] | None,
        configs: Mapping[str, str],
        *,
        validate_only: bool = False,
        default_partitions: int = 1,
        default_replication_factor: int = 1,
    ) -> TopicMetadata:
        validate_topic_name(name)
        self._check_name_free(name)
        if assignment:
            if num_partitions != -1 or replication_factor != -1:
                raise KafkaError("both an assignment and a partition count or replication factor "
                                 "were given", ErrorCode.INVALID_REQUEST)
            self._check_assignment(assignment, 0)
            replicas = dict(assignment)
        else:
            partitions = default_partitions if num_partitions == -1 else num_partitions
            factor = default_replication_factor if replication_factor == -1 else replication_factor
            if partitions <= 0:
                raise KafkaError("number of partitions must be larger than 0", ErrorCode.INVALID_PARTITIONS)
            if factor <= 0:
                raise KafkaError("replication factor must be larger than 0",
                                 ErrorCode.INVALID_REPLICATION_FACTOR)
            replicas = assign_replicas(partitions, factor, self.live_brokers())
        try:
            self.validate_configs(configs)
        except ValueError as e:
            raise KafkaError(str(e), ErrorCode.INVALID_CONFIG) from None
        topic = TopicMetadata(name, uuid.uuid4(), configs=dict(configs), internal=name.startswith("__"))
        for p, r in replicas.items():
            topic.partitions[p] = self._elect(r, 0)
        if validate_only:
            return topic
        with self.store.batch():
            self.store.set(f"/config/topics/{name}", {"version": 1, "config": topic.configs})
            self._write_assignment(topic)
            for p, state in topic.partitions.items():
                self._write_partition_state(name, p, state)
        self.topics[name] = topic
        for p in topic.partitions:
            self.channel.leader_and_isr(topic, p)
        return topic

    def delete_topic(self, name: str) -> TopicMetadata:
        topic = self.topics.get(name)
        if topic is None:
            raise KafkaError("This server does not host this topic-partition.",
                             ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        del self.topics[name]
        for p in topic.partitions:
            self.channel.stop_replica(name, p, delete=True)
        self.store.delete(f"/brokers/topics/{name}")
        self.store.delete(f"/config/topics/{name}")
        return topic

    def alter_topic_configs(self, name: str, configs: Mapping[str, str], *,
                            validate_only: bool = False) -> TopicMetadata:
        """Replace a topic's config overrides (AlterConfigs); persisted at /config/topics/<name>
        and applied by the brokers at once."""
        topic = self.topics.get(name)
        if topic is None:
            raise KafkaError(f"Topic {name} does not exist.", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        try:
            self.validate_configs(configs)
        except ValueError as e:
            raise KafkaError(str(e), ErrorCode.INVALID_CONFIG) from None
        if validate_only:
            return topic
        self.store.set(f"/config/topics/{name}", {"version": 1, "config": dict(configs)})
        topic.configs = dict(configs)
        self.channel.topic_config_changed(topic)
        return topic

    def broker_configs(self, entity: str) -> dict[str, str]:
        """Dynamic configs of broker `entity` (an id, or "<default>" for the cluster default)."""
        node = self.store.get(f"/config/brokers/{entity}")
        return dict(node[0]["config"]) if node else {}

    def set_broker_configs(self, entity: str, configs: Mapping[str, str]) -> None:
        """Persist dynamic broker configs at /config/brokers/<entity>, as Kafka's ZooKeeper mode."""
        path = f"/config/brokers/{entity}"
        if configs:
            self.store.set(path, {"version": 1, "config": dict(configs)})
        elif self.store.get(path) is not None:
            self.store.delete(path)

    def create_partitions(
        self, name: str, count: int, assignment: list[list[int]] | None, *, validate_only: bool = False
    ) -> None:
        topic = self.topics.get(name)
        if topic is None:
            raise KafkaError("This server does not host this topic-partition.",
                             ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        current = len(topic.partitions)
        if count <= current:
            raise KafkaError(f"Topic currently has {current} partitions, {count} would not be an "
                             "increase.", ErrorCode.INVALID_PARTITIONS)
        if assignment is not None:
            if len(assignment) != count - current:
                raise KafkaError(f"Increasing the number of partitions by {count - current} but "
                                 f"{len(assignment)} assignments provided.", ErrorCode.INVALID_REPLICA_ASSIGNMENT)
            new = {current + i: list(r) for i, r in enumerate(assignment)}
            self._check_assignment(new, current)
        else:
            factor = len(topic.partitions[0].replicas)
            new = assign_replicas(count - current, factor, self.live_brokers(), start_partition=current)
        if validate_only:
            return
        with self.store.batch():
            for p, replicas in new.items():
                topic.partitions[p] = self._elect(replicas, 0)
                self._write_partition_state(name, p, topic.partitions[p])
            self._write_assignment(topic)
        for p in new:
            self.channel.leader_and_isr(topic, p)
