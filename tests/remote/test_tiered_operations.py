"""What operators see of tiered storage (KIP-405), on a real broker process with a directory
store: Kafka's remote metrics on the Prometheus endpoint (copy, fetch and delete counters, copy
lag, remote size, the store failing), `strom topics describe` with local and remote sizes, and
`strom dump-log` of a remote segment, by path in the directory store and by object key through
the store the broker's rsm.config.* keys name."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from strom.testing import (
    BrokerProcess,
    close_client,
    create_topic,
    metric_value,
    scrape,
    unique_name,
    wait_for,
)

RECORDS = 1200
SEGMENT_BYTES = "16384"


@pytest.fixture(scope="module")
def remote_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("remote-store")


@pytest.fixture(scope="module")
def store_link(remote_root) -> Path:
    """The store's root as the broker knows it: a symlink to remote_root, which the failure test
    points elsewhere and back, each in one atomic rename."""
    link = remote_root.with_name(remote_root.name + "-link")
    link.symlink_to(remote_root)
    return link


@pytest.fixture(scope="module")
def broker(store_link):
    with BrokerProcess(overrides={
            "metrics.port": "0",
            "remote.log.storage.system.enable": "true",
            "rsm.config.storage.root": str(store_link),
            "remote.log.manager.task.interval.ms": "300",
            "log.retention.check.interval.ms": "300",
            "rlmm.config.remote.log.metadata.topic.num.partitions": "3"}) as b:
        yield b


def _produce(bootstrap: str, topic: str, count: int = RECORDS, first: int = 0) -> None:
    """Small flushes, so that batches are small and segments roll every few of them."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    errors = []
    try:
        for i in range(first, first + count):
            producer.produce(topic, b"v%06d" % i + b"x" * 100,
                             on_delivery=lambda err, _msg: errors.append(err) if err else None)
            if i % 20 == 19:
                producer.flush(10)
        assert producer.flush(30) == 0
    finally:
        close_client(producer)
    assert errors == []


def _samples(broker: BrokerProcess) -> dict:
    return scrape(broker.metrics_url)


def _topic_gauge(broker: BrokerProcess, name: str, topic: str) -> float | None:
    return _samples(broker).get((name, frozenset({("topic", topic)})))


def _tiered_topic(broker: BrokerProcess, base: str, local_retention_ms: str) -> str:
    topic = unique_name(base)
    create_topic(broker.bootstrap, topic, config={
        "remote.storage.enable": "true", "segment.bytes": SEGMENT_BYTES, "local.retention.ms": local_retention_ms})
    _produce(broker.bootstrap, topic)
    # every rolled segment copied: the copy lag of the topic is 0 and it has remote segments
    wait_for(lambda: _topic_gauge(broker, "strom_topic_remote_log_segments", topic)
             and _topic_gauge(broker, "strom_topic_remote_copy_lag_segments", topic) == 0,
             timeout=60, what=f"the rolled segments of {topic} copied")
    return topic


@pytest.fixture(scope="module")
def kept(broker):
    """A tiered topic whose segments stay on local disk too (long local retention)."""
    return _tiered_topic(broker, "kept", "3600000")


@pytest.fixture(scope="module")
def offloaded(broker):
    """A tiered topic whose copied segments leave the local disk at once."""
    topic = _tiered_topic(broker, "offloaded", "1")
    wait_for(lambda: len(_segment_files(broker, topic)) == 1, timeout=60,
             what=f"the local segments of {topic} deleted")
    return topic


def _segment_files(broker: BrokerProcess, topic: str) -> list[Path]:
    return sorted((broker.data_dir / "logs" / f"{topic}-0").glob("*.log"))


