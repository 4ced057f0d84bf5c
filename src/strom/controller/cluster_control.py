"""What the quorum controller writes for brokers, features and configs (Kafka's
ClusterControlManager, BrokerHeartbeatManager, FeatureControlManager and
ConfigurationControlManager).

Brokers register (RegisterBrokerRecord, fenced, their epoch the offset the record is written
at) and then heartbeat: a broker caught up to its registration is unfenced; one that asks to be
fenced, or whose heartbeats stop for `broker.session.timeout.ms`, is fenced and loses its
leaderships and ISR places; one that wants to shut down moves its leaderships away first
(controlled shutdown) and is told to go once it leads nothing. Sessions live in the active
controller's memory only, as in Kafka: a new active controller gives every broker a fresh one.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from strom.controller import features as feature_rules
from strom.controller.replication_control import (
    Change,
    Limits,
    fence_changes,
    leaders_for_returning,
    led_by,
    shutdown_changes,
    unclean_shutdown_changes,
)
from strom.log.config import check_remote_storage_change
from strom.metadata import records as r
from strom.metadata.image import (
    BROKER_RESOURCE,
    FENCE,
    GROUP_RESOURCE,
    TOPIC_RESOURCE,
    UNFENCE,
    MetadataImage,
)
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.scram import MECHANISM_BY_ID, scram_credential

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3  # IncrementalAlterConfigs operations


@dataclass
class BrokerSession:
    last_heartbeat: float  # monotonic seconds
    registered_at: int  # offset of its RegisterBrokerRecord: caught up once its metadata is past it
    let_go: bool = False  # its controlled shutdown ended: it was told it may go


def register_broker(image: MetadataImage, request: Any, cluster_id: str | None, epoch: int,
                    sessions: Mapping[int, BrokerSession], now: float, session_timeout_s: float,
                    limits: Limits | None = None) -> Change:
    """BrokerRegistration: a RegisterBrokerRecord at broker epoch `epoch`, fenced until it has
    caught up. A second process with the same id is refused while the first one's session lives.
    A new process of a broker that did not shut down cleanly first leaves every ISR and ELR."""
    if cluster_id is not None and request.cluster_id != cluster_id:
        raise KafkaError(f"Expected cluster ID {cluster_id}, but got cluster ID {request.cluster_id}",
                         ErrorCode.INCONSISTENT_CLUSTER_ID)
    existing = image.brokers.get(request.broker_id)
    session = sessions.get(request.broker_id)
    if (existing is not None and existing.incarnation_id != request.incarnation_id and session is not None
            and now - session.last_heartbeat < session_timeout_s and not existing.fenced):
        raise KafkaError(f"Another broker is registered with that broker id {request.broker_id}.",
                         ErrorCode.DUPLICATE_BROKER_REGISTRATION)
    log_dirs = list(getattr(request, "log_dirs", None) or [])
    if image.features.get("metadata.version", 0) >= DIRECTORY_ASSIGNMENT_METADATA_VERSION:
        check_log_dirs(image, request.broker_id, log_dirs)
    cleanup = []
    if existing is None or existing.incarnation_id != request.incarnation_id:
        if not shut_down_cleanly(existing, request, sessions.get(request.broker_id)):
            cleanup = unclean_shutdown_changes(image, request.broker_id, limits or Limits())
    rec = r.RegisterBrokerRecord
    record = rec(broker_id=request.broker_id, incarnation_id=request.incarnation_id, broker_epoch=epoch,
                 end_points=[rec.BrokerEndpoint(name=x.name, host=x.host, port=x.port,
                                                security_protocol=x.security_protocol) for x in request.listeners],
                 features=[rec.BrokerFeature(name=f.name, min_supported_version=f.min_supported_version,
                                             max_supported_version=f.max_supported_version)
                           for f in request.features],
                 rack=request.rack, fenced=True, in_controlled_shutdown=False,
                 log_dirs=log_dirs)
    return Change([*cleanup, record], epoch)


def shut_down_cleanly(existing: Any, request: Any, session: BrokerSession | None) -> bool:
    """KIP-966: a broker that comes back names the epoch it had when it last shut down cleanly
    (PreviousBrokerEpoch, from its logs' clean-shutdown markers); any other value means its logs
    may have lost unflushed records."""
    if existing is None:
        return False
    previous = getattr(request, "previous_broker_epoch", -1)
    return previous >= 0 and previous == existing.epoch


# Kafka's MetadataVersion.IBP_3_7_IV2: brokers register their log directories (KIP-858).
DIRECTORY_ASSIGNMENT_METADATA_VERSION = 17


def check_log_dirs(image: MetadataImage, broker_id: int, log_dirs: list[uuid.UUID]) -> None:
    """KIP-858's rules for the directory ids a broker registers: some, none of the 100 reserved
    ids (Kafka's DirectoryId: unassigned, lost, ...), no id twice, none another broker has."""
    def invalid(message: str) -> KafkaError:
        return KafkaError(message, ErrorCode.INVALID_REGISTRATION)

    if not log_dirs:
        raise invalid("No directories specified in request")
    if any(d.int < 100 for d in log_dirs):
        raise invalid("Reserved directory ID in request")
    if len(set(log_dirs)) != len(log_dirs):
        raise invalid("Duplicate directory ID in request")
    for other in image.brokers.values():
        if other.id != broker_id and (taken := set(other.log_dirs) & set(log_dirs)):
            raise invalid(f"Broker {other.id} is already registered with directory {taken.pop()}")


@dataclass
class Heartbeat:
    is_caught_up: bool
    is_fenced: bool
    should_shut_down: bool


def steady_heartbeat(image: MetadataImage, request: Any, session: BrokerSession | None) -> Heartbeat | None:
    """The answer to a heartbeat that changes nothing (the usual one: an unfenced broker that
    stays, or a fenced one still catching up), read from one registration; None when the
    heartbeat may need records and must wait its turn among the controller's events."""
    broker = image.brokers.get(request.broker_id)
    if (broker is None or session is None or broker.epoch != request.broker_epoch or request.want_shut_down
            or broker.in_controlled_shutdown or _cordon_change(broker, request) is not None):
        return None
    caught_up = request.current_metadata_offset >= session.registered_at
    if not broker.fenced and not request.want_fence:
        return Heartbeat(caught_up, False, False)
    if broker.fenced and not caught_up:
        return Heartbeat(False, True, False)
    return None


def heartbeat(image: MetadataImage, request: Any, session: BrokerSession | None, limits: Limits) -> Change:
    """BrokerHeartbeat: the broker's next state and the records that get it there."""
    broker = image.brokers.get(request.broker_id)
    if broker is None:
        raise KafkaError(f"Broker {request.broker_id} is not registered.", ErrorCode.BROKER_ID_NOT_REGISTERED)
    if broker.epoch != request.broker_epoch or session is None:
        raise KafkaError(f"Expected broker epoch {broker.epoch}, but got {request.broker_epoch}",
                         ErrorCode.STALE_BROKER_EPOCH)
    caught_up = request.current_metadata_offset >= session.registered_at
    out = Change(result=Heartbeat(caught_up, broker.fenced, False))
    cordoned = _cordon_change(broker, request)
    if cordoned is not None:
        out.records.append(r.BrokerRegistrationChangeRecord(broker_id=broker.id, broker_epoch=broker.epoch,
                                                            cordoned_log_dirs=cordoned))
    if request.want_shut_down:
        if not broker.in_controlled_shutdown:
            out.records.append(r.BrokerRegistrationChangeRecord(broker_id=broker.id, broker_epoch=broker.epoch,
                                                                in_controlled_shutdown=1))
            out.records += shutdown_changes(image, broker.id, limits)
        elif led_by(image, broker.id):  # another broker can take these since it asked: move them
            out.records += shutdown_changes(image, broker.id, limits)
        else:
            # Nothing left to move: it may go, and is fenced so that nobody waits for it.
            out.records.append(r.BrokerRegistrationChangeRecord(broker_id=broker.id, broker_epoch=broker.epoch,
                                                                fenced=FENCE))
            out.records += fence_changes(image, broker.id, limits)
            out.result = Heartbeat(caught_up, True, True)
        return out
    if broker.fenced and not request.want_fence and caught_up:
        out.records.append(r.BrokerRegistrationChangeRecord(broker_id=broker.id, broker_epoch=broker.epoch,
                                                            fenced=UNFENCE))
        out.records += leaders_for_returning(image, broker.id, limits)
        out.result = Heartbeat(True, False, False)
    elif not broker.fenced and request.want_fence:
        out.records.append(r.BrokerRegistrationChangeRecord(broker_id=broker.id, broker_epoch=broker.epoch,
                                                            fenced=FENCE))
        out.records += fence_changes(image, broker.id, limits)
        out.result = Heartbeat(caught_up, True, False)
    return out


def _cordon_change(broker: Any, request: Any) -> list[uuid.UUID] | None:
    """KIP-1066: the broker's cordoned log dirs (of those it registered) when its heartbeat
    names others than the metadata has; None when unchanged or not said (BrokerHeartbeat < v2)."""
    named = getattr(request, "cordoned_log_dirs", None)
    if named is None:
        return None
    cordoned = [d for d in broker.log_dirs if d in set(named)]
    return None if cordoned == broker.cordoned_log_dirs else cordoned


def expire_session(image: MetadataImage, broker_id: int, limits: Limits) -> list[Any]:
    """broker.session.timeout.ms passed without a heartbeat: fence it."""
    broker = image.brokers.get(broker_id)
    if broker is None or broker.fenced:
        return []
    return [r.BrokerRegistrationChangeRecord(broker_id=broker_id, broker_epoch=broker.epoch, fenced=FENCE),
            *fence_changes(image, broker_id, limits)]


def unregister_broker(image: MetadataImage, broker_id: int, limits: Limits) -> list[Any]:
    broker = image.brokers.get(broker_id)
    if broker is None:
        raise KafkaError(f"Broker {broker_id} is not registered.", ErrorCode.BROKER_ID_NOT_REGISTERED)
    out = [] if broker.fenced else fence_changes(image, broker_id, limits)
    return [*out, r.UnregisterBrokerRecord(broker_id=broker_id, broker_epoch=broker.epoch)]


PRODUCER_ID_BLOCK = 1000  # ids handed out per AllocateProducerIds, as Kafka's block size


def allocate_producer_ids(image: MetadataImage, broker_id: int, broker_epoch: int) -> Change:
    """AllocateProducerIds (KIP-730): the next block of producer ids for a live broker, recorded
    (ProducerIdsRecord) before it is handed out, so no id is ever given twice."""
    broker = image.brokers.get(broker_id)
    if broker is None:
        raise KafkaError(f"Broker {broker_id} is not registered.", ErrorCode.BROKER_ID_NOT_REGISTERED)
    if broker_epoch != broker.epoch:
        raise KafkaError(f"Expected broker epoch {broker.epoch}, but got {broker_epoch}", ErrorCode.STALE_BROKER_EPOCH)
    start = image.next_producer_id
    return Change([r.ProducerIdsRecord(broker_id=broker_id, broker_epoch=broker_epoch,
                                       next_producer_id=start + PRODUCER_ID_BLOCK)], (start, PRODUCER_ID_BLOCK))


def create_acls(image: MetadataImage, creations: list[Any]) -> list[Any]:
    """CreateAcls: an AccessControlEntryRecord for each ACL the image does not hold yet."""
    held = {_acl_key(rec) for rec in image.acls.values()}
    out = []
    for c in creations:
        key = (c.resource_type, c.resource_name, c.resource_pattern_type, c.principal, c.host, c.operation,
               c.permission_type)
        if key not in held:
            held.add(key)
            out.append(r.AccessControlEntryRecord(
                id=uuid.uuid4(), resource_type=c.resource_type, resource_name=c.resource_name,
                pattern_type=c.resource_pattern_type, principal=c.principal, host=c.host, operation=c.operation,
                permission_type=c.permission_type))
    return out


def _acl_key(rec: Any) -> tuple:
    return (rec.resource_type, rec.resource_name, rec.pattern_type, rec.principal, rec.host, rec.operation,
            rec.permission_type)


@dataclass(frozen=True)
class AclView:
    """An ACL record as the authorizer's filters read an ACL."""

    principal: str
    host: str
    operation: int
    permission: int


def delete_acls(image: MetadataImage, filters: list[Any]) -> Change:
    """DeleteAcls: each filter's matching ACLs removed. Result: the removed records, per filter."""
    out = Change(result=[])
    gone: set[uuid.UUID] = set()
    for f in filters:
        matched = [rec for rec in image.acls.values() if rec.id not in gone
                   and f.matches_resource((rec.resource_type, rec.pattern_type, rec.resource_name))
                   and f.matches_acl(AclView(rec.principal, rec.host, rec.operation, rec.permission_type))]
        gone.update(rec.id for rec in matched)
        out.records += [r.RemoveAccessControlEntryRecord(id=rec.id) for rec in matched]
        out.result.append(matched)
    return out


def quota_records(entity: list[dict], updates: Mapping[str, str | None]) -> list[Any]:
    """AlterClientQuotas of one entity: a ClientQuotaRecord per key set or removed."""
    data = [r.ClientQuotaRecord.EntityData(entity_type=e["entity_type"], entity_name=e["entity_name"])
            for e in entity]
    return [r.ClientQuotaRecord(entity=data, key=key, value=0.0 if value is None else float(value),
                                remove=value is None) for key, value in updates.items()]


def scram_records(user: str, ops: list[tuple[str, int, Any]]) -> list[Any]:
    """AlterUserScramCredentials of one user (checked): what the server keeps of each new
    password (RFC 5802's stored and server keys), or the credential's removal."""
    out = []
    for op, mechanism, item in ops:
        if op == "delete":
            out.append(r.RemoveUserScramCredentialRecord(name=user, mechanism=mechanism))
        else:
            cred = scram_credential(MECHANISM_BY_ID[mechanism], bytes(item.salted_password), bytes(item.salt),
                                    item.iterations)
            out.append(r.UserScramCredentialRecord(name=user, mechanism=mechanism, salt=cred.salt,
                                                   stored_key=cred.stored_key, server_key=cred.server_key,
                                                   iterations=cred.iterations))
    return out


# --- features --------------------------------------------------------------------------------------

def bootstrap_records(levels: Mapping[str, int]) -> list[Any]:
    """What a new cluster's first active controller writes: the finalized feature levels
    (metadata.version first), from the bootstrap checkpoint `strom storage format` wrote."""
    return [r.FeatureLevelRecord(name=name, feature_level=level)
            for name, level in sorted(levels.items(), key=lambda kv: (kv[0] != feature_rules.METADATA_VERSION, kv[0]))]


def update_features(image: MetadataImage, updates: list[feature_rules.FeatureUpdate]) -> Change:
    """UpdateFeatures: the ZooKeeper controller's rules (features.plan_updates), all or nothing,
    recorded as FeatureLevelRecords (level 0 removes a feature)."""
    levels, results = feature_rules.plan_updates(dict(image.features), updates)
    out = Change(result=results)
    if any(code != ErrorCode.NONE for code, _ in results.values()):
        return out
    for name in sorted(set(levels) | set(image.features)):
        if levels.get(name, 0) != image.features.get(name, 0):
            out.records.append(r.FeatureLevelRecord(name=name, feature_level=levels.get(name, 0)))
    return out


# --- configs ---------------------------------------------------------------------------------------

def alter_configs(image: MetadataImage, resource_type: int, name: str, ops: list[tuple[int, str, str | None]],
                  validate: Callable[[int, str, dict[str, str]], None], list_keys: Callable[[str], bool]) -> list[Any]:
    """IncrementalAlterConfigs of one topic, broker or group resource: SET, DELETE, APPEND, SUBTRACT
    (the last two on list-valued configs), validated as a whole, recorded as ConfigRecords."""
    if resource_type == TOPIC_RESOURCE and name not in image.topics:
        raise KafkaError(f"Topic {name} does not exist.", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    if resource_type not in (TOPIC_RESOURCE, BROKER_RESOURCE, GROUP_RESOURCE):
        raise KafkaError(f"unsupported resource type {resource_type}", ErrorCode.INVALID_REQUEST)
    current = dict(image.configs.get((resource_type, name), {}))
    configs = dict(current)
    for op, key, value in ops:
        if op == SET:
            configs[key] = value
        elif op == DELETE:
            configs.pop(key, None)
        elif op in (APPEND, SUBTRACT):
            if not list_keys(key):
                raise KafkaError(f"{('APPEND', 'SUBTRACT')[op == SUBTRACT]} operation is not allowed for "
                                 f"config key {key} which is not of list type", ErrorCode.INVALID_CONFIG)
            items = [x for x in (configs.get(key) or "").split(",") if x]
            given = [x.strip() for x in (value or "").split(",") if x.strip()]
            items = items + [x for x in given if x not in items] if op == APPEND else [x for x in items if x not in given]
            configs[key] = ",".join(items)
        else:
            raise KafkaError(f"unknown config operation {op}", ErrorCode.INVALID_REQUEST)
    validate(resource_type, name, configs)
    if resource_type == TOPIC_RESOURCE:
        try:
            check_remote_storage_change(current, configs)
        except ValueError as e:
            raise KafkaError(str(e), ErrorCode.INVALID_CONFIG) from None
    out = [r.ConfigRecord(resource_type=resource_type, resource_name=name, name=k, value=v)
           for k, v in configs.items() if current.get(k) != v]
    out += [r.ConfigRecord(resource_type=resource_type, resource_name=name, name=k, value=None)
            for k in current if k not in configs]
    if any(rec.name == MIN_INSYNC for rec in out) and (resource_type == TOPIC_RESOURCE or name == ""):
        out += elr_cleared(image, name if resource_type == TOPIC_RESOURCE else None)
    return out


MIN_INSYNC = "min.insync.replicas"


def elr_cleared(image: MetadataImage, topic: str | None) -> list[Any]:
    """KIP-966: ELRs were kept for the old min.insync.replicas; a new one (of `topic`, or the
    cluster-wide one: every topic) clears them, as Kafka's controller does."""
    if image.features.get(feature_rules.ELR_VERSION, 0) < 1:
        return []
    return [r.PartitionChangeRecord(partition_id=index, topic_id=t.topic_id, eligible_leader_replicas=[],
                                    last_known_elr=[])
            for t, index, state in image.partitions()
            if (topic is None or t.name == topic) and (state.elr or state.last_known_elr)]
