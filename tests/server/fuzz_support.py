"""A bounded, structure-aware protocol fuzzer for a Strom broker on 127.0.0.1.

`RequestFactory` builds a valid request for any (api key, version) from the same schema
tables the broker decodes with (kafka-python's, plus Strom's own under
`strom/protocol/schemas`), and remembers where each length prefix, integer, string, record
set and tagged-field section lies in the bytes. `mutate` then damages the request the ways a
broken or hostile client would: flipped bits, cut bodies, lengths that lie (longer, negative,
null, billions), invalid UTF-8, unknown or lying tagged fields, record batches damaged behind a
recomputed CRC, a wrong api version or key, random bytes after a valid header, and frame sizes
that lie.

`Fuzzer` sends each case on a connection of its own, followed by an ApiVersions probe: a
broker answers one connection's requests in order, so the probe's answer says the case has
been dealt with (answered, or silently dropped as acks=0 is). It sorts outcomes into
answered / silent / closed / held, and watches the broker's log for lines that betray an
exception nobody handled.

Everything is drawn from one `random.Random(seed)`: the same seed gives the same cases.
Run by tests/server/test_fuzz.py; `python tests/server/fuzz_support.py replay HEX` sends one
recorded case to a fresh broker and prints what its log said.
"""

from __future__ import annotations

import itertools
import random
import socket
import struct
import sys
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from crc32c import crc32c
from kafka.protocol.schemas.fields.array import ArrayField
from kafka.protocol.schemas.fields.codecs import (
    UUID,
    BitField,
    Boolean,
    Bytes,
    Float64,
    Int8,
    Int16,
    Int32,
    Int64,
    String,
    UnsignedInt16,
)
from kafka.protocol.schemas.fields.simple import SimpleField
from kafka.protocol.schemas.fields.struct import StructField
from kafka.protocol.schemas.fields.struct_array import StructArrayField

from strom.protocol import compression, messages
from strom.protocol.frames import frame
from strom.protocol.records import build_batch
from strom.protocol.varint import write_uvarint

PRODUCE, FIND_COORDINATOR, JOIN_GROUP, API_VERSIONS, CREATE_TOPICS = 0, 10, 11, 18, 19
_FIXED = {Int8: ">b", Int16: ">h", UnsignedInt16: ">H", Int32: ">i", Int64: ">q", Boolean: ">?",
          Float64: ">d"}
_INT_RANGE = {Int8: (-(1 << 7), (1 << 7) - 1), Int16: (-(1 << 15), (1 << 15) - 1),
              UnsignedInt16: (0, (1 << 16) - 1), Int32: (-(1 << 31), (1 << 31) - 1),
              Int64: (-(1 << 63), (1 << 63) - 1)}
_SIGNED_FORMAT = {1: ">b", 2: ">h", 4: ">i", 8: ">q"}

# Controller requests (LeaderAndIsr, StopReplica, UpdateMetadata, ControlledShutdown) are
# refused on every socket of an embedded broker, whatever they carry, so they are fuzzed like
# any other request. A field may still be kept out of the mutations here (none is now).
PROTECTED: dict[int, set[str]] = {}
STALE_CONTROLLER_EPOCH = 0
FOREIGN_BROKER_ID = 1_000_000

TOPICS = ("fuzz-topic", "fuzz-topic", "fuzz-topic", "fuzz-other")
# Optional parts of requests that, when present and random, make the whole request fail early.
_MOSTLY_EMPTY = frozenset({"assignments", "configs", "forgotten_topics_data", "ungrouped_partition_states"})
GROUPS = ("fuzz-group", "fuzz-group", "fuzz-other-group")


@dataclass(slots=True)
class Span:
    """Where one encoded element lies in a request's bytes (offsets in the frame payload).

    kind: "int" (a fixed-width number), "len" (a length or count prefix; `width` 2 or 4 bytes,
    0 for an unsigned varint; `of` says of what), "string" and "records" (their contents),
    "tags" (a tagged-field section, from its count to its end)."""

    start: int
    end: int
    kind: str
    name: str
    width: int = 0
    of: str = ""
    count: int = 0
    protected: bool = False


@dataclass(slots=True)
class Request:
    api_key: int
    version: int
    payload: bytes  # header + body, without the size prefix
    spans: list[Span]
    header_end: int
    flexible: bool


@dataclass(slots=True)
class Case:
    number: int
    api_key: int
    version: int
    mutation: str
    data: bytes  # exactly what goes on the wire, size prefixes included
    framed: bool  # sizes are honest: a probe request can follow it

    def describe(self) -> str:
        return (f"case {self.number}: api {self.api_key} v{self.version} {self.mutation}, "
                f"{len(self.data)} bytes: {self.data.hex()}")


# --- valid requests ---------------------------------------------------------------------------

