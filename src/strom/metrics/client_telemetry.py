"""Client telemetry (KIP-714): subscriptions, client instances and the metrics clients push.

Kafka's ClientMetricsManager, with a built-in receiver: the latest value of every metric a
client pushes is kept for the Prometheus endpoint (`strom_client_telemetry`).

- Subscriptions are CLIENT_METRICS config resources (type 16), one per name, with `metrics`
  (metric name prefixes, `*` for all), `interval.ms` (100 ms to 1 h, default 5 min) and `match`
  (`client_instance_id`, `client_id`, `client_software_name`, `client_software_version`,
  `client_source_address`, `client_source_port` = regex, every one must match the whole value).
  They are stored at /config/client-metrics/<name> and announced through /config/changes like
  the other configs, so every broker follows them. None by default: a client is then told to
  collect nothing and pushes nothing.
- A client instance is what GetTelemetrySubscriptions names (the broker assigns a random UUID
  to a client that sends the zero UUID). Its subscription is every subscription that matches
  it: the union of their metrics and the smallest interval, identified by a subscription id
  that is a hash of both and the instance id (the same on every broker, so a client may push
  to another broker than the one it asked). A change of the subscriptions re-evaluates each
  instance at its next request.
- PushTelemetry is checked as Kafka checks it: nothing after a terminating push
  (INVALID_REQUEST), not before the push interval has passed since the last push unless the
  client has fetched its subscription since (THROTTLING_QUOTA_EXCEEDED; a terminating push is
  exempt), the current subscription id (UNKNOWN_SUBSCRIPTION_ID), a known compression type
  (UNSUPPORTED_COMPRESSION_TYPE), at most `TELEMETRY_MAX_BYTES` (Kafka's telemetry.max.bytes
  default, 1 MiB; TELEMETRY_TOO_LARGE). A payload that does not decompress or parse as OTLP
  `MetricsData` is INVALID_RECORD.

What a client can make the broker hold is bounded: 16,384 instances (least recently active
dropped first, as Kafka's LRU cache), each forgotten after max(60 s, 3 push intervals)
without a request; decompressed payloads of at most 4 x TELEMETRY_MAX_BYTES; at most
`MAX_SERIES` exported series over all instances (the instances that pushed longest ago lose
theirs first); metric names and attribute labels of bounded length.
"""

from __future__ import annotations

import asyncio
import logging
import re
import struct
import time
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import cramjam

from strom.config.repository import ChangeListener, sanitize
from strom.controller import znodes
from strom.controller.admin import read_configs
from strom.protocol import compression
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.varint import VarintError, read_uvarint

log = logging.getLogger(__name__)

GET_TELEMETRY_SUBSCRIPTIONS, PUSH_TELEMETRY = 71, 72
CLIENT_METRICS = 16  # ConfigResource type
CLIENT_METRICS_CONFIG = 7  # DescribeConfigs config source
ENTITY_TYPE = "client-metrics"  # /config/client-metrics/<name>

# Error codes ErrorCode does not name.
UNSUPPORTED_COMPRESSION_TYPE = 76
UNKNOWN_SUBSCRIPTION_ID = 117
TELEMETRY_TOO_LARGE = 118

# What a push can be refused with, as the endpoint counts them.
PUSH_ERRORS = (ErrorCode.INVALID_REQUEST, UNSUPPORTED_COMPRESSION_TYPE, ErrorCode.INVALID_RECORD,
               ErrorCode.THROTTLING_QUOTA_EXCEEDED, UNKNOWN_SUBSCRIPTION_ID, TELEMETRY_TOO_LARGE)

TELEMETRY_MAX_BYTES = 1 << 20  # Kafka's telemetry.max.bytes default
MAX_DECOMPRESSED_BYTES = 4 * TELEMETRY_MAX_BYTES
MAX_INSTANCES = 16384  # Kafka's ClientMetricsManager cache size
INSTANCE_EXPIRY_MS = 60_000  # or 3 push intervals, whichever is longer
MAX_SERIES = 10_000  # strom_client_telemetry series, over all instances
MAX_NAME_CHARS = 256  # longer metric names are dropped
MAX_ATTRIBUTES_CHARS = 256  # longer attribute labels are cut
_SWEEP_EVERY_S = 5.0
OFFLOAD_BYTES = 64 << 10  # payloads larger than this are decompressed and parsed in a thread

