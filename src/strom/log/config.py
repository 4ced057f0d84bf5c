"""Per-topic log settings under Kafka's names and defaults.

Topic configs arrive as Kafka's string key/value pairs (CreateTopics, AlterConfigs, the
`--config` of the CLI); `LogConfig.with_overrides` validates them the way Kafka's `LogConfig`
does, so a bad value is refused with INVALID_CONFIG before any log is touched.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from strom.protocol import compression

log = logging.getLogger(__name__)

INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1

CREATE_TIME = "CreateTime"
LOG_APPEND_TIME = "LogAppendTime"
# compression.type: keep the producer's codec, or recompress into one (KIP-390 levels apply).
COMPRESSION_TYPES = ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")


# How a record's subject is named (Confluent's serializers' strategies, by their class names).
TOPIC_NAME_STRATEGY = "io.confluent.kafka.serializers.subject.TopicNameStrategy"
RECORD_NAME_STRATEGY = "io.confluent.kafka.serializers.subject.RecordNameStrategy"
TOPIC_RECORD_NAME_STRATEGY = "io.confluent.kafka.serializers.subject.TopicRecordNameStrategy"
SUBJECT_NAME_STRATEGIES = (TOPIC_NAME_STRATEGY, RECORD_NAME_STRATEGY, TOPIC_RECORD_NAME_STRATEGY)

# Iceberg topics (strom.tables): how a topic's records become table rows (Redpanda's mode names).
ICEBERG_MODES = ("disabled", "key_value", "value_schema_id_prefix", "value_schema_latest")
ICEBERG_SCHEMA_MODES = ("value_schema_id_prefix", "value_schema_latest")  # read the schema registry
# The columns of the key_value mode, which a partition spec may name.
ICEBERG_KEY_VALUE_COLUMNS = ("partition", "offset", "timestamp", "timestamp_type", "key", "value")
# The schema modes' metadata columns (in their `strom` struct), which a partition spec may name.
ICEBERG_METADATA_COLUMNS = ("partition", "offset", "timestamp", "timestamp_type", "key")
ICEBERG_TRANSFORMS = ("identity", "year", "month", "day", "hour")
ICEBERG_TIME_TRANSFORMS = ("year", "month", "day", "hour")


@dataclass(slots=True)
class LogConfig:
    segment_bytes: int = 1073741824  # segment.bytes (broker: log.segment.bytes)
    segment_ms: int = 604800000  # segment.ms (broker: log.roll.ms / log.roll.hours)
    retention_ms: int = 604800000  # retention.ms; -1 = unlimited
    retention_bytes: int = -1  # retention.bytes; -1 = unlimited
    index_interval_bytes: int = 4096  # index.interval.bytes
    segment_index_bytes: int = 10485760  # segment.index.bytes: roll when the index is this big
    max_message_bytes: int = 1048588  # max.message.bytes: the largest batch accepted
    message_timestamp_type: str = CREATE_TIME  # message.timestamp.type
    file_delete_delay_ms: int = 60000  # file.delete.delay.ms
    cleanup_policy: str = "delete"  # cleanup.policy: delete, compact, or both
    # Compaction (strom.log.cleaner); broker defaults are the log.cleaner.* settings.
    delete_retention_ms: int = 86400000  # delete.retention.ms: how long tombstones stay readable
    min_cleanable_dirty_ratio: float = 0.5  # min.cleanable.dirty.ratio
    min_compaction_lag_ms: int = 0  # min.compaction.lag.ms: records younger stay uncompacted
    max_compaction_lag_ms: int = LONG_MAX  # max.compaction.lag.ms: compact by then, whatever the ratio
    # Flush policy (strom.log.flusher); broker defaults are log.flush.interval.messages/.ms.
    flush_messages: int = LONG_MAX  # flush.messages: fsync after this many unflushed records
    flush_ms: int = LONG_MAX  # flush.ms: fsync when the last flush is this old
    min_insync_replicas: int = 1  # min.insync.replicas: for acks=all produce
    # unclean.leader.election.enable: may an out-of-sync replica lead (losing records)?
    unclean_leader_election_enable: bool = False
    # Replicas whose replication traffic is throttled ("partition:broker,...", "*" or ""),
    # on the leader's side and on the follower's (Kafka's reassignment throttles).
    leader_replication_throttled_replicas: str = ""
    follower_replication_throttled_replicas: str = ""
    compression_type: str = "producer"  # compression.type
    compression_gzip_level: int = -1  # compression.gzip.level (-1: the codec's default, 6)
    compression_lz4_level: int = 9  # compression.lz4.level
    compression_zstd_level: int = 3  # compression.zstd.level
    # CreateTime records must lie within [now - before, now + after] (Kafka 4.0's defaults).
    message_timestamp_before_max_ms: int = LONG_MAX
    message_timestamp_after_max_ms: int = 3600000
    segment_jitter_ms: int = 0  # segment.jitter.ms: up to this much earlier roll by segment.ms
    preallocate: bool = False  # preallocate: accepted; segments grow as written
    # Tiered storage (KIP-405): closed segments are copied to the remote store and the local
    # copies kept only for local.retention.* (-2: as retention.*); retention.* bound the whole log.
    local_retention_ms: int = -2
    local_retention_bytes: int = -2
    remote_storage_enable: bool = False
    remote_log_copy_disable: bool = False  # KIP-950: the remote data stays readable, nothing new is copied
    remote_log_delete_on_disable: bool = False
    # Not a topic config: the broker's (and controller's) remote.log.storage.system.enable, which
    # a topic must have to enable remote storage.
    remote_storage_system_enable: bool = False
    # Schema validation on produce (Confluent Server's names): every record's key / value must be
    # framed with a schema id registered for its subject (strom.schemas, the broker's registry).
    key_schema_validation: bool = False
    value_schema_validation: bool = False
    key_subject_name_strategy: str = TOPIC_NAME_STRATEGY
    value_subject_name_strategy: str = TOPIC_NAME_STRATEGY
    # Iceberg topics (strom.tables): the leader translates committed records into a table.
    iceberg_mode: str = "disabled"
    iceberg_partition_spec: str = "(hour(timestamp))"
    iceberg_table_properties: str = ""
    # KIP-1191: share groups may write their dead letters here (errors.deadletterqueue.group.enable).
    dead_letter_group_enable: bool = False
    # Not a topic config: the broker's iceberg.enabled, which a topic must have to set a mode.
    iceberg_system_enable: bool = False
    # Not a topic config: whether the broker runs the schema registry (schema.registry.listeners),
    # which the schema modes read; None where it is not known (nothing is checked).
    schema_registry_enable: bool | None = None
    # Derived from the fields above when made (asked at every append; a LogConfig is never
    # changed in place: with_overrides makes a new one).
    log_append_time: bool = dataclasses.field(init=False)  # message.timestamp.type=LogAppendTime
    delete_enabled: bool = dataclasses.field(init=False)  # cleanup.policy has delete
    compact: bool = dataclasses.field(init=False)  # cleanup.policy has compact
    # (codec, level) batches must be in (compression.type), or None to keep the producer's.
    recompress_to: tuple[int, int | None] | None = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.log_append_time = self.message_timestamp_type == LOG_APPEND_TIME
        policies = _policies(self.cleanup_policy)
        self.delete_enabled, self.compact = "delete" in policies, "compact" in policies
        self.recompress_to = None if self.compression_type == "producer" else _recompress_to(
            self.compression_type, self.compression_gzip_level, self.compression_lz4_level,
            self.compression_zstd_level)

    def replication_throttled(self, follower: bool, partition: int, broker: int) -> bool:
        """Is this replica's replication throttled (asked per partition per fetch, so the list
        is parsed once per distinct string)?"""
        listed = _parsed_throttled(self.follower_replication_throttled_replicas if follower
                                   else self.leader_replication_throttled_replicas)
        return listed is None or (partition, broker) in listed

    @property
    def local_retention_ms_effective(self) -> int:
        """How long a tiered log keeps a segment locally: local.retention.ms, or retention.ms
        for -2."""
        return self.retention_ms if self.local_retention_ms == -2 else self.local_retention_ms

    @property
    def local_retention_bytes_effective(self) -> int:
        return self.retention_bytes if self.local_retention_bytes == -2 else self.local_retention_bytes

    def with_overrides(self, overrides: Mapping[str, str]) -> LogConfig:
        """A copy with Kafka topic config overrides applied; ValueError("<key>: <reason>")."""
        changes: dict[str, Any] = {}
        for key, raw in overrides.items():
            if key in DEPRECATED_TOPIC_CONFIGS:
                log.warning("topic config %s=%s ignored: %s", key, raw, DEPRECATED_TOPIC_CONFIGS[key])
                continue
            spec = TOPIC_CONFIG_KEYS.get(key)
            if spec is None:
                raise ValueError(f"{key}: unknown topic config")
            field, parse = spec
            try:
                changes[field] = parse(str(raw).strip())
            except ValueError as e:
                raise ValueError(f"{key}: {e}") from None
        result = dataclasses.replace(self, **changes)
        _check_tiering(result, overrides)
        _check_iceberg(result, overrides)
        if result.min_compaction_lag_ms > result.max_compaction_lag_ms:
            # Kafka refuses the pair rather than either value on its own.
            key = "min.compaction.lag.ms" if "min.compaction.lag.ms" in overrides else "max.compaction.lag.ms"
            raise ValueError(
                f"{key}: min.compaction.lag.ms ({result.min_compaction_lag_ms}) is larger than "
                f"max.compaction.lag.ms ({result.max_compaction_lag_ms})"
            )
        return result

    def to_topic_configs(self) -> dict[str, str]:
        """Kafka config name -> string value, e.g. for DescribeConfigs."""
        return {key: _text(getattr(self, field)) for key, (field, _) in TOPIC_CONFIG_KEYS.items()}


def _text(value: Any) -> str:
    """A config value as Kafka writes it (booleans in lower case)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


