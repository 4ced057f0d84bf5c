""".proto text as a FileDescriptorProto, the form protobuf's descriptor pool builds from.

proto_schema_parser gives the syntax tree; this module lowers it as protoc would (map entry
messages, group types, proto3 `optional` as a synthetic oneof). Type names are left as
written: the pool resolves them in protobuf's scoping rules. Options whose name is in
parentheses (custom options, extensions of the *Options messages) cannot be set until their
extension is known, so they come back apart, as PendingOption, for the pool to apply.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from google.protobuf import descriptor_pb2 as pb
from google.protobuf.message import Message as ProtoMessage
from proto_schema_parser import ast
from proto_schema_parser.parser import Parser

from strom.schemas.parsed import MAX_DEPTH, SchemaError

# .proto text longer than this is refused before parsing: the parser is pure Python and a
# client must not be able to hold a request thread for long.
MAX_TEXT_CHARS = 256 * 1024

FDP = pb.FieldDescriptorProto
SCALARS = {
    "double": FDP.TYPE_DOUBLE, "float": FDP.TYPE_FLOAT, "int64": FDP.TYPE_INT64,
    "uint64": FDP.TYPE_UINT64, "int32": FDP.TYPE_INT32, "fixed64": FDP.TYPE_FIXED64,
    "fixed32": FDP.TYPE_FIXED32, "bool": FDP.TYPE_BOOL, "string": FDP.TYPE_STRING,
    "bytes": FDP.TYPE_BYTES, "uint32": FDP.TYPE_UINT32, "sfixed32": FDP.TYPE_SFIXED32,
    "sfixed64": FDP.TYPE_SFIXED64, "sint32": FDP.TYPE_SINT32, "sint64": FDP.TYPE_SINT64,
}
_LABELS = {
    ast.FieldCardinality.OPTIONAL: FDP.LABEL_OPTIONAL,
    ast.FieldCardinality.REQUIRED: FDP.LABEL_REQUIRED,
    ast.FieldCardinality.REPEATED: FDP.LABEL_REPEATED,
}
MAX_FIELD_NUMBER = 536_870_911
MAX_ENUM_NUMBER = 2_147_483_647


@dataclass
class PendingOption:
    """A custom option: set on `target` (an *Options message) once its extension resolves
    (`name` as written, e.g. "(confluent.field_meta).doc"; `scope` the full name of where
    it was written, for the lookup)."""

    target: ProtoMessage
    name: str
    value: object
    scope: str


def check_nesting(text: str) -> None:
    """Refuse text nested deeper than MAX_DEPTH before the recursive parser sees it."""
    depth = 0
    for token in re.finditer(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|//[^\n]*|/\*.*?\*/|[{}<>\[\]()]',
                             text, re.DOTALL):
        ch = token.group()
        if ch in "{<[(":
            depth += 1
            if depth > MAX_DEPTH:
                raise SchemaError(f"the schema nests deeper than {MAX_DEPTH} levels")
        elif ch in "}>])":
            depth = max(depth - 1, 0)


def parse_proto_text(text: str, name: str) -> tuple[pb.FileDescriptorProto, list[PendingOption]]:
    """`text` as a FileDescriptorProto named `name`, and its custom options still to set."""
    if len(text) > MAX_TEXT_CHARS:
        raise SchemaError(f"the schema has {len(text)} characters, more than {MAX_TEXT_CHARS}")
    check_nesting(text)
    try:
        tree = Parser(setup_lexer=_strict, setup_parser=_strict).parse(text)
    except SchemaError:
        raise
    except (ValueError, TypeError, AttributeError, RecursionError) as e:
        raise SchemaError(f"invalid .proto: {e}") from None
    return _Lowering(name).file(tree)


class _RaisingListener:
    """ANTLR's default listener prints and recovers; a schema with a syntax error is refused."""

    def syntaxError(self, recognizer, symbol, line, column, msg, e):  # noqa: N802 (ANTLR's name)
        raise SchemaError(f"invalid .proto at line {line}:{column}: {msg}")

    def reportAmbiguity(self, *args):  # noqa: N802
        pass

    def reportAttemptingFullContext(self, *args):  # noqa: N802
        pass

    def reportContextSensitivity(self, *args):  # noqa: N802
        pass


