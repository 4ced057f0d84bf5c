"""Avro schemas: parsed with their references, in Confluent's canonical text, checked for
reader/writer compatibility as Avro Java's SchemaCompatibility checks, values decoded and
encoded with fastavro.

Internally a schema is "resolved": the JSON with every named type's `name` made its full name
(no `namespace` left to inherit) and every use of a named type after its definition a string of
its full name. Each named type is defined once, in the schema (or referenced schema) that
declares it; `_defs` maps full names to those definitions. The canonical text, Confluent's
normalized form, the compatibility checker and fastavro's input are all written from that.

This module parses and resolves; the texts are written by avro_canonical, compatibility is
checked by avro_compat and hostile payloads are caught by avro_values.
"""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Sequence

import fastavro

from strom.schemas.avro_canonical import JavaWriter, NormalWriter
from strom.schemas.avro_compat import Checker, describe
from strom.schemas.avro_types import (
    FIELD_RESERVED,
    NAMED,
    PRIMITIVES,
    deref,
    invalid,
    kind_of,
    split_name,
)
from strom.schemas.avro_values import Scanner, check_value_depth, guard
from strom.schemas.loading import dependencies_first, load_json
from strom.schemas.parsed import (
    AVRO,
    MAX_DEPTH,
    ParsedSchema,
    ResolvedReference,
    SchemaError,
)

_SCHEMA_RESERVED = frozenset({"type", "name", "namespace", "doc", "fields", "items", "values",
                              "size", "symbols", "aliases"})
_ORDERS = ("ascending", "descending", "ignore")
# JSON nesting a schema text may have: a few levels per Avro type (record, fields, field) and
# room for defaults; it keeps every recursive walk below Python's recursion limit.
_MAX_JSON_DEPTH = 4 * MAX_DEPTH


class AvroSchema(ParsedSchema):
    """A valid Avro schema, with the named types of its references."""

    schema_type = AVRO

    def __init__(self, root: object, defs: dict[str, dict], ref_names: frozenset[str],
                 references: Sequence[ResolvedReference]) -> None:
        self._root = root
        self._defs = defs
        self._ref_names = ref_names
        self._references = tuple(references)
        self._canonical = JavaWriter(defs, set(ref_names)).write(root, None)
        self._expanded = _expand(root, defs, ref_names)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._fast = fastavro.parse_schema(self._expanded)
        except Exception as e:  # fastavro raises several kinds for one cause: a bad schema
            raise SchemaError(f"invalid Avro schema: {e}") from None
        self._empty = guard(root, defs)

    @classmethod
    def parse(cls, text: str, references: Sequence[ResolvedReference] = ()) -> AvroSchema:
        defs: dict[str, dict] = {}
        try:
            for ref in dependencies_first(references):
                try:
                    _Resolver(defs).resolve(_load(ref.schema, "schema"))
                except SchemaError as e:
                    raise SchemaError(f"reference {ref.name}: {e}") from None
            ref_names = frozenset(defs)
            root = _Resolver(defs).resolve(_load(text, "schema"))
            return cls(root, defs, ref_names, references)
        except RecursionError:  # every walk is bounded; this is the last guard
            raise invalid("nested too deep") from None

    @property
    def canonical(self) -> str:
        return self._canonical

    @property
    def name(self) -> str | None:
        """The record's full name, for the record name subject strategies."""
        node = self._deref(self._root)
        return node["name"] if isinstance(node, dict) and node["type"] in NAMED else None

    @property
    def record_name(self) -> str | None:
        return self.name

    @property
    def resolved(self) -> str:
        """The schema with its referenced types written in place (Confluent's RESOLVED
        format): what a client without the references needs to read the data."""
        return JavaWriter(self._defs, set()).write(self._expanded, None)

    def normalized(self) -> AvroSchema:
        text = NormalWriter(self._defs, set(self._ref_names)).write(self._root)
        return type(self).parse(text, self._references)

    def read_errors(self, writer: ParsedSchema) -> list[str]:
        if not isinstance(writer, AvroSchema):
            return [f"Incompatible because of different schema type: {writer.schema_type}"]
        checker = Checker(self._defs, writer._defs)
        try:
            checker.check(self._root, writer._root, [])
        except RecursionError:  # the depth is bounded; this is the last guard
            return [describe("TYPE_MISMATCH", "/", "schemas nested too deep to compare")]
        return [describe(*found) for found in dict.fromkeys(checker.found)]

    def decode(self, payload: bytes | memoryview) -> object:
        data = bytes(payload)
        if self._empty is not None:
            Scanner(self._defs, self._empty, data).scan(self._root)
        stream = io.BytesIO(data)
        try:
            value = fastavro.schemaless_reader(stream, self._fast, None)
        except Exception as e:  # garbage shows as EOF, bad index, bad UTF-8, ...
            raise SchemaError(f"payload does not match the Avro schema: {e!r}") from None
        if stream.tell() != len(data):
            raise SchemaError(f"payload does not match the Avro schema: "
                              f"{len(data) - stream.tell()} bytes left after the value")
        return value

    def encode(self, value: object) -> bytes:
        """`value` in Avro binary (the payload only, without framing); SchemaError if it does
        not fit the schema."""
        if self._empty is not None:
            check_value_depth(value)
        stream = io.BytesIO()
        try:
            fastavro.schemaless_writer(stream, self._fast, value, strict=True,
                                      strict_allow_default=True)
        except Exception as e:
            raise SchemaError(f"value does not match the Avro schema: {e}") from None
        return stream.getvalue()

    def _deref(self, node: object) -> object:
        return self._defs[node] if isinstance(node, str) and node in self._defs else node

    def __repr__(self) -> str:
        return f"AvroSchema({self._canonical[:200]})"


