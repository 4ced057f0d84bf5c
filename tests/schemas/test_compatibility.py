"""Compatibility levels over real schema changes, as Confluent's schema evolution table has
them: BACKWARD allows deleting fields and adding optional ones, FORWARD adding fields and
deleting optional ones, FULL only optional ones either way, NONE anything; the _TRANSITIVE
forms hold against every earlier version, the others against the latest only."""

import json

import pytest

from strom.schemas import json_schema
from strom.schemas.parsed import Compatibility, compatibility_errors, parse

B, BT = Compatibility.BACKWARD, Compatibility.BACKWARD_TRANSITIVE
F, FT = Compatibility.FORWARD, Compatibility.FORWARD_TRANSITIVE
FU, FUT = Compatibility.FULL, Compatibility.FULL_TRANSITIVE
NONE = Compatibility.NONE
ALL = (B, BT, F, FT, FU, FUT, NONE)


def record(*fields, name="User"):
    return parse("AVRO", json.dumps({"type": "record", "name": name, "namespace": "com.acme",
                                     "fields": list(fields)}))


ID = {"name": "id", "type": "int"}
NAME = {"name": "name", "type": "string"}
NAME_OPTIONAL = {"name": "name", "type": "string", "default": ""}

# (change, old fields, new fields, levels that allow it)
AVRO_CHANGES = [
    ("add a field with a default", [ID], [ID, NAME_OPTIONAL], {B, BT, F, FT, FU, FUT}),
    ("add a field without a default", [ID], [ID, NAME], {F, FT}),
    ("delete a field with a default", [ID, NAME_OPTIONAL], [ID], {B, BT, F, FT, FU, FUT}),
    ("delete a field without a default", [ID, NAME], [ID], {B, BT}),
    ("promote int to long", [ID], [{"name": "id", "type": "long"}], {B, BT}),
    ("narrow long to int", [{"name": "id", "type": "long"}], [ID], {F, FT}),
    ("change int to string", [ID], [{"name": "id", "type": "string"}], set()),
    ("string to bytes", [NAME], [{"name": "name", "type": "bytes"}], {B, BT, F, FT, FU, FUT}),
    ("make a field nullable", [NAME], [{"name": "name", "type": ["null", "string"]}], {B, BT}),
    ("rename a field, keeping the old name as alias", [NAME],
     [{"name": "full_name", "type": "string", "aliases": ["name"]}], {B, BT}),
]


@pytest.mark.parametrize("change, old, new, allowed", AVRO_CHANGES, ids=[c[0] for c in AVRO_CHANGES])
@pytest.mark.parametrize("level", ALL, ids=str)
def test_avro_schema_evolution_table(change, old, new, allowed, level):
    errors = compatibility_errors(level, record(*new), [record(*old)])
    if level in allowed or level is NONE:
        assert errors == []
    else:
        assert errors, f"{change} should be refused under {level}"


def test_avro_errors_name_the_incompatibility_and_where():
    [error] = compatibility_errors(B, record(ID, NAME), [record(ID)])
    assert error.startswith("{errorType:'READER_FIELD_MISSING_DEFAULT_VALUE'")
    assert "'/fields/1'" in error and "additionalInfo:'name'" in error
    [error] = compatibility_errors(B, record({"name": "id", "type": "string"}), [record(ID)])
    assert "TYPE_MISMATCH" in error and "'/fields/0/type'" in error
    assert "reader type: STRING not compatible with writer type: INT" in error
    [error] = compatibility_errors(B, record(ID, name="Person"), [record(ID)])
    assert "NAME_MISMATCH" in error and "expected: com.acme.User" in error


def test_avro_enum_union_and_fixed_changes():
    def enum(*symbols, default=None):
        kind = {"type": "enum", "name": "Kind", "symbols": list(symbols)}
        if default:
            kind["default"] = default
        return record({"name": "kind", "type": kind})

    # a reader without a writer's symbol cannot read it, unless it has an enum default
    [error] = compatibility_errors(B, enum("A"), [enum("A", "B", "C")])
    assert "MISSING_ENUM_SYMBOLS" in error and "[B, C]" in error and "/fields/0/type/symbols" in error
    assert compatibility_errors(B, enum("A", default="A"), [enum("A", "B")]) == []
    assert compatibility_errors(B, enum("A", "B"), [enum("A")]) == []

    wide = record({"name": "v", "type": ["null", "int", "string"]})
    narrow = record({"name": "v", "type": ["null", "int"]})
    [error] = compatibility_errors(B, narrow, [wide])
    assert "MISSING_UNION_BRANCH" in error and "/fields/0/type/2" in error
    assert compatibility_errors(F, narrow, [wide]) == []

    def fixed(size):
        return record({"name": "f", "type": {"type": "fixed", "name": "F", "size": size}})

    [error] = compatibility_errors(B, fixed(4), [fixed(8)])
    assert "FIXED_SIZE_MISMATCH" in error and "expected: 8, found: 4" in error