# Kafka accepts any compression type it knows, and advertises these, in order of preference.
ACCEPTED_COMPRESSION_TYPES = [compression.ZSTD, compression.LZ4, compression.GZIP, compression.SNAPPY]
_KNOWN_COMPRESSION_TYPES = frozenset(compression.NAMES)

# --- subscriptions (ClientMetricsConfigs) ------------------------------------------------------

METRICS, INTERVAL_MS, MATCH = "metrics", "interval.ms", "match"
CONFIG_KEYS = (METRICS, INTERVAL_MS, MATCH)
LIST_KEYS = frozenset({METRICS, MATCH})
CONFIG_TYPES = {METRICS: 7, INTERVAL_MS: 3, MATCH: 7}  # DescribeConfigs config types: LIST, INT
CONFIG_DOCS = {METRICS: "Telemetry metric name prefix list",
               INTERVAL_MS: "Metrics push interval in milliseconds",
               MATCH: "Client match criteria"}
ALL_METRICS = "*"
DEFAULT_INTERVAL_MS = 5 * 60 * 1000
MIN_INTERVAL_MS, MAX_INTERVAL_MS = 100, 3_600_000
MATCH_KEYS = frozenset({"client_instance_id", "client_id", "client_software_name",
                        "client_software_version", "client_source_address", "client_source_port"})


def split_list(value: str | None) -> list[str]:
    """A LIST config value as Kafka's ConfigDef parses it: comma-separated, trimmed."""
    if value is None or not value.strip():
        return []
    return [v.strip() for v in value.split(",")]


@dataclass(frozen=True, slots=True)
class Subscription:
    name: str
    metrics: frozenset[str]
    interval_ms: int
    match: tuple[tuple[str, re.Pattern], ...]

    def matches(self, attributes: Mapping[str, str | None]) -> bool:
        for key, pattern in self.match:
            value = attributes.get(key)
            if value is None or pattern.fullmatch(value) is None:
                return False
        return True


def parse_match(patterns: Iterable[str]) -> tuple[tuple[str, re.Pattern], ...]:
    out = {}
    for pattern in patterns:
        parts = pattern.split("=")
        key = parts[0].strip()
        if len(parts) != 2 or key not in MATCH_KEYS:
            raise KafkaError(f"Illegal client matching pattern: {pattern}", ErrorCode.INVALID_CONFIG)
        try:
            out[key] = re.compile(parts[1].strip())
        except re.error:
            raise KafkaError(f"Illegal client matching pattern: {pattern}", ErrorCode.INVALID_CONFIG) from None
    return tuple(out.items())


def parse_subscription(name: str, configs: Mapping[str, str]) -> Subscription | None:
    """A subscription from its stored configs (None when it has none: deleted), validated as
    Kafka validates them (KafkaError otherwise)."""
    if not name:
        raise KafkaError("Subscription name can't be empty", ErrorCode.INVALID_REQUEST)
    for key in configs:
        if key not in CONFIG_KEYS:
            raise KafkaError(f"Unknown client metrics configuration: {key}", ErrorCode.INVALID_REQUEST)
    interval = DEFAULT_INTERVAL_MS
    if INTERVAL_MS in configs:
        try:
            interval = int(str(configs[INTERVAL_MS]).strip())
        except ValueError:
            raise KafkaError(f"Invalid value {configs[INTERVAL_MS]} for configuration {INTERVAL_MS}: "
                             "Not a number of type INT", ErrorCode.INVALID_CONFIG) from None
        if not MIN_INTERVAL_MS <= interval <= MAX_INTERVAL_MS:
            raise KafkaError(f"Invalid value {interval} for {INTERVAL_MS}, interval must be between "
                             f"{MIN_INTERVAL_MS} and {MAX_INTERVAL_MS} (1 hour)", ErrorCode.INVALID_REQUEST)
    match = parse_match(split_list(configs.get(MATCH)))
    if not configs:
        return None
    return Subscription(name, frozenset(split_list(configs.get(METRICS))), interval, match)


# --- client instances --------------------------------------------------------------------------

