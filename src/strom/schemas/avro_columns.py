"""Avro values as typed columns, for readers that want columns rather than bytes: the Spark
source's typed columns and Iceberg topics' tables share it.

- `column_type(schema, types)`: the column type of an Avro type (resolved JSON, as
  AvroSchema.resolved writes it) in the caller's type system, with Spark's `from_avro` rules:
  records are structs, enums strings, fixed bytes, a union of one type and null is that type
  nullable, a union of numbers is the widest; date, timestamps and decimals (precision up to
  38) have types of their own, other logical types read as their underlying type.
- `AvroReader`: payloads decoded with the schema their writer used and resolved to the
  reader's (Avro schema resolution: a field the writer lacks gets the reader's default, one
  the reader lacks is skipped), one decoder per writer schema.
"""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import fastavro

from strom.schemas.avro import AvroSchema
from strom.schemas.avro_types import PRIMITIVES
from strom.schemas.parsed import SchemaError

T = TypeVar("T")
T_co = TypeVar("T_co")

# Logical types with a column type of their own, by the name `ColumnTypes.primitive` gets.
LOGICAL = {("int", "date"): "date", ("long", "timestamp-millis"): "timestamp",
           ("long", "timestamp-micros"): "timestamp", ("long", "local-timestamp-millis"): "timestamp_ntz",
           ("long", "local-timestamp-micros"): "timestamp_ntz"}
NUMBERS = ("int", "long", "float", "double")  # a union of them reads as the widest
MAX_DECIMAL_PRECISION = 38


class ColumnTypes(Protocol[T]):
    """A type system's constructors. `primitive` gets an Avro primitive's name (null included)
    or a LOGICAL value (date, timestamp, timestamp_ntz); enums come as string, fixed as bytes."""

    def primitive(self, name: str) -> T: ...
    def decimal(self, precision: int, scale: int) -> T: ...
    def struct(self, fields: list[tuple[str, T, bool]]) -> T: ...
    def array(self, item: T, nullable: bool) -> T: ...
    def map(self, value: T, nullable: bool) -> T: ...


def column_type(schema: object, types: ColumnTypes[T]) -> tuple[T, bool]:
    """(column type, nullable) of values of `schema`. SchemaError for a type with no column
    type: a recursive record, a union of unrelated types."""
    return _Walk(types).type_of(schema, ())


class _Walk(Generic[T]):
    def __init__(self, types: ColumnTypes[T]) -> None:
        self.types = types
        self.named: dict[str, dict] = {}

    def type_of(self, node: object, path: tuple[str, ...]) -> tuple[T, bool]:
        """`path`: the records being walked, to refuse recursion."""
        if isinstance(node, str):
            if node in PRIMITIVES:
                return self.types.primitive(node), node == "null"
            if node in path:
                raise _recursive(node)
            return self.type_of(self.named[node], path)
        if isinstance(node, list):
            return self._union(node, path)
        kind = node["type"]
        if isinstance(kind, (dict, list)):
            return self.type_of(kind, path)
        if "logicalType" in node and kept(node):
            if node["logicalType"] == "decimal":
                return self.types.decimal(node["precision"], node.get("scale", 0)), False
            return self.types.primitive(LOGICAL[kind, node["logicalType"]]), False
        if kind in PRIMITIVES:
            return self.types.primitive(kind), kind == "null"
        if kind in ("record", "error"):
            if node["name"] in path:
                raise _recursive(node["name"])
            self.named[node["name"]] = node
            inner = (*path, node["name"])
            return self.types.struct([(f["name"], *self.type_of(f["type"], inner)) for f in node["fields"]]), False
        if kind in ("enum", "fixed"):
            self.named[node["name"]] = node
            return self.types.primitive("string" if kind == "enum" else "bytes"), False
        if kind == "array":
            return self.types.array(*self.type_of(node["items"], path)), False
        if kind == "map":
            return self.types.map(*self.type_of(node["values"], path)), False
        raise SchemaError(f"unknown Avro type {kind!r}")

    def _union(self, branches: list, path: tuple[str, ...]) -> tuple[T, bool]:
        others = [b for b in branches if _plain_name(b) != "null"]
        nullable = len(others) < len(branches)
        if not others:
            return self.types.primitive("null"), True
        if len(others) == 1:
            return self.type_of(others[0], path)[0], nullable
        names = [_plain_name(b) for b in others]
        if all(n in NUMBERS for n in names):
            return self.types.primitive(max(names, key=NUMBERS.index)), nullable
        raise SchemaError("a union of " + ", ".join(n or _describe(b) for n, b in zip(names, others, strict=True))
                          + " has no column type (a union of one type and null, or of numbers, has)")


