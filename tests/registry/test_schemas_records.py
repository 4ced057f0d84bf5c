"""The `_schemas` records as a Confluent registry writes them (hand-made here, byte for byte in
its JSON), read by Strom's store; what Strom writes read back; unreadable records skipped."""

from __future__ import annotations

import json

import pytest

from strom.registry import records as rec
from strom.registry.store import SchemaStore, StoredSchema
from strom.schemas.parsed import Reference

AVRO_A = '{"type":"record","name":"A","fields":[{"name":"x","type":"int"}]}'
PROTO = 'syntax = "proto3";\nmessage M {\n  int32 x = 1;\n}\n'


def key(**fields) -> bytes:
    return json.dumps(fields).encode()


def confluent_topic() -> list[tuple[bytes, bytes | None]]:
    """What a Confluent registry leaves in its topic for: a global config, two versions of an Avro
    subject, a Protobuf subject referring to nothing, a JSON subject referencing the Avro one's
    version 1 (a reference, as Confluent writes it), a soft-deleted subject, a subject config,
    a mode, its own NOOPs, and a hard-deleted version (its tombstone)."""
    avro_b = '{"type":"record","name":"A","fields":[{"name":"x","type":"int"},{"name":"y","type":"string","default":""}]}'
    return [
        (key(keytype="NOOP", magic=0), None),
        (key(keytype="CONFIG", subject=None, magic=0), b'{"compatibilityLevel":"FULL"}'),
        (key(keytype="SCHEMA", subject="orders-value", version=1, magic=1),
         json.dumps({"subject": "orders-value", "version": 1, "id": 1, "schema": AVRO_A, "deleted": False}).encode()),
        (key(keytype="SCHEMA", subject="orders-value", version=2, magic=1),
         json.dumps({"subject": "orders-value", "version": 2, "id": 2, "schema": avro_b, "deleted": False}).encode()),
        (key(keytype="SCHEMA", subject="proto-value", version=1, magic=1),
         json.dumps({"subject": "proto-value", "version": 1, "id": 3, "schemaType": "PROTOBUF", "schema": PROTO,
                     "deleted": False}).encode()),
        (key(keytype="SCHEMA", subject="json-value", version=1, magic=1),
         json.dumps({"subject": "json-value", "version": 1, "id": 4, "schemaType": "JSON",
                     "references": [{"name": "a.avsc", "subject": "orders-value", "version": 1}],
                     "schema": '{"type":"object"}', "deleted": False}).encode()),
        # the same schema under a second subject: the same id
        (key(keytype="SCHEMA", subject="copy-value", version=1, magic=1),
         json.dumps({"subject": "copy-value", "version": 1, "id": 1, "schema": AVRO_A, "deleted": False}).encode()),
        (key(keytype="DELETE_SUBJECT", subject="copy-value", magic=0), b'{"subject":"copy-value","version":1}'),
        (key(keytype="CONFIG", subject="orders-value", magic=0), b'{"compatibilityLevel":"NONE"}'),
        (key(keytype="MODE", subject=None, magic=0), b'{"mode":"READWRITE"}'),
        (key(keytype="MODE", subject="proto-value", magic=0), b'{"mode":"READONLY"}'),
        # version 3 registered, soft-deleted, then hard-deleted (tombstone)
        (key(keytype="SCHEMA", subject="orders-value", version=3, magic=1),
         json.dumps({"subject": "orders-value", "version": 3, "id": 5, "schema": '"string"', "deleted": False}).encode()),
        (key(keytype="SCHEMA", subject="orders-value", version=3, magic=1),
         json.dumps({"subject": "orders-value", "version": 3, "id": 5, "schema": '"string"', "deleted": True}).encode()),
        (key(keytype="SCHEMA", subject="orders-value", version=3, magic=1), None),
        (key(keytype="NOOP", magic=0), None),
    ]


def load(records) -> SchemaStore:
    store = SchemaStore()
    for offset, (k, v) in enumerate(records):
        store.apply_bytes(offset, k, v)
    return store


def test_a_confluent_topic_is_read():
    store = load(confluent_topic())
    assert store.next_offset == len(confluent_topic())
    assert store.subject_names() == ["json-value", "orders-value", "proto-value"]
    assert store.subject_names(deleted=True) == ["copy-value", "json-value", "orders-value", "proto-value"]
    assert [v.version for v in store.versions("orders-value")] == [1, 2]
    assert store.schema_by_id(1) == StoredSchema("AVRO", AVRO_A)
    assert store.schema_by_id(3).schema_type == "PROTOBUF"
    assert store.schema_by_id(4).references == (Reference("a.avsc", "orders-value", 1),)
    assert store.schema_by_id(5) is None  # hard deleted: no version has it
    assert store.max_id == 5  # ... but its id is still taken
    assert store.is_registered("orders-value", 1) and store.is_registered("orders-value", 2)
    assert not store.is_registered("copy-value", 1)  # soft deleted there
    assert not store.is_registered("orders-value", 3)
    assert [(v.subject, v.version, v.deleted) for v in store.versions_of_id(1, deleted=True)] == [
        ("copy-value", 1, True), ("orders-value", 1, False)]
    assert store.referenced_by("orders-value", 1) == [4]
    assert store.configs == {None: "FULL", "orders-value": "NONE"}
    assert store.modes == {None: "READWRITE", "proto-value": "READONLY"}


