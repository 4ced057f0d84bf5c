"""Dynamic broker configs (Kafka's DynamicBrokerConfig).

Three layers make the broker's effective config, lowest precedence first: server.properties
(plus `--override`), the cluster-wide dynamic default (`/config/brokers/<default>` in the
metadata store) and this broker's dynamic configs (`/config/brokers/<id>`). AlterConfigs and
IncrementalAlterConfigs change the dynamic layers; only DYNAMIC_BROKER_CONFIGS may be set
there, and a change is validated by building the whole effective config before anything is
stored, so a bad value is INVALID_CONFIG and leaves the broker as it was.
"""

from __future__ import annotations

from collections.abc import Mapping

from strom.config.broker import DEFINITIONS, BrokerConfig, ConfigError
from strom.config.describe import DYNAMIC_BROKER_CONFIGS, ConfigLayers
from strom.protocol.errors import ErrorCode, KafkaError

DEFAULT_ENTITY = "<default>"  # Kafka's ZooKeeper name for the cluster-wide default


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

    def validate(self, is_default: bool, configs: Mapping[str, str]) -> BrokerConfig:
        """The effective config if the entity's dynamic configs became `configs`; raises
        KafkaError(INVALID_CONFIG) naming the problem."""
        unknown = sorted(k for k in configs if k not in DEFINITIONS)
        if unknown:
            raise KafkaError(f"Unknown broker config: {', '.join(unknown)}", ErrorCode.INVALID_CONFIG)
        static_only = sorted(k for k in configs if k not in DYNAMIC_BROKER_CONFIGS)
        if static_only:
            raise KafkaError(f"Cannot update these configs dynamically: {', '.join(static_only)}",
                             ErrorCode.INVALID_CONFIG)
        default = configs if is_default else self.default
        per_broker = self.per_broker if is_default else configs
        try:
            effective = self._build(default, per_broker)
            effective.default_log_config().with_overrides({})  # cross-field checks
        except (ConfigError, ValueError) as e:
            raise KafkaError(str(e), ErrorCode.INVALID_CONFIG) from None
        current = self.effective()["log.cleaner.threads"]
        wanted = effective["log.cleaner.threads"]
        if not current / 2 <= wanted <= current * 2:
            # Kafka's bound: one change may at most halve or double the cleaner threads.
            raise KafkaError(f"Invalid value {wanted} for log.cleaner.threads: it may change by at "
                             f"most a factor of 2 at a time (currently {current})",
                             ErrorCode.INVALID_CONFIG)
        return effective

    def update(self, is_default: bool, configs: Mapping[str, str]) -> BrokerConfig:
        """Validate and take `configs` as the entity's dynamic configs; the new effective config."""
        effective = self.validate(is_default, configs)
        target = self.entity(is_default)
        target.clear()
        target.update(configs)
        return effective
