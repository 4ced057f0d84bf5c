"""Kafka 4.0's dynamic broker and group configs, walked from one table taken from Kafka's
documentation (the "Update Mode" of each broker config: per-broker or cluster-wide; every
other broker config is read-only; the group configs section), against a broker process:
each key is accepted at the scopes Kafka allows and refused where Kafka refuses it, a bad
value is INVALID_CONFIG. Strom's own column: keys it refuses because it cannot change them
while running (listeners, TLS, SASL; see strom.config.dynamic_modes)."""

from __future__ import annotations

import pytest

from strom.protocol.errors import ErrorCode

from .conftest import wire_call

pytestmark = pytest.mark.timeout(120)

INCREMENTAL_ALTER_CONFIGS, BROKER, GROUP = 44, 4, 32
SET, DELETE = 0, 1
B, C = "per-broker", "cluster-wide"

# name, Kafka 4.0's update mode, a valid value (Kafka's default), a bad value (None: any string).
TABLE = [
    ("background.threads", C, "10", "0"),
    ("compression.type", C, "producer", "brotli"),
    ("compression.gzip.level", C, "-1", "10"),
    ("compression.lz4.level", C, "9", "18"),
    ("compression.zstd.level", C, "3", "23"),
    ("log.flush.interval.messages", C, "9223372036854775807", "0"),
    ("log.flush.interval.ms", C, "60000", "x"),
    ("log.retention.bytes", C, "-1", "x"),
    ("log.retention.ms", C, "604800000", "x"),
    ("log.roll.jitter.ms", C, "0", "-1"),
    ("log.roll.ms", C, "604800000", "x"),
    ("log.segment.bytes", C, "1073741824", "1000"),
    ("log.segment.delete.delay.ms", C, "60000", "-1"),
    ("message.max.bytes", C, "1048588", "-1"),
    ("min.insync.replicas", C, "1", "0"),
    ("num.io.threads", C, "8", "0"),
    ("num.network.threads", C, "3", "0"),
    ("num.recovery.threads.per.data.dir", C, "2", "0"),
    ("num.replica.fetchers", C, "1", "x"),
    ("unclean.leader.election.enable", C, "false", "maybe"),
    ("log.cleaner.backoff.ms", C, "15000", "-1"),
    ("log.cleaner.dedupe.buffer.size", C, "134217728", "x"),
    ("log.cleaner.delete.retention.ms", C, "86400000", "-1"),
    ("log.cleaner.io.buffer.load.factor", C, "0.9", "x"),
    ("log.cleaner.io.buffer.size", C, "524288", "-1"),
    ("log.cleaner.io.max.bytes.per.second", C, "1.7976931348623157E308", "x"),
    ("log.cleaner.max.compaction.lag.ms", C, "9223372036854775807", "0"),
    ("log.cleaner.min.cleanable.ratio", C, "0.5", "2"),
    ("log.cleaner.min.compaction.lag.ms", C, "0", "-1"),
    ("log.cleaner.threads", C, "1", "x"),
    ("log.cleanup.policy", C, "delete", "shred"),
    ("log.index.interval.bytes", C, "4096", "-1"),
    ("log.index.size.max.bytes", C, "10485760", "1"),
    ("log.local.retention.bytes", C, "-2", "-3"),
    ("log.local.retention.ms", C, "-2", "-3"),
    ("log.message.timestamp.after.max.ms", C, "3600000", "-1"),
    ("log.message.timestamp.before.max.ms", C, "9223372036854775807", "-1"),
    ("log.message.timestamp.type", C, "CreateTime", "Now"),
    ("log.preallocate", C, "false", "maybe"),
    ("max.connection.creation.rate", C, "2147483647", "-1"),
    ("max.connections", C, "2147483647", "-1"),
    ("max.connections.per.ip", C, "2147483647", "-1"),
    ("max.connections.per.ip.overrides", C, "", None),
    ("remote.fetch.max.wait.ms", C, "500", "0"),
    ("remote.list.offsets.request.timeout.ms", C, "30000", "0"),
    ("remote.log.manager.copier.thread.pool.size", C, "10", "0"),
    ("remote.log.manager.copy.max.bytes.per.second", C, "9223372036854775807", "0"),
    ("remote.log.manager.expiration.thread.pool.size", C, "10", "0"),
    ("remote.log.manager.fetch.max.bytes.per.second", C, "9223372036854775807", "0"),
    ("remote.log.reader.threads", C, "10", "0"),
    ("remote.log.index.file.cache.total.size.bytes", C, "1073741824", "0"),
    ("metric.reporters", C, "", None),
    ("producer.id.expiration.ms", C, "86400000", "0"),
    ("transaction.partition.verification.enable", C, "true", "maybe"),
    ("listeners", B, "PLAINTEXT://127.0.0.1:0", None),
    ("listener.security.protocol.map", B, "PLAINTEXT:PLAINTEXT", None),
    ("principal.builder.class", B, "org.example.Builder", None),
    ("sasl.enabled.mechanisms", B, "PLAIN", None),
    ("sasl.kerberos.kinit.cmd", B, "/usr/bin/kinit", None),
    ("sasl.kerberos.min.time.before.relogin", B, "60000", "x"),
    ("sasl.kerberos.principal.to.local.rules", B, "DEFAULT", None),
    ("sasl.kerberos.service.name", B, "kafka", None),
    ("sasl.kerberos.ticket.renew.jitter", B, "0.05", "x"),
    ("sasl.kerberos.ticket.renew.window.factor", B, "0.8", "x"),
    ("sasl.login.refresh.buffer.seconds", B, "300", "40000"),
    ("sasl.login.refresh.min.period.seconds", B, "60", "40000"),
    ("sasl.login.refresh.window.factor", B, "0.8", "x"),
    ("sasl.login.refresh.window.jitter", B, "0.05", "x"),
    ("sasl.mechanism.inter.broker.protocol", B, "PLAIN", None),
    ("ssl.cipher.suites", B, "", None),
    ("ssl.client.auth", B, "none", None),
    ("ssl.enabled.protocols", B, "TLSv1.2,TLSv1.3", None),
    ("ssl.keymanager.algorithm", B, "SunX509", None),
    ("ssl.protocol", B, "TLSv1.3", None),
    ("ssl.provider", B, "SunJSSE", None),
    ("ssl.trustmanager.algorithm", B, "PKIX", None),
    ("ssl.endpoint.identification.algorithm", B, "https", None),
    ("ssl.engine.factory.class", B, "org.example.Factory", None),
    ("ssl.secure.random.implementation", B, "SHA1PRNG", None),
]
# Per-broker in Kafka, dynamic there only listener-prefixed (SslConfigs.RECONFIGURABLE_CONFIGS).
LISTENER_ONLY = ["ssl.keystore.type", "ssl.keystore.location", "ssl.keystore.password", "ssl.key.password",
                 "ssl.truststore.type", "ssl.truststore.location", "ssl.truststore.password",
                 "ssl.keystore.certificate.chain", "ssl.keystore.key", "ssl.truststore.certificates"]