def test_avro_recursive_types_compare():
    def node(*extra):
        return parse("AVRO", json.dumps({"type": "record", "name": "Node", "fields": [
            {"name": "next", "type": ["null", "Node"]}, *extra]}))

    assert compatibility_errors(FU, node(NAME_OPTIONAL), [node()]) == []
    [error] = compatibility_errors(B, node(NAME), [node()])
    assert "READER_FIELD_MISSING_DEFAULT_VALUE" in error


def test_transitive_levels_check_every_earlier_version():
    # v1 has no name; v2 adds it with a default; v3 drops the default. v3 reads v2's data
    # but not v1's: BACKWARD (latest only) allows it, BACKWARD_TRANSITIVE does not.
    v1, v2, v3 = record(ID), record(ID, NAME_OPTIONAL), record(ID, NAME)
    assert compatibility_errors(B, v3, [v1, v2]) == []
    assert compatibility_errors(FU, v3, [v1, v2]) == []
    assert compatibility_errors(BT, v3, [v1, v2])
    assert compatibility_errors(FUT, v3, [v1, v2])
    # forward: v1 with a field v2 deletes... v3 (without name) is read by v2 (name
    # defaulted) but not by v1 (name required)
    w1, w2, w3 = record(ID, NAME), record(ID, NAME_OPTIONAL), record(ID)
    assert compatibility_errors(F, w3, [w1, w2]) == []
    assert compatibility_errors(FT, w3, [w1, w2])
    assert compatibility_errors(NONE, w3, [w1, w2]) == []


def test_first_version_is_compatible_with_nothing_before_it():
    for level in ALL:
        assert compatibility_errors(level, record(ID), []) == []


def test_different_schema_types_are_incompatible():
    json_schema = parse("JSON", '{"type": "object"}')
    assert compatibility_errors(B, record(ID), [json_schema])


# -- JSON Schema ---------------------------------------------------------------------------

def obj(properties, required=(), closed=False, **more):
    schema = {"type": "object", "properties": properties, **more}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return parse("JSON", json.dumps(schema))


def js(schema):
    return parse("JSON", json.dumps(schema))


A = {"a": {"type": "string"}}
AB = {"a": {"type": "string"}, "b": {"type": "integer"}}
AB_DEFAULT = {"a": {"type": "string"}, "b": {"type": "integer", "default": 0}}

