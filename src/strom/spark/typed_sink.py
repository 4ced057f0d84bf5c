"""The sink's typed columns: a struct `value` (or `key`) written in the registry's framing.

The schema is the subject's latest when the column fits it; else (Avro, JSON Schema) one
derived from the column's Spark type, registered under the subject (the registry answers with
the existing id when it is there already, and applies its compatibility rules otherwise). A
Protobuf subject must hold its .proto already: a message is not derived from a struct. Each
row is encoded by the schema package and framed with the schema's id."""

from __future__ import annotations

import base64
import datetime
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from strom.schemas import frame
from strom.schemas.parsed import AVRO, JSON, PROTOBUF, ParsedSchema, SchemaError, parse
from strom.spark import registry
from strom.spark.formats import ColumnFormat
from strom.spark.registry import FetchedSchema, RegistryError

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class SinkPlan:
    """A typed column of the sink and the registered schema its values are encoded with."""

    format: ColumnFormat
    schema: FetchedSchema


def plan_sink(formats: tuple[ColumnFormat, ...], schema: StructType) -> tuple[SinkPlan, ...]:
    out = []
    for f in formats:
        data_type = schema[f.column].dataType
        if not isinstance(data_type, StructType):
            raise SchemaError(f"with {f.column}Format={f.kind} the {f.column} column must be a struct, "
                              f"not {data_type.simpleString()}")
        try:
            chosen = _latest_fitting(f, data_type) or _register(f, data_type)
        except (RegistryError, SchemaError) as e:
            raise RegistryError(f"{f.column}Format={f.kind}: {e}") from None
        out.append(SinkPlan(f, chosen))
    return tuple(out)


def _latest_fitting(f: ColumnFormat, data_type: StructType) -> FetchedSchema | None:
    try:
        _, latest = registry.by_version(f.registry, f.subject, None)
    except RegistryError:
        if f.kind == "protobuf":
            raise
        return None  # no subject yet (an unreachable registry fails the registration next)
    if latest.schema_type != f.kind.upper():
        raise SchemaError(f"subject {f.subject!r} holds {latest.schema_type} schemas, not {f.kind.upper()}")
    if f.kind == "avro":
        from strom.spark.typed_avro import spark_type

        fits = _same(spark_type(json.loads(_parsed(latest).resolved)), data_type)
    elif f.kind == "protobuf":
        message = _parsed(latest).message_descriptor([0])
        unknown = [n for n in data_type.fieldNames() if n not in message.fields_by_name]
        if unknown:
            raise SchemaError(f"the {f.column} column has fields {unknown} that {message.full_name} (subject "
                              f"{f.subject!r}, its latest version) does not")
        fits = True
    else:
        properties = json.loads(latest.text).get("properties")
        fits = isinstance(properties, dict) and set(data_type.fieldNames()) <= set(properties)
    return latest if fits else None


def _register(f: ColumnFormat, data_type: StructType) -> FetchedSchema:
    if f.kind == "avro":
        from strom.spark.typed_avro import avro_schema

        text, kind = json.dumps(avro_schema(data_type)), AVRO
    else:
        text, kind = json.dumps(json_schema(data_type)), JSON
    return FetchedSchema(registry.register(f.registry, f.subject, kind, text), kind, text)


def _same(a: DataType, b: DataType) -> bool:
    """The same type, nullability aside."""
    return a.simpleString() == b.simpleString()


@cache
def _parsed(fetched: FetchedSchema) -> ParsedSchema:
    return parse(fetched.schema_type, fetched.text, fetched.references)


# -- Spark -> JSON Schema ----------------------------------------------------------------------

