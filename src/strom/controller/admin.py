"""What admin requests write into the metadata store (Kafka's AdminZkClient), and the checks and
assignments they share with the quorum controller.

Any broker validates a topic creation, deletion, partition increase or config change and
writes it as Kafka does in ZooKeeper mode: the new topic's assignment under /brokers/topics,
a deletion request under /admin/delete_topics, configs under /config plus a change
notification under /config/changes. The controller and the other brokers react to those
nodes through their watches; nothing here talks to a broker. `plan_topic` and
`plan_partitions` (validation, limits, replica assignment) are the same for the quorum
controller, which records their outcome as TopicRecord and PartitionRecords instead.
"""

from __future__ import annotations

import logging
import random
import re
import uuid
from collections.abc import Callable, Iterable, Mapping

from strom.controller import znodes
from strom.controller.store import Create, MetadataStore, NodeExists, SetData
from strom.protocol.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

MAX_TOPIC_NAME = 249
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
# Notifications kept under /config/changes: a broker that was away reloads every config at
# start-up, so old ones only matter to brokers that are running and have already seen them.
KEEP_CONFIG_CHANGES = 100
MAX_INT32 = 2**31 - 1


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


def _too_few_brokers(factor: int, n: int) -> KafkaError:
    return KafkaError(f"Replication factor: {factor} larger than available brokers: {n}.",
                      ErrorCode.INVALID_REPLICATION_FACTOR)


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
    brokers = sorted(brokers)
    assignment: dict[int, list[int]] = {}
    for partition, first, shift in _walk(num_partitions, replication_factor, len(brokers),
                                         start_partition, start_index, replica_shift):
        n = len(brokers)
        assignment[partition] = [brokers[first]] + [
            brokers[(first + 1 + (shift + j) % (n - 1)) % n] for j in range(replication_factor - 1)]
    return assignment


def _walk(num_partitions: int, replication_factor: int, n: int, start_partition: int,
          start_index: int | None, replica_shift: int | None):
    """Both assignments' walk: (partition, index of its first replica, follower shift), the
    shift growing every full round of `n` brokers, from a random start unless given."""
    if replication_factor > n:
        raise _too_few_brokers(replication_factor, n)
    start = random.randrange(n) if start_index is None else start_index
    shift = random.randrange(n) if replica_shift is None else replica_shift
    for partition in range(start_partition, start_partition + num_partitions):
        if partition > 0 and partition % n == 0:
            shift += 1
        yield partition, (partition + start) % n, shift


def rack_alternated(racks: Mapping[int, str]) -> list[int]:
    """Brokers ordered so that consecutive ones are on different racks where possible:
    the first broker of each rack, then the second of each, and so on."""
    by_rack: dict[str, list[int]] = {}
    for broker, rack in sorted(racks.items()):
        by_rack.setdefault(rack, []).append(broker)
    columns = [by_rack[r] for r in sorted(by_rack)]
    return [col[i] for i in range(max(map(len, columns))) for col in columns if i < len(col)]


def assign_replicas_rack_aware(
    num_partitions: int,
    replication_factor: int,
    racks: Mapping[int, str],
    *,
    start_partition: int = 0,
    start_index: int | None = None,
    replica_shift: int | None = None,
) -> dict[int, list[int]]:
    """Kafka's rack-aware assignment: the rack-unaware walk over rack-alternated brokers, where
    a follower is skipped while its rack (or the broker itself) already holds a replica and an
    unused rack (or broker) remains."""
    arranged = rack_alternated(racks)
    n, n_racks = len(arranged), len(set(racks.values()))
    assignment: dict[int, list[int]] = {}
    for partition, first, shift in _walk(num_partitions, replication_factor, n, start_partition,
                                         start_index, replica_shift):
        leader = arranged[first]
        replicas, used_racks, used = [leader], {racks[leader]}, {leader}
        k = 0
        while len(replicas) < replication_factor:
            candidate = arranged[(first + 1 + (shift * n_racks + k) % (n - 1)) % n]
            k += 1
            rack_ok = racks[candidate] not in used_racks or len(used_racks) == n_racks
            broker_ok = candidate not in used or len(used) == n
            if rack_ok and broker_ok:
                replicas.append(candidate)
                used_racks.add(racks[candidate])
                used.add(candidate)
        assignment[partition] = replicas
    return assignment


