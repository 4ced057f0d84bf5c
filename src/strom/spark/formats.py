"""The options that turn the `key` / `value` columns into typed columns: each one's format
(`keyFormat` / `valueFormat`: binary, avro, protobuf or json), the schema registry it is
framed for, the subject and version of the reader schema, and what to do with a record that
cannot be decoded (`mode`, as Spark's from_avro: FAILFAST or PERMISSIVE)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class FormatOptionError(ValueError):
    """A bad typed-column option (options.py reports it as a StromOptionError)."""

BINARY = "binary"
TYPED = ("avro", "protobuf", "json")
COLUMNS = ("key", "value")
MODES = ("failfast", "permissive")


@dataclass(frozen=True)
class Registry:
    """Where schemas are fetched and registered (a Confluent-compatible registry, such as the
    broker's own on schema.registry.listeners)."""

    url: str
    user_info: str | None = None  # "user:password" for HTTP basic auth

    def client_conf(self) -> dict[str, Any]:
        conf: dict[str, Any] = {"url": self.url}
        if self.user_info:
            conf.update({"basic.auth.credentials.source": "USER_INFO", "basic.auth.user.info": self.user_info})
        return conf


@dataclass(frozen=True)
class ColumnFormat:
    """How one of `key` / `value` is framed and typed."""

    column: str  # "key" or "value"
    kind: str  # "avro", "protobuf" or "json"
    subject: str
    version: int | None  # the reader schema's version; None: the subject's latest
    registry: Registry
    permissive: bool = False  # a record that cannot be decoded becomes null instead of failing


def column_formats(options: Mapping[str, str], topics: tuple[str, ...], role: str) -> tuple[ColumnFormat, ...]:
    """The typed columns the options ask for (none: both stay binary). `topics`: the one
    topic a subject defaults from (TopicNameStrategy), or several / none when no default
    exists (a pattern, several topics, a sink writing a `topic` column)."""
    registry = None
    out = []
    for column in COLUMNS:
        kind = options.get(f"{column}format", BINARY).strip().lower()
        if kind == BINARY:
            continue
        if kind not in TYPED:
            raise FormatOptionError(f"Option '{column}Format' must be one of binary, {', '.join(TYPED)}, "
                                   f"not {options[f'{column}format']!r}")
        if registry is None:
            registry = _registry(options, column)
        subject = options.get(f"{column}subject", "").strip()
        if not subject:
            if len(topics) != 1:
                raise FormatOptionError(
                    f"{column}Format={kind} reads more than one topic (or a pattern): name the schema's "
                    f"subject with the option '{column}Subject'")
            subject = f"{topics[0]}-{column}"
        out.append(ColumnFormat(column, kind, subject, _version(options, column) if role == "source" else None,
                                registry, _permissive(options) if role == "source" else False))
    return tuple(out)


def _registry(options: Mapping[str, str], column: str) -> Registry:
    url = options.get("schema.registry.url", "").strip()
    if not url:
        raise FormatOptionError(f"Option 'schema.registry.url' must be specified with {column}Format "
                               "(the registry's address, e.g. http://127.0.0.1:8081)")
    if not url.startswith(("http://", "https://")):
        raise FormatOptionError(f"Option 'schema.registry.url' must be an http(s):// URL, not {url!r}")
    user_info = options.get("schema.registry.basic.auth.user.info")
    if user_info is not None and ":" not in user_info:
        raise FormatOptionError("Option 'schema.registry.basic.auth.user.info' must be user:password")
    return Registry(url.rstrip("/"), user_info)


def _version(options: Mapping[str, str], column: str) -> int | None:
    raw = options.get(f"{column}schemaversion", "latest").strip().lower()
    if raw in ("latest", "-1"):
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise FormatOptionError(f"Option '{column}SchemaVersion' must be 'latest' or a version number (1, 2, "
                               f"...), not {options[f'{column}schemaversion']!r}")
    return int(raw)


def _permissive(options: Mapping[str, str]) -> bool:
    mode = options.get("mode", "FAILFAST").strip().lower()
    if mode not in MODES:
        raise FormatOptionError(f"Option 'mode' must be FAILFAST or PERMISSIVE, not {options['mode']!r}")
    return mode == "permissive"
