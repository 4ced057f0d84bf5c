"""JSON Schema: a schema checked against its draft's metaschema (draft-07 unless `$schema`
names another), `$ref`s resolved only through the referenced schemas the registry hands in
(never the network), and read errors by Confluent's JSON Schema compatibility rules.

Confluent's rules compare the schema that wrote (`original`) with the one that reads
(`update`) keyword by keyword and call each change by a difference type; some types are
compatible, the rest are the errors. The content model of an object decides what adding or
removing a property means: open (any other property allowed, the default) or closed
(`additionalProperties: false`), or partially open (other properties must match a schema).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from decimal import Decimal
from urllib.parse import urljoin

import jsonschema
import jsonschema.exceptions
import referencing
import referencing.exceptions
import referencing.jsonschema
from jsonschema_specifications import REGISTRY as SPECIFICATIONS

from strom.schemas.loading import dependencies_first, load_json
from strom.schemas.parsed import (
    JSON,
    MAX_DEPTH,
    ParsedSchema,
    ResolvedReference,
    SchemaError,
    compact_json,
)

# JSON nesting a schema may have: a subschema is two levels down (properties, name); the
# metaschema check recurses a few frames per level, which this keeps far from the limit.
MAX_JSON_DEPTH = 2 * MAX_DEPTH
_DRAFTS = {
    "http://json-schema.org/draft-04/schema": jsonschema.Draft4Validator,
    "http://json-schema.org/draft-06/schema": jsonschema.Draft6Validator,
    "http://json-schema.org/draft-07/schema": jsonschema.Draft7Validator,
    "https://json-schema.org/draft/2019-09/schema": jsonschema.Draft201909Validator,
    "https://json-schema.org/draft/2020-12/schema": jsonschema.Draft202012Validator,
}
_DEFAULT_DRAFT = jsonschema.Draft7Validator  # as Confluent, when a schema names none


class JsonSchema(ParsedSchema):
    """A valid JSON Schema with the schemas its `$ref`s reach."""

    schema_type = JSON

    def __init__(self, schema: dict | bool, exact: dict | bool, draft: type,
                 registry: referencing.Registry, references: Sequence[ResolvedReference]) -> None:
        self.schema = schema
        self._exact = exact  # fractions as Decimal: their text as written
        self._draft = draft
        self._registry = registry
        self._references = tuple(references)
        self._canonical = compact_json(exact)
        self._validator = draft(schema, registry=registry)

    @property
    def record_name(self) -> str | None:
        """The schema's title, as Confluent's JSON Schema serializers name a record."""
        title = self.schema.get("title") if isinstance(self.schema, dict) else None
        return title if isinstance(title, str) else None

    @classmethod
    def parse(cls, text: str, references: Sequence[ResolvedReference] = ()) -> JsonSchema:
        schema = _load(text, "schema")
        draft = _draft_of(schema)
        resources = []
        for ref in dependencies_first(references):
            contents = _load(ref.schema, f"reference {ref.name}")
            ref_draft = _draft_of(contents, draft)
            _check(contents, ref_draft, f"reference {ref.name}")
            resources.append((ref.name, _resource(contents, ref_draft)))
        base = _id_of(schema)
        if base:  # a relative reference name resolves against the schema's own $id too
            resources += [(urljoin(base, name), resource) for name, resource in resources]
        # the schema itself under its $id (or "", for the "#/..." refs of one without)
        # the metaschemas resolve too, as in any validator; nothing else but what is given
        registry = SPECIFICATIONS.with_resources([*resources, (base, _resource(schema, draft))])
        _check(schema, draft, "schema")
        try:
            registry = registry.crawl()
        except Exception as e:  # noqa: BLE001 - a malformed $id shows as anything
            raise SchemaError(f"invalid JSON Schema: {e}") from None
        exact = json.loads(text, parse_float=Decimal)  # (the text loaded already once)
        parsed = cls(schema, exact, draft, registry, references)
        parsed._check_refs()
        return parsed

    @property
    def canonical(self) -> str:
        return self._canonical

    @property
    def name(self) -> str | None:
        """The schema's title, as Confluent names a JSON Schema (record name strategies)."""
        title = self.schema.get("title") if isinstance(self.schema, dict) else None
        return title if isinstance(title, str) else None

    def normalized(self) -> JsonSchema:
        # Confluent reads the schema back with its object keys ordered, numbers as written
        return type(self).parse(compact_json(_sorted(self._exact)), self._references)

    def read_errors(self, writer: ParsedSchema) -> list[str]:
        if not isinstance(writer, JsonSchema):
            return [f"Incompatible because of different schema type: {writer.schema_type}"]
        diff = _Diff()
        try:
            diff.compare(writer._root(), self._root(), "#/", 0)
        except (_TooComplex, RecursionError):  # depth is bounded; this is the last guard
            return ['{errorType:"TYPE_CHANGED", description:"The schemas are too complex to '
                    f'compare (more than {_MAX_COMPARE_STEPS} steps)"}}']
        return [_describe(kind, path) for kind, path in dict.fromkeys(diff.found)
                if kind not in COMPATIBLE_CHANGES]

    def decode(self, payload: bytes | memoryview) -> object:
        try:
            return json.loads(bytes(payload))
        except RecursionError:
            raise SchemaError("payload is JSON nested too deep") from None
        except ValueError as e:  # also UnicodeDecodeError
            raise SchemaError(f"payload is not JSON: {e}") from None

    def validation_errors(self, value: object, limit: int = 10) -> list[str]:
        """Why `value` does not match the schema (empty: it does), at most `limit` reasons."""
        errors = []
        try:
            for error in self._validator.iter_errors(value):
                errors.append(f"{error.json_path}: {error.message}")
                if len(errors) >= limit:
                    break
        except RecursionError:
            errors.append("value nested too deep to validate")
        except referencing.exceptions.Unresolvable as e:
            errors.append(f"unresolvable $ref {e}")
        return errors

    def encode(self, value: object) -> bytes:
        """`value` as compact JSON (the payload only, without framing), after checking it
        matches the schema (as Confluent's JSON serializer does); SchemaError if not."""
        errors = self.validation_errors(value, limit=3)
        if errors:
            raise SchemaError("value does not match the JSON Schema: " + "; ".join(errors))
        try:
            return json.dumps(value, separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False).encode()
        except (TypeError, ValueError, RecursionError) as e:
            raise SchemaError(f"value is not JSON: {e}") from None

    def _root(self) -> _Node:
        return _Node(self.schema, self._registry.resolver(base_uri=_id_of(self.schema)))

    def _check_refs(self) -> None:
        """Every `$ref` of the schema resolves (a missing reference is a SchemaError now, not
        when data arrives)."""
        pending = [(self.schema, _id_of(self.schema))]
        while pending:
            node, base = pending.pop()
            if isinstance(node, dict):
                if isinstance(node.get("$id"), str):
                    base = urljoin(base, node["$id"])
                ref = node.get("$ref")
                if isinstance(ref, str):
                    try:
                        self._registry.resolver(base_uri=base).lookup(ref)
                    except referencing.exceptions.Unresolvable:
                        raise SchemaError(f"invalid JSON Schema: $ref {ref!r} does not resolve "
                                          "(a missing reference?)") from None
                    except Exception as e:  # noqa: BLE001 - a malformed pointer
                        raise SchemaError(f"invalid JSON Schema: $ref {ref!r}: {e}") from None
                pending += [(v, base) for k, v in node.items()
                            if k not in ("enum", "const", "default", "examples")]
            elif isinstance(node, list):
                pending += [(v, base) for v in node]

    def __repr__(self) -> str:
        return f"JsonSchema({self._canonical[:200]})"


