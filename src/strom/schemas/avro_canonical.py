"""Avro schema text written from the resolved form: Avro Java's Schema.toString() (the
canonical text Confluent stores) and Confluent's normalized text."""

from __future__ import annotations

from strom.schemas.avro_types import FIELD_RESERVED, NAMED, PRIMITIVES, split_name
from strom.schemas.parsed import compact_json

# Names Avro Java writes in full even where the namespace would allow the short form.
_TYPE_NAMES = PRIMITIVES | {"record", "enum", "array", "map", "union", "fixed"}
# Logical types Avro Java knows, with the type each annotates (others stay plain properties).
_LOGICAL = {"decimal": ("bytes", "fixed"), "uuid": ("string", "fixed"), "date": ("int",),
            "time-millis": ("int",), "time-micros": ("long",), "timestamp-millis": ("long",),
            "timestamp-micros": ("long",), "timestamp-nanos": ("long",),
            "local-timestamp-millis": ("long",), "local-timestamp-micros": ("long",),
            "local-timestamp-nanos": ("long",), "duration": ("fixed",)}


class JavaWriter:
    """Avro Java's Schema.toString(): compact, its attribute order, a named type defined at
    its first use and named (short where the namespace allows) after it. Types in `known`
    (those of the references) are only named."""

    def __init__(self, defs: dict[str, dict], known: set[str]) -> None:
        self.defs = defs
        self.known = known

    @staticmethod
    def _qualified(full: str, space: str | None) -> str:
        own, simple = split_name(full)
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
        own, simple = split_name(full)
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
        parts += self._props(field, FIELD_RESERVED)
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


class NormalWriter:
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
        parts += self._sorted(field, FIELD_RESERVED)
        return "{" + ",".join(parts) + "}"

    @staticmethod
    def _sorted(node: dict, reserved: set[str] | frozenset[str]) -> list[str]:
        return [f"{compact_json(k)}:{compact_json(node[k])}" for k in sorted(node) if k not in reserved]
