"""The clients behind `strom producer-perf-test` and `strom consumer-perf-test`: librdkafka
(confluent-kafka) when it is installed, since the numbers should measure the cluster rather
than the client, and kafka-python (a dependency of Strom) otherwise. Both take Kafka's Java
client properties:

- librdkafka knows most Java names as they are (acks, linger.ms, batch.size, compression.type,
  client.id, security.protocol, ssl.*, sasl.*, fetch.min.bytes, ...); the ones it spells
  differently are renamed (RENAMED, buffer.memory, the truststore/keystore and JAAS settings),
  Java-only ones are left out (JAVA_ONLY), and any other name librdkafka refuses is left out
  too; both are named on stderr.
- kafka-python takes them through ClientSettings.kafka_python_config (dotted names become its
  underscored ones; those it does not know are named on stderr and left out).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import click

from strom.cli.common import ClientSettings, CommandError
from strom.jaas import parse_jaas

# Java name -> librdkafka name, same value.
RENAMED = {"max.request.size": "message.max.bytes", "fetch.max.wait.ms": "fetch.wait.max.ms",
           "receive.buffer.bytes": "socket.receive.buffer.bytes", "send.buffer.bytes": "socket.send.buffer.bytes",
           "sasl.mechanism": "sasl.mechanisms", "ssl.truststore.location": "ssl.ca.location",
           "ssl.truststore.certificates": "ssl.ca.pem", "ssl.keystore.certificate.chain": "ssl.certificate.pem",
           "ssl.keystore.key": "ssl.key.pem"}
# Java client settings with nothing to do in librdkafka (serializers: the tools send bytes).
JAVA_ONLY = {"key.serializer", "value.serializer", "key.deserializer", "value.deserializer", "metric.reporters",
             "metrics.num.samples", "metrics.recording.level", "metrics.sample.window.ms", "auto.include.jmx.reporter",
             "ssl.truststore.type", "ssl.keystore.type", "ssl.truststore.password", "ssl.protocol",
             "ssl.keymanager.algorithm", "ssl.trustmanager.algorithm", "interceptor.classes", "partitioner.class",
             "max.block.ms", "max.poll.records", "default.api.timeout.ms", "enable.metrics.push"}
MAX_BLOCK_MS = 60_000  # Java's max.block.ms: how long send() waits for the topic's metadata
MAX_POLL_RECORDS = 500  # Java's max.poll.records: records handed over per poll
STATS_INTERVAL_MS = 500  # librdkafka statistics for --print-metrics


def confluent_kafka_available() -> bool:
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        return False
    return True


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def warn_ignored(names: list[str]) -> None:
    if names:
        click.echo(f"Warning: ignoring client properties this client does not know: {', '.join(sorted(names))}",
                   err=True)


def librdkafka_conf(props: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """librdkafka settings for Java client properties, and the names left out."""
    conf: dict[str, str] = {}
    ignored = []
    keystore_type = props.get("ssl.keystore.type", "JKS").strip().upper()
    for name, value in props.items():
        if name in JAVA_ONLY:
            ignored.append(name)
        elif name in RENAMED:
            conf[RENAMED[name]] = value
        elif name == "buffer.memory":
            conf["queue.buffering.max.kbytes"] = str(max(1, -(-int(value) // 1024)))
        elif name == "ssl.endpoint.identification.algorithm":  # Java turns checks off with "", librdkafka "none"
            conf[name] = value.strip().lower() or "none"
        elif name == "ssl.keystore.location" and keystore_type == "PEM":  # key and chain in one file
            conf["ssl.certificate.location"] = conf["ssl.key.location"] = value
        elif name == "ssl.keystore.password" and keystore_type == "PEM":
            conf["ssl.key.password"] = value
        elif name == "sasl.jaas.config":
            options = parse_jaas(value)
            conf.update({f"sasl.{k}": options[k] for k in ("username", "password") if k in options})
        else:
            conf[name] = value
    return conf, ignored


def make_librdkafka(kind: Callable[[dict], Any], conf: dict[str, Any]) -> Any:
    """A librdkafka client; the settings it does not know are left out and named on stderr,
    a value it refuses is a CommandError."""
    from confluent_kafka import KafkaException

    ignored = []
    while True:
        try:
            client = kind(conf)
            break
        except KafkaException as e:
            text = e.args[0].str()
            unknown = re.fullmatch(r'No such configuration property: "(.+)"', text)
            if not unknown or unknown.group(1) not in conf:
                raise CommandError(f"client properties refused: {text}") from None
            ignored.append(unknown.group(1))
            del conf[unknown.group(1)]
    warn_ignored(ignored)
    return client


def _knob(props: Mapping[str, str], name: str, default: int) -> int:
    try:
        value = int(props.get(name, default))
    except ValueError:
        raise CommandError(f"{name} must be a number, got {props[name]!r}") from None
    if value < 0:
        raise CommandError(f"{name} must not be negative, got {value}")
    return value


class Failures:
    """Records the cluster did not take: each distinct reason is printed once, as it happens."""

    def __init__(self) -> None:
        self.count = 0
        self.seen: set[str] = set()

    def add(self, reason: str) -> None:
        self.count += 1
        if reason not in self.seen:
            self.seen.add(reason)
            click.echo(f"Error: sending a record failed: {reason}", err=True)


def _librdkafka_metrics(stats: dict[str, Any] | None) -> list[tuple[str, object]]:
    """librdkafka's statistics in Kafka's `group:name:{tags}` form: the client's totals and
    each broker connection's counters and latency windows (averages and 99th percentiles, µs)."""
    if not stats:
        return []
    out: list[tuple[str, object]] = []
    client = f"{{client-id={stats.get('client_id', '')}}}"
    for key, value in stats.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out.append((f"librdkafka:{key}:{client}", float(value)))
    for broker in stats.get("brokers", {}).values():
        tags = f"{{client-id={stats.get('client_id', '')}, broker={broker.get('name', '')}}}"
        for key, value in broker.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                out.append((f"librdkafka-broker:{key}:{tags}", float(value)))
            elif isinstance(value, dict) and "avg" in value:
                out.extend((f"librdkafka-broker:{key}-{p}:{tags}", float(value[p])) for p in ("avg", "p99"))
    return out


