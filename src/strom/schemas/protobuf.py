"""Protobuf schemas as Confluent's registry keeps them.

A schema arrives as .proto text or as the base64 of a serialized FileDescriptorProto (what
confluent-kafka's ProtobufSerializer registers), with its imports as references. Both forms
give one ProtobufSchema: `canonical` renders it as .proto text (what the registry returns by
default) and `serialized()` as base64 (what `?format=serialized` returns, and what
confluent-kafka's deserializer asks for).

A value's payload starts with message indexes naming which message of the file wrote it:
a zigzag varint count, then that many zigzag varint indexes (the first among the file's
top-level messages, each next among the nested messages of the one before); the single byte
0 stands for [0], the first message.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence

from google.protobuf import descriptor_pb2 as pb
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message import DecodeError, EncodeError
from google.protobuf.message import Message as ProtoMessage
from google.protobuf.message_factory import GetMessageClass

from strom.schemas.parsed import MAX_DEPTH, PROTOBUF, ParsedSchema, ResolvedReference, SchemaError
from strom.schemas.protobuf_compat import read_errors as _read_errors
from strom.schemas.protobuf_pool import build, file_of
from strom.schemas.protobuf_render import render

_MAIN_FILE = "default"  # the name confluent-kafka's deserializer gives a fetched schema, too
# Protobuf's own decoder refuses messages nested deeper than 100; values given to encode are
# held to the same.
_MAX_VALUE_DEPTH = 100


class ProtobufSchema(ParsedSchema):
    """A valid Protobuf schema (one .proto file) with its imports, built into a pool."""

    schema_type = PROTOBUF

    def __init__(self, fdp: pb.FileDescriptorProto, pool: DescriptorPool, normalize: bool = False) -> None:
        self._fdp = fdp
        self._pool = pool
        self._normalize = normalize
        self._canonical: str | None = None

    @classmethod
    def parse(cls, text: str, references: Sequence[ResolvedReference] = ()) -> ProtobufSchema:
        """`text` (.proto or base64 FileDescriptorProto) with its imports resolved through
        `references`; SchemaError if it is not a valid schema."""
        if not isinstance(text, str):
            raise SchemaError("a Protobuf schema is a string")
        name = _MAIN_FILE
        while any(ref.name == name for ref in references):
            name = "_" + name
        try:
            pool, _ = build(file_of(text, name), references)
            fdp = pb.FileDescriptorProto()
            pool.FindFileByName(name).CopyToProto(fdp)
        except SchemaError:
            raise
        except RecursionError:
            raise SchemaError(f"the schema nests deeper than {MAX_DEPTH} levels") from None
        except Exception as e:  # the parser and the pool have many ways to refuse a file
            raise SchemaError(f"invalid Protobuf schema: {e}") from None
        return cls(fdp, pool)

    # -- the registry's view ---------------------------------------------------------------
    @property
    def canonical(self) -> str:
        if self._canonical is None:
            self._canonical = render(self._fdp, self._pool, self._normalize)
        return self._canonical

    def normalized(self) -> ProtobufSchema:
        return ProtobufSchema(self._fdp, self._pool, normalize=True)

    def serialized(self) -> str:
        """The schema as the base64 of its FileDescriptorProto (imports by their reference
        names), as Confluent's registry returns it with `format=serialized`."""
        return base64.standard_b64encode(self._fdp.SerializeToString()).decode("ascii")

    def read_errors(self, writer: ParsedSchema) -> list[str]:
        if not isinstance(writer, ProtobufSchema):
            return [f"Incompatible because of different schema type: {writer.schema_type} and {PROTOBUF}"]
        return _read_errors(writer.file, self.file)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProtobufSchema) and other.canonical == self.canonical

    def __hash__(self) -> int:
        return hash(self.canonical)

    def __repr__(self) -> str:
        return f"ProtobufSchema({self._fdp.package or '<no package>'}: {', '.join(self.message_names)})"

    # -- messages --------------------------------------------------------------------------
    @property
    def file(self):
        """The schema's protobuf FileDescriptor."""
        return self._pool.FindFileByName(self._fdp.name)

    @property
    def pool(self) -> DescriptorPool:
        return self._pool

    @property
    def message_names(self) -> list[str]:
        """Full names of the top-level messages, in the file's order (index 0 first)."""
        prefix = self._fdp.package + "." if self._fdp.package else ""
        return [prefix + m.name for m in self._fdp.message_type]

    @property
    def record_name(self) -> str | None:
        """The first message's full name (what a serializer of message index [0] names)."""
        names = self.message_names
        return names[0] if names else None

    def message_descriptor(self, indexes: Sequence[int] = (0,)) -> Descriptor:
        """The message that message indexes name (the first top-level message for [0]);
        a caller maps its `fields` to columns."""
        if not indexes:
            indexes = (0,)
        if len(indexes) > MAX_DEPTH + 1:
            raise SchemaError(f"{len(indexes)} message indexes: more than the schema can nest")
        names, messages = [], self._fdp.message_type
        for index in indexes:
            if not 0 <= index < len(messages):
                raise SchemaError(f"message index {index} out of range: {len(messages)} message(s) at "
                                  f"{'.'.join(names) or 'the top level'}")
            names.append(messages[index].name)
            messages = messages[index].nested_type
        full = ".".join(([self._fdp.package] if self._fdp.package else []) + names)
        return self._pool.FindMessageTypeByName(full)

    def message_indexes(self, message: Descriptor | str) -> list[int]:
        """The indexes a serializer writes for `message` (a descriptor of this schema's file,
        or its full or package-relative name)."""
        name = message if isinstance(message, str) else message.full_name
        package = self._fdp.package
        if package and name.startswith(package + "."):
            name = name[len(package) + 1:]
        indexes, messages = [], self._fdp.message_type
        for part in name.split("."):
            found = next((i for i, m in enumerate(messages) if m.name == part), None)
            if found is None:
                raise SchemaError(f"the schema has no message {name}")
            indexes.append(found)
            messages = messages[found].nested_type
        return indexes

    # -- values ----------------------------------------------------------------------------
    def decode(self, payload: bytes | memoryview) -> dict:
        """A payload (message indexes, then the message) as a dict by field name: every field
        of the message, None for one with presence that is not set; ints stay ints, bytes
        stay bytes, enums become their value names (the number when unknown)."""
        descriptor, message = self.decode_message(payload)
        return message_to_dict(message)

    def decode_message(self, payload: bytes | memoryview) -> tuple[Descriptor, ProtoMessage]:
        indexes, offset = read_indexes(payload)
        descriptor = self.message_descriptor(indexes)
        message = GetMessageClass(descriptor)()
        try:
            message.ParseFromString(bytes(memoryview(payload)[offset:]))
        except (DecodeError, RecursionError, ValueError) as e:
            raise SchemaError(f"the payload is not a {descriptor.full_name}: {e}") from None
        return descriptor, message

    def encode(self, value: Mapping, message_name: str | None = None) -> bytes:
        """`value` (a dict by field name, as decode gives) as a payload of `message_name`
        (the first top-level message by default): message indexes, then the message."""
        if message_name is None:
            indexes = [0]
            descriptor = self.message_descriptor(indexes)
        else:
            indexes = self.message_indexes(message_name)
            descriptor = self.message_descriptor(indexes)
        message = GetMessageClass(descriptor)()
        fill_message(message, value, 0)
        try:
            return write_indexes(indexes) + message.SerializeToString()
        except EncodeError as e:
            raise SchemaError(f"cannot encode {descriptor.full_name}: {e}") from None


