"""What every schema type gives the registry, produce validation and Spark: one contract.

A schema arrives as text (`schemaType` AVRO, PROTOBUF or JSON, Confluent's names) with the
schemas it references already resolved by the caller (the registry knows subjects and
versions; this package does not). `parse` turns it into a ParsedSchema or raises SchemaError,
whose message the registry hands back with error code 42201. Nothing here does I/O.
"""

from __future__ import annotations

import importlib
import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum

from strom.java_text import java_double

AVRO = "AVRO"
PROTOBUF = "PROTOBUF"
JSON = "JSON"
SCHEMA_TYPES = (AVRO, PROTOBUF, JSON)

# Bounds a client cannot make us exceed: nesting (recursion in every parser and checker) and
# how many schemas one schema may pull in through its references, transitively.
MAX_DEPTH = 64
MAX_REFERENCES = 1000


def compact_json(value: object) -> str:
    """`value` as Jackson writes a JSON tree compactly: no whitespace, key order kept,
    non-ASCII as is, floats in Java's double form, Decimals in BigDecimal's. Recursive:
    callers bound the nesting."""
    if isinstance(value, float):
        return java_double(value)
    if isinstance(value, Decimal):  # a number kept as written: Java's BigDecimal text
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{compact_json(str(k))}:{compact_json(v)}"
                              for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(map(compact_json, value)) + "]"
    return json.dumps(value, ensure_ascii=False)


class SchemaError(ValueError):
    """The schema is not a valid schema of its type (or its references do not resolve)."""


@dataclass(frozen=True)
class Reference:
    """A reference as the registry stores it: the name the schema uses for it (an Avro full
    name, a .proto import path, a JSON Schema $ref URL), and the subject version it is."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True)
class ResolvedReference:
    """A reference with the text of the schema it names; `references` are that schema's own,
    resolved the same way (the caller has bounded the depth and refused cycles)."""

    name: str
    schema: str
    references: tuple[ResolvedReference, ...] = ()


class Compatibility(StrEnum):
    """Confluent's compatibility levels. BACKWARD: the new schema reads what the previous one
    wrote; FORWARD: the previous schema reads what the new one writes; FULL: both. The
    _TRANSITIVE forms check against every earlier version, the others against the latest."""

    NONE = "NONE"
    BACKWARD = "BACKWARD"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD = "FORWARD"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL = "FULL"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"

    @property
    def transitive(self) -> bool:
        return self.value.endswith("_TRANSITIVE")


class ParsedSchema(ABC):
    """A valid schema of one type."""

    schema_type: str

    @property
    @abstractmethod
    def canonical(self) -> str:
        """The text the registry stores and returns, and compares to find an existing id:
        Confluent's canonical string for the type, so that schemas that differ only in
        whitespace (Avro, JSON) or formatting (Protobuf) get one id."""

    @abstractmethod
    def normalized(self) -> ParsedSchema:
        """The schema normalized as Confluent's `normalize=true` does (a stricter canonical
        form: defaults and ordering that do not change meaning removed)."""

    @abstractmethod
    def read_errors(self, writer: ParsedSchema) -> list[str]:
        """Why data written with `writer` cannot be read with this schema (empty: it can).
        Messages in the manner of Confluent's (e.g. "READER_FIELD_MISSING_DEFAULT_VALUE ...")."""

    @abstractmethod
    def decode(self, payload: bytes | memoryview) -> object:
        """A value's payload (what follows the 5-byte framing; for Protobuf that starts with
        the message indexes) as Python data: a dict for a record or message, parsed JSON for
        JSON Schema. Raises SchemaError if the payload does not match."""

    def encode(self, value: object) -> bytes:
        """`value` (Python data as decode gives it) as a payload, without the framing: what a
        sink writes. SchemaError if the value does not fit the schema."""
        raise NotImplementedError(f"{self.schema_type} schemas do not encode values")

    @property
    def record_name(self) -> str | None:
        """The name the record name subject strategies (RecordNameStrategy,
        TopicRecordNameStrategy) give a record of this schema; None if it has none."""
        return None


def compatibility_errors(level: Compatibility, new: ParsedSchema,
                         previous: Sequence[ParsedSchema]) -> list[str]:
    """Why `new` may not follow `previous` (oldest first) under `level`; empty if it may.
    Non-transitive levels look at the latest previous schema only."""
    if level is Compatibility.NONE or not previous:
        return []
    against = previous if level.transitive else previous[-1:]
    errors: list[str] = []
    for old in reversed(against):  # newest first, as Confluent reports
        if level.value.startswith(("BACKWARD", "FULL")):
            errors += new.read_errors(old)
        if level.value.startswith(("FORWARD", "FULL")):
            errors += old.read_errors(new)
    return errors


# Each type's module imports this one (the contract); this one finds them by name when a
# schema arrives, so the package has no import circle and loads a type's libraries on use.
_KINDS = {AVRO: ("strom.schemas.avro", "AvroSchema"),
          PROTOBUF: ("strom.schemas.protobuf", "ProtobufSchema"),
          JSON: ("strom.schemas.json_schema", "JsonSchema")}


def parse(schema_type: str, text: str, references: Sequence[ResolvedReference] = ()) -> ParsedSchema:
    """`text` parsed as a schema of `schema_type` (AVRO when empty, as Confluent defaults)."""
    schema_type = (schema_type or AVRO).upper()
    if schema_type not in _KINDS:
        raise SchemaError(f"unknown schema type {schema_type}")
    module, name = _KINDS[schema_type]
    kind = getattr(importlib.import_module(module), name)
    return kind.parse(text, references)