@dataclass(slots=True)
class ClientInstance:
    instance_id: uuid.UUID
    attributes: dict[str, str | None]
    subscription_id: int
    version: int  # of the subscriptions it was evaluated against
    metrics: list[str]
    interval_ms: int
    last_get: float | None = None  # monotonic seconds
    last_push: float | None = None
    last_seen: float = 0.0
    terminating: bool = False
    last_error: int = 0
    last_push_at: float = 0.0  # when its metrics were last stored (orders the series eviction)
    series: dict[tuple[str, str], float] = field(default_factory=dict)

    @property
    def expiry_s(self) -> float:
        return max(INSTANCE_EXPIRY_MS, 3 * self.interval_ms) / 1000


def subscription_id(metrics: Iterable[str], interval_ms: int, instance_id: uuid.UUID) -> int:
    """Kafka's idea (a CRC of the metrics and the interval, XOR the instance id's hash), in a
    form every Strom broker computes alike: a client keeps its id when it moves brokers."""
    crc = zlib.crc32(("[" + ", ".join(sorted(metrics)) + "]" + str(interval_ms)).encode())
    high, low = instance_id.int >> 64, instance_id.int & ((1 << 64) - 1)
    folded = high ^ low
    value = (crc ^ (folded >> 32) ^ folded) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