def _strom(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strom", *args], capture_output=True, text=True, timeout=120)


def _describe_fields(out: str, topic: str) -> dict[str, str]:
    line = next(line for line in out.splitlines() if f"Topic: {topic}\tPartition: 0\t" in line)
    return dict(re.findall(r"(\w+): (\S*)", line))


# --- metrics -------------------------------------------------------------------------------

def test_copies_show_in_the_counters_and_the_remote_size(broker, kept):
    samples = _samples(broker)
    copied = metric_value(samples, "strom_remote_copy_bytes_total")
    segments = metric_value(samples, "strom_topic_remote_log_segments", topic=kept)
    size = metric_value(samples, "strom_topic_remote_log_size_bytes", topic=kept)
    assert segments >= 3
    assert metric_value(samples, "strom_remote_copy_requests_total") >= segments
    assert copied >= size > segments * 1000  # each segment holds most of segment.bytes
    # every rolled local segment but the active one is copied: no lag left
    assert metric_value(samples, "strom_topic_remote_copy_lag_bytes", topic=kept) == 0
    assert metric_value(samples, "strom_topic_remote_copy_lag_segments", topic=kept) == 0
    local_segments = metric_value(samples, "strom_log_segments", topic=kept, partition="0")
    assert segments == local_segments - 1  # the local copies are kept here
    # the broker-wide totals are at least this topic's
    assert metric_value(samples, "strom_remote_log_size_bytes") >= size
    assert metric_value(samples, "strom_remote_log_segments") >= segments
    assert metric_value(samples, "strom_remote_copy_errors_total") == 0
    assert metric_value(samples, "strom_remote_storage_unavailable") == 0


def test_the_copy_lag_counts_rolled_segments_not_yet_copied(broker, remote_root):
    """With copies turned off for a topic (remote.log.copy.disable), its rolled segments are the
    lag, in segments and bytes; the remote size stays 0."""
    topic = unique_name("lagging")
    create_topic(broker.bootstrap, topic, config={
        "remote.storage.enable": "true", "segment.bytes": SEGMENT_BYTES, "remote.log.copy.disable": "true"})
    _produce(broker.bootstrap, topic, count=600)

    def lagging() -> dict | None:
        samples = _samples(broker)
        lag = samples.get(("strom_topic_remote_copy_lag_segments", frozenset({("topic", topic)})))
        local = metric_value(samples, "strom_log_segments", topic=topic, partition="0")
        return samples if local >= 3 and lag == local - 1 else None

    # every rolled segment lags (the gauge follows once a task interval has passed)
    samples = wait_for(lagging, timeout=30, what="a copy lag of every rolled segment")
    lag_bytes = metric_value(samples, "strom_topic_remote_copy_lag_bytes", topic=topic)
    assert 0 < lag_bytes < metric_value(samples, "strom_log_size_bytes", topic=topic, partition="0")
    assert metric_value(samples, "strom_topic_remote_log_size_bytes", topic=topic) == 0
    assert not list(remote_root.glob(f"{topic}-*"))


def test_reads_below_the_local_log_start_count_as_remote_fetches(broker, offloaded):
    before = _samples(broker)
    fetched_before = metric_value(before, "strom_remote_fetch_bytes_total")
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique_name("g"),
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(offloaded, 0, 0)])
        message = wait_for(lambda: (m := consumer.poll(0.5)) is not None and not m.error() and m, timeout=30,
                           what="the first record, from remote storage")
        assert message.offset() == 0 and message.value().startswith(b"v000000")
    finally:
        close_client(consumer)
    after = _samples(broker)
    assert metric_value(after, "strom_remote_fetch_bytes_total") > fetched_before
    assert metric_value(after, "strom_remote_fetch_requests_total") > metric_value(
        before, "strom_remote_fetch_requests_total")
    assert metric_value(after, "strom_remote_fetch_errors_total") == 0


def test_a_deleted_topic_counts_its_remote_deletions(broker, remote_root):
    topic = _tiered_topic(broker, "deleted", "3600000")
    segments = metric_value(_samples(broker), "strom_topic_remote_log_segments", topic=topic)
    deleted_before = metric_value(_samples(broker), "strom_remote_delete_requests_total")
    assert list(remote_root.glob(f"{topic}-*/0/*.log"))
    done = _strom("topics", "delete", "--bootstrap-server", broker.bootstrap, "--topic", topic)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: metric_value(_samples(broker), "strom_remote_delete_requests_total")
             >= deleted_before + segments, timeout=60, what="the remote segments deleted")
    assert not list(remote_root.glob(f"{topic}-*/0/*.log"))
    assert (("strom_topic_remote_log_size_bytes", frozenset({("topic", topic)}))) not in _samples(broker)
    assert metric_value(_samples(broker), "strom_remote_delete_errors_total") == 0


# --- topics describe -----------------------------------------------------------------------

