"""Config descriptions as DescribeConfigs answers them (and CreateTopics v5+ for a new topic):
every config's effective value, where it comes from (ConfigSource), its synonyms in
precedence order and, when asked, its documentation (strom.config.docs), for topics
and for brokers.

Precedence is Kafka's: a topic override (DYNAMIC_TOPIC_CONFIG), then the broker configs that
set the topic default - dynamic for this broker (DYNAMIC_BROKER_CONFIG), dynamic cluster
default (DYNAMIC_DEFAULT_BROKER_CONFIG), server.properties (STATIC_BROKER_CONFIG) - and last
Kafka's default (DEFAULT_CONFIG).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from strom.config import docs as config_docs
from strom.config.broker import DEFINITIONS, SENSITIVE
from strom.config.dynamic_modes import EFFECT, REFUSED
from strom.config.synonyms import BROKER_SYNONYMS
from strom.log.config import (
    EXTENSION_TOPIC_CONFIGS,
    TOPIC_CONFIG_KEYS,
    TOPIC_CONFIG_TYPES,
    LogConfig,
)

# ConfigSource
UNKNOWN, DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG = 0, 1, 2, 3
STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 4, 5
# ConfigType (DescribeConfigs v3+)
BOOLEAN, STRING, INT, SHORT, LONG, DOUBLE, LIST, CLASS, PASSWORD = 1, 2, 3, 4, 5, 6, 7, 8, 9

# Broker configs a broker group of synonyms shares (Kafka's brokerConfigSynonyms).
_BROKER_GROUPS = [
    ("log.roll.ms", "log.roll.hours"),
    ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
    ("log.flush.interval.ms", "log.flush.scheduler.interval.ms"),
    ("log.roll.jitter.ms", "log.roll.jitter.hours"),
]

# Broker configs that AlterConfigs may change at runtime (Kafka 4.0's dynamic sets, less those
# Strom cannot change while running); the rest are read-only, as in Kafka.
DYNAMIC_BROKER_CONFIGS = frozenset(k for k, effect in EFFECT.items() if effect != REFUSED)

LIST_CONFIGS = frozenset({"cleanup.policy", "log.cleanup.policy", "listeners", "advertised.listeners",
                          "leader.replication.throttled.replicas", "follower.replication.throttled.replicas",
                          "log.dirs", "log.dir", "group.coordinator.rebalance.protocols",
                          "group.consumer.assignors"})


def _type_of(name: str, default: str | None) -> int:
    if name in LIST_CONFIGS:
        return LIST
    if default in ("true", "false"):
        return BOOLEAN
    if default is None:
        return STRING if not name.endswith((".ms", ".bytes", ".hours", ".minutes", ".messages")) else LONG
    try:
        value = int(default)
    except ValueError:
        try:
            float(default)
            return DOUBLE
        except ValueError:
            return STRING
    return LONG if name.endswith((".ms", ".messages")) or not -(2**31) <= value < 2**31 else INT


_TYPE_IDS = {"BOOLEAN": BOOLEAN, "STRING": STRING, "INT": INT, "SHORT": SHORT, "LONG": LONG,
             "DOUBLE": DOUBLE, "LIST": LIST, "CLASS": CLASS, "PASSWORD": PASSWORD}


def config_type(name: str) -> int:
    """The ConfigType of a topic or broker config: Kafka's, for topic configs and the broker
    configs that set their defaults; inferred from the default for the rest."""
    if name in TOPIC_CONFIG_TYPES:
        return _TYPE_IDS[TOPIC_CONFIG_TYPES[name]]
    topic = next((t for t, names in BROKER_SYNONYMS.items() if name in names), None)
    if topic is not None and not name.endswith((".hours", ".minutes")):
        return _TYPE_IDS[TOPIC_CONFIG_TYPES[topic]]
    if name in TOPIC_CONFIG_KEYS:
        default = str(LogConfig().to_topic_configs()[name])
        return _type_of(name, default)
    spec = DEFINITIONS.get(name)
    return _type_of(name, spec[1] if spec else None)


class ConfigLayers:
    """The broker config layers a description needs: server.properties, the dynamic cluster
    default and this broker's dynamic configs."""

    def __init__(self, static: Mapping[str, str], dynamic_default: Mapping[str, str],
                 dynamic_broker: Mapping[str, str]) -> None:
        self.static = static
        self.dynamic_default = dynamic_default
        self.dynamic_broker = dynamic_broker

    def synonyms(self, described: str, names: Iterable[str], per_broker: bool = True) -> list[dict]:
        """Kafka's configSynonyms: every set value of `names` (a broker config's whole group:
        log.retention.ms, .minutes, .hours), by source precedence, then those before the first
        one named `described` dropped: a synonym that outranks the described name is not its
        synonym (Kafka's dropWhile, which kafka-configs --describe shows)."""
        names = list(names)
        out: list[dict] = []
        layers = [(self.dynamic_broker, DYNAMIC_BROKER_CONFIG),
                  (self.dynamic_default, DYNAMIC_DEFAULT_BROKER_CONFIG),
                  (self.static, STATIC_BROKER_CONFIG),
                  ({n: d for n, (_, d) in DEFINITIONS.items() if d is not None}, DEFAULT_CONFIG)]
        for layer, source in layers:
            for name in names:
                if name in layer:
                    out.append({"name": name, "value": str(layer[name]), "source": source})
        first = next((i for i, s in enumerate(out) if s["name"] == described), len(out))
        # The cluster defaults' description keeps only their own layer, after the drop as Kafka's.
        return [s for s in out[first:] if per_broker or s["source"] == DYNAMIC_DEFAULT_BROKER_CONFIG]