class ClientTelemetry:
    """Subscriptions and client instances of one broker. The store parts (`start`) are only
    for the broker; the rest runs on its own, with `clock` (monotonic seconds) replaceable."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, max_instances: int = MAX_INSTANCES,
                 max_series: int = MAX_SERIES, telemetry_max_bytes: int = TELEMETRY_MAX_BYTES) -> None:
        self.clock = clock
        self.max_instances = max_instances
        self.max_series = max_series
        self.telemetry_max_bytes = telemetry_max_bytes
        self.subscriptions: dict[str, Subscription] = {}
        self.version = 0
        self.instances: OrderedDict[uuid.UUID, ClientInstance] = OrderedDict()  # least recent first
        self.series_count = 0
        self.pushes = 0
        self.push_errors: dict[int, int] = {}
        self.series_dropped = 0
        self.instances_expired = 0
        self.instances_evicted = 0
        # What each connection said of its client in ApiVersions (client_software_name and
        # version), by peer address; bounded like the instances.
        self.software: OrderedDict[str, tuple[str | None, str | None]] = OrderedDict()
        self._last_sweep = 0.0
        self._started = False
        self._starting: asyncio.Lock | None = None
        self._changes: ChangeListener | None = None

    # -- subscriptions

    def set_subscription(self, name: str, configs: Mapping[str, str]) -> None:
        """Apply the stored configs of subscription `name` (none: it is gone)."""
        try:
            sub = parse_subscription(name, configs)
        except KafkaError as e:  # stored by an older or foreign writer: keep what we had
            log.warning("ignoring client metrics subscription %r: %s", name, e)
            return
        if sub is None:
            if self.subscriptions.pop(name, None) is None:
                return
            log.info("client metrics subscription %s removed", name)
        else:
            if self.subscriptions.get(name) == sub:
                return
            self.subscriptions[name] = sub
            log.info("client metrics subscription %s: metrics %s every %d ms%s", name,
                     ",".join(sorted(sub.metrics)) or "(none)", sub.interval_ms,
                     " for " + ",".join(f"{k}={p.pattern}" for k, p in sub.match) if sub.match else "")
        self.version += 1

    async def start(self, broker: Any) -> None:
        """Load the stored subscriptions and follow their changes (once, at first use)."""
        if self._started:
            return
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._started:
                return
            self._changes = ChangeListener(broker.store, broker.store_io, znodes.CONFIG_CHANGES,
                                           znodes.CONFIG_CHANGE_PREFIX, self._change(broker))
            await broker.store_io(self._changes.skip_existing)
            stored = await broker.store_io(load_subscriptions, broker.store)
            for name, configs in stored.items():
                self.set_subscription(name, configs)
            try:
                await self._changes.start()
            except Exception as e:  # without the watch, changes apply only where they were made
                log.warning("client metrics subscriptions: cannot follow changes: %s", e)
            self._started = True

    def _change(self, broker: Any) -> Callable[[Any], Any]:
        async def handle(change: Any) -> None:
            if not isinstance(change, dict) or getattr(broker, "stopping", False):
                return
            entity_type, _, stored_name = str(change.get("entity_path", "")).partition("/")
            if entity_type != ENTITY_TYPE or not stored_name:
                return
            configs = await broker.store_io(read_configs, broker.store, ENTITY_TYPE, stored_name)
            self.set_subscription(unsanitize(stored_name), configs)

        return handle

    # -- instances

    def note_software(self, peer: str, name: str | None, version: str | None) -> None:
        self.software[peer] = (name, version)
        self.software.move_to_end(peer)
        while len(self.software) > self.max_instances:
            self.software.popitem(last=False)

    def _attributes(self, instance_id: uuid.UUID, client_id: str | None, peer: str) -> dict[str, str | None]:
        address, _, port = peer.rpartition(":")
        name, version = self.software.get(peer, (None, None))
        return {"client_instance_id": str(instance_id), "client_id": client_id,
                "client_software_name": name, "client_software_version": version,
                "client_source_address": address or None, "client_source_port": port or None}

    def _evaluate(self, instance_id: uuid.UUID, attributes: dict[str, str | None]) -> ClientInstance:
        metrics: set[str] = set()
        interval = DEFAULT_INTERVAL_MS
        every = False
        for sub in self.subscriptions.values():
            if sub.matches(attributes):
                every = every or ALL_METRICS in sub.metrics
                metrics |= sub.metrics
                interval = min(interval, sub.interval_ms)
        chosen = [ALL_METRICS] if every else sorted(metrics)
        return ClientInstance(instance_id, attributes, subscription_id(chosen, interval, instance_id),
                              self.version, chosen, interval)

    def instance(self, instance_id: uuid.UUID, client_id: str | None, peer: str) -> ClientInstance:
        """The instance, made (or re-evaluated after a subscription change) as needed."""
        now = self.clock()
        self.sweep(now)
        inst = self.instances.get(instance_id)
        if inst is None:
            inst = self._evaluate(instance_id, self._attributes(instance_id, client_id, peer))
            self.instances[instance_id] = inst
            while len(self.instances) > self.max_instances:
                _, old = self.instances.popitem(last=False)
                self._forget(old)
                self.instances_evicted += 1
        elif inst.version < self.version:
            fresh = self._evaluate(instance_id, inst.attributes)
            fresh.series, fresh.last_push_at = inst.series, inst.last_push_at
            self.instances[instance_id] = inst = fresh
        self.instances.move_to_end(instance_id)
        inst.last_seen = now
        return inst

    def sweep(self, now: float | None = None) -> None:
        """Forget instances idle past their expiry (looked at every few seconds)."""
        now = self.clock() if now is None else now
        if now - self._last_sweep < _SWEEP_EVERY_S:
            return
        self._last_sweep = now
        for key in [k for k, i in self.instances.items() if now - i.last_seen > i.expiry_s]:
            self._forget(self.instances.pop(key))
            self.instances_expired += 1

    def _forget(self, inst: ClientInstance) -> None:
        self.series_count -= len(inst.series)
        inst.series = {}

    def new_instance_id(self) -> uuid.UUID:
        while True:
            candidate = uuid.uuid4()
            if candidate not in self.instances and candidate.int > 1:
                return candidate

    # -- the two APIs

    def get_subscriptions(self, request_id: uuid.UUID | None, client_id: str | None, peer: str) -> dict:
        instance_id = request_id if request_id is not None and request_id.int != 0 else self.new_instance_id()
        inst = self.instance(instance_id, client_id, peer)
        now = self.clock()
        last = max((t for t in (inst.last_get, inst.last_push) if t is not None), default=None)
        # Kafka means to let a client that was told its subscription changed, or that its
        # compression is not accepted, ask again at once; anything else waits an interval.
        if (last is not None and (now - last) * 1000 < inst.interval_ms
                and inst.last_error not in (UNKNOWN_SUBSCRIPTION_ID, UNSUPPORTED_COMPRESSION_TYPE)):
            return _get_error(ErrorCode.THROTTLING_QUOTA_EXCEEDED)
        inst.last_get = now
        inst.last_error = 0
        return {"throttle_time_ms": 0, "error_code": 0, "client_instance_id": instance_id,
                "subscription_id": inst.subscription_id,
                "accepted_compression_types": ACCEPTED_COMPRESSION_TYPES,
                "push_interval_ms": inst.interval_ms, "telemetry_max_bytes": self.telemetry_max_bytes,
                "delta_temporality": True, "requested_metrics": list(inst.metrics)}

    def check_push(self, request: Any, client_id: str | None, peer: str) -> tuple[int, ClientInstance | None]:
        """(error code, instance) of a PushTelemetry request, before its payload is read."""
        instance_id = request.client_instance_id
        if instance_id is None or instance_id.int in (0, 1):
            return ErrorCode.INVALID_REQUEST, None
        inst = self.instance(instance_id, client_id, peer)
        error = self._validate_push(inst, request)
        # Kafka's terminating flag follows each push, so that a push after the terminating
        # one is refused and the next accepted again; here it stays: the client said goodbye.
        inst.terminating = inst.terminating or bool(request.terminating)
        if error:
            inst.last_error = error
            self.push_errors[error] = self.push_errors.get(error, 0) + 1
        return error, inst

    def _validate_push(self, inst: ClientInstance, request: Any) -> int:
        if inst.terminating:
            return ErrorCode.INVALID_REQUEST
        now = self.clock()
        accept = (inst.last_push is None
                  or (inst.last_get is not None and inst.last_get > inst.last_push)
                  or (now - inst.last_push) * 1000 >= inst.interval_ms)
        if accept:
            inst.last_push = now
        elif not request.terminating:
            return ErrorCode.THROTTLING_QUOTA_EXCEEDED
        if request.subscription_id != inst.subscription_id:
            return UNKNOWN_SUBSCRIPTION_ID
        if request.compression_type not in _KNOWN_COMPRESSION_TYPES:
            return UNSUPPORTED_COMPRESSION_TYPE
        if request.metrics is not None and len(request.metrics) > self.telemetry_max_bytes:
            return TELEMETRY_TOO_LARGE
        return 0

    def store_metrics(self, inst: ClientInstance, points: list[tuple[str, str, float]]) -> None:
        """Keep the latest value of each pushed series of `inst`, within MAX_SERIES overall."""
        self.pushes += 1
        inst.last_error = 0
        if inst.instance_id not in self.instances:  # expired or evicted while we parsed
            return
        inst.last_push_at = self.clock()
        new = {(n, a) for n, a, _ in points if (n, a) not in inst.series}
        room = self.max_series - self.series_count
        if len(new) > room:
            # Those that pushed longest ago make way; then this one keeps what fits.
            for other in sorted(self.instances.values(), key=lambda i: i.last_push_at):
                if len(new) <= room:
                    break
                if other is inst or not other.series:
                    continue
                room += len(other.series)
                self.series_dropped += len(other.series)
                self._forget(other)
        for name, attrs, value in points:
            key = (name, attrs)
            if key in inst.series:
                inst.series[key] = value
            elif room > 0:
                inst.series[key] = value
                self.series_count += 1
                room -= 1
            else:
                self.series_dropped += 1

    def exported(self) -> Iterable[tuple[ClientInstance, dict[tuple[str, str], float]]]:
        self.sweep()
        return [(inst, dict(inst.series)) for inst in self.instances.values() if inst.series]


def _get_error(code: int) -> dict:
    return {"throttle_time_ms": 0, "error_code": code, "client_instance_id": None, "subscription_id": 0,
            "accepted_compression_types": [], "push_interval_ms": 0, "telemetry_max_bytes": 0,
            "delta_temporality": False, "requested_metrics": []}


def manager(broker: Any) -> ClientTelemetry:
    """The broker's ClientTelemetry, made at first use."""
    found = getattr(broker, "client_telemetry", None)
    if found is None:
        found = ClientTelemetry()
        broker.client_telemetry = found
    return found


