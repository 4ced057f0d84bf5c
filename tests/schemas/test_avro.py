"""Avro schemas: parsing with references, Avro Java's canonical text, Confluent's normalized
form, decoding and encoding payloads, and hostile input that must end in SchemaError."""

import io
import json
import random

import fastavro
import pytest

from strom.schemas import frame, payload_of
from strom.schemas.avro import AvroSchema
from strom.schemas.avro_values import MAX_VALUE_DEPTH
from strom.schemas.parsed import MAX_DEPTH, ResolvedReference, SchemaError, parse

USER = {
    "type": "record", "name": "User", "namespace": "com.acme",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": ["null", "string"], "default": None},
        {"name": "address", "type": {"type": "record", "name": "Address",
                                     "fields": [{"name": "city", "type": "string"}]}},
        {"name": "previous", "type": ["null", "Address"], "default": None, "doc": "moved from"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "namespace": "com.acme.kinds",
                                  "symbols": ["PERSON", "ROBOT"]}},
        {"name": "since", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}
USER_VALUE = {"id": 7, "name": "ada", "address": {"city": "Oslo"}, "previous": None,
              "kind": "ROBOT", "since": 1_700_000_000_000}


def avro(schema, references=()):
    return parse("AVRO", schema if isinstance(schema, str) else json.dumps(schema), references)


# -- canonical text ------------------------------------------------------------------------

def test_canonical_is_avro_javas_compact_form():
    # Java's Schema.toString(): type, name, namespace only where it changes, doc after type,
    # default after doc, a named type written out once and named (short) after that
    assert avro(USER).canonical == (
        '{"type":"record","name":"User","namespace":"com.acme","fields":['
        '{"name":"id","type":"long"},'
        '{"name":"name","type":["null","string"],"default":null},'
        '{"name":"address","type":{"type":"record","name":"Address","fields":'
        '[{"name":"city","type":"string"}]}},'
        '{"name":"previous","type":["null","Address"],"doc":"moved from","default":null},'
        '{"name":"kind","type":{"type":"enum","name":"Kind","namespace":"com.acme.kinds",'
        '"symbols":["PERSON","ROBOT"]}},'
        '{"name":"since","type":{"type":"long","logicalType":"timestamp-millis"}}]}')


# Inputs with the text Avro Java (1.12) writes for them with Schema.toString().
AVRO_JAVA_WRITES = [
    ({"type": "record", "name": "User", "namespace": "com.acme", "doc": "d", "fields": [
        {"name": "id", "type": "long", "doc": "the id", "default": 1, "order": "descending",
         "aliases": ["i"], "x": 1},
        {"name": "e", "type": {"type": "enum", "name": "E", "namespace": "x.y", "symbols": ["A"],
                               "default": "A", "doc": "ed", "aliases": ["OldE", "q.Z"]}},
        {"name": "e2", "type": "x.y.E"},
        {"name": "f", "type": {"type": "fixed", "name": "F", "size": 16, "logicalType": "decimal",
                               "precision": 10, "scale": 2}},
        {"name": "d", "type": "double", "default": 0.0001}],
      "aliases": ["com.old.User", "Legacy"], "extra": {"k": "v"}},
     '{"type":"record","name":"User","namespace":"com.acme","doc":"d","fields":['
     '{"name":"id","type":"long","doc":"the id","default":1,"order":"descending",'
     '"aliases":["i"],"x":1},'
     '{"name":"e","type":{"type":"enum","name":"E","namespace":"x.y","doc":"ed","symbols":["A"],'
     '"default":"A","aliases":["OldE","q.Z"]}},{"name":"e2","type":"x.y.E"},'
     '{"name":"f","type":{"type":"fixed","name":"F","size":16,"logicalType":"decimal",'
     '"precision":10,"scale":2}},{"name":"d","type":"double","default":1.0E-4}],'
     '"extra":{"k":"v"},"aliases":["com.old.User","Legacy"]}'),
    ({"type": "record", "name": "Outer", "namespace": "a", "fields": [
        {"name": "i", "type": {"type": "record", "name": "b.Inner", "fields": [
            {"name": "j", "type": {"type": "record", "name": "J", "fields": []}}]}},
        {"name": "k", "type": "b.J"}]},
     '{"type":"record","name":"Outer","namespace":"a","fields":[{"name":"i","type":{"type":'
     '"record","name":"Inner","namespace":"b","fields":[{"name":"j","type":{"type":"record",'
     '"name":"J","fields":[]}}]}},{"name":"k","type":"b.J"}]}'),
    ({"type": "record", "name": "R", "namespace": "n", "fields": [
        {"name": "s", "type": {"type": "record", "name": "string", "fields": []}},
        {"name": "t", "type": "n.string"}]},
     '{"type":"record","name":"R","namespace":"n","fields":[{"name":"s","type":{"type":'
     '"record","name":"string","fields":[]}},{"name":"t","type":"n.string"}]}'),
    ({"type": "record", "name": "R", "fields": [
        {"name": "x", "type": "double", "default": 12345678.0},
        {"name": "y", "type": "float", "default": "NaN"},
        {"name": "z", "type": ["null", "int"], "default": 1}]},
     '{"type":"record","name":"R","fields":[{"name":"x","type":"double","default":1.2345678E7},'
     '{"name":"y","type":"float","default":"NaN"},'
     '{"name":"z","type":["null","int"],"default":1}]}'),
]


