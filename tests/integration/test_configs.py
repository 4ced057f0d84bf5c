"""Topic and dynamic broker configs through confluent-kafka's AdminClient (and the raw wire
for what it does not expose): describe with sources and synonyms, alter, incremental alter,
validation, persistence across restarts, and changes that apply without one."""

from __future__ import annotations

import subprocess
import sys

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ResourceType,
)

from strom.testing import create_topic, wait_for

from .conftest import (
    Rec,
    admin,
    ck_produce,
    old_records,
    retention_has_run,
    set_topic_configs,
    watermarks,
    wire_call,
)

pytestmark = pytest.mark.timeout(90)

DESCRIBE_CONFIGS, TOPIC, BROKER = 32, 2, 4


def describe(bootstrap: str, rtype: ResourceType, name: str) -> dict[str, ConfigEntry]:
    resource = ConfigResource(rtype, name)
    client = admin(bootstrap)  # must outlive the future
    return client.describe_configs([resource])[resource].result(timeout=15)


def source(entry: ConfigEntry) -> ConfigSource:
    return ConfigSource(entry.source)


def synonyms(entry: ConfigEntry) -> list[tuple[str, str, ConfigSource]]:
    return [(s.name, s.value, ConfigSource(s.source)) for s in entry.synonyms.values()]


def incremental(bootstrap: str, rtype: ResourceType, name: str, ops: list[ConfigEntry]) -> KafkaError | None:
    resource = ConfigResource(rtype, name, incremental_configs=ops)
    client = admin(bootstrap)
    try:
        client.incremental_alter_configs([resource])[resource].result(timeout=15)
    except KafkaException as e:
        return e.args[0]
    return None


def op(name: str, value: str | None, kind: AlterConfigOpType = AlterConfigOpType.SET) -> ConfigEntry:
    return ConfigEntry(name, value, incremental_operation=kind)


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated")
def test_topic_incremental_alter_and_describe_round_trip(broker, topic):
    bootstrap = broker.bootstrap
    create_topic(bootstrap, topic, config={"retention.ms": "3600000"})
    before = describe(bootstrap, ResourceType.TOPIC, topic)
    assert before["retention.ms"].value == "3600000"
    assert source(before["retention.ms"]) == ConfigSource.DYNAMIC_TOPIC_CONFIG
    # As Kafka: no log.retention.ms anywhere, so log.retention.hours is not listed.
    assert synonyms(before["retention.ms"]) == [
        ("retention.ms", "3600000", ConfigSource.DYNAMIC_TOPIC_CONFIG),
    ]
    assert incremental(bootstrap, ResourceType.TOPIC, topic, [
        op("segment.bytes", "65536"),
        op("cleanup.policy", "compact"),
        op("retention.ms", None, AlterConfigOpType.DELETE),
        op("min.cleanable.dirty.ratio", "0.25"),
    ]) is None
    assert incremental(bootstrap, ResourceType.TOPIC, topic, [
        op("cleanup.policy", "delete", AlterConfigOpType.APPEND)]) is None
    after = describe(bootstrap, ResourceType.TOPIC, topic)
    assert after["retention.ms"].value == "604800000"
    assert source(after["retention.ms"]) == ConfigSource.DEFAULT_CONFIG
    assert after["segment.bytes"].value == "65536"
    assert synonyms(after["segment.bytes"]) == [
        ("segment.bytes", "65536", ConfigSource.DYNAMIC_TOPIC_CONFIG),
        ("log.segment.bytes", "1073741824", ConfigSource.DEFAULT_CONFIG),
    ]
    assert after["cleanup.policy"].value == "compact,delete"
    assert after["min.cleanable.dirty.ratio"].value == "0.25"
    assert all(not e.is_read_only and not e.is_sensitive for e in after.values())
    # The legacy AlterConfigs replaces the whole set of overrides.
    resource = ConfigResource(ResourceType.TOPIC, topic, set_config={"retention.ms": "1000"})
    client = admin(bootstrap)
    client.alter_configs([resource])[resource].result(timeout=15)
    final = describe(bootstrap, ResourceType.TOPIC, topic)
    overridden = {k for k, e in final.items() if source(e) == ConfigSource.DYNAMIC_TOPIC_CONFIG}
    assert overridden == {"retention.ms"}
    assert final["cleanup.policy"].value == "delete"


