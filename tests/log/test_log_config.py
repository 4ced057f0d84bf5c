from __future__ import annotations

import pytest

from strom.log.config import TOPIC_CONFIG_KEYS, LogConfig


def test_defaults_are_kafkas():
    c = LogConfig()
    assert c.segment_bytes == 1073741824
    assert c.segment_ms == 604800000
    assert c.retention_ms == 604800000
    assert c.retention_bytes == -1
    assert c.index_interval_bytes == 4096
    assert c.segment_index_bytes == 10485760
    assert c.max_message_bytes == 1048588
    assert c.message_timestamp_type == "CreateTime"
    assert c.file_delete_delay_ms == 60000
    assert c.cleanup_policy == "delete"


def test_overrides_parse_and_copy():
    base = LogConfig()
    c = base.with_overrides({
        "segment.bytes": "1024",
        "retention.ms": "-1",
        "retention.bytes": " 5000 ",
        "message.timestamp.type": "LogAppendTime",
        "cleanup.policy": "compact,delete",
        "segment.ms": "10",
        "index.interval.bytes": "0",
        "segment.index.bytes": "80",
        "max.message.bytes": "2000",
        "file.delete.delay.ms": "0",
    })
    assert (c.segment_bytes, c.retention_ms, c.retention_bytes) == (1024, -1, 5000)
    assert c.log_append_time and c.delete_enabled
    assert (c.segment_ms, c.index_interval_bytes, c.segment_index_bytes) == (10, 0, 80)
    assert (c.max_message_bytes, c.file_delete_delay_ms) == (2000, 0)
    assert base == LogConfig()  # the original is untouched
    assert not LogConfig(cleanup_policy="compact").delete_enabled


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("segment.bytes", "13"),
        ("segment.bytes", "abc"),
        ("segment.bytes", str(2**31)),
        ("segment.ms", "0"),
        ("retention.ms", "-2"),
        ("message.timestamp.type", "WallTime"),
        ("cleanup.policy", "erase"),
        ("max.message.bytes", "-1"),
        ("no.such.config", "1"),
    ],
)
def test_bad_overrides_name_the_key(key, value):
    with pytest.raises(ValueError, match=rf"^{key}: "):
        LogConfig().with_overrides({key: value})


def test_topic_config_keys_round_trip():
    c = LogConfig(retention_bytes=123)
    assert set(TOPIC_CONFIG_KEYS) >= {"segment.bytes", "retention.ms", "max.message.bytes", "cleanup.policy"}
    assert LogConfig().with_overrides(c.to_topic_configs()) == c


def test_compaction_and_flush_configs():
    c = LogConfig().with_overrides({
        "cleanup.policy": "compact",
        "delete.retention.ms": "1000",
        "min.cleanable.dirty.ratio": "0.25",
        "min.compaction.lag.ms": "10",
        "max.compaction.lag.ms": "20",
        "flush.messages": "1",
        "flush.ms": "0",
        "min.insync.replicas": "2",
    })
    assert c.compact and not c.delete_enabled
    assert (c.delete_retention_ms, c.min_cleanable_dirty_ratio) == (1000, 0.25)
    assert (c.min_compaction_lag_ms, c.max_compaction_lag_ms) == (10, 20)
    assert (c.flush_messages, c.flush_ms, c.min_insync_replicas) == (1, 0, 2)
    assert LogConfig(cleanup_policy="compact,delete").compact
    assert LogConfig().with_overrides(c.to_topic_configs()) == c


@pytest.mark.parametrize(("base", "overrides", "key"), [
    (LogConfig(), {"min.cleanable.dirty.ratio": "1.01"}, "min.cleanable.dirty.ratio"),
    (LogConfig(), {"min.cleanable.dirty.ratio": "half"}, "min.cleanable.dirty.ratio"),
    (LogConfig(), {"flush.messages": "0"}, "flush.messages"),
    (LogConfig(), {"max.compaction.lag.ms": "0"}, "max.compaction.lag.ms"),
    (LogConfig(), {"min.compaction.lag.ms": "30", "max.compaction.lag.ms": "20"}, "min.compaction.lag.ms"),
    (LogConfig(min_compaction_lag_ms=10), {"max.compaction.lag.ms": "5"}, "max.compaction.lag.ms"),
])
def test_bad_compaction_configs(base, overrides, key):
    with pytest.raises(ValueError, match=rf"^{key}: "):
        base.with_overrides(overrides)


def test_replication_throttled_replicas_match_pairs_or_everything():
    config = LogConfig().with_overrides({"leader.replication.throttled.replicas": "0:1, 2:3",
                                       "follower.replication.throttled.replicas": "*"})
    assert config.replication_throttled(False, 0, 1)
    assert config.replication_throttled(False, 2, 3)
    assert not config.replication_throttled(False, 1, 0)
    assert not config.replication_throttled(False, 0, 3)
    assert config.replication_throttled(True, 7, 9)
    assert not LogConfig().replication_throttled(True, 0, 1)
    assert not LogConfig().replication_throttled(False, 0, 1)