# --- the payload: compressed OTLP MetricsData ---------------------------------------------------

class InvalidPayload(Exception):
    pass


class PayloadTooLarge(Exception):
    pass


def decompress(codec: int, data: bytes, limit: int = MAX_DECOMPRESSED_BYTES) -> bytes | memoryview:
    """`data` decompressed, refusing (PayloadTooLarge) to produce more than `limit` bytes."""
    if codec == compression.NONE:
        return data
    try:
        if codec == compression.SNAPPY:
            return _snappy(data, limit)
        out = bytearray(limit + 1)
        module = {compression.GZIP: cramjam.gzip, compression.LZ4: cramjam.lz4,
                  compression.ZSTD: cramjam.zstd}[codec]
        n = module.decompress_into(data, out)
    except (InvalidPayload, PayloadTooLarge):
        raise
    except Exception as e:  # cramjam.DecompressionError, mostly
        if "whole buffer" in str(e) or "smaller than required" in str(e):
            raise PayloadTooLarge(f"more than {limit} bytes decompressed") from None
        raise InvalidPayload(f"does not decompress as {compression.NAMES[codec]}: {str(e)[:100]}") from None
    if n > limit:
        raise PayloadTooLarge(f"more than {limit} bytes decompressed")
    return memoryview(out)[:n]


