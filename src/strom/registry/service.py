"""SchemaRegistry: what the REST API does, over the store every broker keeps and the one
writer of the cluster (the leader of `_schemas` partition 0).

A write (register, delete, config, mode) on the writer: under one lock, first a NOOP record is
written acks=all and read back, so that the store holds every record acknowledged before it
(also those of a previous writer, after a failover); then ids and versions are decided from the
store, the records written acks=all, and the answer given once the store has applied them.
A write at another broker raises NotWriter: the API forwards it to the writer.

Parsing and compatibility checks, whose work grows with a schema's size, run in the default
executor: the broker's event loop only multiplexes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from strom.registry import errors as err
from strom.registry import records as rec
from strom.registry.errors import RegistryError
from strom.registry.store import SchemaStore, StoredSchema, Version
from strom.registry.topic import SchemasTopic, TopicError
from strom.schemas.parsed import (
    AVRO,
    MAX_DEPTH,
    MAX_REFERENCES,
    PROTOBUF,
    SCHEMA_TYPES,
    Compatibility,
    ParsedSchema,
    Reference,
    ResolvedReference,
    SchemaError,
    compatibility_errors,
    parse,
)

log = logging.getLogger(__name__)

READWRITE, READONLY, IMPORT, READONLY_OVERRIDE = "READWRITE", "READONLY", "IMPORT", "READONLY_OVERRIDE"
MODES = (READWRITE, READONLY, IMPORT, READONLY_OVERRIDE)
MAX_VERSION = 2**31 - 1
_PARSED_CACHE = 1024
_READY_TIMEOUT_S = 30.0
_UNKNOWN_ID_WAIT_S = 0.5  # an id registered through another broker a moment ago: read soon


class NotWriter(Exception):
    """This broker is not the writer: the leader of `_schemas` partition 0 is `writer` (-1: none)."""

    def __init__(self, writer: int) -> None:
        super().__init__(f"the writer is broker {writer}")
        self.writer = writer


@dataclass(frozen=True)
class RegistryConfig:
    topic: str = "_schemas"
    replication_factor: int = 3
    compatibility: str = "BACKWARD"
    mode_mutability: bool = True
    timeout_s: float = 30.0


@dataclass(frozen=True)
class SchemaRequest:
    """A POST body naming a schema (register, lookup, compatibility test)."""

    schema_type: str
    schema: str
    references: tuple[Reference, ...]
    id: int | None = None
    version: int | None = None

    @classmethod
    def of(cls, body: Any) -> SchemaRequest:
        if not isinstance(body, dict):
            raise RegistryError(err.UNPROCESSABLE, "The request body must be a JSON object")
        schema = body.get("schema")
        if not isinstance(schema, str) or not schema.strip():
            raise err.invalid_schema("'schema' must be a non-empty string")
        schema_type = body.get("schemaType") or AVRO
        if not isinstance(schema_type, str) or schema_type.upper() not in SCHEMA_TYPES:
            raise RegistryError(err.UNPROCESSABLE, f"Unknown schema type {schema_type!r}; "
                                f"one of {', '.join(SCHEMA_TYPES)}")
        refs = body.get("references") or []
        if not isinstance(refs, list) or len(refs) > MAX_REFERENCES:
            raise err.invalid_schema(f"'references' must be a list of at most {MAX_REFERENCES}")
        references = []
        for ref in refs:
            if not (isinstance(ref, dict) and isinstance(ref.get("name"), str) and isinstance(ref.get("subject"), str)
                    and _is_int(ref.get("version"))):
                raise err.invalid_schema("a reference needs a string 'name' and 'subject' and an integer 'version'")
            references.append(Reference(ref["name"], ref["subject"], ref["version"]))
        schema_id, version = body.get("id"), body.get("version")
        for name, value in (("id", schema_id), ("version", version)):
            if value is not None and not (_is_int(value) and value >= -1):
                raise RegistryError(err.UNPROCESSABLE, f"'{name}' must be an integer")
        return cls(schema_type.upper(), schema, tuple(references),
                   None if schema_id in (None, -1, 0) else schema_id, None if version in (None, -1, 0) else version)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def version_json(store: SchemaStore, v: Version) -> dict:
    schema = store.schemas[v.id]
    out: dict[str, Any] = {"subject": v.subject, "version": v.version, "id": v.id}
    out.update(schema_json(schema))
    return out


def schema_json(schema: StoredSchema) -> dict:
    out: dict[str, Any] = {}
    if schema.schema_type != AVRO:
        out["schemaType"] = schema.schema_type
    if schema.references:
        out["references"] = [{"name": r.name, "subject": r.subject, "version": r.version} for r in schema.references]
    out["schema"] = schema.schema
    return out


class SchemaRegistry:
    def __init__(self, broker: Any, config: RegistryConfig) -> None:
        self.broker = broker
        self.config = config
        self.store = SchemaStore()
        self.topic = SchemasTopic(broker, config.topic, config.replication_factor, self.store.apply_bytes,
                                  self._reset)
        self._write_lock = asyncio.Lock()
        self._parsed: OrderedDict[int, ParsedSchema] = OrderedDict()

    def start(self) -> None:
        self.topic.start()

    async def close(self) -> None:
        await self.topic.close()

    def _reset(self) -> None:
        self.store = SchemaStore()
        self.topic._apply = self.store.apply_bytes
        self._parsed.clear()

    # --- who writes --------------------------------------------------------------------------
    @property
    def writer(self) -> int:
        return self.topic.leader()

    @property
    def is_writer(self) -> bool:
        """This broker leads `_schemas` (or the topic does not exist yet: whoever is asked to
        write first makes it, and then forwards if another broker leads it)."""
        return not self.topic.exists or self.writer == self.broker.broker_id

    async def wait_ready(self) -> None:
        if not await self.topic.wait(lambda: self.topic.ready, _READY_TIMEOUT_S):
            raise RegistryError(err.OPERATION_TIMEOUT, f"{self.config.topic} was not read within "
                                f"{_READY_TIMEOUT_S:g} s")

    async def _begin_write(self) -> None:
        """Called under the write lock: the topic made, this broker its writer, and the store
        holding every record acknowledged before now."""
        if not self.topic.exists:
            try:
                await self.topic.ensure_topic(asyncio.get_running_loop().time() + self.config.timeout_s)
            except TopicError as e:
                raise RegistryError(err.STORE_ERROR, str(e)) from None
        if self.writer != self.broker.broker_id:
            raise NotWriter(self.writer)
        await self._write([rec.Noop()])
        if self.writer != self.broker.broker_id:
            raise NotWriter(self.writer)

    async def _write(self, records: Sequence[rec.Record]) -> None:
        try:
            last = await self.topic.produce([rec.encode(r) for r in records], self.config.timeout_s)
        except TopicError as e:
            raise RegistryError(err.STORE_ERROR, f"Error while writing to the store: {e}") from None
        if not await self.topic.wait(lambda: self.topic.next_offset > last, self.config.timeout_s):
            raise RegistryError(err.OPERATION_TIMEOUT, f"the write at offset {last} of {self.config.topic} "
                                "was not read back in time")

    # --- levels and modes --------------------------------------------------------------------
    def compatibility_of(self, subject: str | None) -> Compatibility:
        level = self.store.configs.get(subject) if subject is not None else None
        level = level or self.store.configs.get(None) or self.config.compatibility
        try:
            return Compatibility(level.upper())
        except ValueError:
            return Compatibility.BACKWARD

    def mode_of(self, subject: str | None) -> str:
        mode = self.store.modes.get(subject) if subject is not None else None
        return mode or self.store.modes.get(None) or READWRITE

    def _check_writable(self, subject: str | None) -> str:
        mode = self.mode_of(subject)
        if mode in (READONLY, READONLY_OVERRIDE):
            raise err.not_permitted(f"Subject {subject} is in read-only mode" if subject else
                                    "The registry is in read-only mode")
        return mode

    # --- references and parsing --------------------------------------------------------------
    def resolve(self, refs: Sequence[Reference]) -> tuple[tuple[Reference, ...], tuple[ResolvedReference, ...]]:
        """The references with `latest` (-1) replaced by the version it is now, and each resolved
        to its schema text, recursively; 42201 for a missing one, a cycle, nesting deeper than
        MAX_DEPTH or more than MAX_REFERENCES schemas in all."""
        budget = [MAX_REFERENCES]
        fixed = []
        for ref in refs:
            v = self._reference_version(ref)
            fixed.append(Reference(ref.name, ref.subject, v.version))
        return tuple(fixed), self._resolve(tuple(fixed), 0, frozenset(), budget)

    def _reference_version(self, ref: Reference) -> Version:
        if ref.version == -1:
            live = self.store.versions(ref.subject)
            v = live[-1] if live else None
        else:
            v = self.store.version(ref.subject, ref.version)
        if v is None:
            raise err.invalid_schema(f"No schema reference found for subject \"{ref.subject}\" and version "
                                     f"{ref.version} (reference {ref.name!r})")
        return v

    def _resolve(self, refs: tuple[Reference, ...], depth: int, path: frozenset, budget: list[int]) -> tuple[ResolvedReference, ...]:
        if refs and depth >= MAX_DEPTH:
            raise err.invalid_schema(f"references nest deeper than {MAX_DEPTH}")
        out = []
        for ref in refs:
            budget[0] -= 1
            if budget[0] < 0:
                raise err.invalid_schema(f"more than {MAX_REFERENCES} referenced schemas in all")
            v = self._reference_version(ref)
            key = (v.subject, v.version)
            if key in path:
                raise err.invalid_schema(f"references form a cycle through {v.subject} version {v.version}")
            content = self.store.schemas[v.id]
            out.append(ResolvedReference(ref.name, content.schema,
                                         self._resolve(content.references, depth + 1, path | {key}, budget)))
        return tuple(out)

    async def _off_loop(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    @staticmethod
    def _parse(schema_type: str, text: str, resolved: tuple[ResolvedReference, ...], normalize: bool) -> tuple[ParsedSchema, str]:
        try:
            parsed = parse(schema_type, text, resolved)
            canonical = parsed.normalized().canonical if normalize else parsed.canonical
        except SchemaError as e:
            raise err.invalid_schema(str(e) or type(e).__name__) from None
        except RecursionError:
            raise err.invalid_schema("the schema nests too deeply") from None
        except ImportError as e:  # a schema type whose library this installation lacks
            raise err.invalid_schema(f"{schema_type} schemas cannot be read here: {e}") from None
        return parsed, canonical

    async def parse_request(self, req: SchemaRequest, normalize: bool) -> tuple[ParsedSchema, StoredSchema]:
        refs, resolved = self.resolve(req.references)
        parsed, canonical = await self._off_loop(self._parse, req.schema_type, req.schema, resolved, normalize)
        return parsed, StoredSchema(req.schema_type, canonical, refs)

    def _stored_inputs(self, versions: Sequence[Version]) -> list[tuple[int, StoredSchema, tuple]]:
        """What parsing these versions' schemas takes, gathered on the loop (the store is read there)."""
        out = []
        for v in versions:
            content = self.store.schemas[v.id]
            resolved = () if v.id in self._parsed else self._resolve(content.references, 0, frozenset(), [MAX_REFERENCES])
            out.append((v.id, content, resolved))
        return out

    def _parsed_of(self, inputs: list[tuple[int, StoredSchema, tuple]]) -> list[ParsedSchema]:
        out = []
        for schema_id, content, resolved in inputs:
            parsed = self._parsed.get(schema_id)
            if parsed is None:
                try:
                    parsed = parse(content.schema_type, content.schema, resolved)
                except (SchemaError, RecursionError) as e:
                    raise RegistryError(err.INVALID_SCHEMA, f"the stored schema {schema_id} does not parse: {e}") from None
                self._parsed[schema_id] = parsed
                while len(self._parsed) > _PARSED_CACHE:
                    self._parsed.popitem(last=False)
            out.append(parsed)
        return out

    async def _compatibility(self, level: Compatibility, new: ParsedSchema, previous: Sequence[Version]) -> list[str]:
        if level is Compatibility.NONE or not previous:
            return []
        inputs = self._stored_inputs(previous)

        def check() -> list[str]:
            try:
                return compatibility_errors(level, new, self._parsed_of(inputs))
            except RecursionError:
                return ["the schemas nest too deeply to compare"]
        return await self._off_loop(check)

    async def record_name(self, schema_id: int) -> str | None:
        """The record name of the schema an id stands for (the record name subject strategies
        of produce validation); None for an unknown id or a schema without one."""
        if self.store.schema_by_id(schema_id) is None:
            return None
        parsed = self._parsed.get(schema_id)
        if parsed is None:
            inputs = self._stored_inputs([Version("", 0, schema_id)])
            try:
                [parsed] = await self._off_loop(self._parsed_of, inputs)
            except RegistryError:
                return None
        return parsed.record_name

    async def parsed_schemas(self, ids: Iterable[int]) -> dict[int, ParsedSchema | str]:
        """The parsed schemas of these ids, for readers of records beside the broker (Iceberg
        topics): an id this broker has not read yet is waited for briefly; an unknown id, or a
        stored schema that does not parse, gives the reason as text."""
        await self.wait_ready()
        ids = list(ids)
        if any(self.store.schema_by_id(i) is None for i in ids):  # one wait for all of them
            await self.topic.wait(lambda: all(self.store.schema_by_id(i) is not None for i in ids), _UNKNOWN_ID_WAIT_S)
        out: dict[int, ParsedSchema | str] = {}
        for schema_id in ids:
            if self.store.schema_by_id(schema_id) is None:
                out[schema_id] = f"schema id {schema_id} is not registered"
                continue
            try:
                [out[schema_id]] = await self._off_loop(self._parsed_of, self._stored_inputs([Version("", 0, schema_id)]))
            except RegistryError as e:
                out[schema_id] = str(e)
        return out

    async def latest_schema(self, subject: str) -> tuple[int, ParsedSchema, frozenset[int]] | None:
        """The subject's latest live version's schema id and schema, and the ids of all its live
        versions; None while it has none."""
        await self.wait_ready()
        live = self.store.versions(subject)
        if not live:
            return None
        latest = live[-1].id
        [parsed] = await self._off_loop(self._parsed_of, self._stored_inputs([live[-1]]))
        return latest, parsed, frozenset(v.id for v in live)

    # --- writes ------------------------------------------------------------------------------
    async def register(self, subject: str, body: Any, normalize: bool) -> dict:
        req = SchemaRequest.of(body)
        _check_subject(subject)
        if req.id is None and req.version is None and self.mode_of(subject) in (READWRITE, IMPORT):
            # Serializers register the schema they write with at every start: one already in the
            # subject is answered from this broker's store, without a write (or a forward).
            _, content = await self.parse_request(req, normalize)
            for v in reversed(self.store.versions(subject)):
                if self.store.schemas[v.id] == content:
                    return {"id": v.id}
        async with self._write_lock:
            await self._begin_write()
            mode = self._check_writable(subject)
            if (req.id is not None or req.version is not None) and mode != IMPORT:
                raise err.not_permitted(f"Subject {subject} is not in import mode; an id or version "
                                        "may be given only in IMPORT mode")
            parsed, content = await self.parse_request(req, normalize)
            every = self.store.versions(subject, deleted=True)
            live = [v for v in every if not v.deleted]
            for v in reversed(live):
                if self.store.schemas[v.id] == content and (req.id is None or req.id == v.id):
                    return {"id": v.id}
            if mode != IMPORT:
                problems = await self._compatibility(self.compatibility_of(subject), parsed, live)
                if problems:
                    raise RegistryError(err.INCOMPATIBLE_SCHEMA, "Schema being registered is incompatible with "
                                        f"an earlier schema for subject \"{subject}\", details: {problems}")
            schema_id = self._new_id(content, req.id)
            version = (every[-1].version + 1 if every else 1) if req.version is None else req.version
            if version > MAX_VERSION:
                raise err.invalid_version(version)
            if req.version is not None and self.store.version(subject, version) is not None:
                raise err.not_permitted(f"Subject {subject} already has a version {version}")
            await self._write([rec.SchemaRecord(subject, version, schema_id, content.schema_type, content.schema,
                                                content.references)])
            return {"id": schema_id}

    def _new_id(self, content: StoredSchema, wanted: int | None) -> int:
        existing = self.store.id_of(content)
        if wanted is None:
            return existing if existing is not None else self.store.max_id + 1
        held = self.store.schema_by_id(wanted)
        if held is not None and held != content:
            raise RegistryError(err.ID_DOES_NOT_MATCH, f"Overwrite new schema with id {wanted} is not permitted.")
        return wanted

    async def _begin_delete(self, subject: str) -> list[Version]:
        """Every version of the subject, soft-deleted ones too, once a delete may go ahead (under
        the write lock)."""
        await self._begin_write()
        self._check_writable(subject)
        every = self.store.versions(subject, deleted=True)
        if not every:
            raise err.subject_not_found(subject)
        return every

    def _check_unreferenced(self, subject: str, versions: Sequence[Version]) -> None:
        for v in versions:
            if self.store.referenced_by(subject, v.version):
                raise _reference_exists(subject, v.version)

    async def delete_version(self, subject: str, version_text: str, permanent: bool) -> int:
        async with self._write_lock:
            every = await self._begin_delete(subject)
            number = parse_version(version_text)
            if number == -1:
                candidates = every if permanent else [v for v in every if not v.deleted]
                v = candidates[-1] if candidates else None
            else:
                v = self.store.version(subject, number)
            if v is None:
                raise err.version_not_found(version_text)
            self._check_unreferenced(subject, [v])
            if permanent:
                if not v.deleted:
                    raise RegistryError(err.SCHEMA_VERSION_NOT_SOFT_DELETED, f"Subject '{subject}' Version "
                                        f"{v.version} was not deleted first before being permanently deleted")
                await self._write([rec.MaxId(self.store.max_id), rec.SchemaTombstone(subject, v.version)])
            else:
                if v.deleted:
                    raise RegistryError(err.SCHEMA_VERSION_SOFT_DELETED, f"Subject '{subject}' Version {v.version} "
                                        "was soft deleted. Set permanent=true to delete permanently")
                content = self.store.schemas[v.id]
                await self._write([rec.SchemaRecord(subject, v.version, v.id, content.schema_type, content.schema,
                                                    content.references, deleted=True)])
            return v.version

    async def delete_subject(self, subject: str, permanent: bool) -> list[int]:
        async with self._write_lock:
            every = await self._begin_delete(subject)
            live = [v for v in every if not v.deleted]
            self._check_unreferenced(subject, every if permanent else live)
            if permanent:
                if live:
                    raise RegistryError(err.SUBJECT_NOT_SOFT_DELETED, f"Subject '{subject}' was not deleted "
                                        "first before being permanently deleted")
                await self._write([rec.MaxId(self.store.max_id), *(rec.SchemaTombstone(subject, v.version) for v in every)])
                return [v.version for v in every]
            if not live:
                raise RegistryError(err.SUBJECT_SOFT_DELETED, f"Subject '{subject}' was soft deleted. "
                                    "Set permanent=true to delete permanently")
            await self._write([rec.DeleteSubject(subject, live[-1].version)])
            return [v.version for v in live]

    async def set_config(self, subject: str | None, body: Any) -> dict:
        level = body.get("compatibility", body.get("compatibilityLevel")) if isinstance(body, dict) else None
        if not isinstance(level, str) or level.upper() not in Compatibility.__members__:
            raise RegistryError(err.INVALID_COMPATIBILITY_LEVEL, "Invalid compatibility level. Valid values are "
                                "none, backward, forward, full, backward_transitive, forward_transitive, and "
                                "full_transitive")
        async with self._write_lock:
            await self._begin_write()
            self._check_writable(subject)
            await self._write([rec.ConfigRecord(subject, level.upper())])
        return {"compatibility": level.upper()}

    async def delete_config(self, subject: str | None) -> dict:
        async with self._write_lock:
            await self._begin_write()
            self._check_writable(subject)
            if subject is not None and subject not in self.store.configs and not self.store.versions(subject, True):
                raise err.subject_not_found(subject)
            old = self.compatibility_of(subject).value
            await self._write([rec.ConfigRecord(subject, None)])
        return {"compatibilityLevel": old}

    async def set_mode(self, subject: str | None, body: Any, force: bool) -> dict:
        mode = body.get("mode") if isinstance(body, dict) else None
        if not isinstance(mode, str) or mode.upper() not in MODES:
            raise RegistryError(err.INVALID_MODE, "Invalid mode. Valid values are READWRITE, READONLY, "
                                "READONLY_OVERRIDE and IMPORT")
        mode = mode.upper()
        if not self.config.mode_mutability:
            raise err.not_permitted("Mode changes are not allowed (schema.registry.mode.mutability is false)")
        async with self._write_lock:
            await self._begin_write()
            if mode == IMPORT and not force:
                taken = self.store.versions(subject, True) if subject is not None else self.store.subject_names(True)
                if taken:
                    raise err.not_permitted("Cannot import since found existing subjects")
            await self._write([rec.ModeRecord(subject, mode)])
        return {"mode": mode}

    async def delete_mode(self, subject: str | None) -> dict:
        """The subject's mode removed (its mode is the global one again); the global mode removed
        is READWRITE again."""
        async with self._write_lock:
            await self._begin_write()
            old = self.mode_of(subject)
            await self._write([rec.ModeRecord(subject, None)])
        return {"mode": old}

    # --- reads -------------------------------------------------------------------------------
    def get_version(self, subject: str, version_text: str, deleted: bool) -> Version:
        every = self.store.versions(subject, deleted=True)
        if not every:
            raise err.subject_not_found(subject)
        number = parse_version(version_text)
        if number == -1:
            candidates = every if deleted else [v for v in every if not v.deleted]
            if not candidates:
                raise err.subject_not_found(subject)
            return candidates[-1]
        v = self.store.version(subject, number)
        if v is None or v.deleted and not deleted:
            raise err.version_not_found(version_text)
        return v

    async def lookup(self, subject: str, body: Any, normalize: bool, deleted: bool) -> dict:
        req = SchemaRequest.of(body)
        versions = self.store.versions(subject, deleted=deleted)
        if not versions:
            raise err.subject_not_found(subject)
        _, content = await self.parse_request(req, normalize)
        for v in reversed(versions):
            if self.store.schemas.get(v.id) == content:
                return version_json(self.store, v)
        raise err.schema_not_found()

    async def test_compatibility(self, subject: str, version_text: str | None, body: Any, normalize: bool,
                                 verbose: bool) -> dict:
        req = SchemaRequest.of(body)
        live = self.store.versions(subject)
        if version_text is None:
            previous = live
        else:
            number = parse_version(version_text)
            if number == -1:
                previous = live[-1:]
            else:
                v = self.store.version(subject, number)
                if v is None or v.deleted:
                    if not live:
                        raise err.subject_not_found(subject)
                    raise err.version_not_found(version_text)
                previous = [v]
        parsed, _ = await self.parse_request(req, normalize)
        problems = await self._compatibility(self.compatibility_of(subject), parsed, previous)
        out: dict[str, Any] = {"is_compatible": not problems}
        if verbose:
            out["messages"] = problems
        return out

    async def schema_by_id(self, schema_id: int, fmt: str | None) -> dict:
        schema = self.store.schema_by_id(schema_id)
        if schema is None:
            raise RegistryError(err.SCHEMA_NOT_FOUND, f"Schema {schema_id} not found")
        out = schema_json(schema)
        if fmt == "serialized" and schema.schema_type == PROTOBUF:
            [parsed] = await self._off_loop(self._parsed_of, self._stored_inputs(
                [Version("", 0, schema_id)]))
            out["schema"] = parsed.serialized()
        return out


def parse_version(text: str) -> int:
    """A version path segment: 1..2^31-1, or -1 for `latest` (42202 otherwise)."""
    if text == "latest":
        return -1
    try:
        number = int(text)
    except ValueError:
        raise err.invalid_version(text) from None
    if number == -1 or 1 <= number <= MAX_VERSION:
        return number
    raise err.invalid_version(text)


def _check_subject(subject: str) -> None:
    if not subject or len(subject) > 1024 or any(ord(c) < 0x20 for c in subject):
        raise RegistryError(err.INVALID_SUBJECT, f"The specified subject '{subject[:100]}' is not a valid subject")


def _reference_exists(subject: str, version: int) -> RegistryError:
    return RegistryError(err.REFERENCE_EXISTS, "One or more references exist to the schema "
                         f"{{magic=1,keytype=SCHEMA,subject={subject},version={version}}}.")