def _plain_name(node: object) -> str | None:
    """The primitive a union branch is, without a logical type; None for anything else."""
    if isinstance(node, str):
        return node if node in PRIMITIVES else None
    if isinstance(node, dict) and node.get("type") in PRIMITIVES and not (
            "logicalType" in node and kept(node)):
        return node["type"]
    return None


def _describe(node: object) -> str:
    if isinstance(node, dict):
        return node.get("name") or node.get("logicalType") or str(node.get("type"))
    return str(node)


def _recursive(name: str) -> SchemaError:
    return SchemaError(f"the Avro type {name} contains itself: a recursive type has no column type")


def kept(node: dict) -> bool:
    """Whether a logical type has a column type of its own (else it reads as its underlying)."""
    if (node["type"], node["logicalType"]) in LOGICAL:
        return True
    return (node["logicalType"] == "decimal" and node["type"] in ("bytes", "fixed")
            and isinstance(node.get("precision"), int) and 0 < node["precision"] <= MAX_DECIMAL_PRECISION
            and 0 <= node.get("scale", 0) <= node["precision"])


def plain(node: object) -> object:
    """The schema with the logical types that have no column type taken off, so that fastavro
    reads them as their underlying type."""
    if isinstance(node, list):
        return [plain(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = dict(node)
    if out.get("logicalType") is not None and not kept(out):
        del out["logicalType"]
    if "fields" in out:
        out["fields"] = [{**f, "type": plain(f["type"])} for f in out["fields"]]
    for key in ("items", "values"):
        if key in out:
            out[key] = plain(out[key])
    return out


def hazardous(schema: object) -> bool:
    """Whether a payload of `schema` could nest without bound or hold items that take no
    bytes. Conservative: any reuse of a named type, any array or map of null, records or fixed."""
    pending = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, str):
            if node not in PRIMITIVES:
                return True
        elif isinstance(node, list):
            pending += node
        elif isinstance(node, dict):
            for key in ("items", "values"):
                if key in node:
                    item = node[key]
                    kind = item.get("type") if isinstance(item, dict) else item
                    if not isinstance(kind, str) or kind not in PRIMITIVES or kind == "null":
                        return True
                    pending.append(item)
            pending += [f["type"] for f in node.get("fields", ())]
    return False


def _fastavro(schema: object) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fastavro.parse_schema(schema)


class AvroReader:
    """Decoding to the shape of one reader schema: one decoder per writer schema id."""

    def __init__(self, reader: AvroSchema, reader_id: int) -> None:
        self.reader_id = reader_id
        self.reader = reader
        self.reader_json = plain(json.loads(reader.resolved))
        self._fast = _fastavro(self.reader_json)
        self._decoders: dict[int, Callable[[bytes], object]] = {}

    def column_type(self, types: ColumnTypes[T]) -> tuple[T, bool]:
        return column_type(self.reader_json, types)

    def decoder(self, writer_id: int, writer: Callable[[], AvroSchema]) -> Callable[[bytes], object]:
        """payload -> value of the reader's shape, for records framed with `writer_id`;
        `writer` gives that id's schema (asked once per id)."""
        found = self._decoders.get(writer_id)
        if found is None:
            found = self._decoders[writer_id] = self._make_decoder(writer_id, writer)
        return found

    def _make_decoder(self, writer_id: int, writer: Callable[[], AvroSchema]) -> Callable[[bytes], object]:
        if writer_id == self.reader_id:
            parsed, fast, reader_fast = self.reader, self._fast, None
            writer_json = self.reader_json
        else:
            parsed = writer()
            errors = self.reader.read_errors(parsed)
            if errors:
                raise SchemaError(f"data written with schema id {writer_id} cannot be read with the "
                                  f"reader schema (id {self.reader_id}): {'; '.join(errors[:3])}")
            writer_json = plain(json.loads(parsed.resolved))
            fast, reader_fast = _fastavro(writer_json), self._fast
        # A recursive type or items of no size could make fastavro's reader go on without
        # bound: such payloads are first scanned, with bounds, by the schema package.
        check = parsed.decode if hazardous(writer_json) else None

        def decode(data: bytes) -> object:
            if check is not None:
                check(data)
            stream = io.BytesIO(data)
            try:
                value = fastavro.schemaless_reader(stream, fast, reader_fast)
            except Exception as e:  # garbage shows as EOF, a bad index, bad UTF-8, ...
                raise SchemaError(f"payload does not match schema id {writer_id}: {e!r}") from None
            if stream.tell() != len(data):
                raise SchemaError(f"payload does not match schema id {writer_id}: "
                                  f"{len(data) - stream.tell()} bytes left after the value")
            return value

        return decode
