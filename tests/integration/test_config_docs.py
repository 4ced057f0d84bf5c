"""DescribeConfigs v3+ with include_documentation: every topic and broker config carries a
description, as a Kafka broker's do; without it (or before v3) documentation is null.

confluent-kafka's ConfigEntry has no documentation, and kafka-python never asks for it, so the
requests that ask are made on the wire; kafka-python's admin client checks what a client that
does not ask gets."""

from __future__ import annotations

import pytest
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

from strom.config import docs as config_docs
from strom.config.broker import DEFINITIONS
from strom.log.config import EXTENSION_TOPIC_CONFIGS, TOPIC_CONFIG_KEYS
from strom.testing import create_topic

from .conftest import wire_call

pytestmark = pytest.mark.timeout(90)

# What a topic that sets none of the keys beyond Kafka's describes.
KAFKA_TOPIC_KEYS = set(TOPIC_CONFIG_KEYS) - EXTENSION_TOPIC_CONFIGS

DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS, TOPIC, BROKER = 32, 44, 2, 4
BROKER_ID = "0"  # BrokerProcess leaves broker.id at its default


def describe(bootstrap: str, version: int, resources: list[tuple[int, str, list[str] | None]], *,
             docs: bool, synonyms: bool = False) -> list:
    body = wire_call(bootstrap, DESCRIBE_CONFIGS, version, {
        "resources": [{"resource_type": t, "resource_name": n, "configuration_keys": keys}
                      for t, n, keys in resources],
        "include_synonyms": synonyms, "include_documentation": docs})
    assert [r.error_code for r in body.results] == [0] * len(resources), body.results
    return body.results


@pytest.mark.parametrize("version", [3, 4])
def test_every_topic_and_broker_config_is_documented_when_asked(broker, topic, version):
    # The keys beyond Kafka's are described where a topic sets them: this one sets them all.
    extensions = {"confluent.key.schema.validation": "false", "confluent.value.schema.validation": "false",
                  "confluent.key.subject.name.strategy": "TopicNameStrategy",
                  "confluent.value.subject.name.strategy": "TopicNameStrategy",
                  # set, not on: this broker does not translate (iceberg.enabled)
                  "iceberg.mode": "disabled", "iceberg.partition.spec": "(hour(timestamp))",
                  "iceberg.table.properties": "owner=strom",
                  "errors.deadletterqueue.group.enable": "true"}  # share groups' dead letters
    assert set(extensions) == EXTENSION_TOPIC_CONFIGS
    create_topic(broker.bootstrap, topic, config={"retention.ms": "3600000", "cleanup.policy": "compact",
                                                  **extensions})
    topic_result, broker_result = describe(broker.bootstrap, version, [
        (TOPIC, topic, None), (BROKER, BROKER_ID, None)], docs=True, synonyms=True)
    topic_docs = {c.name: c.documentation for c in topic_result.configs}
    broker_docs = {c.name: c.documentation for c in broker_result.configs}
    assert set(topic_docs) == set(TOPIC_CONFIG_KEYS) and set(broker_docs) == set(DEFINITIONS)
    for name, text in [*topic_docs.items(), *broker_docs.items()]:
        assert isinstance(text, str) and text.strip(), name
    # An overridden config is documented like any other; a name that is both a topic and a
    # broker config is described for what it is in each resource.
    assert topic_docs["retention.ms"] == config_docs.doc("retention.ms")
    assert topic_docs["min.insync.replicas"] == config_docs.doc("min.insync.replicas")
    assert broker_docs["min.insync.replicas"] == config_docs.doc("min.insync.replicas", broker=True)
    assert topic_docs["min.insync.replicas"] != broker_docs["min.insync.replicas"]
    assert "Accepted for compatibility" in topic_docs["preallocate"]
    assert "Accepted for compatibility" in broker_docs["num.io.threads"]
    # Sensitive configs are documented, their values still hidden.
    password = next(c for c in broker_result.configs if c.name == "ssl.keystore.password")
    assert password.is_sensitive and password.value is None and password.documentation


def test_named_keys_are_documented(broker, topic):
    create_topic(broker.bootstrap, topic)
    topic_result, broker_result = describe(broker.bootstrap, 4, [
        (TOPIC, topic, ["segment.bytes", "compression.type"]),
        (BROKER, BROKER_ID, ["log.retention.hours", "socket.request.max.bytes"])], docs=True)
    assert {c.name: c.documentation for c in topic_result.configs} == {
        "segment.bytes": config_docs.doc("segment.bytes"),
        "compression.type": config_docs.doc("compression.type")}
    assert {c.name: c.documentation for c in broker_result.configs} == {
        "log.retention.hours": config_docs.doc("log.retention.hours", broker=True),
        "socket.request.max.bytes": config_docs.doc("socket.request.max.bytes", broker=True)}


@pytest.mark.parametrize("version", [3, 4])
def test_documentation_is_null_unless_asked(broker, topic, version):
    create_topic(broker.bootstrap, topic, config={"segment.bytes": "1048576"})
    results = describe(broker.bootstrap, version, [(TOPIC, topic, None), (BROKER, BROKER_ID, None)],
                       docs=False)
    entries = [c for r in results for c in r.configs]
    assert len(entries) == len(KAFKA_TOPIC_KEYS) + len(DEFINITIONS)
    assert all(c.documentation is None for c in entries)


def test_a_client_that_does_not_ask_gets_no_documentation(broker, topic):
    create_topic(broker.bootstrap, topic, config={"retention.ms": "60000"})
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    try:
        described = client.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic), ConfigResource(ConfigResourceType.BROKER,
                                                                              BROKER_ID)],
            config_filter="all")
    finally:
        client.close()
    topic_configs, broker_configs = described["topic"][topic], described["broker"][BROKER_ID]
    assert topic_configs["retention.ms"]["value"] == "60000"
    assert set(topic_configs) == KAFKA_TOPIC_KEYS and len(broker_configs) == len(DEFINITIONS)
    # It speaks v3+ (config types are there) and leaves include_documentation unset.
    for config in [*topic_configs.values(), *broker_configs.values()]:
        assert config["config_type"] and "documentation" in config and config["documentation"] is None


def test_cluster_default_configs_are_documented(fresh_broker):
    """The dynamic cluster default (resource name "") documents its entries too."""
    body = wire_call(fresh_broker.bootstrap, INCREMENTAL_ALTER_CONFIGS, 1, {
        "resources": [{"resource_type": BROKER, "resource_name": "", "configs": [
            {"name": "log.retention.ms", "config_operation": 0, "value": "7200000"},
            {"name": "log.cleaner.threads", "config_operation": 0, "value": "2"}]}],
        "validate_only": False})
    assert [r.error_code for r in body.responses] == [0]
    [asked] = describe(fresh_broker.bootstrap, 4, [(BROKER, "", None)], docs=True, synonyms=True)
    assert {c.name: c.documentation for c in asked.configs} == {
        "log.retention.ms": config_docs.doc("log.retention.ms", broker=True),
        "log.cleaner.threads": config_docs.doc("log.cleaner.threads", broker=True)}
    [unasked] = describe(fresh_broker.bootstrap, 4, [(BROKER, "", None)], docs=False)
    assert [c.documentation for c in unasked.configs] == [None, None]