# -- loading -------------------------------------------------------------------------------

def _load(text: str, what: str) -> dict | bool:
    value = load_json(text, what, "a JSON Schema", MAX_JSON_DEPTH)
    if not isinstance(value, dict | bool):
        raise SchemaError(f"{what}: a JSON Schema is an object or a boolean, not "
                          f"{type(value).__name__}")
    return value


def _sorted(value: object) -> object:
    """`value` with the keys of every object in order (bounded: the schema's depth)."""
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def _id_of(schema: object) -> str:
    if isinstance(schema, dict):
        found = schema.get("$id", schema.get("id"))
        if isinstance(found, str):
            return found
    return ""


def _draft_of(schema: object, default: type = _DEFAULT_DRAFT) -> type:
    if not isinstance(schema, dict) or "$schema" not in schema:
        return default
    named = schema["$schema"]
    # one Strom does not know is read as draft-07, as Confluent does
    return _DRAFTS.get(named.rstrip("#"), default) if isinstance(named, str) else default


def _resource(contents: object, draft: type) -> referencing.Resource:
    specification = referencing.jsonschema.specification_with(draft.META_SCHEMA["$schema"])
    return referencing.Resource.from_contents(contents, default_specification=specification)


def _check(schema: object, draft: type, what: str) -> None:
    try:
        draft.check_schema(schema)
    except jsonschema.exceptions.SchemaError as e:
        where = "/".join(map(str, e.absolute_path))
        raise SchemaError(f"{what}: invalid JSON Schema at '#/{where}': {e.message}") from None
    except RecursionError:
        raise SchemaError(f"{what}: nested too deep") from None


# -- compatibility -------------------------------------------------------------------------