def test_describe_shows_local_and_remote_sizes(broker, offloaded, kept):
    done = _strom("topics", "describe", "--bootstrap-server", broker.bootstrap, "--topic", offloaded,
                  "--topic", kept)
    assert done.returncode == 0, done.stderr
    samples = _samples(broker)
    off = _describe_fields(done.stdout, offloaded)
    assert int(off["RemoteSize"]) == metric_value(samples, "strom_topic_remote_log_size_bytes", topic=offloaded) > 0
    assert int(off["RemoteSegments"]) == metric_value(samples, "strom_topic_remote_log_segments",
                                                      topic=offloaded)
    assert int(off["LocalSize"]) == metric_value(samples, "strom_log_size_bytes", topic=offloaded, partition="0")
    assert int(off["LocalSize"]) < int(off["RemoteSize"])  # the copied segments left the disk
    assert off["LogStartOffset"] == "0"
    local_start = int(off["LocalLogStartOffset"])
    assert 0 < local_start < RECORDS
    kept_fields = _describe_fields(done.stdout, kept)
    assert kept_fields["LocalLogStartOffset"] == kept_fields["LogStartOffset"] == "0"
    assert int(kept_fields["LocalSize"]) > int(kept_fields["RemoteSize"]) > 0
    # the summary lines are Kafka's; the sizes are on the partition lines only
    assert f"Topic: {offloaded}\tTopicId:" in done.stdout and "remote.storage.enable=true" in done.stdout


def test_describe_of_a_topic_not_tiered_shows_no_sizes(broker):
    topic = unique_name("plain")
    create_topic(broker.bootstrap, topic)
    done = _strom("topics", "describe", "--bootstrap-server", broker.bootstrap, "--topic", topic)
    assert done.returncode == 0, done.stderr
    fields = _describe_fields(done.stdout, topic)
    assert "Isr" in fields and "RemoteSize" not in fields and "LocalSize" not in fields


# --- dump-log ------------------------------------------------------------------------------

def _batch_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("baseOffset: ")]


def test_dump_log_of_a_remote_segment_is_the_local_dump(broker, kept, remote_root, tmp_path):
    local = _segment_files(broker, kept)[0]
    assert local.name == "00000000000000000000.log"
    local_dump = _strom("dump-log", str(local), "--deep-iteration")
    assert local_dump.returncode == 0, local_dump.stderr
    (remote,) = remote_root.glob(f"{kept}-*/0/00000000000000000000-*.log")
    expected = _batch_lines(local_dump.stdout)
    assert len(expected) > 5
    # by path in the directory store
    by_path = _strom("dump-log", str(remote), "--deep-iteration")
    assert by_path.returncode == 0, by_path.stderr
    assert _batch_lines(by_path.stdout) == expected
    assert "Log starting offset: 0" in by_path.stdout
    records = [line for line in local_dump.stdout.splitlines() if line.startswith("| offset:")]
    assert records and [line for line in by_path.stdout.splitlines() if line.startswith("| offset:")] == records
    # by object key, through the store the broker's keys make
    props = tmp_path / "server.properties"
    props.write_text(f"remote.log.storage.system.enable=true\nrsm.config.storage.root={remote_root}\n")
    key = str(remote.relative_to(remote_root))
    by_key = _strom("dump-log", "--remote-config", str(props), key)
    assert by_key.returncode == 0, by_key.stderr
    assert f"Dumping {key}" in by_key.stdout
    assert _batch_lines(by_key.stdout) == expected
    # an --override alone says where the store is as well; a key not there is an error
    by_override = _strom("dump-log", "--override", f"rsm.config.storage.root={remote_root}", key,
                         "--print-data-log")
    assert by_override.returncode == 0, by_override.stderr
    assert _batch_lines(by_override.stdout) == expected
    assert "payload: v000000" in by_override.stdout
    missing = _strom("dump-log", "--remote-config", str(props),
                     key.replace("/00000000000000000000-", "/00000000000000000001-"))
    assert missing.returncode == 1 and "no object" in missing.stderr


