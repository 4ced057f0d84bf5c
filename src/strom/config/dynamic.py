"""Dynamic broker configs (Kafka's DynamicBrokerConfig).

Three layers make the broker's effective config, lowest precedence first: server.properties
(plus `--override`), the cluster-wide dynamic default (`/config/brokers/<default>` in the
metadata store) and this broker's dynamic configs (`/config/brokers/<id>`). AlterConfigs and
IncrementalAlterConfigs change the dynamic layers; only DYNAMIC_BROKER_CONFIGS may be set
there, and a change is validated by building the whole effective config before anything is
stored, so a bad value is INVALID_CONFIG and leaves the broker as it was.

A dynamic config is also bounded by what this machine can run (`MACHINE_BOUNDS`), not only by
Kafka's ranges and its per-step rule for cleaner threads: 18 doublings took the cleaner to
200,000 threads. What was stored before is checked the same way at start-up (`load`): a stored
config the broker cannot take is left out and named in the log, and the broker serves.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from strom.config import dynamic_modes as modes
from strom.config.broker import DEFINITIONS, BrokerConfig, ConfigError, is_kafka_broker_config
from strom.config.describe import ConfigLayers
from strom.protocol.errors import ErrorCode, KafkaError

DEFAULT_ENTITY = "<default>"  # Kafka's ZooKeeper name for the cluster-wide default


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# Dynamic configs that cost the machine something, with the (lowest, highest) value it can run
# and why; None leaves that side to Kafka's range. Lower bounds stop a default that would make
# every partition roll or the cleaner spin (Kafka 4 itself raised segment.bytes' minimum to
# 1 MiB, and plans 1 minute for segment.ms and 1 KiB for segment.index.bytes).
MACHINE_BOUNDS: dict[str, Callable[[], tuple[int | None, int | None, str]]] = {
    "log.cleaner.threads": lambda: (None, max(4, 2 * _cores()), f"twice this machine's {_cores()} cores"),
    "log.cleaner.dedupe.buffer.size": lambda: (None, _memory_bytes() // 4,
                                               "a quarter of this machine's memory"),
    "log.cleaner.backoff.ms": lambda: (100, None, "a cleaner that never sleeps rescans every log"),
    "log.segment.bytes": lambda: (1 << 20, None, "smaller segments make a file per few records"),
    "log.index.size.max.bytes": lambda: (1024, None, "a full index rolls the segment"),
    "log.roll.ms": lambda: (60_000, None, "every append would roll a segment"),
}


def machine_bound_error(key: str, value: int | None) -> str | None:
    """Why `value` for dynamic config `key` is more than this machine can run, or None."""
    bounds = MACHINE_BOUNDS.get(key)
    if bounds is None or value is None:
        return None
    low, high, why = bounds()
    if low is not None and value < low:
        return f"Invalid value {value} for {key}: at least {low} ({why})"
    if high is not None and value > high:
        return f"Invalid value {value} for {key}: at most {high} ({why})"
    return None


def check_dynamic(is_default: bool, configs: Mapping[str, str]) -> None:
    """Kafka's checks of a dynamic broker config change (DynamicBrokerConfig.validateConfigs),
    before any value is parsed: each key known, dynamic, at a scope that takes it, and of its
    type. A key that may not be changed so is INVALID_REQUEST, as Kafka answers; a key no broker
    knows, or a bad value, INVALID_CONFIG."""
    def names(keys: list[str]) -> str:
        return ", ".join(sorted(keys))

    unknown = [k for k in configs if k not in DEFINITIONS and not is_kafka_broker_config(k)]
    if unknown:
        raise KafkaError(f"Unknown broker config: {names(unknown)}", ErrorCode.INVALID_CONFIG)
    unprefixed = [k for k in configs if k in modes.LISTENER_PREFIX_ONLY]
    if unprefixed:
        raise KafkaError("These security configs can be dynamically updated only per-listener using the "
                         f"listener prefix: {names(unprefixed)}", ErrorCode.INVALID_REQUEST)
    static_only = [k for k in configs if modes.mode_of(k) is None or modes.effect_of(k) == modes.REFUSED]
    if static_only:
        raise KafkaError(f"Cannot update these configs dynamically: {names(static_only)}",
                         ErrorCode.INVALID_REQUEST)
    for key, value in sorted(configs.items()):
        if (error := modes.value_error(key, value)) is not None:
            raise KafkaError(error, ErrorCode.INVALID_CONFIG)
    per_broker = [k for k in configs if modes.mode_of(k) == modes.PER_BROKER]
    if is_default and per_broker:
        raise KafkaError("Cannot update these configs at default cluster level, broker id must be "
                         f"specified: {names(per_broker)}", ErrorCode.INVALID_REQUEST)


class DynamicBrokerConfig:
    def __init__(self, static: BrokerConfig) -> None:
        self.static = static
        self.default: dict[str, str] = {}
        self.per_broker: dict[str, str] = {}

    def layers(self) -> ConfigLayers:
        return ConfigLayers(self.static.props, self.default, self.per_broker)

    def entity(self, is_default: bool) -> dict[str, str]:
        return self.default if is_default else self.per_broker

    def effective(self) -> BrokerConfig:
        return self._build(self.default, self.per_broker)

    def _build(self, default: Mapping[str, str], per_broker: Mapping[str, str]) -> BrokerConfig:
        return BrokerConfig({**self.static.props, **default, **per_broker})

    def validate(self, is_default: bool, configs: Mapping[str, str], *, stepwise: bool = True) -> BrokerConfig:
        """The effective config if the entity's dynamic configs became `configs`; raises
        KafkaError(INVALID_CONFIG) naming the problem. `stepwise`: a change from the current
        config, to which Kafka's per-step rule applies (not so for what start-up loads)."""
        check_dynamic(is_default, configs)
        default = configs if is_default else self.default
        per_broker = self.per_broker if is_default else configs
        try:
            effective = self._build(default, per_broker)
            effective.default_log_config().with_overrides({})  # cross-field checks
        except (ConfigError, ValueError) as e:
            raise KafkaError(str(e), ErrorCode.INVALID_CONFIG) from None
        current = self.effective()["log.cleaner.threads"]
        wanted = effective["log.cleaner.threads"]
        if stepwise and not current / 2 <= wanted <= current * 2:
            # Kafka's bound: one change may at most halve or double the cleaner threads.
            raise KafkaError(f"Invalid value {wanted} for log.cleaner.threads: it may change by at "
                             f"most a factor of 2 at a time (currently {current})",
                             ErrorCode.INVALID_CONFIG)
        for key in sorted(configs):
            if (error := machine_bound_error(key, effective.values.get(key))) is not None:
                raise KafkaError(error, ErrorCode.INVALID_CONFIG)
        return effective

    def update(self, is_default: bool, configs: Mapping[str, str]) -> BrokerConfig:
        """Validate and take `configs` as the entity's dynamic configs; the new effective config."""
        effective = self.validate(is_default, configs)
        target = self.entity(is_default)
        target.clear()
        target.update(configs)
        return effective

    def load(self, default: Mapping[str, str], per_broker: Mapping[str, str]) -> list[str]:
        """Take the stored dynamic configs (cluster default, then this broker's), leaving out
        each one the broker cannot take: stored by an older version, by hand, or before a
        bound existed. Returns why each was left out, for the log."""
        self.default.clear()
        self.per_broker.clear()
        refused = []
        for is_default, stored in ((True, default), (False, per_broker)):
            layer = self.entity(is_default)
            for key, value in stored.items():
                try:
                    self.validate(is_default, {**layer, key: value}, stepwise=False)
                except KafkaError as e:
                    where = DEFAULT_ENTITY if is_default else "this broker"
                    refused.append(f"{key}={str(value)[:100]} ({where}): {e}")
                    continue
                layer[key] = value
        return refused
