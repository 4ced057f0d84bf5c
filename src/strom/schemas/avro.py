"""Avro schemas: parsed with their references, in Confluent's canonical text, checked for
reader/writer compatibility as Avro Java's SchemaCompatibility checks, values decoded and
encoded with fastavro.

Internally a schema is "resolved": the JSON with every named type's `name` made its full name
(no `namespace` left to inherit) and every use of a named type after its definition a string of
its full name. Each named type is defined once, in the schema (or referenced schema) that
declares it; `_defs` maps full names to those definitions. The canonical text, Confluent's
normalized form, the compatibility checker and fastavro's input are all written from that.
"""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Iterator, Sequence

import fastavro

from strom.schemas.loading import dependencies_first, load_json
from strom.schemas.parsed import (
    AVRO,
    MAX_DEPTH,
    ParsedSchema,
    ResolvedReference,
    SchemaError,
    compact_json,
)

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
NAMED = frozenset({"record", "error", "enum", "fixed"})
# Names Avro Java writes in full even where the namespace would allow the short form.
_TYPE_NAMES = PRIMITIVES | {"record", "enum", "array", "map", "union", "fixed"}
_SCHEMA_RESERVED = frozenset({"type", "name", "namespace", "doc", "fields", "items", "values",
                              "size", "symbols", "aliases"})
_FIELD_RESERVED = frozenset({"name", "type", "doc", "default", "order", "aliases"})
_ORDERS = ("ascending", "descending", "ignore")
# JSON nesting a schema text may have: a few levels per Avro type (record, fields, field) and
# room for defaults; it keeps every recursive walk below Python's recursion limit.
_MAX_JSON_DEPTH = 4 * MAX_DEPTH
# A value nested deeper than this (only a recursive type allows it) is refused: fastavro's
# compiled reader and writer recurse on the C stack, which a hostile payload could overflow.
MAX_VALUE_DEPTH = 500
# Items of an array or map that encode to no bytes at all cost a payload nothing, so their
# count is bounded apart from the payload's size.
MAX_EMPTY_ITEMS = 1_000_000
# Logical types Avro Java knows, with the type each annotates (others stay plain properties).
_LOGICAL = {"decimal": ("bytes", "fixed"), "uuid": ("string", "fixed"), "date": ("int",),
            "time-millis": ("int",), "time-micros": ("long",), "timestamp-millis": ("long",),
            "timestamp-micros": ("long",), "timestamp-nanos": ("long",),
            "local-timestamp-millis": ("long",), "local-timestamp-micros": ("long",),
            "local-timestamp-nanos": ("long",), "duration": ("fixed",)}


class AvroSchema(ParsedSchema):
    """A valid Avro schema, with the named types of its references."""

    schema_type = AVRO

    def __init__(self, root: object, defs: dict[str, dict], ref_names: frozenset[str],
                 references: Sequence[ResolvedReference]) -> None:
        self._root = root
        self._defs = defs
        self._ref_names = ref_names
        self._references = tuple(references)
        self._canonical = _JavaWriter(defs, set(ref_names)).write(root, None)
        self._expanded = _expand(root, defs, ref_names)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._fast = fastavro.parse_schema(self._expanded)
        except Exception as e:  # fastavro raises several kinds for one cause: a bad schema
            raise SchemaError(f"invalid Avro schema: {e}") from None
        self._empty = _guard(root, defs)

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
            raise _invalid("nested too deep") from None

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
        return _JavaWriter(self._defs, set()).write(self._expanded, None)

    def normalized(self) -> AvroSchema:
        text = _NormalWriter(self._defs, set(self._ref_names)).write(self._root)
        return type(self).parse(text, self._references)

    def read_errors(self, writer: ParsedSchema) -> list[str]:
        if not isinstance(writer, AvroSchema):
            return [f"Incompatible because of different schema type: {writer.schema_type}"]
        checker = _Checker(self._defs, writer._defs)
        try:
            checker.check(self._root, writer._root, [])
        except RecursionError:  # the depth is bounded; this is the last guard
            return [_describe("TYPE_MISMATCH", "/", "schemas nested too deep to compare")]
        return [_describe(*found) for found in dict.fromkeys(checker.found)]

    def decode(self, payload: bytes | memoryview) -> object:
        data = bytes(payload)
        if self._empty is not None:
            _Scanner(self._defs, self._empty, data).scan(self._root)
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
            _check_value_depth(value)
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