# Value parsers shared by topic configs and broker configs (strom.config.broker): each takes
# the raw text and returns the typed value, or raises ValueError with a reason the caller
# prefixes with the key.
def int_in(low: int | None = None, high: int = 2**63 - 1) -> Callable[[str], int]:
    """At most a Kafka LONG unless told less."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError(f"expected an integer, got {text!r}") from None
        if low is not None and value < low:
            raise ValueError(f"must be at least {low}, got {value}")
        if value > high:
            raise ValueError(f"must be at most {high}, got {value}")
        return value

    return parse


def double_in(low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise ValueError(f"expected a number, got {text!r}") from None
        if not low <= value <= high:
            raise ValueError(f"must be in [{low}, {high}], got {value}")
        return value

    return parse


def one_of(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.strip() not in options:
            raise ValueError(f"must be one of {', '.join(options)}, got {text!r}")
        return text.strip()

    return parse


def _cleanup_policy(value: str) -> str:
    parts = [p.strip() for p in value.split(",")]
    if not parts or any(p not in ("delete", "compact") for p in parts):
        raise ValueError(f"expected a list of delete, compact, got {value!r}")
    return ",".join(parts)


def parse_bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise ValueError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


# Asked at every append: parsed once per distinct value (few: they are validated on the way in).
@functools.lru_cache(maxsize=64)
def _policies(cleanup_policy: str) -> frozenset[str]:
    return frozenset(cleanup_policy.split(","))


@functools.lru_cache(maxsize=64)
def _recompress_to(compression_type: str, gzip_level: int, lz4_level: int,
                   zstd_level: int) -> tuple[int, int | None]:
    c = compression
    codec = {"uncompressed": c.NONE, "gzip": c.GZIP, "snappy": c.SNAPPY, "lz4": c.LZ4,
             "zstd": c.ZSTD}[compression_type]
    level = {c.GZIP: None if gzip_level == -1 else gzip_level, c.LZ4: lz4_level,
             c.ZSTD: zstd_level}.get(codec)
    return codec, level


@functools.lru_cache(maxsize=256)
def _parsed_throttled(text: str) -> frozenset[tuple[int, int]] | None:
    """A throttled-replicas string as (partition, broker) pairs, or None for "*" (all)."""
    text = text.strip()
    if text == "*":
        return None
    pairs = set()
    for item in text.split(","):
        partition, sep, broker = item.strip().partition(":")
        if sep:
            try:
                pairs.add((int(partition), int(broker)))
            except ValueError:
                continue  # validated on the way in (_throttled_replicas); nothing to match
    return frozenset(pairs)


def _throttled_replicas(text: str) -> str:
    """Kafka's throttled replica list: "*", or "partition:broker" pairs separated by commas."""
    text = text.strip()
    if text in ("", "*"):
        return text
    for pair in text.split(","):
        partition, sep, broker = pair.strip().partition(":")
        if not sep or not partition.isdigit() or not broker.isdigit():
            raise ValueError(f"expected '*' or a list of partition:broker, got {pair.strip()!r}")
    return text


