"""JSON Schema: checked against its draft's metaschema, canonical text as given (compact),
normalized with sorted keys, `$ref`s only to the references handed in, payloads as JSON."""

import json

import pytest

from strom.schemas import frame, payload_of
from strom.schemas.json_schema import MAX_JSON_DEPTH, JsonSchema
from strom.schemas.parsed import ResolvedReference, SchemaError, parse

PERSON = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Person",
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 50, "description": "naïve"},
        "age": {"type": "integer", "minimum": 0},
        "ratio": {"type": "number", "maximum": 1.5e7},
    },
    "required": ["name"],
}


def js(schema, references=()):
    return parse("JSON", schema if isinstance(schema, str) else json.dumps(schema), references)


def test_canonical_is_compact_json_with_key_order_kept():
    person = js(json.dumps(PERSON, indent=2))
    assert person.canonical == (
        '{"$schema":"http://json-schema.org/draft-07/schema#","title":"Person","type":"object",'
        '"properties":{"name":{"type":"string","maxLength":50,"description":"naïve"},'
        '"age":{"type":"integer","minimum":0},"ratio":{"type":"number","maximum":15000000.0}},'
        '"required":["name"]}')
    assert js(person.canonical).canonical == person.canonical
    assert js(json.dumps(PERSON)).canonical == person.canonical
    assert person.name == "Person"


def test_normalized_sorts_keys_at_every_level():
    reordered = {"required": ["name"], "properties": dict(reversed(PERSON["properties"].items())),
                 "type": "object", "title": "Person", "$schema": PERSON["$schema"]}
    assert js(reordered).canonical != js(PERSON).canonical
    assert js(reordered).normalized().canonical == js(PERSON).normalized().canonical
    normal = js(PERSON).normalized().canonical
    assert normal.startswith('{"$schema":')
    assert '"age":{"minimum":0,"type":"integer"}' in normal


@pytest.mark.parametrize("text, why", [
    ("{", "invalid JSON"),
    ("[1, 2]", "object or a boolean"),
    ('"string"', "object or a boolean"),
    ('{"type": "strin"}', "#/type"),
    ('{"type": "object", "properties": {"a": {"minimum": "zero"}}}', "minimum"),
    ('{"type": "object", "required": "a"}', "required"),
])
def test_invalid_schemas_are_schema_errors(text, why):
    with pytest.raises(SchemaError, match=why):
        js(text)


def test_schema_keyword_chooses_the_draft():
    # draft-04's exclusiveMaximum is a flag; from draft-06 on it is a number
    flag = {"type": "number", "maximum": 5, "exclusiveMaximum": True}
    js({"$schema": "http://json-schema.org/draft-04/schema#", **flag})
    with pytest.raises(SchemaError):
        js(flag)  # draft-07 by default
    tuple_2020 = {"$schema": "https://json-schema.org/draft/2020-12/schema",
                  "type": "array", "prefixItems": [{"type": "string"}], "items": False}
    schema = js(tuple_2020)
    assert schema.validation_errors(["a"]) == []
    assert schema.validation_errors(["a", "b"])
    js({"$schema": "https://json-schema.org/draft/2019-09/schema", "type": "string"})
    # a $schema Strom does not know is read as draft-07, as Confluent reads it
    with pytest.raises(SchemaError):
        js({"$schema": "http://example.com/my-draft", **flag})


def test_numbers_keep_the_text_they_were_written_with():
    # Confluent keeps fractions as BigDecimal: 1.50 stays 1.50, 1e3 is written 1E+3
    text = '{"type": "number", "minimum": 1.50, "maximum": 1e3, "multipleOf": 0.25}'
    schema = js(text)
    assert schema.canonical == '{"type":"number","minimum":1.50,"maximum":1E+3,"multipleOf":0.25}'
    assert schema.normalized().canonical == (
        '{"maximum":1E+3,"minimum":1.50,"multipleOf":0.25,"type":"number"}')
    assert schema.validation_errors(0.75) == ["$: 0.75 is less than the minimum of 1.5"]


CUSTOMER = ResolvedReference("customer.json", json.dumps({
    "type": "object", "properties": {"id": {"type": "integer"},
                                     "address": {"$ref": "address.json"}},
    "required": ["id"]}), references=(ResolvedReference("address.json", json.dumps({
        "type": "object", "properties": {"city": {"type": "string"}}})),))


