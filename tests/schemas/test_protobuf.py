"""Protobuf schemas: both registered forms, Confluent's canonical text, compatibility rules,
and values as confluent-kafka's ProtobufSerializer writes them."""

import base64

import pytest
from confluent_kafka.schema_registry import RegisteredSchema, Schema, topic_subject_name_strategy
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2 as pb
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message_factory import GetMessageClass

from strom.schemas import frame, payload_of, schema_id_of
from strom.schemas.parsed import (
    Compatibility,
    ResolvedReference,
    SchemaError,
    compatibility_errors,
    parse,
)
from strom.schemas.protobuf import ProtobufSchema, read_indexes, write_indexes

FDP = pb.FieldDescriptorProto

ORDER_PROTO = """
syntax = "proto3";
package shop;

import "google/protobuf/timestamp.proto";

message Order {
  string id = 1;
  int64 quantity = 2;
  Line line = 3;
  google.protobuf.Timestamp at = 4;
  map<string, int32> tags = 5;
  Kind kind = 6;
  optional string note = 7;
  oneof payment {
    string card = 8;
    int32 cash = 9;
  }

  message Line {
    string sku = 1;
  }
}
enum Kind {
  KIND_UNKNOWN = 0;
  KIND_EXPRESS = 1;
}
"""

# What Strom renders for ORDER_PROTO, from either form: the same text but for a nested type
# named from the file's scope and a blank line before a oneof (as Confluent renders them).
ORDER_CANONICAL = (ORDER_PROTO.lstrip("\n")
                   .replace("  Line line = 3;", "  Order.Line line = 3;")
                   .replace("\n  oneof payment", "\n\n  oneof payment"))
assert ORDER_CANONICAL.count("Order.Line") == 1 and "\n\n  oneof" in ORDER_CANONICAL