# -- message indexes -------------------------------------------------------------------------
def read_indexes(payload: bytes | memoryview) -> tuple[list[int], int]:
    """The message indexes at the start of `payload`, and where the message starts."""
    view = memoryview(payload)
    count, offset = _read_zigzag(view, 0)
    if count == 0:
        return [0], offset
    if count < 0 or count > MAX_DEPTH + 1:
        raise SchemaError(f"invalid message index count {count}")
    indexes = []
    for _ in range(count):
        index, offset = _read_zigzag(view, offset)
        if index < 0:
            raise SchemaError(f"invalid message index {index}")
        indexes.append(index)
    return indexes, offset


def write_indexes(indexes: Sequence[int]) -> bytes:
    """Message indexes as serializers write them ([0] as the single byte 0)."""
    if list(indexes) in ([], [0]):
        return b"\x00"
    return b"".join(_zigzag(v) for v in [len(indexes), *indexes])


def _zigzag(value: int) -> bytes:
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_zigzag(view: memoryview, offset: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if offset >= len(view):
            raise SchemaError("the payload ends inside its message indexes")
        if shift > 63:
            raise SchemaError("a message index varint is longer than 10 bytes")
        byte = view[offset]
        offset += 1
        n |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (n >> 1) ^ -(n & 1), offset


# -- messages as Python data -------------------------------------------------------------------
def message_to_dict(message: ProtoMessage) -> dict:
    out: dict = {}
    for field in message.DESCRIPTOR.fields:
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _to_python(value_field, v) for k, v in getattr(message, field.name).items()}
        elif field.is_repeated:
            out[field.name] = [_to_python(field, v) for v in getattr(message, field.name)]
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _to_python(field, getattr(message, field.name))
    return out