def assign(num_partitions: int, replication_factor: int, brokers: Mapping[int, str | None], *,
           start_partition: int = 0) -> dict[int, list[int]]:
    """Rack-aware when every broker has `broker.rack`, rack-unaware otherwise (Kafka's
    RackAwareMode.Safe)."""
    if brokers and all(rack is not None for rack in brokers.values()):
        return assign_replicas_rack_aware(num_partitions, replication_factor,
                                          {b: r for b, r in brokers.items() if r is not None},
                                          start_partition=start_partition)
    return assign_replicas(num_partitions, replication_factor, list(brokers),
                           start_partition=start_partition)


def check_assignment(assignment: Mapping[int, list[int]], first_partition: int,
                     live: set[int]) -> None:
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


def check_name_free(name: str, existing: Iterable[str]) -> None:
    """A topic name is taken, or collides with another once '.' and '_' are confused (as
    metric names confuse them)."""
    existing = set(existing)
    if name in existing:
        raise KafkaError(f"Topic '{name}' already exists.", ErrorCode.TOPIC_ALREADY_EXISTS)
    folded = name.replace(".", "_")
    for other in existing:
        if other.replace(".", "_") == folded:
            raise KafkaError(f"Topic '{name}' collides with existing topic '{other}'",
                             ErrorCode.INVALID_TOPIC_EXCEPTION)


def check_partition_limit(partitions: int, factor: int, live: Mapping[int, object],
                          counts: Mapping[int, int], limit: int) -> None:
    """Refuse, before any assignment is computed, more partition replicas than the live
    brokers may hold together (`max.broker.partitions` each, as KIP-578 names it)."""
    room = limit * len(live) - sum(counts.get(b, 0) for b in live)
    if partitions * factor > room:
        raise KafkaError(f"{partitions} partitions with replication factor {factor} would exceed "
                         f"max.broker.partitions={limit} ({max(room, 0)} partition replicas "
                         f"left on {len(live)} live brokers)", ErrorCode.POLICY_VIOLATION)


def check_broker_limits(new: Mapping[int, list[int]], counts: Mapping[int, int], limit: int) -> None:
    counts = dict(counts)
    for replicas in new.values():
        for b in replicas:
            counts[b] = counts.get(b, 0) + 1
    over = sorted(b for b, n in counts.items() if n > limit)
    if over:
        raise KafkaError(f"the assignment would put more than max.broker.partitions={limit} "
                         f"partition replicas on brokers {over}", ErrorCode.POLICY_VIOLATION)


def check_configs(configs: Mapping[str, str], validate: Callable[[Mapping[str, str]], None]) -> None:
    try:
        validate(configs)
    except ValueError as e:
        raise KafkaError(str(e), ErrorCode.INVALID_CONFIG) from None


def check_deletable(name: str) -> None:
    if znodes.is_internal(name):
        # Every group's offsets or every transaction's state would go with it.
        raise KafkaError(f"Topic {name} is an internal topic and cannot be deleted",
                         ErrorCode.INVALID_TOPIC_EXCEPTION)


def plan_topic(name: str, num_partitions: int, replication_factor: int,
               assignment: Mapping[int, list[int]] | None, configs: Mapping[str, str], *,
               existing: Iterable[str], live: Mapping[int, str | None],
               validate_configs: Callable[[Mapping[str, str]], None], replica_counts: Mapping[int, int],
               max_broker_partitions: int, default_partitions: int = 1,
               default_replication_factor: int = 1) -> dict[int, list[int]]:
    """Validate a new topic (CreateTopics) and choose its replicas: KafkaError if refused."""
    validate_topic_name(name)
    check_name_free(name, existing)
    if assignment:
        if num_partitions != -1 or replication_factor != -1:
            raise KafkaError("both an assignment and a partition count or replication factor "
                             "were given", ErrorCode.INVALID_REQUEST)
        check_assignment(assignment, 0, set(live))
        replicas = {p: list(r) for p, r in assignment.items()}
        check_broker_limits(replicas, replica_counts, max_broker_partitions)
    else:
        partitions = default_partitions if num_partitions == -1 else num_partitions
        factor = default_replication_factor if replication_factor == -1 else replication_factor
        if partitions <= 0:
            raise KafkaError("number of partitions must be larger than 0", ErrorCode.INVALID_PARTITIONS)
        if factor <= 0:
            raise KafkaError("replication factor must be larger than 0",
                             ErrorCode.INVALID_REPLICATION_FACTOR)
        check_partition_limit(partitions, factor, live, replica_counts, max_broker_partitions)
        replicas = assign(partitions, factor, live)
    check_configs(configs, validate_configs)
    return replicas


