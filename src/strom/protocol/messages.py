"""The one adapter between Strom and the message codec tables of `kafka.protocol`.

kafka-python generates (api_key, version) codecs from Kafka's own JSON message schemas and
keeps unknown tagged fields, so Strom does not hand-write message layouts. Everything Strom
needs from it passes through here:

- `parse_request(frame)` -> `Request` (header + decoded body), raising `UnsupportedRequest`
  for an api key or version the codec does not know;
- `encode_response(header, body)` -> the framed response bytes, with the response header
  version Kafka uses (v1 for flexible versions, but always v0 for ApiVersions);
- `build(cls, version, fields)` turns plain dicts and lists into the codec's objects, so
  handlers write responses the way the schemas read.
"""

from __future__ import annotations

import functools
import importlib
import struct
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kafka.protocol.api_message import ApiMessage
from kafka.protocol.schemas.fields.array import ArrayField
from kafka.protocol.schemas.fields.simple import SimpleField
from kafka.protocol.schemas.fields.struct import StructField
from kafka.protocol.schemas.fields.struct_array import StructArrayField

from strom.protocol import fetch
from strom.protocol.frames import frame
from strom.protocol.list_offsets import parse_list_offsets_request
from strom.protocol.metadata import parse_describe_topic_partitions_request, parse_metadata_request
from strom.protocol.produce import MAX_VERSION as PRODUCE_MAX_VERSION
from strom.protocol.produce import (
    MalformedRequest,
    PartitionProduceData,
    ProduceRequest,
    TopicProduceData,
    parse_produce_request,
)
from strom.protocol.varint import VarintError, skip_tagged_fields, write_uvarint

_HEADER_V1 = struct.Struct(">hhih")
_CORRELATION = struct.Struct(">i")
_KEY_VERSION = struct.Struct(">hh")
API_VERSIONS_KEY = 18
PRODUCE_KEY = 0
METADATA_KEY = 3
LIST_OFFSETS_KEY = 2
DESCRIBE_TOPIC_PARTITIONS_KEY = 75


# The module whose import registers each API's codec classes. Generating the classes from
# their schemas is most of what importing Strom costs (60-70 ms of a command's or a broker's
# start) and a process uses a few APIs, so a module is imported when one of its APIs is first
# looked up. tests/protocol/test_messages.py checks this table against everything registered.
CODEC_MODULES: dict[str, tuple[int, ...]] = {
    "kafka.protocol.producer": (0, 22, 24, 25, 26, 27, 28),
    "kafka.protocol.consumer": (1, 2, 8, 9, 11, 12, 13, 14, 23, 47),
    "kafka.protocol.metadata": (3, 10, 18),
    "kafka.protocol.admin": (15, 16, 19, 20, 21, 29, 30, 31, 32, 33, 34, 35, 37, 42, 43, 44, 45,
                             46, 48, 49, 50, 51, 55, 57, 60, 61, 65, 66, 74, 75),
    "kafka.protocol.sasl": (17, 36),
    "strom.protocol.controller_messages": (4, 5, 6, 7, 56),  # inter-broker (ZooKeeper mode)
    "strom.protocol.delegation_token_messages": (38, 39, 40, 41),
    "strom.protocol.raft_messages": (52, 53, 54, 59, 80, 81, 82),  # the KRaft quorum
    "strom.protocol.kraft_messages": (58, 62, 63, 64, 67),  # broker to controller
    "strom.protocol.consumer_group_messages": (68, 69),  # KIP-848
    "strom.protocol.telemetry_messages": (71, 72),  # KIP-714
    "strom.protocol.share_group_messages": (76, 77, 78, 79, 90, 91, 92),  # KIP-932
    "strom.protocol.share_state_messages": (83, 84, 85, 86, 87),  # KIP-932's share-state RPCs
}
_MODULE_OF = {key: module for module, keys in CODEC_MODULES.items() for key in keys}


def _all_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


def registered_codecs() -> tuple[dict[int, type], dict[int, type]]:
    """The request and response classes of every API whose module has been imported."""
    requests: dict[int, type] = {}
    responses: dict[int, type] = {}
    for cls in _all_subclasses(ApiMessage):
        if getattr(cls, "_class_version", None) is not None or cls._json is None:
            continue
        (requests if cls.is_request() else responses)[cls.API_KEY] = cls
    return requests, responses


