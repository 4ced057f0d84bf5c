"""Typed `key` / `value` columns: registry-framed records decoded into Spark structs.

Planning (driver): the reader schema of each typed column is its subject's chosen version,
and the column's Spark type is that schema's. Reading (tasks): each record's framing names
its writer schema; the payload is decoded with it and resolved to the reader's shape, and a
batch's values become one Arrow array (one conversion per batch). Schemas are fetched once
per id and process (registry.py). Writing: a struct column is encoded with an Avro schema
registered under the subject (or the subject's latest, when it has the column's type), and
framed with its id."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from pyspark.sql.types import ArrayType, DataType, MapType, StructField, StructType

from strom.schemas import NotFramed, frame, schema_id_of
from strom.schemas.parsed import AVRO, SchemaError, parse
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
            if seen is not None and f.version is None and column.data_type != seen[f.column].dataType:
                version, fetched, column = _planned_version(f, seen[f.column].dataType)
        except (RegistryError, SchemaError) as e:
            raise RegistryError(f"{f.column}Format={f.kind}: {e}") from None
        out.append(ColumnPlan(f, fetched.schema_id, version, column.data_type))
    return tuple(out)


def _planned_version(f: ColumnFormat, wanted: DataType) -> tuple[int, FetchedSchema, object]:
    for version in sorted(registry.versions(f.registry, f.subject), reverse=True):
        v, fetched = registry.by_version(f.registry, f.subject, version)
        column = reader_column(f, fetched)
        if column.data_type == wanted:
            return v, fetched, column
    raise RegistryError(f"subject {f.subject!r} has no version of the {f.column} type the query was planned "
                        f"with ({wanted.simpleString()}): load() the DataFrame again")


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
                decode = decoders[schema_id] = column.decoder(registry.by_id(f.registry, schema_id))
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


def _decode_error(f: ColumnFormat, batch: pa.RecordBatch, row: int, error: Exception) -> StromDecodeError:
    where = "{}-{} offset {}".format(*(batch.column(n)[row].as_py() for n in ("topic", "partition", "offset")))
    what = "is not framed by a schema registry serializer" if isinstance(error, NotFramed) else "cannot be decoded"
    return StromDecodeError(
        f"The {f.column} of {where} {what} ({f.column}Format={f.kind}, subject {f.subject!r}): {error}. "
        f"Set the option mode=PERMISSIVE to read such {f.column}s as null instead")


# -- writing (Avro) ----------------------------------------------------------------------------

@dataclass(frozen=True)
class SinkPlan:
    """A typed column of the sink: the schema its values are encoded with, and its id."""

    format: ColumnFormat
    schema_id: int
    schema: str  # Avro schema text


def plan_sink(formats: tuple[ColumnFormat, ...], schema: StructType) -> tuple[SinkPlan, ...]:
    """Each typed column's Avro schema: the subject's latest if it has the column's type, else
    one derived from the column's Spark type, registered under the subject."""
    from strom.spark.typed_avro import avro_schema, spark_type

    out = []
    types = {f.name: f.dataType for f in schema.fields}
    for f in formats:
        data_type = types[f.column]
        chosen = None
        try:
            _, latest = registry.by_version(f.registry, f.subject, None)
            if latest.schema_type == AVRO and _same(spark_type(json.loads(parse(AVRO, latest.text,
                                                                                 latest.references).resolved)),
                                                    data_type):
                chosen = SinkPlan(f, latest.schema_id, latest.text)
        except (RegistryError, SchemaError):
            pass  # no subject yet (or one of another shape): register the column's own
        if chosen is None:
            if not isinstance(data_type, StructType):
                raise SchemaError(f"with {f.column}Format=avro the {f.column} column must be a struct, "
                                  f"not {data_type.simpleString()}")
            text = json.dumps(avro_schema(data_type))
            chosen = SinkPlan(f, registry.register(f.registry, f.subject, AVRO, text), text)
        out.append(chosen)
    return tuple(out)


def _same(a: DataType, b: DataType) -> bool:
    """The same type, nullability aside."""
    return a.simpleString() == b.simpleString()


def encode_batches(batches: Iterator[pa.RecordBatch], plans: tuple[SinkPlan, ...],
                   schema: StructType) -> Iterator[pa.RecordBatch]:
    """Batches with each typed column replaced by its framed Avro binary; `schema`: the
    written DataFrame's."""
    import pyarrow as pa

    encoders = [(p, _encoder(p, schema[p.format.column].dataType)) for p in plans]
    for batch in batches:
        for p, encode in encoders:
            i = batch.schema.get_field_index(p.format.column)
            values = [None if v is None else encode(v) for v in batch.column(i).to_pylist()]
            batch = batch.set_column(i, pa.field(p.format.column, pa.binary()), pa.array(values, pa.binary()))
        yield batch


@cache
def _parsed_avro(text: str):
    return parse(AVRO, text)


def _encoder(p: SinkPlan, data_type: DataType) -> Callable[[object], bytes]:
    schema = _parsed_avro(p.schema)
    header = frame(p.schema_id, b"")
    fit = _for_avro(data_type)

    def encode(value: object) -> bytes:
        return header + schema.encode(fit(value) if fit else value)

    return encode


def _for_avro(data_type: DataType) -> Callable[[object], object] | None:
    """What turns an Arrow value of `data_type` into what the Avro encoder takes (a map comes
    from Arrow as (key, value) pairs, Avro takes a dict); None when nothing needs turning."""
    if isinstance(data_type, MapType):
        inner = _for_avro(data_type.valueType)
        return lambda v: None if v is None else {k: (inner(x) if inner else x) for k, x in v}
    if isinstance(data_type, ArrayType):
        item = _for_avro(data_type.elementType)
        return None if item is None else (lambda v: None if v is None else [item(x) for x in v])
    if isinstance(data_type, StructType):
        fields = {f.name: c for f in data_type.fields if (c := _for_avro(f.dataType)) is not None}
        if not fields:
            return None
        return lambda v: None if v is None else {k: (fields[k](x) if k in fields else x) for k, x in v.items()}
    return None