class _Values:
    """Plausible field values, chosen by field name, so that requests reach past the first
    lookup (an existing topic, a group) rather than failing on a random name."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def string(self, name: str, parent: str) -> str:
        r = self.rng
        if r.random() < 0.02:
            return "x" * r.choice((300, 2500, 20000))  # long values must not make long log lines
        if r.random() < 0.02:
            return r.choice(("ü€\u0000", "\ud7ff", "fuzz topic", "..", "-"))
        parent = parent.lower()
        if "config" in parent and name in ("name", "key"):
            # Topic configs only, none that is also a broker default: min.insync.replicas=9
            # at the broker level is a legitimate request that stops every acks=all write.
            return r.choice(("retention.ms", "cleanup.policy", "segment.bytes",
                             "max.message.bytes", "no.such.config"))
        if name in ("value", "committed_metadata", "metadata"):
            return r.choice(("1", "-1", "0", "delete", "compact", "abc", "", "9" * 30))
        if "topic" in name or (name == "name" and "protocol" not in parent) or name == "resource_name":
            return r.choice(TOPICS + ("", "0", "fuzz-" + str(r.randrange(1000))))
        if "group" in name or name in ("key", "coordinator_keys"):
            return r.choice(GROUPS + ("",))
        if "transactional_id" in name:
            return r.choice(("fuzz-txn", "fuzz-txn", ""))
        if "member_id" in name or "instance_id" in name:
            return r.choice(("", "fuzz-member", str(uuid.UUID(int=r.getrandbits(128)))))
        if name in ("host", "host_name", "v0_host"):
            return "127.0.0.1"  # never anywhere else, even if a request were believed
        if "regex" in name:
            return r.choice(("fuzz.*", "(", "[a-", ".*", "a{99999}"))
        if name == "protocol_type":
            return r.choice(("consumer", "connect", ""))
        if name in ("protocol_name", "name", "server_assignor"):
            return r.choice(("range", "roundrobin", "uniform", "cooperative-sticky", "nope"))
        if "filter" in name:
            return r.choice(("Stable", "Empty", "Ongoing", "classic", "consumer", "x"))
        if name == "path":
            return "/nonexistent-fuzz-dir"
        if name == "listener":
            return "PLAINTEXT"
        return "".join(r.choice("abcdefghij-._0123456789") for _ in range(r.randrange(0, 12)))

    def integer(self, name: str, codec: type) -> int:
        lo, hi = _INT_RANGE[codec]
        return max(lo, min(hi, self._integer(name, lo, hi)))

    def _integer(self, name: str, lo: int, hi: int) -> int:
        r = self.rng
        if name == "controller_epoch":
            return r.choice((0, 1, 2, 1 << 30))  # stale, current, next, made up: all refused here
        if name == "acks":
            return r.choice((-1, 0, 1))
        if name.endswith("_ms") or "timeout" in name:
            return r.choice((0, 10, 100, 6000, 30000) if "session" in name else (0, 10, 100))
        if "partition" in name or name in ("index", "id", "count", "partitions"):
            return r.choice((0, 0, 1, 2, -1))
        if "epoch" in name or name == "generation_id":
            return r.choice((-1, 0, 1))
        if name in ("replica_id", "broker_id", "leader", "controller_id", "replicas", "isr",
                    "broker_ids", "new_isr", "adding_replicas", "removing_replicas"):
            return r.choice((-1, 0, 1, 2))
        if "offset" in name or "timestamp" in name:
            return r.choice((-2, -1, 0, 1, 5))
        if name == "num_partitions":
            return r.choice((1, 2, -1))
        if name == "replication_factor":
            return r.choice((1, -1))
        if "bytes" in name:
            return r.choice((0, 1, 1024, 1 << 20))
        if name == "resource_type":
            return r.choice((2, 4, 8, 0, 1))
        if name == "port":
            return 1  # a closed port on 127.0.0.1
        if "producer_id" in name:
            return r.choice((-1, 0, 1000))
        return r.choice((0, 1, -1, 2, r.randint(max(lo, -(1 << 31)), min(hi, (1 << 31) - 1))))

    def records(self) -> bytes:
        r = self.rng
        batch = [(r.choice((None, b"k", b"key-%d" % i)), r.randbytes(r.choice((0, 5, 100))))
                 for i in range(r.randint(1, 3))]
        codec = r.choice((compression.NONE, compression.NONE, compression.GZIP,
                          compression.SNAPPY, compression.LZ4, compression.ZSTD))
        extra: dict[str, Any] = {}
        if r.random() < 0.25:
            extra = {"producer_id": r.choice((0, 1000)), "producer_epoch": 0, "base_sequence": 0,
                     "transactional": r.random() < 0.5}
        return build_batch(batch, timestamp=1_700_000_000_000, codec=codec, **extra)

    def simple(self, f: SimpleField, version: int, element: bool = False) -> Any:
        """A value for `f`; `element`: an item of an array, which is never null."""
        r, codec, name = self.rng, f._type, f.name
        if not element and f.nullable_for_version_q(version) and r.random() < 0.15:
            return None
        if isinstance(codec, String):
            return self.string(name, "")
        if codec is Bytes:
            return self.records() if f.type_str == "records" else r.randbytes(r.choice((0, 4, 30)))
        if codec is Boolean:
            return r.random() < 0.5
        if codec is UUID:
            return None if r.random() < 0.3 else uuid.UUID(int=r.getrandbits(128))
        if codec is Float64:
            return r.choice((0.0, 1.5, -1.0))
        if codec is BitField:
            return None if r.random() < 0.5 else {0, 3}
        return self.integer(name, codec)


class RequestFactory:
    """Valid requests for any (api key, version) the codec knows, with the layout of their
    bytes. `check_against_codec` (on by default) encodes the same values with the codec and
    insists the bytes are equal, so the recorded layout is the one the broker parses."""

    def __init__(self, rng: random.Random, check_against_codec: bool = True) -> None:
        self.rng = rng
        self.values = _Values(rng)
        self.check = check_against_codec
        self.correlation = 0

    # values
    def _value(self, f: Any, version: int, depth: int) -> Any:
        r = self.rng
        nullable = f.nullable_for_version_q(version)
        if isinstance(f, ArrayField):
            if nullable and r.random() < 0.1:
                return None
            if depth > 3:
                n = 0
            elif f.name in _MOSTLY_EMPTY:
                n = r.choice((0, 0, 0, 1))
            else:
                n = r.choice((1, 1, 1, 0, 2))
            if isinstance(f, StructArrayField):
                return [self._struct_value(f.array_of, version, depth + 1) for _ in range(n)]
            return [self.values.simple(f.array_of, version, element=True) for _ in range(n)]
        if isinstance(f, StructField):
            if nullable and r.random() < 0.2:
                return None
            return self._struct_value(f, version, depth + 1)
        return self.values.simple(f, version)

    def _struct_value(self, sf: StructField, version: int, depth: int) -> dict[str, Any]:
        out = {}
        for f in sf.untagged_fields(version):
            out[f.name] = self._named(f, sf, version, depth)
        for f in sf.tagged_fields(version)._fields:
            if self.rng.random() < 0.25:
                out[f.name] = self._named(f, sf, version, depth)
        return out

    def _named(self, f: Any, parent: StructField, version: int, depth: int) -> Any:
        # Strings need their parent's type name (a config's "name" is not a topic's "name").
        if isinstance(f, SimpleField) and isinstance(f._type, String):
            if f.nullable_for_version_q(version) and self.rng.random() < 0.15:
                return None
            return self.values.string(f.name, parent.type_str)
        if isinstance(f, ArrayField) and not isinstance(f, StructArrayField) \
                and isinstance(f.array_of._type, String):
            if f.nullable_for_version_q(version) and self.rng.random() < 0.1:
                return None
            return [self.values.string(f.name, parent.type_str) for _ in range(self.rng.choice((1, 0, 2)))]
        return self._value(f, version, depth)

    # bytes
    def build(self, api_key: int, version: int, fields: dict[str, Any] | None = None,
              answered: bool = False, alone: bool = False) -> Request:
        """`answered`: a request that must get an answer (a Produce with acks=0 gets none, and
        a failed one closes the connection, as Kafka does). `alone`: one that must be answered
        at once, whatever other clients did before: a JoinGroup joins a group of its own."""
        cls = messages.REQUESTS[api_key]
        flexible = messages.is_flexible(api_key, version)
        if fields is None:
            fields = self._struct_value(cls._struct, version, 0)
        if answered and fields.get("acks") == 0:
            fields["acks"] = 1
        if alone and api_key == JOIN_GROUP and fields.get("group_id"):
            # A join into a group with members waits, as Kafka's coordinator makes it wait,
            # until they rejoin or the group's rebalance timeout passes (a v0 member's session
            # timeout: up to 30 s here), and other clients' joins leave such members behind.
            fields["group_id"] += f"-{uuid.UUID(int=self.rng.getrandbits(128))}"
        for name in PROTECTED.get(api_key, ()):
            if name in fields:
                fields[name] = STALE_CONTROLLER_EPOCH if name == "controller_epoch" else FOREIGN_BROKER_ID
        w = _Writer(flexible, PROTECTED.get(api_key, set()))
        self.correlation += 1
        w.fixed(">h", api_key, "api_key")
        w.fixed(">h", version, "api_version")
        w.fixed(">i", self.correlation, "correlation_id")
        w.string("fuzz-client", "client_id", compact=False)
        if flexible:
            w.tags(b"\x00", "header")
        header_end = len(w.buf)
        w.struct(cls._struct, fields, version, top=True)
        payload = bytes(w.buf)
        if self.check:
            codec_body = messages.build(cls, version, fields).encode(version=version)
            if payload[header_end:] != bytes(codec_body):
                raise AssertionError(f"{cls.name} v{version}: the fuzzer's layout differs from the codec's")
        return Request(api_key, version, payload, w.spans, header_end, flexible)


class _Writer:
    def __init__(self, flexible: bool, protected: set[str]) -> None:
        self.buf = bytearray()
        self.spans: list[Span] = []
        self.flexible = flexible
        self.protected = protected

    def fixed(self, fmt: str, value: Any, name: str) -> None:
        start = len(self.buf)
        self.buf += struct.pack(fmt, value)
        self.spans.append(Span(start, len(self.buf), "int", name, width=len(self.buf) - start,
                               protected=name in self.protected))

    def length(self, n: int | None, name: str, of: str, width: int, compact: bool) -> None:
        start = len(self.buf)
        if compact:
            self.buf += write_uvarint(0 if n is None else n + 1)
            width = 0
        else:
            self.buf += struct.pack(">h" if width == 2 else ">i", -1 if n is None else n)
        self.spans.append(Span(start, len(self.buf), "len", name, width=width, of=of,
                               count=-1 if n is None else n))

    def string(self, value: str | None, name: str, compact: bool) -> None:
        raw = None if value is None else value.encode()
        self.length(None if raw is None else len(raw), name, "string", 2, compact)
        if raw:
            start = len(self.buf)
            self.buf += raw
            self.spans.append(Span(start, len(self.buf), "string", name))

    def tags(self, encoded: bytes, name: str) -> None:
        start = len(self.buf)
        self.buf += encoded
        self.spans.append(Span(start, len(self.buf), "tags", name))

    def struct(self, sf: StructField, value: dict | None, version: int, top: bool = False,
               in_array: bool = False) -> None:
        if not top and not in_array and sf.nullable_for_version_q(version):
            self.buf += b"\xff" if value is None else b"\x01"
            if value is None:
                return
        for f in sf.untagged_fields(version):
            self.field(f, value.get(f.name), version)
        if self.flexible:
            self.tags(sf.tagged_fields(version).encode(value, version=version), f"{sf.name}.tags")

    def field(self, f: Any, value: Any, version: int) -> None:
        compact = self.flexible
        if isinstance(f, ArrayField):
            self.length(None if value is None else len(value), f.name, "array", 4, compact)
            for item in value or ():
                if isinstance(f, StructArrayField):
                    self.struct(f.array_of, item, version, in_array=True)
                else:
                    self.simple(f.array_of, item)
        elif isinstance(f, StructField):
            self.struct(f, value, version)
        else:
            self.simple(f, value)

    def simple(self, f: SimpleField, value: Any) -> None:
        codec, compact = f._type, self.flexible
        if isinstance(codec, String):
            self.string(value, f.name, compact)
        elif codec is Bytes:
            self.length(None if value is None else len(value), f.name, f.type_str, 4, compact)
            if value:
                start = len(self.buf)
                self.buf += value
                if f.type_str == "records":
                    self.spans.append(Span(start, len(self.buf), "records", f.name))
        elif codec in _FIXED:
            self.fixed(_FIXED[codec], value, f.name)
        else:  # UUID, BitField: let the codec lay them out, fixed width either way
            start = len(self.buf)
            self.buf += codec.encode(value)
            self.spans.append(Span(start, len(self.buf), "int", f.name, width=len(self.buf) - start))


# --- mutations --------------------------------------------------------------------------------

_INTERESTING = (0, -1, 1, 2, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, 0x80000000,
                0xFFFFFFFF)


class Mutator:
    """Turns a valid request into one damaged case. Each mutation names itself."""

    STRUCTURAL = ("truncate", "length-longer", "length-shorter", "length-null",
                  "length-negative", "count-huge", "tagged", "random-body", "trailing-garbage",
                  "wrong-version", "wrong-key", "header", "bad-frame", "records")
    IN_PLACE = ("bit-flip", "byte-values", "int-extreme", "bad-utf8")
    WEIGHTS = {"bit-flip": 12, "byte-values": 5, "int-extreme": 8, "bad-utf8": 3, "truncate": 8,
               "length-longer": 6, "length-shorter": 3, "length-null": 6, "length-negative": 4,
               "count-huge": 5, "tagged": 5, "random-body": 5, "trailing-garbage": 3,
               "wrong-version": 5, "wrong-key": 2, "header": 3, "bad-frame": 4, "records": 6,
               "stacked": 5}

    def __init__(self, rng: random.Random, supported: dict[int, tuple[int, int]]) -> None:
        self.rng = rng
        self.supported = supported
        self.names = list(self.WEIGHTS)
        self.weights = [self.WEIGHTS[n] for n in self.names]

    def mutate(self, req: Request, number: int) -> Case:
        name = self.rng.choices(self.names, self.weights)[0]
        if any(s.kind == "records" for s in req.spans) and self.rng.random() < 0.3:
            name = "records"  # only Produce carries record batches: give them their share
        payload = bytearray(req.payload)
        if name == "stacked":
            steps = self.rng.sample(self.IN_PLACE, 2) + [self.rng.choice(self.STRUCTURAL + ("bit-flip",))]
        else:
            steps = [name]
        framed, applied = True, []
        for step in steps:
            result = getattr(self, "_" + step.replace("-", "_"))(req, payload)
            if result is None:  # not applicable to this request: flip bits instead
                step, result = "bit-flip", self._bit_flip(req, payload)
            payload, step_framed = result
            framed = framed and step_framed
            applied.append(step)
            if step in self.STRUCTURAL:
                break  # the layout no longer matches the spans
        data = bytes(payload) if not framed else frame(bytes(payload))
        return Case(number, req.api_key, req.version, "+".join(applied), data, framed)

    # helpers
    def _free_positions(self, req: Request, lo: int = 4) -> list[int]:
        """Byte positions a mutation may touch: not the api key (that could turn any body into
        a controller request) and not a protected field."""
        blocked = set()
        for s in req.spans:
            if s.protected:
                blocked.update(range(s.start, s.end))
        return [i for i in range(lo, len(req.payload)) if i not in blocked] or [len(req.payload) - 1]

    def _spans(self, req: Request, kind: str, of: tuple[str, ...] = ()) -> list[Span]:
        return [s for s in req.spans if s.kind == kind and not s.protected and (not of or s.of in of)]

    def _set_length(self, payload: bytearray, span: Span, value: int) -> bytearray:
        if span.width == 0:
            encoded = write_uvarint(value) if value >= 0 else b"\xff\xff\xff\xff\xff\x7f"
        else:
            lo, hi = (-(1 << 15), (1 << 15) - 1) if span.width == 2 else (-(1 << 31), (1 << 31) - 1)
            value = max(lo, min(hi, value))
            encoded = struct.pack(">h" if span.width == 2 else ">i", value)
        return payload[: span.start] + encoded + payload[span.end :]

    def _encoded_count(self, span: Span, count: int) -> int:
        return count + 1 if span.width == 0 else count

    # in place
    def _bit_flip(self, req: Request, payload: bytearray):
        positions = self._free_positions(req)
        for _ in range(self.rng.randint(1, 4)):
            payload[self.rng.choice(positions)] ^= 1 << self.rng.randrange(8)
        return payload, True

    def _byte_values(self, req: Request, payload: bytearray):
        positions = self._free_positions(req)
        for _ in range(self.rng.randint(1, 3)):
            payload[self.rng.choice(positions)] = self.rng.choice((0x00, 0xFF, 0x7F, 0x80, 0x01))
        return payload, True

    def _int_extreme(self, req: Request, payload: bytearray):
        spans = [s for s in self._spans(req, "int") if s.width in _SIGNED_FORMAT and s.start >= 4]
        if not spans:
            return None
        s = self.rng.choice(spans)
        bits = 8 * s.width
        value = self.rng.choice((0, -1, 1, -(1 << (bits - 1)), (1 << (bits - 1)) - 1,
                                 (1 << (bits - 1)) - 2, 1 << min(bits - 2, 30)))
        payload[s.start : s.end] = struct.pack(_SIGNED_FORMAT[s.width], value)
        return payload, True

    def _bad_utf8(self, req: Request, payload: bytearray):
        spans = self._spans(req, "string")
        if not spans:
            return None
        s = self.rng.choice(spans)
        i = self.rng.randrange(s.start, s.end)
        payload[i] = self.rng.choice((0xFF, 0xC0, 0x80, 0xED))
        return payload, True

    # structural
    def _truncate(self, req: Request, payload: bytearray):
        cut = self.rng.randrange(0, len(payload))
        return payload[:cut], True

    def _length_longer(self, req: Request, payload: bytearray):
        spans = self._spans(req, "len")
        if not spans:
            return None
        s = self.rng.choice(spans)
        extra = self.rng.choice((1, 2, 7, 100, 5000))
        return self._set_length(payload, s, self._encoded_count(s, max(0, s.count) + extra)), True

    def _length_shorter(self, req: Request, payload: bytearray):
        spans = [s for s in self._spans(req, "len") if s.count > 0]
        if not spans:
            return None
        s = self.rng.choice(spans)
        return self._set_length(payload, s, self._encoded_count(s, s.count - 1)), True

    def _length_null(self, req: Request, payload: bytearray):
        spans = [s for s in self._spans(req, "len") if s.count >= 0]
        if not spans:
            return None
        s = self.rng.choice(spans)
        return self._set_length(payload, s, 0 if s.width == 0 else -1), True

    def _length_negative(self, req: Request, payload: bytearray):
        spans = self._spans(req, "len")
        if not spans:
            return None
        s = self.rng.choice(spans)
        return self._set_length(payload, s, self.rng.choice((-2, -1000, -(1 << 31)))), True

    def _count_huge(self, req: Request, payload: bytearray):
        spans = self._spans(req, "len")
        if not spans:
            return None
        s = self.rng.choice(spans)
        value = self.rng.choice(((1 << 31) - 1, 1 << 24, 0xFFFFFFFF if s.width == 0 else (1 << 31) - 1))
        return self._set_length(payload, s, value), True

    def _tagged(self, req: Request, payload: bytearray):
        spans = self._spans(req, "tags")
        if not spans:
            return None
        s = self.rng.choice(spans)
        r = self.rng
        choice = r.randrange(5)
        if choice == 0:  # an unknown tag, honest size
            body = r.randbytes(r.choice((0, 1, 9, 200)))
            section = write_uvarint(1) + write_uvarint(r.randint(50, 100000)) + write_uvarint(len(body)) + body
        elif choice == 1:  # a size running past the end
            section = write_uvarint(1) + write_uvarint(r.randint(0, 9)) + write_uvarint(r.choice((100, 1 << 30)))
        elif choice == 2:  # billions of tags
            section = write_uvarint(0xFFFFFFFF)
        elif choice == 3:  # a known tag number with garbage in it
            body = r.randbytes(r.choice((0, 1, 3, 20)))
            section = write_uvarint(1) + write_uvarint(r.randint(0, 3)) + write_uvarint(len(body)) + body
        else:  # the same tag twice, out of order
            section = write_uvarint(2) + b"\x05\x00" + b"\x01\x00"
        return payload[: s.start] + section + payload[s.end :], True

    def _random_body(self, req: Request, payload: bytearray):
        keep = max([req.header_end] + [s.end for s in req.spans if s.protected])
        return payload[:keep] + self.rng.randbytes(self.rng.choice((0, 1, 5, 17, 64, 300))), True

    def _trailing_garbage(self, req: Request, payload: bytearray):
        return payload + self.rng.randbytes(self.rng.choice((1, 4, 100))), True

    def _wrong_version(self, req: Request, payload: bytearray):
        lo, hi = self.supported.get(req.api_key, (0, 0))
        version = self.rng.choice((hi + 1, lo - 1, -1, 32767, self.rng.randint(lo, hi), 0, hi))
        payload[2:4] = struct.pack(">h", version)
        return payload, True

    def _wrong_key(self, req: Request, payload: bytearray):
        keys = list(self.supported) + [17, 4242, -1, 32767]
        payload[0:2] = struct.pack(">h", self.rng.choice(keys))
        return payload, True

    def _header(self, req: Request, payload: bytearray):
        client = next(s for s in req.spans if s.name == "client_id" and s.kind == "len")
        r = self.rng
        choice = r.randrange(4)
        if choice == 0:
            return self._set_length(payload, client, r.choice((-2, 32767, 12, 10, 0, -(1 << 15)))), True
        if choice == 1:
            payload[client.end] = 0xFF  # invalid UTF-8 in the client id
            return payload, True
        if choice == 2:
            payload[4:8] = struct.pack(">i", r.choice((-1, 0, (1 << 31) - 1)))
            return payload, True
        return payload[:8] + r.randbytes(r.choice((0, 1, 2, 3))), True  # the header itself cut

    def _bad_frame(self, req: Request, payload: bytearray):
        r = self.rng
        body = bytes(payload)
        choice = r.randrange(6)
        if choice == 0:
            data = struct.pack(">i", r.choice((-1, -(1 << 31), -100)))
        elif choice == 1:
            data = struct.pack(">i", r.choice(((100 << 20) + 1, (1 << 31) - 1, 1 << 30)))
        elif choice == 2:
            n = r.choice((0, 1, 2, 3, 7, 9))
            data = struct.pack(">i", n) + body[:n]
        elif choice == 3:  # announced more than sent, then the end of the stream
            data = struct.pack(">i", len(body) + r.choice((1, 100, 70000, 5 << 20))) + body
        elif choice == 4:  # announced less: the rest reads as the next frame
            data = struct.pack(">i", max(0, len(body) - r.choice((1, 4, 9)))) + body
        else:  # a valid frame, then a few bytes of the next size prefix
            data = frame(body) + r.randbytes(r.choice((1, 2, 3)))
        return bytearray(data), False

    def _records(self, req: Request, payload: bytearray):
        spans = [s for s in req.spans if s.kind == "records" and s.end - s.start >= 61]
        if not spans:
            return None
        s = self.rng.choice(spans)
        batch = payload[s.start : s.end]
        r = self.rng
        choice = r.randrange(8)
        if choice == 0:  # batchLength
            batch[8:12] = struct.pack(">i", r.choice((0, -1, 48, len(batch), len(batch) - 13, 1 << 30)))
        elif choice == 1:  # magic
            batch[16] = r.choice((0, 1, 3, 0xFF))
        elif choice == 2:  # attributes: unknown codecs, control, transactional bits
            batch[21:23] = struct.pack(">h", r.choice((5, 6, 7, 0x20, 0x30, 0x10, -1, 0x08)))
        elif choice == 3:  # lastOffsetDelta
            batch[23:27] = struct.pack(">i", r.choice((-1, 0, 1 << 30, (1 << 31) - 1)))
        elif choice == 4:  # record count
            batch[57:61] = struct.pack(">i", r.choice((0, -1, 1 << 30, (1 << 31) - 1, 1000)))
        elif choice == 5:  # producer id / epoch / base sequence
            batch[43:61] = struct.pack(">qhii", r.choice((-2, 0, 1 << 62)), r.choice((-2, 0, 32767)),
                                       r.choice((-2, 0, (1 << 31) - 1)),
                                       struct.unpack_from(">i", batch, 57)[0])
        elif choice == 6:  # garbage varints in the records
            i = r.randrange(61, len(batch))
            batch[i : i + 6] = b"\xff" * min(6, len(batch) - i)
        else:
            for _ in range(r.randint(1, 4)):
                i = r.randrange(21, len(batch))
                batch[i] ^= 1 << r.randrange(8)
        # A correct CRC, so the damage is seen by what comes after the CRC check.
        batch[17:21] = struct.pack(">I", crc32c(bytes(batch[21:])))
        payload[s.start : s.end] = batch
        return payload, True


# --- sending ----------------------------------------------------------------------------------

BAD_LOG_MARKERS = ("Traceback", "request failed with", "Exception in callback",
                   "exception was never retrieved", "Unhandled", " ERROR ", " CRITICAL ")
MAX_LOG_LINE = 2100


def bad_log_line(line: str) -> bool:
    """A line that betrays an exception no code path meant to handle, or a line a client
    could make as long as it likes."""
    return len(line) > MAX_LOG_LINE or any(m in line for m in BAD_LOG_MARKERS)


def probe_request(correlation_id: int) -> bytes:
    """ApiVersions v0: answerable by any broker, whatever came before on the connection."""
    return frame(struct.pack(">hhih", API_VERSIONS, 0, correlation_id, -1))


PROBE_CORRELATION = 0x5EED


def send_case(port: int, case: Case, hold_s: float) -> str:
    """Send one case on a new connection; "answered", "silent" (dealt with, no answer),
    "closed" (the broker closed the connection) or "held" (no verdict within `hold_s`)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=hold_s)
    # Reset on close: tens of thousands of connections must not pile up in TIME_WAIT.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    try:
        try:
            if case.framed:
                sock.sendall(case.data + probe_request(PROBE_CORRELATION))
            else:
                sock.sendall(case.data)
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            return "closed"
        buf, answered = bytearray(), False
        deadline = time.monotonic() + hold_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "held"
            sock.settimeout(remaining)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                return "held"
            except ConnectionResetError:
                return "closed"
            if not chunk:
                return "answered-then-closed" if answered else "closed"
            buf += chunk
            while len(buf) >= 8:
                (size,) = struct.unpack_from(">i", buf, 0)
                if len(buf) < 4 + size:
                    break
                (correlation,) = struct.unpack_from(">i", buf, 4)
                del buf[: 4 + size]
                if correlation == PROBE_CORRELATION and case.framed:
                    return "answered" if answered else "silent"
                answered = True
    finally:
        sock.close()


