"""Confluent's compatibility rules for Protobuf: what a reader schema cannot read of what a
writer schema wrote.

Messages match by name (top level and nested), fields by number. The changes that break a
reader (the rest, like adding or removing an optional field, renaming a field or moving a
message, are allowed):
PACKAGE_CHANGED, MESSAGE_REMOVED, FIELD_KIND_CHANGED (scalar, message or map),
FIELD_SCALAR_KIND_CHANGED (outside one wire-compatible group), FIELD_NAMED_TYPE_CHANGED,
REQUIRED_FIELD_ADDED, REQUIRED_FIELD_REMOVED, ONEOF_FIELD_REMOVED,
MULTIPLE_FIELDS_MOVED_TO_ONEOF, FIELD_MOVED_TO_EXISTING_ONEOF.
Paths are Confluent's: "#/" then message names, then the oneof name and field number.
"""

from __future__ import annotations

from collections import deque

from google.protobuf import descriptor_pb2 as pb
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor

FD = FieldDescriptor

# Scalars whose values a reader of another kind in the same group still reads (the groups of
# protobuf's "updating a message type" rules); enums read as the first group.
_SCALAR_GROUPS = {
    FD.TYPE_INT32: "number", FD.TYPE_INT64: "number", FD.TYPE_UINT32: "number",
    FD.TYPE_UINT64: "number", FD.TYPE_BOOL: "number", FD.TYPE_ENUM: "number",
    FD.TYPE_SINT32: "signed", FD.TYPE_SINT64: "signed",
    FD.TYPE_STRING: "text", FD.TYPE_BYTES: "text",
    FD.TYPE_FIXED32: "fixed32", FD.TYPE_SFIXED32: "fixed32",
    FD.TYPE_FIXED64: "fixed64", FD.TYPE_SFIXED64: "fixed64",
    FD.TYPE_FLOAT: "float", FD.TYPE_DOUBLE: "double",
}

_DESCRIPTIONS = {
    "PACKAGE_CHANGED": "The package at '{path}' in the reader schema does not match the package in the writer schema",
    "MESSAGE_REMOVED": "The reader schema is missing a field of type MESSAGE at path '{path}' in the writer schema",
    "FIELD_KIND_CHANGED": "The type of a field at path '{path}' in the reader schema does not match the writer schema",
    "FIELD_SCALAR_KIND_CHANGED": ("The kind of a SCALAR field at path '{path}' in the reader schema does not match "
                                  "its kind in the writer schema"),
    "FIELD_NAMED_TYPE_CHANGED": ("The type of a MESSAGE field at path '{path}' in the reader schema does not match "
                                 "its type in the writer schema"),
    "REQUIRED_FIELD_ADDED": "A required field at path '{path}' in the reader schema is missing in the writer schema",
    "REQUIRED_FIELD_REMOVED": "The reader schema is missing a required field at path '{path}' in the writer schema",
    "ONEOF_FIELD_REMOVED": "The reader schema is missing a oneof field at path '{path}' in the writer schema",
    "MULTIPLE_FIELDS_MOVED_TO_ONEOF": ("Multiple fields in the oneof at path '{path}' in the reader schema are "
                                       "outside a oneof in the writer schema"),
    "FIELD_MOVED_TO_EXISTING_ONEOF": ("A field moved into the oneof at path '{path}' in the reader schema that "
                                      "already held other fields in the writer schema"),
}


def describe(kind: str, path: str) -> str:
    """One incompatibility as Confluent's registry reports it."""
    return f"{{errorType:'{kind}', description:'{_DESCRIPTIONS[kind].format(path=path)}'}}"


Key = tuple[str, str]  # (writer's full name, reader's full name) of a message pair