def test_dump_log_finds_a_damaged_remote_segment(broker, kept, remote_root, tmp_path):
    (remote,) = remote_root.glob(f"{kept}-*/0/00000000000000000000-*.log")
    damaged = tmp_path / "store" / remote.relative_to(remote_root)
    damaged.parent.mkdir(parents=True)
    data = bytearray(remote.read_bytes())
    data[100] ^= 0xFF  # inside the first batch's records: its CRC no longer matches
    damaged.write_bytes(bytes(data))
    done = _strom("dump-log", "--override", f"rsm.config.storage.root={tmp_path / 'store'}",
                  str(remote.relative_to(remote_root)))
    assert done.returncode == 1
    assert "CRC mismatch" in done.stderr


# --- the store failing (last: it takes the store away for a while) ---------------------------

def _point(link: Path, target: Path) -> None:
    """Make `link` a symlink to `target` in one rename."""
    new = link.with_name(link.name + ".new")
    new.unlink(missing_ok=True)
    new.symlink_to(target)
    new.replace(link)


def test_a_failing_store_sets_the_unavailable_gauge_and_counts_errors(broker, remote_root, store_link, tmp_path):
    topic = unique_name("failing")
    create_topic(broker.bootstrap, topic, config={
        "remote.storage.enable": "true", "segment.bytes": SEGMENT_BYTES, "local.retention.ms": "1"})
    errors_before = metric_value(_samples(broker), "strom_remote_copy_errors_total")
    # The store's root becomes a file: every write under it fails (as root, a read-only
    # directory would not stop this process).
    not_a_directory = tmp_path / "not-a-directory"
    not_a_directory.write_bytes(b"")
    _point(store_link, not_a_directory)
    try:
        _produce(broker.bootstrap, topic, count=400)
        wait_for(lambda: metric_value(_samples(broker), "strom_remote_storage_unavailable") == 1, timeout=30,
                 what="the store reported failing")
        samples = _samples(broker)
        assert metric_value(samples, "strom_remote_copy_errors_total") > errors_before
        assert metric_value(samples, "strom_topic_remote_copy_lag_segments", topic=topic) > 0
        assert metric_value(samples, "strom_topic_remote_log_size_bytes", topic=topic) == 0
    finally:
        _point(store_link, remote_root)
    # the store back: the copies go through, and the gauge says so
    wait_for(lambda: metric_value(_samples(broker), "strom_remote_storage_unavailable") == 0
             and _topic_gauge(broker, "strom_topic_remote_copy_lag_segments", topic) == 0, timeout=60,
             what="the copies done once the store is back")
    assert metric_value(_samples(broker), "strom_topic_remote_log_size_bytes", topic=topic) > 0


def test_dump_log_reads_an_object_of_an_s3_store(broker, kept, remote_root, tmp_path):
    """An S3 store (SeaweedFS) holding a copy of the remote segment: `s3://BUCKET/KEY` with the
    rest of the store's keys as overrides prints what the directory store's object does."""
    from strom.remote import storage_from_config
    from strom.s3_server import S3Server
    from strom.testing import free_ports

    (remote,) = remote_root.glob(f"{kept}-*/0/00000000000000000000-*.log")
    key = str(remote.relative_to(remote_root))
    expected = _batch_lines(_strom("dump-log", str(remote)).stdout)
    assert expected
    with S3Server(data_dir=tmp_path / "s3", ports=free_ports) as server:
        config = server.rsm_config()
        store = storage_from_config(config)
        try:
            store.put(key, remote)
        finally:
            store.close()
        bucket = config.pop("rsm.config.storage.s3.bucket.name")
        overrides = [arg for k, v in config.items() for arg in ("--override", f"{k}={v}")]
        done = _strom("dump-log", f"s3://{bucket}/{key}", *overrides)
        assert done.returncode == 0, done.stderr
        assert f"Dumping s3://{bucket}/{key}" in done.stdout
        assert _batch_lines(done.stdout) == expected
        # the same object from a properties file naming the bucket
        props = tmp_path / "server.properties"
        props.write_text("".join(f"{k}={v}\n" for k, v in server.rsm_config().items()))
        by_key = _strom("dump-log", "--remote-config", str(props), key)
        assert by_key.returncode == 0, by_key.stderr
        assert _batch_lines(by_key.stdout) == expected
        other = key.replace("/00000000000000000000-", "/00000000000000000001-")
        gone = _strom("dump-log", f"s3://{bucket}/{other}", *overrides)
        assert gone.returncode == 1 and f"no object {other}" in gone.stderr