# Kafka topic config name -> (LogConfig field, parser). Bounds are Kafka's.
TOPIC_CONFIG_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "segment.bytes": ("segment_bytes", int_in(14, INT_MAX)),
    "segment.ms": ("segment_ms", int_in(1, LONG_MAX)),
    "retention.ms": ("retention_ms", int_in(-1, LONG_MAX)),
    "retention.bytes": ("retention_bytes", int_in(-1, LONG_MAX)),
    "index.interval.bytes": ("index_interval_bytes", int_in(0, INT_MAX)),
    "segment.index.bytes": ("segment_index_bytes", int_in(4, INT_MAX)),
    "max.message.bytes": ("max_message_bytes", int_in(0, INT_MAX)),
    "message.timestamp.type": ("message_timestamp_type", one_of(CREATE_TIME, LOG_APPEND_TIME)),
    "file.delete.delay.ms": ("file_delete_delay_ms", int_in(0, LONG_MAX)),
    "cleanup.policy": ("cleanup_policy", _cleanup_policy),
    "delete.retention.ms": ("delete_retention_ms", int_in(0, LONG_MAX)),
    "min.cleanable.dirty.ratio": ("min_cleanable_dirty_ratio", double_in(0.0, 1.0)),
    "min.compaction.lag.ms": ("min_compaction_lag_ms", int_in(0, LONG_MAX)),
    "max.compaction.lag.ms": ("max_compaction_lag_ms", int_in(1, LONG_MAX)),
    "flush.messages": ("flush_messages", int_in(1, LONG_MAX)),
    "flush.ms": ("flush_ms", int_in(0, LONG_MAX)),
    "min.insync.replicas": ("min_insync_replicas", int_in(1, INT_MAX)),
    "unclean.leader.election.enable": ("unclean_leader_election_enable", parse_bool),
    "leader.replication.throttled.replicas": ("leader_replication_throttled_replicas",
                                              lambda text: _throttled_replicas(text)),
    "follower.replication.throttled.replicas": ("follower_replication_throttled_replicas",
                                                lambda text: _throttled_replicas(text)),
    "compression.type": ("compression_type", one_of(*COMPRESSION_TYPES)),
    "compression.gzip.level": ("compression_gzip_level", lambda text: _level(text, 1, 9, allow=(-1,))),
    "compression.lz4.level": ("compression_lz4_level", lambda text: _level(text, 1, 17)),
    "compression.zstd.level": ("compression_zstd_level", lambda text: _level(text, -131072, 22)),
    "message.timestamp.before.max.ms": ("message_timestamp_before_max_ms", int_in(0, LONG_MAX)),
    "message.timestamp.after.max.ms": ("message_timestamp_after_max_ms", int_in(0, LONG_MAX)),
    "segment.jitter.ms": ("segment_jitter_ms", int_in(0, LONG_MAX)),
    "preallocate": ("preallocate", parse_bool),
    "local.retention.ms": ("local_retention_ms", int_in(-2, LONG_MAX)),
    "local.retention.bytes": ("local_retention_bytes", int_in(-2, LONG_MAX)),
    "remote.storage.enable": ("remote_storage_enable", parse_bool),
    "remote.log.copy.disable": ("remote_log_copy_disable", parse_bool),
    "remote.log.delete.on.disable": ("remote_log_delete_on_disable", parse_bool),
    "confluent.key.schema.validation": ("key_schema_validation", parse_bool),
    "confluent.value.schema.validation": ("value_schema_validation", parse_bool),
    "confluent.key.subject.name.strategy": ("key_subject_name_strategy", lambda text: _strategy(text)),
    "confluent.value.subject.name.strategy": ("value_subject_name_strategy", lambda text: _strategy(text)),
    "iceberg.mode": ("iceberg_mode", one_of(*ICEBERG_MODES)),
    "iceberg.partition.spec": ("iceberg_partition_spec", lambda text: _partition_spec_text(text)),
    "iceberg.table.properties": ("iceberg_table_properties", lambda text: _table_properties_text(text)),
    "errors.deadletterqueue.group.enable": ("dead_letter_group_enable", parse_bool),
}