def json_schema(data_type: DataType) -> dict:
    """A JSON Schema (draft-07) for values of a Spark type: structs as objects with their
    non-nullable fields required, nullable ones as a oneOf with null."""
    if isinstance(data_type, StructType):
        properties = {f.name: _nullable(json_schema(f.dataType), f.nullable) for f in data_type.fields}
        out: dict = {"type": "object", "properties": properties}
        required = [f.name for f in data_type.fields if not f.nullable]
        if required:
            out["required"] = required
        return out
    if isinstance(data_type, ArrayType):
        return {"type": "array", "items": _nullable(json_schema(data_type.elementType), data_type.containsNull)}
    if isinstance(data_type, MapType):
        if not isinstance(data_type.keyType, StringType):
            raise SchemaError(f"a JSON object has string keys, not {data_type.keyType.simpleString()}")
        return {"type": "object",
                "additionalProperties": _nullable(json_schema(data_type.valueType), data_type.valueContainsNull)}
    if isinstance(data_type, (ByteType, ShortType, IntegerType, LongType)):
        return {"type": "integer"}
    if isinstance(data_type, (FloatType, DoubleType, DecimalType)):
        return {"type": "number"}
    if isinstance(data_type, BooleanType):
        return {"type": "boolean"}
    if isinstance(data_type, StringType):
        return {"type": "string"}
    if isinstance(data_type, BinaryType):
        return {"type": "string", "contentEncoding": "base64"}
    if isinstance(data_type, DateType):
        return {"type": "string", "format": "date"}
    if isinstance(data_type, (TimestampType, TimestampNTZType)):
        return {"type": "string", "format": "date-time"}
    raise SchemaError(f"the Spark type {data_type.simpleString()} has no JSON Schema type")


def _nullable(schema: dict, nullable: bool) -> dict:
    return {"oneOf": [{"type": "null"}, schema]} if nullable else schema


# -- encoding ----------------------------------------------------------------------------------

def encode_batches(batches: Iterator[pa.RecordBatch], plans: tuple[SinkPlan, ...],
                   schema: StructType) -> Iterator[pa.RecordBatch]:
    """Batches with each typed column replaced by its framed binary; `schema`: the written
    DataFrame's."""
    import pyarrow as pa

    encoders = [(p, _encoder(p, schema[p.format.column].dataType)) for p in plans]
    for batch in batches:
        for p, encode in encoders:
            i = batch.schema.get_field_index(p.format.column)
            values = [None if v is None else encode(v) for v in batch.column(i).to_pylist()]
            batch = batch.set_column(i, pa.field(p.format.column, pa.binary()), pa.array(values, pa.binary()))
        yield batch


def _encoder(p: SinkPlan, data_type: DataType) -> Callable[[object], bytes]:
    schema = _parsed(p.schema)
    header = frame(p.schema.schema_id, b"")
    fit = _fitting(data_type, p.format.kind.upper()) or (lambda v: v)

    def encode(value: object) -> bytes:
        return header + schema.encode(fit(value))

    return encode


def _fitting(data_type: DataType, kind: str) -> Callable[[object], object] | None:
    """What turns an Arrow value of `data_type` into what the `kind` encoder takes (None when
    nothing needs turning): maps come from Arrow as (key, value) pairs; JSON has no dates,
    bytes or decimals; Protobuf's unsigned 64-bit columns are decimals."""
    if isinstance(data_type, MapType):
        inner = _fitting(data_type.valueType, kind)
        return lambda v: None if v is None else {k: (inner(x) if inner else x) for k, x in v}
    if isinstance(data_type, ArrayType):
        item = _fitting(data_type.elementType, kind)
        return None if item is None else (lambda v: None if v is None else [item(x) for x in v])
    if isinstance(data_type, StructType):
        fields = {f.name: c for f in data_type.fields if (c := _fitting(f.dataType, kind)) is not None}
        if kind == PROTOBUF:  # a null field is left unset
            return lambda v: None if v is None else {
                k: (fields[k](x) if k in fields else x) for k, x in v.items() if x is not None}
        if not fields:
            return None
        return lambda v: None if v is None else {k: (fields[k](x) if k in fields else x) for k, x in v.items()}
    if kind == JSON and isinstance(data_type, (DateType, TimestampType, TimestampNTZType)):
        return lambda v: None if v is None else _iso(v)
    if kind == JSON and isinstance(data_type, BinaryType):
        return lambda v: None if v is None else base64.b64encode(v).decode()
    if kind in (JSON, PROTOBUF) and isinstance(data_type, DecimalType):
        integral = kind == PROTOBUF
        return lambda v: None if v is None else (int(v) if integral else float(v))
    return None


def _iso(value: datetime.date | datetime.datetime) -> str:
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        value = value.astimezone(datetime.UTC)
    return value.isoformat()