def test_describe_configs_v4_named_keys_and_documentation(broker, topic):
    create_topic(broker.bootstrap, topic, config={"cleanup.policy": "compact"})
    body = wire_call(broker.bootstrap, DESCRIBE_CONFIGS, 4, {
        "resources": [{"resource_type": TOPIC, "resource_name": topic,
                       "configuration_keys": ["cleanup.policy", "delete.retention.ms"]},
                      {"resource_type": TOPIC, "resource_name": topic + "-missing",
                       "configuration_keys": None},
                      {"resource_type": BROKER, "resource_name": "7", "configuration_keys": None}],
        "include_synonyms": False, "include_documentation": True,
    })
    found, missing, other_broker = body.results
    assert found.error_code == 0
    assert [(c.name, c.value, c.config_type) for c in found.configs] == [
        ("cleanup.policy", "compact", 7), ("delete.retention.ms", "86400000", 5)]  # LIST, LONG
    assert all(c.documentation and not c.synonyms for c in found.configs)
    assert missing.error_code == KafkaError.UNKNOWN_TOPIC_OR_PART and missing.error_message
    assert other_broker.error_code == KafkaError.INVALID_REQUEST


@pytest.mark.parametrize("configs", [
    {"retention.ms": "soon"},
    {"min.cleanable.dirty.ratio": "1.5"},
    {"cleanup.policy": "erase"},
    {"segment.bytes": "1"},
    {"no.such.config": "1"},
    {"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"},
])
def test_bad_values_are_invalid_config_and_change_nothing(broker, topic, configs):
    create_topic(broker.bootstrap, topic, config={"retention.ms": "7200000"})
    err = incremental(broker.bootstrap, ResourceType.TOPIC, topic, [op(k, v) for k, v in configs.items()])
    assert err is not None and err.code() == KafkaError.INVALID_CONFIG, err
    assert any(k in err.str() for k in configs), err.str()  # the message names the key
    now = describe(broker.bootstrap, ResourceType.TOPIC, topic)
    assert {k for k, e in now.items() if source(e) == ConfigSource.DYNAMIC_TOPIC_CONFIG} == {"retention.ms"}


def test_other_refusals(broker, topic):
    create_topic(broker.bootstrap, topic)
    missing = incremental(broker.bootstrap, ResourceType.TOPIC, topic + "-nope", [op("retention.ms", "1")])
    assert missing.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    append = incremental(broker.bootstrap, ResourceType.TOPIC, topic,
                         [op("retention.ms", "5", AlterConfigOpType.APPEND)])
    assert append.code() == KafkaError.INVALID_CONFIG
    read_only = incremental(broker.bootstrap, ResourceType.BROKER, "0", [op("num.partitions", "4")])
    assert read_only.code() == KafkaError.INVALID_REQUEST and "dynamically" in read_only.str()


def test_retention_change_takes_effect_without_restart(retention_broker, topic):
    bootstrap = retention_broker.bootstrap
    create_topic(bootstrap, topic, config={"segment.bytes": "2048"})
    ck_produce(bootstrap, topic, old_records(100)
               + [Rec(b"new", partition=0)], **{"linger.ms": 0, "batch.num.messages": 5})
    retention_has_run(bootstrap)
    assert watermarks(bootstrap, topic, 0)[0] == 0  # a week of retention keeps 2-hour-old records
    set_topic_configs(bootstrap, topic, {"retention.ms": "60000"})
    low = wait_for(lambda: watermarks(bootstrap, topic, 0)[0], timeout=60, what="retention to apply")
    assert 0 < low <= 100


def test_size_limit_and_min_insync_apply_at_once(broker, topic):
    bootstrap = broker.bootstrap
    create_topic(bootstrap, topic)
    big = Rec(b"x" * 20_000, partition=0)
    ck_produce(bootstrap, topic, [big])
    set_topic_configs(bootstrap, topic, {"max.message.bytes": "10000"})
    assert produce_error(bootstrap, topic, big.value, acks="1") == KafkaError.MSG_SIZE_TOO_LARGE
    set_topic_configs(bootstrap, topic, {"max.message.bytes": None, "min.insync.replicas": "2"})
    assert produce_error(bootstrap, topic, b"small", acks="all") == KafkaError.NOT_ENOUGH_REPLICAS
    assert produce_error(bootstrap, topic, b"small", acks="1") is None  # only acks=all needs the ISR


def produce_error(bootstrap: str, topic: str, value: bytes, acks: str) -> int | None:
    errors = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "message.timeout.ms": 3000,
                         "retries": 0, "message.max.bytes": 100_000})
    producer.produce(topic, value, partition=0, on_delivery=lambda err, _m: errors.append(err))
    producer.flush(10)
    assert len(errors) == 1
    return None if errors[0] is None else errors[0].code()


