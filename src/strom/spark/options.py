"""The options of the `strom` data source: the same names and meanings as Spark's built-in Kafka
source and sink, checked up front so that a mistake is one clear message instead of a stack
trace from a Spark task. Spark hands options over lower-cased (a case-insensitive dict)."""

from __future__ import annotations

import difflib
import json
import logging
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from strom.spark.client_conf import ClientConfError, for_role, translate
from strom.spark.formats import FormatOptionError, column_formats

log = logging.getLogger("strom.spark")

# Options of both sides for registry-framed keys and values (formats.py).
FORMAT_OPTIONS = {"keyformat", "valueformat", "keysubject", "valuesubject",
                  "schema.registry.url", "schema.registry.basic.auth.user.info"}
# Source options of Spark's Kafka source (lower-cased), with the ones Strom reads.
SOURCE_OPTIONS = {
    "subscribe", "subscribepattern", "assign",
    "startingoffsets", "endingoffsets",
    "startingtimestamp", "endingtimestamp",
    "startingoffsetsbytimestamp", "endingoffsetsbytimestamp", "startingoffsetsbytimestampstrategy",
    "maxoffsetspertrigger", "minoffsetspertrigger", "maxtriggerdelay",
    "minpartitions", "maxrecordsperpartition",
    "failondataloss", "includeheaders", "kafkaconsumer.polltimeoutms",
    "fetchoffset.numretries", "fetchoffset.retryintervalms", "groupidprefix",
    "latestbykey",  # Strom's own: a compacted topic read as a table
    # Strom's own: tiered offsets read from the object store (remote.py), with rsm.config.* keys
    "directremotereads", "remotereadchunkbytes",
    # Strom's own: registry-framed keys and values as typed columns (formats.py)
    *FORMAT_OPTIONS, "keyschemaversion", "valueschemaversion", "mode",
}
STORE_PREFIX = "rsm.config."  # the broker's keys of the remote store, passed as options
SINK_OPTIONS = {"topic", "transactionalidprefix", "includeheaders", *FORMAT_OPTIONS}
# One options dict often serves a job's source and sink: each ignores the other's options, as
# Spark's connector does (a misspelling of either is still an error).
ALL_OPTIONS = SOURCE_OPTIONS | SINK_OPTIONS
# Spark adds these itself (streaming writes, `load(path)`); never a user mistake.
SPARK_OPTIONS = {"path", "checkpointlocation", "queryname"}
SUBSCRIPTIONS = ("subscribe", "subscribePattern", "assign")

LATEST, EARLIEST = -1, -2  # Spark's (and Kafka's ListOffsets) sentinels in offset JSON
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60_000  # Spark's maxTriggerDelay default, 15m


class StromOptionError(ValueError):
    """A bad option of the `strom` data source (message says which and why)."""


class StromDataLossError(RuntimeError):
    """Offsets the query must read no longer exist (retention, DeleteRecords, a deleted topic)."""


# An offset spec: "earliest" | "latest" | {"topic": {partition: offset}}
# | ("timestamp", ms) | ("timestamps", {"topic": {partition: ms}})
OffsetSpec = Any


@dataclass(frozen=True)
class ClientOptions:
    bootstrap: str
    conf: dict[str, str]  # the `kafka.*` options, in librdkafka's names (client_conf.py)
    request_timeout_ms: int | None = None  # Java knobs the connector applies itself
    max_poll_records: int | None = None
    max_block_ms: int | None = None
    given: frozenset[str] = frozenset()  # the client settings as the user named them
    origin: dict[str, str] = field(default_factory=dict)  # librdkafka name -> the user's option
    exclude_internal_topics: bool = True
    max_request_size: int | None = None  # below librdkafka's minimum: the sink checks it

    def client_conf(self, role: str = "admin", **extra: Any) -> dict[str, Any]:
        """librdkafka settings for a "consumer", "producer" or "admin" client: `extra` are the
        connector's defaults, which the user's settings override."""
        timeout = {"socket.timeout.ms": self.request_timeout_ms} if self.request_timeout_ms else {}
        return {"bootstrap.servers": self.bootstrap, **extra, **timeout, **for_role(self.conf, role)}

    def option_name(self, librdkafka_name: str) -> str:
        """The option a librdkafka setting came from, as the user wrote it."""
        return self.origin.get(librdkafka_name, librdkafka_name)


