"""The schema registry's place in the broker: with schema.registry.listeners set, the registry
(strom.registry) reading `_schemas` into its store, its REST API on its own HTTP listener, and
its security when schema.registry.authentication.method is BASIC. `broker.schema_registry.store`
is what produce-time validation reads (is_registered, schema_by_id)."""

from __future__ import annotations

import logging
import ssl
from functools import partial
from typing import Any

from strom.config.broker import ConfigError

log = logging.getLogger(__name__)


class RunningRegistry:
    """The registry, its API and its listener, started and stopped together."""

    def __init__(self, registry: Any, api: Any, listener: Any, url: str) -> None:
        self.registry = registry
        self.api = api
        self.listener = listener
        self.url = url

    @property
    def store(self) -> Any:
        return self.registry.store

    async def close(self) -> None:
        await self.listener.close()
        await self.api.close()
        await self.registry.close()


async def start_schema_registry(broker: Any) -> RunningRegistry | None:
    config = broker.config
    listeners = config["schema.registry.listeners"]
    if not listeners:
        return None
    # Loaded only when turned on: aiohttp and the schema libraries are the registry's own.
    from strom.registry.api import RegistryApi
    from strom.registry.server import HttpListener, ListenerError, parse_listener
    from strom.registry.service import RegistryConfig, SchemaRegistry
    from strom.security.tls import client_context, server_context

    try:
        scheme, host, port = parse_listener(listeners)
    except ListenerError as e:
        raise ConfigError(str(e)) from None
    get = partial(_ssl_setting, config)
    context = server_context(get, "SCHEMA_REGISTRY") if scheme == "https" else None
    forward_ssl = None
    if scheme == "https":  # forwards to the writer check its certificate with the broker's truststore
        trusted = get("ssl.truststore.location") or get("ssl.truststore.certificates")
        forward_ssl = client_context(get, "SCHEMA_REGISTRY") if trusted else ssl.create_default_context()
    registry = SchemaRegistry(broker, RegistryConfig(
        topic=config["schema.registry.kafkastore.topic"],
        replication_factor=config["schema.registry.kafkastore.topic.replication.factor"],
        compatibility=config["schema.registry.schema.compatibility.level"].upper(),
        mode_mutability=config["schema.registry.mode.mutability"]))
    security = None
    if config["schema.registry.authentication.method"] == "BASIC":
        from strom.registry.auth import RegistrySecurity

        security = RegistrySecurity(broker)
    api = RegistryApi(registry, security, config["schema.registry.request.max.bytes"], forward_ssl)
    listener = HttpListener(api.app, config["schema.registry.max.connections"])
    registry.start()
    await listener.start(host, port, context)
    bound_host, bound_port = listener.bound
    url = f"{scheme}://{host or bound_host}:{bound_port}"
    log.info("schema registry listening on %s (topic %s)", url, registry.config.topic)
    return RunningRegistry(registry, api, listener, url)


def _ssl_setting(config: Any, key: str) -> Any:
    return config[key] if key in config.values else None


async def stop_schema_registry(broker: Any) -> None:
    running = getattr(broker, "schema_registry", None)
    if running is not None:
        await running.close()
