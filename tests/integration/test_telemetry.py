"""Client telemetry (KIP-714): GetTelemetrySubscriptions and PushTelemetry against a real
broker, with confluent-kafka (librdkafka pushes its metrics when the broker asks for them) and
by hand on the wire; CLIENT_METRICS subscriptions through IncrementalAlterConfigs and
DescribeConfigs; what the Prometheus endpoint shows; the bounds, with a fake clock."""

from __future__ import annotations

import gzip
import logging
import struct
import time
import uuid

import cramjam
import pytest
from confluent_kafka import Producer

from strom.client import Connection
from strom.metrics import client_telemetry
from strom.metrics.client_telemetry import (
    ClientTelemetry,
    PayloadTooLarge,
    decompress,
    parse_metrics,
)
from strom.testing import BrokerProcess, Cluster, metric_value, scrape, unique_name, wait_for

GET, PUSH, DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 71, 72, 32, 44
CLIENT_METRICS = 16
SET, DELETE, APPEND = 0, 1, 2
NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)
INVALID_CONFIG, INVALID_REQUEST, UNSUPPORTED_COMPRESSION_TYPE = 40, 42, 76
INVALID_RECORD, THROTTLING_QUOTA_EXCEEDED = 87, 89
UNKNOWN_SUBSCRIPTION_ID, TELEMETRY_TOO_LARGE = 117, 118
ZERO = uuid.UUID(int=0)


@pytest.fixture
def broker():
    with BrokerProcess(overrides={"metrics.port": "0"},
                       env={"STROM_LOG_LEVEL": "INFO,strom.metrics.client_telemetry=DEBUG"}) as b:
        yield b


def connect(broker: BrokerProcess, client_id: str = "strom") -> Connection:
    host, port = broker.bootstrap.rsplit(":", 1)
    return Connection(host, int(port), client_id=client_id)


def alter(conn: Connection, name: str, *changes: tuple[str, int, str | None]) -> tuple[int, str | None]:
    body = conn.call(INCREMENTAL_ALTER_CONFIGS, 1, {
        "resources": [{"resource_type": CLIENT_METRICS, "resource_name": name,
                       "configs": [{"name": k, "config_operation": op, "value": v} for k, op, v in changes]}],
        "validate_only": False})
    result = body.responses[0]
    return result.error_code, result.error_message


def subscribe(conn: Connection, name: str, **configs: str) -> None:
    assert alter(conn, name, *((k.replace("_", "."), SET, v) for k, v in configs.items())) == (0, None)


def describe(conn: Connection, name: str) -> dict[str, tuple[str, int]]:
    body = conn.call(DESCRIBE_CONFIGS, 4, {"resources": [{"resource_type": CLIENT_METRICS, "resource_name": name,
                                                          "configuration_keys": None}],
                                           "include_synonyms": False, "include_documentation": False})
    result = body.results[0]
    assert result.error_code == 0, result
    return {c.name: (c.value, c.config_source) for c in result.configs}


def get(conn: Connection, instance_id: uuid.UUID = ZERO):
    return conn.call(GET, 0, {"client_instance_id": instance_id})


def push(conn: Connection, instance_id: uuid.UUID, subscription_id: int, payload: bytes = b"",
         codec: int = NONE, terminating: bool = False) -> int:
    body = conn.call(PUSH, 0, {"client_instance_id": instance_id, "subscription_id": subscription_id,
                               "terminating": terminating, "compression_type": codec, "metrics": payload})
    return body.error_code


# --- a hand-made OTLP MetricsData -----------------------------------------------------------

