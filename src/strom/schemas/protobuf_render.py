"""A FileDescriptorProto (as the pool resolved it) rendered as .proto text, in the layout of
Confluent's registry: syntax and package, imports, options, messages then enums, extends,
services; in a message: reserved, options, fields, oneofs, extension ranges, nested types.

Rendering from the resolved descriptor is what makes one text of a schema however it came
(.proto text in any formatting, or a serialized descriptor). `normalize` is Confluent's
`normalize=true`: imports and options sorted, fields by number, oneofs by their first field,
enum values by number, reserved ranges sorted, type names fully qualified with a leading dot.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2 as pb
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message import Message as ProtoMessage
from google.protobuf.message_factory import GetMessageClass

from strom.schemas.protobuf_text import MAX_FIELD_NUMBER, SCALARS

FDP = pb.FieldDescriptorProto
_SCALAR_NAMES = {number: name for name, number in SCALARS.items()}
_LABEL_NAMES = {FDP.LABEL_OPTIONAL: "optional", FDP.LABEL_REQUIRED: "required", FDP.LABEL_REPEATED: "repeated"}


def default_json_name(name: str) -> str:
    """protoc's json_name for a field that does not set one."""
    out, upper = [], False
    for ch in name:
        if ch == "_":
            upper = True
        else:
            out.append(ch.upper() if upper else ch)
            upper = False
    return "".join(out)


def escape(text: str) -> str:
    """A string for a .proto literal between double quotes."""
    table = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
             "\v": "\\v", "\\": "\\\\", "'": "\\'", '"': '\\"'}
    return "".join(table.get(ch, ch) for ch in text)


def _indent(text: str) -> str:
    return "".join(("  " + line if line else "") + "\n" for line in text.rstrip("\n").split("\n"))