# Strom cannot change these while running and refuses them (documented in docs/operations.md).
STROM_REFUSES = {"listeners", "listener.security.protocol.map", "sasl.enabled.mechanisms",
                 "sasl.mechanism.inter.broker.protocol", "ssl.cipher.suites", "ssl.client.auth",
                 "ssl.enabled.protocols", "ssl.protocol", "ssl.endpoint.identification.algorithm"}
# Read-only in Kafka 4.0 (a sample, each a key Strom parses).
READ_ONLY = ["num.partitions", "log.retention.hours", "log.roll.hours", "auto.create.topics.enable",
             "log.dirs", "broker.id", "advertised.listeners", "offsets.topic.replication.factor",
             "connections.max.reauth.ms", "log.retention.check.interval.ms", "queued.max.requests"]
# Kafka 4.0's group configs with a valid and a bad value (outside the broker's min/max).
GROUP_TABLE = [
    ("consumer.session.timeout.ms", "45000", "1000"),
    ("consumer.heartbeat.interval.ms", "5000", "100"),
    ("share.session.timeout.ms", "45000", "1000"),
    ("share.heartbeat.interval.ms", "5000", "100"),
    ("share.record.lock.duration.ms", "30000", "10"),
    ("share.auto.offset.reset", "earliest", "middle"),
]