def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _len(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _fixed64(number: int, raw: bytes) -> bytes:
    return _varint(number << 3 | 1) + raw


def otlp(*points: tuple[str, float | int, dict[str, str]], kind: int = 5) -> bytes:
    """MetricsData with one gauge (kind 5) or sum (kind 7) data point per metric: a double for
    a float, an int64 for an int."""
    metrics = b""
    for name, value, attributes in points:
        raw = _fixed64(6, struct.pack("<q", value)) if isinstance(value, int) else _fixed64(4, struct.pack("<d", value))
        for key, text in attributes.items():
            raw += _len(7, _len(1, key.encode()) + _len(2, _len(1, text.encode())))
        metrics += _len(2, _len(1, name.encode()) + _len(3, b"ms") + _len(kind, _len(1, raw)))
    resource = _len(1, _len(1, _len(1, b"client_id") + _len(2, _len(1, b"hand"))))
    return _len(1, resource + _len(2, metrics))


def telemetry_series(samples) -> dict[tuple[str, str, str], float]:
    out = {}
    for (name, labels), value in samples.items():
        if name == "strom_client_telemetry":
            d = dict(labels)
            out[(d["client_instance_id"], d["name"], d["attributes"])] = value
    return out


def requests_of(samples, api: str) -> float:
    return sum(v for (name, labels), v in samples.items()
               if name == "strom_requests_total" and dict(labels).get("request") == api)


class LogLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def telemetry_producer(broker: BrokerProcess, client_id: str) -> tuple[Producer, LogLines]:
    lines = LogLines()
    logger = logging.getLogger(unique_name("rdkafka-telemetry"))
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(lines)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "client.id": client_id,
                         "enable.metrics.push": True, "debug": "telemetry", "logger": logger,
                         "linger.ms": 5})
    return producer, lines


def produce_until(producer: Producer, topic: str, predicate, timeout: float, what: str):
    """Produce a record and serve the producer's callbacks every 100 ms until `predicate`."""
    deadline = time.monotonic() + timeout
    while True:
        producer.produce(topic, b"v")
        producer.poll(0.1)
        result = predicate()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"


# --- confluent-kafka ------------------------------------------------------------------------

def test_without_a_subscription_clients_push_nothing(broker):
    with connect(broker) as conn:
        answer = get(conn)
    assert answer.error_code == 0
    assert answer.client_instance_id not in (None, ZERO)
    assert answer.requested_metrics == []  # no metrics: the client collects and pushes none
    assert answer.push_interval_ms == 300_000
    assert answer.accepted_compression_types == [ZSTD, LZ4, GZIP, SNAPPY]
    assert answer.telemetry_max_bytes == 1 << 20
    assert answer.delta_temporality is True

    producer, lines = telemetry_producer(broker, "no-subscription")
    topic = unique_name("telemetry-off")
    produce_until(producer, topic, lambda: any("requested metrics count 0" in line for line in lines.lines),
                  15, "librdkafka to get its (empty) subscription")
    # Two more seconds of producing: no push (a subscription's interval could be 100 ms).
    until = time.monotonic() + 2.0
    produce_until(producer, topic, lambda: time.monotonic() > until, 5, "two seconds of producing")
    assert producer.flush(10) == 0
    samples = scrape(broker.metrics_url)
    assert requests_of(samples, "GetTelemetrySubscriptions") >= 2  # ours and the producer's
    assert requests_of(samples, "PushTelemetry") == 0
    assert metric_value(samples, "strom_client_telemetry_pushes_total") == 0
    assert metric_value(samples, "strom_client_telemetry_subscriptions") == 0
    assert metric_value(samples, "strom_client_telemetry_instances") == 2
    assert telemetry_series(samples) == {}
    assert not any("PushTelemetryRequest" in line for line in lines.lines)


