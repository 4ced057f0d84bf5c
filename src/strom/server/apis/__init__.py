"""KafkaApis: one handler per API, registered with the versions Strom implements.

A handler gets the broker, the request context and the decoded body, and returns the
response as plain dicts (encoded by `strom.protocol.messages`), a `RawResponse` already laid
out as buffers and file regions (Fetch), or None when Kafka sends no response (acks=0).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from strom.network.request import RequestContext
from strom.protocol.errors import ErrorCode

Handler = Callable[[Any, RequestContext, Any], Awaitable[Any]]


def by_topic(entries: Mapping[tuple[str, int], Any], key: str = "partitions",
             name: str = "name") -> list[dict]:
    """Per-partition response entries grouped into the topic array most responses have:
    [{name: topic, key: [entry, ...]}], topics and partitions in the order given."""
    topics: dict[str, list[Any]] = {}
    for (topic, _), entry in entries.items():
        topics.setdefault(topic, []).append(entry)
    return [{name: topic, key: items} for topic, items in topics.items()]


@dataclass(frozen=True, slots=True)
class Api:
    key: int
    min_version: int
    max_version: int
    handler: Handler


HANDLERS: dict[int, Api] = {}


def api(key: int, min_version: int, max_version: int) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        HANDLERS[key] = Api(key, min_version, max_version, handler)
        return handler

    return register


def supports(api_key: int, version: int) -> bool:
    entry = HANDLERS.get(api_key)
    return entry is not None and entry.min_version <= version <= entry.max_version


PRODUCE = 0
TELEMETRY_APIS = (71, 72)  # GetTelemetrySubscriptions, PushTelemetry
KRAFT_ONLY_APIS = (64,)  # UnregisterBroker: forwarded to a quorum controller


def served(broker, api_key: int) -> bool:
    """Whether this broker serves an API it has a handler for: the KRaft-only ones on KRaft
    brokers (those that forward admin requests to a controller)."""
    return api_key not in KRAFT_ONLY_APIS or getattr(broker, "forwards_admin", False)


def supported_versions(broker) -> list[dict]:
    """What ApiVersions advertises (see api_versions.py for Produce's and telemetry's rules)."""
    telemetry = broker.metrics_server is not None
    return [
        {"api_key": a.key, "min_version": 0 if a.key == PRODUCE else a.min_version, "max_version": a.max_version}
        for a in sorted(HANDLERS.values(), key=lambda a: a.key)
        if (telemetry or a.key not in TELEMETRY_APIS) and served(broker, a.key)
    ]


class KafkaApis:
    """The socket server's RequestHandler: each request goes to the handler registered for its
    api key, with the broker."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker

    def supports(self, api_key: int, version: int) -> bool:
        return supports(api_key, version) and served(self.broker, api_key)

    def handle(self, ctx: RequestContext, body: Any) -> Awaitable[Any]:
        """The handler's awaitable itself: a coroutine around it would cost every request one
        more frame (subclasses that add work may be coroutines)."""
        return HANDLERS[ctx.header.api_key].handler(self.broker, ctx, body)

    def unsupported_version_response(self) -> dict:
        """What Kafka answers, at v0, to an ApiVersions request of a version it does not know."""
        return {"error_code": ErrorCode.UNSUPPORTED_VERSION, "api_keys": supported_versions(self.broker)}


def load_all() -> None:
    """Import every handler module of this package, so that each registers its APIs."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