@pytest.mark.parametrize("schema, java", AVRO_JAVA_WRITES)
def test_canonical_is_what_avro_java_writes(schema, java):
    assert avro(schema).canonical == java
    assert avro(java).canonical == java


def test_whitespace_and_spelling_do_not_change_the_canonical_text():
    compact = avro(USER).canonical
    spaced = json.dumps(USER, indent=4)
    # the full name in "name" instead of a namespace; attributes in another order;
    # a primitive written as an object without properties
    respelled = json.loads(json.dumps(USER))
    respelled["name"] = "com.acme.User"
    del respelled["namespace"]
    respelled["fields"][0] = {"type": {"type": "long"}, "name": "id"}
    respelled["fields"][3]["type"] = ["null", "com.acme.Address"]
    respelled = {"fields": respelled["fields"], "name": respelled["name"], "type": "record"}
    assert avro(spaced).canonical == compact
    assert avro(respelled).canonical == compact


def test_unions_define_named_types_and_refuse_duplicates():
    inline = {"type": "record", "name": "R", "fields": [{"name": "x", "type": [
        "null", {"type": "record", "name": "A", "fields": []},
        {"type": "enum", "name": "B", "symbols": ["S"]}]}]}
    assert avro(inline).decode(b"\x04\x00") == {"x": "S"}
    with pytest.raises(SchemaError, match="twice"):
        avro('["int", {"type": "int", "x": 1}]')
    with pytest.raises(SchemaError, match="twice"):
        avro('[{"type": "fixed", "name": "F", "size": 1}, "F"]')
    with pytest.raises(SchemaError, match="inside a union"):
        avro('["int", ["null", "string"]]')


def test_canonical_is_stable():
    once = avro(USER).canonical
    assert avro(once).canonical == once
    primitive = avro('  "string" ')
    assert primitive.canonical == '"string"'
    assert avro('{"type": "int", "connect.name": "x"}').canonical == '{"type":"int","connect.name":"x"}'


def test_a_null_namespace_inside_a_named_one_is_written_as_empty():
    schema = {"type": "record", "name": "a.Outer", "fields": [
        {"name": "inner", "type": {"type": "fixed", "name": "Inner", "namespace": "", "size": 2}}]}
    canonical = avro(schema).canonical
    assert '"name":"Inner","namespace":"","size":2' in canonical
    assert avro(canonical).canonical == canonical


def test_what_avro_java_tolerates_is_tolerated_and_written_as_java_does():
    schema = {"type": "record", "name": "R", "namespace": "com.acme", "doc": 42,
              "fields": [{"name": "a", "type": "int", "order": "DESCENDING"},
                         {"name": "b", "type": "int", "order": "ascending"}]}
    # a doc that is not text is dropped, order's case ignored
    assert avro(schema).canonical == (
        '{"type":"record","name":"R","namespace":"com.acme","fields":['
        '{"name":"a","type":"int","order":"descending"},{"name":"b","type":"int"}]}')


