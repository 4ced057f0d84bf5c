"""What the Avro modules share: the type names, and a resolved type's kind and definition
(strom.schemas.avro describes the resolved form)."""

from __future__ import annotations

from strom.schemas.parsed import SchemaError

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
NAMED = frozenset({"record", "error", "enum", "fixed"})
FIELD_RESERVED = frozenset({"name", "type", "doc", "default", "order", "aliases"})


def invalid(why: str) -> SchemaError:
    return SchemaError(f"invalid Avro schema: {why}")


def split_name(full: str) -> tuple[str | None, str]:
    """A full name's namespace (None: the null namespace) and simple name."""
    space, _, simple = full.rpartition(".")
    return (space or None), simple


def kind_of(node: object, defs: dict[str, dict]) -> str:
    """The type of a resolved node: a primitive, a named type's kind, array, map or union."""
    if isinstance(node, list):
        return "union"
    if isinstance(node, str):
        return node if node in PRIMITIVES else defs[node]["type"]
    return node["type"]


def deref(node: object, defs: dict[str, dict]) -> object:
    """A named type's definition for its name; any other node as it is."""
    return defs[node] if isinstance(node, str) and node not in PRIMITIVES else node
