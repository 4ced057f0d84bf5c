"""Broker configuration: Kafka's names, types and defaults, validated up front.

`strom serve` reads a server.properties file and `--override key=value` pairs. An unknown key
or a bad value is a `ConfigError` with one line that names the key; the CLI exits with 2.
"""

from __future__ import annotations

import difflib
import importlib
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strom.config.synonyms import BROKER_SYNONYMS
from strom.log.cleaner import CleanerConfig
from strom.log.config import (
    COMPRESSION_TYPES,
    TOPIC_CONFIG_KEYS,
    LogConfig,
    double_in,
    int_in,
    one_of,
)

LONG_MAX = 2**63 - 1


class ConfigError(ValueError):
    pass


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise ConfigError(f"expected true or false, got {text!r}")
    return lowered == "true"


def _str(text: str) -> str:
    return text.strip()


def _optional(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    return lambda text: None if text.strip() in ("", "null") else parse(text)


# replica.selector.class: Kafka's rack-aware selector by its Java name (strom.replication makes
# it), or a Python class loaded here so that a wrong name stops the broker at start, as in Kafka.
_KAFKA_REPLICA_SELECTOR = "org.apache.kafka.common.replica.RackAwareReplicaSelector"


def _replica_selector(text: str) -> str:
    name = text.strip()
    if name == _KAFKA_REPLICA_SELECTOR:
        return name
    module, _, cls = name.rpartition(".")
    try:
        if not module or not callable(getattr(getattr(importlib.import_module(module), cls), "select", None)):
            raise ConfigError(f"{name!r} is not a replica selector class (package.module.Class with a select method)")
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"cannot load replica selector {name!r}: {e}") from e
    return name


_LISTENER = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)://(?P<host>\[[0-9a-fA-F:]+\]|[^:/\s]*):(?P<port>\d+)$")


@dataclass(frozen=True, slots=True)
class Listener:
    name: str
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.name}://{self.host}:{self.port}"


def parse_listeners(text: str) -> list[Listener]:
    listeners = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        match = _LISTENER.match(item)
        if not match:
            raise ConfigError(f"{item!r} is not of the form NAME://host:port")
        if int(match["port"]) > 65535:
            raise ConfigError(f"{item!r}: port {match['port']} is out of range (0-65535)")
        listeners.append(Listener(match["name"].upper(), match["host"].strip("[]"), int(match["port"])))
    names = [listener.name for listener in listeners]
    if len(set(names)) != len(names):
        raise ConfigError("each listener name may appear once")
    return listeners


def advertised_listeners(configured: list[Listener] | None, listeners: list[Listener],
                         bound: Mapping[str, tuple[str, int]]) -> list[Listener]:
    """What a broker registers for each listener it serves: its advertised.listeners entry (port
    0 there meaning the bound port), else the listener with the bound port, a wildcard host
    replaced by this machine's name."""
    by_name = {a.name: a for a in configured or []}
    out = []
    for listener in listeners:
        _, bound_port = bound[listener.name]
        chosen = by_name.get(listener.name)
        if chosen is not None:
            out.append(Listener(chosen.name, chosen.host, chosen.port or bound_port))
            continue
        host = listener.host
        if host in ("", "0.0.0.0", "::"):
            host = socket.getfqdn()
        out.append(Listener(listener.name, host, bound_port))
    return out


def _roles(text: str) -> tuple[str, ...]:
    roles = tuple(sorted({r.strip() for r in text.split(",") if r.strip()}))
    if not roles or any(r not in ("broker", "controller") for r in roles):
        raise ConfigError(f"expected broker, controller or broker,controller, got {text!r}")
    return roles


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip().upper() for n in text.split(",") if n.strip())


def _dirs(text: str) -> list[Path]:
    dirs = [Path(s.strip()) for s in text.split(",") if s.strip()]
    if not dirs:
        raise ConfigError("at least one directory is needed")
    return dirs


