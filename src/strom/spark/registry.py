"""Schemas from the registry, for typed columns: through confluent-kafka's SchemaRegistryClient
(plain HTTP, no JVM), one client per registry and process. A schema id names one schema for
ever, so what an id resolves to (with its references) is kept for the life of the process:
an executor asks the registry once per writer schema, not once per record or task."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from confluent_kafka.schema_registry import (
    RegisteredSchema,
    Schema,
    SchemaRegistryClient,
    SchemaRegistryError,
)

from strom.schemas.parsed import MAX_DEPTH, MAX_REFERENCES, ResolvedReference
from strom.spark.formats import Registry


class RegistryError(RuntimeError):
    """A schema the query needs cannot be had from the registry (missing, unreachable, cyclic)."""


@dataclass(frozen=True)
class FetchedSchema:
    """A schema as the registry serves it, with its references resolved to their text."""

    schema_id: int
    schema_type: str  # AVRO, PROTOBUF or JSON
    text: str
    references: tuple[ResolvedReference, ...] = ()


_lock = threading.Lock()
_clients: dict[Registry, SchemaRegistryClient] = {}
_by_id: dict[tuple[Registry, int], FetchedSchema] = {}


def client(registry: Registry) -> SchemaRegistryClient:
    with _lock:
        if registry not in _clients:
            _clients[registry] = SchemaRegistryClient(registry.client_conf())
        return _clients[registry]


def by_id(registry: Registry, schema_id: int) -> FetchedSchema:
    """The schema of a record's framing (cached for the process)."""
    key = (registry, schema_id)
    found = _by_id.get(key)
    if found is None:
        c = client(registry)
        schema = _call(lambda: c.get_schema(schema_id), f"schema id {schema_id}", registry)
        found = _resolved(c, registry, schema_id, schema)
        _by_id[key] = found
    return found


def by_version(registry: Registry, subject: str, version: int | None) -> tuple[int, FetchedSchema]:
    """The schema of `subject` at `version` (None: the latest, asked afresh each time) and
    that version's number."""
    c = client(registry)
    what = f"subject {subject!r} version {'latest' if version is None else version}"
    registered: RegisteredSchema = _call(lambda: c.get_version(subject, "latest" if version is None else version),
                                         what, registry)
    fetched = _resolved(c, registry, registered.schema_id, registered.schema)
    _by_id.setdefault((registry, fetched.schema_id), fetched)
    return registered.version, fetched


def versions(registry: Registry, subject: str) -> list[int]:
    c = client(registry)
    return _call(lambda: c.get_versions(subject), f"the versions of subject {subject!r}", registry)


def register(registry: Registry, subject: str, schema_type: str, text: str) -> int:
    """The id of `text` under `subject`, registered unless it is there already."""
    c = client(registry)
    return _call(lambda: c.register_schema(subject, Schema(text, schema_type)),
                 f"registering a schema under subject {subject!r}", registry)


def _call(call, what: str, registry: Registry):
    try:
        return call()
    except SchemaRegistryError as e:
        raise RegistryError(f"Schema registry {registry.url}: cannot get {what}: {e.error_message} "
                            f"(HTTP {e.http_status_code}, error code {e.error_code})") from None
    except Exception as e:  # the HTTP client's own: connection refused, timeouts, bad JSON
        raise RegistryError(f"Schema registry {registry.url}: cannot get {what}: {e}") from None


def _resolved(c: SchemaRegistryClient, registry: Registry, schema_id: int, schema: Schema) -> FetchedSchema:
    """`schema` with the text of every schema it references, depth and count bounded and
    cycles refused (the registry's own bounds)."""
    count = 0

    def resolve(refs, path: tuple[tuple[str, int], ...]) -> tuple[ResolvedReference, ...]:
        nonlocal count
        out = []
        for ref in refs or ():
            key = (ref.subject, ref.version)
            if key in path:
                raise RegistryError(f"schema id {schema_id}: its references form a cycle at {ref.subject} "
                                    f"version {ref.version}")
            if len(path) >= MAX_DEPTH:
                raise RegistryError(f"schema id {schema_id}: references nested deeper than {MAX_DEPTH}")
            count += 1
            if count > MAX_REFERENCES:
                raise RegistryError(f"schema id {schema_id}: more than {MAX_REFERENCES} references")
            target: RegisteredSchema = _call(lambda r=ref: c.get_version(r.subject, r.version),
                                             f"reference {ref.name} ({ref.subject} version {ref.version})", registry)
            out.append(ResolvedReference(ref.name, target.schema.schema_str,
                                         resolve(target.schema.references, (*path, key))))
        return tuple(out)

    return FetchedSchema(schema_id, (schema.schema_type or "AVRO").upper(), schema.schema_str,
                         resolve(schema.references, ()))
