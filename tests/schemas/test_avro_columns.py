"""Avro types as columns, in a type system of strings, and payloads read with their writer's
schema in the reader's shape."""

from __future__ import annotations

import io
import json

import fastavro
import pytest

from strom.schemas.avro import AvroSchema
from strom.schemas.avro_columns import AvroReader, column_type
from strom.schemas.parsed import SchemaError


class Text:
    def primitive(self, name):
        return name

    def decimal(self, precision, scale):
        return f"decimal({precision},{scale})"

    def struct(self, fields):
        return "struct<" + ",".join(f"{n}:{t}{'?' if null else ''}" for n, t, null in fields) + ">"

    def array(self, item, nullable):
        return f"array<{item}{'?' if nullable else ''}>"

    def map(self, value, nullable):
        return f"map<{value}{'?' if nullable else ''}>"


def typed(schema) -> tuple[str, bool]:
    return column_type(json.loads(AvroSchema.parse(json.dumps(schema)).resolved), Text())


def test_records_logical_types_unions_and_named_references():
    money = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}
    schema = {"type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "amount", "type": money},
        {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "int", "logicalType": "time-millis"}},  # no type of its own
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "size", "type": ["int", "double", "null"]},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "other", "type": "Kind"},
        {"name": "tags", "type": {"type": "map", "values": ["null", "long"]}},
        {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
            {"name": "sku", "type": {"type": "fixed", "name": "Sku", "size": 4}}]}}},
        {"name": "huge", "type": {"type": "bytes", "logicalType": "decimal", "precision": 39}},
    ]}
    assert typed(schema) == ("struct<id:long,note:string?,amount:decimal(10,2),placed:timestamp,local:timestamp_ntz,"
                             "day:date,at:int,ref:string,size:double?,kind:string,other:string,tags:map<long?>,"
                             "lines:array<struct<sku:bytes>>,huge:bytes>", False)
    assert typed(["null", "string"]) == ("string", True)
    assert typed("null") == ("null", True)


@pytest.mark.parametrize("schema, why", [
    ({"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]},
     "Node contains itself"),
    (["string", "long"], "a union of string, long has no column type"),
    (["null", {"type": "int", "logicalType": "date"}, "long"], "a union of date, long has no column type"),
])
def test_types_without_a_column_type_are_refused(schema, why):
    with pytest.raises(SchemaError, match=why):
        typed(schema)


def payload(schema: dict, value: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return out.getvalue()


def test_payloads_are_resolved_to_the_readers_shape():
    v1 = {"type": "record", "name": "User", "fields": [{"name": "name", "type": "string"},
                                                      {"name": "age", "type": "int"}]}
    v2 = {"type": "record", "name": "User", "fields": [{"name": "name", "type": "string"},
                                                      {"name": "email", "type": ["null", "string"], "default": None}]}
    reader = AvroReader(AvroSchema.parse(json.dumps(v2)), 2)
    asked = []

    def writer():
        asked.append(1)
        return AvroSchema.parse(json.dumps(v1))

    old = reader.decoder(1, writer)
    assert old(payload(v1, {"name": "ann", "age": 3})) == {"name": "ann", "email": None}
    assert reader.decoder(1, writer) is old and asked == [1]  # one decoder per writer id
    assert reader.decoder(2, writer)(payload(v2, {"name": "bo", "email": "b@x"})) == {"name": "bo", "email": "b@x"}
    with pytest.raises(SchemaError, match="bytes left after the value"):
        old(payload(v1, {"name": "ann", "age": 3}) + b"\0")
    with pytest.raises(SchemaError, match="payload does not match schema id 1"):
        old(b"\x09")


def test_a_writer_the_reader_cannot_read_is_named():
    reader = AvroReader(AvroSchema.parse(json.dumps(
        {"type": "record", "name": "R", "fields": [{"name": "a", "type": "string"}]})), 5)
    other = AvroSchema.parse(json.dumps({"type": "record", "name": "R", "fields": [{"name": "b", "type": "int"}]}))
    with pytest.raises(SchemaError, match="schema id 6 cannot be read with the reader schema \\(id 5\\)"):
        reader.decoder(6, lambda: other)