def _invalid(why: str) -> SchemaError:
    return SchemaError(f"invalid Avro schema: {why}")


def _load(text: str, what: str) -> object:
    return load_json(text, what, "an Avro schema", _MAX_JSON_DEPTH)


# -- resolving -----------------------------------------------------------------------------

def _split(full: str) -> tuple[str | None, str]:
    space, _, simple = full.rpartition(".")
    return (space or None), simple


def _check_name(name: object, what: str, dotted: bool = False) -> str:
    """`name` if Avro Java accepts it: a letter or _ then letters, digits and _ (dotted:
    parts like that joined by dots)."""
    if not isinstance(name, str):
        raise _invalid(f"{what} {json.dumps(name)[:100]} is not a string")
    for part in name.split(".") if dotted else (name,):
        if not (part and (part[0].isalpha() or part[0] == "_")
                and all(c.isalnum() or c == "_" for c in part)):
            raise _invalid(f"{what} {name!r} is not a valid Avro name")
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
        raise _invalid(f"unknown type {name!r}" + (f" (namespace {space})" if space else ""))

    def _type(self, node: object, space: str | None, depth: int) -> object:
        if depth > MAX_DEPTH:
            raise _invalid(f"types nested deeper than {MAX_DEPTH}")
        if isinstance(node, str):
            return node if node in PRIMITIVES else self._lookup(node, space)
        if isinstance(node, list):
            return self._union(node, space, depth)
        if not isinstance(node, dict):
            raise _invalid(f"{json.dumps(node)[:100]} is not a type")
        kind = node.get("type")
        if not isinstance(kind, str):
            raise _invalid(f"type {json.dumps(kind)[:100]} is not a type name")
        props = {k: v for k, v in node.items() if k not in _SCHEMA_RESERVED}
        if kind in PRIMITIVES:
            return {"type": kind, **props} if props else kind
        if kind in ("array", "map"):
            key = "items" if kind == "array" else "values"
            if key not in node:
                raise _invalid(f"{kind} without {key}")
            return {"type": kind, key: self._type(node[key], space, depth + 1), **props}
        if kind in NAMED:
            return self._named(node, kind, props, space, depth)
        return self._lookup(kind, space)  # {"type": "com.acme.Named"} names a defined type

    def _union(self, branches: list, space: str | None, depth: int) -> list:
        out = [self._type(branch, space, depth + 1) for branch in branches]
        seen: set[str] = set()
        for branch in out:
            if isinstance(branch, list):
                raise _invalid("a union directly inside a union")
            kind = _kind(branch, self.defs)
            key = kind  # named types differ by name
            if kind in NAMED:
                key = branch if isinstance(branch, str) else branch["name"]
            if key in seen:
                raise _invalid(f"union has {key} twice")
            seen.add(key)
        return out

    def _named(self, node: dict, kind: str, props: dict, space: str | None,
               depth: int) -> dict:
        name = _check_name(node.get("name"), f"{kind} name", dotted=True)
        namespace = node.get("namespace", space)
        if namespace is not None and not isinstance(namespace, str):
            raise _invalid(f"namespace {json.dumps(namespace)[:100]} is not a string")
        if namespace and "." not in name:
            _check_name(namespace, "namespace", dotted=True)
        full = self._full(name, namespace or None)
        own_space, simple = _split(full)
        if full in PRIMITIVES:  # in a namespace, n.string is a name like any other
            raise _invalid(f"a {kind} may not be named {simple}")
        if full in self.defs:
            raise _invalid(f"type {full} is defined twice")
        out: dict = {"type": kind, "name": full}
        self.defs[full] = out  # before the fields: a record may contain itself
        if isinstance(node.get("doc"), str):  # Java keeps only a text doc
            out["doc"] = node["doc"]
        if kind == "enum":
            out["symbols"] = self._symbols(node.get("symbols"), full)
            if "default" in props:
                out["default"] = props.pop("default")
                if out["default"] not in out["symbols"]:
                    raise _invalid(f"enum {full} default {json.dumps(out['default'])[:100]} "
                                   "is not one of its symbols")
        elif kind == "fixed":
            size = node.get("size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise _invalid(f"fixed {full} size {json.dumps(size)} is not a size")
            out["size"] = size
        else:
            fields = node.get("fields")
            if not isinstance(fields, list):
                raise _invalid(f"record {full} has no list of fields")
            out["fields"] = [self._field(f, own_space, depth) for f in fields]
            names = [f["name"] for f in out["fields"]]
            if len(set(names)) != len(names):
                raise _invalid(f"record {full} has a field name twice")
        if "aliases" in node:
            out["aliases"] = [self._full(a, own_space)
                              for a in self._aliases(node["aliases"], dotted=True)]
        out.update(props)
        return out

    @staticmethod
    def _symbols(symbols: object, full: str) -> list[str]:
        if not isinstance(symbols, list):
            raise _invalid(f"enum {full} has no list of symbols")
        for symbol in symbols:
            _check_name(symbol, f"enum {full} symbol")
        if len(set(symbols)) != len(symbols):
            raise _invalid(f"enum {full} has a symbol twice")
        return list(symbols)

    @staticmethod
    def _aliases(aliases: object, dotted: bool) -> list[str]:
        if not isinstance(aliases, list):
            raise _invalid(f"aliases {json.dumps(aliases)[:100]} are not a list")
        return [_check_name(a, "alias", dotted) for a in aliases]

    def _field(self, node: object, space: str | None, depth: int) -> dict:
        if not isinstance(node, dict):
            raise _invalid(f"field {json.dumps(node)[:100]} is not an object")
        name = _check_name(node.get("name"), "field name")
        if "type" not in node:
            raise _invalid(f"field {name} has no type")
        out = {"name": name, "type": self._type(node["type"], space, depth + 1)}
        if isinstance(node.get("doc"), str):  # Java keeps only a text doc
            out["doc"] = node["doc"]
        if "default" in node:
            if not _valid_default(out["type"], node["default"], self.defs):
                raise _invalid(f"invalid default for field {name}: "
                               f"{json.dumps(node['default'])[:200]}")
            out["default"] = node["default"]
        order = node.get("order", "ascending")
        order = order.lower() if isinstance(order, str) else order  # Java ignores the case
        if order not in _ORDERS:
            raise _invalid(f"field {name} order {json.dumps(order)[:100]}")
        if order != "ascending":
            out["order"] = order
        if "aliases" in node:
            out["aliases"] = self._aliases(node["aliases"], dotted=False)
        out.update((k, v) for k, v in node.items() if k not in _FIELD_RESERVED)
        return out


def _kind(node: object, defs: dict[str, dict]) -> str:
    if isinstance(node, list):
        return "union"
    if isinstance(node, str):
        return node if node in PRIMITIVES else defs[node]["type"]
    return node["type"]


def _deref(node: object, defs: dict[str, dict]) -> object:
    return defs[node] if isinstance(node, str) and node not in PRIMITIVES else node


def _valid_default(schema: object, value: object, defs: dict[str, dict]) -> bool:
    """Whether `value` is a default Avro Java accepts for `schema` (a union's default may
    match any branch, as Avro 1.12 allows). Bounded: each step into a container also steps
    into the (depth-checked) value."""
    kind = _kind(schema, defs)
    node = _deref(schema, defs)
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


# -- writing -------------------------------------------------------------------------------

class _JavaWriter:
    """Avro Java's Schema.toString(): compact, its attribute order, a named type defined at
    its first use and named (short where the namespace allows) after it. Types in `known`
    (those of the references) are only named."""

    def __init__(self, defs: dict[str, dict], known: set[str]) -> None:
        self.defs = defs
        self.known = known

    @staticmethod
    def _qualified(full: str, space: str | None) -> str:
        own, simple = _split(full)
        return simple if own is not None and own == space and simple not in _TYPE_NAMES else full

    def write(self, node: object, space: str | None) -> str:
        if isinstance(node, str):
            return compact_json(node if node in PRIMITIVES else self._qualified(node, space))
        if isinstance(node, list):
            return "[" + ",".join(self.write(branch, space) for branch in node) + "]"
        kind = node["type"]
        if kind in NAMED:
            return self._named(node, kind, space)
        parts = [f'"type":{compact_json(kind)}']
        if kind in ("array", "map"):
            key = "items" if kind == "array" else "values"
            parts.append(f'"{key}":{self.write(node[key], space)}')
        elif len(node) == 1:
            return compact_json(kind)
        parts += self._props(node, {"type", "items", "values"})
        return "{" + ",".join(parts) + "}"

    def _named(self, node: dict, kind: str, space: str | None) -> str:
        full = node["name"]
        if full in self.known:
            return compact_json(self._qualified(full, space))
        self.known.add(full)
        own, simple = _split(full)
        parts = [f'"type":{compact_json(kind)}', f'"name":{compact_json(simple)}']
        if own != space:
            parts.append(f'"namespace":{compact_json(own or "")}')
        if "doc" in node:
            parts.append(f'"doc":{compact_json(node["doc"])}')
        if kind == "enum":
            parts.append(f'"symbols":{compact_json(node["symbols"])}')
            if "default" in node:
                parts.append(f'"default":{compact_json(node["default"])}')
        elif kind == "fixed":
            parts.append(f'"size":{compact_json(node["size"])}')
        else:
            parts.append('"fields":[' + ",".join(self._field(f, own) for f in node["fields"])
                         + "]")
        parts += self._props(node, {"type", "name", "doc", "symbols", "default", "size",
                                    "fields", "aliases"})
        if node.get("aliases"):
            parts.append('"aliases":' + compact_json([self._qualified(a, own) for a in node["aliases"]]))
        return "{" + ",".join(parts) + "}"

    def _field(self, field: dict, space: str | None) -> str:
        parts = [f'"name":{compact_json(field["name"])}', f'"type":{self.write(field["type"], space)}']
        for key in ("doc", "default", "order", "aliases"):
            if key in field:
                parts.append(f'"{key}":{compact_json(field[key])}')
        parts += self._props(field, _FIELD_RESERVED)
        return "{" + ",".join(parts) + "}"

    @staticmethod
    def _props(node: dict, reserved: set[str] | frozenset[str]) -> list[str]:
        return [f"{compact_json(k)}:{compact_json(v)}" for k, v in node.items() if k not in reserved]


def _logical(node: dict, kind: str, defs: dict[str, dict]) -> dict | None:
    """The logical type Avro Java would recognize on `node` (name and decimal attributes)."""
    name = node.get("logicalType")
    if name not in _LOGICAL or kind not in _LOGICAL[name]:
        return None
    if name != "decimal":
        return {"logicalType": name}
    precision, scale = node.get("precision"), node.get("scale", 0)
    if not (isinstance(precision, int) and isinstance(scale, int) and precision > 0
            and 0 <= scale <= precision):
        return None
    return {"logicalType": name, "precision": precision, **({"scale": scale} if scale else {})}


class _NormalWriter:
    """Confluent's normalized Avro text: full names, `name` before `type`, every attribute
    in a fixed order and properties sorted; parsing it again gives the normalized schema."""

    def __init__(self, defs: dict[str, dict], known: set[str]) -> None:
        self.defs = defs
        self.known = known

    def write(self, node: object) -> str:
        if isinstance(node, str):
            return compact_json(node)
        if isinstance(node, list):
            return "[" + ",".join(map(self.write, node)) + "]"
        kind = node["type"]
        if kind in NAMED:
            return self._named(node, kind)
        parts = [f'"type":{compact_json(kind)}']
        if kind in ("array", "map"):
            key = "items" if kind == "array" else "values"
            parts.append(f'"{key}":{self.write(node[key])}')
            parts += self._sorted(node, {"type", key})
        else:
            logical = _logical(node, kind, self.defs) or {}
            parts += [f"{compact_json(k)}:{compact_json(v)}" for k, v in logical.items()]
            parts += self._sorted(node, {"type", *logical})
        return "{" + ",".join(parts) + "}" if len(parts) > 1 else compact_json(kind)

    def _named(self, node: dict, kind: str) -> str:
        full = node["name"]
        if full in self.known:
            return compact_json(full)
        self.known.add(full)
        parts = [f'"name":{compact_json(full)}', f'"type":{compact_json(kind)}']
        logical: dict = {}
        if kind == "enum":
            parts.append(f'"symbols":{compact_json(node["symbols"])}')
        elif kind == "fixed":
            parts.append(f'"size":{compact_json(node["size"])}')
            logical = _logical(node, kind, self.defs) or {}
            parts += [f"{compact_json(k)}:{compact_json(v)}" for k, v in logical.items()]
        else:
            parts.append('"fields":[' + ",".join(map(self._field, node["fields"])) + "]")
        if node.get("doc"):
            parts.append(f'"doc":{compact_json(node["doc"])}')
        if node.get("aliases"):
            parts.append(f'"aliases":{compact_json(sorted(node["aliases"]))}')
        if kind == "enum" and "default" in node:
            parts.append(f'"default":{compact_json(node["default"])}')
        parts += self._sorted(node, {"type", "name", "doc", "symbols", "default", "size",
                                     "fields", "aliases", *logical})
        return "{" + ",".join(parts) + "}"

    def _field(self, field: dict) -> str:
        parts = [f'"name":{compact_json(field["name"])}', f'"type":{self.write(field["type"])}',
                 f'"order":{compact_json(field.get("order", "ascending"))}']
        if "doc" in field:
            parts.append(f'"doc":{compact_json(field["doc"])}')
        if field.get("aliases"):
            parts.append(f'"aliases":{compact_json(sorted(field["aliases"]))}')
        if "default" in field:
            parts.append(f'"default":{compact_json(field["default"])}')
        parts += self._sorted(field, _FIELD_RESERVED)
        return "{" + ",".join(parts) + "}"

    @staticmethod
    def _sorted(node: dict, reserved: set[str] | frozenset[str]) -> list[str]:
        return [f"{compact_json(k)}:{compact_json(node[k])}" for k in sorted(node) if k not in reserved]


# -- compatibility -------------------------------------------------------------------------

_PROMOTIONS = {"long": {"int"}, "float": {"int", "long"}, "double": {"int", "long", "float"},
               "bytes": {"string"}, "string": {"bytes"}}
# Deeper than this the checker stops and reports (only chains of named types get so deep).
_MAX_CHECK_DEPTH = 6 * MAX_DEPTH  # location steps: three a level, 2 * MAX_DEPTH levels


class _Checker:
    """Whether a reader reads what a writer wrote, by Avro Java's SchemaCompatibility rules;
    `found` lists (incompatibility, location, detail) in the order met."""

    def __init__(self, reader_defs: dict[str, dict], writer_defs: dict[str, dict]) -> None:
        self.rdefs = reader_defs
        self.wdefs = writer_defs
        self.found: list[tuple[str, str, str]] = []
        self.memo: dict[tuple[int, int], list[tuple[str, str, str]]] = {}

    def check(self, reader: object, writer: object, location: list[str]) -> bool:
        reader, writer = _deref(reader, self.rdefs), _deref(writer, self.wdefs)
        if isinstance(reader, str) or isinstance(writer, str):  # a primitive: nothing to recur
            before = len(self.found)
            self._compare(reader, writer, location)
            return len(self.found) == before
        key = (id(reader), id(writer))  # every other node is its own object
        if key in self.memo:  # done, or in progress (a recursive type): compatible so far
            self.found += self.memo[key]
            return not self.memo[key]
        self.memo[key] = []
        if len(location) > _MAX_CHECK_DEPTH:
            found = [("TYPE_MISMATCH", _path(location), "schemas nested too deep to compare")]
        else:
            outer, self.found = self.found, []
            self._compare(reader, writer, location)
            found, self.found = self.found, outer
        self.memo[key] = found
        self.found += found
        return not found

    def _report(self, kind: str, location: list[str], detail: str) -> None:
        self.found.append((kind, _path(location), detail))

    def _compare(self, reader: object, writer: object, location: list[str]) -> None:
        rkind, wkind = _kind(reader, self.rdefs), _kind(writer, self.wdefs)
        if rkind == wkind or {rkind, wkind} == {"record", "error"}:
            if rkind in PRIMITIVES:
                return
            if rkind in ("array", "map"):
                key = "items" if rkind == "array" else "values"
                self.check(reader[key], writer[key], [*location, key])
            elif rkind == "union":
                for i, branch in enumerate(writer):
                    if not self._quiet(reader, branch, location):
                        self._report("MISSING_UNION_BRANCH", [*location, str(i)],
                                     f"reader union lacking writer type: "
                                     f"{_kind(branch, self.wdefs).upper()}")
            else:
                self._named(reader, writer, rkind, location)
            return
        if wkind == "union":
            for i, branch in enumerate(writer):
                self.check(reader, branch, [*location, str(i)])
        elif rkind == "union":
            if not any(self._quiet(branch, writer, location) for branch in reader):
                self._report("MISSING_UNION_BRANCH", location,
                             f"reader union lacking writer type: {wkind.upper()}")
        elif wkind not in _PROMOTIONS.get(rkind, ()):
            self._report("TYPE_MISMATCH", location, f"reader type: {rkind.upper()} not "
                         f"compatible with writer type: {wkind.upper()}")

    def _quiet(self, reader: object, writer: object, location: list[str]) -> bool:
        """Whether `writer` is readable by `reader`, without reporting why not."""
        outer = self.found
        self.found = []
        try:
            return self.check(reader, writer, location)
        finally:
            self.found = outer

    def _named(self, reader: dict, writer: dict, kind: str, location: list[str]) -> None:
        _, rsimple = _split(reader["name"])
        _, wsimple = _split(writer["name"])
        # Avro Java compares the names without their namespaces, or a reader alias
        if rsimple != wsimple and writer["name"] not in reader.get("aliases", ()):
            self._report("NAME_MISMATCH", [*location, "name"], f"expected: {writer['name']}")
        if kind == "fixed" and reader["size"] != writer["size"]:
            self._report("FIXED_SIZE_MISMATCH", [*location, "size"],
                         f"expected: {writer['size']}, found: {reader['size']}")
        elif kind == "enum":
            missing = sorted(set(writer["symbols"]) - set(reader["symbols"]))
            if missing and reader.get("default") not in reader["symbols"]:
                self._report("MISSING_ENUM_SYMBOLS", [*location, "symbols"],
                             "[" + ", ".join(missing) + "]")
        elif kind in ("record", "error"):
            by_name = {f["name"]: f for f in writer["fields"]}
            for i, field in enumerate(reader["fields"]):
                at = [*location, "fields", str(i)]
                written = next((by_name[n] for n in (field["name"], *field.get("aliases", ()))
                                if n in by_name), None)
                if written is not None:
                    self.check(field["type"], written["type"], [*at, "type"])
                elif "default" not in field:
                    self._report("READER_FIELD_MISSING_DEFAULT_VALUE", at, field["name"])


def _path(location: list[str]) -> str:
    return "/" + "/".join(location)


_DESCRIPTIONS = {
    "FIXED_SIZE_MISMATCH": "The size of FIXED type field at path '{path}' in the reader "
                           "schema does not match with the writer schema",
    "TYPE_MISMATCH": "The type (path '{path}') of a field in the reader schema does not match "
                     "with the writer schema",
    "NAME_MISMATCH": "The name of the schema has changed (path '{path}')",
    "MISSING_ENUM_SYMBOLS": "The reader schema is missing enum symbols '{info}' at path "
                            "'{path}' in the writer schema",
    "MISSING_UNION_BRANCH": "The reader schema is missing a type inside a union field at path "
                            "'{path}' in the writer schema",
    "READER_FIELD_MISSING_DEFAULT_VALUE": "The field '{info}' at path '{path}' in the reader "
                                          "schema has no default value and is missing in the "
                                          "writer schema",
}


def _describe(kind: str, path: str, info: str) -> str:
    """One incompatibility in Confluent's form (reader: the schema reading, writer: the one
    that wrote; the registry's new and old schema, by the direction of the check)."""
    description = _DESCRIPTIONS[kind].format(path=path, info=info)
    return f"{{errorType:'{kind}', description:'{description}', additionalInfo:'{info}'}}"


# -- hostile payloads ----------------------------------------------------------------------

def _guard(root: object, defs: dict[str, dict]) -> set[str] | None:
    """The records that encode to no bytes, if a payload could nest without bound (a
    recursive type) or hold items that take no bytes: then it is scanned (iteratively, with
    bounds) before fastavro reads it. None: no scan needed. Linear in the schema's size."""
    nodes = list(_walk(root, defs))
    named = {n["name"]: n for n in nodes if isinstance(n, dict) and n["type"] in NAMED}
    nesting = _nesting(root, named, defs)
    if nesting > 2 * MAX_DEPTH:
        raise _invalid(f"types nested {nesting} deep through named types (at most "
                       f"{2 * MAX_DEPTH})")
    empty = _empty_records(named, defs)
    items = [n.get("items", n.get("values")) for n in nodes
             if isinstance(n, dict) and n["type"] in ("array", "map")]
    if _has_cycle(named, defs) or any(_takes_no_bytes(i, defs, empty) for i in items):
        return empty
    return None


def _walk(root: object, defs: dict[str, dict]) -> Iterator[object]:
    """Every type node reachable from `root`, each named type once."""
    seen: set[str] = set()
    pending = [root]
    while pending:
        node = pending.pop()
        if isinstance(node, str):
            if node in PRIMITIVES or node in seen:
                continue
            seen.add(node)
            node = defs[node]
        elif isinstance(node, dict) and node["type"] in NAMED:
            if node["name"] in seen:
                continue
            seen.add(node["name"])
        yield node
        pending += _children(node)


def _children(node: object) -> list:
    if isinstance(node, list):
        return node
    if isinstance(node, dict):
        return [f["type"] for f in node.get("fields", ())] + [
            node[k] for k in ("items", "values") if k in node]
    return []


def _named_uses(node: dict) -> Iterator[str]:
    """The named types a named type's definition uses directly (down to the next name)."""
    pending = _children(node)
    while pending:
        child = pending.pop()
        if isinstance(child, str):
            if child not in PRIMITIVES:
                yield child
        elif isinstance(child, dict) and child["type"] in NAMED:
            yield child["name"]
        else:
            pending += _children(child)


def _has_cycle(named: dict[str, dict], defs: dict[str, dict]) -> bool:
    """Whether a named type contains itself (iterative depth-first search)."""
    done: set[str] = set()
    for start in named:
        if start in done:
            continue
        path = {start}
        stack = [(start, iter(_named_uses(defs[start])))]
        while stack:
            name, uses = stack[-1]
            used = next(uses, None)
            if used is None:
                stack.pop()
                path.discard(name)
                done.add(name)
            elif used in path:
                return True
            elif used not in done:
                path.add(used)
                stack.append((used, iter(_named_uses(defs[used]))))
    return False


def _nesting(root: object, named: dict[str, dict], defs: dict[str, dict]) -> int:
    """How deep a value of `root` nests, following named types (a recursive use counts as
    nothing: the scan bounds those), from the innermost named types out."""
    height: dict[str, int] = {}
    entered: set[str] = set()
    for start in named:
        stack = [(start, False)]
        while stack:
            name, inside_done = stack.pop()
            if name in height:
                continue
            if not inside_done:
                if name in entered:
                    continue
                entered.add(name)
                stack.append((name, True))
                stack += [(n, False) for n in _named_uses(defs[name]) if n not in height]
                continue
            height[name] = _height(defs[name], height, own=True)
    return _height(root, height, own=False)


def _height(node: object, height: dict[str, int], own: bool) -> int:
    """The levels below and including `node`, taking named types' heights from `height`."""
    deepest = 0
    pending = [(node, 1)]
    while pending:
        child, depth = pending.pop()
        name = child if isinstance(child, str) and child not in PRIMITIVES else (
            child["name"] if isinstance(child, dict) and child["type"] in NAMED else None)
        if name is not None and not (own and child is node):
            deepest = max(deepest, depth - 1 + height.get(name, 1))
            continue
        deepest = max(deepest, depth)
        pending += [(c, depth + 1) for c in _children(child)]
    return deepest


def _empty_records(named: dict[str, dict], defs: dict[str, dict]) -> set[str]:
    """The records whose every field encodes to no bytes (null, fixed of size 0, such a
    record), found from the inside out; a record inside itself is never empty."""
    empty: set[str] = set()
    decided: set[str] = set()
    entered: set[str] = set()  # being decided: met again, it is inside itself
    for start in named:
        stack = [(start, False)]
        while stack:
            name, inside_done = stack.pop()
            node = defs[name]
            if name in decided or node["type"] not in ("record", "error"):
                continue
            if not inside_done:
                if name in entered:
                    continue
                entered.add(name)
                stack.append((name, True))
                stack += [(n, False) for n in _named_uses(node) if n not in decided]
                continue
            decided.add(name)
            if all(_takes_no_bytes(f["type"], defs, empty) for f in node["fields"]):
                empty.add(name)
    return empty


def _takes_no_bytes(node: object, defs: dict[str, dict], empty: set[str]) -> bool:
    kind = _kind(node, defs)
    node = _deref(node, defs)
    return (kind == "null" or (kind == "fixed" and node["size"] == 0)
            or (kind in ("record", "error") and node["name"] in empty))


class _Scanner:
    """Walks a payload by the schema without building values, on an explicit stack, refusing
    nesting beyond MAX_VALUE_DEPTH and more than MAX_EMPTY_ITEMS items that take no bytes."""

    def __init__(self, defs: dict[str, dict], empty: set[str], data: bytes) -> None:
        self.defs = defs
        self.empty = empty
        self.data = data
        self.pos = 0
        self.empty_items = 0

    def _fail(self, why: str) -> SchemaError:
        return SchemaError(f"payload does not match the Avro schema: {why}")

    def _long(self) -> int:
        shift = result = 0
        while True:
            if self.pos >= len(self.data):
                raise self._fail("ends inside a number")
            byte = self.data[self.pos]
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (result >> 1) ^ -(result & 1)
            shift += 7
            if shift > 63:
                raise self._fail("a number longer than 10 bytes")

    def _skip(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.data):
            raise self._fail(f"a length of {n} at byte {self.pos} runs past the end")
        self.pos += n

    def scan(self, root: object) -> None:
        # items: (type, depth) or ("block", container type, items left in block, depth)
        pending: list[tuple] = [(root, 1)]
        while pending:
            task = pending.pop()
            if task[0] == "block":
                self._block(task, pending)
                continue
            node, depth = task
            if depth > MAX_VALUE_DEPTH:
                raise self._fail(f"values nested deeper than {MAX_VALUE_DEPTH}")
            kind = _kind(node, self.defs)
            node = _deref(node, self.defs)
            if kind in ("null",):
                continue
            if kind == "boolean":
                self._skip(1)
            elif kind in ("int", "long", "enum"):
                self._long()
            elif kind == "float":
                self._skip(4)
            elif kind == "double":
                self._skip(8)
            elif kind in ("bytes", "string"):
                self._skip(self._long())
            elif kind == "fixed":
                self._skip(node["size"])
            elif kind == "union":
                index = self._long()
                if not 0 <= index < len(node):
                    raise self._fail(f"union index {index} out of range")
                pending.append((node[index], depth + 1))
            elif kind in ("record", "error"):
                pending += [(f["type"], depth + 1) for f in reversed(node["fields"])]
            else:  # array, map
                pending.append(("block", node, 0, depth))

    def _block(self, task: tuple, pending: list[tuple]) -> None:
        _, node, left, depth = task
        item = node.get("items", node.get("values"))
        if left == 0:
            count = self._long()
            if count == 0:
                return
            if count < 0:
                count = -count
                self._long()  # the block's size in bytes
            if _takes_no_bytes(item, self.defs, self.empty):
                self.empty_items += count
                if self.empty_items > MAX_EMPTY_ITEMS:
                    raise self._fail(f"more than {MAX_EMPTY_ITEMS} items that take no bytes")
            elif count > len(self.data) - self.pos:
                raise self._fail(f"{count} items in {len(self.data) - self.pos} bytes")
            left = count
        pending.append(("block", node, left - 1, depth))
        pending.append((item, depth + 1))
        if node["type"] == "map":
            pending.append(("string", depth + 1))


def _check_value_depth(value: object) -> None:
    pending = [(value, 1)]
    while pending:
        node, depth = pending.pop()
        if depth > MAX_VALUE_DEPTH:
            raise SchemaError(f"value nested deeper than {MAX_VALUE_DEPTH}")
        if isinstance(node, dict):
            pending += [(v, depth + 1) for v in node.values()]
        elif isinstance(node, list | tuple):
            pending += [(v, depth + 1) for v in node]