class _Diff:
    """Compares message pairs from a worklist, never by recursion: a schema's messages may
    hold each other in chains as long as the schema is. A field whose message types pair up
    depends on that pair; a pair with findings makes each field depending on it (and, in
    turn, theirs) FIELD_NAMED_TYPE_CHANGED, as Confluent reports."""

    def __init__(self) -> None:
        self.found: dict[Key | None, list[tuple[str, str]]] = {None: []}
        self.depends: dict[Key, list[tuple[str, Key]]] = {}  # field path -> the pair it holds
        self.queue: deque[tuple[Key, Descriptor, Descriptor, str]] = deque()
        self.current: Key | None = None

    def add(self, kind: str, path: str) -> None:
        self.found[self.current].append((kind, path))

    def pair(self, w: Descriptor, r: Descriptor, path: str) -> Key:
        key = (w.full_name, r.full_name)
        if key not in self.found:
            self.found[key] = []
            self.depends[key] = []
            self.queue.append((key, w, r, path))
        return key

    def files(self, writer: FileDescriptor, reader: FileDescriptor) -> list[tuple[str, str]]:
        if writer.package != reader.package:
            self.add("PACKAGE_CHANGED", "#/")
        self.types(list(writer.message_types_by_name.values()),
                   list(reader.message_types_by_name.values()), "#")
        while self.queue:
            self.current, w, r, path = self.queue.popleft()
            self._message(w, r, path)
        broken = {key for key, found in self.found.items() if key is not None and found}
        holders: dict[Key, list[Key]] = {}
        for holder, deps in self.depends.items():
            for _, key in deps:
                holders.setdefault(key, []).append(holder)
        spread = deque(broken)
        while spread:
            for holder in holders.get(spread.popleft(), ()):
                if holder not in broken:
                    broken.add(holder)
                    spread.append(holder)
        out: list[tuple[str, str]] = []
        for key, found in self.found.items():
            out += found
            out += [("FIELD_NAMED_TYPE_CHANGED", path) for path, dep in self.depends.get(key, ()) if dep in broken]
        return list(dict.fromkeys(out))

    def types(self, writer: list[Descriptor], reader: list[Descriptor], path: str) -> None:
        readers = {m.name: m for m in reader}
        for w in writer:
            r = readers.get(w.name)
            if r is None:
                if not w.GetOptions().map_entry:
                    self.add("MESSAGE_REMOVED", f"{path}/{w.name}")
            else:
                self.pair(w, r, f"{path}/{w.name}")

    def _message(self, w: Descriptor, r: Descriptor, path: str) -> None:
        w_syn, r_syn = _synthetic_oneofs(w), _synthetic_oneofs(r)
        w_top = {f.number: f for f in w.fields if _oneof(f, w_syn) is None}
        r_top = {f.number: f for f in r.fields if _oneof(f, r_syn) is None}
        w_all = {f.number: f for f in w.fields}
        r_all = {f.number: f for f in r.fields}
        w_oneofs = {o.name: o for o in w.oneofs if o.name not in w_syn}
        r_oneofs = {o.name: o for o in r.oneofs if o.name not in r_syn}
        w_in_oneof = {f.number for o in w_oneofs.values() for f in o.fields}
        for name, oneof in r_oneofs.items():
            moved = sum(1 for f in oneof.fields if f.number in w_top)
            existing = sum(1 for f in oneof.fields if f.number not in w_top and f.number in w_in_oneof)
            for f in oneof.fields:
                w_top.pop(f.number, None)  # moved in: not a removal
            if moved > 1:
                self.add("MULTIPLE_FIELDS_MOVED_TO_ONEOF", f"{path}/{name}")
            elif moved == 1 and existing:
                self.add("FIELD_MOVED_TO_EXISTING_ONEOF", f"{path}/{name}")
        for name, w_oneof in w_oneofs.items():
            r_oneof = r_oneofs.get(name)
            if r_oneof is None:
                continue
            r_members = {f.number: f for f in r_oneof.fields}
            for f in sorted(w_oneof.fields, key=lambda f: f.number):
                if f.number in r_members:
                    self.field(f, r_members[f.number], f"{path}/{name}/{f.number}")
                elif f.number not in r_all:
                    self.add("ONEOF_FIELD_REMOVED", f"{path}/{name}/{f.number}")
        for name, w_oneof in w_oneofs.items():  # a oneof gone with its fields
            if name not in r_oneofs:
                for f in w_oneof.fields:
                    if f.number not in r_all:
                        self.add("ONEOF_FIELD_REMOVED", f"{path}/{name}/{f.number}")
        for number in sorted(set(w_top) | set(r_top)):
            wf, rf = w_top.get(number), r_top.get(number)
            where = f"{path}/{number}"
            if rf is None:
                if wf is not None and wf.number not in r_all and wf.is_required:
                    self.add("REQUIRED_FIELD_REMOVED", where)
            elif wf is None:
                if rf.number not in w_all and rf.is_required:
                    self.add("REQUIRED_FIELD_ADDED", where)
            else:
                self.field(wf, rf, where)
        for number in sorted(set(w_all) & set(r_all)):  # moved into, out of or between oneofs
            wf, rf = w_all[number], r_all[number]
            wo, ro = _oneof(wf, w_syn), _oneof(rf, r_syn)
            if (wo is None and ro is None) or (wo is not None and ro is not None and wo.name == ro.name):
                continue
            self.field(wf, rf, f"{path}/{number}")
        self.types(list(w.nested_types), list(r.nested_types), path)

    def field(self, w: FieldDescriptor, r: FieldDescriptor, path: str) -> None:
        wk, rk = _kind(w), _kind(r)
        if wk != rk:
            self.add("FIELD_KIND_CHANGED", path)
        elif wk == "scalar":
            if _SCALAR_GROUPS[w.type] != _SCALAR_GROUPS[r.type]:
                self.add("FIELD_SCALAR_KIND_CHANGED", path)
        elif wk == "map":
            self.field(w.message_type.fields_by_name["key"], r.message_type.fields_by_name["key"], path)
            self.field(w.message_type.fields_by_name["value"], r.message_type.fields_by_name["value"], path)
        else:
            wt, rt = w.message_type, r.message_type
            if _local_name(wt) != _local_name(rt):
                self.add("FIELD_NAMED_TYPE_CHANGED", path)
                return
            dep = self.pair(wt, rt, "#/" + _local_name(wt).replace(".", "/"))
            self.depends[self.current].append((path, dep))


def _oneof(f: FieldDescriptor, synthetic: frozenset[str]):
    o = f.containing_oneof
    return None if o is None or o.name in synthetic else o


def _synthetic_oneofs(message: Descriptor) -> frozenset[str]:
    """The names of proto3 `optional`'s one-field oneofs, which are no oneofs to a reader."""
    proto = pb.DescriptorProto()
    message.CopyToProto(proto)
    return frozenset(proto.oneof_decl[f.oneof_index].name for f in proto.field if f.proto3_optional)


def _kind(f: FieldDescriptor) -> str:
    if f.type in (FD.TYPE_MESSAGE, FD.TYPE_GROUP):
        return "map" if f.message_type.GetOptions().map_entry else "message"
    return "scalar"


def _local_name(message: Descriptor) -> str:
    package = message.file.package
    return message.full_name[len(package) + 1:] if package else message.full_name


def read_errors(writer: FileDescriptor, reader: FileDescriptor) -> list[str]:
    """Why `reader` cannot read what `writer` wrote, in Confluent's words (empty: it can)."""
    return [describe(kind, path) for kind, path in _Diff().files(writer, reader)]