# Confluent's difference types that do not break a reader (SchemaDiff.COMPATIBLE_CHANGES).
COMPATIBLE_CHANGES = frozenset({
    "ID_CHANGED", "DESCRIPTION_CHANGED", "TITLE_CHANGED", "DEFAULT_CHANGED", "SCHEMA_REMOVED",
    "TYPE_EXTENDED", "MAX_LENGTH_INCREASED", "MAX_LENGTH_REMOVED", "MIN_LENGTH_DECREASED",
    "MIN_LENGTH_REMOVED", "PATTERN_REMOVED", "MAXIMUM_INCREASED", "MAXIMUM_REMOVED",
    "MINIMUM_DECREASED", "MINIMUM_REMOVED", "EXCLUSIVE_MAXIMUM_INCREASED",
    "EXCLUSIVE_MAXIMUM_REMOVED", "EXCLUSIVE_MINIMUM_DECREASED", "EXCLUSIVE_MINIMUM_REMOVED",
    "MULTIPLE_OF_REDUCED", "MULTIPLE_OF_REMOVED", "REQUIRED_ATTRIBUTE_WITH_DEFAULT_ADDED",
    "REQUIRED_ATTRIBUTE_REMOVED", "DEPENDENCY_ARRAY_NARROWED", "DEPENDENCY_ARRAY_REMOVED",
    "DEPENDENCY_SCHEMA_REMOVED", "MAX_PROPERTIES_INCREASED", "MAX_PROPERTIES_REMOVED",
    "MIN_PROPERTIES_DECREASED", "MIN_PROPERTIES_REMOVED", "ADDITIONAL_PROPERTIES_ADDED",
    "ADDITIONAL_PROPERTIES_EXTENDED", "PROPERTY_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL",
    "REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_UNOPEN_CONTENT_MODEL",
    "OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL",
    "PROPERTY_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL",
    "PROPERTY_REMOVED_FROM_OPEN_CONTENT_MODEL",
    "PROPERTY_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
    "PROPERTY_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL", "MAX_ITEMS_INCREASED",
    "MAX_ITEMS_REMOVED", "MIN_ITEMS_DECREASED", "MIN_ITEMS_REMOVED", "UNIQUE_ITEMS_REMOVED",
    "ADDITIONAL_ITEMS_ADDED", "ADDITIONAL_ITEMS_EXTENDED",
    "ITEM_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL", "ITEM_ADDED_TO_CLOSED_CONTENT_MODEL",
    "ITEM_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL", "ITEM_REMOVED_FROM_OPEN_CONTENT_MODEL",
    "ITEM_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
    "ITEM_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL", "ENUM_ARRAY_EXTENDED",
    "COMBINED_TYPE_EXTENDED", "PRODUCT_TYPE_NARROWED", "SUM_TYPE_EXTENDED", "NOT_TYPE_NARROWED",
})

_COMBINERS = ("allOf", "anyOf", "oneOf")
_OBJECT_WORDS = ("properties", "required", "additionalProperties", "patternProperties",
                 "minProperties", "maxProperties", "dependencies", "dependentRequired",
                 "dependentSchemas", "propertyNames")
_ARRAY_WORDS = ("items", "prefixItems", "additionalItems", "minItems", "maxItems",
                "uniqueItems", "contains")
_STRING_WORDS = ("minLength", "maxLength", "pattern", "format")
_NUMBER_WORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
# What only describes a schema: with nothing else, the schema allows everything.
_ANNOTATIONS = frozenset({"$schema", "$id", "id", "title", "description", "default",
                          "examples", "$comment", "definitions", "$defs", "readOnly",
                          "writeOnly", "deprecated", "$anchor", "$dynamicAnchor"})
# Deeper than this (only $ref cycles through different pairs get so deep) the diff stops.
_MAX_COMPARE_DEPTH = 2 * MAX_DEPTH
# Subschemas compared at most in one check: combined schemas compare every pair of their
# subschemas, so nested ones grow the work exponentially with their depth.
_MAX_COMPARE_STEPS = 200_000


class _TooComplex(Exception):
    """The comparison took more than _MAX_COMPARE_STEPS steps."""


class _Node:
    """A subschema with the resolver its `$ref`s resolve with."""

    __slots__ = ("schema", "resolver")

    def __init__(self, schema: object, resolver: referencing.Resolver) -> None:
        self.schema = schema
        self.resolver = resolver

    def child(self, schema: object) -> _Node:
        resolver = self.resolver
        if isinstance(schema, dict) and isinstance(schema.get("$id"), str):
            # a subschema with its own $id is the base of the $refs inside it
            resolver = resolver.in_subresource(referencing.Resource.from_contents(
                schema, default_specification=referencing.jsonschema.DRAFT7))
        return _Node(schema, resolver)

    def deref(self) -> _Node:
        """This node, or what its `$ref` (followed through chains) points at."""
        node = self
        for _ in range(MAX_DEPTH):
            schema = node.schema
            if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str)):
                return node
            resolved = node.resolver.lookup(schema["$ref"])
            node = _Node(resolved.contents, resolved.resolver)
        raise SchemaError(f"a chain of $refs longer than {MAX_DEPTH}")


