"""Columns of the schema modes' tables: the record's metadata as the struct column `strom`, and
Avro types as Arrow types (schemas/avro_columns' ColumnTypes), which pyiceberg's
`union_by_name` turns into the table's Iceberg columns.

The value's fields sit at the top level and its metadata in `strom` (Redpanda keeps its in a
`redpanda` struct), so that no value field clashes with a metadata column. Every value column
is optional: a field a later writer schema drops reads as null, as do old rows in a column a
later one adds.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyiceberg.types import (
    BinaryType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from strom.protocol.records import Record
from strom.schemas.parsed import SchemaError

METADATA = "strom"  # the metadata struct column
METADATA_COLUMNS = ("partition", "offset", "timestamp", "timestamp_type", "key")  # what a spec may name


def record_fields(first_id: int, value: bool) -> list[NestedField]:
    """A record's metadata (and its raw value, for key_value's top level) as Iceberg fields,
    numbered from `first_id` in this order: partition, offset, timestamp, timestamp_type, key,
    [value,] headers (a list of struct key string, value binary)."""
    ids = iter(range(first_id, first_id + 10))
    fields = [NestedField(next(ids), "partition", IntegerType(), required=True),
              NestedField(next(ids), "offset", LongType(), required=True),
              NestedField(next(ids), "timestamp", TimestamptzType(), required=True),
              NestedField(next(ids), "timestamp_type", IntegerType(), required=True),
              NestedField(next(ids), "key", BinaryType(), required=False)]
    if value:
        fields.append(NestedField(next(ids), "value", BinaryType(), required=False))
    headers, element, key, header_value = (next(ids) for _ in range(4))
    fields.append(NestedField(headers, "headers", ListType(element, StructType(
        NestedField(key, "key", StringType(), required=True),
        NestedField(header_value, "value", BinaryType(), required=False)), element_required=True), required=False))
    return fields


def metadata_field() -> NestedField:
    """The `strom` struct: field ids 1 to 10, the first of a new table's."""
    return NestedField(1, METADATA, StructType(*record_fields(2, value=False)), required=True)


def metadata(partition: int, record: Record, timestamp_type: int) -> dict[str, Any]:
    return {"partition": partition, "offset": record.offset, "timestamp": record.timestamp * 1000,
            "timestamp_type": timestamp_type, "key": record.key,
            "headers": [{"key": k, "value": v} for k, v in record.headers]}


_PRIMITIVES = {"boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
               "double": pa.float64(), "bytes": pa.binary(), "string": pa.string(), "date": pa.date32(),
               "timestamp": pa.timestamp("us", tz="UTC"), "timestamp_ntz": pa.timestamp("us")}


class ArrowTypes:
    """schemas.avro_columns.ColumnTypes for Arrow: every field, item and value nullable, so
    that writer schemas of one subject union into one table schema."""

    def primitive(self, name: str) -> pa.DataType:
        found = _PRIMITIVES.get(name)
        if found is None:  # null: Iceberg has no type for a value that is always null
            raise SchemaError(f"the Avro type {name} has no Iceberg type")
        return found

    def decimal(self, precision: int, scale: int) -> pa.DataType:
        return pa.decimal128(precision, scale)

    def struct(self, fields: list[tuple[str, pa.DataType, bool]]) -> pa.DataType:
        return pa.struct([pa.field(name, kind, nullable=True) for name, kind, _ in fields])

    def array(self, item: pa.DataType, nullable: bool) -> pa.DataType:
        return pa.list_(pa.field("element", item, nullable=True))

    def map(self, value: pa.DataType, nullable: bool) -> pa.DataType:
        return pa.map_(pa.string(), pa.field("value", value, nullable=True))


def value_columns(kind: pa.DataType, is_record: bool) -> pa.Schema:
    """The value's top-level columns: a record's fields, or one column `value`."""
    if not is_record:
        return pa.schema([pa.field("value", kind, nullable=True)])
    fields = [kind.field(i) for i in range(kind.num_fields)]
    if any(f.name == METADATA for f in fields):
        raise SchemaError(f"the record has a field named {METADATA}, the column of the record's metadata")
    if not fields:
        raise SchemaError("a record without fields has no columns")
    return pa.schema(fields)