class Renderer:
    def __init__(self, fdp: pb.FileDescriptorProto, pool: DescriptorPool, normalize: bool = False) -> None:
        self.fdp = fdp
        self.pool = pool
        self.normalize = normalize
        self.proto3 = fdp.syntax == "proto3"
        self.symbols = _symbols(pool, fdp)

    # -- file ------------------------------------------------------------------------------
    def file(self) -> str:
        fdp = self.fdp
        out = [f'syntax = "{fdp.syntax or "proto2"}";\n']
        if fdp.package:
            out.append(f"package {fdp.package};\n")
        public = {fdp.dependency[i] for i in fdp.public_dependency}
        imports = [d for d in fdp.dependency if d not in public]
        publics = [d for d in fdp.dependency if d in public]
        if self.normalize:
            imports, publics = sorted(set(imports)), sorted(set(publics))
        if imports or publics:
            out.append("\n")
            out += [f'import "{d}";\n' for d in imports]
            out += [f'import public "{d}";\n' for d in publics]
        options = self.options(fdp.options)
        if options:
            out.append("\n")
            out += [f"option {o};\n" for o in options]
        if fdp.message_type or fdp.enum_type:
            out.append("\n")
            out += [self.message(m, fdp.package) for m in fdp.message_type]
            out += [self.enum(e) for e in fdp.enum_type]
        if fdp.extension:
            out.append("\n")
            out.append(self.extends(fdp.extension, fdp.package))
        if fdp.service:
            out.append("\n")
            out += [self.service(s) for s in fdp.service]
        return "".join(out)

    # -- messages --------------------------------------------------------------------------
    def message(self, msg: pb.DescriptorProto, parent: str, keyword: str = "message", head: str = "") -> str:
        scope = f"{parent}.{msg.name}" if parent else msg.name
        sections: list[str] = []
        reserved = self.reserved(msg)
        if reserved:
            sections.append("".join(f"reserved {r};\n" for r in reserved))
        options = self.options(msg.options)
        if options:
            sections.append("".join(f"option {o};\n" for o in options))
        nested = {n.name: n for n in msg.nested_type}
        groups = {f.type_name.rsplit(".", 1)[-1] for f in msg.field if f.type == FDP.TYPE_GROUP}
        real_oneofs = [i for i, _ in enumerate(msg.oneof_decl)
                       if any(f.HasField("oneof_index") and f.oneof_index == i and not f.proto3_optional
                              for f in msg.field)]
        plain = [f for f in msg.field if not f.HasField("oneof_index") or f.proto3_optional]
        if self.normalize:
            plain.sort(key=lambda f: f.number)
        if plain:
            sections.append("".join(self.field(f, scope, nested) for f in plain))
        oneofs = []
        for i in real_oneofs:
            members = [f for f in msg.field if f.HasField("oneof_index") and f.oneof_index == i]
            if self.normalize:
                members.sort(key=lambda f: f.number)
            oneofs.append((msg.oneof_decl[i], members))
        if self.normalize:
            oneofs.sort(key=lambda o: o[1][0].number)
        if oneofs:
            sections.append("".join(self.oneof(decl, members, scope, nested) for decl, members in oneofs))
        if msg.extension_range:
            sections.append("".join(f"extensions {_span(r.start, r.end - 1)};\n" for r in msg.extension_range))
        inner = [n for n in msg.nested_type if not n.options.map_entry and n.name not in groups]
        if inner or msg.enum_type:
            sections.append("".join([self.message(n, scope) for n in inner] + [self.enum(e) for e in msg.enum_type]))
        if msg.extension:
            sections.append(self.extends(msg.extension, scope))
        if not sections:
            return f"{keyword} {head}{msg.name} {{}}\n" if keyword == "message" else f"{head}{{}}\n"
        body = "\n".join(_indent(s) for s in sections)
        opening = f"{keyword} {msg.name} {{" if keyword == "message" else f"{head}{{"
        return f"{opening}\n{body}}}\n"

    def field(self, f: FDP, scope: str, nested: dict[str, pb.DescriptorProto], in_oneof: bool = False) -> str:
        entry = self._map_entry(f, nested)
        if f.type == FDP.TYPE_GROUP:
            group = nested.get(f.type_name.rsplit(".", 1)[-1])
            label = "" if in_oneof else _LABEL_NAMES[f.label] + " "
            head = f"{label}group {group.name if group else f.name} = {f.number} "
            return self.message(group or pb.DescriptorProto(name=f.name), scope, keyword="group", head=head)
        if entry is not None:
            key, value = entry.field[0], entry.field[1]
            text = f"map<{self.type_of(key, scope)}, {self.type_of(value, scope)}>"
        else:
            text = self.type_of(f, scope)
            label = self._label(f, in_oneof)
            if label:
                text = f"{label} {text}"
        options = self.options(f.options, sort=False)
        if f.HasField("default_value"):
            options.append(f"default = {self._default(f)}")
        if f.HasField("json_name") and f.json_name != default_json_name(f.name):
            options.append(f'json_name = "{escape(f.json_name)}"')
        if self.normalize:
            options.sort()
        return f"{text} {f.name} = {f.number}{_compact(options)};\n"

    def oneof(self, decl: pb.OneofDescriptorProto, members: list[FDP], scope: str,
              nested: dict[str, pb.DescriptorProto]) -> str:
        sections = []
        options = self.options(decl.options)
        if options:
            sections.append("".join(f"option {o};\n" for o in options))
        sections.append("".join(self.field(f, scope, nested, in_oneof=True) for f in members))
        body = "\n".join(_indent(s) for s in sections)
        return f"oneof {decl.name} {{\n{body}}}\n"

    def _label(self, f: FDP, in_oneof: bool) -> str:
        if in_oneof:
            return ""
        if self.proto3 and f.label == FDP.LABEL_OPTIONAL:
            return "optional" if f.proto3_optional else ""
        return _LABEL_NAMES[f.label]

    def _map_entry(self, f: FDP, nested: dict[str, pb.DescriptorProto]) -> pb.DescriptorProto | None:
        if f.type != FDP.TYPE_MESSAGE or f.label != FDP.LABEL_REPEATED:
            return None
        entry = nested.get(f.type_name.rsplit(".", 1)[-1])
        if entry is not None and entry.options.map_entry and len(entry.field) == 2:
            return entry
        return None

    def type_of(self, f: FDP, scope: str) -> str:
        if f.type in _SCALAR_NAMES:
            return _SCALAR_NAMES[f.type]
        return self.type_name(f.type_name, scope)

    def type_name(self, name: str, scope: str) -> str:
        """A type's name as written in `scope`: fully qualified with a leading dot when
        normalizing, otherwise without the file's package (or whole) when that still resolves
        to the same type there."""
        full = name.lstrip(".")
        if self.normalize:
            return "." + full
        package = self.fdp.package
        candidates = [full[len(package) + 1:]] if package and full.startswith(package + ".") else []
        candidates.append(full)
        for candidate in candidates:
            if self._resolve(candidate, scope) == full:
                return candidate
        return "." + full

    def _resolve(self, name: str, scope: str) -> str | None:
        first = name.split(".", 1)[0]
        parts = scope.split(".") if scope else []
        for i in range(len(parts), -1, -1):
            prefix = ".".join(parts[:i])
            if (f"{prefix}.{first}" if prefix else first) in self.symbols:
                return f"{prefix}.{name}" if prefix else name
        return None

    def _default(self, f: FDP) -> str:
        if f.type in (FDP.TYPE_STRING,):
            return f'"{escape(f.default_value)}"'
        if f.type == FDP.TYPE_BYTES:
            return f'"{f.default_value}"'  # kept C-escaped by the descriptor
        return f.default_value

    def reserved(self, msg: pb.DescriptorProto | pb.EnumDescriptorProto, inclusive_end: bool = False) -> list[str]:
        ranges = [(r.start, r.end if inclusive_end else r.end - 1) for r in msg.reserved_range]
        names = list(msg.reserved_name)
        if self.normalize:
            ranges.sort()
            names.sort()
        return [_span(a, b) for a, b in ranges] + [f'"{escape(n)}"' for n in names]

    # -- enums, extends, services ----------------------------------------------------------
    def enum(self, enum: pb.EnumDescriptorProto) -> str:
        lines = [f"option {o};\n" for o in self.options(enum.options)]
        lines += [f"reserved {r};\n" for r in self.reserved(enum, inclusive_end=True)]
        values = list(enum.value)
        if self.normalize:
            values.sort(key=lambda v: (v.number, v.name))
        for value in values:
            options = self.options(value.options)
            lines.append(f"{value.name} = {value.number}{_compact(options)};\n")
        if not lines:
            return f"enum {enum.name} {{}}\n"
        return f"enum {enum.name} {{\n{_indent(''.join(lines))}}}\n"

    def extends(self, fields, scope: str) -> str:
        by_extendee: dict[str, list[FDP]] = {}
        for f in fields:
            by_extendee.setdefault(f.extendee, []).append(f)
        out = []
        for extendee, members in by_extendee.items():
            body = "".join(self.field(f, scope, {}) for f in members)
            out.append(f"extend {self.type_name(extendee, scope)} {{\n{_indent(body)}}}\n")
        return "".join(out)

    def service(self, service: pb.ServiceDescriptorProto) -> str:
        sections = []
        options = self.options(service.options)
        if options:
            sections.append("".join(f"option {o};\n" for o in options))
        scope = self.fdp.package
        rpcs = []
        for m in service.method:
            request = ("stream " if m.client_streaming else "") + self.type_name(m.input_type, scope)
            response = ("stream " if m.server_streaming else "") + self.type_name(m.output_type, scope)
            method_options = self.options(m.options)
            tail = " {\n" + _indent("".join(f"option {o};\n" for o in method_options)) + "}" if method_options else ""
            rpcs.append(f"rpc {m.name} ({request}) returns ({response}){tail};\n")
        if rpcs:
            sections.append("".join(rpcs))
        body = "\n".join(_indent(s) for s in sections)
        return f"service {service.name} {{\n{body}}}\n" if body else f"service {service.name} {{}}\n"

    # -- options ---------------------------------------------------------------------------
    def options(self, options: ProtoMessage, sort: bool = True) -> list[str]:
        """`name = value` for each option set, custom ones (extensions) in parentheses."""
        message = self._with_extensions(options)
        out = []
        for field, value in message.ListFields():
            if field.name == "map_entry" and not field.is_extension:
                continue
            name = f"({field.full_name})" if field.is_extension else field.name
            if field.is_repeated:  # .proto sets a repeated option once per element
                items = value.items() if _is_map(field) else value
                out += [f"{name} = {self._element(field, item)}" for item in items]
            else:
                out.append(f"{name} = {self.value(field, value)}")
        if sort and self.normalize:
            out.sort()
        return out

    def _with_extensions(self, options: ProtoMessage) -> ProtoMessage:
        raw = options.SerializeToString()
        if not raw:
            return options
        try:
            holder = GetMessageClass(self.pool.FindMessageTypeByName(options.DESCRIPTOR.full_name))()
        except KeyError:  # descriptor.proto not in the pool: no file defines custom options
            return options
        holder.ParseFromString(raw)
        return holder

    def _element(self, field, item) -> str:
        if not _is_map(field):
            return self.value_one(field, item)
        entry = field.message_type
        return ("{ key: " + self.value_one(entry.fields_by_name["key"], item[0]) + ", value: "
                + self.value_one(entry.fields_by_name["value"], item[1]) + " }")

    def value(self, field, value) -> str:
        if field.is_repeated and not _is_map(field):
            return "[" + ", ".join(self.value_one(field, v) for v in value) + "]"
        if _is_map(field):
            entries = [(k, value[k]) for k in sorted(value)] if self.normalize else list(value.items())
            vf = field.message_type.fields_by_name["value"]
            kf = field.message_type.fields_by_name["key"]
            return "[" + ", ".join(
                "{ key: " + self.value_one(kf, k) + ", value: " + self.value_one(vf, v) + " }" for k, v in entries
            ) + "]"
        return self.value_one(field, value)

    def value_one(self, field, value) -> str:
        if field.message_type is not None:
            fields = value.ListFields()
            if self.normalize:
                fields = sorted(fields, key=lambda fv: fv[0].name)
            inner = [f"{f.name}: {self.value(f, v)}" for f, v in fields]
            if not inner:
                return "{}"
            return "{\n" + _indent(",\n".join(inner)) + "}"
        if field.enum_type is not None:
            known = field.enum_type.values_by_number.get(value)
            return known.name if known else str(value)
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, str):
            return f'"{escape(value)}"'
        if isinstance(value, bytes):
            return '"' + "".join(chr(b) if 32 <= b < 127 and chr(b) not in "\\\"'" else f"\\{b:03o}"
                                 for b in value) + '"'
        return repr(value) if isinstance(value, float) else str(value)