def _kafka_python_metrics(raw: dict | None) -> list[tuple[str, object]]:
    """kafka-python's metrics, named as Kafka's Java client names them."""
    out: list[tuple[str, object]] = []
    for name, metric in (raw or {}).items():
        tags = ", ".join(f"{k}={v}" for k, v in name.tags.items())
        value = metric.value()
        out.append((f"{name.group}:{name.name}:{{{tags}}}", float(value) if isinstance(value, int | float) else value))
    return out


# --- producers ----------------------------------------------------------------------------------
class Producer:
    """What producer-perf-test asks of a client. `record(latency_ms, size, now_ms)` is called
    once per acknowledged record; failures go to `failures`."""

    name = ""

    def wait_for_topic(self) -> None:
        raise NotImplementedError

    def send(self, payload: bytes) -> None:
        raise NotImplementedError

    def pause(self, seconds: float) -> None:
        """Sleep while throttled (acknowledgements are still served)."""
        time.sleep(seconds)

    def init_transactions(self) -> None:
        raise NotImplementedError

    def begin_transaction(self) -> None:
        raise NotImplementedError

    def commit_transaction(self) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def metrics(self) -> list[tuple[str, object]]:
        raise NotImplementedError


class LibrdkafkaProducer(Producer):
    name = "confluent-kafka"

    def __init__(self, props: dict[str, str], topic: str, record: Callable[[int, int, int], None],
                 failures: Failures, print_metrics: bool) -> None:
        from confluent_kafka import Producer as RdProducer

        self.topic, self.record, self.failures = topic, record, failures
        self.max_block_ms = _knob(props, "max.block.ms", MAX_BLOCK_MS)
        conf, ignored = librdkafka_conf(props)
        warn_ignored([n for n in ignored if n not in ("key.serializer", "value.serializer", "max.block.ms")])
        conf["on_delivery"] = self._delivered
        self.stats: dict[str, Any] | None = None
        if print_metrics:
            conf.setdefault("statistics.interval.ms", str(STATS_INTERVAL_MS))
            conf["stats_cb"] = self._stats
        self.producer = make_librdkafka(RdProducer, conf)
        self.timeout_s = self.max_block_ms / 1000

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            self.record(int((msg.latency() or 0) * 1000), len(msg), now_ms())
        else:
            self.failures.add(err.str())

    def _stats(self, text: str) -> None:
        self.stats = json.loads(text)

    def wait_for_topic(self) -> None:
        """As Java's send() waits up to max.block.ms for the topic's metadata (the broker may
        create it): every partition with a leader, or a CommandError."""
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                topic = self.producer.list_topics(self.topic, timeout=max(0.1, deadline - time.monotonic()))
                meta = topic.topics.get(self.topic)
                if meta is not None and meta.error is None and meta.partitions and all(
                        p.leader >= 0 for p in meta.partitions.values()):
                    return
            except KafkaException:
                pass
            if time.monotonic() >= deadline:
                raise CommandError(f"Topic {self.topic} not present in metadata after {self.max_block_ms} ms.")
            time.sleep(0.1)

    def send(self, payload: bytes) -> None:
        from confluent_kafka import KafkaException

        while True:
            try:
                self.producer.produce(self.topic, payload)
                break
            except BufferError:  # queue.buffering.max.*: wait for acknowledgements, as Java's send() blocks
                self.producer.poll(0.005)
            except KafkaException as e:  # a record too large, say: Java's send() fails that record alone
                self.failures.add(e.args[0].str())
                break
        self.producer.poll(0)  # acknowledgements as they come, so latencies are not queued behind sends

    def pause(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.producer.poll(left)

    def _txn(self, call: Callable[..., None], *args: Any) -> None:
        from confluent_kafka import KafkaException

        try:
            call(*args)
        except KafkaException as e:
            raise CommandError(f"transaction failed: {e.args[0].str()}") from None

    def init_transactions(self) -> None:
        self._txn(self.producer.init_transactions, self.timeout_s)

    def begin_transaction(self) -> None:
        self._txn(self.producer.begin_transaction)

    def commit_transaction(self) -> None:
        self._txn(self.producer.commit_transaction)

    def flush(self) -> None:
        while self.producer.flush(1.0):
            pass

    def close(self) -> None:
        self.flush()

    def metrics(self) -> list[tuple[str, object]]:
        seen = self.stats
        deadline = time.monotonic() + 2 * STATS_INTERVAL_MS / 1000
        while self.stats is seen and time.monotonic() < deadline:  # a report covering the whole run
            self.producer.poll(0.05)
        return _librdkafka_metrics(self.stats)


class KafkaPythonProducer(Producer):
    name = "kafka-python"

    def __init__(self, client: ClientSettings, props: dict[str, str], topic: str,
                 record: Callable[[int, int, int], None], failures: Failures) -> None:
        from kafka import KafkaProducer

        self.topic, self.record, self.failures = topic, record, failures
        props = {k: v for k, v in props.items() if k not in ("key.serializer", "value.serializer")}
        self.producer = KafkaProducer(**client.kafka_python_config(KafkaProducer.DEFAULT_CONFIG, extra=props))
        self.max_block_ms = self.producer.config["max_block_ms"]

    def _acked(self, start: int, size: int, _metadata: Any) -> None:
        now = now_ms()
        self.record(now - start, size, now)

    def _failed(self, error: Exception) -> None:
        name = type(error).__name__
        self.failures.add(f"{name}: {error}" if str(error) and str(error) != name else name)

    def wait_for_topic(self) -> None:
        from kafka.errors import KafkaTimeoutError

        try:
            self.producer.partitions_for(self.topic)
        except KafkaTimeoutError:
            raise CommandError(f"Topic {self.topic} not present in metadata after {self.max_block_ms} ms.") from None

    def send(self, payload: bytes) -> None:
        from kafka.errors import KafkaError

        try:
            future = self.producer.send(self.topic, value=payload)
        except KafkaError as e:  # a record too large, say: Java's send() fails that record alone
            self._failed(e)
            return
        future.add_callback(self._acked, now_ms(), len(payload))
        future.add_errback(self._failed)

    def init_transactions(self) -> None:
        self.producer.init_transactions()

    def begin_transaction(self) -> None:
        self.producer.begin_transaction()

    def commit_transaction(self) -> None:
        self.producer.commit_transaction()

    def flush(self) -> None:
        self.producer.flush()

    def close(self) -> None:
        self.producer.close()

    def metrics(self) -> list[tuple[str, object]]:
        return _kafka_python_metrics(self.producer.metrics(raw=True))


# --- consumers ----------------------------------------------------------------------------------
class Consumer:
    """What consumer-perf-test asks of a client: subscribe with rebalance callbacks, then polls
    that return (records, bytes of keys and values)."""

    name = ""

    def poll(self, max_records: int, timeout_s: float) -> tuple[int, int]:
        raise NotImplementedError

    def metrics(self) -> list[tuple[str, object]]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class LibrdkafkaConsumer(Consumer):
    name = "confluent-kafka"

    def __init__(self, props: dict[str, str], topic: str, assigned: Callable[[], None],
                 revoked: Callable[[], None], print_metrics: bool) -> None:
        from confluent_kafka import Consumer as RdConsumer

        self.max_poll_records = _knob(props, "max.poll.records", MAX_POLL_RECORDS) or MAX_POLL_RECORDS
        conf, ignored = librdkafka_conf(props)
        warn_ignored([n for n in ignored if n not in ("key.deserializer", "value.deserializer", "max.poll.records")])
        self.stats: dict[str, Any] | None = None
        if print_metrics:
            conf.setdefault("statistics.interval.ms", str(STATS_INTERVAL_MS))
            conf["stats_cb"] = self._stats
        self.errors: set[str] = set()
        self.consumer = make_librdkafka(RdConsumer, conf)
        self.consumer.subscribe([topic], on_assign=lambda c, ps: assigned(), on_revoke=lambda c, ps: revoked())

    def _stats(self, text: str) -> None:
        self.stats = json.loads(text)

    def poll(self, max_records: int, timeout_s: float) -> tuple[int, int]:
        count = size = 0
        for m in self.consumer.consume(min(max_records, self.max_poll_records), timeout_s):
            error = m.error()
            if error is not None:
                if error.fatal():
                    raise CommandError(f"the consumer failed: {error.str()}")
                if error.str() not in self.errors:  # an unknown topic, say: Java's consumer waits too
                    self.errors.add(error.str())
                    click.echo(f"Warning: {error.str()}", err=True)
                continue
            key, value = m.key(), m.value()
            count += 1
            size += (len(key) if key is not None else 0) + (len(value) if value is not None else 0)
        return count, size

    def metrics(self) -> list[tuple[str, object]]:
        seen = self.stats
        assignment = self.consumer.assignment()
        self.consumer.pause(assignment)  # serve the statistics callback without fetching more
        deadline = time.monotonic() + 2 * STATS_INTERVAL_MS / 1000
        while self.stats is seen and time.monotonic() < deadline:
            self.consumer.poll(0.05)
        return _librdkafka_metrics(self.stats)

    def close(self) -> None:
        self.consumer.close()


class KafkaPythonConsumer(Consumer):
    name = "kafka-python"

    def __init__(self, client: ClientSettings, props: dict[str, str], topic: str, assigned: Callable[[], None],
                 revoked: Callable[[], None]) -> None:
        from kafka import ConsumerRebalanceListener, KafkaConsumer

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked_partitions: Any) -> None:
                revoked()

            def on_partitions_assigned(self, assigned_partitions: Any) -> None:
                assigned()

        props = {k: v for k, v in props.items() if k not in ("key.deserializer", "value.deserializer")}
        self.consumer = KafkaConsumer(**client.kafka_python_config(KafkaConsumer.DEFAULT_CONFIG, extra=props))
        self.consumer.subscribe(topics=[topic], listener=Listener())

    def poll(self, max_records: int, timeout_s: float) -> tuple[int, int]:
        count = size = 0
        batches = self.consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        for records in batches.values():
            count += len(records)
            size += sum(max(r.serialized_key_size, 0) + max(r.serialized_value_size, 0) for r in records)
        return count, size

    def metrics(self) -> list[tuple[str, object]]:
        return _kafka_python_metrics(self.consumer.metrics(raw=True))

    def close(self) -> None:
        self.consumer.close()