class _Codecs(Mapping[int, type]):
    """api key -> the codec class, importing the API's module at its first lookup."""

    def __init__(self, requests: bool) -> None:
        self._requests = requests
        self._known: dict[int, type] = {}

    def __getitem__(self, api_key: int) -> type:
        cls = self._known.get(api_key)
        if cls is None:
            module = _MODULE_OF.get(api_key)
            if module is None:
                raise KeyError(api_key)
            importlib.import_module(module)
            requests, responses = registered_codecs()
            self._known = requests if self._requests else responses
            cls = self._known[api_key]
        return cls

    def __iter__(self) -> Iterator[int]:
        return iter(_MODULE_OF)

    def __len__(self) -> int:
        return len(_MODULE_OF)


REQUESTS: Mapping[int, type] = _Codecs(requests=True)
RESPONSES: Mapping[int, type] = _Codecs(requests=False)


class UnsupportedRequest(Exception):
    """The api key or version is not one the codec can parse: Kafka closes the connection."""


class InvalidRequest(Exception):
    """The bytes do not parse as the request they claim to be."""


@dataclass(slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    flexible: bool


@dataclass(slots=True)
class Request:
    header: RequestHeader
    body: Any  # the codec's object for (api_key, api_version)
    size: int


# (api key, version) -> (request class, flexible) for every version the codec knows, filled at
# first use: each request looks its class up once here, not through the lazy Mapping and the
# codec's class properties. Bounded by the codec's tables (unknown versions are not kept).
_REQUEST_CODECS: dict[tuple[int, int], tuple[type, bool]] = {}


def request_codec(api_key: int, version: int) -> tuple[type, bool] | None:
    """The request class and whether `version` is flexible, or None when the codec does not
    know the api key or version."""
    codec = _REQUEST_CODECS.get((api_key, version))
    if codec is None:
        cls = REQUESTS.get(api_key)
        if cls is None or not 0 <= version <= cls.max_version:
            return None
        codec = _REQUEST_CODECS[(api_key, version)] = (cls, cls.flexible_version_q(version))
    return codec


def is_flexible(api_key: int, version: int) -> bool:
    codec = _REQUEST_CODECS.get((api_key, version)) or request_codec(api_key, version)
    if codec is not None:
        return codec[1]
    cls = REQUESTS.get(api_key)
    if cls is None:
        return False
    if api_key == API_VERSIONS_KEY and version > cls.max_version:
        return True  # newer ApiVersions versions stay flexible; needed to answer them at all
    return cls.flexible_version_q(version)



def parse_header(buf, flexible: bool | None = None) -> tuple[RequestHeader, int]:
    """Request header v1 (or v2 with tagged fields when the body version is flexible; None:
    look it up)."""
    if len(buf) < _HEADER_V1.size:
        raise InvalidRequest("request shorter than its header")
    api_key, api_version, correlation_id, client_len = _HEADER_V1.unpack_from(buf, 0)
    pos = _HEADER_V1.size
    client_id = None
    if client_len >= 0:
        if pos + client_len > len(buf):
            raise InvalidRequest("client id runs past the end of the request")
        client_id = str(buf[pos : pos + client_len], "utf-8", "replace")  # one copy, not two
        pos += client_len
    if flexible is None:
        flexible = is_flexible(api_key, api_version)
    if flexible:
        if pos < len(buf) and buf[pos] == 0:  # the usual empty tag section, in line
            return RequestHeader(api_key, api_version, correlation_id, client_id, True), pos + 1
        try:
            pos = skip_tagged_fields(buf, pos)
        except VarintError as e:
            raise InvalidRequest(f"request header tagged fields: {e}") from None
    return RequestHeader(api_key, api_version, correlation_id, client_id, flexible), pos


@functools.lru_cache(maxsize=1024)  # the same few topic ids, request after request
def _topic_id(raw: bytes) -> uuid.UUID | None:
    """A topic id from its 16 bytes; all zeros is none, as the codec reads it."""
    return uuid.UUID(bytes=raw) if any(raw) else None


try:  # the compiled parser of the usual Produce and Fetch requests (_requests.c)
    from strom.protocol._records import parse_request as _parse_compiled
    from strom.protocol._records import request_types as _request_types
except ImportError:  # pragma: no cover - exercised by the tests directly
    _parse_compiled = None
else:
    _request_types({"Request": Request, "RequestHeader": RequestHeader, "ProduceRequest": ProduceRequest,
                    "TopicProduceData": TopicProduceData, "PartitionProduceData": PartitionProduceData,
                    "FetchRequest": fetch.FetchRequest, "FetchTopic": fetch.FetchTopic,
                    "FetchPartition": fetch.FetchPartition, "ForgottenTopic": fetch.ForgottenTopic,
                    "ReplicaState": fetch.ReplicaState},
                   _topic_id)


def parse_request(buf) -> Request:
    """The request in a frame (without its size): header and body. Raises UnsupportedRequest
    for an api key or version the codec does not know, InvalidRequest for a malformed one."""
    if _parse_compiled is not None and (request := _parse_compiled(buf)) is not None:
        return request  # the usual Produce or Fetch request, parsed in one compiled call
    return parse_request_py(buf)


def parse_request_py(buf) -> Request:
    if len(buf) < 4:
        raise InvalidRequest("request shorter than its header")
    api_key, api_version = _KEY_VERSION.unpack_from(buf, 0)
    codec = _REQUEST_CODECS.get((api_key, api_version)) or request_codec(api_key, api_version)
    if codec is None:
        cls = REQUESTS.get(api_key)
        if cls is None:
            raise UnsupportedRequest(f"unknown api key {api_key}")
        raise UnsupportedRequest(f"{cls.name} v{api_version} is not known")
    cls, flexible = codec
    header, pos = parse_header(buf, flexible)
    try:
        if api_key == PRODUCE_KEY and 3 <= api_version <= PRODUCE_MAX_VERSION:
            # The hot path: record sets stay writable views of the frame (see produce.py).
            body = parse_produce_request(memoryview(buf)[pos:], api_version)
        elif api_key == METADATA_KEY:
            # Names stay in the frame until the handler reads them (see metadata.py).
            body = parse_metadata_request(buf, pos, api_version)
        elif api_key == LIST_OFFSETS_KEY and api_version >= 1:
            body = parse_list_offsets_request(buf, pos, api_version)
        elif api_key == DESCRIBE_TOPIC_PARTITIONS_KEY:
            body = parse_describe_topic_partitions_request(buf, pos, api_version)
        else:
            body = _decode_body(cls, memoryview(buf)[pos:], api_version, flexible)
    except MalformedRequest as e:
        raise InvalidRequest(f"malformed {cls.name} v{api_version}: {e}") from e
    except InvalidRequest as e:
        raise InvalidRequest(f"malformed {cls.name} v{api_version}: {e}") from e
    except Exception as e:  # the codec raises assorted errors on truncated or garbled bodies
        raise InvalidRequest(f"malformed {cls.name} v{api_version}: {e!r}") from e
    return Request(header, body, len(buf))


def _decode_body(cls: type, view: memoryview, version: int, flexible: bool) -> Any:
    """The codec's decoder, plus the two checks Kafka's generated readers make and the codec
    skips: a string or bytes field may not run past the end of the request (the codec slices
    short and carries on), and a field the schema does not allow to be null may not be null
    (the codec reads any negative length as null, and handlers trust the schema)."""
    decode = cls._struct.compiled_decode_from(version, compact=flexible, tagged=flexible,
                                              data_class=cls[None])
    body, end = decode(view, 0)
    if end > len(view):
        raise InvalidRequest(f"a field runs {end - len(view)} bytes past the end of the request")
    check = _null_check(cls, version)
    if check is not None and (field := check(body)) is not None:
        raise InvalidRequest(f"non-nullable field {field} was null")
    return body


_NullCheck = Callable[[Any], "str | None"]
_NULL_CHECKS: dict[tuple[type, int], _NullCheck | None] = {}


def _null_check(cls: type, version: int) -> _NullCheck | None:
    key = (cls, version)
    if key not in _NULL_CHECKS:
        _NULL_CHECKS[key] = _struct_null_check(cls._struct, version)
    return _NULL_CHECKS[key]


def _struct_null_check(struct_field: StructField, version: int) -> _NullCheck | None:
    """A function naming the first field of a decoded struct that holds null where the schema
    says it may not (searching nested structs and arrays), or None when no field can."""
    checks: list[tuple[str, bool, str, _NullCheck | None]] = []
    for f in struct_field.untagged_fields(version):
        nullable = f.nullable_for_version_q(version)
        if isinstance(f, StructArrayField):
            checks.append((f.name, nullable, "structs", _struct_null_check(f.array_of, version)))
        elif isinstance(f, ArrayField):
            of_references = not isinstance(f.array_of, SimpleField) or f.array_of.type_str in ("string", "bytes")
            checks.append((f.name, nullable, "values" if of_references else "", None))
        elif isinstance(f, StructField):
            # The codec never decodes a non-nullable struct as null: only its fields matter.
            if (inner := _struct_null_check(f, version)) is not None:
                checks.append((f.name, True, "struct", inner))
        elif f.type_str in ("string", "bytes", "records") and not nullable:
            checks.append((f.name, False, "", None))
    checks = [c for c in checks if not c[1] or c[3] is not None or c[2] == "values"]
    if not checks:
        return None

    def check(obj: Any) -> str | None:
        for name, nullable, kind, inner in checks:
            value = getattr(obj, name)
            if value is None:
                if nullable:
                    continue
                return name
            if kind == "values" and any(v is None for v in value):
                return f"{name}[]"
            if inner is not None:
                for item in value if kind == "structs" else (value,):
                    if (bad := inner(item)) is not None:
                        return f"{name}.{bad}"
        return None

    return check


def response_header(header: RequestHeader) -> bytes:
    """Correlation id, plus an empty tag buffer for flexible versions except ApiVersions."""
    if header.flexible and header.api_key != API_VERSIONS_KEY:
        return _CORRELATION.pack(header.correlation_id) + b"\x00"
    return _CORRELATION.pack(header.correlation_id)


def build(cls: type, version: int, fields: dict[str, Any]) -> Any:
    """Make the codec object of struct `cls` at `version` from plain (nested) dicts.

    A field that `version` does not have is left out, as the encoder would leave it out: one
    answer serves every version (a struct that came later cannot even be made at an older one).
    A whole request or response is made by its class's constructor. Its elements, of which a
    controller's LeaderAndIsr or a wide response holds 100,000, are made the way that
    constructor makes them (each given field set, tagged ones noted, the version's other fields
    at their defaults, unknown names refused), from a plan made once per struct and version."""
    plan = _BUILD_PLANS.get((cls, version)) or _build_plan(cls, version)
    if not fields.keys() <= plan.names:
        raise ValueError(f"Unrecognized fields for type {cls._struct.name}: {sorted(fields.keys() - plan.names)}")
    if plan.message:
        return cls(version=version, **{f.name: _nested(f, fields[f.name], version)
                                       for f in plan.fields if f.name in fields})
    obj = _new_object(cls)
    obj._version, obj.tags, obj.unknown_tags = version, None, None
    for f in plan.fields:
        if f.name in fields:
            if f.tagged:
                if obj.tags is None:
                    obj.tags = set()
                obj.tags.add(f.name)
            setattr(obj, f.name, _nested(f, fields[f.name], version) if f.struct is not None else fields[f.name])
        else:
            setattr(obj, f.name, f.default.field.default if type(f.default) is _DefaultOf else f.default)
    return obj


@dataclass(frozen=True, slots=True)
class _PlannedField:
    name: str
    tagged: bool
    default: Any  # or _DefaultOf
    struct: type | None  # the class of the struct (or of the array's structs) it holds
    array: bool


@dataclass(frozen=True)
class _BuildPlan:
    message: bool  # an ApiMessage (a request or response), not one of its elements
    fields: tuple[_PlannedField, ...]  # those the version has, in the codec's order
    names: frozenset[str]  # every field of the struct, of any version


@dataclass(frozen=True)
class _DefaultOf:
    """A default the codec cannot give (a struct's): asked for only when the field is left
    out, so that it fails then, as the codec's constructor does."""

    field: Any


_BUILD_PLANS: dict[tuple[type, int], _BuildPlan] = {}
_new_object = object.__new__


def _nested(f: _PlannedField, value: Any, version: int) -> Any:
    """`value` of field `f` with its nested dicts made into structs."""
    if value is None or f.struct is None:
        return value
    if f.array:
        return [build(f.struct, version, v) if isinstance(v, dict) else v for v in value]
    return build(f.struct, version, value)


def _build_plan(cls: type, version: int) -> _BuildPlan:
    struct_field = cls._struct
    if not struct_field.min_version <= version <= struct_field.max_version:
        raise ValueError(f"Invalid version: {version} (min={struct_field.min_version}, max={struct_field.max_version})")
    fields = []
    for f in struct_field._fields:  # in the order the codec's constructor walks them
        if not f.for_version_q(version):
            continue
        nested = struct_field.fields[f.name]  # where the codec keeps a nested struct's class
        holds_structs = nested.is_struct() or nested.is_struct_array()
        try:
            default = f.default
        except NotImplementedError:
            default = _DefaultOf(f)
        fields.append(_PlannedField(f.name, f.tag is not None, default,
                                    nested.data_class if holds_structs else None, nested.is_struct_array()))
    plan = _BuildPlan(issubclass(cls, ApiMessage), tuple(fields), frozenset(f.name for f in struct_field._fields))
    _BUILD_PLANS[(cls, version)] = plan
    return plan


class StreamedResponse:
    """A response whose one large array is encoded an element at a time, as the handler makes
    them: the codec's objects for one element live only while it is encoded, so the response
    costs its bytes (and the handler's dict for the element at hand), not a tree of objects."""

    def __init__(self, api_key: int, version: int, array: str) -> None:
        self.cls = RESPONSES[api_key]
        self.version = version
        self.flexible = self.cls.flexible_version_q(version)
        self.field = self.cls._struct.fields[array]
        self.items = bytearray()
        self.count = 0

    def add(self, fields: dict[str, Any]) -> None:
        element = build(self.field.data_class, self.version, fields)
        self.items += self.field.array_of.encode(element, version=self.version, compact=self.flexible,
                                                 tagged=self.flexible)
        self.count += 1

    def add_encoded(self, element: bytes) -> None:
        """An element the caller encoded itself (the common error entries, at speed)."""
        self.items += element
        self.count += 1

    def parts(self, fields: dict[str, Any]) -> list[bytes | bytearray]:
        """The body: the other fields (`fields`), the array where the schema has it."""
        message = build(self.cls, self.version, fields)
        head, tail, out = bytearray(), bytearray(), None
        v, flexible = self.version, self.flexible
        for f in self.cls._struct.untagged_fields(v):
            if f is self.field:
                head += write_uvarint(self.count + 1) if flexible else struct.pack(">i", self.count)
                out = tail
                continue
            (head if out is None else tail).extend(
                f.encode(getattr(message, f.name), version=v, compact=flexible, tagged=flexible))
        if flexible:
            tail += self.cls._struct.tagged_fields(v).encode(message, version=v)
        return [bytes(head), self.items, bytes(tail)]


def encode_body(api_key: int, version: int, fields: dict[str, Any]) -> bytes:
    return build(RESPONSES[api_key], version, fields).encode(version=version)


def encode_response(header: RequestHeader, fields: dict[str, Any], version: int | None = None) -> bytes:
    """Frame a response to `header` from plain dicts. `version` overrides the header's (used
    to answer an unsupported ApiVersions request at v0)."""
    version = header.api_version if version is None else version
    body = encode_body(header.api_key, version, fields)
    return frame(response_header(header) + body)


def encode_request(api_key: int, version: int, fields: dict[str, Any], correlation_id: int = 1,
                   client_id: str = "strom") -> bytes:
    """A framed request, for tools and tests that speak to a broker without a client library."""
    cls = REQUESTS[api_key]
    cid = client_id.encode()
    head = _HEADER_V1.pack(api_key, version, correlation_id, len(cid)) + cid
    if is_flexible(api_key, version):
        head += b"\x00"
    return frame(head + build(cls, version, fields).encode(version=version))


def decode_response(api_key: int, version: int, payload) -> tuple[int, Any]:
    """(correlation id, body) of a response frame's payload, for tools and tests."""
    (correlation_id,) = _CORRELATION.unpack_from(payload, 0)
    pos = 4
    if is_flexible(api_key, version) and api_key != API_VERSIONS_KEY:
        pos = skip_tagged_fields(payload, pos)
    return correlation_id, RESPONSES[api_key].decode(memoryview(payload)[pos:], version=version)