def test_defaults_are_written_as_jackson_writes_them():
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "big", "type": "double", "default": 1e20},
        {"name": "small", "type": "float", "default": 0.5},
        {"name": "tags", "type": {"type": "map", "values": "int"}, "default": {"b": 1, "a": 2}}]}
    canonical = avro(schema).canonical
    assert '"default":1.0E20' in canonical
    assert '"default":0.5' in canonical
    assert '"default":{"b":1,"a":2}' in canonical


def test_normalized_names_everything_in_full_and_sorts_properties():
    a = {"type": "record", "name": "R", "namespace": "n", "fields": [
        {"name": "f", "type": {"type": "string", "z": 1, "a": 2}, "aliases": ["y", "x"]}]}
    b = {"type": "record", "name": "n.R", "fields": [
        {"aliases": ["x", "y"], "type": {"a": 2, "type": "string", "z": 1}, "name": "f"}]}
    assert avro(a).canonical != avro(b).canonical
    assert avro(a).normalized().canonical == avro(b).normalized().canonical
    normal = avro(a).normalized()
    assert normal.canonical == normal.normalized().canonical
    assert '{"type":"string","a":2,"z":1}' in normal.canonical


# -- references ----------------------------------------------------------------------------

ADDRESS = ResolvedReference("com.acme.Address", json.dumps(
    {"type": "record", "name": "Address", "namespace": "com.acme",
     "fields": [{"name": "city", "type": "string"}, {"name": "zone", "type": "Zone"}]}),
    references=(ResolvedReference("com.acme.Zone", json.dumps(
        {"type": "enum", "name": "Zone", "namespace": "com.acme", "symbols": ["A", "B"]})),))
ORDER = {"type": "record", "name": "Order", "namespace": "com.acme", "fields": [
    {"name": "ship_to", "type": "Address"}, {"name": "bill_to", "type": "com.acme.Address"}]}


def test_a_record_uses_named_types_of_its_references_and_theirs():
    order = avro(ORDER, [ADDRESS])
    # referenced types are only named in the canonical text, as Confluent stores it
    assert order.canonical == ('{"type":"record","name":"Order","namespace":"com.acme","fields":'
                               '[{"name":"ship_to","type":"Address"},'
                               '{"name":"bill_to","type":"Address"}]}')
    value = {"ship_to": {"city": "Oslo", "zone": "A"}, "bill_to": {"city": "Rome", "zone": "B"}}
    assert order.decode(order.encode(value)) == value
    # the resolved text stands alone: a plain Avro library reads the data with it
    resolved = fastavro.parse_schema(json.loads(order.resolved))
    assert fastavro.schemaless_reader(io.BytesIO(order.encode(value)), resolved, None) == value
    assert avro(order.canonical, [ADDRESS]).canonical == order.canonical


def test_a_missing_reference_is_a_schema_error():
    with pytest.raises(SchemaError, match="Address"):
        avro(ORDER)
    zone_missing = ResolvedReference(ADDRESS.name, ADDRESS.schema)
    with pytest.raises(SchemaError, match="Zone"):
        avro(ORDER, [zone_missing])


def test_a_type_shared_by_two_references_is_parsed_once():
    zone = ADDRESS.references[0]
    other = ResolvedReference("com.acme.Depot", json.dumps(
        {"type": "record", "name": "Depot", "namespace": "com.acme",
         "fields": [{"name": "zone", "type": "Zone"}]}), references=(zone,))
    schema = {"type": "record", "name": "com.acme.Both", "fields": [
        {"name": "a", "type": "Address"}, {"name": "d", "type": "Depot"}]}
    both = avro(schema, [ADDRESS, other])
    value = {"a": {"city": "x", "zone": "B"}, "d": {"zone": "A"}}
    assert both.decode(both.encode(value)) == value


def test_too_many_or_too_deep_references_are_refused():
    chain = ResolvedReference("T0", '{"type":"fixed","name":"T0","size":1}')
    for i in range(1, MAX_DEPTH + 2):
        chain = ResolvedReference(f"T{i}", f'{{"type":"fixed","name":"T{i}","size":1}}', (chain,))
    with pytest.raises(SchemaError, match="deeper"):
        avro('"T1"', [chain])