# Keys beyond Apache Kafka's (Confluent Server's schema validation): described only where a topic
# sets them, so that a topic otherwise describes exactly Kafka's configs.
# KIP-1191's topic key comes after Kafka 4.3 (the release Strom describes): shown where set.
EXTENSION_TOPIC_CONFIGS = frozenset(k for k in TOPIC_CONFIG_KEYS if k.startswith(("confluent.", "iceberg."))
                                    or k == "errors.deadletterqueue.group.enable")

# Keys Kafka 3.x took and 4.0 dropped (message format v0/v1, down-conversion, the old
# timestamp bound): accepted so that old scripts still work, with a warning, and ignored.
DEPRECATED_TOPIC_CONFIGS = {
    "message.format.version": "record batches are always v2 (Kafka 4.0 removed this config)",
    "message.downconversion.enable": "no down-conversion: clients older than Fetch v4 are not served",
    "message.timestamp.difference.max.ms": "use message.timestamp.before.max.ms and message.timestamp.after.max.ms",
}

# Kafka's ConfigDef type of each topic config, for DescribeConfigs (v3+).
TOPIC_CONFIG_TYPES = {
    **dict.fromkeys(("segment.bytes", "segment.index.bytes", "max.message.bytes", "index.interval.bytes",
                     "min.insync.replicas", "compression.gzip.level", "compression.lz4.level",
                     "compression.zstd.level"), "INT"),
    **dict.fromkeys(("segment.ms", "segment.jitter.ms", "retention.ms", "retention.bytes", "flush.messages",
                     "flush.ms", "delete.retention.ms", "min.compaction.lag.ms", "max.compaction.lag.ms",
                     "file.delete.delay.ms", "message.timestamp.before.max.ms",
                     "message.timestamp.after.max.ms", "message.timestamp.difference.max.ms",
                     "local.retention.ms", "local.retention.bytes"), "LONG"),
    **dict.fromkeys(("unclean.leader.election.enable", "preallocate", "remote.storage.enable",
                     "remote.log.copy.disable", "remote.log.delete.on.disable",
                     "message.downconversion.enable", "confluent.key.schema.validation",
                     "errors.deadletterqueue.group.enable",
                     "confluent.value.schema.validation"), "BOOLEAN"),
    **dict.fromkeys(("cleanup.policy", "leader.replication.throttled.replicas",
                     "follower.replication.throttled.replicas"), "LIST"),
    "min.cleanable.dirty.ratio": "DOUBLE",
    **dict.fromkeys(("message.timestamp.type", "compression.type", "message.format.version",
                     "confluent.key.subject.name.strategy", "confluent.value.subject.name.strategy",
                     "iceberg.mode", "iceberg.partition.spec", "iceberg.table.properties"), "STRING"),
}


