"""Avro values as Spark columns: an Avro schema's Spark type (as Spark's from_avro maps it), a
record's payload decoded with the writer schema its framing names and resolved to the
reader's (Avro's schema resolution: a field the writer lacks gets the reader's default, a
field the reader lacks is skipped), and a Spark struct's Avro schema for the sink."""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Callable

import fastavro
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
    NullType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from strom.schemas.avro import AvroSchema
from strom.schemas.parsed import AVRO, SchemaError, parse
from strom.spark.registry import FetchedSchema

_PRIMITIVE = {"null": NullType(), "boolean": BooleanType(), "int": IntegerType(), "long": LongType(),
              "float": FloatType(), "double": DoubleType(), "bytes": BinaryType(), "string": StringType()}
# Logical types with a Spark type of their own; the others (uuid, time-*, *-nanos, duration)
# are read as their underlying type, as Spark's from_avro does.
_LOGICAL = {("int", "date"): DateType(), ("long", "timestamp-millis"): TimestampType(),
            ("long", "timestamp-micros"): TimestampType(),
            ("long", "local-timestamp-millis"): TimestampNTZType(),
            ("long", "local-timestamp-micros"): TimestampNTZType()}
_WIDER = [IntegerType(), LongType(), FloatType(), DoubleType()]  # numeric unions read as the widest
MAX_DECIMAL_PRECISION = 38  # Spark's


class AvroColumn:
    """Decoding of one column whose reader schema is `reader`: one decoder per writer schema id."""

    def __init__(self, reader: FetchedSchema) -> None:
        self.reader_id = reader.schema_id
        self.reader = _parse(reader)
        self.reader_json = _plain(json.loads(self.reader.resolved))
        self.data_type = spark_type(self.reader_json)
        self._fast = _fastavro(self.reader_json)
        self._decoders: dict[int, Callable[[bytes], object]] = {}

    def decoder(self, writer: FetchedSchema) -> Callable[[bytes], object]:
        """payload -> value of the reader's shape, for records framed with `writer`'s id."""
        found = self._decoders.get(writer.schema_id)
        if found is None:
            found = self._decoders[writer.schema_id] = self._make_decoder(writer)
        return found

    def _make_decoder(self, writer: FetchedSchema) -> Callable[[bytes], object]:
        if writer.schema_type != AVRO:
            raise SchemaError(f"schema id {writer.schema_id} is a {writer.schema_type} schema, not Avro")
        if writer.schema_id == self.reader_id:
            parsed, fast, reader_fast = self.reader, self._fast, None
            writer_json = self.reader_json
        else:
            parsed = _parse(writer)
            errors = self.reader.read_errors(parsed)
            if errors:
                raise SchemaError(f"data written with schema id {writer.schema_id} cannot be read with the "
                                  f"reader schema (id {self.reader_id}): {'; '.join(errors[:3])}")
            writer_json = _plain(json.loads(parsed.resolved))
            fast, reader_fast = _fastavro(writer_json), self._fast
        # A recursive type or items of no size could make fastavro's reader go on without
        # bound: such payloads are first scanned, with bounds, by the schema package.
        check = parsed.decode if _hazardous(writer_json) else None

        def decode(data: bytes) -> object:
            if check is not None:
                check(data)
            stream = io.BytesIO(data)
            try:
                value = fastavro.schemaless_reader(stream, fast, reader_fast)
            except Exception as e:  # garbage shows as EOF, a bad index, bad UTF-8, ...
                raise SchemaError(f"payload does not match schema id {writer.schema_id}: {e!r}") from None
            if stream.tell() != len(data):
                raise SchemaError(f"payload does not match schema id {writer.schema_id}: "
                                  f"{len(data) - stream.tell()} bytes left after the value")
            return value

        return decode


def _parse(fetched: FetchedSchema) -> AvroSchema:
    schema = parse(AVRO, fetched.text, fetched.references)
    assert isinstance(schema, AvroSchema)
    return schema


def _fastavro(schema: object) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fastavro.parse_schema(schema)