def _entry(name: str, value: str | None, source: int, synonyms: list[dict], *, read_only: bool,
           include_synonyms: bool, include_docs: bool, doc: str | None) -> dict:
    sensitive = name in SENSITIVE
    if sensitive:  # Kafka's PASSWORD configs: never shown, here or in a synonym
        value, synonyms = None, [{**s, "value": None} for s in synonyms]
    return {
        "name": name,
        "value": value,
        "read_only": read_only,
        "config_source": source,
        "is_sensitive": sensitive,
        "synonyms": synonyms if include_synonyms else [],
        "config_type": config_type(name),
        "documentation": doc if include_docs else None,
    }


def describe_topic(defaults: LogConfig, overrides: Mapping[str, str], layers: ConfigLayers,
                   keys: Iterable[str] | None = None, *, include_synonyms: bool = False,
                   include_docs: bool = False) -> list[dict]:
    """Every config of a topic with `overrides` (or just `keys`), DescribeConfigs style."""
    effective = defaults.with_overrides(overrides).to_topic_configs()
    if keys is None:
        wanted = sorted(k for k in effective if k not in EXTENSION_TOPIC_CONFIGS or k in overrides)
    else:
        wanted = [k for k in keys if k in effective]
    out = []
    for name in wanted:
        broker_names = BROKER_SYNONYMS.get(name, ())
        synonyms = layers.synonyms(broker_names[0], broker_names) if broker_names else []
        if name in overrides:
            synonyms.insert(0, {"name": name, "value": str(overrides[name]), "source": DYNAMIC_TOPIC_CONFIG})
        source = synonyms[0]["source"] if synonyms else DEFAULT_CONFIG
        out.append(_entry(name, effective[name], source, synonyms, read_only=False,
                          include_synonyms=include_synonyms, include_docs=include_docs,
                          doc=config_docs.doc(name)))
    return out


def created_topic_configs(defaults: LogConfig, overrides: Mapping[str, str],
                          layers: ConfigLayers) -> list[dict]:
    """The configs CreateTopics v5+ reports for a new topic (its schema's subset)."""
    fields = ("name", "value", "read_only", "config_source", "is_sensitive")
    return [{k: e[k] for k in fields} for e in describe_topic(defaults, overrides, layers)]


def _broker_synonym_names(name: str) -> tuple[str, ...]:
    return next((group for group in _BROKER_GROUPS if name in group), (name,))


def describe_broker(values: Mapping[str, Any], layers: ConfigLayers, keys: Iterable[str] | None = None,
                    *, per_broker: bool = True, include_synonyms: bool = False,
                    include_docs: bool = False) -> list[dict]:
    """A broker's configs (`per_broker`), or the dynamic cluster defaults (resource name "")."""
    if per_broker:
        names = sorted(DEFINITIONS)
    else:
        names = sorted(layers.dynamic_default)
    if keys is not None:
        wanted = set(keys)
        names = [n for n in names if n in wanted]
    out = []
    for name in names:
        synonyms = layers.synonyms(name, _broker_synonym_names(name), per_broker)
        source = synonyms[0]["source"] if synonyms else DEFAULT_CONFIG
        if per_broker:
            raw = _raw_value(name, values, layers)
        else:
            raw = str(layers.dynamic_default[name])
        out.append(_entry(name, raw, source, synonyms, read_only=name not in DYNAMIC_BROKER_CONFIGS,
                          include_synonyms=include_synonyms, include_docs=include_docs,
                          doc=config_docs.doc(name, broker=True)))
    return out


def _raw_value(name: str, values: Mapping[str, Any], layers: ConfigLayers) -> str | None:
    for layer in (layers.dynamic_broker, layers.dynamic_default, layers.static):
        if name in layer:
            return str(layer[name])
    default = DEFINITIONS[name][1]
    if default is not None:
        return default
    value = values.get(name)
    if value is None:
        return None
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)