_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def _snappy(data: bytes, limit: int) -> bytes:
    """Raw snappy (librdkafka) or xerial's framing of raw blocks (the Java client), each
    block's length read from its header before it is decompressed."""
    blocks = []
    if data.startswith(_XERIAL_MAGIC):
        pos = 16
        while pos < len(data):
            if pos + 4 > len(data):
                raise InvalidPayload("truncated snappy block")
            (n,) = struct.unpack_from(">i", data, pos)
            pos += 4
            if n < 0 or pos + n > len(data):
                raise InvalidPayload("truncated snappy block")
            blocks.append(data[pos:pos + n])
            pos += n
    else:
        blocks.append(data)
    out, total = [], 0
    for block in blocks:
        total += cramjam.snappy.decompress_raw_len(block)
        if total > limit:
            raise PayloadTooLarge(f"more than {limit} bytes decompressed")
        out.append(bytes(cramjam.snappy.decompress_raw(block)))
    return b"".join(out)


_DOUBLE = struct.Struct("<d")
_INT64 = struct.Struct("<q")


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """A protobuf varint (up to 64 bits) that ends before `end`."""
    try:
        return read_uvarint(buf[:end], pos, max_bits=70)
    except VarintError as e:
        raise InvalidPayload("bad varint") from e


def _fields(buf: memoryview, pos: int, end: int):
    """(field number, wire type, value) of a protobuf message: ints for varints and fixed
    fields (as unsigned little-endian), (start, end) for length-delimited ones."""
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise InvalidPayload("field number 0")
        if wire == 0:
            value, pos = _varint(buf, pos, end)
        elif wire == 1:
            if pos + 8 > end:
                raise InvalidPayload("truncated fixed64")
            value, pos = int.from_bytes(buf[pos:pos + 8], "little"), pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos, end)
            if pos + n > end:
                raise InvalidPayload("length runs past the end")
            value, pos = (pos, pos + n), pos + n
        elif wire == 5:
            if pos + 4 > end:
                raise InvalidPayload("truncated fixed32")
            value, pos = int.from_bytes(buf[pos:pos + 4], "little"), pos + 4
        else:
            raise InvalidPayload(f"unsupported wire type {wire}")
        yield number, wire, value


def _text(buf: memoryview, span: tuple[int, int]) -> str:
    try:
        return bytes(buf[span[0]:span[1]]).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidPayload("a string is not UTF-8") from None


def _any_value(buf: memoryview, span: tuple[int, int]) -> str:
    for number, wire, value in _fields(buf, *span):
        if number == 1 and wire == 2:
            return _text(buf, value)
        if number == 2 and wire == 0:
            return "true" if value else "false"
        if number == 3 and wire == 0:
            return str(value - (1 << 64) if value >= 1 << 63 else value)
        if number == 4 and wire == 1:
            return repr(_DOUBLE.unpack(value.to_bytes(8, "little"))[0])
    return ""


def _attributes(buf: memoryview, spans: list[tuple[int, int]]) -> str:
    pairs = []
    for span in spans:
        key = value = ""
        for number, wire, v in _fields(buf, *span):
            if number == 1 and wire == 2:
                key = _text(buf, v)
            elif number == 2 and wire == 2:
                value = _any_value(buf, v)
        pairs.append(f"{key}={value}")
    return ",".join(sorted(pairs))[:MAX_ATTRIBUTES_CHARS]