def _strict(recognizer) -> None:
    recognizer.removeErrorListeners()
    recognizer.addErrorListener(_RaisingListener())


_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
            "\\": "\\", "'": "'", '"': '"', "?": "?"}


def unescape(text: str) -> str:
    """A .proto string literal's content (quotes already gone) with its C escapes undone."""
    if "\\" not in text:
        return text

    def one(m: re.Match) -> str:
        s = m.group(1)
        if s[0] in "xX":
            return chr(int(s[1:], 16))
        if s[0] in "01234567":
            return chr(int(s, 8))
        if s[0] in "uU":
            return chr(int(s[1:], 16))
        return _ESCAPES.get(s, s)

    return re.sub(r"\\([xX][0-9a-fA-F]{1,2}|[0-7]{1,3}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)", one, text)


def map_entry_name(field_name: str) -> str:
    """protoc's name for a map field's entry message: the field in CamelCase, then Entry."""
    return "".join(part[:1].upper() + part[1:] for part in field_name.split("_")) + "Entry"


class _Lowering:
    def __init__(self, name: str) -> None:
        self.name = name
        self.pending: list[PendingOption] = []
        self.proto3 = False

    def file(self, tree: ast.File) -> tuple[pb.FileDescriptorProto, list[PendingOption]]:
        if tree.edition is not None:
            raise SchemaError("protobuf editions are not supported, only proto2 and proto3")
        syntax = tree.syntax or "proto2"
        if syntax not in ("proto2", "proto3"):
            raise SchemaError(f"unknown syntax {syntax!r}")
        self.proto3 = syntax == "proto3"
        fd = pb.FileDescriptorProto(name=self.name, syntax=syntax)
        packages = [e.name for e in tree.file_elements if isinstance(e, ast.Package)]
        if len(packages) > 1:
            raise SchemaError("a .proto has at most one package statement")
        fd.package = packages[0] if packages else ""
        scope = fd.package
        for element in tree.file_elements:
            if isinstance(element, ast.Import):
                if element.name in fd.dependency:
                    raise SchemaError(f"{element.name} is imported twice")
                fd.dependency.append(element.name)
                if element.public:
                    fd.public_dependency.append(len(fd.dependency) - 1)
                if element.weak:
                    fd.weak_dependency.append(len(fd.dependency) - 1)
            elif isinstance(element, ast.Option):
                self.option(fd.options, element, scope)
            elif isinstance(element, ast.Message):
                self.message(fd.message_type.add(), element, _join(scope, element.name))
            elif isinstance(element, ast.Enum):
                self.enum(fd.enum_type.add(), element, scope)
            elif isinstance(element, ast.Extension):
                self.extend(fd.extension, fd.message_type, element, scope)
            elif isinstance(element, ast.Service):
                self.service(fd.service.add(), element, scope)
        return fd, self.pending

    def message(self, msg: pb.DescriptorProto, node: ast.Message | ast.Group, scope: str) -> None:
        msg.name = node.name
        real_oneofs: list[tuple[ast.OneOf, int]] = []
        for element in node.elements:
            if isinstance(element, ast.Field):
                self.field(msg.field.add(), element, scope)
            elif isinstance(element, ast.MapField):
                self.map_field(msg, element, scope)
            elif isinstance(element, ast.Group):
                self.group(msg, element, scope)
            elif isinstance(element, ast.OneOf):
                index = len(msg.oneof_decl)
                real_oneofs.append((element, index))
                decl = msg.oneof_decl.add(name=element.name)
                for part in element.elements:
                    if isinstance(part, ast.Option):
                        self.option(decl.options, part, scope)
                    elif isinstance(part, ast.Field):
                        field = msg.field.add()
                        self.field(field, part, scope, in_oneof=True)
                        field.oneof_index = index
                    elif isinstance(part, ast.Group):
                        self.group(msg, part, scope, oneof_index=index)
                if not any(f.HasField("oneof_index") and f.oneof_index == index for f in msg.field):
                    raise SchemaError(f"oneof {element.name} in {scope} has no fields")
            elif isinstance(element, ast.Option):
                self.option(msg.options, element, scope)
            elif isinstance(element, ast.ExtensionRange):
                for text in element.ranges:
                    low, high = _range(text, MAX_FIELD_NUMBER)
                    r = msg.extension_range.add(start=low, end=high + 1)
                    for option in element.options:
                        self.option(r.options, option, scope)
            elif isinstance(element, ast.Reserved):
                for text in element.ranges:
                    low, high = _range(text, MAX_FIELD_NUMBER)
                    msg.reserved_range.add(start=low, end=high + 1)
                msg.reserved_name.extend(unescape(n) for n in element.names)
            elif isinstance(element, ast.Message):
                self.message(msg.nested_type.add(), element, _join(scope, element.name))
            elif isinstance(element, ast.Enum):
                self.enum(msg.enum_type.add(), element, scope)
            elif isinstance(element, ast.Extension):
                self.extend(msg.extension, msg.nested_type, element, scope)
        # protoc puts proto3 optional's synthetic oneofs after every real one
        for field in msg.field:
            if field.proto3_optional:
                field.oneof_index = len(msg.oneof_decl)
                name = "_" + field.name
                while any(o.name == name for o in msg.oneof_decl):
                    name = "X" + name
                msg.oneof_decl.add(name=name)

    def field(self, field: FDP, node: ast.Field, scope: str, in_oneof: bool = False) -> None:
        field.name = node.name
        field.number = node.number
        if node.type in SCALARS:
            field.type = SCALARS[node.type]
        else:
            field.type_name = node.type
        if in_oneof:
            field.label = FDP.LABEL_OPTIONAL
        elif node.cardinality is None:
            if not self.proto3:
                raise SchemaError(f"field {scope}.{node.name} needs a label (optional, required or repeated) in proto2")
            field.label = FDP.LABEL_OPTIONAL
        else:
            field.label = _LABELS[node.cardinality]
            if self.proto3 and node.cardinality is ast.FieldCardinality.REQUIRED:
                raise SchemaError(f"field {scope}.{node.name}: required fields are not allowed in proto3")
            if self.proto3 and node.cardinality is ast.FieldCardinality.OPTIONAL:
                field.proto3_optional = True
        self.field_options(field, node.options, scope)

    def field_options(self, field: FDP, options: list[ast.Option], scope: str) -> None:
        for option in options:
            if option.name == "default":
                field.default_value = _default_text(option.value)
            elif option.name == "json_name":
                field.json_name = _string(option.value, "json_name")
            else:
                self.option(field.options, option, scope)

    def map_field(self, msg: pb.DescriptorProto, node: ast.MapField, scope: str) -> None:
        entry = msg.nested_type.add(name=map_entry_name(node.name))
        entry.options.map_entry = True
        key = entry.field.add(name="key", number=1, label=FDP.LABEL_OPTIONAL)
        if node.key_type not in SCALARS or node.key_type in ("double", "float", "bytes"):
            raise SchemaError(f"map field {scope}.{node.name}: {node.key_type} cannot be a map key")
        key.type = SCALARS[node.key_type]
        value = entry.field.add(name="value", number=2, label=FDP.LABEL_OPTIONAL)
        if node.value_type in SCALARS:
            value.type = SCALARS[node.value_type]
        else:
            value.type_name = node.value_type
        field = msg.field.add(name=node.name, number=node.number, label=FDP.LABEL_REPEATED,
                              type=FDP.TYPE_MESSAGE, type_name=entry.name)
        self.field_options(field, node.options, scope)

    def group(self, msg: pb.DescriptorProto, node: ast.Group, scope: str, oneof_index: int | None = None) -> None:
        if self.proto3:
            raise SchemaError(f"group {scope}.{node.name}: groups are not allowed in proto3")
        self.message(msg.nested_type.add(), node, _join(scope, node.name))
        field = msg.field.add(name=node.name.lower(), number=node.number, type=FDP.TYPE_GROUP,
                              type_name=node.name)
        if oneof_index is not None:
            field.label = FDP.LABEL_OPTIONAL
            field.oneof_index = oneof_index
        else:
            field.label = _LABELS[node.cardinality or ast.FieldCardinality.OPTIONAL]

    def enum(self, enum: pb.EnumDescriptorProto, node: ast.Enum, scope: str) -> None:
        enum.name = node.name
        for element in node.elements:
            if isinstance(element, ast.EnumValue):
                value = enum.value.add(name=element.name, number=element.number)
                for option in element.options:
                    self.option(value.options, option, scope)
            elif isinstance(element, ast.Option):
                self.option(enum.options, element, scope)
            elif isinstance(element, ast.EnumReserved):
                for text in element.ranges:
                    low, high = _range(text, MAX_ENUM_NUMBER)
                    enum.reserved_range.add(start=low, end=high)
                enum.reserved_name.extend(unescape(n) for n in element.names)
        if not enum.value:
            raise SchemaError(f"enum {_join(scope, node.name)} has no values")

    def extend(self, into, messages, node: ast.Extension, scope: str) -> None:
        for element in node.elements:
            if isinstance(element, ast.Field):
                field = into.add()
                self.field(field, element, scope)
                field.proto3_optional = False
            elif isinstance(element, ast.Group):
                holder = pb.DescriptorProto()
                self.group(holder, element, scope)
                messages.add().CopyFrom(holder.nested_type[0])
                field = into.add()
                field.CopyFrom(holder.field[0])
            else:
                continue
            field.extendee = node.typeName

    def service(self, service: pb.ServiceDescriptorProto, node: ast.Service, scope: str) -> None:
        service.name = node.name
        for element in node.elements:
            if isinstance(element, ast.Option):
                self.option(service.options, element, scope)
            elif isinstance(element, ast.Method):
                method = service.method.add(name=element.name, input_type=element.input_type.type,
                                            output_type=element.output_type.type)
                if element.input_type.stream:
                    method.client_streaming = True
                if element.output_type.stream:
                    method.server_streaming = True
                for option in element.elements:
                    if isinstance(option, ast.Option):
                        self.option(method.options, option, scope)

    def option(self, target: ProtoMessage, node: ast.Option, scope: str) -> None:
        if node.name.startswith("("):
            self.pending.append(PendingOption(target, node.name, node.value, scope))
            return
        field = target.DESCRIPTOR.fields_by_name.get(node.name)
        if field is None:
            raise SchemaError(f"unknown option {node.name} on {target.DESCRIPTOR.name}")
        set_field(target, field, node.value)


