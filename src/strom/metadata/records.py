"""Kafka's metadata records: the values of the data records in `__cluster_metadata` and its
snapshots, framed as Kafka's MetadataRecordSerde frames an ApiMessageAndVersion: unsigned
varints frame version (1), record type (the schema's apiKey) and record version, then the
record in the flexible ("compact") encoding of its schema (`strom/protocol/schemas/*Record.json`,
Kafka's field layouts).

A snapshot of 100,000 partitions is 100,000 PartitionRecords, so the codec is compiled: from each
schema, the source of a decoder and an encoder per version is generated once and exec'd, which
runs about ten times faster than walking the schema per record as kafka-python's generic codec
does (tests/metadata hold the two to the same bytes).

    rec = TopicRecord(name="orders", topic_id=uuid.uuid4())
    value = encode(rec)              # framed bytes, at the version Kafka 4.0 writes
    rec2 = decode(value)             # the record object; decode_framed() also gives the version
"""

from __future__ import annotations

import json
import re
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

FRAME_VERSION = 1
_MAX = 32767

# The versions Kafka 4.0 writes at metadata.version 4.0-IV3 (log directories on). A record that
# names a newer field is written at the version that has it: a partition record's ELR fields
# (KIP-966, v2), a broker change's cordoned log dirs (KIP-1066, v3).
WRITE_VERSIONS = {"RegisterBrokerRecord": 3, "PartitionRecord": 1, "PartitionChangeRecord": 1,
                  "BrokerRegistrationChangeRecord": 2}

_FIXED = {"int8": "b", "int16": "h", "int32": "i", "int64": "q", "uint16": "H", "float64": "d",
          "bool": "?"}
_SIZES = {"b": 1, "h": 2, "i": 4, "q": 8, "H": 2, "d": 8, "?": 1}
_STRUCT_NAMES = {"b": "_S_i8", "h": "_S_i16", "i": "_S_i32", "q": "_S_i64", "H": "_S_u16", "d": "_S_f64",
                 "?": "_S_bool"}


# --- varints and the few helpers generated code calls ------------------------------------------

_UV_SMALL = [bytes([i]) for i in range(128)]