def _is_map(field) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _compact(options: list[str]) -> str:
    if not options:
        return ""
    if len(options) == 1:
        return f" [{options[0]}]"
    return " [\n" + _indent(",\n".join(options)) + "]"


def _span(start: int, end: int) -> str:
    if end >= MAX_FIELD_NUMBER and start != end:
        return f"{start} to max"
    return str(start) if start == end else f"{start} to {end}"


def _symbols(pool: DescriptorPool, fdp: pb.FileDescriptorProto) -> set[str]:
    """Full names of the packages, messages and enums a schema can see (its file and its
    imports, transitively), for checking what a shortened type name resolves to."""
    names: set[str] = set()
    seen: set[str] = set()
    stack = [fdp.name]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            file = pool.FindFileByName(name)
        except KeyError:
            continue
        parts = file.package.split(".") if file.package else []
        names.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        types = list(file.message_types_by_name.values())
        names.update(e.full_name for e in file.enum_types_by_name.values())
        while types:
            t = types.pop()
            names.add(t.full_name)
            types.extend(t.nested_types)
            names.update(e.full_name for e in t.enum_types)
        stack.extend(d.name for d in file.dependencies)
    return names


def render(fdp: pb.FileDescriptorProto, pool: DescriptorPool, normalize: bool = False) -> str:
    return Renderer(fdp, pool, normalize).file()
