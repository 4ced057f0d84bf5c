"""The `_schemas` topic's records in Confluent Schema Registry's own JSON formats, so that a
topic a Confluent (or Karapace) registry wrote is read here and the other way round.

Keys: {"keytype": SCHEMA|CONFIG|MODE|DELETE_SUBJECT|CLEAR_SUBJECT|NOOP, "subject": ..., ("version"
for SCHEMA), "magic": 1 for SCHEMA, 0 for the others}. Values: a schema version {"subject",
"version", "id", "schemaType" (absent for AVRO), "references", "schema", "deleted"}, a config
{"compatibilityLevel"}, a mode {"mode"}, a subject's soft deletion {"subject", "version": the
last version deleted}, a subject's clearing {"subject"}. A null value is a tombstone: a hard
deleted version, a config or mode removed.

One record is Strom's own: key {"keytype": "NOOP", "magic": 1} carrying {"maxId": n}, the
highest id ever given, written before a hard delete so that compaction cannot take the last
record of the highest id away and let it be given again. Confluent and Karapace ignore NOOP
records (their own NOOP has magic 0 and a null value, a different key for compaction).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from strom.schemas.parsed import AVRO, Reference

SCHEMA, CONFIG, MODE, NOOP = "SCHEMA", "CONFIG", "MODE", "NOOP"
DELETE_SUBJECT, CLEAR_SUBJECT = "DELETE_SUBJECT", "CLEAR_SUBJECT"
MAX_KEY_BYTES = 1 << 16


class RecordError(ValueError):
    """A record of the topic that is not one of the formats above."""


@dataclass(frozen=True)
class SchemaRecord:
    subject: str
    version: int
    id: int
    schema_type: str
    schema: str
    references: tuple[Reference, ...] = ()
    deleted: bool = False


@dataclass(frozen=True)
class SchemaTombstone:
    subject: str
    version: int


@dataclass(frozen=True)
class ConfigRecord:
    subject: str | None  # None: the global config
    compatibility: str | None  # None: removed (tombstone)


@dataclass(frozen=True)
class ModeRecord:
    subject: str | None
    mode: str | None


@dataclass(frozen=True)
class DeleteSubject:
    subject: str
    version: int


@dataclass(frozen=True)
class ClearSubject:
    subject: str


@dataclass(frozen=True)
class MaxId:
    max_id: int


@dataclass(frozen=True)
class Noop:
    pass


Record = SchemaRecord | SchemaTombstone | ConfigRecord | ModeRecord | DeleteSubject | ClearSubject | MaxId | Noop


def _dump(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def encode(record: Record) -> tuple[bytes, bytes | None]:
    """The record's key and value bytes (value None: a tombstone)."""
    if isinstance(record, SchemaRecord):
        key = {"keytype": SCHEMA, "subject": record.subject, "version": record.version, "magic": 1}
        value = {"subject": record.subject, "version": record.version, "id": record.id}
        if record.schema_type != AVRO:
            value["schemaType"] = record.schema_type
        if record.references:
            value["references"] = [{"name": r.name, "subject": r.subject, "version": r.version}
                                   for r in record.references]
        value["schema"] = record.schema
        value["deleted"] = record.deleted
        return _dump(key), _dump(value)
    if isinstance(record, SchemaTombstone):
        return _dump({"keytype": SCHEMA, "subject": record.subject, "version": record.version, "magic": 1}), None
    if isinstance(record, ConfigRecord):
        value = None if record.compatibility is None else _dump({"compatibilityLevel": record.compatibility})
        return _dump({"keytype": CONFIG, "subject": record.subject, "magic": 0}), value
    if isinstance(record, ModeRecord):
        value = None if record.mode is None else _dump({"mode": record.mode})
        return _dump({"keytype": MODE, "subject": record.subject, "magic": 0}), value
    if isinstance(record, DeleteSubject):
        return (_dump({"keytype": DELETE_SUBJECT, "subject": record.subject, "magic": 0}),
                _dump({"subject": record.subject, "version": record.version}))
    if isinstance(record, ClearSubject):
        return (_dump({"keytype": CLEAR_SUBJECT, "subject": record.subject, "magic": 0}),
                _dump({"subject": record.subject}))
    if isinstance(record, MaxId):
        return _dump({"keytype": NOOP, "magic": 1}), _dump({"maxId": record.max_id})
    if isinstance(record, Noop):
        return _dump({"keytype": NOOP, "magic": 0}), None
    raise TypeError(f"not a _schemas record: {type(record).__name__}")


def _load(data: bytes, what: str) -> dict:
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise RecordError(f"{what} is not JSON: {e}") from None
    except RecursionError:
        raise RecordError(f"{what} nests too deeply") from None
    if not isinstance(obj, dict):
        raise RecordError(f"{what} is not a JSON object")
    return obj


def _int(obj: dict, name: str) -> int:
    value = obj.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise RecordError(f"{name} is not an integer: {value!r}")
    return value


def _str(obj: dict, name: str, optional: bool = False) -> str | None:
    value = obj.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise RecordError(f"{name} is not a string: {value!r}")
    return value


def _references(value: dict) -> tuple[Reference, ...]:
    refs = value.get("references") or []
    if not isinstance(refs, list):
        raise RecordError("references is not a list")
    out = []
    for ref in refs:
        if not isinstance(ref, dict):
            raise RecordError("a reference is not an object")
        out.append(Reference(_str(ref, "name"), _str(ref, "subject"), _int(ref, "version")))
    return tuple(out)


def decode(key: bytes | None, value: bytes | None) -> Record:
    """The record of a key and value as the topic holds them; RecordError if unreadable."""
    if key is None:
        raise RecordError("a record without a key")
    if len(key) > MAX_KEY_BYTES:
        raise RecordError("a key over 64 KiB")
    k = _load(key, "the key")
    keytype = k.get("keytype")
    if keytype == SCHEMA:
        subject, version = _str(k, "subject"), _int(k, "version")
        if value is None:
            return SchemaTombstone(subject, version)
        v = _load(value, "the value")
        return SchemaRecord(subject=_str(v, "subject"), version=_int(v, "version"), id=_int(v, "id"),
                            schema_type=(_str(v, "schemaType", True) or AVRO).upper(), schema=_str(v, "schema"),
                            references=_references(v), deleted=bool(v.get("deleted", False)))
    if keytype == CONFIG:
        subject = _str(k, "subject", True)
        if value is None:
            return ConfigRecord(subject, None)
        v = _load(value, "the value")
        return ConfigRecord(subject, _str(v, "compatibilityLevel", True) or _str(v, "compatibility", True))
    if keytype == MODE:
        subject = _str(k, "subject", True)
        return ModeRecord(subject, None if value is None else _str(_load(value, "the value"), "mode"))
    if keytype == DELETE_SUBJECT:
        if value is None:
            return Noop()
        v = _load(value, "the value")
        return DeleteSubject(_str(v, "subject"), _int(v, "version"))
    if keytype == CLEAR_SUBJECT:
        if value is None:
            return Noop()
        return ClearSubject(_str(_load(value, "the value"), "subject"))
    if keytype == NOOP:
        if value is not None and k.get("magic") == 1:
            return MaxId(_int(_load(value, "the value"), "maxId"))
        return Noop()
    raise RecordError(f"unknown keytype {keytype!r}")
