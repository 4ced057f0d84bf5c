"""Iceberg topics on one real broker (iceberg.enabled, a SQLite catalog and a file:// warehouse
under its log dir, commits every 200 ms), the tables read back with pyiceberg: a key_value topic
equals its committed records (keys, headers, several partitions, a transaction aborted and one
committed); a kill -9 mid-translation leaves every offset in the table exactly once; records
deleted from the topic stay in the table; bad configs are INVALID_CONFIG; a table of the
topic's name that Strom did not make is left alone."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from confluent_kafka import KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from strom.testing import (
    BrokerProcess,
    consume_all,
    create_topic,
    free_ports,
    produce_acked,
    report_broker_logs,
    unique_name,
    wait_for,
)

from .iceberg_table import (
    TRANSLATING,
    as_compared,
    broker_catalog,
    duplicates,
    expected_row,
    offsets_map,
    rows,
)

pytest_runtest_makereport = pytest.hookimpl(hookwrapper=True)(report_broker_logs)

OVERRIDES = {**TRANSLATING, "group.initial.rebalance.delay.ms": "0"}
KEY_VALUE = {"iceberg.mode": "key_value"}


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(overrides=OVERRIDES) as proc:
        yield proc


@pytest.fixture(scope="module")
def catalog(broker):
    return broker_catalog(broker.data_dir)


def committed_rows(bootstrap: str, topic: str) -> list[dict]:
    """The topic's committed records (read_committed), each as its key_value row."""
    return [expected_row(m) for m in consume_all(bootstrap, topic, **{"isolation.level": "read_committed"})]


def wait_for_table(catalog, topic: str, expected: list[dict], timeout: float = 30.0) -> list[dict]:
    """The table's rows once it holds every (partition, offset) of `expected` (or the test
    fails, naming what is missing)."""
    wanted = {(r["partition"], r["offset"]) for r in expected}

    def holds() -> list[dict] | None:
        table_rows = rows(catalog, topic)
        return table_rows if wanted <= {(r["partition"], r["offset"]) for r in table_rows} else None

    return wait_for(holds, timeout, interval=0.1, what=f"the table of {topic} holding {len(wanted)} records")


def test_key_value_table_equals_the_committed_records(broker, catalog):
    topic = unique_name("kv")
    create_topic(broker.bootstrap, topic, 3, config=KEY_VALUE)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in range(90):
        producer.produce(topic, value=None if i == 7 else b"value-%d" % i, key=None if i % 10 == 3 else b"key-%d" % i,
                         partition=i % 3, headers=[("h", b"x%d" % i), ("empty", None)] if i % 2 else None)
    assert producer.flush(30) == 0
    txn = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": unique_name("tx")})
    txn.init_transactions(30)
    txn.begin_transaction()
    for i in range(6):
        txn.produce(topic, value=b"aborted-%d" % i, partition=i % 3)
    txn.abort_transaction(30)
    txn.begin_transaction()
    for i in range(6):
        txn.produce(topic, value=b"committed-%d" % i, key=b"t", partition=i % 3)
    txn.commit_transaction(30)
    for i in range(9):  # after both transactions: the last stable offset passes their markers
        producer.produce(topic, value=b"after-%d" % i, partition=i % 3)
    assert producer.flush(30) == 0

    expected = committed_rows(broker.bootstrap, topic)
    assert len(expected) == 90 + 6 + 9
    table_rows = wait_for_table(catalog, topic, expected)
    assert not duplicates(table_rows)
    assert sorted((as_compared(r) for r in table_rows), key=lambda r: (r["partition"], r["offset"])) == \
        sorted(expected, key=lambda r: (r["partition"], r["offset"]))
    assert not [r for r in table_rows if r["value"] and r["value"].startswith(b"aborted")]
    assert {r["partition"] for r in table_rows} == {0, 1, 2}
    # the table says where each partition's translation got to: past its last record
    offsets = offsets_map(catalog, topic)
    for p in range(3):
        assert offsets[str(p)] > max(r["offset"] for r in table_rows if r["partition"] == p)
    table = catalog.load_table(("strom", topic))
    assert [f.name for f in table.spec().fields] == ["timestamp_hour"]
    assert table.properties["strom.mode"] == "key_value"