# name -> (parser, default as Kafka writes it). None means "no value" (Kafka's null).
DEFINITIONS: dict[str, tuple[Callable[[str], Any], str | None]] = {
    "broker.id": (int_in(0), "0"),
    "node.id": (_optional(int_in(0)), None),
    "listeners": (parse_listeners, "PLAINTEXT://127.0.0.1:9092"),
    "advertised.listeners": (_optional(parse_listeners), None),
    "inter.broker.listener.name": (_optional(_str), None),
    "listener.security.protocol.map": (_optional(_str), None),
    "log.dirs": (_optional(_dirs), None),
    "log.dir": (_dirs, "./strom-data"),
    "cordoned.log.dirs": (_optional(lambda text: "*" if text.strip() == "*" else _dirs(text)), None),
    "num.partitions": (int_in(1), "1"),
    "default.replication.factor": (int_in(1), "1"),
    "auto.create.topics.enable": (_bool, "true"),
    "delete.topic.enable": (_bool, "true"),
    "log.segment.bytes": (int_in(14), "1073741824"),
    "log.roll.ms": (_optional(int_in(1)), None),
    "log.roll.hours": (int_in(1), "168"),
    "log.retention.ms": (_optional(int_in(-1)), None),
    "log.retention.minutes": (_optional(int_in(-1)), None),
    "log.retention.hours": (int_in(-1), "168"),
    "log.retention.bytes": (int_in(-1), "-1"),
    "log.retention.check.interval.ms": (int_in(1), "300000"),
    "log.index.interval.bytes": (int_in(0), "4096"),
    "index.interval.bytes": (_optional(int_in(0)), None),  # the topic-level name, accepted as a synonym
    "log.index.size.max.bytes": (int_in(4), "10485760"),
    "log.segment.delete.delay.ms": (int_in(0), "60000"),
    "log.cleanup.policy": (one_of("delete", "compact", "compact,delete", "delete,compact"), "delete"),
    "log.message.timestamp.type": (one_of("CreateTime", "LogAppendTime"), "CreateTime"),
    "log.message.timestamp.before.max.ms": (int_in(0), str(LONG_MAX)),
    "log.message.timestamp.after.max.ms": (int_in(0), "3600000"),  # Kafka 4.0's default (KIP-1030)
    "compression.type": (one_of(*COMPRESSION_TYPES), "producer"),
    "compression.gzip.level": (lambda text: TOPIC_CONFIG_KEYS["compression.gzip.level"][1](text), "-1"),
    "compression.lz4.level": (lambda text: TOPIC_CONFIG_KEYS["compression.lz4.level"][1](text), "9"),
    "compression.zstd.level": (lambda text: TOPIC_CONFIG_KEYS["compression.zstd.level"][1](text), "3"),
    "log.roll.jitter.ms": (_optional(int_in(0)), None),
    "log.roll.jitter.hours": (int_in(0), "0"),
    "log.preallocate": (_bool, "false"),
    "log.local.retention.ms": (int_in(-2), "-2"),
    "log.local.retention.bytes": (int_in(-2), "-2"),
    # Tiered storage (KIP-405): the remote log manager's settings, under Kafka's names and defaults.
    "remote.log.storage.system.enable": (_bool, "false"),
    "remote.log.storage.manager.class.name": (_str, ""),
    "remote.log.storage.manager.class.path": (_str, ""),
    "remote.log.storage.manager.impl.prefix": (_str, "rsm.config."),
    "remote.log.metadata.manager.class.name": (
        _str, "org.apache.kafka.server.log.remote.metadata.storage.TopicBasedRemoteLogMetadataManager"),
    "remote.log.metadata.manager.class.path": (_str, ""),
    "remote.log.metadata.manager.impl.prefix": (_str, "rlmm.config."),
    "remote.log.metadata.manager.listener.name": (_str, ""),
    "remote.log.metadata.custom.metadata.max.bytes": (int_in(0), "128"),
    "remote.log.manager.task.interval.ms": (int_in(1), "30000"),
    "remote.log.manager.task.retry.backoff.ms": (int_in(1), "500"),
    "remote.log.manager.task.retry.backoff.max.ms": (int_in(1), "30000"),
    "remote.log.manager.task.retry.jitter": (double_in(0.0, 0.5), "0.2"),
    "remote.log.manager.thread.pool.size": (int_in(1), "2"),
    "remote.log.manager.copier.thread.pool.size": (int_in(1), "10"),
    "remote.log.manager.expiration.thread.pool.size": (int_in(1), "10"),
    "remote.log.manager.copy.max.bytes.per.second": (int_in(1), str(LONG_MAX)),
    "remote.log.manager.copy.quota.window.num": (int_in(1), "11"),
    "remote.log.manager.copy.quota.window.size.seconds": (int_in(1), "1"),
    "remote.log.manager.fetch.max.bytes.per.second": (int_in(1), str(LONG_MAX)),
    "remote.log.manager.fetch.quota.window.num": (int_in(1), "11"),
    "remote.log.manager.fetch.quota.window.size.seconds": (int_in(1), "1"),
    "remote.log.reader.threads": (int_in(1), "10"),
    "remote.log.reader.max.pending.tasks": (int_in(1), "100"),
    "remote.log.index.file.cache.total.size.bytes": (int_in(1), "1073741824"),
    "remote.fetch.max.wait.ms": (int_in(1), "500"),
    "remote.list.offsets.request.timeout.ms": (int_in(1), "30000"),
    "log.flush.interval.messages": (int_in(1), str(LONG_MAX)),
    "log.flush.interval.ms": (_optional(int_in(0)), None),
    "log.flush.scheduler.interval.ms": (int_in(1), str(LONG_MAX)),
    "log.flush.offset.checkpoint.interval.ms": (int_in(0), "60000"),
    "log.flush.start.offset.checkpoint.interval.ms": (int_in(0), "60000"),
    "replica.high.watermark.checkpoint.interval.ms": (int_in(1), "5000"),
    # Log cleaner (compaction), with Kafka's defaults.
    "log.cleaner.enable": (_bool, "true"),
    "log.cleaner.threads": (int_in(1), "1"),
    "log.cleaner.backoff.ms": (int_in(0), "15000"),
    "log.cleaner.dedupe.buffer.size": (int_in(1), "134217728"),
    "log.cleaner.io.buffer.load.factor": (double_in(0.0, 1.0), "0.9"),
    "log.cleaner.min.cleanable.ratio": (double_in(0.0, 1.0), "0.5"),
    "log.cleaner.delete.retention.ms": (int_in(0), "86400000"),
    "log.cleaner.min.compaction.lag.ms": (int_in(0), "0"),
    "log.cleaner.max.compaction.lag.ms": (int_in(1), str(LONG_MAX)),
    "message.max.bytes": (int_in(0), "1048588"),
    "socket.request.max.bytes": (int_in(1), "104857600"),
    "socket.send.buffer.bytes": (int_in(-1), "102400"),
    "socket.receive.buffer.bytes": (int_in(-1), "102400"),
    "queued.max.requests": (int_in(1), "500"),
    # What all connections' large requests may hold together (-1: no bound, Kafka's default;
    # Strom bounds it by default). At least socket.request.max.bytes, so any request fits.
    "queued.max.request.bytes": (int_in(-1), str(256 << 20)),
    "num.network.threads": (int_in(1), "3"),
    "num.io.threads": (int_in(1), "8"),
    "num.recovery.threads.per.data.dir": (int_in(1), "2"),  # Kafka 4.0 (KIP-1030)
    "min.insync.replicas": (int_in(1), "1"),
    "replica.lag.time.max.ms": (int_in(0), "30000"),
    "num.replica.fetchers": (int_in(1), "1"),
    "max.incremental.fetch.session.cache.slots": (int_in(0), "1000"),
    "max.request.partition.size.limit": (int_in(1), "2000"),  # DescribeTopicPartitions pages
    "unclean.leader.election.enable": (_bool, "false"),
    "max.connections": (int_in(0), "2147483647"),
    # Partition replicas one broker may hold (KIP-578's name): CreateTopics and CreatePartitions
    # beyond it get POLICY_VIOLATION instead of a broker that cannot open or load its logs.
    "max.broker.partitions": (int_in(1), "20000"),
    # Strom's own: a log dir with less free space refuses writes (KAFKA_STORAGE_ERROR) and keeps
    # serving reads, until retention or deletions free enough (Kafka's broker halts instead).
    "log.dir.min.free.bytes": (int_in(0), str(64 << 20)),
    "max.connections.per.ip": (int_in(0), "2147483647"),
    "max.connections.per.ip.overrides": (_str, ""),
    "connections.max.idle.ms": (int_in(-1), "600000"),
    "leader.replication.throttled.rate": (int_in(1), str(2**63 - 1)),
    "follower.replication.throttled.rate": (int_in(1), str(2**63 - 1)),
    "controlled.shutdown.enable": (_bool, "true"),
    "controlled.shutdown.max.retries": (int_in(0), "3"),
    "controlled.shutdown.retry.backoff.ms": (int_in(0), "5000"),
    "auto.leader.rebalance.enable": (_bool, "true"),
    "leader.imbalance.check.interval.seconds": (int_in(1), "300"),
    "leader.imbalance.per.broker.percentage": (int_in(0), "10"),
    "replica.fetch.max.bytes": (int_in(0), "1048576"),
    "replica.fetch.response.max.bytes": (int_in(0), "10485760"),
    "replica.fetch.wait.max.ms": (int_in(0), "500"),
    "replica.fetch.min.bytes": (int_in(1), "1"),
    "replica.fetch.backoff.ms": (int_in(0), "1000"),
    "offsets.topic.num.partitions": (int_in(1), "50"),
    "offsets.topic.replication.factor": (int_in(1), "3"),
    "transaction.state.log.num.partitions": (int_in(1), "50"),
    "transaction.state.log.replication.factor": (int_in(1), "3"),
    "transaction.state.log.min.isr": (int_in(1), "2"),
    "group.initial.rebalance.delay.ms": (int_in(0), "3000"),
    # Group coordinator (classic groups, offsets and KIP-848 consumer groups).
    "group.min.session.timeout.ms": (int_in(0), "6000"),
    "group.max.session.timeout.ms": (int_in(0), "1800000"),
    "group.max.size": (int_in(1), "2147483647"),
    "offsets.topic.segment.bytes": (int_in(1), "104857600"),
    "offsets.retention.minutes": (int_in(1), "10080"),
    "offsets.retention.check.interval.ms": (int_in(1), "600000"),
    "offsets.commit.timeout.ms": (int_in(1), "5000"),
    "offsets.load.buffer.size": (int_in(1), "5242880"),
    "offset.metadata.max.bytes": (int_in(0), "4096"),
    "transaction.state.log.segment.bytes": (int_in(1), "104857600"),
    # Transaction coordinator.
    "transaction.max.timeout.ms": (int_in(1), "900000"),
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": (int_in(1), "10000"),
    "transactional.id.expiration.ms": (int_in(1), "604800000"),
    "transaction.remove.expired.transaction.cleanup.interval.ms": (int_in(1), "3600000"),
    "producer.id.expiration.ms": (int_in(1), "86400000"),
    "producer.id.expiration.check.interval.ms": (int_in(1), "600000"),
    "group.coordinator.rebalance.protocols": (_str, "classic,consumer"),
    "group.consumer.session.timeout.ms": (int_in(1), "45000"),
    "group.consumer.min.session.timeout.ms": (int_in(1), "45000"),
    "group.consumer.max.session.timeout.ms": (int_in(1), "60000"),
    "group.consumer.heartbeat.interval.ms": (int_in(1), "5000"),
    "group.consumer.min.heartbeat.interval.ms": (int_in(1), "5000"),
    "group.consumer.max.heartbeat.interval.ms": (int_in(1), "15000"),
    "group.consumer.max.size": (int_in(1), "2147483647"),
    "group.consumer.assignors": (_str, "uniform,range"),
    # KIP-1240 (Kafka 4.3): the bounds of a group's consumer.assignment.interval.ms.
    "group.consumer.assignment.interval.ms": (int_in(0), "1000"),
    "group.consumer.min.assignment.interval.ms": (int_in(0), "0"),
    "group.consumer.max.assignment.interval.ms": (int_in(0), "15000"),
    # KIP-932 share groups and the share coordinator's state topic.
    "group.share.session.timeout.ms": (int_in(1), "45000"),
    "group.share.min.session.timeout.ms": (int_in(1), "45000"),
    "group.share.max.session.timeout.ms": (int_in(1), "60000"),
    "group.share.heartbeat.interval.ms": (int_in(1), "5000"),
    "group.share.min.heartbeat.interval.ms": (int_in(1), "5000"),
    "group.share.max.heartbeat.interval.ms": (int_in(1), "15000"),
    "group.share.max.size": (int_in(1, 1000), "200"),
    "group.share.delivery.count.limit": (int_in(2, 10), "5"),
    "group.share.record.lock.duration.ms": (int_in(1000), "30000"),
    "group.share.min.record.lock.duration.ms": (int_in(1000), "15000"),
    "group.share.max.record.lock.duration.ms": (int_in(1000, 3600000), "60000"),
    "group.share.partition.max.record.locks": (int_in(100, 10000), "2000"),
    # KIP-1240 (Kafka 4.3): the bounds of a group's share.delivery.count.limit,
    # share.partition.max.record.locks and share.assignment.interval.ms.
    "group.share.min.delivery.count.limit": (int_in(2, 5), "2"),
    "group.share.max.delivery.count.limit": (int_in(5, 25), "10"),
    "group.share.min.partition.max.record.locks": (int_in(100, 2000), "100"),
    "group.share.max.partition.max.record.locks": (int_in(2000, 10000), "4000"),
    "group.share.assignment.interval.ms": (int_in(0), "1000"),
    "group.share.min.assignment.interval.ms": (int_in(0), "0"),
    "group.share.max.assignment.interval.ms": (int_in(0), "15000"),
    "group.share.max.share.sessions": (int_in(1, 100000), "2000"),
    # KIP-1191 dead-letter topics of share groups (strom.share.dead_letters).
    "errors.deadletterqueue.topic.name.prefix": (_str, "dlq."),
    "errors.deadletterqueue.auto.create.topics.enable": (_bool, "false"),
    "share.coordinator.state.topic.num.partitions": (int_in(1), "50"),
    "share.coordinator.state.topic.replication.factor": (int_in(1, 32767), "3"),
    "share.coordinator.state.topic.min.isr": (int_in(1, 32767), "2"),
    "share.coordinator.state.topic.segment.bytes": (int_in(1), "104857600"),
    # KRaft (KIP-500/595/631/853): a node with process.roles set runs without ZooKeeper.
    "process.roles": (_optional(_roles), None),
    "controller.listener.names": (_optional(_names), None),
    "controller.quorum.voters": (_str, ""),
    "controller.quorum.bootstrap.servers": (_str, ""),
    "controller.quorum.election.timeout.ms": (int_in(1), "1000"),
    "controller.quorum.fetch.timeout.ms": (int_in(1), "2000"),
    "controller.quorum.election.backoff.max.ms": (int_in(1), "1000"),
    "controller.quorum.append.linger.ms": (int_in(0), "25"),
    "controller.quorum.request.timeout.ms": (int_in(1), "2000"),
    "controller.quorum.retry.backoff.ms": (int_in(0), "20"),
    "metadata.log.dir": (_optional(lambda text: _dirs(text)[0]), None),
    "metadata.log.segment.bytes": (int_in(12), "1073741824"),
    "metadata.log.max.record.bytes.between.snapshots": (int_in(1), "20971520"),
    "metadata.log.max.snapshot.interval.ms": (int_in(0), "3600000"),
    "broker.session.timeout.ms": (int_in(1), "9000"),
    "broker.heartbeat.interval.ms": (int_in(1), "2000"),
    "initial.broker.registration.timeout.ms": (int_in(1), "60000"),
    "sasl.mechanism.controller.protocol": (_str, "GSSAPI"),
    "zookeeper.connect": (_optional(_str), None),
    "zookeeper.session.timeout.ms": (int_in(1), "18000"),
    "zookeeper.connection.timeout.ms": (_optional(int_in(1)), None),  # default: the session timeout
    "zookeeper.set.acl": (_bool, "false"),
    # Strom's own: the digest user ("user:password") the broker authenticates to ZooKeeper as,
    # what Kafka reads from the JAAS file's Client section with ZooKeeper's DigestLoginModule.
    "zookeeper.digest.auth": (_optional(_str), None),
    "control.plane.listener.name": (_optional(_str), None),
    "security.inter.broker.protocol": (_str, "PLAINTEXT"),
    "broker.rack": (_optional(_str), None),
    # Fetch from follower (KIP-392): unset, consumers read from leaders only.
    "replica.selector.class": (_optional(_replica_selector), None),
    # Strom's own: the Prometheus endpoint (GET /metrics), off unless a port is given (0: any
    # free port, named in the ready line); metrics.host is the address it binds.
    "metrics.port": (int_in(-1, 65535), "-1"),
    "metrics.host": (_str, "127.0.0.1"),
    # The schema registry (strom/registry, docs/schema-registry.md): Confluent Schema Registry's
    # config names behind "schema.registry."; off unless listeners are given.
    "schema.registry.listeners": (_optional(_str), None),
    "schema.registry.kafkastore.topic": (_str, "_schemas"),
    "schema.registry.kafkastore.topic.replication.factor": (int_in(1), "3"),
    "schema.registry.schema.compatibility.level": (
        one_of("none", "backward", "backward_transitive", "forward", "forward_transitive", "full",
               "full_transitive", "NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE",
               "FULL", "FULL_TRANSITIVE"), "backward"),
    "schema.registry.mode.mutability": (_bool, "true"),
    "schema.registry.authentication.method": (one_of("NONE", "BASIC"), "NONE"),
    "schema.registry.request.max.bytes": (int_in(1024), "4194304"),
    "schema.registry.max.connections": (int_in(1), "1000"),
    # Iceberg topics (strom/tables, docs/iceberg-topics.md): off unless enabled. The catalog's
    # uri and the warehouse default to places under the first log dir (iceberg_settings).
    "iceberg.enabled": (_bool, "false"),
    "iceberg.catalog.type": (one_of("sql", "rest"), "sql"),
    "iceberg.catalog.uri": (_optional(_str), None),
    "iceberg.catalog.name": (_str, "strom"),
    "iceberg.namespace": (_str, "strom"),
    "iceberg.warehouse": (_optional(_str), None),
    "iceberg.commit.interval.ms": (int_in(1), "60000"),
    # TLS for SSL listeners (security/tls.py), Kafka's names and defaults; stores must be PEM.
    "ssl.keystore.type": (_str, "JKS"),
    "ssl.keystore.location": (_optional(_str), None),
    "ssl.keystore.password": (_optional(_str), None),
    "ssl.key.password": (_optional(_str), None),
    "ssl.keystore.certificate.chain": (_optional(_str), None),
    "ssl.keystore.key": (_optional(_str), None),
    "ssl.truststore.type": (_str, "JKS"),
    "ssl.truststore.location": (_optional(_str), None),
    "ssl.truststore.password": (_optional(_str), None),
    "ssl.truststore.certificates": (_optional(_str), None),
    "ssl.client.auth": (one_of("none", "requested", "required"), "none"),
    "ssl.enabled.protocols": (_str, "TLSv1.2,TLSv1.3"),
    "ssl.cipher.suites": (_str, ""),
    "ssl.protocol": (_str, "TLSv1.3"),
    "ssl.endpoint.identification.algorithm": (_str, "https"),
    # SASL (security/sasl.py): mechanisms per listener come from
    # listener.name.<listener>.<mechanism>.sasl.jaas.config, as Kafka's listener-scoped JAAS.
    "sasl.enabled.mechanisms": (_str, "GSSAPI"),
    "sasl.mechanism.inter.broker.protocol": (_str, "GSSAPI"),
    "sasl.server.max.receive.size": (int_in(1), "524288"),
    "connections.max.reauth.ms": (int_in(0), "0"),
    "connection.failed.authentication.delay.ms": (int_in(0), "100"),
    # Strom's own, in Kafka's style (security/sasl.py GuessLimit): failed guesses of one user's
    # secret from one address per window before the next guesses wait; 0 turns it off.
    "sasl.server.failed.authentication.limit": (int_in(0), "10"),
    "sasl.server.failed.authentication.window.ms": (int_in(1), "60000"),
    # Quotas (network/quotas.py): the rate windows, and the broker-wide connection creation rate.
    "quota.window.num": (int_in(1), "11"),
    "quota.window.size.seconds": (int_in(1), "1"),
    "max.connection.creation.rate": (int_in(0), "2147483647"),
    # Delegation tokens (security/delegation_tokens.py): on when a secret is set, as in Kafka.
    "delegation.token.secret.key": (_optional(_str), None),
    "delegation.token.master.key": (_optional(_str), None),  # the secret's deprecated name
    "delegation.token.max.lifetime.ms": (int_in(1), "604800000"),
    "delegation.token.expiry.time.ms": (int_in(1), "86400000"),
    "delegation.token.expiry.check.interval.ms": (int_in(1), "3600000"),
    # Authorization (security/authorizer.py): empty authorizer.class.name means none, as in Kafka.
    "authorizer.class.name": (_str, ""),
    "super.users": (_str, ""),
    "allow.everyone.if.no.acl.found": (_bool, "false"),
}
# Never shown by DescribeConfigs (Kafka's PASSWORD type): null with is_sensitive set.
SENSITIVE = frozenset({"ssl.keystore.password", "ssl.key.password", "ssl.truststore.password",
                       "ssl.keystore.key", "delegation.token.secret.key", "delegation.token.master.key",
                       "zookeeper.digest.auth"})
