"""Which broker configs AlterConfigs and IncrementalAlterConfigs may change at runtime: Kafka
4.0's dynamic update modes, as its broker configs documentation lists them ("Update Mode":
read-only, per-broker, cluster-wide), with what each does in Strom.

`MODES` is that list. A per-broker config may be set only for one broker (resource name = its
id); a cluster-wide one also as the cluster default (resource name ""). Every other Kafka
broker config is read-only. Listener-prefixed names (listener.name.<listener>.<config>) are
dynamic where their config is, and per-broker except Kafka's cluster-level listener configs;
the SSL key and trust store configs may be changed only listener-prefixed, as in Kafka.

`EFFECT` says what Strom does with an accepted value: LIVE, it applies at once; STORED, it is
kept (and described) but changes nothing, because what Kafka means by it has no counterpart in
Strom (JVM thread pools, Kerberos, Java plugin classes, tiered storage managers); REFUSED, Strom
has the setting but cannot change it while running (listeners, TLS and SASL set-up), so it
refuses the change instead of storing a value that would not apply.
"""

from __future__ import annotations

import math
from collections.abc import Callable

PER_BROKER, CLUSTER_WIDE = "per-broker", "cluster-wide"
LIVE, STORED, REFUSED = "live", "stored", "refused"

# Topic defaults and cleaner settings: applied at once to every log (LogServices).
_LOG = """compression.type compression.gzip.level compression.lz4.level compression.zstd.level
log.flush.interval.messages log.flush.interval.ms log.retention.bytes log.retention.ms
log.roll.jitter.ms log.roll.ms log.segment.bytes log.segment.delete.delay.ms message.max.bytes
min.insync.replicas unclean.leader.election.enable log.cleaner.backoff.ms
log.cleaner.dedupe.buffer.size log.cleaner.delete.retention.ms log.cleaner.io.buffer.load.factor
log.cleaner.max.compaction.lag.ms log.cleaner.min.cleanable.ratio
log.cleaner.min.compaction.lag.ms log.cleaner.threads log.cleanup.policy log.index.interval.bytes
log.index.size.max.bytes log.local.retention.bytes log.local.retention.ms
log.message.timestamp.after.max.ms log.message.timestamp.before.max.ms
log.message.timestamp.type log.preallocate""".split()
# Read from the live config where they are used (socket server, fetchers, producer state).
_LIVE_OTHER = """max.connection.creation.rate max.connections max.connections.per.ip
max.connections.per.ip.overrides num.replica.fetchers producer.id.expiration.ms""".split()
# Kafka's meaning has no counterpart in Strom: thread pools of the JVM broker (Strom serves
# from one event loop), Java plugin classes, Kafka's tiered-storage manager, the cleaner's I/O
# buffers and throttle, and verification Strom always does.
_CLUSTER_STORED = """background.threads num.io.threads num.network.threads
num.recovery.threads.per.data.dir log.cleaner.io.buffer.size log.cleaner.io.max.bytes.per.second
metric.reporters remote.fetch.max.wait.ms remote.list.offsets.request.timeout.ms
remote.log.manager.copier.thread.pool.size remote.log.manager.copy.max.bytes.per.second
remote.log.manager.expiration.thread.pool.size remote.log.manager.fetch.max.bytes.per.second
remote.log.reader.threads remote.log.index.file.cache.total.size.bytes
transaction.partition.verification.enable""".split()
# Kerberos login, OAUTHBEARER login refresh and JSSE plumbing: Strom has none of them.
_BROKER_STORED = """principal.builder.class sasl.kerberos.kinit.cmd
sasl.kerberos.min.time.before.relogin sasl.kerberos.principal.to.local.rules
sasl.kerberos.service.name sasl.kerberos.ticket.renew.jitter
sasl.kerberos.ticket.renew.window.factor sasl.login.refresh.buffer.seconds
sasl.login.refresh.min.period.seconds sasl.login.refresh.window.factor
sasl.login.refresh.window.jitter ssl.keymanager.algorithm ssl.trustmanager.algorithm
ssl.provider ssl.engine.factory.class ssl.secure.random.implementation""".split()
# Listeners, TLS and SASL are set up when the broker starts.
_BROKER_REFUSED = """listeners listener.security.protocol.map sasl.enabled.mechanisms
sasl.jaas.config sasl.mechanism.inter.broker.protocol ssl.cipher.suites ssl.client.auth
ssl.enabled.protocols ssl.protocol ssl.endpoint.identification.algorithm ssl.key.password
ssl.keystore.certificate.chain ssl.keystore.key ssl.keystore.location ssl.keystore.password
ssl.keystore.type ssl.truststore.certificates ssl.truststore.location ssl.truststore.password
ssl.truststore.type""".split()

MODES: dict[str, str] = {
    **dict.fromkeys(_LOG + _LIVE_OTHER + _CLUSTER_STORED, CLUSTER_WIDE),
    # Kafka's dynamic-only broker configs (no static form), the replication throttles.
    "leader.replication.throttled.rate": CLUSTER_WIDE,
    "follower.replication.throttled.rate": CLUSTER_WIDE,
    **dict.fromkeys(_BROKER_STORED + _BROKER_REFUSED, PER_BROKER),
    # KIP-1066: the broker's new partitions go to its other log dirs from now on.
    "cordoned.log.dirs": PER_BROKER,
}
EFFECT: dict[str, str] = {
    **dict.fromkeys(_LOG + _LIVE_OTHER + ["leader.replication.throttled.rate",
                                          "follower.replication.throttled.rate", "cordoned.log.dirs"], LIVE),
    **dict.fromkeys(_CLUSTER_STORED + _BROKER_STORED, STORED),
    **dict.fromkeys(_BROKER_REFUSED, REFUSED),
}

