"""Iceberg topics' schema modes on one real broker running the schema registry (and tiered
storage on a directory store), values written with confluent-kafka's AvroSerializer, the tables
read back with pyiceberg: Avro values become columns; a field added mid-stream adds a column,
older rows null there; records that cannot be decoded (not framed, an unknown id, a payload that
does not match, a recursive schema, a type change, a Protobuf value) land in `<topic>~dlq` and
translation goes on;
value_schema_latest reads older writers with the latest schema; a kill -9 with dead letters in
flight leaves each offset once across both tables; a tiered topic is backfilled from remote
storage."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import fastavro
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from strom.testing import (
    BrokerProcess,
    create_topic,
    free_ports,
    list_offset,
    metric_value,
    produce_acked,
    report_broker_logs,
    scrape,
    tiered_overrides,
    unique_name,
    wait_for,
)

from .iceberg_table import TRANSLATING, broker_catalog, rows

pytest_runtest_makereport = pytest.hookimpl(hookwrapper=True)(report_broker_logs)

OVERRIDES = TRANSLATING
ID_PREFIX = {"iceberg.mode": "value_schema_id_prefix"}

V1 = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "item", "type": "string"},
    {"name": "tags", "type": {"type": "array", "items": "string"}}]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "price", "type": ["null", "double"], "default": None}]}
RECURSIVE = {"type": "record", "name": "Node", "fields": [
    {"name": "label", "type": "string"}, {"name": "next", "type": ["null", "Node"], "default": None}]}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    url = f"http://127.0.0.1:{free_ports(1)[0]}"
    store = {"rsm.config.storage.root": str(tmp_path_factory.mktemp("remote"))}
    with BrokerProcess(overrides=tiered_overrides(store, **OVERRIDES, **{"schema.registry.listeners": url,
                                                                         "metrics.port": "0"})) as proc:
        proc.registry_url = url
        yield proc


@pytest.fixture(scope="module")
def catalog(broker):
    return broker_catalog(broker.data_dir)


@pytest.fixture(scope="module")
def registry(broker):
    return SchemaRegistryClient({"url": broker.registry_url})


def serializer(registry, schema: dict, auto_register: bool = True) -> AvroSerializer:
    return AvroSerializer(registry, json.dumps(schema), conf={"auto.register.schemas": auto_register,
                                                             "use.latest.version": not auto_register})


def produce(broker, topic: str, values: list[bytes | None], partition: int = 0) -> list[int]:
    return produce_acked(broker.bootstrap, topic, values, partition=partition)


def encode(ser: AvroSerializer, topic: str, value: dict) -> bytes:
    return ser(value, SerializationContext(topic, MessageField.VALUE))


def by_offset(table_rows: list[dict]) -> dict[int, dict]:
    return {r["strom"]["offset"]: r for r in table_rows}


def wait_rows(catalog, name: str, count: int, timeout: float = 30.0) -> list[dict]:
    return wait_for(lambda: (found := rows(catalog, name)) and len(found) >= count and found, timeout,
                    interval=0.1, what=f"{count} rows in {name}")


def test_avro_values_become_columns_and_a_new_field_adds_one(broker, catalog, registry):
    topic = unique_name("orders")
    create_topic(broker.bootstrap, topic, 1, config=ID_PREFIX)
    v1 = serializer(registry, V1)
    produce(broker, topic, [encode(v1, topic, {"id": i, "item": f"item-{i}", "tags": ["a"] * (i % 3)})
                            for i in range(10)] + [None])
    wait_rows(catalog, topic, 11)
    v2 = serializer(registry, V2)
    unknown_id = b"\x00" + (987654).to_bytes(4, "big") + b"\x02"
    bad_payload = encode(v1, topic, {"id": 1, "item": "x", "tags": []})[:5] + b"\xff\xff\xff"
    offsets = produce(broker, topic, [encode(v2, topic, {"id": 100 + i, "item": "new", "tags": [], "price": 1.5 * i})
                                      for i in range(5)] + [b"plain text", unknown_id, bad_payload, b"\x00\x01"])
    produce(broker, topic, [encode(v1, topic, {"id": 200, "item": "after", "tags": ["z"]})])

    table_rows = by_offset(wait_rows(catalog, topic, 17))
    dead = by_offset(wait_rows(catalog, f"{topic}~dlq", 4))
    assert sorted(table_rows) == [*range(11), *offsets[:5], offsets[-1] + 1]
    assert sorted(dead) == offsets[5:]
    table = catalog.load_table(("strom", topic))
    assert [f.name for f in table.schema().fields] == ["strom", "id", "item", "tags", "price"]
    assert all(not f.required for f in table.schema().fields[1:])
    assert table_rows[4]["id"] == 4 and table_rows[4]["item"] == "item-4" and table_rows[4]["tags"] == ["a"]
    assert table_rows[4]["price"] is None  # written before the field was added
    assert table_rows[offsets[2]]["price"] == 3.0
    assert table_rows[10]["id"] is None and table_rows[10]["strom"]["key"] is None  # a null value: its metadata
    assert table_rows[offsets[-1] + 1]["item"] == "after"
    meta = table_rows[3]["strom"]
    assert (meta["partition"], meta["offset"], meta["timestamp_type"], meta["headers"]) == (0, 3, 0, [])
    assert [f.name for f in table.spec().fields] == ["timestamp_hour"]
    assert table.schema().find_field(table.spec().fields[0].source_id).name == "timestamp"  # strom.timestamp
    reasons = {o: dead[o]["reason"] for o in dead}
    assert "not framed" in reasons[offsets[5]] and "not framed" in reasons[offsets[8]]
    assert "987654" in reasons[offsets[6]] and "not registered" in reasons[offsets[6]]
    assert "does not match" in reasons[offsets[7]]
    assert dead[offsets[5]]["value"] == b"plain text" and dead[offsets[7]]["value"] == bad_payload


def test_a_schema_with_no_iceberg_type_a_type_change_and_protobuf_are_dead_letters(broker, catalog, registry):
    topic = unique_name("recursive")
    create_topic(broker.bootstrap, topic, 1, config=ID_PREFIX)
    nodes = AvroSerializer(registry, json.dumps(RECURSIVE),
                           conf={"subject.name.strategy": lambda ctx, name: "nodes-value"})
    as_string = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "string"}]}
    changed = AvroSerializer(registry, json.dumps(as_string), conf={"subject.name.strategy": lambda ctx, name: "other"})
    proto = registry.register_schema(unique_name("proto"), Schema(
        'syntax = "proto3"; message M { int32 a = 1; }', "PROTOBUF"))
    v1 = serializer(registry, V1)
    offsets = produce(broker, topic, [
        encode(v1, topic, {"id": 1, "item": "a", "tags": []}),
        encode(nodes, topic, {"label": "a", "next": {"label": "b", "next": None}}),
        encode(changed, topic, {"id": "one"}),  # id was a long
        b"\x00" + proto.to_bytes(4, "big") + b"\x00\x08\x01",
        encode(v1, topic, {"id": 2, "item": "b", "tags": []})])
    dead = by_offset(wait_rows(catalog, f"{topic}~dlq", 3))
    table_rows = by_offset(wait_rows(catalog, topic, 2))
    assert sorted(table_rows) == [offsets[0], offsets[4]] and sorted(dead) == offsets[1:4]
    assert "recursive" in dead[offsets[1]]["reason"]
    assert "cannot take" in dead[offsets[2]]["reason"] and "id" in dead[offsets[2]]["reason"]
    assert dead[offsets[3]]["reason"] == "PROTOBUF values are not supported yet"


def test_value_schema_latest_reads_older_writers_with_the_latest_schema(broker, catalog, registry):
    topic = unique_name("latest")
    create_topic(broker.bootstrap, topic, 1)
    v1 = serializer(registry, V1)
    produce(broker, topic, [encode(v1, topic, {"id": i, "item": "old", "tags": []}) for i in range(3)])
    v2 = {**V2, "fields": [*V1["fields"], {"name": "price", "type": "double", "default": 9.5}]}
    registry.register_schema(f"{topic}-value", Schema(json.dumps(v2), "AVRO"))
    bare = io.BytesIO()
    fastavro.schemaless_writer(bare, fastavro.parse_schema(v2), {"id": 7, "item": "bare", "tags": ["t"], "price": 1.0})
    produce(broker, topic, [encode(serializer(registry, v2, auto_register=False), topic,
                                   {"id": 5, "item": "new", "tags": [], "price": 2.0}), bare.getvalue()])
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource("TOPIC", topic, incremental_configs=[
        ConfigEntry("iceberg.mode", "value_schema_latest", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(30)
    table_rows = by_offset(wait_rows(catalog, topic, 5))
    assert [(table_rows[o]["id"], table_rows[o]["item"], table_rows[o]["price"]) for o in range(5)] == [
        (0, "old", 9.5), (1, "old", 9.5), (2, "old", 9.5), (5, "new", 2.0), (7, "bare", 1.0)]


def test_kill_9_with_dead_letters_leaves_each_offset_once(broker, catalog, registry):
    topic = unique_name("kill")
    create_topic(broker.bootstrap, topic, 2, config={**ID_PREFIX, "iceberg.partition.spec": "(partition)"})
    v1 = serializer(registry, V1)
    good = encode(v1, topic, {"id": 1, "item": "x" * 50, "tags": ["a", "b"]})

    def send(start: int, count: int) -> None:
        producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 2})
        for i in range(start, start + count):
            producer.produce(topic, value=b"bad-%d" % i if i % 7 == 0 else good, partition=i % 2)
            if i % 500 == 0:
                producer.poll(0)
        assert producer.flush(30) == 0

    send(0, 2000)
    wait_for(lambda: rows(catalog, f"{topic}~dlq"), 30, what="a first dead-letter commit")
    send(2000, 2000)
    broker.kill()
    broker.restart()
    send(4000, 1000)

    def complete() -> tuple[list, list] | None:
        main, dead = rows(catalog, topic), rows(catalog, f"{topic}~dlq")
        return (main, dead) if len(main) + len(dead) >= 5000 else None

    main, dead = wait_for(complete, 60, interval=0.2, what="5000 offsets in the two tables")
    keys = [(r["strom"]["partition"], r["strom"]["offset"]) for r in main + dead]
    assert len(keys) == len(set(keys)) == 5000
    assert len(dead) == len(range(0, 5000, 7))
    assert all(r["value"].startswith(b"bad-") for r in dead) and all(r["item"] == "x" * 50 for r in main)


def test_turning_a_schema_mode_on_backfills_from_tiered_storage(broker, catalog, registry):
    topic = unique_name("tiered")
    create_topic(broker.bootstrap, topic, 1, config={"remote.storage.enable": "true", "segment.bytes": "4096",
                                                     "local.retention.bytes": "1"})
    v1 = serializer(registry, V1)
    values = [encode(v1, topic, {"id": i, "item": "p" * 900, "tags": []}) for i in range(30)]
    produce_acked(broker.bootstrap, topic, values, batch_each=True)
    wait_for(lambda: list_offset(broker.bootstrap, topic, -4) > 0, 30, what="the oldest segments only remote")
    assert list_offset(broker.bootstrap, topic, -2) == 0
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource("TOPIC", topic, incremental_configs=[
        ConfigEntry("iceberg.mode", "value_schema_id_prefix", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(30)
    table_rows = by_offset(wait_rows(catalog, topic, 30))
    assert sorted(table_rows) == list(range(30)) and table_rows[0]["id"] == 0


def test_lag_metrics_and_describe(broker, catalog, registry):
    topic = unique_name("described")
    create_topic(broker.bootstrap, topic, 2, config=ID_PREFIX)
    v1 = serializer(registry, V1)
    produce(broker, topic, [encode(v1, topic, {"id": i, "item": "m", "tags": []}) for i in range(8)] + [b"junk"])
    wait_rows(catalog, topic, 8)
    wait_rows(catalog, f"{topic}~dlq", 1)

    def caught_up() -> dict | None:
        samples = scrape(broker.metrics_url)
        labels = [frozenset({"topic": topic, "partition": str(p)}.items()) for p in range(2)]
        lags = [(samples.get(("strom_iceberg_translation_lag_offsets", key)),
                 samples.get(("strom_iceberg_translation_lag_seconds", key))) for key in labels]
        return samples if lags == [(0, 0), (0, 0)] else None

    samples = wait_for(caught_up, 30, what="no translation lag")
    assert metric_value(samples, "strom_iceberg_dead_letter_records_total", topic=topic) == 1
    described = subprocess.run([sys.executable, "-m", "strom", "topics", "describe", "--topic", topic,
                                "--bootstrap-server", broker.bootstrap], capture_output=True, text=True, timeout=60)
    summary = described.stdout.splitlines()[0]
    assert f"\tIcebergTable: strom.{topic}\tDeadLetterTable: strom.{topic}~dlq" in summary, described
    plain = unique_name("plain")
    create_topic(broker.bootstrap, plain, 1)
    described = subprocess.run([sys.executable, "-m", "strom", "topics", "describe", "--topic", plain,
                                "--bootstrap-server", broker.bootstrap], capture_output=True, text=True, timeout=60)
    assert described.returncode == 0 and "IcebergTable" not in described.stdout