@dataclass
class Finding:
    lines: list[str]
    suspects: list[Case]  # the cases sent shortly before the lines appeared


@dataclass
class FuzzReport:
    seed: int
    cases: int = 0
    frames: int = 0  # requests sent: the cases and the probes after them
    seconds: float = 0.0
    outcomes: Counter = field(default_factory=Counter)
    by_mutation: Counter = field(default_factory=Counter)
    by_api: Counter = field(default_factory=Counter)
    valid_outcomes: Counter = field(default_factory=Counter)  # unmutated requests, per outcome
    valid_rejected: list[Case] = field(default_factory=list)
    held: list[Case] = field(default_factory=list)  # no verdict in time: waited on, or stalled
    findings: list[Finding] = field(default_factory=list)
    died_after: list[Case] = field(default_factory=list)

    def summary(self) -> str:
        rate = self.cases / self.seconds if self.seconds else 0.0
        keys = sorted({k for k, _ in self.by_api})
        return (f"seed {self.seed}: {self.cases} cases ({self.frames} frames) in {self.seconds:.1f} s "
                f"({rate:.0f}/s) over {len(self.by_api)} (api, version) pairs of {len(keys)} api keys "
                f"{keys}; bursts {sum(n for (m, _), n in self.by_mutation.items() if m == 'burst')}; "
                f"outcomes {dict(self.outcomes)}; "
                f"unmutated requests {dict(self.valid_outcomes)}; "
                f"{len(self.findings)} suspicious log events")


