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

from strom.protocol.messages import RequestHeader


@dataclass(slots=True)
class RequestContext:
    header: RequestHeader
    listener: str
    client: str
    principal: str = "User:ANONYMOUS"  # who the connection authenticated as (TLS certificate, SASL)
    security_protocol: str = "PLAINTEXT"  # of the listener the request came on
    token_authenticated: bool = False  # SASL with a delegation token


@dataclass(slots=True)
class RawResponse:
    """A response body already encoded: bytes and regions with `fd`, `position`, `size`."""

    parts: list[Any]


class CloseConnection(Exception):
    """Raised by a handler when Kafka answers by closing the connection (e.g. a failed acks=0
    produce, which has no response to carry the error)."""


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


def load_all() -> None:
    """Import every handler module of this package, so that each registers its APIs."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
