"""The schema modes: values decoded through the schema registry into columns.

- value_schema_id_prefix: each value is framed as the registry's serializers frame it (magic
  byte 0, a 4-byte schema id) and decoded with the schema its id names; the table takes each
  writer schema's columns (`union_by_name`: new fields become columns, ints widen to longs).
- value_schema_latest: values are read with the latest schema of the subject `<topic>-value`
  (TopicNameStrategy): a value framed with the id of one of the subject's versions is resolved
  from that version to the latest (Avro schema resolution), any other value is read as a bare
  payload of the latest schema; the table takes the latest schema's columns.

A value that cannot become a row (not framed, an unknown id, a payload that does not match, a
schema with no Iceberg type, a type change the table cannot take) becomes a dead letter:
a row of the table `<topic>~dlq` with its metadata, raw value and the reason. Avro only:
Protobuf and JSON Schema values are dead letters with the reason "not supported yet".

The registry is reached through a SchemaSource of blocking callables (the broker gives them:
they run on its loop); everything here runs in the translators' executor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import BinaryType, NestedField, StringType

from strom.protocol.records import Record
from strom.schemas.avro_columns import AvroReader
from strom.schemas.parsed import SchemaError
from strom.tables.columns import ArrowTypes, metadata, metadata_field, value_columns
from strom.tables.settings import SchemaSource

ID_PREFIX, LATEST = "value_schema_id_prefix", "value_schema_latest"
DEAD_LETTER = "dead_letter"
MAX_CACHED = 256  # writer schemas kept prepared per partition


@dataclass
class Group:
    """Rows decoded with one schema: its columns, and per row (its row, its raw value)."""

    columns: pa.Schema
    rows: list[tuple[dict[str, Any], bytes | None]] = field(default_factory=list)


@dataclass
class Decoded:
    groups: dict[int, Group] = field(default_factory=dict)  # by schema id; -1: null values
    dead: list[dict[str, Any]] = field(default_factory=list)  # dead-letter rows


def dead_row(meta: dict[str, Any], value: bytes | None, reason: str) -> dict[str, Any]:
    return {"strom": meta, "value": value, "reason": reason}


class _Prepared:
    """A schema ready to decode with: its columns and a payload -> row function."""

    def __init__(self, reader: AvroReader, decode: Callable[[bytes], object]) -> None:
        kind, _ = reader.column_type(ArrowTypes())
        self.is_record = pa.types.is_struct(kind) and _is_record(reader.reader_json)
        self.columns = value_columns(kind, self.is_record)
        self.decode = decode

    def row(self, payload: bytes) -> dict[str, Any]:
        value = self.decode(payload)
        return dict(value) if self.is_record else {"value": value}  # type: ignore[call-overload]


def _is_record(schema: object) -> bool:
    if isinstance(schema, list):  # a union of a record and null
        schema = next((b for b in schema if b != "null"), None)
    return isinstance(schema, dict) and schema.get("type") in ("record", "error")


class SchemaConverter:
    """A schema mode's converter for one topic: `schema` is what a new table starts with (the
    metadata struct; value columns come with the first rows), `decode` makes a batch's rows."""

    evolves = True
    spec_prefix = "strom."  # iceberg.partition.spec's columns are the metadata struct's

    def __init__(self, mode: str, topic: str, source: SchemaSource) -> None:
        self.mode = mode
        self.subject = f"{topic}-value"
        self.source = source
        self.schema = Schema(metadata_field())
        self._prepared: dict[tuple[int, int], _Prepared | str] = {}  # (reader id, writer id)
        self._unknown: dict[tuple[int, int], _Prepared | str] = {}  # ids not registered, this batch's

    def decode(self, partition: int, records: Iterable[tuple[Record, int]]) -> Decoded:
        out = Decoded()
        records = list(records)
        latest = self.source.latest(self.subject) if self.mode == LATEST else None
        wanted = {_frame(r.value)[0] for r, _ in records if r.value is not None} - {None}
        if latest is not None:
            wanted = (wanted & latest[2]) | {latest[0]}
        self._prepare(wanted, latest)
        for record, timestamp_type in records:
            meta = metadata(partition, record, timestamp_type)
            value = record.value
            if value is None:  # a tombstone: its metadata, its value columns null
                out.groups.setdefault(-1, Group(pa.schema([]))).rows.append(({"strom": meta}, None))
                continue
            key, payload, reason = self._route(value, latest)
            prepared = (self._prepared.get(key) or self._unknown.get(key)) if key is not None else None
            if isinstance(prepared, str):
                reason = prepared
            if reason is not None or prepared is None:
                out.dead.append(dead_row(meta, value, reason or "no schema"))
                continue
            try:
                row = prepared.row(payload)
            except Exception as e:  # noqa: BLE001 - any payload the decoder refuses is a dead letter
                out.dead.append(dead_row(meta, value, str(e) or type(e).__name__))
                continue
            row["strom"] = meta
            out.groups.setdefault(key[0], Group(prepared.columns)).rows.append((row, value))
        return out

    def _route(self, value: bytes, latest: tuple[int, Any, frozenset[int]] | None
               ) -> tuple[tuple[int, int] | None, bytes, str | None]:
        """(reader id, writer id), the payload, or why the value has none."""
        writer, payload = _frame(value)
        if self.mode == ID_PREFIX:
            if writer is None:
                return None, value, "the value is not framed with a schema id (magic byte 0 and a 4-byte id)"
            return (writer, writer), payload, None
        if latest is None:
            return None, value, f"no schema is registered under the subject {self.subject}"
        if writer is not None and writer in latest[2]:
            return (latest[0], writer), payload, None
        return (latest[0], latest[0]), value, None  # a bare payload of the latest schema

    def _prepare(self, wanted: set[int], latest: tuple[int, Any, frozenset[int]] | None) -> None:
        if len(self._prepared) > MAX_CACHED:
            self._prepared.clear()
        reader_id = latest[0] if latest is not None else None
        keys = {(reader_id if reader_id is not None else w, w) for w in wanted}
        self._unknown = {}
        missing = {k for k in keys if k not in self._prepared}
        if not missing:
            return
        ids = {i for k in missing for i in k}
        found = self.source.schemas(ids)
        if latest is not None:
            found[latest[0]] = latest[1]
        for reader_key, writer_key in missing:
            prepared = self._prepared_one(found, reader_key, writer_key)
            if isinstance(found.get(reader_key), str) or isinstance(found.get(writer_key), str):
                self._unknown[reader_key, writer_key] = prepared  # this batch only: it may be registered later
            else:
                self._prepared[reader_key, writer_key] = prepared

    @staticmethod
    def _prepared_one(found: dict[int, Any], reader_id: int, writer_id: int) -> _Prepared | str:
        for schema_id in (reader_id, writer_id):
            schema = found.get(schema_id)
            if schema is None or isinstance(schema, str):
                return schema or f"schema id {schema_id} is not registered"
            if schema.schema_type != "AVRO":
                return f"{schema.schema_type} values are not supported yet"
        try:
            reader = AvroReader(found[reader_id], reader_id)
            return _Prepared(reader, reader.decoder(writer_id, lambda: found[writer_id]))
        except (SchemaError, RecursionError) as e:
            return f"schema id {reader_id}: {e or type(e).__name__}"


def _frame(value: bytes) -> tuple[int | None, bytes]:
    """(schema id, payload) of a framed value; (None, value) when it is not framed."""
    if len(value) < 5 or value[0] != 0:
        return None, value
    return int.from_bytes(value[1:5], "big"), value[5:]


class DeadLetterConverter:
    """The dead-letter table `<topic>~dlq`: the metadata struct, the raw value, the reason."""

    mode = DEAD_LETTER
    evolves = False
    spec_prefix = "strom."

    def __init__(self) -> None:
        self.schema = Schema(metadata_field(), NestedField(11, "value", BinaryType(), required=False),
                             NestedField(12, "reason", StringType(), required=True))