def test_a_subscription_makes_the_producer_push_its_metrics(broker):
    with connect(broker) as conn:
        subscribe(conn, "producers", metrics="org.apache.kafka.producer.", interval_ms="1000",
                  match="client_software_name=confluent-kafka-python,client_id=pushing-.*")
        assert describe(conn, "producers") == {
            "metrics": ("org.apache.kafka.producer.", 7), "interval.ms": ("1000", 7),
            "match": ("client_software_name=confluent-kafka-python,client_id=pushing-.*", 7)}

    producer, lines = telemetry_producer(broker, "pushing-producer")
    topic = unique_name("telemetry-on")
    began = time.monotonic()

    def pushed():
        series = telemetry_series(scrape(broker.metrics_url))
        return series if any(name == "org.apache.kafka.producer.record.queue.time.max" for _, name, _ in series) else None

    series = produce_until(producer, topic, pushed, 10, "the producer's metrics at the endpoint")
    assert time.monotonic() - began < 5  # the first push comes after 0.5 to 1.5 intervals
    assert any("requested metrics count 1" in line for line in lines.lines)
    instances = {instance for instance, _, _ in series}
    assert len(instances) == 1
    instance = instances.pop()
    names = {name for _, name, _ in series}
    assert all(name.startswith("org.apache.kafka.producer.") for name in names)
    assert "org.apache.kafka.producer.node.request.latency.avg" in names
    assert any(attrs.startswith("node.id=") for _, name, attrs in series
               if name == "org.apache.kafka.producer.node.request.latency.avg")
    samples = scrape(broker.metrics_url)
    assert metric_value(samples, "strom_client_telemetry_info", client_instance_id=instance,
                        client_id="pushing-producer", client_software_name="confluent-kafka-python",
                        client_software_version=next(
                            dict(labels)["client_software_version"] for (name, labels) in samples
                            if name == "strom_client_telemetry_info"),
                        client_source_address="127.0.0.1") == 1
    # Pushes go on every interval.
    first = metric_value(samples, "strom_client_telemetry_pushes_total")
    produce_until(producer, topic, lambda: metric_value(scrape(broker.metrics_url),
                                                        "strom_client_telemetry_pushes_total") > first,
                  5, "a second push")
    assert producer.flush(10) == 0
    del producer  # librdkafka's last push says it is terminating: the instance takes no more
    with connect(broker) as conn:
        assert push(conn, uuid.UUID(instance), 0) == INVALID_REQUEST
    samples = scrape(broker.metrics_url)
    pushes = metric_value(samples, "strom_client_telemetry_pushes_total")
    assert requests_of(samples, "PushTelemetry") == pushes + 1  # all accepted, but ours
    # One DEBUG line per push.
    assert sum("telemetry push from" in line for line in broker.stderr_lines) == pushes + 1

    # Another client id does not match: it is asked for nothing.
    with connect(broker, client_id="someone-else") as conn:
        answer = get(conn)
        assert answer.requested_metrics == [] and answer.push_interval_ms == 300_000
    with connect(broker, client_id="pushing-raw") as conn:
        assert get(conn).requested_metrics == []  # ApiVersions did not say it is confluent-kafka-python


def test_subscriptions_are_stored_changed_and_deleted(broker):
    with connect(broker, client_id="app-1") as conn:
        subscribe(conn, "one", metrics="a.,b.", interval_ms="2000")
        assert alter(conn, "one", ("metrics", APPEND, "c.,a.")) == (0, None)
        assert describe(conn, "one")["metrics"] == ("a.,b.,c.", 7)
        subscribe(conn, "two", metrics="z.", interval_ms="1000", match="client_id=app-.*")
        first = get(conn)
        assert sorted(first.requested_metrics) == ["a.", "b.", "c.", "z."]
        assert first.push_interval_ms == 1000  # the smallest interval of those that match
        subscribe(conn, "all", metrics="*")
        # A change of the subscriptions: the client is told at its next push, and may ask at once.
        instance, old_id = first.client_instance_id, first.subscription_id
        assert push(conn, instance, old_id) == UNKNOWN_SUBSCRIPTION_ID
        second = get(conn, instance)
        assert second.error_code == 0 and second.requested_metrics == ["*"]
        assert second.client_instance_id == instance and second.subscription_id != old_id
        assert push(conn, instance, second.subscription_id) == 0

    assert broker.stop() == 0
    broker.restart()
    with connect(broker, client_id="app-1") as conn:
        assert describe(conn, "two") == {"metrics": ("z.", 7), "interval.ms": ("1000", 7),
                                         "match": ("client_id=app-.*", 7)}
        # The same instance, asking a broker that never saw it, gets the same subscription id.
        again = get(conn, instance)
        assert again.subscription_id == second.subscription_id and again.requested_metrics == ["*"]
        assert alter(conn, "all", ("metrics", DELETE, None)) == (0, None)
        assert describe(conn, "all") == {}
        answer = get(conn)
        assert sorted(answer.requested_metrics) == ["a.", "b.", "c.", "z."]
        for name in ("one", "two"):
            assert alter(conn, name, ("metrics", DELETE, None), ("interval.ms", DELETE, None),
                         ("match", DELETE, None)) == (0, None)
        answer = get(conn)
        assert answer.requested_metrics == [] and answer.push_interval_ms == 300_000


