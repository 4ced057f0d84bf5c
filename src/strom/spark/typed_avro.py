"""Avro values as Spark columns: an Avro schema's Spark type (as Spark's from_avro maps it), a
record's payload decoded with the writer schema its framing names and resolved to the
reader's (Avro's schema resolution: a field the writer lacks gets the reader's default, a
field the reader lacks is skipped), and a Spark struct's Avro schema for the sink."""

from __future__ import annotations

from collections.abc import Callable

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
from strom.schemas.avro_columns import AvroReader, column_type
from strom.schemas.parsed import AVRO, SchemaError, parse
from strom.spark.registry import FetchedSchema

_PRIMITIVE = {"null": NullType(), "boolean": BooleanType(), "int": IntegerType(), "long": LongType(),
              "float": FloatType(), "double": DoubleType(), "bytes": BinaryType(), "string": StringType(),
              "date": DateType(), "timestamp": TimestampType(), "timestamp_ntz": TimestampNTZType()}


class _SparkTypes:
    """Spark's types for avro_columns.column_type."""

    def primitive(self, name: str) -> DataType:
        return _PRIMITIVE[name]

    def decimal(self, precision: int, scale: int) -> DataType:
        return DecimalType(precision, scale)

    def struct(self, fields: list[tuple[str, DataType, bool]]) -> DataType:
        return StructType([StructField(name, data_type, nullable) for name, data_type, nullable in fields])

    def array(self, item: DataType, nullable: bool) -> DataType:
        return ArrayType(item, nullable)

    def map(self, value: DataType, nullable: bool) -> DataType:
        return MapType(StringType(), value, nullable)


class AvroColumn:
    """Decoding of one column whose reader schema is `reader`: one decoder per writer schema id."""

    def __init__(self, reader: FetchedSchema) -> None:
        self.reader_id = reader.schema_id
        self._reader = AvroReader(_parse(reader), reader.schema_id)
        self.data_type = self._reader.column_type(_SparkTypes())[0]

    def decoder(self, writer: FetchedSchema) -> Callable[[bytes], object]:
        """payload -> value of the reader's shape, for records framed with `writer`'s id."""
        if writer.schema_type != AVRO:
            raise SchemaError(f"schema id {writer.schema_id} is a {writer.schema_type} schema, not Avro")
        return self._reader.decoder(writer.schema_id, lambda: _parse(writer))


def _parse(fetched: FetchedSchema) -> AvroSchema:
    schema = parse(AVRO, fetched.text, fetched.references)
    assert isinstance(schema, AvroSchema)
    return schema


def spark_type(schema: object) -> DataType:
    """The Spark type of values of `schema` (resolved JSON, as AvroSchema.resolved writes it)."""
    return column_type(schema, _SparkTypes())[0]


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