# -- invalid schemas -----------------------------------------------------------------------

@pytest.mark.parametrize("text, why", [
    ("{", "invalid JSON"),
    ("", "invalid JSON"),
    ('"strin"', "unknown type"),
    ('{"type": "record", "name": "R"}', "invalid Avro"),
    ('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "Nope"}]}', "Nope"),
    ('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int", "default": "x"}]}',
     "default"),
    ('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int",'
     ' "default": 3000000000}]}', "default"),
    ('{"type": "record", "name": "R", "fields": [{"name": "a", "type": {"type": "record",'
     ' "name": "S", "fields": [{"name": "x", "type": "int"}]}, "default": {}}]}', "default"),
    ('{"type": "enum", "name": "E", "symbols": ["A", "A"]}', "invalid Avro"),
    ('{"type": "enum", "name": "E", "symbols": ["A"], "default": "B"}', "default"),
    ('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"},'
     ' {"name": "a", "type": "int"}]}', "invalid Avro"),
    ('{"type": "record", "name": "1R", "fields": []}', "invalid Avro"),
    ('{"type": "fixed", "name": "F"}', "invalid Avro"),
    ('{"type": {"type": "int"}}', "invalid Avro"),
    ("42", "invalid Avro"),
])
def test_invalid_schemas_are_schema_errors(text, why):
    with pytest.raises(SchemaError, match=why):
        avro(text)


def test_a_10000_deep_schema_is_refused_without_recursion_error():
    deep = '{"type":"array","items":' * 10_000 + '"int"' + "}" * 10_000
    with pytest.raises(SchemaError, match="deeper"):
        avro(deep)
    nested_records = "int"
    for i in range(MAX_DEPTH + 1):
        nested_records = {"type": "record", "name": f"R{i}",
                          "fields": [{"name": "f", "type": nested_records}]}
    with pytest.raises(SchemaError, match="deeper"):
        avro(nested_records)


def test_a_schema_of_a_few_megabytes_parses():
    fields = [{"name": f"field_{i}", "type": ["null", "string"], "default": None,
               "doc": "d" * 150} for i in range(10_000)]
    big = json.dumps({"type": "record", "name": "Wide", "fields": fields})
    assert len(big) > 2_000_000
    wide = avro(big)
    assert avro(wide.canonical).canonical == wide.canonical
    assert wide.decode(b"\x00" * 10_000)["field_9999"] is None


# -- values --------------------------------------------------------------------------------

def test_decode_reads_what_fastavro_writes():
    user = avro(USER)
    stream = io.BytesIO()
    fastavro.schemaless_writer(stream, fastavro.parse_schema(USER), USER_VALUE)
    decoded = user.decode(payload_of(frame(1, stream.getvalue())))
    assert decoded["address"] == {"city": "Oslo"} and decoded["kind"] == "ROBOT"
    assert decoded["since"].year == 2023
    assert user.encode(USER_VALUE) == stream.getvalue()


@pytest.mark.parametrize("payload", [b"", b"\x02", b"\x0e\x04", b"\xff" * 20,
                                     b"\x0e\x02\x08ab", b"\x0e\x02\x02\xff\x0a\x00"])
def test_garbage_payloads_are_schema_errors(payload):
    with pytest.raises(SchemaError):
        avro(USER).decode(payload)


def test_random_payloads_never_escape_as_other_errors():
    user = avro(USER)
    good = user.encode(USER_VALUE)
    rng = random.Random(1)
    for _ in range(2000):
        payload = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            payload[rng.randrange(len(payload))] = rng.randrange(256)
        try:
            user.decode(bytes(payload[: rng.randint(0, len(payload))]))
        except SchemaError:
            pass


def test_trailing_bytes_are_refused():
    with pytest.raises(SchemaError, match="left"):
        avro('"int"').decode(b"\x02\x00")


def test_encode_refuses_a_value_that_does_not_fit():
    with pytest.raises(SchemaError):
        avro(USER).encode({"id": "seven"})
    with pytest.raises(SchemaError):
        avro('"int"').encode("x")