def _strategy(text: str) -> str:
    """A subject name strategy by its full class name or its short one (TopicNameStrategy)."""
    for name in SUBJECT_NAME_STRATEGIES:
        if text.strip() in (name, name.rsplit(".", 1)[1]):
            return name
    raise ValueError(f"must be one of {', '.join(SUBJECT_NAME_STRATEGIES)}, got {text!r}")


def _level(text: str, low: int, high: int, allow: tuple[int, ...] = ()) -> int:
    value = int_in(None, high)(text)
    if value not in allow and value < low:
        raise ValueError(f"must be in [{low}, {high}]{' or ' + ', '.join(map(str, allow)) if allow else ''}, got {value}")
    return value


def check_remote_storage_change(old: Mapping[str, str], new: Mapping[str, str]) -> None:
    """KIP-950's rule for turning remote storage off on a topic: only together with deleting its
    remote data and stopping copies (remote.log.delete.on.disable and remote.log.copy.disable
    true); keeping the remote data read-only is remote.storage.enable=true with
    remote.log.copy.disable=true. ValueError("<key>: <reason>") otherwise."""
    def flag(configs: Mapping[str, str], key: str) -> bool:
        return str(configs.get(key, "false")).strip().lower() == "true"

    if flag(old, "remote.storage.enable") and not flag(new, "remote.storage.enable") and not (
            flag(new, "remote.log.delete.on.disable") and flag(new, "remote.log.copy.disable")):
        raise ValueError("remote.storage.enable: remote storage can be turned off only with its data deleted: "
                         "set remote.log.copy.disable=true and remote.log.delete.on.disable=true with it; to "
                         "keep the remote data readable instead, keep remote.storage.enable=true and set "
                         "remote.log.copy.disable=true")


