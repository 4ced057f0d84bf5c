"""The columns of Spark's Kafka source, in Spark types and in the Arrow types Spark expects
from a Python data source (they must match exactly, nullability included)."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

if TYPE_CHECKING:
    import pyarrow as pa

HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))


@cache
def source_schema(include_headers: bool) -> StructType:
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", HEADERS))
    return StructType(fields)


@cache
def arrow_schema(include_headers: bool) -> pa.Schema:
    # Spark converts a Python source's batches with the session-independent UTC zone.
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(source_schema(include_headers), timezone="UTC")