def _plain(node: object) -> object:
    """The schema with the logical types Spark has no type for taken off, so that fastavro
    reads them as their underlying type."""
    if isinstance(node, list):
        return [_plain(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = dict(node)
    logical = out.get("logicalType")
    if logical is not None and not _kept(out):
        del out["logicalType"]
    if "fields" in out:
        out["fields"] = [{**f, "type": _plain(f["type"])} for f in out["fields"]]
    for key in ("items", "values"):
        if key in out:
            out[key] = _plain(out[key])
    return out


def _kept(node: dict) -> bool:
    if (node["type"], node["logicalType"]) in _LOGICAL:
        return True
    return (node["logicalType"] == "decimal" and node["type"] in ("bytes", "fixed")
            and isinstance(node.get("precision"), int) and 0 < node["precision"] <= MAX_DECIMAL_PRECISION
            and 0 <= node.get("scale", 0) <= node["precision"])


def _hazardous(schema: object) -> bool:
    """Whether a payload of `schema` could nest without bound or hold items that take no
    bytes. Conservative: any reuse of a named type, any array or map of null, records or fixed."""
    pending = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, str):
            if node not in _PRIMITIVE:
                return True
        elif isinstance(node, list):
            pending += node
        elif isinstance(node, dict):
            for key in ("items", "values"):
                if key in node:
                    item = node[key]
                    kind = item.get("type") if isinstance(item, dict) else item
                    if not isinstance(kind, str) or kind not in _PRIMITIVE or kind == "null":
                        return True
                    pending.append(item)
            pending += [f["type"] for f in node.get("fields", ())]
    return False


# -- Avro -> Spark -----------------------------------------------------------------------------

def spark_type(schema: object) -> DataType:
    """The Spark type of values of `schema` (resolved JSON, as AvroSchema.resolved writes it)."""
    data_type, _ = _to_spark(schema, {}, ())
    return data_type


def _to_spark(node: object, named: dict[str, dict], path: tuple[str, ...]) -> tuple[DataType, bool]:
    """(Spark type, nullable) of one Avro type; `path`: the records being mapped (recursion)."""
    if isinstance(node, str):
        if node in _PRIMITIVE:
            return _PRIMITIVE[node], node == "null"
        if node in path:
            raise SchemaError(f"the Avro type {node} contains itself: a recursive type has no Spark type")
        return _to_spark(named[node], named, path)
    if isinstance(node, list):
        return _union(node, named, path)
    kind = node["type"]
    if isinstance(kind, (dict, list)):
        return _to_spark(kind, named, path)
    if "logicalType" in node and _kept(node):
        if node["logicalType"] == "decimal":
            return DecimalType(node["precision"], node.get("scale", 0)), False
        return _LOGICAL[kind, node["logicalType"]], False
    if kind in _PRIMITIVE:
        return _PRIMITIVE[kind], kind == "null"
    if kind in ("record", "error"):
        if node["name"] in path:
            raise SchemaError(f"the Avro type {node['name']} contains itself: a recursive type has no Spark type")
        named[node["name"]] = node
        inner = (*path, node["name"])
        fields = []
        for f in node["fields"]:
            data_type, nullable = _to_spark(f["type"], named, inner)
            fields.append(StructField(f["name"], data_type, nullable))
        return StructType(fields), False
    if kind in ("enum", "fixed"):
        named[node["name"]] = node
        return (StringType() if kind == "enum" else BinaryType()), False
    if kind == "array":
        item, nullable = _to_spark(node["items"], named, path)
        return ArrayType(item, nullable), False
    if kind == "map":
        value, nullable = _to_spark(node["values"], named, path)
        return MapType(StringType(), value, nullable), False
    raise SchemaError(f"unknown Avro type {kind!r}")


def _union(branches: list, named: dict[str, dict], path: tuple[str, ...]) -> tuple[DataType, bool]:
    nullable = any(b == "null" or (isinstance(b, dict) and b.get("type") == "null") for b in branches)
    types = []
    for branch in branches:
        data_type, _ = _to_spark(branch, named, path)
        if not isinstance(data_type, NullType):
            types.append(data_type)
    if not types:
        return NullType(), True
    if len(types) == 1:
        return types[0], nullable
    if all(t in _WIDER for t in types):
        return max(types, key=_WIDER.index), nullable
    raise SchemaError("a union of " + ", ".join(t.simpleString() for t in types) + " has no Spark column type "
                      "(a union of one type and null, or of numbers, has)")


# -- Spark -> Avro (the sink) ------------------------------------------------------------------

def avro_schema(data_type: StructType, name: str = "topLevelRecord") -> dict:
    """An Avro record schema for values of a Spark struct (as Spark's to_avro derives one):
    nullable fields as a union with null first, default null."""
    return _to_avro(data_type, name, None)  # type: ignore[return-value]


def _to_avro(data_type: DataType, name: str, namespace: str | None) -> object:
    simple = {BooleanType: "boolean", ByteType: "int", ShortType: "int", IntegerType: "int", LongType: "long",
              FloatType: "float", DoubleType: "double", StringType: "string", BinaryType: "bytes"}
    if type(data_type) in simple:
        return simple[type(data_type)]
    if isinstance(data_type, DateType):
        return {"type": "int", "logicalType": "date"}
    if isinstance(data_type, TimestampType):
        return {"type": "long", "logicalType": "timestamp-micros"}
    if isinstance(data_type, TimestampNTZType):
        return {"type": "long", "logicalType": "local-timestamp-micros"}
    if isinstance(data_type, DecimalType):
        return {"type": "bytes", "logicalType": "decimal", "precision": data_type.precision,
                "scale": data_type.scale}
    if isinstance(data_type, ArrayType):
        return {"type": "array", "items": _nullable(_to_avro(data_type.elementType, name, namespace),
                                                     data_type.containsNull)}
    if isinstance(data_type, MapType):
        if not isinstance(data_type.keyType, StringType):
            raise SchemaError(f"an Avro map has string keys, not {data_type.keyType.simpleString()}")
        return {"type": "map", "values": _nullable(_to_avro(data_type.valueType, name, namespace),
                                                   data_type.valueContainsNull)}
    if isinstance(data_type, StructType):
        full = f"{namespace}.{name}" if namespace else name
        record: dict = {"type": "record", "name": name}
        if namespace:
            record["namespace"] = namespace
        record["fields"] = []
        for f in data_type.fields:
            field: dict = {"name": f.name, "type": _nullable(_to_avro(f.dataType, f.name, full), f.nullable)}
            if f.nullable:
                field["default"] = None
            record["fields"].append(field)
        return record
    raise SchemaError(f"the Spark type {data_type.simpleString()} has no Avro type")


def _nullable(schema: object, nullable: bool) -> object:
    return ["null", schema] if nullable else schema