def _kind(schema: object) -> str:
    """The everit-style class of a subschema: empty (allows all), false, combined, not,
    enum, or the JSON type it constrains."""
    if schema is True or schema == {}:
        return "empty"
    if schema is False:
        return "false"
    if not isinstance(schema, dict):
        return "empty"
    combiners = [k for k in _COMBINERS if k in schema]
    if combiners:
        return "combined"
    if "not" in schema:
        return "not"
    if "enum" in schema or "const" in schema:
        return "enum"
    kind = schema.get("type")
    if isinstance(kind, list):
        return "combined" if len(kind) != 1 else _type_kind(kind[0])
    if isinstance(kind, str):
        return _type_kind(kind)
    for words, found in ((_OBJECT_WORDS, "object"), (_ARRAY_WORDS, "array"),
                         (_STRING_WORDS, "string"), (_NUMBER_WORDS, "number")):
        if any(w in schema for w in words):
            return found
    if all(k in _ANNOTATIONS for k in schema):
        return "empty"
    return "empty"


def _type_kind(name: str) -> str:
    return "number" if name == "integer" else name


def _combined(schema: dict) -> tuple[str, list]:
    """A combined schema's criterion and subschemas: a list of types is anyOf those types;
    a combiner beside other keywords is allOf the rest and the combiner."""
    combiners = [k for k in _COMBINERS if k in schema]
    if not combiners:  # "type": [..]
        rest = {k: v for k, v in schema.items() if k != "type"}
        return "anyOf", [{**rest, "type": t} for t in schema["type"]]
    rest = {k: v for k, v in schema.items() if k not in _COMBINERS and k not in _ANNOTATIONS}
    if len(combiners) == 1 and not rest:
        return combiners[0], list(schema[combiners[0]])
    return "allOf", [*([rest] if rest else []), *({k: schema[k]} for k in combiners)]