def plan_partitions(count: int, assignment: list[list[int]] | None, current: Mapping[int, list[int]],
                    live: Mapping[int, str | None], replica_counts: Mapping[int, int],
                    max_broker_partitions: int) -> dict[int, list[int]]:
    """Validate a partition increase (CreatePartitions) and choose the new partitions' replicas."""
    n = len(current)
    if count <= n:
        raise KafkaError(f"Topic currently has {n} partitions, {count} would not be an "
                         "increase.", ErrorCode.INVALID_PARTITIONS)
    if assignment is not None:
        if len(assignment) != count - n:
            raise KafkaError(f"Increasing the number of partitions by {count - n} but "
                             f"{len(assignment)} assignments provided.",
                             ErrorCode.INVALID_REPLICA_ASSIGNMENT)
        new = {n + i: list(r) for i, r in enumerate(assignment)}
        check_assignment(new, n, set(live))
    else:
        factor = len(current[min(current)])
        check_partition_limit(count - n, factor, live, replica_counts, max_broker_partitions)
        new = assign(count - n, factor, live, start_partition=n)
    check_broker_limits(new, replica_counts, max_broker_partitions)
    return new


class TopicAdmin:
    """Admin changes as writes to the metadata store. `live_brokers` gives the brokers to
    assign replicas to (id -> rack), as the metadata cache of the calling broker knows them."""

    def __init__(self, store: MetadataStore, live_brokers: Callable[[], Mapping[int, str | None]],
                 validate_configs: Callable[[Mapping[str, str]], None],
                 replica_counts: Callable[[], Mapping[int, int]] = dict,
                 max_broker_partitions: Callable[[], int] = lambda: MAX_INT32) -> None:
        self.store = store
        self.live_brokers = live_brokers
        self.validate_configs = validate_configs
        self.replica_counts = replica_counts  # broker id -> partition replicas it holds now
        self.max_broker_partitions = max_broker_partitions

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
    ) -> tuple[uuid.UUID, dict[int, list[int]]]:
        """Validate and record a new topic; returns its id and replica assignment."""
        replicas = plan_topic(name, num_partitions, replication_factor, assignment, configs,
                              existing=self.store.children(znodes.TOPICS), live=dict(self.live_brokers()),
                              validate_configs=self.validate_configs, replica_counts=self.replica_counts(),
                              max_broker_partitions=self.max_broker_partitions(),
                              default_partitions=default_partitions,
                              default_replication_factor=default_replication_factor)
        topic_id = uuid.uuid4()
        if validate_only:
            return topic_id, replicas
        # Configs first: a broker that sees the topic reads its configs at once (Kafka's order).
        try:
            self.store.multi([
                Create(znodes.config_path("topics", name), {"version": 1, "config": dict(configs)}),
                Create(znodes.topic_path(name), znodes.encode_assignment(topic_id, replicas)),
            ])
        except NodeExists:
            raise KafkaError(f"Topic '{name}' already exists.", ErrorCode.TOPIC_ALREADY_EXISTS) from None
        return topic_id, replicas

    def is_recorded(self, name: str) -> bool:
        """Whether the store still holds a trace of the topic (its assignment, configs or
        deletion request, any of which stops a creation of the name): the controller removes
        them only once every replica's log is gone, after brokers' metadata has dropped it."""
        paths = (znodes.topic_path(name), znodes.config_path("topics", name), f"{znodes.DELETE_TOPICS}/{name}")
        return any(node is not None for node in self.store.get_many(list(paths)))

    def delete_topic(self, name: str) -> None:
        check_deletable(name)
        if self.store.get(znodes.topic_path(name)) is None:
            raise KafkaError("This server does not host this topic-partition.",
                             ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        try:
            self.store.create(f"{znodes.DELETE_TOPICS}/{name}")
        except NodeExists:
            pass  # already being deleted

    def create_partitions(self, name: str, count: int, assignment: list[list[int]] | None, *,
                          validate_only: bool = False) -> dict[int, list[int]]:
        node = self.store.get(znodes.topic_path(name))
        if node is None or self.store.get(f"{znodes.DELETE_TOPICS}/{name}") is not None:
            raise KafkaError("This server does not host this topic-partition.",
                             ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        if znodes.is_internal(name):
            # Which partition holds a group's offsets or a transaction's state is decided by
            # the partition count: more partitions would lose track of both.
            raise KafkaError(f"Topic {name} is an internal topic: its partition count cannot change",
                             ErrorCode.INVALID_PARTITIONS)
        data, version = node
        topic_id, current = znodes.decode_assignment(data)
        new = plan_partitions(count, assignment, current, dict(self.live_brokers()), self.replica_counts(),
                              self.max_broker_partitions())
        if not validate_only:
            self.store.multi([SetData(znodes.topic_path(name),
                                      znodes.encode_assignment(topic_id, {**current, **new}), version)])
        return new

    # -- configs

    def change_topic_config(self, name: str, configs: Mapping[str, str], *,
                            validate_only: bool = False) -> None:
        if self.store.get(znodes.topic_path(name)) is None:
            raise KafkaError(f"Topic {name} does not exist.", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        policy = {p.strip() for p in configs.get("cleanup.policy", "").split(",")}
        if znodes.is_internal(name) and policy != {"compact"}:
            # Deleting by age or size would take committed offsets and transaction states
            # with it (the broker default policy is delete, so the override must stay).
            raise KafkaError(f"Topic {name} is an internal topic: its cleanup.policy must stay compact",
                             ErrorCode.INVALID_CONFIG)
        check_configs(configs, self.validate_configs)
        if not validate_only:
            self._change_config("topics", name, configs)

    def change_broker_config(self, entity: str, configs: Mapping[str, str]) -> None:
        """Dynamic configs of broker `entity` (an id, or "<default>" for the cluster default)."""
        self._change_config("brokers", entity, configs)

    def change_client_config(self, path: str, configs: Mapping[str, str]) -> None:
        """Configs of a user, client id or IP (SCRAM credentials, quotas) at `path` under
        /config: "users/alice", "users/alice/clients/app", "clients/<default>", "ips/10.0.0.1"."""
        entity_type, _, name = path.partition("/")
        self._change_config(entity_type, name, configs)

    def _change_config(self, entity_type: str, name: str, configs: Mapping[str, str]) -> None:
        self.store.set(znodes.config_path(entity_type, name), {"version": 1, "config": dict(configs)})
        created = self.store.create(f"{znodes.CONFIG_CHANGES}/{znodes.CONFIG_CHANGE_PREFIX}",
                                    znodes.config_change(f"{entity_type}/{name}"), sequential=True)
        self._purge_changes(created.rsplit("/", 1)[1])

    def _purge_changes(self, newest: str) -> None:
        keep_from = int(newest[len(znodes.CONFIG_CHANGE_PREFIX):]) - KEEP_CONFIG_CHANGES
        for child in self.store.children(znodes.CONFIG_CHANGES):
            seq = child[len(znodes.CONFIG_CHANGE_PREFIX):]
            if seq.isdigit() and int(seq) < keep_from:
                self.store.delete(f"{znodes.CONFIG_CHANGES}/{child}")


def read_configs(store: MetadataStore, entity_type: str, name: str) -> dict[str, str]:
    node = store.get(znodes.config_path(entity_type, name))
    return dict(node[0].get("config") or {}) if node and node[0] else {}