def test_every_broker_follows_the_subscriptions():
    with Cluster(brokers=2) as cluster:
        one, two = cluster.brokers[1], cluster.brokers[2]
        with connect(two, client_id="roaming") as conn2:
            first = get(conn2)
            assert first.requested_metrics == []
            with connect(one) as conn1:
                subscribe(conn1, "roaming", metrics="*", interval_ms="500", match="client_id=roaming")
            # Broker 2 learns of it from the change notification: the client is told at its
            # next push that its subscription changed, and then gets the new one.
            instance = first.client_instance_id

            def changed():
                time.sleep(0.05)
                return push(conn2, instance, first.subscription_id) == UNKNOWN_SUBSCRIPTION_ID

            wait_for(changed, timeout=10, what="broker 2 to see the new subscription")
            answer = get(conn2, instance)
            assert answer.requested_metrics == ["*"] and answer.push_interval_ms == 500
        assert any("client metrics subscription roaming: metrics *" in line for line in two.stderr_lines)
        # The client may push to the other broker with the id it was given.
        with connect(one, client_id="roaming") as conn1:
            assert push(conn1, instance, answer.subscription_id, otlp(("roamed", 1.0, {}))) == 0


def test_invalid_subscriptions_are_refused(broker):
    with connect(broker) as conn:
        assert alter(conn, "bad", ("interval.ms", SET, "50"))[0] == INVALID_REQUEST
        assert alter(conn, "bad", ("interval.ms", SET, "3600001"))[0] == INVALID_REQUEST
        assert alter(conn, "bad", ("interval.ms", SET, "soon"))[0] == INVALID_CONFIG
        assert alter(conn, "bad", ("metrics.prefix", SET, "x"))[0] == INVALID_REQUEST
        assert alter(conn, "bad", ("match", SET, "client_colour=red"))[0] == INVALID_CONFIG
        assert alter(conn, "bad", ("match", SET, "client_id=("))[0] == INVALID_CONFIG
        assert alter(conn, "bad", ("match", SET, "client_id"))[0] == INVALID_CONFIG
        assert alter(conn, "bad", ("interval.ms", APPEND, "100"))[0] == INVALID_CONFIG
        assert alter(conn, "", ("metrics", SET, "*"))[0] == INVALID_REQUEST
        assert describe(conn, "bad") == {}
        assert get(conn).requested_metrics == []


# --- by hand on the wire ----------------------------------------------------------------------