def test_refs_resolve_through_the_references_and_theirs():
    order = js({"type": "object", "properties": {"customer": {"$ref": "customer.json"}},
                "required": ["customer"]}, [CUSTOMER])
    assert order.validation_errors({"customer": {"id": 1, "address": {"city": "Oslo"}}}) == []
    [error] = order.validation_errors({"customer": {"id": 1, "address": {"city": 5}}})
    assert "city" in error and "string" in error
    assert order.encode({"customer": {"id": 2}}) == b'{"customer":{"id":2}}'


def test_refs_resolve_against_the_schemas_own_id():
    order = js({"$id": "https://schemas.example.com/order.json", "type": "object",
                "properties": {"customer": {"$ref": "customer.json"}}}, [CUSTOMER])
    assert order.validation_errors({"customer": {"id": "x"}})


def test_a_missing_reference_is_a_schema_error_and_the_network_is_never_asked():
    with pytest.raises(SchemaError, match="customer.json"):
        js({"properties": {"c": {"$ref": "customer.json"}}})
    with pytest.raises(SchemaError, match="does not resolve"):
        js({"properties": {"c": {"$ref": "https://json-schema.org/draft-07/nothing-here"}}})
    with pytest.raises(SchemaError, match="does not resolve"):
        js({"properties": {"c": {"$ref": "#/definitions/missing"}}})


def test_a_recursive_schema_is_legal():
    tree = js({"definitions": {"node": {"type": "object", "properties": {
        "value": {"type": "integer"},
        "children": {"type": "array", "items": {"$ref": "#/definitions/node"}}}}},
        "$ref": "#/definitions/node"})
    assert tree.validation_errors({"value": 1, "children": [{"value": 2, "children": []}]}) == []
    assert tree.validation_errors({"value": 1, "children": [{"value": "two"}]})
    assert tree.read_errors(tree) == []


def test_a_10000_deep_schema_is_refused_without_recursion_error():
    deep = '{"items":' * 10_000 + "{}" + "}" * 10_000
    with pytest.raises(SchemaError, match="deeper"):
        js(deep)
    at_limit = '{"not":' * (MAX_JSON_DEPTH - 1) + "{}" + "}" * (MAX_JSON_DEPTH - 1)
    assert js(at_limit).read_errors(js(at_limit)) == []


def test_a_schema_of_a_few_megabytes_parses():
    properties = {f"field_{i}": {"type": "string", "description": "d" * 200}
                  for i in range(10_000)}
    big = json.dumps({"type": "object", "properties": properties})
    assert len(big) > 2_000_000
    schema = js(big)
    assert schema.canonical == json.dumps(json.loads(big), separators=(",", ":"))
    assert schema.read_errors(schema) == []


def test_decode_is_the_payloads_json():
    person = js(PERSON)
    assert person.decode(payload_of(frame(3, b'{"name":"ada","age":36}'))) == {
        "name": "ada", "age": 36}
    assert person.decode(b"[1]") == [1]  # decode parses; validation_errors judges


@pytest.mark.parametrize("payload", [b"", b"{", b"\xff\xfe", b'{"a":1}x', b"[" * 100_000])
def test_garbage_payloads_are_schema_errors(payload):
    with pytest.raises(SchemaError):
        js(PERSON).decode(payload)


def test_encode_checks_the_value_against_the_schema():
    person = js(PERSON)
    assert person.encode({"name": "ada", "age": 36}) == b'{"name":"ada","age":36}'
    with pytest.raises(SchemaError, match="required"):
        person.encode({"age": 36})
    with pytest.raises(SchemaError):
        person.encode({"name": "x", "ratio": float("nan")})


def test_validating_a_deep_value_is_an_error_not_a_crash():
    nested: object = 1
    for _ in range(5000):
        nested = [nested]
    tree = js({"$ref": "#/definitions/t",
               "definitions": {"t": {"anyOf": [{"type": "integer"},
                                               {"type": "array", "items": {"$ref": "#/definitions/t"}}]}}})
    assert tree.validation_errors(nested)


def test_json_schema_is_what_parse_gives():
    assert isinstance(js(True), JsonSchema)
    assert js(True).canonical == "true"


def test_decode_reads_what_confluent_kafkas_json_serializer_writes():
    registry = pytest.importorskip("confluent_kafka.schema_registry")
    serializers = pytest.importorskip("confluent_kafka.schema_registry.json_schema")
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = registry.SchemaRegistryClient.new_client({"url": "mock://strom-json"})
    serialize = serializers.JSONSerializer(json.dumps(PERSON), client)
    framed = serialize({"name": "ada", "age": 36}, SerializationContext("people", MessageField.VALUE))
    registered = client.get_latest_version("people-value").schema.schema_str
    schema = js(registered)
    assert schema.decode(payload_of(framed)) == {"name": "ada", "age": 36}
    assert schema.canonical == js(PERSON).canonical
