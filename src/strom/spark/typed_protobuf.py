"""Protobuf values as Spark columns: a message's Spark struct from its descriptor (as Spark's
from_protobuf maps it: every field nullable, enums as their names, unsigned 64-bit numbers
as decimal(20,0)), and a payload decoded with the writer schema its framing names, the
message picked by the framing's message indexes."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from strom.schemas.parsed import PROTOBUF, SchemaError, parse
from strom.schemas.protobuf import ProtobufSchema
from strom.spark.registry import FetchedSchema

F = FieldDescriptor
_UNSIGNED_64 = (F.TYPE_UINT64, F.TYPE_FIXED64)
_SCALARS: dict[int, DataType] = {
    F.TYPE_DOUBLE: DoubleType(), F.TYPE_FLOAT: FloatType(), F.TYPE_BOOL: BooleanType(),
    F.TYPE_STRING: StringType(), F.TYPE_BYTES: BinaryType(), F.TYPE_ENUM: StringType(),
    F.TYPE_INT32: IntegerType(), F.TYPE_SINT32: IntegerType(), F.TYPE_SFIXED32: IntegerType(),
    F.TYPE_INT64: LongType(), F.TYPE_SINT64: LongType(), F.TYPE_SFIXED64: LongType(),
    F.TYPE_UINT32: LongType(), F.TYPE_FIXED32: LongType(),
    F.TYPE_UINT64: DecimalType(20, 0), F.TYPE_FIXED64: DecimalType(20, 0),
}


class ProtobufColumn:
    """Decoding of one column whose reader schema is `reader` (its first message)."""

    def __init__(self, reader: FetchedSchema) -> None:
        self.reader_id = reader.schema_id
        self.descriptor = _parse(reader).message_descriptor([0])
        self.data_type = spark_type(self.descriptor)
        self._decoders: dict[int, Callable[[bytes], object]] = {}

    def decoder(self, writer: FetchedSchema) -> Callable[[bytes], object]:
        found = self._decoders.get(writer.schema_id)
        if found is None:
            if writer.schema_type != PROTOBUF:
                raise SchemaError(f"schema id {writer.schema_id} is a {writer.schema_type} schema, not Protobuf")
            schema = _parse(writer)
            wanted = self.descriptor.full_name

            def decode(data: bytes) -> object:
                descriptor, message = schema.decode_message(data)
                if descriptor.full_name != wanted:
                    raise SchemaError(f"the record is a {descriptor.full_name}, the column's message is {wanted}")
                return _row(message)

            found = self._decoders[writer.schema_id] = decode
        return found


def _parse(fetched: FetchedSchema) -> ProtobufSchema:
    schema = parse(PROTOBUF, fetched.text, fetched.references)
    assert isinstance(schema, ProtobufSchema)
    return schema


def spark_type(descriptor: Descriptor, path: tuple[str, ...] = ()) -> StructType:
    if descriptor.full_name in path:
        raise SchemaError(f"the message {descriptor.full_name} contains itself: a recursive message has no "
                          "Spark type")
    inner = (*path, descriptor.full_name)
    return StructType([StructField(f.name, _field_type(f, inner), True) for f in descriptor.fields])


def _field_type(field: FieldDescriptor, path: tuple[str, ...]) -> DataType:
    if _is_map(field):
        key, value = (field.message_type.fields_by_name[n] for n in ("key", "value"))
        return MapType(_single_type(key, path), _single_type(value, path), True)
    single = _single_type(field, path)
    return ArrayType(single, True) if field.is_repeated else single


def _single_type(field: FieldDescriptor, path: tuple[str, ...]) -> DataType:
    if field.message_type is not None:
        return spark_type(field.message_type, path)
    return _SCALARS[field.type]


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _row(message) -> dict:
    """A message as a dict in the column's shape (None for a field with presence not set)."""
    out: dict = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {_scalar(field.message_type.fields_by_name["key"], k): _single(value_field, v)
                               for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_single(field, v) for v in value]
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _single(field, value)
    return out


def _single(field: FieldDescriptor, value):
    return _row(value) if field.message_type is not None else _scalar(field, value)


def _scalar(field: FieldDescriptor, value):
    if field.type == F.TYPE_ENUM:
        known = field.enum_type.values_by_number.get(value)
        return known.name if known is not None else str(value)
    if field.type in _UNSIGNED_64:
        return Decimal(value)
    return value