def prepare_broker(port: int) -> None:
    """The topics the fuzzer's requests name, with records in each partition; called again
    every round, since a fuzzed DeleteTopics may have removed them. And the internal topics:
    the first request that needs a coordinator makes its topic of 50 partitions and waits for
    it (seconds on a busy machine), which a first-round request must not be held by."""
    from strom.client import Connection

    names = sorted(set(TOPICS))
    with Connection("127.0.0.1", port) as conn:
        body = conn.call(CREATE_TOPICS, 5, {"topics": [
            {"name": name, "num_partitions": 2, "replication_factor": 1, "assignments": [],
             "configs": []} for name in names], "timeout_ms": 5000, "validate_only": False})
        created = [t.name for t in body.topics if t.error_code == 0]
        if created:
            conn.call(PRODUCE, 9, {"transactional_id": None, "acks": 1, "timeout_ms": 5000, "topic_data": [
                {"name": name, "partition_data": [
                    {"index": p, "records": build_batch([(b"k", b"v")] * 3, timestamp=1_700_000_000_000)}
                    for p in range(2)]} for name in created]})
        for key_type, key in ((0, "fuzz-group"), (1, "fuzz-txn"), (2, "fuzz-group:AAAAAAAAAAAAAAAAAAAAAA:0")):
            conn.call(FIND_COORDINATOR, 6, {"key_type": key_type, "coordinator_keys": [key]})