# -- loading -------------------------------------------------------------------------------

def _load(text: str, what: str) -> object:
    return load_json(text, what, "an Avro schema", _MAX_JSON_DEPTH)


# -- resolving -----------------------------------------------------------------------------

def _check_name(name: object, what: str, dotted: bool = False) -> str:
    """`name` if Avro Java accepts it: a letter or _ then letters, digits and _ (dotted:
    parts like that joined by dots)."""
    if not isinstance(name, str):
        raise invalid(f"{what} {json.dumps(name)[:100]} is not a string")
    for part in name.split(".") if dotted else (name,):
        if not (part and (part[0].isalpha() or part[0] == "_")
                and all(c.isalnum() or c == "_" for c in part)):
            raise invalid(f"{what} {name!r} is not a valid Avro name")
    return name


class _Resolver:
    """Checks a schema's JSON as Avro Java's parser does and turns it into its resolved
    form, adding its named types to `defs`."""

    def __init__(self, defs: dict[str, dict]) -> None:
        self.defs = defs

    def resolve(self, node: object) -> object:
        return self._type(node, None, 1)

    @staticmethod
    def _full(name: str, space: str | None) -> str:
        if "." in name:
            return name
        return f"{space}.{name}" if space else name

    def _lookup(self, name: str, space: str | None) -> str:
        # as Avro Java: the name in the enclosing namespace, else in the null namespace
        for full in (self._full(name, space), name):
            if full in self.defs:
                return full
        raise invalid(f"unknown type {name!r}" + (f" (namespace {space})" if space else ""))

    def _type(self, node: object, space: str | None, depth: int) -> object:
        if depth > MAX_DEPTH:
            raise invalid(f"types nested deeper than {MAX_DEPTH}")
        if isinstance(node, str):
            return node if node in PRIMITIVES else self._lookup(node, space)
        if isinstance(node, list):
            return self._union(node, space, depth)
        if not isinstance(node, dict):
            raise invalid(f"{json.dumps(node)[:100]} is not a type")
        kind = node.get("type")
        if not isinstance(kind, str):
            raise invalid(f"type {json.dumps(kind)[:100]} is not a type name")
        props = {k: v for k, v in node.items() if k not in _SCHEMA_RESERVED}
        if kind in PRIMITIVES:
            return {"type": kind, **props} if props else kind
        if kind in ("array", "map"):
            key = "items" if kind == "array" else "values"
            if key not in node:
                raise invalid(f"{kind} without {key}")
            return {"type": kind, key: self._type(node[key], space, depth + 1), **props}
        if kind in NAMED:
            return self._named(node, kind, props, space, depth)
        return self._lookup(kind, space)  # {"type": "com.acme.Named"} names a defined type

    def _union(self, branches: list, space: str | None, depth: int) -> list:
        out = [self._type(branch, space, depth + 1) for branch in branches]
        seen: set[str] = set()
        for branch in out:
            if isinstance(branch, list):
                raise invalid("a union directly inside a union")
            kind = kind_of(branch, self.defs)
            key = kind  # named types differ by name
            if kind in NAMED:
                key = branch if isinstance(branch, str) else branch["name"]
            if key in seen:
                raise invalid(f"union has {key} twice")
            seen.add(key)
        return out

    def _named(self, node: dict, kind: str, props: dict, space: str | None,
               depth: int) -> dict:
        name = _check_name(node.get("name"), f"{kind} name", dotted=True)
        namespace = node.get("namespace", space)
        if namespace is not None and not isinstance(namespace, str):
            raise invalid(f"namespace {json.dumps(namespace)[:100]} is not a string")
        if namespace and "." not in name:
            _check_name(namespace, "namespace", dotted=True)
        full = self._full(name, namespace or None)
        own_space, simple = split_name(full)
        if full in PRIMITIVES:  # in a namespace, n.string is a name like any other
            raise invalid(f"a {kind} may not be named {simple}")
        if full in self.defs:
            raise invalid(f"type {full} is defined twice")
        out: dict = {"type": kind, "name": full}
        self.defs[full] = out  # before the fields: a record may contain itself
        if isinstance(node.get("doc"), str):  # Java keeps only a text doc
            out["doc"] = node["doc"]
        if kind == "enum":
            out["symbols"] = self._symbols(node.get("symbols"), full)
            if "default" in props:
                out["default"] = props.pop("default")
                if out["default"] not in out["symbols"]:
                    raise invalid(f"enum {full} default {json.dumps(out['default'])[:100]} "
                                   "is not one of its symbols")
        elif kind == "fixed":
            size = node.get("size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise invalid(f"fixed {full} size {json.dumps(size)} is not a size")
            out["size"] = size
        else:
            fields = node.get("fields")
            if not isinstance(fields, list):
                raise invalid(f"record {full} has no list of fields")
            out["fields"] = [self._field(f, own_space, depth) for f in fields]
            names = [f["name"] for f in out["fields"]]
            if len(set(names)) != len(names):
                raise invalid(f"record {full} has a field name twice")
        if "aliases" in node:
            out["aliases"] = [self._full(a, own_space)
                              for a in self._aliases(node["aliases"], dotted=True)]
        out.update(props)
        return out

    @staticmethod
    def _symbols(symbols: object, full: str) -> list[str]:
        if not isinstance(symbols, list):
            raise invalid(f"enum {full} has no list of symbols")
        for symbol in symbols:
            _check_name(symbol, f"enum {full} symbol")
        if len(set(symbols)) != len(symbols):
            raise invalid(f"enum {full} has a symbol twice")
        return list(symbols)

    @staticmethod
    def _aliases(aliases: object, dotted: bool) -> list[str]:
        if not isinstance(aliases, list):
            raise invalid(f"aliases {json.dumps(aliases)[:100]} are not a list")
        return [_check_name(a, "alias", dotted) for a in aliases]

    def _field(self, node: object, space: str | None, depth: int) -> dict:
        if not isinstance(node, dict):
            raise invalid(f"field {json.dumps(node)[:100]} is not an object")
        name = _check_name(node.get("name"), "field name")
        if "type" not in node:
            raise invalid(f"field {name} has no type")
        out = {"name": name, "type": self._type(node["type"], space, depth + 1)}
        if isinstance(node.get("doc"), str):  # Java keeps only a text doc
            out["doc"] = node["doc"]
        if "default" in node:
            if not _valid_default(out["type"], node["default"], self.defs):
                raise invalid(f"invalid default for field {name}: "
                               f"{json.dumps(node['default'])[:200]}")
            out["default"] = node["default"]
        order = node.get("order", "ascending")
        order = order.lower() if isinstance(order, str) else order  # Java ignores the case
        if order not in _ORDERS:
            raise invalid(f"field {name} order {json.dumps(order)[:100]}")
        if order != "ascending":
            out["order"] = order
        if "aliases" in node:
            out["aliases"] = self._aliases(node["aliases"], dotted=False)
        out.update((k, v) for k, v in node.items() if k not in FIELD_RESERVED)
        return out


def _valid_default(schema: object, value: object, defs: dict[str, dict]) -> bool:
    """Whether `value` is a default Avro Java accepts for `schema` (a union's default may
    match any branch, as Avro 1.12 allows). Bounded: each step into a container also steps
    into the (depth-checked) value."""
    kind = kind_of(schema, defs)
    node = deref(schema, defs)
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind in ("int", "long"):
        bits = 31 if kind == "int" else 63
        return (isinstance(value, int) and not isinstance(value, bool)
                and -(1 << bits) <= value < (1 << bits))
    if kind in ("float", "double"):
        return (isinstance(value, int | float) and not isinstance(value, bool)
                or value in ("NaN", "Infinity", "-Infinity"))
    if kind in ("string", "bytes", "enum", "fixed"):
        return isinstance(value, str)
    if kind == "array":
        return isinstance(value, list) and all(_valid_default(node["items"], v, defs)
                                               for v in value)
    if kind == "map":
        return isinstance(value, dict) and all(_valid_default(node["values"], v, defs)
                                               for v in value.values())
    if kind == "union":
        return any(_valid_default(branch, value, defs) for branch in node)
    if kind in ("record", "error"):
        return isinstance(value, dict) and all(
            _valid_default(f["type"], value[f["name"]], defs) if f["name"] in value
            else "default" in f for f in node.get("fields", ()))  # (): a record in definition
    return False


def _expand(root: object, defs: dict[str, dict], ref_names: frozenset[str]) -> object:
    """`root` with each referenced type's definition written in place of its first use."""
    if not ref_names:
        return root
    written: set[str] = set()

    def walk(node: object, depth: int) -> object:
        if depth > 2 * MAX_DEPTH:
            raise SchemaError(f"invalid Avro schema: types (with references) nested deeper "
                              f"than {2 * MAX_DEPTH}")
        if isinstance(node, str):
            if node in PRIMITIVES or node in written or node not in ref_names:
                return node
            node = defs[node]
        if isinstance(node, list):
            return [walk(branch, depth + 1) for branch in node]
        if node["type"] in NAMED:
            if node["name"] in written:
                return node["name"]
            written.add(node["name"])
        out = dict(node)
        if "fields" in node:
            out["fields"] = [{**f, "type": walk(f["type"], depth + 1)} for f in node["fields"]]
        for key in ("items", "values"):
            if key in node:
                out[key] = walk(node[key], depth + 1)
        return out

    return walk(root, 1)