def test_push_errors(broker):
    with connect(broker) as admin:
        subscribe(admin, "hand", metrics="*", interval_ms="1000", match="client_id=hand")
    with connect(broker, client_id="hand") as conn:
        def fresh():
            answer = get(conn)
            assert answer.error_code == 0 and answer.requested_metrics == ["*"], answer
            return answer.client_instance_id, answer.subscription_id

        # No instance id, or a reserved one.
        assert push(conn, ZERO, 1) == INVALID_REQUEST
        assert push(conn, uuid.UUID(int=1), 1) == INVALID_REQUEST

        # Accepted, and shown; then too early.
        instance, sub = fresh()
        payload = otlp(("hand.latency", 12.5, {"node.id": "3"}), ("hand.count", 7, {}))
        assert push(conn, instance, sub, gzip.compress(payload), GZIP) == 0
        assert push(conn, instance, sub, payload) == THROTTLING_QUOTA_EXCEEDED
        series = telemetry_series(scrape(broker.metrics_url))
        assert series[(str(instance), "hand.latency", "node.id=3")] == 12.5
        assert series[(str(instance), "hand.count", "")] == 7
        # Asking for the subscription again before the interval is too early as well.
        assert get(conn, instance).error_code == THROTTLING_QUOTA_EXCEEDED
        # A terminating push is taken even early; nothing after it.
        assert push(conn, instance, sub, bytes(cramjam.zstd.compress(otlp(("hand.count", 9, {})))), ZSTD,
                    terminating=True) == 0
        assert telemetry_series(scrape(broker.metrics_url))[(str(instance), "hand.count", "")] == 9
        assert push(conn, instance, sub, terminating=True) == INVALID_REQUEST

        # A stale subscription id; the client may then ask again at once.
        instance, sub = fresh()
        assert push(conn, instance, sub + 1) == UNKNOWN_SUBSCRIPTION_ID
        assert get(conn, instance).error_code == 0

        # Compression: an unknown type; the client may then ask again at once.
        instance, sub = fresh()
        assert push(conn, instance, sub, payload, 9) == UNSUPPORTED_COMPRESSION_TYPE
        assert get(conn, instance).error_code == 0

        # Too large: as sent, or once decompressed.
        instance, sub = fresh()
        assert push(conn, instance, sub, b"\0" * ((1 << 20) + 1)) == TELEMETRY_TOO_LARGE
        instance, sub = fresh()
        bomb = gzip.compress(b"\0" * (64 << 20))
        assert len(bomb) < 1 << 20
        assert push(conn, instance, sub, bomb, GZIP) == TELEMETRY_TOO_LARGE

        # Not OTLP, or not what the compression type says.
        for data, codec in ((b"\x0a\xff\x01", NONE), (b"\x0b", NONE), (b"not zstd", ZSTD), (payload, LZ4),
                            (b"\x82SNAPPY\x00" + b"\0" * 8 + b"\xff\xff\xff\xff", SNAPPY)):
            instance, sub = fresh()
            assert push(conn, instance, sub, data, codec) == INVALID_RECORD, (data, codec)

        # Every compression type Kafka accepts, in the framing clients use.
        for codec, packed in ((SNAPPY, bytes(cramjam.snappy.compress_raw(payload))),
                              (LZ4, bytes(cramjam.lz4.compress(payload))), (NONE, payload)):
            instance, sub = fresh()
            assert push(conn, instance, sub, packed, codec) == 0, codec
            assert telemetry_series(scrape(broker.metrics_url))[(str(instance), "hand.count", "")] == 7

        # An empty push is fine (a client with nothing to say yet).
        instance, sub = fresh()
        assert push(conn, instance, sub) == 0

    samples = scrape(broker.metrics_url)
    assert metric_value(samples, "strom_client_telemetry_push_errors_total", error_code="118") == 2
    assert metric_value(samples, "strom_client_telemetry_push_errors_total", error_code="87") == 5
    assert "Traceback" not in "\n".join(broker.stderr_lines)


# --- the bounds, with a fake clock -------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _push_request(instance_id, subscription_id, terminating=False):
    class Request:
        pass

    r = Request()
    r.client_instance_id, r.subscription_id, r.terminating = instance_id, subscription_id, terminating
    r.compression_type, r.metrics = NONE, b""
    return r


