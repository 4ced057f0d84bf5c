"""JSON Schema values as Spark columns: an object's properties as a struct (string, integer,
number, boolean, arrays and nested objects typed; anything else, as a free-form value, its
JSON text), every field nullable; a payload parsed and checked against that shape."""

from __future__ import annotations

import json
from collections.abc import Callable

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from strom.schemas.parsed import JSON, MAX_DEPTH, SchemaError
from strom.spark.registry import FetchedSchema

Convert = Callable[[object], object]
_SIMPLE = {"string": StringType(), "integer": LongType(), "number": DoubleType(), "boolean": BooleanType()}


class JsonColumn:
    """Decoding of one column whose reader schema is `reader`. Every writer version is read
    the same way: parsed, then fitted to the reader's properties (others are dropped)."""

    def __init__(self, reader: FetchedSchema) -> None:
        self.reader_id = reader.schema_id
        try:
            root = json.loads(reader.text)
        except (ValueError, RecursionError) as e:
            raise SchemaError(f"schema id {reader.schema_id} is not valid JSON: {e}") from None
        self.data_type, self._convert = _shape(root, root, 0)

    def decoder(self, writer: FetchedSchema) -> Callable[[bytes], object]:
        if writer.schema_type != JSON:
            raise SchemaError(f"schema id {writer.schema_id} is a {writer.schema_type} schema, not JSON")
        return self.decode

    def decode(self, data: bytes) -> object:
        try:
            value = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise SchemaError(f"the payload is not JSON: {e}") from None
        return self._convert(value)


def _resolve(node: object, root: object, depth: int) -> object:
    """A local $ref (#/definitions/..., #/$defs/...) followed; other nodes as they are."""
    while isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#"):
        depth += 1
        if depth > MAX_DEPTH:
            raise SchemaError(f"$ref nested deeper than {MAX_DEPTH} (a recursive schema has no Spark type)")
        target = root
        for part in node["$ref"].lstrip("#").strip("/").split("/"):
            if not part:
                continue
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise SchemaError(f"$ref {node['$ref']} names nothing in the schema")
            target = target[part]
        node = target
    return node


def _types(node: dict) -> list[str]:
    kind = node.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    for key in ("oneOf", "anyOf"):  # X or null
        branches = node.get(key)
        if isinstance(branches, list):
            kinds = [b.get("type") for b in branches if isinstance(b, dict)]
            if len(kinds) == len(branches) and kinds.count("null") == 1 and len(kinds) == 2:
                return [k for k in kinds if isinstance(k, str)]
    return []


def _shape(node: object, root: object, depth: int) -> tuple[DataType, Convert]:
    """(Spark type, value converter) of a schema node; depth bounded."""
    if depth > MAX_DEPTH:
        raise SchemaError(f"the JSON schema nests deeper than {MAX_DEPTH}")
    node = _resolve(node, root, depth)
    if not isinstance(node, dict):
        return StringType(), _as_json
    if node.get("type") is None and isinstance(node.get("oneOf", node.get("anyOf")), list):
        branch = next((b for b in node.get("oneOf", node.get("anyOf")) if isinstance(b, dict)
                       and b.get("type") != "null"), None)
        if branch is not None and len(_types(node)) == 2:
            return _shape(branch, root, depth + 1)
    kinds = [k for k in _types(node) if k != "null"]
    if len(kinds) != 1:
        return StringType(), _as_json
    kind = kinds[0]
    if kind in _SIMPLE:
        return _SIMPLE[kind], _checked(kind)
    if kind == "array" and isinstance(node.get("items"), dict):
        item_type, item = _shape(node["items"], root, depth + 1)
        return ArrayType(item_type, True), _array(item)
    if kind == "object" and isinstance(node.get("properties"), dict) and node["properties"]:
        fields, converters = [], {}
        for name, sub in node["properties"].items():
            data_type, converters[name] = _shape(sub, root, depth + 1)
            fields.append(StructField(name, data_type, True))
        return StructType(fields), _object(converters)
    return StringType(), _as_json


def _as_json(value: object) -> object:
    return None if value is None else json.dumps(value, separators=(",", ":"))


def _checked(kind: str) -> Convert:
    def check(value: object) -> object:
        if value is None:
            return None
        ok = {"string": isinstance(value, str), "boolean": isinstance(value, bool),
              "integer": isinstance(value, int) and not isinstance(value, bool) and -2**63 <= value < 2**63,
              "number": isinstance(value, (int, float)) and not isinstance(value, bool)}[kind]
        if not ok:
            raise SchemaError(f"{json.dumps(value)[:100]} is not a {kind}")
        return float(value) if kind == "number" else value
    return check


def _array(item: Convert) -> Convert:
    def convert(value: object) -> object:
        if value is None:
            return None
        if not isinstance(value, list):
            raise SchemaError(f"{json.dumps(value)[:100]} is not an array")
        return [item(v) for v in value]
    return convert


def _object(fields: dict[str, Convert]) -> Convert:
    def convert(value: object) -> object:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise SchemaError(f"{json.dumps(value)[:100]} is not an object")
        return {name: f(value.get(name)) for name, f in fields.items()}
    return convert