class _Diff:
    """Confluent's SchemaDiff over two schemas: `found` lists (difference type, path)."""

    def __init__(self) -> None:
        self.found: list[tuple[str, str]] = []
        self.visiting: set[tuple[int, int]] = set()
        self.steps = 0

    def add(self, kind: str, path: str) -> None:
        self.found.append((kind, path))

    def compatible(self, original: _Node, update: _Node, path: str, depth: int) -> tuple[
            bool, list[tuple[str, str]]]:
        """Whether `update` reads what `original` allows, and the differences, unrecorded."""
        outer, self.found = self.found, []
        try:
            self.compare(original, update, path, depth)
            found = self.found
        finally:
            self.found = outer
        return all(k in COMPATIBLE_CHANGES for k, _ in found), found

    def compare(self, original: _Node | None, update: _Node | None, path: str,
                depth: int) -> None:
        if original is None or update is None:
            if original is not None or update is not None:
                self.add("SCHEMA_ADDED" if original is None else "SCHEMA_REMOVED", path)
            return
        if depth > _MAX_COMPARE_DEPTH:
            self.add("TYPE_CHANGED", path)
            return
        self.steps += 1
        if self.steps > _MAX_COMPARE_STEPS:
            raise _TooComplex
        original, update = original.deref(), update.deref()
        okind, ukind = _kind(original.schema), _kind(update.schema)
        if okind != "combined" and ukind == "combined":
            criterion, subschemas = _combined(update.schema)
            if len(subschemas) == 1 or criterion in ("anyOf", "oneOf"):
                for sub in subschemas:
                    ok, found = self.compatible(original, update.child(sub), path, depth + 1)
                    if ok:
                        self.found += found
                        if len(subschemas) > 1:
                            self.add("SUM_TYPE_EXTENDED", path)
                        return
        elif okind == "combined" and ukind != "combined":
            criterion, subschemas = _combined(original.schema)
            if len(subschemas) == 1:
                ok, found = self.compatible(original.child(subschemas[0]), update, path,
                                            depth + 1)
                if ok:
                    self.found += found
                    return
        if okind != ukind:
            if okind == "false" or ukind == "empty":
                return
            self.add("TYPE_CHANGED", path)
            return
        key = (id(original.schema), id(update.schema))
        if key in self.visiting:  # a recursive schema: this pair is being compared already
            return
        self.visiting.add(key)
        try:
            o, u = original.schema, update.schema
            if isinstance(o, dict) and isinstance(u, dict):
                for word, change in (("$id", "ID_CHANGED"), ("title", "TITLE_CHANGED"),
                                     ("description", "DESCRIPTION_CHANGED"),
                                     ("default", "DEFAULT_CHANGED")):
                    if o.get(word) != u.get(word):
                        self.add(change, path)
            compare_kind = getattr(self, f"_{okind}", None)
            if compare_kind is not None:
                compare_kind(original, update, path, depth + 1)
        finally:
            self.visiting.discard(key)

    # -- per kind ---------------------------------------------------------------------------

    def _bound(self, o: dict, u: dict, word: str, name: str, path: str) -> None:
        """A numeric keyword: added, removed, increased or decreased."""
        before, after = o.get(word), u.get(word)
        if isinstance(before, bool) or isinstance(after, bool):  # draft-04 exclusive flags
            before, after = (before or None), (after or None)
            if before == after:
                return
        if before == after:
            return
        if before is None:
            self.add(f"{name}_ADDED", path)
        elif after is None:
            self.add(f"{name}_REMOVED", path)
        elif isinstance(before, int | float) and isinstance(after, int | float):
            self.add(f"{name}_INCREASED" if after > before else f"{name}_DECREASED", path)

    def _string(self, original: _Node, update: _Node, path: str, depth: int) -> None:
        o, u = original.schema, update.schema
        self._bound(o, u, "maxLength", "MAX_LENGTH", path)
        self._bound(o, u, "minLength", "MIN_LENGTH", path)
        if o.get("pattern") != u.get("pattern"):
            self.add("PATTERN_ADDED" if "pattern" not in o else
                     "PATTERN_REMOVED" if "pattern" not in u else "PATTERN_CHANGED", path)

    def _number(self, original: _Node, update: _Node, path: str, depth: int) -> None:
        o, u = original.schema, update.schema
        o_integer, u_integer = o.get("type") == "integer", u.get("type") == "integer"
        if o_integer != u_integer:
            self.add("TYPE_EXTENDED" if o_integer else "TYPE_NARROWED", path)
        self._bound(o, u, "maximum", "MAXIMUM", path)
        self._bound(o, u, "minimum", "MINIMUM", path)
        self._bound(o, u, "exclusiveMaximum", "EXCLUSIVE_MAXIMUM", path)
        self._bound(o, u, "exclusiveMinimum", "EXCLUSIVE_MINIMUM", path)
        before, after = o.get("multipleOf"), u.get("multipleOf")
        if before != after:
            if before is None:
                self.add("MULTIPLE_OF_ADDED", path)
            elif after is None:
                self.add("MULTIPLE_OF_REMOVED", path)
            elif _divides(before, after):
                self.add("MULTIPLE_OF_EXPANDED", path)
            elif _divides(after, before):
                self.add("MULTIPLE_OF_REDUCED", path)
            else:
                self.add("MULTIPLE_OF_CHANGED", path)

    def _enum(self, original: _Node, update: _Node, path: str, depth: int) -> None:
        before, after = _enum_values(original.schema), _enum_values(update.schema)
        if before == after:
            return
        if all(v in after for v in before):
            self.add("ENUM_ARRAY_EXTENDED", path)
        elif all(v in before for v in after):
            self.add("ENUM_ARRAY_NARROWED", path)
        else:
            self.add("ENUM_ARRAY_CHANGED", path)

    def _not(self, original: _Node, update: _Node, path: str, depth: int) -> None:
        before, after = original.child(original.schema["not"]), update.child(update.schema["not"])
        # what `not` refuses: refusing less (the refused schema reads more) reads more
        ok, _ = self.compatible(after, before, _at(path, "not"), depth)
        if not ok or before.schema != after.schema:
            self.add("NOT_TYPE_NARROWED" if ok else "NOT_TYPE_EXTENDED", path)

    def _combined(self, original: _Node, update: _Node, path: str, depth: int) -> None:
        o_criterion, o_subs = _combined(original.schema)
        u_criterion, u_subs = _combined(update.schema)
        if o_criterion != u_criterion:
            if u_criterion == "anyOf" or (o_criterion == "allOf" and u_criterion == "oneOf"):
                self.add("COMBINED_TYPE_EXTENDED", path)
            else:
                self.add("COMBINED_TYPE_CHANGED", path)
                return
        if len(o_subs) < len(u_subs):
            self.add("PRODUCT_TYPE_EXTENDED" if u_criterion == "allOf" else "SUM_TYPE_EXTENDED",
                     path)
        elif len(o_subs) > len(u_subs):
            self.add("PRODUCT_TYPE_NARROWED" if u_criterion == "allOf" else "SUM_TYPE_NARROWED",
                     path)
        # pair each original subschema with an update one it is compatible with (a maximum
        # matching, by augmenting paths: the lists are short)
        word = u_criterion
        found: dict[tuple[int, int], list] = {}
        for i, o_sub in enumerate(o_subs):
            for j, u_sub in enumerate(u_subs):
                ok, diffs = self.compatible(original.child(o_sub), update.child(u_sub),
                                            _at(path, word, str(j)), depth)
                if ok:
                    found[i, j] = diffs
        match: dict[int, int] = {}  # update index -> original index

        def augment(i: int, seen: set[int]) -> bool:
            for j in range(len(u_subs)):
                if (i, j) in found and j not in seen:
                    seen.add(j)
                    if j not in match or augment(match[j], seen):
                        match[j] = i
                        return True
            return False

        matched = sum(augment(i, set()) for i in range(len(o_subs)))
        for j, i in match.items():
            self.found += found[i, j]
        if matched < min(len(o_subs), len(u_subs)):
            self.add("COMBINED_TYPE_SUBSCHEMAS_CHANGED", path)

    def _object(self, original: _Node, update: _Node, path: str, depth: int) -> None:
        o, u = original.schema, update.schema
        self._bound(o, u, "maxProperties", "MAX_PROPERTIES", path)
        self._bound(o, u, "minProperties", "MIN_PROPERTIES", path)
        o_permits, u_permits = _permits_additional(o), _permits_additional(u)
        if o_permits != u_permits:
            self.add("ADDITIONAL_PROPERTIES_REMOVED" if o_permits
                     else "ADDITIONAL_PROPERTIES_ADDED", path)
        o_extra, u_extra = _additional_schema(o), _additional_schema(u)
        if o_extra != u_extra and o_permits and u_permits:
            self.compare(None if o_extra is None else original.child(o_extra),
                         None if u_extra is None else update.child(u_extra),
                         _at(path, "additionalProperties"), depth)
        o_required, u_required = _required(o), _required(u)
        o_props, u_props = _properties(o), _properties(u)
        for name in sorted(set(o_required) | set(u_required)):
            if name not in o_required:
                has_default = isinstance(u_props.get(name), dict) and "default" in u_props[name]
                self.add("REQUIRED_ATTRIBUTE_WITH_DEFAULT_ADDED" if has_default
                         else "REQUIRED_ATTRIBUTE_ADDED", _at(path, "required", name))
            elif name not in u_required:
                self.add("REQUIRED_ATTRIBUTE_REMOVED", _at(path, "required", name))
        for name in sorted(set(o_props) | set(u_props)):
            at = _at(path, "properties", name)
            if name not in u_props:
                self._property_removed(original, update, name, at, depth)
            elif name not in o_props:
                self._property_added(original, update, name, at, depth)
            else:
                self.compare(original.child(o_props[name]), update.child(u_props[name]), at,
                             depth)
        self._dependencies(o, u, path)

    def _property_removed(self, original: _Node, update: _Node, name: str, at: str,
                          depth: int) -> None:
        before = original.child(_properties(original.schema)[name])
        if _open(update.schema):
            self.add("PROPERTY_REMOVED_FROM_OPEN_CONTENT_MODEL", at)
            return
        covering = _partial_schema(update.schema, name)
        if covering is not None:
            ok, found = self.compatible(before, update.child(covering), at, depth)
            self.found += found
            self.add("PROPERTY_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL" if ok else
                     "PROPERTY_REMOVED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL", at)
        elif before.schema is False:
            self.add("PROPERTY_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL", at)
        else:
            self.add("PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL", at)

    def _property_added(self, original: _Node, update: _Node, name: str, at: str,
                        depth: int) -> None:
        after_schema = _properties(update.schema)[name]
        required = name in _required(update.schema)
        has_default = isinstance(after_schema, dict) and "default" in after_schema
        if _open(original.schema):
            if _kind(after_schema) == "empty":
                self.add("PROPERTY_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL", at)
            elif required:
                self.add("REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_OPEN_CONTENT_MODEL"
                         if has_default else "REQUIRED_PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL", at)
            else:
                self.add("OPTIONAL_PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL", at)
            return
        covering = _partial_schema(original.schema, name)
        if covering is not None:
            ok, found = self.compatible(original.child(covering), update.child(after_schema),
                                        at, depth)
            self.found += found
            self.add("PROPERTY_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL" if ok else
                     "PROPERTY_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL", at)
        if required:
            self.add("REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_UNOPEN_CONTENT_MODEL"
                     if has_default else "REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL", at)
        else:
            self.add("OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL", at)

    def _dependencies(self, o: dict, u: dict, path: str) -> None:
        before = {k: v for k, v in _dict(o.get("dependencies")).items() if isinstance(v, list)}
        before.update(_dict(o.get("dependentRequired")))
        after = {k: v for k, v in _dict(u.get("dependencies")).items() if isinstance(v, list)}
        after.update(_dict(u.get("dependentRequired")))
        for name in sorted(set(before) | set(after)):
            at = _at(path, "dependencies", name)
            if name not in after:
                self.add("DEPENDENCY_ARRAY_REMOVED", at)
            elif name not in before:
                self.add("DEPENDENCY_ARRAY_ADDED", at)
            elif set(before[name]) != set(after[name]):
                self.add("DEPENDENCY_ARRAY_NARROWED" if set(after[name]) < set(before[name])
                         else "DEPENDENCY_ARRAY_EXTENDED" if set(after[name]) > set(before[name])
                         else "DEPENDENCY_ARRAY_CHANGED", at)

    def _array(self, original: _Node, update: _Node, path: str, depth: int) -> None:
        o, u = original.schema, update.schema
        self._bound(o, u, "maxItems", "MAX_ITEMS", path)
        self._bound(o, u, "minItems", "MIN_ITEMS", path)
        if bool(o.get("uniqueItems")) != bool(u.get("uniqueItems")):
            self.add("UNIQUE_ITEMS_ADDED" if u.get("uniqueItems") else "UNIQUE_ITEMS_REMOVED",
                     path)
        o_items, u_items = _item_schemas(o), _item_schemas(u)
        if isinstance(o_items, list) or isinstance(u_items, list):
            self._tuple(original, update, o_items, u_items, path, depth)
        elif o_items != u_items:
            self.compare(None if o_items is None else original.child(o_items),
                         None if u_items is None else update.child(u_items), _at(path, "items"),
                         depth)

    def _tuple(self, original: _Node, update: _Node, o_items: object, u_items: object,
               path: str, depth: int) -> None:
        o_list = o_items if isinstance(o_items, list) else []
        u_list = u_items if isinstance(u_items, list) else []
        o_extra, u_extra = _extra_items(original.schema), _extra_items(update.schema)
        for i in range(max(len(o_list), len(u_list))):
            at = _at(path, "items", str(i))
            if i >= len(u_list):  # the item is removed from the update
                if u_extra is True:
                    self.add("ITEM_REMOVED_FROM_OPEN_CONTENT_MODEL", at)
                elif u_extra is False:
                    self.add("ITEM_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL"
                             if o_list[i] is False else "ITEM_REMOVED_FROM_CLOSED_CONTENT_MODEL",
                             at)
                else:
                    ok, found = self.compatible(original.child(o_list[i]), update.child(u_extra),
                                                at, depth)
                    self.found += found
                    self.add("ITEM_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL" if ok
                             else "ITEM_REMOVED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL", at)
            elif i >= len(o_list):  # the item is added in the update
                if o_extra is True:
                    self.add("ITEM_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL"
                             if _kind(u_list[i]) == "empty" else "ITEM_ADDED_TO_OPEN_CONTENT_MODEL",
                             at)
                elif o_extra is False:
                    self.add("ITEM_ADDED_TO_CLOSED_CONTENT_MODEL", at)
                else:
                    ok, found = self.compatible(original.child(o_extra), update.child(u_list[i]),
                                                at, depth)
                    self.found += found
                    self.add("ITEM_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL" if ok
                             else "ITEM_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL", at)
            else:
                self.compare(original.child(o_list[i]), update.child(u_list[i]), at, depth)
        if (o_extra is not False) != (u_extra is not False):
            self.add("ADDITIONAL_ITEMS_REMOVED" if u_extra is False else "ADDITIONAL_ITEMS_ADDED",
                     path)
        elif o_extra not in (True, False) or u_extra not in (True, False):
            if o_extra != u_extra:
                self.compare(original.child(o_extra), update.child(u_extra),
                             _at(path, "additionalItems"), depth)