def alter(bootstrap: str, rtype: int, name: str, configs: dict[str, str | None]) -> tuple[int, str]:
    body = wire_call(bootstrap, INCREMENTAL_ALTER_CONFIGS, 1, {"resources": [{
        "resource_type": rtype, "resource_name": name,
        "configs": [{"name": k, "config_operation": SET if v is not None else DELETE, "value": v}
                    for k, v in configs.items()]}], "validate_only": False})
    (response,) = body.responses
    return response.error_code, response.error_message or ""


def test_dynamic_broker_configs_as_kafka_4_documents_them(fresh_broker):
    bootstrap, failures = fresh_broker.bootstrap, []

    def expect(what: str, got: tuple[int, str], code: int, words: str = "") -> None:
        if got[0] != code or words not in got[1].lower():
            failures.append(f"{what}: {got}, expected {code} {words!r}")

    for name, mode, good, bad in TABLE:
        if name in STROM_REFUSES:
            expect(f"{name} (per-broker)", alter(bootstrap, BROKER, "0", {name: good}),
                   ErrorCode.INVALID_REQUEST, "dynamically")
            continue
        expect(f"{name} (per-broker)", alter(bootstrap, BROKER, "0", {name: good}), ErrorCode.NONE)
        expect(f"{name} deleted", alter(bootstrap, BROKER, "0", {name: None}), ErrorCode.NONE)
        if mode == C:
            expect(f"{name} (default)", alter(bootstrap, BROKER, "", {name: good}), ErrorCode.NONE)
            expect(f"{name} default deleted", alter(bootstrap, BROKER, "", {name: None}), ErrorCode.NONE)
        else:
            expect(f"{name} (default)", alter(bootstrap, BROKER, "", {name: good}),
                   ErrorCode.INVALID_REQUEST, "broker id must be specified")
        if bad is not None:
            expect(f"{name}={bad}", alter(bootstrap, BROKER, "0", {name: bad}), ErrorCode.INVALID_CONFIG)
    for name in ("max.connections", "max.connection.creation.rate"):  # cluster-level listener configs
        expect(f"listener-prefixed {name}",
               alter(bootstrap, BROKER, "", {f"listener.name.plaintext.{name}": "1000"}), ErrorCode.NONE)
        alter(bootstrap, BROKER, "", {f"listener.name.plaintext.{name}": None})
    for name in LISTENER_ONLY:
        expect(f"{name} unprefixed", alter(bootstrap, BROKER, "0", {name: "x"}),
               ErrorCode.INVALID_REQUEST, "only per-listener")
    for name in READ_ONLY:
        for entity in ("0", ""):
            expect(f"{name} ({entity!r})", alter(bootstrap, BROKER, entity, {name: "1"}),
                   ErrorCode.INVALID_REQUEST, "dynamically")
    assert not failures, "\n".join(failures)


def test_group_configs_as_kafka_4_documents_them(fresh_broker):
    bootstrap, failures = fresh_broker.bootstrap, []
    for name, good, bad in GROUP_TABLE:
        got = alter(bootstrap, GROUP, "g1", {name: good})
        if got[0] != ErrorCode.NONE:
            failures.append(f"{name}={good}: {got}")
        got = alter(bootstrap, GROUP, "g1", {name: bad})
        if got[0] != ErrorCode.INVALID_CONFIG:
            failures.append(f"{name}={bad}: {got}")
    got = alter(bootstrap, GROUP, "g1", {"consumer.nonsense.ms": "1"})
    if got[0] != ErrorCode.INVALID_CONFIG:
        failures.append(f"unknown group config: {got}")
    assert not failures, "\n".join(failures)