def _check_tiering(config: LogConfig, overrides: Mapping[str, str]) -> None:
    """Kafka's checks of a tiered topic's configs (LogConfig.validate): the broker must have
    remote storage, the topic must not be compacted, and local retention must not outlast the
    whole log's."""
    if not config.remote_storage_enable:
        return
    if "remote.storage.enable" in overrides and not config.remote_storage_system_enable:
        raise ValueError("remote.storage.enable: Tiered Storage functionality is disabled in the broker. "
                         "Topic cannot be configured with remote log storage "
                         "(set remote.log.storage.system.enable=true)")
    if config.compact:
        key = "cleanup.policy" if "cleanup.policy" in overrides else "remote.storage.enable"
        raise ValueError(f"{key}: Remote log storage only supported for topics with cleanup.policy=delete")
    for local, whole, name in ((config.local_retention_ms, config.retention_ms, "ms"),
                               (config.local_retention_bytes, config.retention_bytes, "bytes")):
        if whole != -1 and local != -2 and (local == -1 or local > whole):
            raise ValueError(f"local.retention.{name}: Value must not be more than retention.{name} "
                             f"property value, but it is {local} (retention.{name} is {whole})")


def parse_partition_spec(text: str) -> tuple[tuple[str, str], ...]:
    """An Iceberg partition spec as iceberg.partition.spec writes it: "(hour(timestamp))",
    "(day(timestamp), partition)", "()" for none; each field a column or transform(column). The
    (transform, column) pairs; ValueError when it is not of that form."""
    body = text.strip()
    if not (body.startswith("(") and body.endswith(")")):
        raise ValueError(f"expected a parenthesized list such as (hour(timestamp)) or (), got {text!r}")
    body = body[1:-1].strip()
    fields: list[tuple[str, str]] = []
    for item in filter(None, (part.strip() for part in body.split(","))) if body else ():
        if item.endswith(")") and "(" in item:
            transform, _, column = item[:-1].partition("(")
            transform, column = transform.strip(), column.strip()
        else:
            transform, column = "identity", item
        if transform not in ICEBERG_TRANSFORMS:
            raise ValueError(f"unknown transform {transform!r} (one of {', '.join(ICEBERG_TRANSFORMS)})")
        if not column.isidentifier():
            raise ValueError(f"{item!r} does not name a column")
        fields.append((transform, column))
    if body and not fields:
        raise ValueError(f"expected a list of fields, got {text!r}")
    if len(set(fields)) != len(fields):
        raise ValueError(f"a field appears twice in {text!r}")
    return tuple(fields)


def _partition_spec_text(text: str) -> str:
    fields = parse_partition_spec(text)
    return "(" + ", ".join(c if t == "identity" else f"{t}({c})" for t, c in fields) + ")"


def parse_table_properties(text: str) -> dict[str, str]:
    """iceberg.table.properties: "k=v,k2=v2" as a dict; ValueError when a pair has no key."""
    properties = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected a list of key=value, got {pair!r}")
        if key.strip().startswith("strom."):
            raise ValueError(f"{key.strip()}: table properties under strom. are Strom's own")
        properties[key.strip()] = value.strip()
    return properties


def _table_properties_text(text: str) -> str:
    return ",".join(f"{k}={v}" for k, v in parse_table_properties(text).items())


def _check_iceberg(config: LogConfig, overrides: Mapping[str, str]) -> None:
    """A topic in an Iceberg mode needs iceberg.enabled on the brokers (and a schema mode the
    schema registry), and a partition spec over the mode's columns."""
    if config.iceberg_mode == "disabled":
        return
    if "iceberg.mode" in overrides and not config.iceberg_system_enable:
        raise ValueError("iceberg.mode: Iceberg topics are disabled in the broker (set iceberg.enabled=true)")
    columns = ICEBERG_KEY_VALUE_COLUMNS if config.iceberg_mode == "key_value" else ICEBERG_METADATA_COLUMNS
    for transform, column in parse_partition_spec(config.iceberg_partition_spec):
        if column not in columns:
            raise ValueError(f"iceberg.partition.spec: no column {column!r} in the {config.iceberg_mode} mode "
                             f"(one of {', '.join(columns)})")
        if transform in ICEBERG_TIME_TRANSFORMS and column != "timestamp":
            raise ValueError(f"iceberg.partition.spec: {transform}() applies to timestamp, not {column!r}")
    if "iceberg.mode" in overrides and config.iceberg_mode in ICEBERG_SCHEMA_MODES and (
            config.schema_registry_enable is False):
        raise ValueError(f"iceberg.mode: {config.iceberg_mode} reads the schema registry, which the "
                         "broker does not run (set schema.registry.listeners)")