LIST = {"type": "record", "name": "Node", "fields": [
    {"name": "value", "type": "int"}, {"name": "next", "type": ["null", "Node"], "default": None}]}


def test_a_recursive_type_is_legal_and_reads_its_data():
    node = avro(LIST)
    assert node.canonical == ('{"type":"record","name":"Node","fields":[{"name":"value","type":'
                              '"int"},{"name":"next","type":["null","Node"],"default":null}]}')
    value = {"value": 1, "next": {"value": 2, "next": None}}
    assert node.decode(node.encode(value)) == value
    assert node.read_errors(node) == []


def test_a_deeply_nested_payload_of_a_recursive_type_is_refused():
    # 100,000 links would overflow the C stack of a compiled reader
    payload = b"\x02\x02" * 100_000 + b"\x02\x00"
    with pytest.raises(SchemaError, match="deeper"):
        avro(LIST).decode(payload)
    value = None
    for i in range(MAX_VALUE_DEPTH):
        value = {"value": i, "next": value}
    with pytest.raises(SchemaError, match="deeper"):
        avro(LIST).encode(value)


def chain(length):
    """A record whose fields hold records each holding the one before it, by name."""
    fields = [{"name": "r0", "type": {"type": "record", "name": "R0", "fields": []}}]
    for i in range(1, length):
        fields.append({"name": f"r{i}", "type": {"type": "record", "name": f"R{i}", "fields": [
            {"name": "previous", "type": f"R{i - 1}"}]}})
    return {"type": "record", "name": "Chain", "fields": fields}


def test_nesting_through_named_types_is_bounded():
    # every value of a 3000-long chain nests 3000 deep: refused (in linear time) rather than
    # left to overflow a reader
    with pytest.raises(SchemaError, match="through named types"):
        avro(chain(3000))
    short = avro(chain(50))
    value = short.decode(b"")  # every record is empty: no bytes at all
    assert value["r49"]["previous"] == value["r48"]


def test_items_that_take_no_bytes_are_bounded():
    nulls = avro('{"type": "array", "items": "null"}')
    assert nulls.decode(b"\x06\x00") == [None, None, None]
    with pytest.raises(SchemaError, match="no bytes"):
        nulls.decode(b"\xfe\xff\xff\xff\xff\xff\xff\xff\x7f\x00")  # 2**62 nulls
    empty = avro('{"type": "array", "items": {"type": "record", "name": "E", "fields": ['
                 '{"name": "n", "type": "null"}, {"name": "f", "type": '
                 '{"type": "fixed", "name": "F", "size": 0}}]}}')
    assert empty.decode(b"\x04\x00") == [{"n": None, "f": b""}] * 2
    with pytest.raises(SchemaError, match="no bytes"):
        empty.decode(b"\xfe\xff\xff\xff\xff\xff\xff\xff\x7f\x00")
    with pytest.raises(SchemaError, match="does not match"):
        avro('{"type": "array", "items": "int"}').decode(b"\xfe\xff\xff\xff\x0f\x02")


def test_avro_schema_is_what_parse_gives():
    assert isinstance(parse("", '"int"'), AvroSchema)
    assert avro(USER).name == "com.acme.User"
    assert avro('"int"').name is None


def test_decode_reads_what_confluent_kafkas_avro_serializer_writes():
    registry = pytest.importorskip("confluent_kafka.schema_registry")
    serializers = pytest.importorskip("confluent_kafka.schema_registry.avro")
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = registry.SchemaRegistryClient.new_client({"url": "mock://strom-avro"})
    serialize = serializers.AvroSerializer(client, json.dumps(USER))
    framed = serialize(USER_VALUE, SerializationContext("users", MessageField.VALUE))
    registered = client.get_latest_version("users-value").schema.schema_str
    decoded = avro(registered).decode(payload_of(framed))
    assert {k: decoded[k] for k in ("id", "name", "address", "kind")} == {
        "id": 7, "name": "ada", "address": {"city": "Oslo"}, "kind": "ROBOT"}
    assert avro(registered).canonical == avro(USER).canonical