_LISTENER_KEY = re.compile(r"^listener\.name\.(?P<listener>[^.]+)\.(?P<key>.+)$")
# Listener-scoped keys that are not broker keys: a mechanism's JAAS configuration.
_LISTENER_ONLY = re.compile(r"^[a-z0-9-]+\.sasl\.jaas\.config$")

# Keys Kafka types INT (SHORT for the replication factors): a value above their range is
# refused as Kafka refuses it, instead of, say, a broker asked to run 2^40 of something.
_KAFKA_INT = {
    "broker.id", "node.id", "num.partitions", "default.replication.factor", "log.segment.bytes",
    "log.roll.hours", "log.retention.minutes", "log.retention.hours", "log.index.interval.bytes",
    "index.interval.bytes", "log.index.size.max.bytes", "log.cleaner.threads", "message.max.bytes",
    "socket.request.max.bytes", "socket.send.buffer.bytes", "socket.receive.buffer.bytes",
    "queued.max.requests", "num.network.threads", "num.io.threads",
    "num.recovery.threads.per.data.dir", "min.insync.replicas", "num.replica.fetchers",
    "compression.gzip.level", "compression.lz4.level", "compression.zstd.level", "log.roll.jitter.hours",
    "max.incremental.fetch.session.cache.slots", "max.request.partition.size.limit",
    "max.connections", "max.connections.per.ip", "max.broker.partitions",
    "controlled.shutdown.max.retries", "leader.imbalance.per.broker.percentage",
    "replica.fetch.max.bytes", "replica.fetch.response.max.bytes", "replica.fetch.wait.max.ms",
    "replica.fetch.min.bytes", "replica.fetch.backoff.ms", "offsets.topic.num.partitions",
    "transaction.state.log.num.partitions", "transaction.state.log.min.isr",
    "group.initial.rebalance.delay.ms", "group.min.session.timeout.ms",
    "group.max.session.timeout.ms", "group.max.size", "offsets.topic.segment.bytes",
    "offsets.retention.minutes", "offsets.load.buffer.size", "offset.metadata.max.bytes",
    "offsets.commit.timeout.ms", "transaction.state.log.segment.bytes", "transaction.max.timeout.ms",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms", "transactional.id.expiration.ms",
    "transaction.remove.expired.transaction.cleanup.interval.ms", "producer.id.expiration.ms",
    "producer.id.expiration.check.interval.ms", "log.flush.offset.checkpoint.interval.ms",
    "log.flush.start.offset.checkpoint.interval.ms", "group.consumer.session.timeout.ms",
    "group.consumer.min.session.timeout.ms", "group.consumer.max.session.timeout.ms",
    "group.consumer.heartbeat.interval.ms", "group.consumer.min.heartbeat.interval.ms",
    "group.consumer.max.heartbeat.interval.ms", "group.consumer.max.size",
    "zookeeper.session.timeout.ms", "zookeeper.connection.timeout.ms",
    "controller.quorum.election.timeout.ms", "controller.quorum.fetch.timeout.ms",
    "controller.quorum.election.backoff.max.ms", "controller.quorum.append.linger.ms",
    "controller.quorum.request.timeout.ms", "controller.quorum.retry.backoff.ms",
    "metadata.log.segment.bytes", "broker.session.timeout.ms", "broker.heartbeat.interval.ms",
}
_KAFKA_SHORT = {"offsets.topic.replication.factor", "transaction.state.log.replication.factor"}
_PLUGIN_PREFIX_KEYS = ("remote.log.storage.manager.impl.prefix", "remote.log.metadata.manager.impl.prefix")
# The remote log metadata topic's settings (rlmm.config.<key>): Kafka's default, and lowest value.
REMOTE_METADATA_DEFAULTS = {
    "remote.log.metadata.topic.num.partitions": (50, 1),
    "remote.log.metadata.topic.replication.factor": (3, 1),
    "remote.log.metadata.topic.retention.ms": (-1, -1),
}