def test_a_duplicate_id_with_another_schema_is_skipped_as_confluent_does():
    records = confluent_topic() + [
        (key(keytype="SCHEMA", subject="other", version=1, magic=1),
         json.dumps({"subject": "other", "version": 1, "id": 1, "schema": '"int"'}).encode())]
    store = load(records)
    assert store.schema_by_id(1).schema == AVRO_A
    assert store.versions("other") == []


def test_unreadable_records_are_skipped_and_reading_goes_on():
    records = [(b"not json", b"{}"), (None, b"{}"), (b"[" * 100_000 + b"]" * 100_000, b"{}"), (key(keytype="SCHEMA", subject="s", version="x", magic=1), b"{}"),
               (key(keytype="WHAT", magic=0), b"{}"),
               (key(keytype="SCHEMA", subject="s", version=1, magic=1), b"[1,2]"),
               (key(keytype="SCHEMA", subject="s", version=1, magic=1),
                json.dumps({"subject": "s", "version": 1, "id": 7, "schema": '"int"'}).encode())]
    store = load(records)
    assert store.next_offset == 7
    assert store.schema_by_id(7) == StoredSchema("AVRO", '"int"')


@pytest.mark.parametrize("record", [
    rec.SchemaRecord("s", 3, 9, "JSON", '{"type":"object"}', (Reference("r", "t", 2),), deleted=True),
    rec.SchemaRecord("s", 1, 1, "AVRO", '"int"'),
    rec.SchemaTombstone("s", 2),
    rec.ConfigRecord(None, "FULL_TRANSITIVE"), rec.ConfigRecord("s", None),
    rec.ModeRecord("s", "IMPORT"), rec.ModeRecord(None, None),
    rec.DeleteSubject("s", 4), rec.ClearSubject("s"), rec.MaxId(12), rec.Noop(),
])
def test_what_strom_writes_reads_back(record):
    k, v = rec.encode(record)
    assert rec.decode(k, v) == record
    assert json.loads(k)["keytype"] in ("SCHEMA", "CONFIG", "MODE", "DELETE_SUBJECT", "CLEAR_SUBJECT", "NOOP")


def test_written_records_are_confluents_format():
    k, v = rec.encode(rec.SchemaRecord("orders-value", 2, 5, "PROTOBUF", PROTO, (Reference("x.proto", "x", 1),)))
    assert json.loads(k) == {"keytype": "SCHEMA", "subject": "orders-value", "version": 2, "magic": 1}
    assert json.loads(v) == {"subject": "orders-value", "version": 2, "id": 5, "schemaType": "PROTOBUF",
                             "references": [{"name": "x.proto", "subject": "x", "version": 1}], "schema": PROTO,
                             "deleted": False}
    k, v = rec.encode(rec.ConfigRecord(None, "BACKWARD"))
    assert json.loads(k) == {"keytype": "CONFIG", "subject": None, "magic": 0}
    assert json.loads(v) == {"compatibilityLevel": "BACKWARD"}
    k, v = rec.encode(rec.DeleteSubject("s", 3))
    assert (json.loads(k), json.loads(v)) == ({"keytype": "DELETE_SUBJECT", "subject": "s", "magic": 0},
                                              {"subject": "s", "version": 3})


def test_ids_survive_compaction_through_the_max_id_record():
    """A hard delete writes the highest id given before its tombstones; compaction may drop the
    deleted schema's records, and the next id still comes after it."""
    written = [rec.SchemaRecord("s", 1, 1, "AVRO", '"int"'), rec.SchemaRecord("s", 2, 2, "AVRO", '"long"'),
               rec.SchemaRecord("s", 2, 2, "AVRO", '"long"', deleted=True), rec.MaxId(2), rec.SchemaTombstone("s", 2)]
    # what compaction keeps: the last record of each key, tombstones gone after delete.retention.ms
    last: dict[bytes, bytes | None] = {}
    for record in written:
        k, v = rec.encode(record)
        last.pop(k, None)
        last[k] = v
    compacted = [(k, v) for k, v in last.items() if v is not None]
    store = load(compacted)
    assert store.schema_by_id(2) is None
    assert store.max_id == 2