class Fuzzer:
    """Cases for each (api key, version) in turn until the time is up, one connection each,
    from `workers` clients at once (threads with generators of their own, seeded from `seed`).

    Now and then a worker sends one valid request from two to four connections at the same
    moment (a burst): races between clients, such as two DeleteRecords writing the same
    checkpoint, need two. `log_lines` is the broker's log as a growing list
    (BrokerProcess.stderr_lines); `alive` says whether its process still runs."""

    BURST_SHARE = 0.08

    def __init__(self, port: int, seed: int, targets: Sequence[tuple[int, int]],
                 log_lines: list[str], alive: Callable[[], bool], hold_s: float = 1.5,
                 prepare: Callable[[int], None] | None = prepare_broker, workers: int = 1) -> None:
        self.port = port
        self.prepare = prepare
        self.seed = seed
        self.rng = random.Random(seed)
        self.report = FuzzReport(seed)
        self.targets = list(targets)
        self.supported: dict[int, tuple[int, int]] = {}
        for key, version in self.targets:
            lo, hi = self.supported.get(key, (version, version))
            self.supported[key] = (min(lo, version), max(hi, version))
        self.factory = RequestFactory(self.rng)
        self.mutator = Mutator(self.rng, self.supported)
        self.log_lines = log_lines
        self.alive = alive
        self.hold_s = hold_s
        self.workers = workers
        self.recent: deque[Case] = deque(maxlen=8 * workers)
        self.seen_lines = len(log_lines)
        self._lock = threading.Lock()
        self._numbers = itertools.count()
        self._stop = threading.Event()
        self._min_rounds = 0

    def run(self, seconds: float, max_cases: int | None = None, min_cases: int = 0) -> FuzzReport:
        """Fuzz until `seconds` have passed and each target has had `min_cases` cases (its valid
        one included), or `max_cases` cases in all. The minimum is counted, not timed: a busy
        machine sends fewer cases a second, and would otherwise leave targets untried."""
        begin = time.monotonic()
        deadline = begin + seconds
        # Every worker sends each target once a round.
        self._min_rounds = -(-min_cases // self.workers)
        if self.workers == 1:
            self._work(self.rng, self.factory, self.mutator, deadline, max_cases)
        else:
            threads = []
            for i in range(self.workers):
                rng = random.Random(self.seed * 1000 + i)
                threads.append(threading.Thread(target=self._work, daemon=True, args=(
                    rng, RequestFactory(rng), Mutator(rng, self.supported), deadline, max_cases)))
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        self._scan_log(settle=True)
        self.report.seconds = time.monotonic() - begin
        return self.report

    def _work(self, rng: random.Random, factory: RequestFactory, mutator: Mutator, deadline: float,
              max_cases: int | None) -> None:
        rounds = 0

        def more() -> bool:
            return rounds < self._min_rounds or time.monotonic() < deadline

        while not self._stop.is_set() and more():
            if self.prepare is not None:
                self.prepare(self.port)
            order = list(self.targets)
            rng.shuffle(order)
            for api_key, version in order:
                number = next(self._numbers)
                if max_cases is not None and number >= max_cases:
                    return
                burst = rounds > 0 and self.workers > 1 and rng.random() < self.BURST_SHARE
                req = factory.build(api_key, version, answered=rounds == 0 or burst, alone=rounds == 0)
                # The first round sends each request as it is: a valid request that the broker
                # refuses says the fuzzer (or the broker) is wrong, not the client.
                if rounds == 0:
                    cases = [Case(number, api_key, version, "none", frame(req.payload), True)]
                elif burst:
                    cases = [Case(number, api_key, version, "burst", frame(req.payload), True)
                             for _ in range(rng.randint(2, 4))]
                else:
                    cases = [mutator.mutate(req, number)]
                if not self._send(cases) or self._stop.is_set() or not more():
                    return
            rounds += 1

    def _send(self, cases: list[Case]) -> bool:
        """Send `cases` at once (a burst is several), each on its own connection."""
        with self._lock:
            self.recent.extend(cases)
        if len(cases) == 1:
            outcomes = [self._outcome(cases[0])]
        else:
            outcomes: list[str] = [""] * len(cases)
            gate = threading.Barrier(len(cases))

            def one(i: int) -> None:
                gate.wait()
                outcomes[i] = self._outcome(cases[i])

            senders = [threading.Thread(target=one, args=(i,)) for i in range(len(cases))]
            for t in senders:
                t.start()
            for t in senders:
                t.join()
        with self._lock:
            report = self.report
            for case, outcome in zip(cases, outcomes, strict=True):
                report.cases += 1
                report.frames += 2 if case.framed else 1  # the case, and the probe after it
                report.outcomes[outcome] += 1
                report.by_mutation[(case.mutation.split("+")[0], outcome)] += 1
                report.by_api[(case.api_key, case.version)] += 1
                if outcome == "held":
                    report.held.append(case)
                if case.mutation in ("none", "burst"):
                    report.valid_outcomes[outcome] += 1
                    # A burst's copies may wait on each other (a group's joins): only a closed
                    # connection refuses them.
                    if outcome not in ("answered", "silent") and (case.mutation == "none" or outcome != "held"):
                        report.valid_rejected.append(case)
            self._scan_log()
            if not self.alive():
                report.died_after = list(self.recent)
                self._stop.set()
                return False
        return True

    def _outcome(self, case: Case) -> str:
        try:
            return send_case(self.port, case, self.hold_s)
        except (ConnectionRefusedError, OSError) as e:
            return f"connect-failed:{type(e).__name__}"

    def _scan_log(self, settle: bool = False) -> None:
        if settle:
            time.sleep(0.5)  # the log arrives through a pipe, a moment after the answers
        lines = self.log_lines[self.seen_lines :]
        self.seen_lines += len(lines)
        bad = [line for line in lines if bad_log_line(line)]
        if bad:
            self.report.findings.append(Finding([b[:500] for b in bad], list(self.recent)))


def advertised_targets(port: int) -> list[tuple[int, int]]:
    """Every (api key, version) the broker's ApiVersions advertises and serves: Produce v0-v2
    are advertised only, as by Kafka since 4.0, and refused (test_kafka_43 checks that)."""
    from strom.client import Connection

    with Connection("127.0.0.1", port) as conn:
        body = conn.call(API_VERSIONS, 3, {"client_software_name": "fuzz", "client_software_version": "1"})
    return [(k.api_key, v) for k in body.api_keys for v in range(k.min_version, k.max_version + 1)
            if not (k.api_key == 0 and v < 3)]


def replay(data_hex: str, overrides: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """Send one recorded case to a fresh broker: (outcome, its log lines after start-up)."""
    from strom.testing import BrokerProcess

    data = bytes.fromhex(data_hex)
    (size,) = struct.unpack_from(">i", data, 0)
    case = Case(0, -1, -1, "replay", data, framed=size == len(data) - 4)
    with BrokerProcess(overrides=overrides) as broker:
        prepare_broker(broker.port)
        start = len(broker.stderr_lines)
        outcome = send_case(broker.port, case, 3.0)
        time.sleep(0.5)
        return outcome, broker.stderr_lines[start:]


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "replay":
        for hex_case in sys.argv[2:]:
            result, lines = replay(hex_case)
            print(result)
            print("\n".join(lines))
    else:
        print(__doc__)
        sys.exit(2)
