"""Java Kafka client settings, as Spark users pass them through `kafka.*` options, turned into
librdkafka's: the same setting under librdkafka's name, a knob the connector applies itself
(timeouts, poll and fetch sizes), or a clear refusal when nothing can honour it. Every
librdkafka setting remembers the option it came from, so that an error names what the user
wrote (`kafka.max.request.size`), not librdkafka's name for it (`message.max.bytes`).

librdkafka already takes most Java names as they are (acks, linger.ms, batch.size,
compression.type, client.id, security.protocol, fetch.max.bytes, ...); only the ones below
differ. Options are shared between Spark's source and sink (one options dict for both is
common): a setting for the other role is ignored, as Spark's connector ignores it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from strom.jaas import parse_jaas

# Java name -> librdkafka name, same value.
RENAMED = {
    "max.request.size": "message.max.bytes",
    "fetch.max.wait.ms": "fetch.wait.max.ms",
    "receive.buffer.bytes": "socket.receive.buffer.bytes",
    "send.buffer.bytes": "socket.send.buffer.bytes",
    "sasl.mechanism": "sasl.mechanisms",
    "ssl.truststore.certificates": "ssl.ca.pem",
    "ssl.keystore.certificate.chain": "ssl.certificate.pem",
    "ssl.keystore.key": "ssl.key.pem",
}
# Applied by the connector (ClientOptions fields), not by librdkafka.
KNOBS = {"request.timeout.ms", "max.poll.records", "max.block.ms", "default.api.timeout.ms"}
# Kept under the same name for librdkafka, and read by the connector's own fetch path too:
# checked here, as the fetch path needs numbers.
FETCH_SIZES = {"fetch.max.bytes", "max.partition.fetch.bytes", "fetch.min.bytes", "fetch.wait.max.ms"}
# Java-only settings with nothing to do in a Python client; dropped. The connector assigns
# partitions itself and never joins a group, so an assignment strategy has nothing to assign.
IGNORED = {"metric.reporters", "metrics.num.samples", "metrics.recording.level", "metrics.sample.window.ms",
           "auto.include.jmx.reporter", "ssl.truststore.type", "ssl.keystore.type", "ssl.protocol",
           "ssl.keymanager.algorithm", "ssl.trustmanager.algorithm", "ssl.secure.random.implementation",
           "ssl.engine.factory.class", "enable.metrics.push", "partition.assignment.strategy"}
# librdkafka refuses a message.max.bytes below this; a smaller max.request.size (valid in Java)
# is enforced by the sink itself.
LIBRDKAFKA_MIN_MESSAGE_MAX_BYTES = 1000
# librdkafka settings of one role only: left out of the other role's clients (librdkafka would
# warn that it ignores them), so one options dict serves source and sink alike.
CONSUMER_ONLY = {"group.id", "group.instance.id", "session.timeout.ms", "heartbeat.interval.ms",
                 "group.protocol", "group.protocol.type", "group.remote.assignor", "max.poll.interval.ms",
                 "coordinator.query.interval.ms", "enable.auto.offset.store", "auto.commit.interval.ms",
                 "queued.min.messages", "queued.max.messages.kbytes", "fetch.wait.max.ms", "fetch.queue.backoff.ms",
                 "fetch.message.max.bytes", "max.partition.fetch.bytes", "fetch.max.bytes", "fetch.min.bytes",
                 "fetch.error.backoff.ms", "isolation.level", "enable.partition.eof", "check.crcs",
                 "allow.auto.create.topics", "client.rack"}
PRODUCER_ONLY = {"transactional.id", "transaction.timeout.ms", "enable.idempotence", "enable.gapless.guarantee",
                 "queue.buffering.max.messages", "queue.buffering.max.kbytes", "queue.buffering.max.ms",
                 "linger.ms", "message.send.max.retries", "retries", "queue.buffering.backpressure.threshold",
                 "compression.codec", "compression.type", "compression.level", "batch.num.messages", "batch.size",
                 "sticky.partitioning.linger.ms", "request.required.acks", "acks", "request.timeout.ms",
                 "message.timeout.ms", "delivery.timeout.ms", "partitioner"}
# Java's partitioners -> librdkafka's `partitioner`.
PARTITIONERS = {
    "org.apache.kafka.clients.producer.internals.DefaultPartitioner": "murmur2_random",
    "org.apache.kafka.clients.producer.UniformStickyPartitioner": "random",
}
# Refused as Spark's connector refuses them, for the role they concern (the other role ignores
# them), and what no Python client can do.
SOURCE_REFUSED = {
    "auto.offset.reset": "set the source option 'startingOffsets' instead",
    "enable.auto.commit": "offsets are kept in Spark's checkpoint, never committed to Kafka",
    "key.deserializer": "keys are always binary; use DataFrame operations to decode them",
    "value.deserializer": "values are always binary; use DataFrame operations to decode them",
}
SINK_REFUSED = {
    "key.serializer": "keys must be binary or string columns",
    "value.serializer": "values must be binary or string columns",
    "transactional.id": "set the sink option 'transactionalIdPrefix' for exactly-once streaming writes",
}
REFUSED = {
    "interceptor.classes": "Java interceptors cannot run in a Python client",
    "sasl.login.callback.handler.class": "Java callback handlers cannot run in a Python client",
    "sasl.client.callback.handler.class": "Java callback handlers cannot run in a Python client",
    "sasl.login.class": "Java login classes cannot run in a Python client",
}
# What a JKS or PKCS#12 truststore has to become for librdkafka.
_PEM_ONLY = "librdkafka reads PEM certificates: convert it (keytool -exportcert -rfc) and set ssl.truststore.type=PEM"


class ClientConfError(ValueError):
    """A `kafka.*` setting no Python client can honour (the message says why)."""


@dataclass(frozen=True)
class ClientConf:
    """librdkafka settings plus the Java knobs the connector applies itself (None: unset)."""
    conf: dict[str, str]
    request_timeout_ms: int | None = None
    max_poll_records: int | None = None
    max_block_ms: int | None = None
    given: frozenset[str] = field(default_factory=frozenset)  # the Java names the user set
    # librdkafka name -> the option the user wrote ("kafka.max.request.size"), for messages
    origin: dict[str, str] = field(default_factory=dict)
    exclude_internal_topics: bool = True  # Java's exclude.internal.topics, for subscribePattern
    max_request_size: int | None = None  # below librdkafka's minimum: checked by the sink


def for_role(conf: dict[str, str], role: str) -> dict[str, str]:
    """`conf` without the settings librdkafka knows for the other role only ("consumer",
    "producer"; "admin" keeps neither)."""
    drop = {"consumer": PRODUCER_ONLY, "producer": CONSUMER_ONLY}.get(role, CONSUMER_ONLY | PRODUCER_ONLY)
    return {k: v for k, v in conf.items() if k not in drop}


def _int(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ClientConfError(f"kafka.{name} must be a non-negative integer, not {raw!r}")
    return value


def _jaas(raw: str, mechanism: str) -> dict[str, str]:
    try:
        options = parse_jaas(raw)
    except ValueError as e:
        raise ClientConfError(f"kafka.sasl.jaas.config cannot be read: {e}") from None
    if mechanism.upper() == "OAUTHBEARER":
        sub = options.get("unsecuredLoginStringClaim_sub")
        return {"sasl.oauthbearer.config": f"principal={sub}"} if sub else {}
    if options.get("tokenauth", "").lower() == "true":
        raise ClientConfError("kafka.sasl.jaas.config: delegation-token (tokenauth) logins are not "
                              "supported by librdkafka")
    out = {}
    if "username" in options:
        out["sasl.username"] = options["username"]
    if "password" in options:
        out["sasl.password"] = options["password"]
    return out


def _bool(name: str, raw: str) -> bool:
    if raw.strip().lower() not in ("true", "false"):
        raise ClientConfError(f"kafka.{name} must be true or false, not {raw!r}")
    return raw.strip().lower() == "true"


def translate(settings: Mapping[str, str], role: str = "source") -> ClientConf:
    """`settings`: client settings by Java (or librdkafka) name, without the `kafka.` prefix,
    for a "source" or a "sink"."""
    conf: dict[str, str] = {}
    knobs: dict[str, int] = {}
    origin: dict[str, str] = {}
    exclude_internal, max_request_size = True, None
    refused = {**REFUSED, **(SOURCE_REFUSED if role == "source" else SINK_REFUSED)}
    other_role = SINK_REFUSED if role == "source" else SOURCE_REFUSED
    store_type = {k: settings.get(f"ssl.{k}.type", "PEM").strip().upper() for k in ("truststore", "keystore")}
    for name, value in settings.items():
        before = set(conf)
        if name in refused:
            raise ClientConfError(f"Kafka option 'kafka.{name}' is not supported: {refused[name]}")
        if name in IGNORED or name in other_role:
            continue
        if name in KNOBS:
            knobs[name] = _int(name, value)
        elif name == "exclude.internal.topics":
            exclude_internal = _bool(name, value)
        elif name == "max.request.size":
            size = _int(name, value)
            if size < LIBRDKAFKA_MIN_MESSAGE_MAX_BYTES:
                max_request_size, size = size, LIBRDKAFKA_MIN_MESSAGE_MAX_BYTES
            conf["message.max.bytes"] = str(size)
        elif name == "ssl.endpoint.identification.algorithm":
            # Java turns host name checks off with an empty value, librdkafka with "none".
            conf[name] = value.strip().lower() or "none"
        elif name in RENAMED:
            conf[RENAMED[name]] = value
            if RENAMED[name] in FETCH_SIZES:
                _int(name, value)
        elif name in FETCH_SIZES:
            conf[name] = str(_int(name, value))
        elif name == "buffer.memory":
            conf["queue.buffering.max.kbytes"] = str(max(1, -(-_int(name, value) // 1024)))
        elif name == "partitioner.class":
            if value.strip() not in PARTITIONERS:
                raise ClientConfError(
                    f"kafka.partitioner.class={value} has no librdkafka equivalent (Java partitioners "
                    f"cannot run in a Python client): use {' or '.join(sorted(PARTITIONERS))}, or write "
                    "a 'partition' column to choose partitions yourself")
            conf["partitioner"] = PARTITIONERS[value.strip()]
        elif name == "ssl.truststore.location":
            if store_type["truststore"] != "PEM":
                raise ClientConfError(f"kafka.ssl.truststore.type={store_type['truststore']}: {_PEM_ONLY}")
            conf["ssl.ca.location"] = value
        elif name == "ssl.keystore.location":
            if store_type["keystore"] == "PKCS12":
                conf["ssl.keystore.location"] = value  # librdkafka reads PKCS#12 keystores itself
            elif store_type["keystore"] == "PEM":  # Java's PEM keystore: key and chain in one file
                conf["ssl.certificate.location"] = conf["ssl.key.location"] = value
            else:
                raise ClientConfError(f"kafka.ssl.keystore.type={store_type['keystore']}: librdkafka reads "
                                      "PEM or PKCS12 keystores")
        elif name == "ssl.keystore.password" and store_type["keystore"] == "PEM":
            conf["ssl.key.password"] = value
        elif name == "sasl.jaas.config":
            mechanism = settings.get("sasl.mechanism") or settings.get("sasl.mechanisms") or "GSSAPI"
            conf.update(_jaas(value, mechanism))
        else:
            conf[name] = value
        origin.update((key, f"kafka.{name}") for key in set(conf) - before)
    return ClientConf(conf, knobs.get("request.timeout.ms", knobs.get("default.api.timeout.ms")),
                      knobs.get("max.poll.records"), knobs.get("max.block.ms"), frozenset(settings),
                      origin, exclude_internal, max_request_size)