def order_file() -> pb.FileDescriptorProto:
    """ORDER_PROTO as protoc describes it, built by hand (not by Strom's parser)."""
    fd = pb.FileDescriptorProto(name="shop/order.proto", package="shop", syntax="proto3",
                                dependency=["google/protobuf/timestamp.proto"])
    order = fd.message_type.add(name="Order")
    add = order.field.add
    add(name="id", number=1, label=FDP.LABEL_OPTIONAL, type=FDP.TYPE_STRING, json_name="id")
    add(name="quantity", number=2, label=FDP.LABEL_OPTIONAL, type=FDP.TYPE_INT64, json_name="quantity")
    add(name="line", number=3, label=FDP.LABEL_OPTIONAL, type=FDP.TYPE_MESSAGE, type_name=".shop.Order.Line")
    add(name="at", number=4, label=FDP.LABEL_OPTIONAL, type=FDP.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp")
    add(name="tags", number=5, label=FDP.LABEL_REPEATED, type=FDP.TYPE_MESSAGE, type_name=".shop.Order.TagsEntry")
    add(name="kind", number=6, label=FDP.LABEL_OPTIONAL, type=FDP.TYPE_ENUM, type_name=".shop.Kind")
    add(name="note", number=7, label=FDP.LABEL_OPTIONAL, type=FDP.TYPE_STRING, oneof_index=1, proto3_optional=True)
    add(name="card", number=8, label=FDP.LABEL_OPTIONAL, type=FDP.TYPE_STRING, oneof_index=0)
    add(name="cash", number=9, label=FDP.LABEL_OPTIONAL, type=FDP.TYPE_INT32, oneof_index=0)
    order.oneof_decl.add(name="payment")
    order.oneof_decl.add(name="_note")
    order.nested_type.add(name="Line").field.add(name="sku", number=1, label=FDP.LABEL_OPTIONAL, type=FDP.TYPE_STRING)
    entry = order.nested_type.add(name="TagsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, label=FDP.LABEL_OPTIONAL, type=FDP.TYPE_STRING)
    entry.field.add(name="value", number=2, label=FDP.LABEL_OPTIONAL, type=FDP.TYPE_INT32)
    kind = fd.enum_type.add(name="Kind")
    kind.value.add(name="KIND_UNKNOWN", number=0)
    kind.value.add(name="KIND_EXPRESS", number=1)
    return fd


def message_classes(*files: pb.FileDescriptorProto) -> DescriptorPool:
    pool = DescriptorPool()
    from google.protobuf import timestamp_pb2
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    for f in files:
        pool.Add(f)
    return pool


class FakeRegistry:
    """The calls ProtobufSerializer and ProtobufDeserializer make, answered by Strom's
    ProtobufSchema as the registry service would (serialized form on request)."""

    def __init__(self):
        self.schemas: dict[int, tuple[Schema, ProtobufSchema]] = {}
        self.versions: dict[tuple[str, int], int] = {}

    def _resolve(self, schema):
        refs = []
        for ref in schema.references or []:
            stored, _ = self.schemas[self.versions[(ref.subject, ref.version)]]
            refs.append(ResolvedReference(ref.name, stored.schema_str, tuple(self._resolve(stored))))
        return refs

    def register_schema_full_response(self, subject, schema, normalize_schemas=False):
        parsed = ProtobufSchema.parse(schema.schema_str, self._resolve(schema))
        same = [i for i, (_, known) in self.schemas.items() if known.canonical == parsed.canonical]
        schema_id = same[0] if same else len(self.schemas) + 1
        self.schemas.setdefault(schema_id, (schema, parsed))
        self.versions[(subject, 1)] = schema_id
        return RegisteredSchema(schema_id=schema_id, guid=None, schema=schema, subject=subject, version=1)

    def register_schema(self, subject, schema, normalize_schemas=False):
        return self.register_schema_full_response(subject, schema).schema_id

    def lookup_schema(self, subject, schema, normalize_schemas=False, deleted=False):
        return self.register_schema_full_response(subject, schema)

    def get_schema(self, schema_id, subject_name=None, fmt=None):
        schema, parsed = self.schemas[schema_id]
        return Schema(parsed.serialized() if fmt == "serialized" else parsed.canonical, "PROTOBUF",
                      schema.references)

    def get_version(self, subject, version, deleted=False, fmt=None):
        schema_id = self.versions[(subject, version)]
        return RegisteredSchema(schema_id=schema_id, guid=None, schema=self.get_schema(schema_id, fmt=fmt),
                                subject=subject, version=version)

    def config(self):
        return {}


CONF = {"subject.name.strategy": topic_subject_name_strategy}
CTX = SerializationContext("orders", MessageField.VALUE)


def test_what_the_serializer_registers_parses_renders_and_decodes():
    pool = message_classes(order_file())
    order_class = GetMessageClass(pool.FindMessageTypeByName("shop.Order"))
    line_class = GetMessageClass(pool.FindMessageTypeByName("shop.Order.Line"))
    registry = FakeRegistry()
    serializer = ProtobufSerializer(order_class, registry, CONF)
    order = order_class(id="o-1", quantity=2**40, line=line_class(sku="A7"), kind=1, cash=12)
    order.tags["fragile"] = 1
    order.at.seconds = 1_700_000_000
    value = serializer(order, CTX)

    schema_id = schema_id_of(value)
    registered, schema = registry.schemas[schema_id]
    base64.b64decode(registered.schema_str, validate=True)  # the serializer's form: base64 descriptor
    assert schema.canonical == ORDER_CANONICAL
    assert bytes(payload_of(value))[:1] == b"\x00"  # first message: the single index byte 0
    assert schema.decode(payload_of(value)) == {
        "id": "o-1", "quantity": 2**40, "line": {"sku": "A7"},
        "at": {"seconds": 1_700_000_000, "nanos": 0}, "tags": {"fragile": 1},
        "kind": "KIND_EXPRESS", "note": None, "card": None, "cash": 12,
    }

    # a nested message is named by its indexes [0, 0]
    nested = ProtobufSerializer(line_class, registry, CONF)(line_class(sku="B2"), CTX)
    assert bytes(payload_of(nested))[:3] == b"\x04\x00\x00"
    assert registry.schemas[schema_id_of(nested)][1].decode(payload_of(nested)) == {"sku": "B2"}


def test_the_deserializer_reads_what_strom_serves_and_encodes():
    pool = message_classes(order_file())
    order_class = GetMessageClass(pool.FindMessageTypeByName("shop.Order"))
    registry = FakeRegistry()
    ProtobufSerializer(order_class, registry, CONF)(order_class(id="x"), CTX)
    schema = registry.schemas[1][1]

    payload = schema.encode({"id": "o-2", "quantity": -5, "line": {"sku": "C"}, "tags": {"a": 2},
                             "kind": "KIND_EXPRESS", "note": "ring twice", "card": None})
    message = ProtobufDeserializer(order_class, CONF, registry)(frame(1, payload), CTX)
    assert (message.id, message.quantity, message.line.sku, dict(message.tags), message.kind, message.note) == \
        ("o-2", -5, "C", {"a": 2}, 1, "ring twice")
    assert not message.HasField("card")

    line = schema.encode({"sku": "D"}, "shop.Order.Line")
    assert read_indexes(line) == ([0, 0], 3)
    assert schema.decode(line) == {"sku": "D"}


def test_imports_are_registered_as_references_and_resolved_through_them():
    common = pb.FileDescriptorProto(name="common/money.proto", package="common", syntax="proto3")
    money = common.message_type.add(name="Money")
    money.field.add(name="cents", number=1, label=FDP.LABEL_OPTIONAL, type=FDP.TYPE_INT64)
    invoice = pb.FileDescriptorProto(name="billing/invoice.proto", package="billing", syntax="proto3",
                                     dependency=["common/money.proto", "google/protobuf/timestamp.proto"])
    msg = invoice.message_type.add(name="Invoice")
    msg.field.add(name="total", number=1, label=FDP.LABEL_OPTIONAL, type=FDP.TYPE_MESSAGE, type_name=".common.Money")
    msg.field.add(name="due", number=2, label=FDP.LABEL_OPTIONAL, type=FDP.TYPE_MESSAGE,
                  type_name=".google.protobuf.Timestamp")
    pool = message_classes(common, invoice)
    invoice_class = GetMessageClass(pool.FindMessageTypeByName("billing.Invoice"))
    registry = FakeRegistry()
    value = ProtobufSerializer(invoice_class, registry, CONF)(invoice_class(total={"cents": 999}), CTX)

    registered, schema = registry.schemas[schema_id_of(value)]
    # the well-known import is no reference; the other is, by its import path
    assert [r.name for r in registered.references] == ["common/money.proto"]
    assert schema.decode(payload_of(value)) == {"total": {"cents": 999}, "due": None}
    assert "common.Money total = 1;" in schema.canonical
    # the deserializer fetches the schema and its reference in serialized form and reads on
    message = ProtobufDeserializer(invoice_class, CONF, registry)(value, CTX)
    assert message.total.cents == 999

    with pytest.raises(SchemaError, match="common/money.proto"):
        ProtobufSchema.parse(registered.schema_str)  # its reference left out


def test_text_imports_through_references():
    money = 'syntax = "proto3"; package common; message Money { int64 cents = 1; }'
    text = 'syntax = "proto3"; package billing; import "common/money.proto"; message Invoice { common.Money total = 1; }'
    schema = parse("PROTOBUF", text, [ResolvedReference("common/money.proto", money)])
    assert schema.decode(schema.encode({"total": {"cents": 5}})) == {"total": {"cents": 5}}
    with pytest.raises(SchemaError, match="common/money.proto"):
        parse("PROTOBUF", text)
    with pytest.raises(SchemaError, match="reference common/money.proto"):
        parse("PROTOBUF", text, [ResolvedReference("common/money.proto", "message {")])


def test_text_and_serialized_forms_give_one_canonical_text():
    from_text = ProtobufSchema.parse(ORDER_PROTO)
    serialized = base64.b64encode(order_file().SerializeToString()).decode()
    from_descriptor = ProtobufSchema.parse(serialized)
    reformatted = ProtobufSchema.parse(
        "// an order\n" + ORDER_PROTO.replace("\n", "\n\n").replace("  ", "\t").replace(" = ", "=")
    )
    assert from_text.canonical == from_descriptor.canonical == reformatted.canonical == ORDER_CANONICAL
    assert from_text == from_descriptor
    # the canonical text and the serialized form parse back to the same schema
    assert ProtobufSchema.parse(from_text.canonical).canonical == ORDER_CANONICAL
    assert ProtobufSchema.parse(from_text.serialized()).canonical == ORDER_CANONICAL


@pytest.mark.parametrize("module", ["descriptor_pb2", "struct_pb2", "type_pb2", "api_pb2"])
def test_canonical_text_describes_the_same_file(module):
    """protobuf's own files (proto2 and proto3, options, defaults, extension ranges, maps):
    their canonical text parses back to the very descriptor (json_name aside, which protoc
    derives when a file does not set it)."""
    import importlib

    descriptor = importlib.import_module(f"google.protobuf.{module}").DESCRIPTOR
    schema = ProtobufSchema.parse(base64.b64encode(descriptor.serialized_pb).decode())
    again = ProtobufSchema.parse(schema.canonical)
    assert again.canonical == schema.canonical

    def without_json_names(schema):
        fdp = pb.FileDescriptorProto.FromString(base64.b64decode(schema.serialized()))
        stack = list(fdp.message_type)
        while stack:
            message = stack.pop()
            for field in message.field:
                field.ClearField("json_name")
            stack += message.nested_type
        return fdp

    assert without_json_names(again) == without_json_names(schema)


def test_normalized_sorts_and_qualifies():
    a = ProtobufSchema.parse("""syntax = "proto3"; package p;
        import "google/protobuf/timestamp.proto"; import "google/protobuf/duration.proto";
        option java_package = "x"; option go_package = "y";
        message M { int32 b = 2; google.protobuf.Timestamp a = 1; map<string, M> c = 3;
                    oneof o { string z = 9; string y = 5; } }""")
    b = ProtobufSchema.parse("""syntax = "proto3"; package p;
        import "google/protobuf/duration.proto"; import "google/protobuf/timestamp.proto";
        option go_package = "y"; option java_package = "x";
        message M { google.protobuf.Timestamp a = 1; int32 b = 2; map<string, M> c = 3;
                    oneof o { string y = 5; string z = 9; } }""")
    assert a.canonical != b.canonical
    assert a.normalized().canonical == b.normalized().canonical == """syntax = "proto3";
package p;

import "google/protobuf/duration.proto";
import "google/protobuf/timestamp.proto";

option go_package = "y";
option java_package = "x";

message M {
  .google.protobuf.Timestamp a = 1;
  int32 b = 2;
  map<string, .p.M> c = 3;

  oneof o {
    string y = 5;
    string z = 9;
  }
}
"""
    assert a.normalized().decode(b"\x00\x08\x07") == a.decode(b"\x00\x08\x07")


def test_proto2_options_and_custom_options_round_trip():
    text = """
syntax = "proto2";
package legacy;
import "confluent/meta.proto";
option java_package = "com.example.legacy";
message Account {
  option (confluent.message_meta).doc = "an account";
  required string id = 1 [(confluent.field_meta) = { tags: ["PII"] }];
  optional int32 level = 2 [default = 3, deprecated = true];
  repeated string aliases = 3 [json_name = "otherNames"];
  extensions 100 to max;
  reserved 5 to 7, 9;
  reserved "gone";
}
extend Account { optional string nickname = 100; }
"""
    schema = ProtobufSchema.parse(text)
    canonical = schema.canonical
    assert 'required string id = 1 [(confluent.field_meta) = {\n' in canonical
    assert "optional int32 level = 2 [\n    deprecated = true,\n    default = 3\n  ];" in canonical
    assert 'json_name = "otherNames"' in canonical
    assert "extensions 100 to max;" in canonical and "reserved 5 to 7;" in canonical
    assert 'option (confluent.message_meta) = {\n    doc: "an account"\n  };' in canonical
    assert ProtobufSchema.parse(canonical).canonical == canonical
    assert schema.decode(schema.encode({"id": "a"})) == {"id": "a", "level": None, "aliases": []}
    with pytest.raises(SchemaError, match="cannot encode legacy.Account"):
        schema.encode({"level": 1})  # a required field missing


def test_message_descriptor_maps_fields_for_columns():
    schema = ProtobufSchema.parse(ORDER_PROTO)
    order = schema.message_descriptor([0])
    assert [f.name for f in order.fields] == ["id", "quantity", "line", "at", "tags", "kind", "note", "card", "cash"]
    # protoc's order: the map entry comes where its field is declared, before Line
    assert schema.message_descriptor([0, 0]).full_name == "shop.Order.TagsEntry"
    assert schema.message_indexes("shop.Order.Line") == [0, 1]
    assert schema.message_names == ["shop.Order"]
    with pytest.raises(SchemaError, match="out of range"):
        schema.message_descriptor([1])


# -- compatibility ---------------------------------------------------------------------------

V1 = """syntax = "proto3"; package shop;
message Order { string id = 1; int32 quantity = 2; Item item = 3; string card = 4; string cash = 5; }
message Item { string sku = 1; }"""


def errors(level: str, new: str, old: str = V1) -> list[str]:
    return compatibility_errors(Compatibility(level), ProtobufSchema.parse(new), [ProtobufSchema.parse(old)])


@pytest.mark.parametrize("level", ["BACKWARD", "FORWARD", "FULL"])
@pytest.mark.parametrize("new", [
    V1.replace("string cash = 5;", "string cash = 5; int64 extra = 6;"),            # field added
    V1.replace("string cash = 5;", ""),                                              # field removed
    V1.replace("int32 quantity", "int64 quantity"),                                   # same scalar group
    V1.replace("int32 quantity", "uint64 quantity"),
    V1.replace("string id", "bytes id"),
    V1.replace("string id = 1", "string order_id = 1"),                               # field renamed
    V1.replace("string card = 4; string cash = 5;", "oneof pay { string card = 4; }"),  # one field into a oneof
])
def test_allowed_changes(level, new):
    assert errors(level, new) == []


@pytest.mark.parametrize(("new", "kind", "path"), [
    (V1.replace("int32 quantity", "string quantity"), "FIELD_SCALAR_KIND_CHANGED", "#/Order/2"),
    (V1.replace("int32 quantity", "sint32 quantity"), "FIELD_SCALAR_KIND_CHANGED", "#/Order/2"),
    (V1.replace("int32 quantity", "Item quantity"), "FIELD_KIND_CHANGED", "#/Order/2"),
    (V1.replace("int32 quantity", "map<string, string> quantity"), "FIELD_KIND_CHANGED", "#/Order/2"),
    (V1.replace("Item item", "Other item") + " message Other { string sku = 1; }", "FIELD_NAMED_TYPE_CHANGED",
     "#/Order/3"),
    (V1.replace("message Item { string sku = 1; }", "message Article { string sku = 1; }")
       .replace("Item item", "Article item"), "MESSAGE_REMOVED", "#/Item"),                  # message renamed
    (V1.replace("string card = 4; string cash = 5;", "oneof pay { string card = 4; string cash = 5; }"),
     "MULTIPLE_FIELDS_MOVED_TO_ONEOF", "#/Order/pay"),
    (V1.replace("package shop;", "package store;"), "PACKAGE_CHANGED", "#/"),
])
def test_refused_changes_both_ways(new, kind, path):
    backward = errors("BACKWARD", new)
    assert any(f"errorType:'{kind}'" in e and f"'{path}'" in e for e in backward), backward
    assert errors("FULL", new)[: len(backward)] == backward


def test_a_message_added_is_backward_but_not_forward_compatible():
    new = V1 + " message Extra { string note = 1; }"
    assert errors("BACKWARD", new) == []
    assert any("MESSAGE_REMOVED" in e and "'#/Extra'" in e for e in errors("FORWARD", new))


def test_a_type_change_inside_a_referenced_message_changes_the_field_type():
    new = V1.replace("message Item { string sku = 1; }", "message Item { int32 sku = 1; }")
    found = errors("BACKWARD", new)
    assert any("FIELD_SCALAR_KIND_CHANGED" in e and "'#/Item/1'" in e for e in found)
    assert any("FIELD_NAMED_TYPE_CHANGED" in e and "'#/Order/3'" in e for e in found)


def test_directional_rules_follow_the_level():
    with_oneof = """syntax = "proto3"; package shop; message Order { oneof pay { string card = 4; string cash = 5; } }"""
    without = """syntax = "proto3"; package shop; message Order { oneof pay { string card = 4; } }"""
    # a reader without the oneof's field cannot read it: refused when the new schema reads (BACKWARD)
    assert any("ONEOF_FIELD_REMOVED" in e for e in errors("BACKWARD", without, with_oneof))
    assert errors("FORWARD", without, with_oneof) == []
    assert any("ONEOF_FIELD_REMOVED" in e for e in errors("FORWARD", with_oneof, without))

    required_v1 = 'syntax = "proto2"; message R { optional string a = 1; }'
    required_v2 = 'syntax = "proto2"; message R { optional string a = 1; required int32 b = 2; }'
    assert any("REQUIRED_FIELD_ADDED" in e for e in errors("BACKWARD", required_v2, required_v1))
    assert any("REQUIRED_FIELD_REMOVED" in e for e in errors("FORWARD", required_v2, required_v1))
    assert errors("NONE", required_v2, required_v1) == []


def test_long_chains_of_messages_are_compared_without_recursion():
    n = 1500
    chain = 'syntax = "proto3";' + "".join(f"message M{i} {{ M{i + 1} next = 1; }}" for i in range(n))
    old = ProtobufSchema.parse(chain + f"message M{n} {{ string x = 1; }}")
    new = ProtobufSchema.parse(chain + f"message M{n} {{ double x = 1; }}")
    found = new.read_errors(old)
    assert f"'#/M{n}/1'" in found[-1] and "FIELD_SCALAR_KIND_CHANGED" in found[-1]
    assert sum("FIELD_NAMED_TYPE_CHANGED" in e for e in found) == n  # every holder up the chain


def test_transitive_levels_check_every_earlier_version():
    v1 = ProtobufSchema.parse('syntax = "proto3"; message M { string a = 1; }')
    v2 = ProtobufSchema.parse('syntax = "proto3"; message M { }')
    v3 = ProtobufSchema.parse('syntax = "proto3"; message M { int32 a = 1; }')
    assert compatibility_errors(Compatibility.BACKWARD, v3, [v1, v2]) == []
    assert any("FIELD_SCALAR_KIND_CHANGED" in e
               for e in compatibility_errors(Compatibility.BACKWARD_TRANSITIVE, v3, [v1, v2]))


# -- hostile input ---------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "",
    "message {",
    'syntax = "proto3"; message M { string a = ; }',
    'syntax = "proto3"; message M { string a = 1; string b = 1; }',        # duplicate number
    'syntax = "proto3"; message M { Missing a = 1; }',                      # unknown type
    'syntax = "proto3"; message M { required string a = 1; }',
    'syntax = "proto4"; message M {}',
    'syntax = "proto3"; message M { string a = 1 [bogus = true]; }',
    'syntax = "proto3"; message M { string a = 1 [(nowhere.opt) = 1]; }',
    "bm90IGEgZGVzY3JpcHRvcg==",                                             # base64, not a descriptor
    "!!!!",
])
def test_invalid_schemas_are_refused(text):
    with pytest.raises(SchemaError):
        ProtobufSchema.parse(text)