def set_field(target: ProtoMessage, field, value: object) -> None:
    """Set `field` of `target` from an option value as parsed (scalar, identifier, message
    literal or list); SchemaError when the value does not fit the field."""
    try:
        if isinstance(value, list):
            if not field.is_repeated:
                raise SchemaError(f"option {field.name} takes one value, not a list")
            for item in value:
                _set_one(target, field, item)
        else:
            _set_one(target, field, value)
    except SchemaError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        raise SchemaError(f"option {field.name}: {e}") from None


def _set_one(target: ProtoMessage, field, value: object) -> None:
    extension = getattr(field, "is_extension", False)
    if field.type in (FDP.TYPE_MESSAGE, FDP.TYPE_GROUP):
        if not isinstance(value, ast.MessageLiteral):
            raise SchemaError(f"option {field.name} takes a message literal {{ ... }}")
        if field.message_type.GetOptions().map_entry:
            _set_entry(target.Extensions[field] if extension else getattr(target, field.name),
                       field.message_type, value)
            return
        if field.is_repeated:
            sub = (target.Extensions[field] if extension else getattr(target, field.name)).add()
        else:
            sub = target.Extensions[field] if extension else getattr(target, field.name)
            sub.SetInParent()
        fill_literal(sub, value)
        return
    scalar = scalar_value(field, value)
    if field.is_repeated:
        (target.Extensions[field] if extension else getattr(target, field.name)).append(scalar)
    elif extension:
        target.Extensions[field] = scalar
    else:
        setattr(target, field.name, scalar)