def _at(path: str, *parts: str) -> str:
    """A JSON pointer path one or more steps below `path` ("#/" is the root)."""
    return path.rstrip("/") + "/" + "/".join(parts)


def _divides(a: float, b: float) -> bool:
    """Whether `b` is a multiple of `a`."""
    if a == 0:
        return False
    quotient = b / a
    return math.isfinite(quotient) and abs(quotient - round(quotient)) < 1e-9


def _dict(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def _enum_values(schema: dict) -> list:
    if "const" in schema:
        return [schema["const"]]
    return list(schema["enum"]) if isinstance(schema.get("enum"), list) else []


def _properties(schema: dict) -> dict:
    return _dict(schema.get("properties"))


def _required(schema: dict) -> list:
    required = schema.get("required")
    return [r for r in required if isinstance(r, str)] if isinstance(required, list) else []


def _permits_additional(schema: dict) -> bool:
    return schema.get("additionalProperties", True) is not False


def _additional_schema(schema: dict) -> object:
    extra = schema.get("additionalProperties")
    return None if isinstance(extra, bool) else extra


def _open(schema: dict) -> bool:
    """An open content model: any property not named is allowed, whatever its value."""
    extra = schema.get("additionalProperties", True)
    return not schema.get("patternProperties") and (extra is True or extra == {})


def _partial_schema(schema: dict, name: str) -> object:
    """The schema a property not named must match in a partially open content model."""
    for pattern, sub in _dict(schema.get("patternProperties")).items():
        try:
            if re.search(pattern, name):
                return sub
        except re.error:
            continue
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) and extra != {} else None