def test_instances_expire_and_are_bounded():
    clock = Clock()
    telemetry = ClientTelemetry(clock=clock, max_instances=3)
    telemetry.set_subscription("fast", {"metrics": "*", "interval.ms": "1000", "match": "client_id=c"})
    ids = [telemetry.get_subscriptions(None, "c", f"10.0.0.1:{port}")["client_instance_id"] for port in range(5)]
    assert list(telemetry.instances) == ids[2:]  # the least recently active went first
    assert telemetry.instances_evicted == 2
    clock.now += 59
    telemetry.get_subscriptions(ids[4], "c", "10.0.0.1:4")
    clock.now += 6  # 65 s after ids[2] and ids[3] were last seen (sweeps are 5 s apart)
    telemetry.sweep()
    assert list(telemetry.instances) == [ids[4]]
    assert telemetry.instances_expired == 2
    # A long push interval keeps an instance three intervals (no subscription: 5 minutes).
    slow = telemetry.get_subscriptions(None, "other", "10.0.0.1:9")["client_instance_id"]
    clock.now += 3 * 300 - 10
    telemetry.sweep()
    assert slow in telemetry.instances
    clock.now += 20
    telemetry.sweep()
    assert slow not in telemetry.instances


def test_series_are_bounded_oldest_pushers_first():
    clock = Clock()
    telemetry = ClientTelemetry(clock=clock, max_series=5)
    telemetry.set_subscription("all", {"metrics": "*", "interval.ms": "1000"})
    instances = []
    for i in range(3):
        answer = telemetry.get_subscriptions(None, f"c{i}", f"10.0.0.{i}:1")
        error, inst = telemetry.check_push(_push_request(answer["client_instance_id"], answer["subscription_id"]),
                                           f"c{i}", f"10.0.0.{i}:1")
        assert error == 0
        instances.append(inst)
    telemetry.store_metrics(instances[0], [("a", "", 1.0), ("b", "", 2.0)])
    clock.now += 1
    telemetry.store_metrics(instances[1], [("a", "", 1.0), ("b", "", 2.0)])
    clock.now += 1
    telemetry.store_metrics(instances[2], [("a", "", 1.0), ("b", "", 2.0), ("c", "", 3.0)])
    # Room for 5: the first instance, which pushed longest ago, lost its 2.
    assert [len(i.series) for i in instances] == [0, 2, 3]
    assert telemetry.series_count == 5 and telemetry.series_dropped == 2
    # Updates of known series need no room; one instance alone keeps at most the bound.
    telemetry.store_metrics(instances[2], [("a", "", 10.0)] + [(f"n{k}", "", 0.0) for k in range(10)])
    assert instances[2].series[("a", "")] == 10.0
    assert telemetry.series_count == 5 and len(instances[2].series) == 5
    # An instance that expires takes its series with it.
    clock.now += 61
    telemetry.sweep()
    assert telemetry.series_count == 0 and not telemetry.instances


def test_payload_bounds_and_parsing():
    payload = otlp(("x.y", 1.5, {"b": "2", "a": "1"}), ("x.z", -3, {}), kind=7)
    assert parse_metrics(payload) == [("x.y", "a=1,b=2", 1.5), ("x.z", "", -3.0)]
    assert parse_metrics(decompress(GZIP, gzip.compress(payload))) == parse_metrics(payload)
    assert bytes(decompress(ZSTD, bytes(cramjam.zstd.compress(payload)))) == payload
    with pytest.raises(PayloadTooLarge):
        decompress(ZSTD, bytes(cramjam.zstd.compress(b"\0" * 1000)), limit=999)
    with pytest.raises(PayloadTooLarge):
        decompress(SNAPPY, bytes(cramjam.snappy.compress_raw(b"\0" * 1000)), limit=999)
    assert len(decompress(LZ4, bytes(cramjam.lz4.compress(b"\0" * 1000)), limit=1000)) == 1000
    long_name = "n" * (client_telemetry.MAX_NAME_CHARS + 1)
    assert parse_metrics(otlp((long_name, 1.0, {}), ("ok", 2.0, {"k": "v" * 1000}))) == [
        ("ok", ("k=" + "v" * 1000)[:client_telemetry.MAX_ATTRIBUTES_CHARS], 2.0)]
