"""SchemaStore: the `_schemas` topic applied in memory, record by record, on every broker that
runs the registry. Reads are served from it; the writer decides ids and versions from it.

Confluent's rules as its reader applies them: a schema record whose id is already taken by a
different schema is skipped (the id stays with the first); a subject's soft deletion marks its
versions up to the one named deleted; a tombstone removes a version; a schema (its id) lives as
long as a version, deleted or not, refers to it. Nothing here does I/O or parses a schema.

`is_registered` and `schema_by_id` are the read-only interface produce-time validation uses.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from strom.registry import records as rec
from strom.schemas.parsed import Reference

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredSchema:
    """A schema's content: what one id stands for across subjects."""

    schema_type: str
    schema: str
    references: tuple[Reference, ...] = ()


@dataclass
class Version:
    subject: str
    version: int
    id: int
    deleted: bool = False


class SchemaStore:
    def __init__(self) -> None:
        self.schemas: dict[int, StoredSchema] = {}
        self._ids: dict[StoredSchema, int] = {}  # content -> its (first) id
        self.subjects: dict[str, dict[int, Version]] = {}
        self._versions_of: dict[int, set[tuple[str, int]]] = {}  # id -> (subject, version)s
        self._referrers: dict[tuple[str, int], set[int]] = {}  # (subject, version) -> ids referring to it
        self.configs: dict[str | None, str] = {}
        self.modes: dict[str | None, str] = {}
        self.max_id = 0
        self.next_offset = 0  # of the topic: every record before it is applied

    # --- applying the topic ------------------------------------------------------------------
    def apply_bytes(self, offset: int, key: bytes | None, value: bytes | None) -> None:
        try:
            record = rec.decode(key, value)
        except rec.RecordError as e:
            log.warning("_schemas offset %d: skipped, not readable: %s", offset, e)
        else:
            self.apply(record)
        self.next_offset = max(self.next_offset, offset + 1)

    def apply(self, record: rec.Record) -> None:
        if isinstance(record, rec.SchemaRecord):
            self._put_version(record)
        elif isinstance(record, rec.SchemaTombstone):
            self._remove_version(record.subject, record.version)
        elif isinstance(record, rec.ConfigRecord):
            self._set(self.configs, record.subject, record.compatibility)
        elif isinstance(record, rec.ModeRecord):
            self._set(self.modes, record.subject, record.mode)
        elif isinstance(record, rec.DeleteSubject):
            for v in self.subjects.get(record.subject, {}).values():
                if v.version <= record.version:
                    v.deleted = True
        elif isinstance(record, rec.ClearSubject):
            for v in [v for v in self.subjects.get(record.subject, {}).values() if v.deleted]:
                self._remove_version(v.subject, v.version)
        elif isinstance(record, rec.MaxId):
            self.max_id = max(self.max_id, record.max_id)

    @staticmethod
    def _set(table: dict, subject: str | None, value: str | None) -> None:
        if value is None:
            table.pop(subject, None)
        else:
            table[subject] = value.upper()

    def _put_version(self, r: rec.SchemaRecord) -> None:
        content = StoredSchema(r.schema_type, r.schema, r.references)
        held = self.schemas.get(r.id)
        if held is not None and held != content:
            log.warning("_schemas: %s version %d names id %d, which another schema has; skipped",
                        r.subject, r.version, r.id)
            return
        old = self.subjects.get(r.subject, {}).get(r.version)
        if old is not None and old.id != r.id:
            self._remove_version(r.subject, r.version)
        if held is None:
            self.schemas[r.id] = content
            self._ids.setdefault(content, r.id)
            for ref in content.references:
                self._referrers.setdefault((ref.subject, ref.version), set()).add(r.id)
        self.subjects.setdefault(r.subject, {})[r.version] = Version(r.subject, r.version, r.id, r.deleted)
        self._versions_of.setdefault(r.id, set()).add((r.subject, r.version))
        self.max_id = max(self.max_id, r.id)

    def _remove_version(self, subject: str, version: int) -> None:
        versions = self.subjects.get(subject)
        v = versions.pop(version, None) if versions is not None else None
        if v is None:
            return
        if not versions:
            del self.subjects[subject]
        holders = self._versions_of.get(v.id, set())
        holders.discard((subject, version))
        if not holders:  # the last version of this schema: the id goes (max_id keeps it taken)
            self._versions_of.pop(v.id, None)
            content = self.schemas.pop(v.id)
            if self._ids.get(content) == v.id:
                del self._ids[content]
            for ref in content.references:
                referrers = self._referrers.get((ref.subject, ref.version))
                if referrers is not None:
                    referrers.discard(v.id)
                    if not referrers:
                        del self._referrers[(ref.subject, ref.version)]

    # --- reads -------------------------------------------------------------------------------
    def is_registered(self, subject: str, schema_id: int) -> bool:
        """Whether `schema_id` is a version of `subject` that is not deleted."""
        return any(s == subject and not self.subjects[s][v].deleted
                   for s, v in self._versions_of.get(schema_id, ()))

    def schema_by_id(self, schema_id: int) -> StoredSchema | None:
        """The schema of an id (also when its versions are soft-deleted: data written with it
        must stay readable), None when no version has it."""
        return self.schemas.get(schema_id)

    def id_of(self, content: StoredSchema) -> int | None:
        return self._ids.get(content)

    def versions(self, subject: str, deleted: bool = False) -> list[Version]:
        """The subject's versions, oldest first; soft-deleted ones only when `deleted`."""
        found = self.subjects.get(subject, {})
        return [found[n] for n in sorted(found) if deleted or not found[n].deleted]

    def version(self, subject: str, number: int) -> Version | None:
        return self.subjects.get(subject, {}).get(number)

    def subject_names(self, deleted: bool = False) -> list[str]:
        return sorted(s for s, found in self.subjects.items() if deleted or any(not v.deleted for v in found.values()))

    def versions_of_id(self, schema_id: int, deleted: bool = False) -> list[Version]:
        found = (self.subjects[s][v] for s, v in self._versions_of.get(schema_id, ()))
        return sorted((v for v in found if deleted or not v.deleted), key=lambda v: (v.subject, v.version))

    def referenced_by(self, subject: str, version: int) -> list[int]:
        """The ids of schemas with a live version that reference this subject version."""
        return sorted(i for i in self._referrers.get((subject, version), ())
                      if any(not v.deleted for v in self.versions_of_id(i, deleted=True)))