def _item_schemas(schema: dict) -> object:
    """The single schema every item matches, or the list of positional item schemas."""
    if isinstance(schema.get("prefixItems"), list):
        return schema["prefixItems"]
    return schema.get("items")


def _extra_items(schema: dict) -> object:
    """What items past the positional ones must match: True (anything), False (none
    allowed) or a schema."""
    if isinstance(schema.get("prefixItems"), list):
        extra = schema.get("items", True)
    else:
        extra = schema.get("additionalItems", True)
    return True if extra == {} else extra


# Confluent's groups of difference types, each described one way.
_KEYWORD_ADDED = frozenset({
    "MAXIMUM_ADDED", "MINIMUM_ADDED", "EXCLUSIVE_MAXIMUM_ADDED", "EXCLUSIVE_MINIMUM_ADDED",
    "MULTIPLE_OF_ADDED", "MAX_LENGTH_ADDED", "MIN_LENGTH_ADDED", "PATTERN_ADDED",
    "REQUIRED_ATTRIBUTE_ADDED", "MAX_PROPERTIES_ADDED", "MIN_PROPERTIES_ADDED",
    "DEPENDENCY_ARRAY_ADDED", "DEPENDENCY_SCHEMA_ADDED", "MAX_ITEMS_ADDED", "MIN_ITEMS_ADDED",
    "UNIQUE_ITEMS_ADDED", "ADDITIONAL_ITEMS_REMOVED", "ADDITIONAL_PROPERTIES_REMOVED"})