# Kafka's SslConfigs.RECONFIGURABLE_CONFIGS: dynamic only with a listener prefix.
LISTENER_PREFIX_ONLY = frozenset({
    "ssl.keystore.type", "ssl.keystore.location", "ssl.keystore.password", "ssl.key.password",
    "ssl.truststore.type", "ssl.truststore.location", "ssl.truststore.password",
    "ssl.keystore.certificate.chain", "ssl.keystore.key", "ssl.truststore.certificates"})
# Listener-prefixed, these stay cluster-wide (Kafka's ClusterLevelListenerConfigs).
CLUSTER_LEVEL_LISTENER = frozenset({"max.connections", "max.connection.creation.rate", "num.network.threads"})
# Set as listener.name.<listener>.<mechanism>.<config> (Kafka's ListenerMechanismConfigs).
MECHANISM_CONFIGS = ("sasl.jaas.config", "sasl.login.callback.handler.class", "sasl.login.class",
                     "sasl.server.callback.handler.class", "connections.max.reauth.ms")
_LISTENER_PREFIX = "listener.name."


def base_name(key: str) -> tuple[str, bool]:
    """(the config a key sets, whether it is listener-prefixed)."""
    if not key.startswith(_LISTENER_PREFIX):
        return key, False
    rest = key[len(_LISTENER_PREFIX):].partition(".")[2]
    mechanism = next((m for m in MECHANISM_CONFIGS if rest.endswith("." + m)), None)
    return (mechanism or rest), True


def mode_of(key: str) -> str | None:
    """PER_BROKER, CLUSTER_WIDE or None (read-only) for a key as AlterConfigs names it."""
    base, prefixed = base_name(key)
    if base not in MODES:
        return None
    if prefixed:
        return CLUSTER_WIDE if base in CLUSTER_LEVEL_LISTENER else PER_BROKER
    return MODES[base]


def effect_of(key: str) -> str | None:
    return EFFECT.get(base_name(key)[0])


# Kafka's types and ranges for the dynamic configs Strom stores without a parser of its own
# (those in broker.DEFINITIONS are checked by building the config); None: no bound.
def _number(kind: type, low: float | None = None, high: float | None = None) -> Callable[[str], str | None]:
    def check(text: str) -> str | None:
        try:
            value = kind(text.strip())
        except ValueError:
            return f"Not a number of type {'INT' if kind is int else 'DOUBLE'}"
        if isinstance(value, float) and not math.isfinite(value):
            return "Not a finite number"
        if low is not None and value < low:
            return f"Value must be at least {low}"
        if high is not None and value > high:
            return f"Value must be no more than {high}"
        return None
    return check


def _bool(text: str) -> str | None:
    return None if text.strip().lower() in ("true", "false") else "Expected value to be either true or false"


_INT_MAX, _LONG_MAX, _SHORT_MAX = 2**31 - 1, 2**63 - 1, 2**15 - 1
VALUE_CHECKS: dict[str, Callable[[str], str | None]] = {
    "background.threads": _number(int, 1, _INT_MAX),
    "log.cleaner.io.buffer.size": _number(int, 0, _INT_MAX),
    "log.cleaner.io.max.bytes.per.second": _number(float),
    "remote.fetch.max.wait.ms": _number(int, 1, _INT_MAX),
    "remote.list.offsets.request.timeout.ms": _number(int, 1, _LONG_MAX),
    "remote.log.manager.copier.thread.pool.size": _number(int, 1, _INT_MAX),
    "remote.log.manager.copy.max.bytes.per.second": _number(int, 1, _LONG_MAX),
    "remote.log.manager.expiration.thread.pool.size": _number(int, 1, _INT_MAX),
    "remote.log.manager.fetch.max.bytes.per.second": _number(int, 1, _LONG_MAX),
    "remote.log.reader.threads": _number(int, 1, _INT_MAX),
    "remote.log.index.file.cache.total.size.bytes": _number(int, 1, _LONG_MAX),
    "transaction.partition.verification.enable": _bool,
    "sasl.kerberos.min.time.before.relogin": _number(int, None, _LONG_MAX),
    "sasl.kerberos.ticket.renew.jitter": _number(float),
    "sasl.kerberos.ticket.renew.window.factor": _number(float),
    "sasl.login.refresh.buffer.seconds": _number(int, None, _SHORT_MAX),
    "sasl.login.refresh.min.period.seconds": _number(int, None, _SHORT_MAX),
    "sasl.login.refresh.window.factor": _number(float),
    "sasl.login.refresh.window.jitter": _number(float),
}


def value_error(key: str, value: str) -> str | None:
    """Why `value` is not a valid value of dynamic config `key` by its Kafka type, or None."""
    check = VALUE_CHECKS.get(base_name(key)[0])
    reason = check(value) if check is not None else None
    return None if reason is None else f"Invalid value {value} for configuration {key}: {reason}"
