"""Java Kafka client settings, as Spark users pass them through `kafka.*` options, turned into
librdkafka's: the same setting under librdkafka's name, a knob the connector applies itself
(timeouts, poll sizes), or a clear refusal when nothing can honour it.

librdkafka already takes most Java names as they are (acks, linger.ms, batch.size,
compression.type, client.id, security.protocol, ...); only the ones below differ."""

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
# Java-only settings with nothing to do in a Python client; dropped.
IGNORED = {"metric.reporters", "metrics.num.samples", "metrics.recording.level", "metrics.sample.window.ms",
           "auto.include.jmx.reporter", "ssl.truststore.type", "ssl.keystore.type", "ssl.protocol",
           "ssl.keymanager.algorithm", "ssl.trustmanager.algorithm", "ssl.secure.random.implementation",
           "ssl.engine.factory.class", "enable.metrics.push"}
# Java's partitioners -> librdkafka's `partitioner`.
PARTITIONERS = {
    "org.apache.kafka.clients.producer.internals.DefaultPartitioner": "murmur2_random",
    "org.apache.kafka.clients.producer.UniformStickyPartitioner": "random",
}
REFUSED = {
    "auto.offset.reset": "set the source option 'startingOffsets' instead",
    "enable.auto.commit": "offsets are kept in Spark's checkpoint, never committed to Kafka",
    "key.deserializer": "keys are always binary; use DataFrame operations to decode them",
    "value.deserializer": "values are always binary; use DataFrame operations to decode them",
    "key.serializer": "keys must be binary or string columns",
    "value.serializer": "values must be binary or string columns",
    "interceptor.classes": "Java interceptors cannot run in a Python client",
    "transactional.id": "set the sink option 'transactionalIdPrefix' for exactly-once streaming writes",
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


def translate(settings: Mapping[str, str]) -> ClientConf:
    """`settings`: client settings by Java (or librdkafka) name, without the `kafka.` prefix."""
    conf: dict[str, str] = {}
    knobs: dict[str, int] = {}
    store_type = {k: settings.get(f"ssl.{k}.type", "PEM").strip().upper() for k in ("truststore", "keystore")}
    for name, value in settings.items():
        if name in REFUSED:
            raise ClientConfError(f"Kafka option '{name}' is not supported: {REFUSED[name]}")
        if name in IGNORED:
            continue
        if name in KNOBS:
            knobs[name] = _int(name, value)
        elif name in RENAMED:
            conf[RENAMED[name]] = value
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
    return ClientConf(conf, knobs.get("request.timeout.ms", knobs.get("default.api.timeout.ms")),
                      knobs.get("max.poll.records"), knobs.get("max.block.ms"), frozenset(settings))