def test_hostile_nesting_and_size_are_refused_quickly():
    deep = 'syntax = "proto3";' + "message M {" * 10_000 + "}" * 10_000
    with pytest.raises(SchemaError, match="deeper"):
        ProtobufSchema.parse(deep)
    deep_option = 'syntax = "proto3"; option java_package = ' + "{" * 10_000 + ";"
    with pytest.raises(SchemaError):
        ProtobufSchema.parse(deep_option)

    # serialized descriptors nested past Strom's bound, and past protobuf's decoder's
    for depth in (80, 10_000):
        fd = pb.FileDescriptorProto(name="x", syntax="proto3")
        msg = fd.message_type.add(name="M0")
        for i in range(1, min(depth, 99)):
            msg = msg.nested_type.add(name=f"M{i}")
        raw = fd.SerializeToString()
        if depth > 99:  # deeper than protobuf itself writes: nest the bytes by hand
            raw = b""
            for _ in range(depth):  # DescriptorProto.nested_type is field 3
                raw = b"\x1a" + _varint(len(raw)) + raw
            raw = b"\x22" + _varint(len(raw)) + raw  # FileDescriptorProto.message_type is field 4
        with pytest.raises(SchemaError, match="deeper"):
            ProtobufSchema.parse(base64.b64encode(raw).decode())

    huge = 'syntax = "proto3"; message M { ' + " ".join(f"string f{i} = {i};" for i in range(1, 40_000)) + " }"
    with pytest.raises(SchemaError, match="characters"):
        ProtobufSchema.parse(huge)
    with pytest.raises(SchemaError, match="larger"):
        ProtobufSchema.parse("QUFB" * 400_000)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