def _uv_bytes(value: int) -> bytes:
    if value < 128:
        return _UV_SMALL[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _uv(buf, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    value, shift = b & 0x7F, 7
    while True:
        pos += 1
        b = buf[pos]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos + 1
        shift += 7
        if shift > 28:
            raise ValueError("unsigned varint longer than 5 bytes")


_ZERO = bytes(16)
# uuid.UUID(bytes=...) checks its arguments at length (microseconds); a topic id recurs in every
# PartitionRecord of its topic, so ids are made once and shared (a bounded cache).
_UUIDS: dict[bytes, uuid.UUID] = {}
_UUID_CACHE = 1 << 16


def _uuid(buf, pos: int) -> uuid.UUID | None:
    raw = bytes(buf[pos:pos + 16])
    if raw == _ZERO:
        return None
    u = _UUIDS.get(raw)
    if u is None:
        if len(raw) != 16:
            raise ValueError("uuid runs past the end of the record")
        if len(_UUIDS) >= _UUID_CACHE:
            _UUIDS.clear()
        u = _UUIDS[raw] = uuid.UUID(bytes=raw)
    return u


def _uuid_of(raw: bytes) -> uuid.UUID | None:
    return _uuid(raw, 0)


_FORMATS: dict[tuple[str, int], str] = {}


def _array_format(code: str, n: int) -> str:
    fmt = _FORMATS.get((code, n))
    if fmt is None:
        fmt = _FORMATS[(code, n)] = f">{n}{code}"
    return fmt


def _uuid_bytes(value: uuid.UUID | None) -> bytes:
    return _ZERO if value is None else value.bytes


def _str(buf, pos: int, n: int) -> str:
    end = pos + n
    if end > len(buf):
        raise ValueError("string runs past the end of the record")
    return str(buf[pos:end], "utf-8")


def _bytes(buf, pos: int, n: int) -> bytes:
    end = pos + n
    if end > len(buf):
        raise ValueError("bytes run past the end of the record")
    return bytes(buf[pos:end])


def _compact_str(value: str | None) -> bytes:
    if value is None:
        return b"\x00"
    raw = value.encode()
    return _uv_bytes(len(raw) + 1) + raw


def _compact_bytes(value: bytes | None) -> bytes:
    if value is None:
        return b"\x00"
    return _uv_bytes(len(value) + 1) + bytes(value)


# --- schemas -------------------------------------------------------------------------------------

def _versions(text: str | None) -> tuple[int, int] | None:
    if text is None or text == "none":
        return None
    if text.endswith("+"):
        return int(text[:-1]), _MAX
    lo, _, hi = text.partition("-")
    return int(lo), int(hi or lo)


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def _within(v: int, span: tuple[int, int] | None) -> bool:
    return span is not None and span[0] <= v <= span[1]


@dataclass
class _Field:
    name: str
    attr: str
    type: str
    versions: tuple[int, int] | None
    nullable: tuple[int, int] | None
    tagged: tuple[int, int] | None
    tag: int | None
    default: Any
    struct: _Struct | None = None

    @property
    def element(self) -> str:
        return self.type[2:] if self.type.startswith("[]") else self.type

    @property
    def is_array(self) -> bool:
        return self.type.startswith("[]")


@dataclass
class _Struct:
    name: str
    fields: list[_Field]


def _default(spec: dict) -> Any:
    kind, text = spec["type"], spec.get("default")
    if text == "null":
        return None
    if kind.startswith("[]"):
        return []
    if kind == "bool":
        return text == "true"
    if kind in ("int8", "int16", "int32", "int64", "uint16"):
        return int(text, 0) if text else 0
    if kind == "float64":
        return float(text) if text else 0.0
    if kind == "string":
        return text or ""
    if kind == "bytes":
        return b""
    if kind == "uuid":
        return None
    return None  # an inline struct: built from its own defaults


def _parse_struct(name: str, specs: list[dict], common: dict[str, list[dict]]) -> _Struct:
    fields = []
    for spec in specs:
        kind = spec["type"]
        element = kind[2:] if kind.startswith("[]") else kind
        sub = None
        if element[:1].isupper():
            sub = _parse_struct(element, spec.get("fields") or common[element], common)
        tag = spec.get("tag")
        fields.append(_Field(spec["name"], _snake(spec["name"]), kind, _versions(spec.get("versions")),
                             _versions(spec.get("nullableVersions")), _versions(spec.get("taggedVersions")),
                             None if tag is None else int(tag), _default(spec), sub))
    return _Struct(name, fields)


# --- code generation -----------------------------------------------------------------------------

class _Gen:
    """Emits the classes and the per-version codec functions of one record schema."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.ns = namespace
        self.lines: list[str] = []
        self.classes: dict[str, type] = {}

    def emit(self, text: str) -> None:
        self.lines.append(text)

    # classes: slots, keyword construction with the schema's defaults, equality and repr
    def make_class(self, struct: _Struct) -> type:
        for f in struct.fields:
            if f.struct is not None and f.struct.name not in self.classes:
                self.make_class(f.struct)
        slots = tuple(f.attr for f in struct.fields)
        params, body = [], []
        for f in struct.fields:
            d = f.default
            if f.is_array and d == []:
                params.append(f"{f.attr}=_D")
                body.append(f"    self.{f.attr} = [] if {f.attr} is _D else {f.attr}")
            elif f.struct is not None and not f.is_array:
                params.append(f"{f.attr}=_D")
                body.append(f"    self.{f.attr} = _C_{f.struct.name}() if {f.attr} is _D else {f.attr}")
            else:
                params.append(f"{f.attr}={d!r}")
                body.append(f"    self.{f.attr} = {f.attr}")
        src = [f"def __init__(self, {', '.join(params)}):" if params else "def __init__(self):"]
        src += body or ["    pass"]
        local: dict[str, Any] = {}
        exec("\n".join(src), self.ns, local)  # noqa: S102 - our own generated source

        def __eq__(self, other: object) -> bool:
            return type(other) is type(self) and all(getattr(self, a) == getattr(other, a) for a in slots)

        def __repr__(self) -> str:
            return f"{struct.name}({', '.join(f'{a}={getattr(self, a)!r}' for a in slots)})"

        cls = type(struct.name, (), {"__slots__": slots, "__init__": local["__init__"], "__eq__": __eq__,
                                     "__repr__": __repr__, "__hash__": None})
        self.ns[f"_C_{struct.name}"] = cls
        self.classes[struct.name] = cls
        for f in struct.fields:
            if f.struct is not None:
                setattr(cls, f.struct.name, self.classes[f.struct.name])
        return cls

    # decoders
    def decoder(self, struct: _Struct, v: int) -> str:
        fname = f"_d_{struct.name}_{v}"
        if fname in self.ns or any(line.startswith(f"def {fname}(") for line in self.lines):
            return fname
        for f in struct.fields:
            if f.struct is not None and _within(v, f.versions):
                self.decoder(f.struct, v)
        out = [f"def {fname}(buf, pos):"]
        present = [f for f in struct.fields if _within(v, f.versions)]
        for f in struct.fields:
            if not _within(v, f.versions) or _within(v, f.tagged):
                out.append(f"    {f.attr} = {self._default_expr(f)}")
        for run in self._runs([f for f in present if not _within(v, f.tagged)]):
            if isinstance(run, list):  # consecutive fixed-size fields: one unpack
                names = ", ".join(f.attr for f in run)
                fmt = ">" + "".join("16s" if f.type == "uuid" else _FIXED[f.type] for f in run)
                size = sum(16 if f.type == "uuid" else _SIZES[_FIXED[f.type]] for f in run)
                out.append(f"    {names}, = _unpack({fmt!r}, buf, pos)")
                out.append(f"    pos += {size}")
                out += [f"    {f.attr} = _uuid_of({f.attr})" for f in run if f.type == "uuid"]
            else:
                out += self._read(run, v, "    ")
        out.append("    n_tags, pos = _uv(buf, pos)")
        out.append("    for _ in range(n_tags):")
        out.append("        tag, pos = _uv(buf, pos)")
        out.append("        size, pos = _uv(buf, pos)")
        out.append("        end = pos + size")
        first = True
        for f in present:
            if _within(v, f.tagged):
                out.append(f"        {'if' if first else 'elif'} tag == {f.tag}:")
                out += self._read(f, v, "            ")
                first = False
        out.append("        pos = end")
        args = ", ".join(f.attr for f in struct.fields)
        out.append(f"    return _C_{struct.name}({args}), pos")
        self.lines += out
        return fname

    @staticmethod
    def _runs(fields: list[_Field]) -> list:
        """Fields in order, runs of two or more fixed-size ones (ints, bool, uuid) grouped."""
        out: list = []
        run: list[_Field] = []
        for f in fields:
            if not f.is_array and (f.type in _FIXED or f.type == "uuid"):
                run.append(f)
                continue
            out += [run] if len(run) > 1 else run
            run = []
            out.append(f)
        out += [run] if len(run) > 1 else run
        return out

    def _default_expr(self, f: _Field) -> str:
        if f.is_array and f.default == []:
            return "[]"
        if f.struct is not None and not f.is_array:
            return f"_C_{f.struct.name}()"
        return repr(f.default)

    def _read(self, f: _Field, v: int, ind: str) -> list[str]:
        a, el = f.attr, f.element
        if not f.is_array:
            return [ind + line for line in self._read_one(a, el, f, v)]
        out = [f"{ind}n, pos = _uv(buf, pos)",
               f"{ind}if n == 0:", f"{ind}    {a} = None", f"{ind}else:", f"{ind}    n -= 1"]
        if el in _FIXED and el != "bool":
            code, size = _FIXED[el], _SIZES[_FIXED[el]]
            out += [f"{ind}    if pos + {size} * n > len(buf):",
                    f"{ind}        raise ValueError('array runs past the end of the record')",
                    f"{ind}    {a} = list(_unpack(_fmt('{code}', n), buf, pos))",
                    f"{ind}    pos += {size} * n"]
        else:
            out += [f"{ind}    {a} = []", f"{ind}    for _ in range(n):"]
            out += [f"{ind}        " + line for line in self._read_one("x", el, f, v)]
            out.append(f"{ind}        {a}.append(x)")
        return out

    def _read_one(self, target: str, el: str, f: _Field, v: int) -> list[str]:
        if el in _FIXED:
            code = _FIXED[el]
            return [f"{target}, = {_STRUCT_NAMES[code]}.unpack_from(buf, pos)", f"pos += {_SIZES[code]}"]
        if el == "string":
            return ["n, pos = _uv(buf, pos)", f"{target} = None if n == 0 else _str(buf, pos, n - 1)",
                    "pos += max(n - 1, 0)"]
        if el == "bytes":
            return ["n, pos = _uv(buf, pos)", f"{target} = None if n == 0 else _bytes(buf, pos, n - 1)",
                    "pos += max(n - 1, 0)"]
        if el == "uuid":
            return [f"{target} = _uuid(buf, pos)", "pos += 16"]
        return [f"{target}, pos = _d_{f.struct.name}_{v}(buf, pos)"]

    # encoders
    def encoder(self, struct: _Struct, v: int) -> str:
        fname = f"_e_{struct.name}_{v}"
        if any(line.startswith(f"def {fname}(") for line in self.lines):
            return fname
        for f in struct.fields:
            if f.struct is not None and _within(v, f.versions):
                self.encoder(f.struct, v)
        out = [f"def {fname}(o, out):"]
        tagged = [f for f in struct.fields if _within(v, f.versions) and _within(v, f.tagged)]
        plain = [f for f in struct.fields if _within(v, f.versions) and not _within(v, f.tagged)]
        for run in self._runs(plain):
            if isinstance(run, list):  # consecutive fixed-size fields: one pack
                fmt = ">" + "".join("16s" if f.type == "uuid" else _FIXED[f.type] for f in run)
                args = ", ".join(f"_uuid_bytes(o.{f.attr})" if f.type == "uuid" else f"o.{f.attr}" for f in run)
                out.append(f"    out += _pack({fmt!r}, {args})")
            else:
                out += self._write(run, f"o.{run.attr}", v, "    ", "out")
        if not tagged:
            out.append("    out += b'\\x00'")
        else:
            out.append("    tags = []")
            for f in sorted(tagged, key=lambda f: f.tag):
                out.append(f"    if o.{f.attr} != {self._default_expr(f)}:")
                out.append("        t = bytearray()")
                out += self._write(f, f"o.{f.attr}", v, "        ", "t")
                out.append(f"        tags.append(({f.tag}, t))")
            out.append("    out += _uv_bytes(len(tags))")
            out.append("    for tag, t in tags:")
            out.append("        out += _uv_bytes(tag)")
            out.append("        out += _uv_bytes(len(t))")
            out.append("        out += t")
        self.lines += out
        return fname

    def _write(self, f: _Field, value: str, v: int, ind: str, out: str) -> list[str]:
        el = f.element
        if not f.is_array:
            return [ind + line for line in self._write_one(value, el, f, v, out)]
        lines = [f"{ind}arr = {value}", f"{ind}if arr is None:", f"{ind}    {out} += b'\\x00'", f"{ind}else:",
                 f"{ind}    {out} += _uv_bytes(len(arr) + 1)"]
        if el in _FIXED and el != "bool":
            lines.append(f"{ind}    {out} += _pack(_fmt('{_FIXED[el]}', len(arr)), *arr)")
        else:
            lines.append(f"{ind}    for x in arr:")
            lines += [f"{ind}        " + line for line in self._write_one("x", el, f, v, out)]
        return lines

    def _write_one(self, value: str, el: str, f: _Field, v: int, out: str) -> list[str]:
        if el in _FIXED:
            return [f"{out} += {_STRUCT_NAMES[_FIXED[el]]}.pack({value})"]
        if el == "string":
            return [f"{out} += _compact_str({value})"]
        if el == "bytes":
            return [f"{out} += _compact_bytes({value})"]
        if el == "uuid":
            return [f"{out} += _uuid_bytes({value})"]
        return [f"_e_{f.struct.name}_{v}({value}, {out})"]


def _namespace() -> dict[str, Any]:
    ns: dict[str, Any] = {"_uv": _uv, "_uv_bytes": _uv_bytes, "_uuid": _uuid, "_uuid_bytes": _uuid_bytes,
                          "_uuid_of": _uuid_of, "_fmt": _array_format,
                          "_str": _str, "_bytes": _bytes, "_compact_str": _compact_str,
                          "_compact_bytes": _compact_bytes, "_unpack": struct.unpack_from,
                          "_pack": struct.pack, "_D": object()}
    for code, name in _STRUCT_NAMES.items():
        ns[name] = struct.Struct(">" + code)
    return ns


@dataclass(frozen=True)
class RecordType:
    api_key: int
    name: str
    max_version: int
    write_version: int
    cls: type
    decoders: tuple[Callable, ...]
    encoders: tuple[Callable, ...]


def _compile(schema: dict) -> RecordType:
    common = {s["name"]: s["fields"] for s in schema.get("commonStructs", [])}
    root = _parse_struct(schema["name"], schema["fields"], common)
    gen = _Gen(_namespace())
    cls = gen.make_class(root)
    lo, hi = _versions(schema["validVersions"])
    names = [(gen.decoder(root, v), gen.encoder(root, v)) for v in range(lo, hi + 1)]
    exec("\n".join(gen.lines), gen.ns)  # noqa: S102 - our own generated source
    return RecordType(schema["apiKey"], schema["name"], hi, WRITE_VERSIONS.get(schema["name"], hi), cls,
                      tuple(gen.ns[d] for d, _ in names), tuple(gen.ns[e] for _, e in names))


def _load() -> dict[int, RecordType]:
    out = {}
    for entry in resources.files("strom.protocol.schemas").iterdir():
        if entry.name.endswith("Record.json"):
            schema = json.loads(entry.read_text())
            if "apiKey" in schema:
                rt = _compile(schema)
                out[rt.api_key] = rt
    return out


RECORD_TYPES: dict[int, RecordType] = _load()
_BY_CLASS: dict[type, RecordType] = {rt.cls: rt for rt in RECORD_TYPES.values()}

# The record classes, under Kafka's names.
RegisterBrokerRecord = RECORD_TYPES[0].cls
UnregisterBrokerRecord = RECORD_TYPES[1].cls
TopicRecord = RECORD_TYPES[2].cls
PartitionRecord = RECORD_TYPES[3].cls
ConfigRecord = RECORD_TYPES[4].cls
PartitionChangeRecord = RECORD_TYPES[5].cls
FenceBrokerRecord = RECORD_TYPES[7].cls
UnfenceBrokerRecord = RECORD_TYPES[8].cls
RemoveTopicRecord = RECORD_TYPES[9].cls
DelegationTokenRecord = RECORD_TYPES[10].cls
UserScramCredentialRecord = RECORD_TYPES[11].cls
FeatureLevelRecord = RECORD_TYPES[12].cls
ClientQuotaRecord = RECORD_TYPES[14].cls
ProducerIdsRecord = RECORD_TYPES[15].cls
BrokerRegistrationChangeRecord = RECORD_TYPES[17].cls
AccessControlEntryRecord = RECORD_TYPES[18].cls
RemoveAccessControlEntryRecord = RECORD_TYPES[19].cls
NoOpRecord = RECORD_TYPES[20].cls
RemoveUserScramCredentialRecord = RECORD_TYPES[22].cls
BeginTransactionRecord = RECORD_TYPES[23].cls
EndTransactionRecord = RECORD_TYPES[24].cls
AbortTransactionRecord = RECORD_TYPES[25].cls
RemoveDelegationTokenRecord = RECORD_TYPES[26].cls
RegisterControllerRecord = RECORD_TYPES[27].cls


def record_type(record: Any) -> RecordType:
    rt = _BY_CLASS.get(type(record))
    if rt is None:
        raise TypeError(f"{type(record).__name__} is not a metadata record")
    return rt


_NEWER_FIELDS = {"PartitionRecord": (2, ("eligible_leader_replicas", "last_known_elr")),
                 "PartitionChangeRecord": (2, ("eligible_leader_replicas", "last_known_elr")),
                 "BrokerRegistrationChangeRecord": (3, ("cordoned_log_dirs",))}


def encode(record: Any, version: int | None = None) -> bytes:
    """The framed value of `record` (ApiMessageAndVersion), at Kafka 4.0's version unless given."""
    rt = record_type(record)
    v = rt.write_version if version is None else version
    newer = _NEWER_FIELDS.get(rt.name) if version is None else None
    if newer is not None and any(getattr(record, name) is not None for name in newer[1]):
        v = newer[0]
    if not 0 <= v <= rt.max_version:
        raise ValueError(f"{rt.name} has no version {v}")
    out = bytearray(b"\x01")
    out += _uv_bytes(rt.api_key)
    out += _uv_bytes(v)
    rt.encoders[v](record, out)
    return bytes(out)


def decode_framed(value) -> tuple[int, int, Any]:
    """(api key, version, record) of a framed value; ValueError when it is not one."""
    try:
        frame, pos = _uv(value, 0)
        if frame != FRAME_VERSION:
            raise ValueError(f"metadata record frame version {frame} is not {FRAME_VERSION}")
        api_key, pos = _uv(value, pos)
        version, pos = _uv(value, pos)
        rt = RECORD_TYPES.get(api_key)
        if rt is None:
            raise ValueError(f"unknown metadata record type {api_key}")
        if version > rt.max_version:
            raise ValueError(f"{rt.name} version {version} is newer than this software reads")
        record, end = rt.decoders[version](value, pos)
    except (IndexError, struct.error) as e:
        raise ValueError(f"truncated metadata record: {e}") from None
    if end != len(value):
        raise ValueError(f"{len(value) - end} bytes after a {rt.name}")
    return api_key, version, record


def decode(value) -> Any:
    return decode_framed(value)[2]