def _at_most(parse: Callable[[str], Any], high: int) -> Callable[[str], Any]:
    def bounded(text: str) -> Any:
        value = parse(text)
        if value is not None and value > high:
            raise ConfigError(f"must be at most {high}, got {value}")
        return value
    return bounded


for _key in _KAFKA_INT | _KAFKA_SHORT:
    _parse, _default = DEFINITIONS[_key]
    DEFINITIONS[_key] = (_at_most(_parse, 2**15 - 1 if _key in _KAFKA_SHORT else 2**31 - 1), _default)


def is_kafka_broker_config(key: str) -> bool:
    from strom.config.kafka_configs import NAMES, PREFIXES

    return key in NAMES or key.startswith(PREFIXES)


def unknown_key_message(key: str) -> str:
    """Why `key` is refused, with what the user most likely meant: the broker name of a topic
    config (retention.ms -> log.retention.ms), or the nearest known key."""
    if key in BROKER_SYNONYMS:
        return (f"{key!r} is a topic config; the broker's default for every topic is "
                f"{BROKER_SYNONYMS[key][0]!r}")
    from strom.config.kafka_configs import NAMES

    near = difflib.get_close_matches(key, set(DEFINITIONS) | NAMES, n=1, cutoff=0.8)
    return f"unknown config key {key!r}" + (f"; did you mean {near[0]!r}?" if near else "")