def test_dynamic_broker_configs_apply_live_and_survive_restart(retention_broker, topic):
    proc = retention_broker
    bootstrap = proc.bootstrap
    create_topic(bootstrap, topic, config={"segment.bytes": "2048"})
    ck_produce(bootstrap, topic, old_records(60)
               + [Rec(b"new", partition=0)], **{"linger.ms": 0, "batch.num.messages": 5})
    # This broker's log.retention.ms is the default of every topic without an override.
    assert incremental(bootstrap, ResourceType.BROKER, "0", [op("log.retention.ms", "60000")]) is None
    wait_for(lambda: watermarks(bootstrap, topic, 0)[0] > 0, timeout=60, what="broker retention to apply")
    entry = describe(bootstrap, ResourceType.TOPIC, topic)["retention.ms"]
    assert (entry.value, source(entry)) == ("60000", ConfigSource.DYNAMIC_BROKER_CONFIG)
    assert synonyms(entry) == [("log.retention.ms", "60000", ConfigSource.DYNAMIC_BROKER_CONFIG),
                               ("log.retention.hours", "168", ConfigSource.DEFAULT_CONFIG)]
    # Cluster-wide defaults (resource name "", which confluent-kafka cannot name: the CLI)
    # rank below per-broker values.
    assert strom_configs(bootstrap, "alter", "--broker-defaults",
                         "--add-config", "log.retention.ms=120000,message.max.bytes=500000").returncode == 0
    defaults = strom_configs(bootstrap, "describe", "--broker-defaults").stdout.splitlines()
    assert defaults[0] == "Dynamic configs for the default broker are:"
    assert sorted(defaults[1:]) == [
        "  log.retention.ms=120000 sensitive=false synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:log.retention.ms=120000}",
        "  message.max.bytes=500000 sensitive=false synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:message.max.bytes=500000}",
    ]
    broker0 = describe(bootstrap, ResourceType.BROKER, "0")
    assert (broker0["log.retention.ms"].value, source(broker0["log.retention.ms"])) == \
        ("60000", ConfigSource.DYNAMIC_BROKER_CONFIG)
    assert (broker0["message.max.bytes"].value, source(broker0["message.max.bytes"])) == \
        ("500000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)
    assert source(broker0["log.retention.bytes"]) == ConfigSource.STATIC_BROKER_CONFIG
    assert broker0["num.partitions"].is_read_only and not broker0["log.retention.ms"].is_read_only
    bad = incremental(bootstrap, ResourceType.BROKER, "0", [op("log.cleaner.min.cleanable.ratio", "2")])
    assert bad.code() == KafkaError.INVALID_CONFIG
    # Everything above is in the metadata store: a restart keeps it.
    assert proc.stop() == 0
    proc.start()
    again = describe(bootstrap, ResourceType.TOPIC, topic)
    assert (again["retention.ms"].value, source(again["retention.ms"])) == ("60000", ConfigSource.DYNAMIC_BROKER_CONFIG)
    assert again["max.message.bytes"].value == "500000"
    assert again["segment.bytes"].value == "2048"
    assert "  message.max.bytes=500000" in strom_configs(bootstrap, "describe", "--broker-defaults").stdout


def strom_configs(bootstrap: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strom", "configs", args[0], "--bootstrap-server",
                           bootstrap, *args[1:]], capture_output=True, text=True, timeout=30)


def test_cli_describe_and_alter(broker, topic):
    bootstrap = broker.bootstrap
    create_topic(bootstrap, topic, config={"retention.ms": "7200000"})
    done = strom_configs(bootstrap, "alter", "--topic", topic, "--add-config",
                         "cleanup.policy=[compact,delete],delete.retention.ms=1000",
                         "--delete-config", "retention.ms")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"Completed updating config for topic {topic}."
    entries = describe(bootstrap, ResourceType.TOPIC, topic)
    assert entries["cleanup.policy"].value == "compact,delete"
    assert source(entries["retention.ms"]) == ConfigSource.DEFAULT_CONFIG
    shown = strom_configs(bootstrap, "describe", "--topic", topic)
    assert shown.returncode == 0
    assert shown.stdout.splitlines() == [
        f"Dynamic configs for topic {topic} are:",
        "  cleanup.policy=compact,delete sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:cleanup.policy="
        "compact,delete, DEFAULT_CONFIG:log.cleanup.policy=delete}",
        "  delete.retention.ms=1000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:delete.retention.ms=1000, "
        "DEFAULT_CONFIG:log.cleaner.delete.retention.ms=86400000}",
    ]
    everything = strom_configs(bootstrap, "describe", "--topic", topic, "--all").stdout.splitlines()
    assert len(everything) == 1 + len(entries)
    bad = strom_configs(bootstrap, "alter", "--topic", topic, "--add-config", "segment.bytes=1")
    assert bad.returncode == 1 and "segment.bytes" in bad.stderr
    assert strom_configs(bootstrap, "describe", "--topic", topic + "-nope").returncode == 1