def _to_python(field: FieldDescriptor, value):
    if field.message_type is not None:
        return message_to_dict(value)
    if field.enum_type is not None:
        known = field.enum_type.values_by_number.get(value)
        return known.name if known is not None else value
    return value


def fill_message(message: ProtoMessage, value: Mapping, depth: int) -> None:
    """Set `message`'s fields from a dict by field name (None leaves a field unset)."""
    descriptor = message.DESCRIPTOR
    if not isinstance(value, Mapping):
        raise SchemaError(f"{descriptor.full_name} takes a dict, not {type(value).__name__}")
    if depth > _MAX_VALUE_DEPTH:
        raise SchemaError(f"the value nests deeper than {_MAX_VALUE_DEPTH} messages")
    for key, item in value.items():
        field = descriptor.fields_by_name.get(key)
        if field is None:
            raise SchemaError(f"{descriptor.full_name} has no field {key!r}")
        if item is None:
            continue
        try:
            _fill_field(message, field, item, depth)
        except SchemaError:
            raise
        except (TypeError, ValueError, AttributeError) as e:
            raise SchemaError(f"{field.full_name}: {e}") from None


def _fill_field(message: ProtoMessage, field: FieldDescriptor, item, depth: int) -> None:
    if _is_map(field):
        if not isinstance(item, Mapping):
            raise SchemaError(f"{field.full_name} is a map and takes a dict")
        container = getattr(message, field.name)
        value_field = field.message_type.fields_by_name["value"]
        for k, v in item.items():
            if value_field.message_type is not None:
                fill_message(container[k], v, depth + 1)
            else:
                container[k] = _scalar(value_field, v)
    elif field.is_repeated:
        if isinstance(item, (str, bytes, Mapping)) or not isinstance(item, Sequence):
            raise SchemaError(f"{field.full_name} is repeated and takes a list")
        container = getattr(message, field.name)
        for v in item:
            if field.message_type is not None:
                fill_message(container.add(), v, depth + 1)
            else:
                container.append(_scalar(field, v))
    elif field.message_type is not None:
        sub = getattr(message, field.name)
        sub.SetInParent()
        fill_message(sub, item, depth + 1)
    else:
        setattr(message, field.name, _scalar(field, item))


def _scalar(field: FieldDescriptor, value):
    if field.enum_type is not None and isinstance(value, str):
        known = field.enum_type.values_by_name.get(value)
        if known is None:
            raise SchemaError(f"{value!r} is not a value of {field.enum_type.full_name}")
        return known.number
    return value


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry
