"""The key_value mode: each record a row of its metadata and raw bytes.

Columns: partition (int), offset (long), timestamp (timestamptz, from the record's
milliseconds), timestamp_type (int: Kafka's TimestampType id, 0 CreateTime, 1 LogAppendTime),
key and value (binary, null when the record's is), headers (list of struct key string, value
binary). A converter of another mode offers the same two members: `schema` and `convert`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema

from strom.protocol.records import Record
from strom.tables.columns import record_fields

CREATE_TIME, LOG_APPEND_TIME = 0, 1


class KeyValueConverter:
    mode = "key_value"

    def __init__(self) -> None:
        self.schema = Schema(*record_fields(1, value=True))
        self.arrow_schema = schema_to_pyarrow(self.schema)

    def convert(self, partition: int, records: Iterable[tuple[Record, int]]) -> pa.Table:
        """(record, timestamp type) pairs of one partition as an Arrow table of `schema`."""
        columns: dict[str, list[Any]] = {name: [] for name in self.arrow_schema.names}
        for record, timestamp_type in records:
            columns["offset"].append(record.offset)
            columns["timestamp"].append(record.timestamp * 1000)  # microseconds
            columns["timestamp_type"].append(timestamp_type)
            columns["key"].append(record.key)
            columns["value"].append(record.value)
            columns["headers"].append([{"key": k, "value": v} for k, v in record.headers])
        columns["partition"] = [partition] * len(columns["offset"])
        return pa.Table.from_pydict(columns, schema=self.arrow_schema)