@pytest.mark.parametrize("payload", [
    b"",                                   # no indexes at all
    b"\x02\x02",                           # index [1]: out of range
    b"\x02",                               # a count, then nothing
    b"\x01",                               # count -1
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # endless varint
    b"\x7e",                               # count 63 with no indexes
    b"\x00\x0a\xff\xff\xff\xff\x0f",        # a string longer than the payload
    b"\x00\x0a\x02\xc3\x28",               # invalid UTF-8 in a proto3 string
    b"\x00\x0f",                           # a field with wire type 7
])
def test_garbage_payloads_are_refused(payload):
    schema = ProtobufSchema.parse(ORDER_PROTO)
    with pytest.raises(SchemaError):
        schema.decode(payload)


def test_bad_values_are_refused_on_encode():
    schema = ProtobufSchema.parse(ORDER_PROTO)
    for value in ({"nope": 1}, {"quantity": "many"}, {"kind": "KIND_SLOW"}, {"tags": [1]}, {"line": 3}, [1]):
        with pytest.raises(SchemaError):
            schema.encode(value)
    with pytest.raises(SchemaError, match="no message"):
        schema.encode({}, "shop.Nowhere")


def test_message_indexes_as_serializers_write_them():
    assert write_indexes([0]) == b"\x00"
    assert write_indexes([1]) == b"\x02\x02"
    assert write_indexes([0, 2, 300]) == b"\x06\x00\x04\xd8\x04"
    for indexes in ([0], [1], [0, 2, 300]):
        assert read_indexes(write_indexes(indexes) + b"rest") == (indexes, len(write_indexes(indexes)))


def test_another_schema_type_is_never_compatible():
    class Other:
        schema_type = "AVRO"

    assert ProtobufSchema.parse(V1).read_errors(Other()) != []
