"""A schema's file and the files it imports, built into a protobuf DescriptorPool.

Imports come from the schema's references (a reference's name is the import path), except
the well-known files serializers never register (google/protobuf/*, google/type/*,
confluent/*): those every pool has, as Confluent's clients assume. A schema arrives as .proto
text or as the base64 of a serialized FileDescriptorProto (what confluent-kafka's
ProtobufSerializer registers); both become the same FileDescriptorProto here.
"""

from __future__ import annotations

import base64
import binascii
import functools
import importlib
import re
from collections.abc import Sequence

from google.protobuf import descriptor_pb2 as pb
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass

from strom.schemas.parsed import MAX_DEPTH, MAX_REFERENCES, ResolvedReference, SchemaError
from strom.schemas.protobuf_text import MAX_TEXT_CHARS, PendingOption, parse_proto_text, set_field

MAX_SERIALIZED_BYTES = 1024 * 1024
_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]+")
BUILTIN_PREFIXES = ("google/protobuf/", "google/type/", "confluent/")

_WELL_KNOWN = ("any", "api", "descriptor", "duration", "empty", "field_mask", "source_context",
               "struct", "timestamp", "type", "wrappers")
_GOOGLE_TYPES = ("calendar_period", "color", "date", "datetime", "dayofweek", "expr", "fraction",
                 "latlng", "money", "month", "postal_address", "quaternion", "timeofday")

# Confluent's own imports, as its clients define them (field numbers are the wire contract).
_CONFLUENT_FILES = {
    "confluent/meta.proto": """
syntax = "proto3";
package confluent;
import "google/protobuf/descriptor.proto";
message Meta {
  string doc = 1;
  map<string, string> params = 2;
  repeated string tags = 3;
  repeated Rule rules = 4;
}
message Rule {
  string name = 1;
  string doc = 2;
  string expr = 3;
  string sql = 4;
}
extend google.protobuf.FileOptions { Meta file_meta = 1088; }
extend google.protobuf.MessageOptions { Meta message_meta = 1088; }
extend google.protobuf.FieldOptions { Meta field_meta = 1088; }
extend google.protobuf.EnumOptions { Meta enum_meta = 1088; }
extend google.protobuf.EnumValueOptions { Meta enum_value_meta = 1088; }
""",
    "confluent/type/decimal.proto": """
syntax = "proto3";
package confluent.type;
message Decimal {
  bytes value = 1;
  uint32 precision = 2;
  int32 scale = 3;
}
""",
}


def is_builtin(name: str) -> bool:
    return name.startswith(BUILTIN_PREFIXES)


@functools.cache
def builtin_files() -> dict[str, pb.FileDescriptorProto]:
    """Every well-known file this process can offer, by import path."""
    files: dict[str, pb.FileDescriptorProto] = {}
    modules = [f"google.protobuf.{n}_pb2" for n in _WELL_KNOWN]
    modules += [f"google.type.{n}_pb2" for n in _GOOGLE_TYPES]  # googleapis-common-protos, if there
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        files[module.DESCRIPTOR.name] = pb.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
    for name, text in _CONFLUENT_FILES.items():
        fdp, pending = parse_proto_text(text, name)
        assert not pending
        files[name] = fdp
    return files


def file_of(text: str, name: str) -> tuple[pb.FileDescriptorProto, list[PendingOption]]:
    """A schema's text (.proto or base64 FileDescriptorProto) as a FileDescriptorProto."""
    if not text.strip():
        raise SchemaError("the schema is empty")
    if _BASE64.fullmatch(text):
        return _from_serialized(text, name), []
    return parse_proto_text(text, name)


def _from_serialized(text: str, name: str) -> pb.FileDescriptorProto:
    if len(text) > MAX_SERIALIZED_BYTES * 4 // 3 + 4096:
        raise SchemaError(f"the serialized schema is larger than {MAX_SERIALIZED_BYTES} bytes")
    try:
        raw = base64.b64decode("".join(text.split()), validate=True)
        fdp = pb.FileDescriptorProto.FromString(raw)
    except (binascii.Error, ValueError, DecodeError) as e:
        if "MaxDepth" in str(e):
            raise SchemaError(f"the schema nests deeper than {MAX_DEPTH} levels") from None
        raise SchemaError(f"neither .proto text nor a base64 FileDescriptorProto: {e}") from None
    fdp.name = name
    stack = [(m, 1) for m in fdp.message_type]
    while stack:
        message, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise SchemaError(f"the schema nests messages deeper than {MAX_DEPTH} levels")
        stack.extend((m, depth + 1) for m in message.nested_type)
    return fdp


