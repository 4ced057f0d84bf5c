"""Typed `key` / `value` columns: registry-framed records decoded into Spark structs.

Planning (driver): the reader schema of each typed column is its subject's chosen version,
and the column's Spark type is that schema's. Reading (tasks): each record's framing names
its writer schema; the payload is decoded with it and resolved to the reader's shape, and a
batch's values become one Arrow array (one conversion per batch). Schemas are fetched once
per id and process (registry.py). Writing: typed_sink.py."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from pyspark.sql.types import DataType, StructField, StructType

from strom.schemas import NotFramed, schema_id_of
from strom.schemas.parsed import SchemaError
from strom.spark import registry
from strom.spark.formats import ColumnFormat
from strom.spark.registry import FetchedSchema, RegistryError

if TYPE_CHECKING:
    import pyarrow as pa


class StromDecodeError(RuntimeError):
    """A record of a typed column that cannot be decoded (and mode is not PERMISSIVE)."""


@dataclass(frozen=True)
class ColumnPlan:
    """A typed column as planned: its format, the reader schema's id and version, its type."""

    format: ColumnFormat
    reader_id: int
    version: int
    data_type: DataType


# -- planning ----------------------------------------------------------------------------------

def plan(formats: tuple[ColumnFormat, ...], seen: StructType | None = None) -> tuple[ColumnPlan, ...]:
    """The reader schemas of typed columns. `seen`: the schema Spark planned the query with
    (load() time); when a subject's latest version has changed since, the newest version
    with the planned type is the reader, so the query's columns stay what they were."""
    out = []
    for f in formats:
        try:
            version, fetched = registry.by_version(f.registry, f.subject, f.version)
            column = reader_column(f, fetched)
            if seen is not None and f.version is None and not _same(column.data_type, seen[f.column].dataType):
                version, fetched, column = _planned_version(f, seen[f.column].dataType)
        except (RegistryError, SchemaError) as e:
            raise RegistryError(f"{f.column}Format={f.kind}: {e}") from None
        out.append(ColumnPlan(f, fetched.schema_id, version, column.data_type))
    return tuple(out)


def _planned_version(f: ColumnFormat, wanted: DataType) -> tuple[int, FetchedSchema, object]:
    for version in sorted(registry.versions(f.registry, f.subject), reverse=True):
        v, fetched = registry.by_version(f.registry, f.subject, version)
        column = reader_column(f, fetched)
        if _same(column.data_type, wanted):
            return v, fetched, column
    raise RegistryError(f"subject {f.subject!r} has no version of the {f.column} type the query was planned "
                        f"with ({wanted.simpleString()}): load() the DataFrame again")


def _same(a: DataType, b: DataType) -> bool:
    """The same type, nullability aside (Spark may hand a planned schema back relaxed)."""
    return a.simpleString() == b.simpleString()


def typed_schema(base: StructType, plans: tuple[ColumnPlan, ...]) -> StructType:
    """The source's columns with each typed column's struct in place of its binary."""
    types = {p.format.column: p.data_type for p in plans}
    return StructType([StructField(f.name, types[f.name], True) if f.name in types else f for f in base.fields])


@cache
def _arrow_schema(schema_json: str) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(StructType.fromJson(json.loads(schema_json)), timezone="UTC")


_columns: dict[tuple, object] = {}


def reader_column(f: ColumnFormat, reader: FetchedSchema):
    """The decoding of a column with reader schema `reader` (AvroColumn, ProtobufColumn or
    JsonColumn), kept for the process."""
    key = (f.registry, f.kind, reader.schema_id)
    found = _columns.get(key)
    if found is None:
        if reader.schema_type != f.kind.upper():
            raise SchemaError(f"subject {f.subject!r} holds a {reader.schema_type} schema (id {reader.schema_id}), "
                              f"not {f.kind.upper()}")
        if f.kind == "avro":
            from strom.spark.typed_avro import AvroColumn as kind
        elif f.kind == "protobuf":
            from strom.spark.typed_protobuf import ProtobufColumn as kind
        else:
            from strom.spark.typed_json import JsonColumn as kind
        found = _columns[key] = kind(reader)
    return found


# -- reading -----------------------------------------------------------------------------------

def decode_batches(batches: Iterator[pa.RecordBatch], plans: tuple[ColumnPlan, ...],
                   schema: StructType) -> Iterator[pa.RecordBatch]:
    """Batches of the Kafka columns with the typed ones decoded; `schema`: the source's."""
    import pyarrow as pa

    arrow = _arrow_schema(schema.json())
    for batch in batches:
        columns = list(batch.columns)
        for p in plans:
            i = batch.schema.get_field_index(p.format.column)
            columns[i] = decode_column(p, columns[i], batch, arrow.field(i).type)
        yield pa.RecordBatch.from_arrays(columns, schema=arrow)


def decode_column(p: ColumnPlan, raw: pa.Array, batch: pa.RecordBatch, arrow_type: pa.DataType) -> pa.Array:
    import pyarrow as pa

    f = p.format
    column = reader_column(f, registry.by_id(f.registry, p.reader_id))
    decoders: dict[int, Callable[[bytes], object]] = {}
    out: list = []
    append = out.append
    for i, data in enumerate(raw.to_pylist()):
        if data is None:  # a null key, or a tombstone
            append(None)
            continue
        try:
            schema_id = schema_id_of(data)
            decode = decoders.get(schema_id)
            if decode is None:
                try:
                    decode = column.decoder(registry.by_id(f.registry, schema_id))
                except (SchemaError, RegistryError) as e:
                    decode = _failing(e)  # asked once per batch, not once per record
                decoders[schema_id] = decode
            append(decode(data[5:]))
        except (NotFramed, SchemaError, RegistryError) as e:
            if not f.permissive:
                raise _decode_error(f, batch, i, e) from None
            append(None)
    try:
        return pa.array(out, arrow_type)
    except (pa.ArrowException, TypeError, ValueError) as e:
        raise StromDecodeError(f"{f.column}Format={f.kind}: decoded values do not fit the column type "
                               f"{p.data_type.simpleString()}: {e}") from None


def _failing(error: Exception) -> Callable[[bytes], object]:
    kind, message = type(error), str(error)

    def fail(_: bytes) -> object:
        raise kind(message)  # a new one each time: a re-raised one would pile up tracebacks

    return fail


def _decode_error(f: ColumnFormat, batch: pa.RecordBatch, row: int, error: Exception) -> StromDecodeError:
    where = "{}-{} offset {}".format(*(batch.column(n)[row].as_py() for n in ("topic", "partition", "offset")))
    what = "is not framed by a schema registry serializer" if isinstance(error, NotFramed) else "cannot be decoded"
    return StromDecodeError(
        f"The {f.column} of {where} {what} ({f.column}Format={f.kind}, subject {f.subject!r}): {error}. "
        f"Set the option mode=PERMISSIVE to read such {f.column}s as null instead")