@dataclass(frozen=True)
class SourceOptions:
    client: ClientOptions
    subscribe: tuple[str, ...] = ()
    pattern: str | None = None
    assign: dict[str, tuple[int, ...]] | None = None
    starting: OffsetSpec = "latest"
    ending: OffsetSpec = "latest"
    by_timestamp_strategy: str = "error"
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    poll_timeout_ms: int = 120_000
    isolation_level: str = "read_uncommitted"
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    offset_retries: int = 3  # fetchOffset.numRetries / retryIntervalMs, as Spark's defaults
    offset_retry_interval_ms: int = 1000
    group_id: str | None = None  # kafka.group.id, or groupIdPrefix + a unique suffix
    latest_by_key: bool = False
    remote_storage: dict[str, str] = field(default_factory=dict)  # rsm.config.* options: a store to read
    direct_remote_reads: bool = False  # tiered offsets from that store, not through the broker
    remote_chunk_bytes: int = 4 << 20
    formats: tuple = ()  # formats.ColumnFormat of key/value read as typed columns

    @property
    def client_id(self) -> str:
        """kafka.client.id, else named after the group as the Java consumer names itself (so
        client-id quotas and request logs tell a query's readers apart)."""
        return self.client.conf.get("client.id") or (f"consumer-{self.group_id}-1" if self.group_id
                                                     else "strom-spark")

    def matches(self, topic: str) -> bool:
        if self.subscribe:
            return topic in self.subscribe
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        return self.assign is not None and topic in self.assign


@dataclass(frozen=True)
class SinkOptions:
    client: ClientOptions
    topic: str | None
    transactional_id_prefix: str | None = None  # exactly-once streaming writes when set
    formats: tuple = ()  # formats.ColumnFormat of key/value written from typed columns


def data_loss(opts: SourceOptions, what: str) -> None:
    """Fail or warn, as failOnDataLoss says."""
    if opts.fail_on_data_loss:
        raise StromDataLossError(
            f"{what}. Some data may have been lost because it is no longer in Kafka: aged out by "
            "retention, removed by DeleteRecords, or the topic was deleted. Set the source option "
            "failOnDataLoss=false to skip it with a warning instead.")
    log.warning("%s; skipping it (failOnDataLoss=false)", what)


def parse_bootstrap(servers: str) -> list[tuple[str, int]]:
    """'h1:9092,[::1]:9093' -> [(h1, 9092), (::1, 9093)]; a malformed address is an option error."""
    out = []
    for item in servers.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise StromOptionError(f"kafka.bootstrap.servers: {item.strip()!r} is not a host:port address "
                                   "(a comma-separated list like 127.0.0.1:9092)")
        out.append((host.strip("[]"), int(port)))
    return out


def _client(options: Mapping[str, str], role: str) -> ClientOptions:
    servers = options.get("kafka.bootstrap.servers")
    if not servers:
        raise StromOptionError(
            f"Option 'kafka.bootstrap.servers' must be specified for the strom {role} "
            "(a comma-separated host:port list, e.g. 127.0.0.1:9092)")
    parse_bootstrap(servers)
    settings = {key[len("kafka."):]: value for key, value in options.items()
                if key.startswith("kafka.") and key != "kafka.bootstrap.servers"}
    try:
        c = translate(settings, role)
    except ClientConfError as e:
        raise StromOptionError(str(e)) from None
    return ClientOptions(servers, c.conf, c.request_timeout_ms, c.max_poll_records, c.max_block_ms, c.given,
                         c.origin, c.exclude_internal_topics, c.max_request_size)


def _unknown(options: Mapping[str, str], allowed: set[str], role: str) -> None:
    bad = sorted(k for k in options if not k.startswith(("kafka.", STORE_PREFIX))
                 and k not in ALL_OPTIONS | SPARK_OPTIONS)
    if bad:
        near = [f"{k} (did you mean {m[0]}?)" if (m := difflib.get_close_matches(k, ALL_OPTIONS, 1)) else k
                for k in bad]
        raise StromOptionError(
            f"Unknown option(s) for the strom {role}: {', '.join(near)}. Valid options: "
            f"{', '.join(sorted(allowed))}, kafka.* client settings and rsm.config.* remote storage keys")


def flag(options: Mapping[str, str], key: str, default: bool) -> bool:
    raw = options.get(key)
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise StromOptionError(f"Option '{key}' must be true or false, not {raw!r}")


