"""MetadataImage: the cluster's metadata as the KRaft log says it, replayed record by record.

Every controller applies the committed records of `__cluster_metadata` to its image in log
order (Kafka's MetadataDelta + MetadataImage, kept here as one structure changed in place), and
writes the image back as records for a snapshot (`records()`, in the order Kafka's
MetadataImage.write uses: features first, so a reader knows metadata.version before anything
else). A partition's state is never changed in place: a change replaces its PartitionState, so a
`copy()` (dicts copied, states shared) stays what it was while the image moves on, and a
snapshot can be encoded from it off the event loop.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from strom.metadata import records as r
from strom.metadata.model import SECURITY_PROTOCOLS, EndPoint, PartitionState
from strom.protocol.scram import MECHANISM_BY_ID, ScramCredential

NO_LEADER_CHANGE = -2  # PartitionChangeRecord.Leader when the leader stays
# BrokerRegistrationChangeRecord's Fenced: Kafka's BrokerRegistrationFencingChange.
FENCE, UNFENCE = 1, -1
# ConfigRecord / DescribeConfigs resource types.
TOPIC_RESOURCE, BROKER_RESOURCE, GROUP_RESOURCE = 2, 4, 32
_PROTOCOL_NAMES = {v: k for k, v in SECURITY_PROTOCOLS.items()}

Entity = tuple[tuple[str, str | None], ...]  # a client quota entity: ((type, name), ...) sorted


@dataclass(slots=True)
class BrokerRegistration:
    """A broker as RegisterBrokerRecord and its changes describe it (Kafka's BrokerRegistration)."""

    id: int
    epoch: int
    incarnation_id: uuid.UUID | None
    endpoints: list[EndPoint]
    rack: str | None = None
    fenced: bool = True
    in_controlled_shutdown: bool = False
    features: dict[str, tuple[int, int]] = field(default_factory=dict)
    log_dirs: list[uuid.UUID] = field(default_factory=list)
    cordoned_log_dirs: list[uuid.UUID] = field(default_factory=list)  # KIP-1066, from its heartbeats

    @property
    def cordoned(self) -> bool:
        """Every log dir it registered is cordoned: it takes no new replica."""
        return bool(self.log_dirs) and set(self.log_dirs) <= set(self.cordoned_log_dirs)

    def to_record(self) -> Any:
        rec = r.RegisterBrokerRecord
        return rec(broker_id=self.id, incarnation_id=self.incarnation_id, broker_epoch=self.epoch,
                   end_points=[rec.BrokerEndpoint(name=e.listener, host=e.host, port=e.port,
                                                  security_protocol=SECURITY_PROTOCOLS.get(e.security_protocol, 0))
                               for e in self.endpoints],
                   features=[rec.BrokerFeature(name=n, min_supported_version=lo, max_supported_version=hi)
                             for n, (lo, hi) in sorted(self.features.items())],
                   rack=self.rack, fenced=self.fenced, in_controlled_shutdown=self.in_controlled_shutdown,
                   log_dirs=list(self.log_dirs))

    @classmethod
    def from_record(cls, rec: Any) -> BrokerRegistration:
        return cls(rec.broker_id, rec.broker_epoch, rec.incarnation_id,
                   [EndPoint(e.name, e.host, e.port, _PROTOCOL_NAMES.get(e.security_protocol, "PLAINTEXT"))
                    for e in rec.end_points],
                   rec.rack, rec.fenced, rec.in_controlled_shutdown,
                   {f.name: (f.min_supported_version, f.max_supported_version) for f in rec.features},
                   list(rec.log_dirs or []))


@dataclass(slots=True)
class TopicImage:
    name: str
    topic_id: uuid.UUID
    partitions: dict[int, PartitionState] = field(default_factory=dict)


def partition_state(rec: Any) -> PartitionState:
    """A PartitionRecord as the controller's partition state (partition epoch in zk_version)."""
    return PartitionState(rec.leader, rec.leader_epoch, list(rec.isr), list(rec.replicas), -1,
                          rec.partition_epoch, list(rec.adding_replicas), list(rec.removing_replicas),
                          rec.leader_recovery_state, list(rec.directories) if rec.directories else None,
                          list(rec.eligible_leader_replicas or []), list(rec.last_known_elr or []))


def partition_record(topic_id: uuid.UUID, index: int, s: PartitionState) -> Any:
    return r.PartitionRecord(partition_id=index, topic_id=topic_id, replicas=list(s.replicas), isr=list(s.isr),
                             removing_replicas=list(s.removing), adding_replicas=list(s.adding), leader=s.leader,
                             leader_recovery_state=s.leader_recovery_state, leader_epoch=s.leader_epoch,
                             partition_epoch=s.zk_version,
                             directories=list(s.directories) if s.directories is not None
                             else [None] * len(s.replicas),
                             eligible_leader_replicas=list(s.elr) if s.elr else None,
                             last_known_elr=list(s.last_known_elr) if s.last_known_elr else None)


def merge_change(s: PartitionState, rec: Any) -> PartitionState:
    """Kafka's PartitionRegistration.merge: what a PartitionChangeRecord names changes; a new
    leader (or the same one named again) starts a leader epoch; every change is a partition epoch."""
    leader, leader_epoch = s.leader, s.leader_epoch
    if rec.leader != NO_LEADER_CHANGE:
        leader, leader_epoch = rec.leader, s.leader_epoch + 1
    replicas = s.replicas if rec.replicas is None else list(rec.replicas)
    directories = s.directories if rec.directories is None else list(rec.directories)
    if rec.replicas is not None and rec.directories is None:
        directories = None  # replicas changed without their dirs: unassigned
    return replace(s, leader=leader, leader_epoch=leader_epoch,
                   isr=s.isr if rec.isr is None else list(rec.isr), replicas=replicas,
                   removing=s.removing if rec.removing_replicas is None else list(rec.removing_replicas),
                   adding=s.adding if rec.adding_replicas is None else list(rec.adding_replicas),
                   leader_recovery_state=(s.leader_recovery_state if rec.leader_recovery_state == -1
                                          else rec.leader_recovery_state),
                   directories=directories, zk_version=s.zk_version + 1,
                   elr=s.elr if rec.eligible_leader_replicas is None else list(rec.eligible_leader_replicas),
                   last_known_elr=s.last_known_elr if rec.last_known_elr is None else list(rec.last_known_elr))


class MetadataImage:
    def __init__(self) -> None:
        self.features: dict[str, int] = {}
        self.brokers: dict[int, BrokerRegistration] = {}
        self.controllers: dict[int, Any] = {}  # RegisterControllerRecord by controller id
        self.topics: dict[str, TopicImage] = {}
        self.topics_by_id: dict[uuid.UUID, TopicImage] = {}
        self.configs: dict[tuple[int, str], dict[str, str]] = {}  # (resource type, name) -> configs
        self.client_quotas: dict[Entity, dict[str, float]] = {}
        self.scram: dict[tuple[str, int], Any] = {}  # (user, mechanism) -> UserScramCredentialRecord
        self.acls: dict[uuid.UUID, Any] = {}  # AccessControlEntryRecord by id
        self.acl_version = 0  # counts changes to `acls`, for who keeps a copy of them
        self.delegation_tokens: dict[str, Any] = {}  # DelegationTokenRecord by token id
        self.token_version = 0  # counts changes to `delegation_tokens`, as acl_version
        self.next_producer_id = 0
        self.end_offset = 0  # the log offset the image has applied up to (exclusive)
        self.partition_count = 0
        self.replica_counts: dict[int, int] = {}  # broker id -> partition replicas assigned to it
        # KIP-868: the records of a metadata transaction are applied when it ends, all at once.
        self.transaction: list[Any] | None = None

    # --- replay ------------------------------------------------------------------------------

    def replay(self, rec: Any) -> None:
        """Apply one record (decoded). Unknown kinds are refused: a log this software cannot
        read must not be half applied."""
        kind = type(rec)
        if self.transaction is not None and kind not in _TRANSACTION_MARKERS:
            self.transaction.append(rec)
            return
        handler = _REPLAY.get(kind)
        if handler is None:
            raise ValueError(f"cannot replay {kind.__name__}")
        handler(self, rec)

    def replay_values(self, values: list[bytes]) -> None:
        for value in values:
            self.replay(r.decode(value))

    def _register_broker(self, rec: Any) -> None:
        self.brokers[rec.broker_id] = BrokerRegistration.from_record(rec)

    def _unregister_broker(self, rec: Any) -> None:
        b = self.brokers.get(rec.broker_id)
        if b is not None and (rec.broker_epoch < 0 or b.epoch == rec.broker_epoch):
            del self.brokers[rec.broker_id]

    def _broker(self, broker_id: int, epoch: int) -> BrokerRegistration | None:
        b = self.brokers.get(broker_id)
        return b if b is not None and b.epoch == epoch else None

    def _fence(self, rec: Any) -> None:
        if (b := self._broker(rec.id, rec.epoch)) is not None:
            self.brokers[b.id] = replace(b, fenced=True)

    def _unfence(self, rec: Any) -> None:
        if (b := self._broker(rec.id, rec.epoch)) is not None:
            self.brokers[b.id] = replace(b, fenced=False)

    def _broker_change(self, rec: Any) -> None:
        b = self._broker(rec.broker_id, rec.broker_epoch)
        if b is None:
            return
        fenced = True if rec.fenced == FENCE else False if rec.fenced == UNFENCE else b.fenced
        shutdown = b.in_controlled_shutdown or rec.in_controlled_shutdown == 1
        self.brokers[b.id] = replace(b, fenced=fenced, in_controlled_shutdown=shutdown,
                                     log_dirs=list(rec.log_dirs) if rec.log_dirs else b.log_dirs,
                                     cordoned_log_dirs=b.cordoned_log_dirs if rec.cordoned_log_dirs is None
                                     else list(rec.cordoned_log_dirs))

    def _topic(self, rec: Any) -> None:
        topic = TopicImage(rec.name, rec.topic_id)
        self.topics[rec.name] = topic
        self.topics_by_id[rec.topic_id] = topic

    def _count(self, replicas: list[int], delta: int) -> None:
        counts = self.replica_counts
        for b in replicas:
            n = counts.get(b, 0) + delta
            if n:
                counts[b] = n
            else:
                counts.pop(b, None)

    def _put(self, topic: TopicImage, index: int, state: PartitionState) -> None:
        old = topic.partitions.get(index)
        if old is None:
            self.partition_count += 1
        elif old.replicas is not state.replicas:
            self._count(old.replicas, -1)
        if old is None or old.replicas is not state.replicas:
            self._count(state.replicas, 1)
        topic.partitions[index] = state

    def _partition(self, rec: Any) -> None:
        topic = self.topics_by_id.get(rec.topic_id)
        if topic is None:
            raise ValueError(f"PartitionRecord for unknown topic id {rec.topic_id}")
        self._put(topic, rec.partition_id, partition_state(rec))

    def _partition_change(self, rec: Any) -> None:
        topic = self.topics_by_id.get(rec.topic_id)
        state = topic.partitions.get(rec.partition_id) if topic is not None else None
        if state is None:
            raise ValueError(f"PartitionChangeRecord for unknown partition {rec.topic_id}-{rec.partition_id}")
        self._put(topic, rec.partition_id, merge_change(state, rec))

    def _remove_topic(self, rec: Any) -> None:
        topic = self.topics_by_id.pop(rec.topic_id, None)
        if topic is not None:
            del self.topics[topic.name]
            self.partition_count -= len(topic.partitions)
            for state in topic.partitions.values():
                self._count(state.replicas, -1)
            self.configs.pop((TOPIC_RESOURCE, topic.name), None)

    def _config(self, rec: Any) -> None:
        key = (rec.resource_type, rec.resource_name)
        if rec.value is None:
            entity = self.configs.get(key)
            if entity is not None:
                entity.pop(rec.name, None)
                if not entity:
                    del self.configs[key]
        else:
            self.configs.setdefault(key, {})[rec.name] = rec.value

    def _feature(self, rec: Any) -> None:
        if rec.feature_level == 0:
            self.features.pop(rec.name, None)
        else:
            self.features[rec.name] = rec.feature_level

    def _quota(self, rec: Any) -> None:
        entity = tuple(sorted((e.entity_type, e.entity_name) for e in rec.entity))
        if rec.remove:
            values = self.client_quotas.get(entity)
            if values is not None:
                values.pop(rec.key, None)
                if not values:
                    del self.client_quotas[entity]
        else:
            self.client_quotas.setdefault(entity, {})[rec.key] = rec.value

    def _producer_ids(self, rec: Any) -> None:
        self.next_producer_id = rec.next_producer_id

    def _acl(self, rec: Any) -> None:
        self.acls[rec.id] = rec
        self.acl_version += 1

    def _remove_acl(self, rec: Any) -> None:
        self.acls.pop(rec.id, None)
        self.acl_version += 1

    def _scram(self, rec: Any) -> None:
        self.scram[(rec.name, rec.mechanism)] = rec

    def _remove_scram(self, rec: Any) -> None:
        self.scram.pop((rec.name, rec.mechanism), None)

    def _token(self, rec: Any) -> None:
        self.delegation_tokens[rec.token_id] = rec
        self.token_version += 1

    def _remove_token(self, rec: Any) -> None:
        self.delegation_tokens.pop(rec.token_id, None)
        self.token_version += 1

    def _controller(self, rec: Any) -> None:
        self.controllers[rec.controller_id] = rec

    def _begin_transaction(self, rec: Any) -> None:
        self.transaction = []

    def _end_transaction(self, rec: Any) -> None:
        records, self.transaction = self.transaction or [], None
        for x in records:
            self.replay(x)

    def _abort_transaction(self, rec: Any) -> None:
        self.transaction = None

    def _ignore(self, rec: Any) -> None:
        pass

    # --- reading -------------------------------------------------------------------------------

    def partitions(self) -> Iterator[tuple[TopicImage, int, PartitionState]]:
        for topic in self.topics.values():
            for index, state in topic.partitions.items():
                yield topic, index, state

    def scram_credentials(self, user: str | None = None) -> Iterator[tuple[str, str, ScramCredential]]:
        """(user, mechanism name, credential) of every SCRAM credential, or of `user`'s."""
        for (name, mechanism), rec in list(self.scram.items()):
            if user is None or name == user:
                yield name, MECHANISM_BY_ID.get(mechanism, ""), ScramCredential(rec.salt, rec.stored_key,
                                                                                 rec.server_key, rec.iterations)

    def topic_configs(self, name: str) -> dict[str, str]:
        return dict(self.configs.get((TOPIC_RESOURCE, name), {}))

    def copy(self) -> MetadataImage:
        """A copy that does not change when this image does (states are shared: never mutated)."""
        out = MetadataImage.__new__(MetadataImage)
        out.__dict__.update(self.__dict__)
        # An open metadata transaction's records too: the copy goes on replaying into its own.
        out.transaction = None if self.transaction is None else list(self.transaction)
        out.features = dict(self.features)
        out.brokers = dict(self.brokers)
        out.controllers = dict(self.controllers)
        out.topics = {n: TopicImage(t.name, t.topic_id, dict(t.partitions)) for n, t in self.topics.items()}
        out.topics_by_id = {t.topic_id: t for t in out.topics.values()}
        out.configs = {k: dict(v) for k, v in self.configs.items()}
        out.client_quotas = {k: dict(v) for k, v in self.client_quotas.items()}
        out.replica_counts = dict(self.replica_counts)
        out.scram = dict(self.scram)
        out.acls = dict(self.acls)
        out.delegation_tokens = dict(self.delegation_tokens)
        return out

    # --- writing back (snapshots) ----------------------------------------------------------------

    def records(self) -> Iterator[Any]:
        """The image as records, in Kafka's snapshot order (metadata.version first)."""
        for name in sorted(self.features, key=lambda n: (n != "metadata.version", n)):
            yield r.FeatureLevelRecord(name=name, feature_level=self.features[name])
        for broker in self.brokers.values():
            yield broker.to_record()
            if broker.cordoned_log_dirs:
                yield r.BrokerRegistrationChangeRecord(broker_id=broker.id, broker_epoch=broker.epoch,
                                                       cordoned_log_dirs=list(broker.cordoned_log_dirs))
        yield from self.controllers.values()
        for topic in self.topics.values():
            yield r.TopicRecord(name=topic.name, topic_id=topic.topic_id)
            for index, state in topic.partitions.items():
                yield partition_record(topic.topic_id, index, state)
        for (kind, name), values in self.configs.items():
            for key, value in values.items():
                yield r.ConfigRecord(resource_type=kind, resource_name=name, name=key, value=value)
        for entity, values in self.client_quotas.items():
            for key, value in values.items():
                yield r.ClientQuotaRecord(entity=[r.ClientQuotaRecord.EntityData(entity_type=t, entity_name=n)
                                                  for t, n in entity], key=key, value=value, remove=False)
        if self.next_producer_id:
            yield r.ProducerIdsRecord(broker_id=-1, broker_epoch=-1, next_producer_id=self.next_producer_id)
        yield from self.acls.values()
        yield from self.scram.values()
        yield from self.delegation_tokens.values()

    def encode(self) -> list[bytes]:
        return [r.encode(rec) for rec in self.records()]


_REPLAY = {
    r.RegisterBrokerRecord: MetadataImage._register_broker,
    r.UnregisterBrokerRecord: MetadataImage._unregister_broker,
    r.FenceBrokerRecord: MetadataImage._fence,
    r.UnfenceBrokerRecord: MetadataImage._unfence,
    r.BrokerRegistrationChangeRecord: MetadataImage._broker_change,
    r.TopicRecord: MetadataImage._topic,
    r.PartitionRecord: MetadataImage._partition,
    r.PartitionChangeRecord: MetadataImage._partition_change,
    r.RemoveTopicRecord: MetadataImage._remove_topic,
    r.ConfigRecord: MetadataImage._config,
    r.FeatureLevelRecord: MetadataImage._feature,
    r.ClientQuotaRecord: MetadataImage._quota,
    r.ProducerIdsRecord: MetadataImage._producer_ids,
    r.AccessControlEntryRecord: MetadataImage._acl,
    r.RemoveAccessControlEntryRecord: MetadataImage._remove_acl,
    r.UserScramCredentialRecord: MetadataImage._scram,
    r.RemoveUserScramCredentialRecord: MetadataImage._remove_scram,
    r.DelegationTokenRecord: MetadataImage._token,
    r.RemoveDelegationTokenRecord: MetadataImage._remove_token,
    r.RegisterControllerRecord: MetadataImage._controller,
    r.NoOpRecord: MetadataImage._ignore,
    r.RECORD_TYPES[21].cls: MetadataImage._ignore,  # ZkMigrationStateRecord: no migrations here
    r.BeginTransactionRecord: MetadataImage._begin_transaction,
    r.EndTransactionRecord: MetadataImage._end_transaction,
    r.AbortTransactionRecord: MetadataImage._abort_transaction,
}
_TRANSACTION_MARKERS = (r.EndTransactionRecord, r.AbortTransactionRecord, r.BeginTransactionRecord)
