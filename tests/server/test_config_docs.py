"""Every config DescribeConfigs reports has a documentation string: a topic or broker config
added without one fails here."""

from __future__ import annotations

import pytest

from strom.config import docs as config_docs
from strom.config.broker import DEFINITIONS
from strom.config.describe import ConfigLayers, describe_broker, describe_topic
from strom.log.config import (
    DEPRECATED_TOPIC_CONFIGS,
    EXTENSION_TOPIC_CONFIGS,
    TOPIC_CONFIG_KEYS,
    LogConfig,
)


def _check(text: str | None) -> None:
    assert text is not None
    assert text == text.strip() and "  " not in text
    assert text.endswith(".") and 20 <= len(text) <= 400


@pytest.mark.parametrize("name", sorted(TOPIC_CONFIG_KEYS) + sorted(DEPRECATED_TOPIC_CONFIGS))
def test_every_topic_config_has_a_doc(name):
    _check(config_docs.doc(name))


@pytest.mark.parametrize("name", sorted(DEFINITIONS))
def test_every_broker_config_has_a_doc(name):
    _check(config_docs.doc(name, broker=True))


def test_the_tables_name_only_known_configs():
    """No description of a config that no longer exists (a rename would leave one behind)."""
    assert set(config_docs.BROKER_DOCS) == set(DEFINITIONS)
    assert set(config_docs.TOPIC_DOCS) == set(TOPIC_CONFIG_KEYS) | set(DEPRECATED_TOPIC_CONFIGS)
    assert config_docs.doc("no.such.config") is None


def test_a_name_both_topic_and_broker_is_described_for_each():
    """min.insync.replicas as a broker config is the topics' default; as a topic config, itself."""
    topic, broker = config_docs.doc("min.insync.replicas"), config_docs.doc("min.insync.replicas", broker=True)
    assert topic != broker and "default" in broker and "acks=all" in topic
    assert config_docs.doc("log.retention.ms") == config_docs.doc("log.retention.ms", broker=True)


def test_ignored_configs_say_so():
    for name in ("preallocate", "log.preallocate", "num.io.threads", "num.network.threads",
                 "queued.max.requests", "ssl.truststore.password", *DEPRECATED_TOPIC_CONFIGS):
        assert "Accepted for compatibility" in config_docs.doc(name, broker=name not in TOPIC_CONFIG_KEYS)


def test_described_entries_carry_the_doc_only_when_asked():
    layers = ConfigLayers({}, {"log.retention.ms": "1000"}, {})
    for include_docs in (True, False):
        topic = describe_topic(LogConfig(), {"retention.ms": "5"}, layers, include_docs=include_docs)
        per_broker = describe_broker({}, layers, include_docs=include_docs)
        default = describe_broker({}, layers, per_broker=False, include_docs=include_docs)
        # the keys beyond Kafka's only where the topic sets them (it sets none)
        assert {e["name"] for e in topic} == set(TOPIC_CONFIG_KEYS) - EXTENSION_TOPIC_CONFIGS
        assert len(per_broker) == len(DEFINITIONS)
        assert [e["name"] for e in default] == ["log.retention.ms"]
        for entry in topic + per_broker + default:
            if include_docs:
                assert entry["documentation"], entry["name"]
            else:
                assert entry["documentation"] is None
    [entry] = describe_broker({}, layers, ["min.insync.replicas"], include_docs=True)
    assert entry["documentation"] == config_docs.doc("min.insync.replicas", broker=True)