def _positive_int(options: Mapping[str, str], key: str) -> int | None:
    raw = options.get(key)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise StromOptionError(f"Option '{key}' must be a positive integer, not {raw!r}")
    return value


def _json(raw: str, key: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise StromOptionError(f"Option '{key}' is not valid JSON ({e}): {raw!r}") from None


def _per_partition(raw: str, key: str) -> dict[str, dict[int, int]]:
    """JSON {"topic": {"0": 23, "1": -2}} as {topic: {partition: number}}."""
    value = _json(raw, key)
    try:
        return {str(t): {int(p): int(o) for p, o in parts.items()} for t, parts in value.items()}
    except (AttributeError, TypeError, ValueError):
        raise StromOptionError(
            f"Option '{key}' must be JSON like {{\"topicA\":{{\"0\":23,\"1\":-1}}}}, not {raw!r}") from None


def _offsets(options: Mapping[str, str], prefix: str, default: str, batch: bool) -> OffsetSpec:
    """startingOffsets/endingOffsets and their timestamp variants, in Spark's precedence:
    a global timestamp, then per-partition timestamps, then offsets."""
    ts_key = f"{prefix}timestamp"
    if options.get(ts_key) is not None:
        try:
            return ("timestamp", int(options[ts_key]))
        except ValueError:
            raise StromOptionError(f"Option '{prefix}Timestamp' must be milliseconds since the epoch") from None
    if options.get(f"{prefix}offsetsbytimestamp") is not None:
        return ("timestamps", _per_partition(options[f"{prefix}offsetsbytimestamp"],
                                             f"{prefix}OffsetsByTimestamp"))
    raw = options.get(f"{prefix}offsets", default).strip()
    name = f"{prefix}Offsets"
    if raw.lower() in ("earliest", "latest"):
        spec = raw.lower()
    else:
        spec = _per_partition(raw, name)
    bad = "latest" if prefix == "starting" else "earliest"
    sentinel = LATEST if prefix == "starting" else EARLIEST
    if batch and (spec == bad or (isinstance(spec, dict) and any(
            o == sentinel for parts in spec.values() for o in parts.values()))):
        raise StromOptionError(f"{name}={bad} (or {sentinel} in JSON) is not allowed for batch queries")
    if prefix == "ending" and isinstance(spec, dict) and any(
            o < LATEST for parts in spec.values() for o in parts.values()):
        raise StromOptionError(f"{name} offsets must be >= 0 or -1 (latest): {raw!r}")
    return spec


_DURATION = re.compile(r"^\s*(\d+)\s*(us|ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_ms(options: Mapping[str, str], key: str, default: int) -> int:
    """A Spark time string ('15m', '30s', '500ms'; a bare number is milliseconds)."""
    raw = options.get(key)
    if raw is None:
        return default
    match = _DURATION.match(raw)
    if match is None:
        raise StromOptionError(f"Option '{key}' must be a duration like 30s, 5m or 500ms, not {raw!r}")
    return int(int(match[1]) * _MS[(match[2] or "ms").lower()])


def _count(options: Mapping[str, str], key: str, default: int) -> int:
    raw = options.get(key)
    if raw is None:
        return default
    if not raw.strip().isdigit():
        raise StromOptionError(f"Option '{key}' must be a non-negative integer, not {raw!r}")
    return int(raw)


def source_options(options: Mapping[str, str], batch: bool | None) -> SourceOptions:
    """Validate the options of a read (`batch`: spark.read, else spark.readStream; None: the
    checks both share, made when the DataFrame is defined)."""
    _unknown(options, SOURCE_OPTIONS, "source")
    client = _client(options, "source")
    given = [name for name in SUBSCRIPTIONS if options.get(name.lower())]
    if len(given) != 1:
        which = "One" if not given else "Only one"
        raise StromOptionError(
            f"{which} of the options 'subscribe', 'subscribePattern', 'assign' must be specified "
            f"for the strom source{'' if not given else ' (got ' + ', '.join(given) + ')'}")
    kind = given[0].lower()
    raw = options[kind]
    subscribe, pattern, assign = (), None, None
    if kind == "subscribe":
        subscribe = tuple(t.strip() for t in raw.split(",") if t.strip())
        if not subscribe:
            raise StromOptionError(f"Option 'subscribe' names no topic: {raw!r}")
    elif kind == "subscribepattern":
        try:
            re.compile(raw)
        except re.error as e:
            raise StromOptionError(f"Option 'subscribePattern' is not a valid regex ({e}): {raw!r}") from None
        pattern = raw
    else:
        value = _json(raw, "assign")
        try:
            assign = {str(t): tuple(int(p) for p in parts) for t, parts in value.items()}
        except (AttributeError, TypeError, ValueError):
            raise StromOptionError(f"Option 'assign' must be JSON like {{\"topicA\":[0,1]}}, not {raw!r}") from None
    if batch is False and any(options.get(k) is not None for k in ("endingoffsets", "endingtimestamp",
                                                                    "endingoffsetsbytimestamp")):
        raise StromOptionError("Ending offsets are for batch queries only (spark.read), not readStream")
    if batch is False and flag(options, "latestbykey", False):
        raise StromOptionError("latestByKey is for batch queries only (spark.read), not readStream")
    strategy = options.get("startingoffsetsbytimestampstrategy", "error").lower()
    if strategy not in ("error", "latest"):
        raise StromOptionError("Option 'startingOffsetsByTimestampStrategy' must be 'error' or 'latest'")
    isolation = client.conf.setdefault("isolation.level", "read_uncommitted")  # Java's default
    if isolation not in ("read_uncommitted", "read_committed"):
        raise StromOptionError("kafka.isolation.level must be read_uncommitted or read_committed")
    store = {k: v for k, v in options.items() if k.startswith(STORE_PREFIX)}
    direct = flag(options, "directremotereads", bool(store))
    if direct and not store:
        raise StromOptionError("directRemoteReads=true needs the remote store's rsm.config.* options (e.g. "
                               "rsm.config.storage.s3.bucket.name, or rsm.config.storage.root)")
    if direct and client.conf.get("security.protocol", "plaintext").lower() != "plaintext":
        if options.get("directremotereads") is not None:
            raise StromOptionError("directRemoteReads needs kafka.security.protocol PLAINTEXT (the raw client "
                                   "that reads the remote log metadata speaks neither TLS nor SASL)")
        log.warning("strom source: remote storage is read through the broker: direct reads need "
                    "kafka.security.protocol PLAINTEXT")
        direct = False
    group = client.conf.pop("group.id", None)
    if group is None and options.get("groupidprefix") is not None:
        group = f"{options['groupidprefix']}-{uuid.uuid4()}"
    return SourceOptions(
        client=client, subscribe=subscribe, pattern=pattern, assign=assign,
        starting=_offsets(options, "starting", "earliest" if batch else "latest", bool(batch)),
        ending=_offsets(options, "ending", "latest", bool(batch)) if batch is not False else "latest",
        by_timestamp_strategy=strategy,
        max_offsets_per_trigger=_positive_int(options, "maxoffsetspertrigger"),
        min_offsets_per_trigger=_positive_int(options, "minoffsetspertrigger"),
        max_trigger_delay_ms=duration_ms(options, "maxtriggerdelay", DEFAULT_MAX_TRIGGER_DELAY_MS),
        min_partitions=_positive_int(options, "minpartitions"),
        max_records_per_partition=_positive_int(options, "maxrecordsperpartition"),
        fail_on_data_loss=flag(options, "failondataloss", True),
        include_headers=flag(options, "includeheaders", False),
        poll_timeout_ms=_positive_int(options, "kafkaconsumer.polltimeoutms") or 120_000,
        isolation_level=isolation,
        offset_retries=_count(options, "fetchoffset.numretries", 3),
        offset_retry_interval_ms=duration_ms(options, "fetchoffset.retryintervalms", 1000),
        group_id=group,
        latest_by_key=flag(options, "latestbykey", False),
        remote_storage=store,
        direct_remote_reads=direct,
        remote_chunk_bytes=_positive_int(options, "remotereadchunkbytes") or 4 << 20,
        formats=_formats(options, subscribe or tuple(assign or ()), "source"),
    )


def sink_options(options: Mapping[str, str]) -> SinkOptions:
    _unknown(options, SINK_OPTIONS, "sink")
    flag(options, "includeheaders", True)  # a 'headers' column is written whenever there is one
    topic = options.get("topic") or None
    return SinkOptions(_client(options, "sink"), topic, options.get("transactionalidprefix") or None,
                       _formats(options, (topic,) if topic else (), "sink"))


def _formats(options: Mapping[str, str], topics: tuple[str, ...], role: str) -> tuple:
    try:
        return column_formats(options, topics, role)
    except FormatOptionError as e:
        raise StromOptionError(str(e)) from None