# (change, old, new, levels that allow it): Confluent's content-model rules make adding a
# property to an open object (any other property allowed, with any value) unsafe for readers
# and removing one from a closed object (additionalProperties false) unsafe too.
JSON_CHANGES = [
    ("add an optional property to an open model", obj(A), obj(AB), {F, FT}),
    ("remove a property from an open model", obj(AB), obj(A), {B, BT}),
    ("add an optional property to a closed model", obj(A, closed=True), obj(AB, closed=True),
     {B, BT}),
    ("remove a property from a closed model", obj(AB, closed=True), obj(A, closed=True), {F, FT}),
    ("add a required property to a closed model", obj(A, closed=True),
     obj(AB, ["b"], closed=True), set()),
    ("add a required property with a default to a closed model", obj(A, closed=True),
     obj(AB_DEFAULT, ["b"], closed=True), {B, BT}),
    ("require an existing property", obj(A), obj(A, ["a"]), {F, FT}),
    ("open a closed model", obj(A, closed=True), obj(A), {B, BT}),
    ("make a string nullable", js({"type": "string"}), js({"type": ["string", "null"]}), {B, BT}),
    ("integer to number", js({"type": "integer"}), js({"type": "number"}), {B, BT}),
    ("string to integer", js({"type": "string"}), js({"type": "integer"}), set()),
    ("lower maxLength", js({"type": "string", "maxLength": 50}),
     js({"type": "string", "maxLength": 20}), {F, FT}),
    ("add a minimum", js({"type": "number"}), js({"type": "number", "minimum": 0}), {F, FT}),
    ("add a pattern", js({"type": "string"}), js({"type": "string", "pattern": "^a"}), {F, FT}),
    ("extend an enum", js({"enum": ["a", "b"]}), js({"enum": ["a", "b", "c"]}), {B, BT}),
    ("change array items", js({"type": "array", "items": {"type": "string"}}),
     js({"type": "array", "items": {"type": "integer"}}), set()),
    ("add a oneOf branch", js({"oneOf": [{"type": "string"}, {"type": "integer"}]}),
     js({"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "boolean"}]}), {B, BT}),
    ("change a description only", js({"type": "string", "description": "x"}),
     js({"type": "string", "description": "y"}), {B, BT, F, FT, FU, FUT}),
]


@pytest.mark.parametrize("change, old, new, allowed", JSON_CHANGES, ids=[c[0] for c in JSON_CHANGES])
@pytest.mark.parametrize("level", ALL, ids=str)
def test_json_schema_evolution_table(change, old, new, allowed, level):
    errors = compatibility_errors(level, new, [old])
    if level in allowed or level is NONE:
        assert errors == []
    else:
        assert errors, f"{change} should be refused under {level}"


def test_json_errors_use_confluents_difference_types_and_paths():
    [error] = compatibility_errors(B, obj(A, closed=True), [obj(AB, closed=True)])
    assert error.startswith('{errorType:"PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL"')
    assert "'#/properties/b'" in error
    errors = compatibility_errors(B, obj(AB, ["b"], closed=True), [obj(A, closed=True)])
    kinds = {e.split('"')[1] for e in errors}
    assert kinds == {"REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL", "REQUIRED_ATTRIBUTE_ADDED"}
    [error] = compatibility_errors(B, js({"type": "integer"}), [js({"type": "string"})])
    assert 'errorType:"TYPE_CHANGED"' in error and "'#/'" in error
    [error] = compatibility_errors(F, js({"enum": ["a", "b", "c"]}), [js({"enum": ["a", "b"]})])
    assert 'errorType:"ENUM_ARRAY_NARROWED"' in error


def test_json_nested_and_referenced_properties_are_compared():
    old = js({"type": "object", "properties": {"inner": {"$ref": "#/definitions/inner"}},
              "definitions": {"inner": {"type": "object", "properties": A,
                                        "additionalProperties": False}}})
    new = js({"type": "object", "properties": {"inner": {"type": "object", "properties": {},
                                                         "additionalProperties": False}}})
    [error] = compatibility_errors(B, new, [old])
    assert "PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL" in error
    assert "'#/properties/inner/properties/a'" in error


def test_json_partially_open_models_check_the_covering_schema():
    partial = {"additionalProperties": {"type": "string"}}
    # b (an integer) added where other properties had to be strings: old data had a string b
    errors = compatibility_errors(B, obj(AB, **partial), [obj(A, **partial)])
    assert any("PROPERTY_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL" in e for e in errors)
    wider = {"a": {"type": "string"}, "b": {"type": "string", "maxLength": 3}}
    assert compatibility_errors(F, obj(wider, **partial), [obj(A, **partial)]) == []


def test_json_transitive_levels_check_every_earlier_version():
    # v2 requires a with a default (allowed), v3 drops the default: v3 reads v2's data,
    # not v1's (where a may be missing)
    v1 = obj(A)
    v2 = obj({"a": {"type": "string", "default": "x"}}, ["a"])
    v3 = obj(A, ["a"])
    assert compatibility_errors(B, v2, [v1]) == []
    assert compatibility_errors(B, v3, [v1, v2]) == []
    [error] = compatibility_errors(BT, v3, [v1, v2])
    assert "REQUIRED_ATTRIBUTE_ADDED" in error


def test_json_nested_combined_schemas_are_compared_within_a_bound(monkeypatch):
    # every anyOf compares each pair of its branches: nested, the pairs multiply (a lower
    # bound here keeps the test fast; the real one is hit the same way)
    monkeypatch.setattr(json_schema, "_MAX_COMPARE_STEPS", 5_000)
    def nested(depth, kind):
        if depth == 0:
            return {"type": kind}
        return {"anyOf": [nested(depth - 1, kind) for _ in range(3)]}

    errors = compatibility_errors(B, js(nested(6, "integer")), [js(nested(6, "string"))])
    assert errors and "too complex" in errors[0]
    assert compatibility_errors(B, js(nested(2, "string")), [js(nested(2, "string"))]) == []
