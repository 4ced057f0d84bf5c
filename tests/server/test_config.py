import subprocess
import sys

import pytest

from strom.config.broker import BrokerConfig, ConfigError, load, parse_listeners


def test_defaults_are_kafkas():
    cfg = BrokerConfig()
    assert cfg["num.partitions"] == 1 and cfg["message.max.bytes"] == 1048588
    assert cfg["socket.request.max.bytes"] == 104857600
    assert [str(x) for x in cfg.listeners] == ["PLAINTEXT://127.0.0.1:9092"]
    log = cfg.default_log_config()
    assert log.segment_bytes == 1073741824 and log.retention_ms == 168 * 3600 * 1000
    assert log.index_interval_bytes == 4096 and log.segment_ms == 168 * 3600 * 1000


def test_retention_precedence_ms_minutes_hours():
    assert BrokerConfig({"log.retention.hours": "1"}).log_retention_ms == 3_600_000
    assert BrokerConfig({"log.retention.minutes": "2", "log.retention.hours": "1"}).log_retention_ms == 120_000
    assert BrokerConfig({"log.retention.ms": "5", "log.retention.minutes": "2"}).log_retention_ms == 5
    assert BrokerConfig({"log.retention.ms": "-1"}).log_retention_ms == -1


@pytest.mark.parametrize("props, fragment", [
    ({"no.such.key": "1"}, "unknown config key 'no.such.key'$"),
    ({"num.partition": "3"}, "did you mean 'num.partitions'"),
    ({"retention.ms": "1000"}, "'retention.ms' is a topic config; .* 'log.retention.ms'"),
    ({"queued.max.request.bytes": "1024"}, "at least socket.request.max.bytes"),
    ({"log.segment.bytes": str(2**31)}, "must be at most 2147483647"),
    ({"num.partitions": "zero"}, "invalid value for num.partitions"),
    ({"num.partitions": "0"}, "must be at least 1"),
    ({"auto.create.topics.enable": "yes"}, "expected true or false"),
    ({"listeners": "localhost:9092"}, "NAME://host:port"),
    ({"log.message.timestamp.type": "Now"}, "must be one of"),
    ({"advertised.listeners": "OTHER://h:1"}, "no matching listener"),
])
def test_bad_values_name_the_key(props, fragment):
    with pytest.raises(ConfigError, match=fragment):
        BrokerConfig(props)


def test_properties_file_and_overrides(tmp_path):
    path = tmp_path / "server.properties"
    path.write_text("# comment\nnum.partitions=3\nlog.dirs = /tmp/a,/tmp/b\n")
    cfg = load(path, ["num.partitions=4"])
    assert cfg["num.partitions"] == 4
    assert [str(d) for d in cfg.log_dirs] == ["/tmp/a", "/tmp/b"]


def test_listener_parsing():
    a, b = parse_listeners("PLAINTEXT://127.0.0.1:9092, internal://[::1]:0")
    assert (a.name, a.host, a.port) == ("PLAINTEXT", "127.0.0.1", 9092)
    assert (b.name, b.host, b.port) == ("INTERNAL", "::1", 0)


@pytest.mark.parametrize("args", [
    ["--override", "bogus.key=1"],
    ["--override", "message.max.bytes=lots"],
    ["/nonexistent/server.properties"],
])
def test_cli_rejects_bad_config_with_exit_2(args):
    proc = subprocess.run([sys.executable, "-m", "strom", "serve", *args], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("strom: ")


def test_cleaner_threads_change_at_most_by_half_or_double():
    from strom.config.broker import BrokerConfig
    from strom.config.dynamic import DynamicBrokerConfig
    from strom.protocol.errors import ErrorCode, KafkaError

    dynamic = DynamicBrokerConfig(BrokerConfig({"log.cleaner.threads": "2"}))
    assert dynamic.validate(True, {"log.cleaner.threads": "4"})["log.cleaner.threads"] == 4
    assert dynamic.validate(True, {"log.cleaner.threads": "1"})["log.cleaner.threads"] == 1
    for value in ("5", "200000"):
        try:
            dynamic.validate(True, {"log.cleaner.threads": value})
        except KafkaError as e:
            assert e.code == ErrorCode.INVALID_CONFIG and "factor of 2" in str(e)
        else:
            raise AssertionError(f"log.cleaner.threads={value} accepted")