def build(main: tuple[pb.FileDescriptorProto, list[PendingOption]],
          references: Sequence[ResolvedReference]) -> tuple[DescriptorPool, list[pb.FileDescriptorProto]]:
    """The pool holding `main`, its imports (from `references`) and the well-known files;
    and the files of the references, in the order they were added."""
    ordered: list[tuple[pb.FileDescriptorProto, list[PendingOption]]] = []
    _load(references, ordered, set(), 1)
    ordered.append(main)
    files: list[pb.FileDescriptorProto] = []
    for fdp, pending in ordered:
        if pending:
            _apply_options(_pool_of(files + [fdp]), pending)
        files.append(fdp)
    return _pool_of(files), files[:-1]


def _load(references: Sequence[ResolvedReference], into: list, seen: set[str], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise SchemaError(f"references nest deeper than {MAX_DEPTH} levels")
    for ref in references:
        if ref.name in seen or (is_builtin(ref.name) and ref.name in builtin_files()):
            continue
        seen.add(ref.name)
        if len(seen) > MAX_REFERENCES:
            raise SchemaError(f"the schema has more than {MAX_REFERENCES} references")
        _load(ref.references, into, seen, depth + 1)
        try:
            into.append(file_of(ref.schema, ref.name))
        except SchemaError as e:
            raise SchemaError(f"reference {ref.name}: {e}") from None


def _pool_of(files: list[pb.FileDescriptorProto]) -> DescriptorPool:
    pool = DescriptorPool()
    added: set[str] = set()
    given = {f.name: f for f in files}
    builtins = builtin_files()

    def add(fdp: pb.FileDescriptorProto, chain: tuple[str, ...]) -> None:
        if fdp.name in added:
            return
        for dep in fdp.dependency:
            if dep in chain:
                raise SchemaError(f"import cycle through {dep}")
            target = builtins.get(dep) if is_builtin(dep) and dep in builtins else given.get(dep)
            if target is None:
                where = "" if fdp is files[-1] else f" (imported by {fdp.name})"
                raise SchemaError(f"import {dep!r}{where} is neither a reference of the schema nor a well-known file")
            add(target, chain + (dep,))
        try:
            pool.Add(fdp)
        except Exception as e:  # the pool says TypeError, KeyError or ValueError, by case
            raise SchemaError(f"invalid schema {fdp.name}: {e}") from None
        added.add(fdp.name)

    for fdp in files:
        add(fdp, (fdp.name,))
    return pool


_OPTION_NAME = re.compile(r"\(([^()]+)\)((?:\.\w+)*)")


def _apply_options(pool: DescriptorPool, pending: list[PendingOption]) -> None:
    """Custom options set as the extensions they name, found in `pool`."""
    for option in pending:
        m = _OPTION_NAME.fullmatch(option.name)
        if m is None:
            raise SchemaError(f"invalid option name {option.name}")
        extension = _find_extension(pool, m.group(1), option.scope)
        extendee = option.target.DESCRIPTOR.full_name
        if extension is None or extension.containing_type.full_name != extendee:
            raise SchemaError(f"unknown option {option.name} on {option.target.DESCRIPTOR.name}")
        holder = GetMessageClass(pool.FindMessageTypeByName(extendee))()
        path = [p for p in m.group(2).split(".") if p]
        if not path:
            set_field(holder, extension, option.value)
        else:
            if extension.message_type is None or extension.is_repeated:
                raise SchemaError(f"option {option.name}: {m.group(1)} has no fields")
            current = holder.Extensions[extension]
            for part in path[:-1]:
                field = current.DESCRIPTOR.fields_by_name.get(part)
                if field is None or field.message_type is None or field.is_repeated:
                    raise SchemaError(f"option {option.name}: no message field {part}")
                current = getattr(current, part)
            field = current.DESCRIPTOR.fields_by_name.get(path[-1])
            if field is None:
                raise SchemaError(f"option {option.name}: no field {path[-1]}")
            set_field(current, field, option.value)
        option.target.MergeFromString(holder.SerializeToString())


def _find_extension(pool: DescriptorPool, name: str, scope: str):
    if name.startswith("."):
        candidates = [name[1:]]
    else:
        parts = scope.split(".") if scope else []
        candidates = [".".join(parts[:i] + [name]) for i in range(len(parts), -1, -1)]
    for candidate in candidates:
        try:
            return pool.FindExtensionByName(candidate)
        except KeyError:
            continue
    return None


__all__ = ["MAX_SERIALIZED_BYTES", "MAX_TEXT_CHARS", "build", "builtin_files", "file_of", "is_builtin"]