class BrokerConfig:
    """Validated broker settings; `values` holds every key, explicit or default."""

    def __init__(self, props: Mapping[str, str] | None = None) -> None:
        props = dict(props or {})
        # listener.name.<listener>.<key>: one listener's settings (see listener_setting).
        self.listener_props: dict[tuple[str, str], str] = {}
        for key in list(props):
            match = _LISTENER_KEY.match(key)
            if match and (match["key"] in DEFINITIONS or _LISTENER_ONLY.match(match["key"])):
                self.listener_props[(match["listener"].upper(), match["key"])] = props.pop(key)
        # A remote store's and the remote log metadata manager's own keys (rsm.config.*,
        # rlmm.config.*, or the prefixes configured): handed to them as they are.
        prefixes = tuple(props.get(k, DEFINITIONS[k][1]).strip() for k in _PLUGIN_PREFIX_KEYS)
        self.plugin_props = {k: props.pop(k) for k in list(props) if k.startswith(prefixes)}
        # iceberg.catalog.<property>: any other property of the Iceberg catalog, handed over as is.
        self.iceberg_catalog_props = {k[len("iceberg.catalog."):]: props.pop(k) for k in list(props)
                                      if k.startswith("iceberg.catalog.") and k not in DEFINITIONS}
        unused = sorted(k for k in props if k not in DEFINITIONS and is_kafka_broker_config(k))
        unknown = sorted(set(props) - set(DEFINITIONS) - set(unused))
        if unknown:
            raise ConfigError(unknown_key_message(unknown[0]))
        # Kafka configs Strom has no use for (a KRaft quorum, SSL stores, metric reporters): a
        # user's server.properties starts as it is; the broker names them in one warning.
        self.ignored = unused
        props = {k: v for k, v in props.items() if k not in unused}
        self.explicit = frozenset(props)
        self.props = props  # as given, for DescribeConfigs and dynamic reconfiguration
        self.values: dict[str, Any] = {}
        for key, (parse, default) in DEFINITIONS.items():
            text = props.get(key, default)
            try:
                self.values[key] = None if text is None else parse(text)
            except ValueError as e:
                raise ConfigError(f"invalid value for {key}: {e}") from None
        self._check_advertised()
        self._check_cordoned()
        self._check_kraft()
        self._check_security_protocols()
        self._check_group_bounds()
        queued, largest = self.values["queued.max.request.bytes"], self.values["socket.request.max.bytes"]
        if 0 < queued < largest:  # Kafka's rule: the pool must fit the largest request
            raise ConfigError(f"queued.max.request.bytes ({queued}) must be -1 or at least "
                              f"socket.request.max.bytes ({largest})")

    def protocol_of(self, listener: str) -> str:
        """A listener's security protocol: listener.security.protocol.map, else its name when
        that is a protocol, else PLAINTEXT (as Strom has always served such listeners)."""
        for pair in filter(None, (p.strip() for p in (self.values["listener.security.protocol.map"] or "").split(","))):
            name, _, protocol = pair.partition(":")
            if name.strip().upper() == listener:
                return protocol.strip().upper()
        return listener if listener in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL") else "PLAINTEXT"

    def listener_setting(self, listener: str, key: str) -> Any:
        """`key` for `listener`: its listener.name override, else the broker's value (None for
        a listener-only key such as `plain.sasl.jaas.config` that the listener does not set)."""
        override = self.listener_props.get((listener, key))
        if key not in DEFINITIONS:
            return override
        return DEFINITIONS[key][0](override) if override is not None else self.values[key]

    @property
    def process_roles(self) -> tuple[str, ...]:
        """KRaft roles (process.roles); empty for a ZooKeeper or embedded broker."""
        return self.values["process.roles"] or ()

    @property
    def controller_listener_names(self) -> tuple[str, ...]:
        return self.values["controller.listener.names"] or ()

    @property
    def metadata_log_dir(self) -> Path:
        """metadata.log.dir, else the first log dir (Kafka's default)."""
        return self.values["metadata.log.dir"] or self.log_dirs[0]

    def _check_group_bounds(self) -> None:
        """Kafka's rule for a broker default that bounds group configs (KIP-1240): within its
        own min and max, which are in order."""
        for pattern in ("group.share.{}delivery.count.limit", "group.share.{}partition.max.record.locks",
                        "group.share.{}assignment.interval.ms", "group.consumer.{}assignment.interval.ms"):
            low, value, high = (pattern.format(b) for b in ("min.", "", "max."))
            if self.values[value] < self.values[low]:
                raise ConfigError(f"{value} must be greater than or equal to {low}")
            if self.values[high] < self.values[value]:
                raise ConfigError(f"{high} must be greater than or equal to {value}")

    def _check_cordoned(self) -> None:
        """KIP-1066: only this broker's own log dirs can be cordoned."""
        own = {d.absolute() for d in self.log_dirs}
        if self.values["cordoned.log.dirs"] == "*":
            return
        for d in self.values["cordoned.log.dirs"] or ():
            if d.absolute() not in own:
                raise ConfigError(f"invalid value for cordoned.log.dirs: {d} is not one of log.dirs")

    def _check_kraft(self) -> None:
        """Kafka's start-up checks of a KRaft node's settings, each a one-line refusal."""
        roles = self.process_roles
        names = {listener.name for listener in self.listeners}
        controllers = self.controller_listener_names
        if not roles:
            return
        if self.values["zookeeper.connect"]:
            raise ConfigError("zookeeper.connect cannot be set with process.roles: a KRaft node has no ZooKeeper")
        if self.values["node.id"] is None:
            raise ConfigError("node.id is required when process.roles is set")
        if not controllers:
            raise ConfigError("controller.listener.names is required when process.roles is set")
        if not self.values["controller.quorum.voters"] and not self.values["controller.quorum.bootstrap.servers"]:
            raise ConfigError("controller.quorum.voters or controller.quorum.bootstrap.servers is required "
                              "when process.roles is set")
        if "controller" in roles:
            if controllers[0] not in names:
                raise ConfigError(f"the controller listener {controllers[0]} (controller.listener.names) must "
                                  "be one of listeners")
            if "broker" not in roles and names - set(controllers):
                raise ConfigError("a controller (process.roles=controller) may only have the listeners of "
                                  f"controller.listener.names, not {sorted(names - set(controllers))}")
        elif names & set(controllers):
            raise ConfigError("a broker (process.roles=broker) must not listen on the controller listener "
                              f"{sorted(names & set(controllers))}")
        if "broker" in roles and self.inter_broker_listener in controllers:
            raise ConfigError(f"the inter-broker listener {self.inter_broker_listener} cannot be a controller "
                              "listener")

    def _check_security_protocols(self) -> None:
        """The inter-broker listener must name an existing listener (brokers reach each other
        there, authenticating like clients when it is secured)."""
        if self.inter_broker_listener not in {listener.name for listener in self.listeners}:
            raise ConfigError(f"the inter-broker listener {self.inter_broker_listener} is not one of listeners")

    @property
    def inter_broker_listener(self) -> str:
        """Where brokers reach each other: control.plane.listener.name, else
        inter.broker.listener.name, else the listener of security.inter.broker.protocol."""
        for key in ("control.plane.listener.name", "inter.broker.listener.name"):
            if self.values[key]:
                return self.values[key].upper()
        wanted = self.values["security.inter.broker.protocol"].upper()
        names = [listener.name for listener in self.listeners
                 if listener.name not in self.controller_listener_names] or [self.listeners[0].name]
        return wanted if wanted in names else names[0]

    def _check_advertised(self) -> None:
        advertised = self.values["advertised.listeners"]
        if advertised:
            names = {listener.name for listener in self.listeners}
            for listener in advertised:
                if listener.name not in names:
                    raise ConfigError(f"advertised listener {listener} has no matching listener")

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    @property
    def broker_id(self) -> int:
        node_id = self.values["node.id"]
        return self.values["broker.id"] if node_id is None else node_id

    @property
    def listeners(self) -> list[Listener]:
        return self.values["listeners"]

    @property
    def log_dirs(self) -> list[Path]:
        return self.values["log.dirs"] or self.values["log.dir"]

    @property
    def cordoned_log_dirs(self) -> list[Path]:
        """The log dirs (of log_dirs, as written there) that take no new partitions (KIP-1066);
        `*` names them all."""
        if self.values["cordoned.log.dirs"] == "*":
            return list(self.log_dirs)
        cordoned = {d.absolute() for d in self.values["cordoned.log.dirs"] or ()}
        return [d for d in self.log_dirs if d.absolute() in cordoned]

    @property
    def log_roll_ms(self) -> int:
        ms = self.values["log.roll.ms"]
        return ms if ms is not None else self.values["log.roll.hours"] * 3_600_000

    @property
    def log_retention_ms(self) -> int:
        # Kafka's precedence: ms, then minutes, then hours; any negative value means unlimited.
        ms = self.values["log.retention.ms"]
        if ms is None and self.values["log.retention.minutes"] is not None:
            ms = self.values["log.retention.minutes"] * 60_000
        if ms is None:
            ms = self.values["log.retention.hours"] * 3_600_000
        return -1 if ms < 0 else ms

    @property
    def log_flush_interval_ms(self) -> int:
        # Kafka: log.flush.interval.ms, else log.flush.scheduler.interval.ms.
        ms = self.values["log.flush.interval.ms"]
        return ms if ms is not None else self.values["log.flush.scheduler.interval.ms"]

    def cleaner_config(self) -> CleanerConfig:
        return CleanerConfig(
            enable=self.values["log.cleaner.enable"],
            threads=self.values["log.cleaner.threads"],
            dedupe_buffer_size=self.values["log.cleaner.dedupe.buffer.size"],
            io_buffer_load_factor=self.values["log.cleaner.io.buffer.load.factor"],
            backoff_ms=self.values["log.cleaner.backoff.ms"],
        )

    def default_log_config(self) -> LogConfig:
        """The topic defaults this broker applies to topics without overrides."""
        index_interval = self.values["index.interval.bytes"]
        return LogConfig(
            segment_bytes=self.values["log.segment.bytes"],
            segment_ms=self.log_roll_ms,
            retention_ms=self.log_retention_ms,
            retention_bytes=self.values["log.retention.bytes"],
            index_interval_bytes=(
                index_interval if index_interval is not None else self.values["log.index.interval.bytes"]
            ),
            segment_index_bytes=self.values["log.index.size.max.bytes"],
            max_message_bytes=self.values["message.max.bytes"],
            message_timestamp_type=self.values["log.message.timestamp.type"],
            file_delete_delay_ms=self.values["log.segment.delete.delay.ms"],
            cleanup_policy=self.values["log.cleanup.policy"],
            delete_retention_ms=self.values["log.cleaner.delete.retention.ms"],
            min_cleanable_dirty_ratio=self.values["log.cleaner.min.cleanable.ratio"],
            min_compaction_lag_ms=self.values["log.cleaner.min.compaction.lag.ms"],
            max_compaction_lag_ms=self.values["log.cleaner.max.compaction.lag.ms"],
            flush_messages=self.values["log.flush.interval.messages"],
            flush_ms=self.log_flush_interval_ms,
            min_insync_replicas=self.values["min.insync.replicas"],
            unclean_leader_election_enable=self.values["unclean.leader.election.enable"],
            compression_type=self.values["compression.type"],
            compression_gzip_level=self.values["compression.gzip.level"],
            compression_lz4_level=self.values["compression.lz4.level"],
            compression_zstd_level=self.values["compression.zstd.level"],
            message_timestamp_before_max_ms=self.values["log.message.timestamp.before.max.ms"],
            message_timestamp_after_max_ms=self.values["log.message.timestamp.after.max.ms"],
            segment_jitter_ms=(self.values["log.roll.jitter.ms"] if self.values["log.roll.jitter.ms"] is not None
                               else self.values["log.roll.jitter.hours"] * 3_600_000),
            preallocate=self.values["log.preallocate"],
            local_retention_ms=self.values["log.local.retention.ms"],
            local_retention_bytes=self.values["log.local.retention.bytes"],
            remote_storage_system_enable=self.values["remote.log.storage.system.enable"],
            iceberg_system_enable=self.values["iceberg.enabled"],
            # A schema mode needs the registry where topics are translated; a dedicated
            # controller validates configs without running either, so it does not check.
            schema_registry_enable=(bool(self.values["schema.registry.listeners"])
                                    if self.process_roles != ("controller",) else None),
        )

    def remote_storage_props(self) -> dict[str, str]:
        """The remote store's keys (under remote.log.storage.manager.impl.prefix, rsm.config.)."""
        prefix = self.values["remote.log.storage.manager.impl.prefix"]
        return {k: v for k, v in self.plugin_props.items() if k.startswith(prefix)}

    def remote_metadata_setting(self, key: str) -> int:
        """One of the remote log metadata topic's settings (under
        remote.log.metadata.manager.impl.prefix, rlmm.config.): its number, or Kafka's default."""
        prefix = self.values["remote.log.metadata.manager.impl.prefix"]
        default, low = REMOTE_METADATA_DEFAULTS[key]
        text = self.plugin_props.get(prefix + key)
        if text is None:
            return default
        try:
            return int_in(low)(text)
        except ValueError as e:
            raise ConfigError(f"invalid value for {prefix}{key}: {e}") from None


def read_properties(path: Path) -> dict[str, str]:
    """Java-properties subset: `key=value` or `key: value` lines, `#`/`!` comments, and a line
    ending in a backslash continued on the next (its leading spaces dropped), as a JAAS line
    in a Kafka server.properties often is."""
    props: dict[str, str] = {}
    lines = iter(enumerate(path.read_text().splitlines(), 1))
    for number, raw in lines:
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        while _continues(line):
            following = next(lines, None)
            line = line[:-1] + ("" if following is None else following[1].lstrip())
        match = re.match(r"^([^=:\s]+)\s*[=:]\s*(.*)$", line)
        if not match:
            raise ConfigError(f"{path}:{number}: expected key=value, got {raw!r}")
        props[match[1]] = match[2]
    return props


def _continues(line: str) -> bool:
    """An odd number of trailing backslashes: the last one joins the next line."""
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def load(path: Path | None, overrides: list[str]) -> BrokerConfig:
    props = read_properties(path) if path is not None else {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--override expects key=value, got {item!r}")
        props[key.strip()] = value
    return BrokerConfig(props)