def test_kill_9_mid_translation_leaves_every_offset_once(broker, catalog):
    topic = unique_name("kv-kill")
    create_topic(broker.bootstrap, topic, 2, config={**KEY_VALUE, "iceberg.partition.spec": "()"})

    def produce(start: int, count: int) -> None:
        producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True,
                             "linger.ms": 2, "batch.num.messages": 50})
        for i in range(start, start + count):
            producer.produce(topic, value=b"r-%06d" % i, key=b"%d" % (i % 17), partition=i % 2)
            if i % 500 == 0:
                producer.poll(0)
        assert producer.flush(30) == 0

    produce(0, 3000)
    # some of it is in the table, not all of it yet (or the kill comes after the translation)
    wait_for(lambda: len(rows(catalog, topic)) > 0, 30, what="a first commit")
    produce(3000, 3000)
    broker.kill()
    broker.restart()
    produce(6000, 1000)
    expected = committed_rows(broker.bootstrap, topic)
    assert len(expected) == 7000
    table_rows = wait_for_table(catalog, topic, expected)
    assert not duplicates(table_rows)
    assert len(table_rows) == 7000
    assert sorted(r["value"] for r in table_rows) == sorted(r["value"] for r in expected)
    assert catalog.load_table(("strom", topic)).spec().is_unpartitioned()