def _number_point(buf: memoryview, span: tuple[int, int]) -> tuple[str, float] | None:
    value = None
    attributes = []
    for number, wire, v in _fields(buf, *span):
        if number == 4 and wire == 1:
            value = _DOUBLE.unpack(v.to_bytes(8, "little"))[0]
        elif number == 6 and wire == 1:
            value = float(_INT64.unpack(v.to_bytes(8, "little"))[0])
        elif number == 7 and wire == 2:
            attributes.append(v)
    if value is None:
        return None
    return _attributes(buf, attributes), value


def parse_metrics(data: bytes | memoryview) -> list[tuple[str, str, float]]:
    """(metric name, data point attributes as "k=v,...", value) of every gauge and sum data
    point of an OTLP MetricsData (ExportMetricsServiceRequest has the same layout); other
    kinds of metric are skipped. InvalidPayload if the bytes are not such a message."""
    buf = memoryview(data)
    points = []
    for number, wire, resource_metrics in _fields(buf, 0, len(buf)):
        if number != 1 or wire != 2:
            continue
        for n2, w2, scope_metrics in _fields(buf, *resource_metrics):
            if n2 != 2 or w2 != 2:
                continue
            for n3, w3, metric in _fields(buf, *scope_metrics):
                if n3 != 2 or w3 != 2:
                    continue
                name, bodies = "", []
                for n4, w4, v in _fields(buf, *metric):
                    if n4 == 1 and w4 == 2:
                        name = _text(buf, v)
                    elif n4 in (5, 7) and w4 == 2:  # gauge, sum
                        bodies.append(v)
                for body in bodies:
                    for n5, w5, point in _fields(buf, *body):
                        if n5 == 1 and w5 == 2:
                            parsed = _number_point(buf, point)
                            if parsed is not None and name and len(name) <= MAX_NAME_CHARS:
                                points.append((name, parsed[0], parsed[1]))
    return points


def read_payload(codec: int, data: bytes) -> list[tuple[str, str, float]]:
    return parse_metrics(decompress(codec, data))


# --- the CLIENT_METRICS config resource --------------------------------------------------------

def unsanitize(stored: str) -> str:
    from urllib.parse import unquote

    return unquote(stored)


def load_subscriptions(store: Any) -> dict[str, dict[str, str]]:
    """Every stored subscription's configs, by name (blocking)."""
    return {unsanitize(n): read_configs(store, ENTITY_TYPE, n) for n in store.children(f"/config/{ENTITY_TYPE}")}


async def stored_subscription(broker: Any, name: str) -> dict[str, str]:
    if not name:
        raise KafkaError("Client metrics subscription name must not be empty", ErrorCode.INVALID_REQUEST)
    return await broker.store_io(read_configs, broker.store, ENTITY_TYPE, sanitize(name))


async def describe_subscription(broker: Any, name: str, keys: Iterable[str] | None,
                                include_docs: bool) -> list[dict]:
    """DescribeConfigs of a CLIENT_METRICS resource: its stored configs, as Kafka lists them."""
    configs = await stored_subscription(broker, name)
    wanted = sorted(configs) if keys is None else [k for k in keys if k in configs]
    return [{"name": k, "value": configs[k], "read_only": False, "config_source": CLIENT_METRICS_CONFIG,
             "is_sensitive": False, "synonyms": [], "config_type": CONFIG_TYPES.get(k, 0),
             "documentation": CONFIG_DOCS.get(k) if include_docs else None} for k in wanted]


async def alter_subscription(broker: Any, name: str, new_configs: Callable[[dict[str, str]], dict[str, str]],
                             validate_only: bool) -> None:
    """Apply `new_configs(current)` as subscription `name`'s configs: validated, stored and
    announced to every broker, and applied here at once. No configs left deletes it."""
    configs = new_configs(dict(await stored_subscription(broker, name)))
    parse_subscription(name, configs)
    if validate_only:
        return
    await broker.store_io(broker.admin.change_client_config, f"{ENTITY_TYPE}/{sanitize(name)}", configs)
    manager(broker).set_subscription(name, configs)