_VALUE_INCREASED = frozenset({"MIN_LENGTH_INCREASED", "MINIMUM_INCREASED",
                              "EXCLUSIVE_MINIMUM_INCREASED", "MIN_PROPERTIES_INCREASED",
                              "MULTIPLE_OF_EXPANDED", "MIN_ITEMS_INCREASED"})
_VALUE_DECREASED = frozenset({"MAX_LENGTH_DECREASED", "MAXIMUM_DECREASED", "MAX_ITEMS_DECREASED",
                              "EXCLUSIVE_MAXIMUM_DECREASED", "MAX_PROPERTIES_DECREASED"})
_VALUE_CHANGED = frozenset({"PATTERN_CHANGED", "MULTIPLE_OF_CHANGED", "DEPENDENCY_ARRAY_CHANGED"})
_FEWER = frozenset({"ENUM_ARRAY_NARROWED", "SUM_TYPE_NARROWED", "ADDITIONAL_ITEMS_NARROWED",
                    "ADDITIONAL_PROPERTIES_NARROWED"})
_MORE = frozenset({"DEPENDENCY_ARRAY_EXTENDED", "PRODUCT_TYPE_EXTENDED", "SUM_TYPE_EXTENDED",
                   "NOT_TYPE_EXTENDED"})
_TYPE = frozenset({"TYPE_CHANGED", "TYPE_NARROWED", "COMBINED_TYPE_CHANGED",
                   "COMBINED_TYPE_SUBSCHEMAS_CHANGED", "ENUM_ARRAY_CHANGED"})
_ADDED_TO_OPEN = frozenset({"REQUIRED_PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL",
                            "REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_OPEN_CONTENT_MODEL",
                            "OPTIONAL_PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL",
                            "ITEM_ADDED_TO_OPEN_CONTENT_MODEL"})


def _describe(kind: str, path: str) -> str:
    """One difference in Confluent's form (reader: the schema reading, writer: the one that
    wrote; the registry's new and old schema, by the direction of the check)."""
    return f'{{errorType:"{kind}", description:"{_description(kind, path)}"}}'


def _description(kind: str, at: str) -> str:  # noqa: PLR0911 - one sentence per group
    if kind in _KEYWORD_ADDED:
        return f"The keyword at path '{at}' in the reader schema is not present in the writer schema"
    if kind in _VALUE_INCREASED:
        return f"The value at path '{at}' in the reader schema is more than its value in the writer schema"
    if kind in _VALUE_DECREASED:
        return f"The value at path '{at}' in the reader schema is less than its value in the writer schema"
    if kind in _VALUE_CHANGED:
        return f"The value at path '{at}' is different between the reader and writer schema"
    if kind in _FEWER:
        return (f"An array or combined type at path '{at}' has fewer elements in the reader "
                "schema than the writer schema")
    if kind in _MORE:
        return (f"An array or combined type at path '{at}' has more elements in the reader "
                "schema than the writer schema")
    if kind in _TYPE:
        return f"A type at path '{at}' is different between the reader schema and the writer schema"
    if kind in _ADDED_TO_OPEN:
        return (f"The reader schema has an open content model and has a property or item at "
                f"path '{at}' which is missing in the writer schema")
    if kind == "REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL":
        return (f"The reader schema has an unopen content model and has a required property at "
                f"path '{at}' which is missing in the writer schema")
    if kind in ("PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL",
                "ITEM_REMOVED_FROM_CLOSED_CONTENT_MODEL"):
        return (f"The reader schema has a closed content model and is missing a property or "
                f"item present at path '{at}' in the writer schema")
    if kind.endswith("REMOVED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL"):
        return (f"A property or item is missing in the reader schema but present at path "
                f"'{at}' in the writer schema and is not covered by its partially open "
                "content model")
    if kind.endswith("ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL"):
        return (f"The reader schema has a property or item at path '{at}' which is missing "
                "in the writer schema and is not covered by its partially open content model")
    return f"The schema at path '{at}' changed in the reader schema ({kind})"