def test_turning_the_mode_on_backfills_and_off_keeps_the_table(broker, catalog):
    topic = unique_name("backfill")
    create_topic(broker.bootstrap, topic, 1)
    produce_acked(broker.bootstrap, topic, [b"old-%d" % i for i in range(30)])
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})

    def set_mode(mode: str) -> None:
        resource = ConfigResource("TOPIC", topic, incremental_configs=[
            ConfigEntry("iceberg.mode", mode, incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([resource])[resource].result(30)

    set_mode("key_value")
    table_rows = wait_for_table(catalog, topic, committed_rows(broker.bootstrap, topic))
    assert sorted(r["offset"] for r in table_rows) == list(range(30))
    set_mode("disabled")
    wait_for(lambda: f"{topic}-0: Iceberg translation stopped" in broker.log_text(), 30, what="translation stopped")
    produce_acked(broker.bootstrap, topic, [b"new"] * 5)
    time.sleep(1.0)  # commits run every 200 ms: a translation still going would show
    assert len(rows(catalog, topic)) == 30


def test_retention_does_not_delete_table_rows(broker, catalog):
    """Records deleted from the topic (DeleteRecords, as retention deletes them) stay in the
    table; translation goes on after the new log start."""
    topic = unique_name("retained")
    create_topic(broker.bootstrap, topic, 1, config={**KEY_VALUE, "retention.ms": "100"})
    produce_acked(broker.bootstrap, topic, [b"old-%d" % i for i in range(20)])
    wait_for_table(catalog, topic, committed_rows(broker.bootstrap, topic))
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    [deleted] = admin.delete_records([TopicPartition(topic, 0, 20)], request_timeout=30).values()
    assert deleted.result(30).low_watermark == 20
    produce_acked(broker.bootstrap, topic, [b"new-%d" % i for i in range(5)])
    table_rows = wait_for(lambda: (found := rows(catalog, topic)) and len(found) >= 25 and found, 30,
                          what="the new records in the table")
    assert sorted(r["offset"] for r in table_rows) == list(range(25))
    assert sorted(r["value"] for r in table_rows if r["offset"] < 20) == sorted(b"old-%d" % i for i in range(20))
    described = subprocess.run([sys.executable, "-m", "strom", "topics", "describe", "--topic", topic,
                                "--bootstrap-server", broker.bootstrap], capture_output=True, text=True, timeout=60)
    assert described.stdout.splitlines()[0].endswith(f"\tIcebergTable: strom.{topic}"), described


def test_a_schema_mode_without_the_schema_registry_is_invalid_config(broker):
    """This broker runs no schema registry: a schema mode is refused when the topic is made."""
    error = _create_error(broker.bootstrap, unique_name("no-registry"), {"iceberg.mode": "value_schema_id_prefix"})
    assert error.args[0].name() == "INVALID_CONFIG" and "schema.registry.listeners" in error.args[0].str()


def _create_error(bootstrap: str, name: str, config: dict[str, str]) -> KafkaException:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    with pytest.raises(KafkaException) as raised:
        admin.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(30)
    return raised.value


@pytest.mark.parametrize("config, why", [
    ({"iceberg.mode": "key_value", "iceberg.partition.spec": "(bucket(4, key))"}, "iceberg.partition.spec"),
    ({"iceberg.mode": "key_value", "iceberg.partition.spec": "(hour(key))"}, "applies to timestamp"),
    ({"iceberg.mode": "key_value", "iceberg.partition.spec": "hour(timestamp)"}, "parenthesized"),
    ({"iceberg.mode": "value_schema_latest", "iceberg.partition.spec": "(value)"}, "no column 'value'"),
    ({"iceberg.mode": "upsert"}, "iceberg.mode"),
    ({"iceberg.mode": "key_value", "iceberg.table.properties": "no-value"}, "key=value"),
])
def test_bad_iceberg_configs_are_invalid_config(broker, config, why):
    error = _create_error(broker.bootstrap, unique_name("bad"), config).args[0]
    assert error.name() == "INVALID_CONFIG" and why in error.str()


def test_bad_iceberg_config_on_alter_is_invalid_config(broker):
    topic = unique_name("alter")
    create_topic(broker.bootstrap, topic, 1)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource("TOPIC", topic, incremental_configs=[
        ConfigEntry("iceberg.mode", "key_value", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("iceberg.partition.spec", "(day(offset))", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException) as raised:
        admin.incremental_alter_configs([resource])[resource].result(30)
    assert raised.value.args[0].name() == "INVALID_CONFIG"


def test_iceberg_mode_without_iceberg_enabled_is_invalid_config():
    with BrokerProcess() as plain:
        error = _create_error(plain.bootstrap, "t", KEY_VALUE).args[0]
        assert error.name() == "INVALID_CONFIG" and "iceberg.enabled" in error.str()
        create_topic(plain.bootstrap, "off", 1, config={"iceberg.mode": "disabled"})  # the default is fine


def test_a_table_not_made_by_strom_is_left_alone(broker, catalog):
    topic = unique_name("clash")
    catalog.create_namespace_if_not_exists("strom")
    theirs = catalog.create_table(("strom", topic), schema=Schema(NestedField(1, "id", LongType(), required=False)))
    create_topic(broker.bootstrap, topic, 1, config=KEY_VALUE)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        producer.produce(topic, value=b"v%d" % i)
    assert producer.flush(30) == 0
    line = f"the Iceberg table strom.{topic} is not translated into: it was not made by Strom"
    wait_for(lambda: line in broker.log_text(), 30, what="the refusal logged")
    time.sleep(1.0)  # commits run every 200 ms: a translation would have shown by now
    table = catalog.load_table(("strom", topic))
    assert table.current_snapshot() is None and table.metadata_location == theirs.metadata_location
    assert broker.log_text().count(line) == 1


def test_a_catalog_that_is_down_stops_translation_not_produce():
    """A REST catalog nobody listens on: produce and consume go on, translation waits, and the
    outage is one log line however many tries it takes."""
    port = free_ports(1)[0]
    with BrokerProcess(overrides={**OVERRIDES, "iceberg.catalog.type": "rest",
                                  "iceberg.catalog.uri": f"http://127.0.0.1:{port}"}) as down:
        topic = unique_name("down")
        create_topic(down.bootstrap, topic, 1, config=KEY_VALUE)
        produce_acked(down.bootstrap, topic, [b"v%d" % i for i in range(20)])
        wait_for(lambda: "Iceberg catalog unavailable" in down.log_text(), 30, what="the outage logged")
        time.sleep(1.0)  # tries go on meanwhile, a second apart at most
        assert produce_acked(down.bootstrap, topic, [b"w"] * 5) == [20, 21, 22, 23, 24]
        assert len(consume_all(down.bootstrap, topic)) == 25
        assert down.log_text().count("Iceberg catalog unavailable") == 1