def _set_entry(container, entry, literal: ast.MessageLiteral) -> None:
    parts = {e.name: e.value for e in literal.elements if isinstance(e, ast.MessageLiteralField)}
    if "key" not in parts:
        raise SchemaError(f"a map entry of {entry.full_name} needs a key")
    key = scalar_value(entry.fields_by_name["key"], parts["key"])
    value_field = entry.fields_by_name["value"]
    if value_field.message_type is not None:
        if not isinstance(parts.get("value", ast.MessageLiteral()), ast.MessageLiteral):
            raise SchemaError(f"a map entry of {entry.full_name} takes a message value")
        fill_literal(container[key], parts.get("value", ast.MessageLiteral()))
    elif "value" in parts:
        container[key] = scalar_value(value_field, parts["value"])


def fill_literal(target: ProtoMessage, literal: ast.MessageLiteral) -> None:
    for element in literal.elements:
        if not isinstance(element, ast.MessageLiteralField):
            continue
        field = target.DESCRIPTOR.fields_by_name.get(element.name)
        if field is None:
            raise SchemaError(f"{target.DESCRIPTOR.full_name} has no field {element.name}")
        set_field(target, field, element.value)


def scalar_value(field, value: object) -> object:
    """An option's scalar as the Python value `field` holds."""
    if field.type == FDP.TYPE_ENUM:
        if isinstance(value, ast.Identifier):
            known = field.enum_type.values_by_name.get(value.name)
            if known is None:
                raise SchemaError(f"option {field.name}: {value.name} is not a value of {field.enum_type.full_name}")
            return known.number
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise SchemaError(f"option {field.name} takes an enum value")
    if isinstance(value, ast.Identifier):
        if field.type in (FDP.TYPE_DOUBLE, FDP.TYPE_FLOAT) and value.name in ("inf", "nan"):
            return float(value.name)
        raise SchemaError(f"option {field.name}: unexpected identifier {value.name}")
    if field.type == FDP.TYPE_STRING:
        return _string(value, field.name)
    if field.type == FDP.TYPE_BYTES:
        return _string(value, field.name).encode("latin-1")
    if field.type == FDP.TYPE_BOOL:
        if not isinstance(value, bool):
            raise SchemaError(f"option {field.name} takes true or false")
        return value
    if field.type in (FDP.TYPE_DOUBLE, FDP.TYPE_FLOAT):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SchemaError(f"option {field.name} takes a number")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SchemaError(f"option {field.name} takes an integer")
    return value


def _string(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise SchemaError(f"option {name} takes a string")
    return unescape(value)


def _default_text(value: object) -> str:
    """A field's default as FieldDescriptorProto.default_value keeps it (text)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, ast.Identifier):
        return value.name
    if isinstance(value, str):
        return unescape(value)
    if isinstance(value, (int, float)):
        return repr(value)
    raise SchemaError("a field's default is a scalar")


def _range(text: str, maximum: int) -> tuple[int, int]:
    parts = [p.strip() for p in text.split("to")]
    try:
        low = int(parts[0], 0)
        high = low if len(parts) == 1 else (maximum if parts[1] == "max" else int(parts[1], 0))
    except ValueError:
        raise SchemaError(f"invalid range {text!r}") from None
    if len(parts) > 2 or high < low:
        raise SchemaError(f"invalid range {text!r}")
    return low, high


def _join(scope: str, name: str) -> str:
    return f"{scope}.{name}" if scope else name
