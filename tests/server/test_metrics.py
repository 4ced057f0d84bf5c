"""The Prometheus endpoint, scraped around real client traffic: the numbers move as the
traffic says they must. Also request logging and logger levels (BROKER_LOGGER)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from strom.testing import (
    BrokerProcess,
    create_topic,
    metric_value,
    produce_acked,
    scrape,
    unique_name,
    wait_for,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(overrides={"metrics.port": "0", "group.initial.rebalance.delay.ms": "0",
                                  "log.cleaner.backoff.ms": "200"}) as b:
        yield b


def test_metrics_are_off_by_default():
    with BrokerProcess() as b:
        assert b.metrics_url is None


def test_produce_and_consume_move_the_topic_counters(broker):
    url, topic, group = broker.metrics_url, unique_name("metered"), unique_name("metered-group")
    assert url is not None and url.startswith("http://127.0.0.1:")
    create_topic(broker.bootstrap, topic, partitions=2)
    before = scrape(url)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(500):
        producer.produce(topic, key=str(i).encode(), value=b"v" * 100, partition=i % 2)
    assert producer.flush(30) == 0
    after_produce = scrape(url)
    assert metric_value(after_produce, "strom_topic_messages_in_total", topic=topic) == 500
    topic_bytes = metric_value(after_produce, "strom_topic_bytes_in_total", topic=topic)
    assert topic_bytes > 500 * 100  # record framing and batch headers on top of the values
    assert metric_value(after_produce, "strom_bytes_in_total") - metric_value(before, "strom_bytes_in_total") >= topic_bytes
    assert metric_value(after_produce, "strom_messages_in_total") - metric_value(before, "strom_messages_in_total") >= 500
    ends = [metric_value(after_produce, "strom_log_end_offset", topic=topic, partition=str(p)) for p in (0, 1)]
    assert ends == [250, 250]
    assert metric_value(after_produce, "strom_log_size_bytes", topic=topic, partition="0") > 0
    assert metric_value(after_produce, "strom_log_segments", topic=topic, partition="0") == 1
    produces = sum(v for (n, labels), v in after_produce.items()
                   if n == "strom_requests_total" and ("request", "Produce") in labels)
    assert produces >= 1
    assert metric_value(after_produce, "strom_request_time_seconds_count", request="Produce") == produces
    buckets = sorted((float(dict(labels)["le"]), v) for (n, labels), v in after_produce.items()
                     if n == "strom_request_time_seconds_bucket" and ("request", "Produce") in labels)
    counts = [v for _, v in buckets]
    assert counts == sorted(counts) and counts[-1] == produces  # cumulative, +Inf is the count

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 30
    while got < 500 and time.monotonic() < deadline:
        got += len([m for m in consumer.consume(500, 1) if not m.error()])
    assert got == 500
    consumer.commit(asynchronous=False)
    after_consume = scrape(url)
    assert metric_value(after_consume, "strom_topic_bytes_out_total", topic=topic) >= topic_bytes
    assert metric_value(after_consume, "strom_topic_fetch_requests_total", topic=topic) >= 2
    assert metric_value(after_consume, "strom_connections", listener="PLAINTEXT") >= 1
    assert metric_value(after_consume, "strom_groups", state="Stable") >= 1
    for p in (0, 1):
        assert metric_value(after_consume, "strom_consumer_group_lag", group=group, topic=topic, partition=str(p)) == 0

    # Produce 30 more to partition 0 without consuming them: the group lags by exactly that.
    for _ in range(30):
        producer.produce(topic, value=b"late", partition=0)
    assert producer.flush(30) == 0
    lagging = scrape(url)
    assert metric_value(lagging, "strom_consumer_group_lag", group=group, topic=topic, partition="0") == 30
    assert metric_value(lagging, "strom_consumer_group_lag", group=group, topic=topic, partition="1") == 0
    consumer.close()
    assert 0.0 <= metric_value(lagging, "strom_network_processor_avg_idle_ratio") <= 1.0
    assert metric_value(lagging, "process_resident_memory_bytes") > 0
    assert metric_value(lagging, "strom_active_controller") == 1
    assert metric_value(lagging, "strom_leader_partitions") >= 2
    assert metric_value(lagging, "strom_under_replicated_partitions") == 0


def test_long_poll_shows_in_the_fetch_purgatory_and_remote_time(broker):
    url, topic = broker.metrics_url, unique_name("quiet")
    create_topic(broker.bootstrap, topic)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique_name("quiet-group"),
                         "fetch.wait.max.ms": 2000, "fetch.min.bytes": 1000000})
    consumer.assign([TopicPartition(topic, 0, 0)])
    try:
        # The consumer's fetch waits in the purgatory for data that does not come.
        wait_for(lambda: (consumer.poll(0.05), metric_value(scrape(url), "strom_purgatory_size", operation="Fetch"))[1] >= 1,
                 timeout=20, what="a long-polling fetch in the purgatory")
        # The series appears with the first Fetch answered, which may be the parked one.
        remote_time = ("strom_request_remote_time_seconds_sum", frozenset({("request", "Fetch")}))
        wait_for(lambda: (consumer.poll(0.05), scrape(url).get(remote_time, 0.0))[1] >= 1.0,
                 timeout=20, what="a second of fetch remote time")
    finally:
        consumer.close()


def test_refused_records_count_as_rejected_and_failed(broker):
    url, topic = broker.metrics_url, unique_name("compacted")
    create_topic(broker.bootstrap, topic, config={"cleanup.policy": "compact"})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "retries": 0})
    errors = []
    producer.produce(topic, value=b"no key", on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(30)
    assert errors and errors[0] is not None  # a compacted topic refuses keyless records
    samples = scrape(url)
    assert metric_value(samples, "strom_topic_failed_produce_requests_total", topic=topic) == 1
    assert metric_value(samples, "strom_topic_bytes_rejected_total", topic=topic) > 0
    assert metric_value(samples, "strom_topic_messages_in_total", topic=topic) == 0


def test_flushes_and_cleaning_are_timed(broker):
    url, topic = broker.metrics_url, unique_name("cleaned")
    create_topic(broker.bootstrap, topic, config={
        "cleanup.policy": "compact", "segment.bytes": "2000", "min.cleanable.dirty.ratio": "0.01",
        "flush.messages": "1"})
    before = scrape(url)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "batch.num.messages": 1})
    for i in range(200):
        producer.produce(topic, key=b"k%d" % (i % 5), value=b"x" * 50)
        producer.poll(0)
    assert producer.flush(30) == 0
    after = scrape(url)
    assert metric_value(after, "strom_log_flush_seconds_count") > metric_value(before, "strom_log_flush_seconds_count")
    assert metric_value(after, "strom_log_segments", topic=topic, partition="0") > 1
    wait_for(lambda: metric_value(scrape(url), "strom_log_cleaner_passes_total") > metric_value(before, "strom_log_cleaner_passes_total"),
             timeout=30, what="a compaction pass")
    samples = scrape(url)
    assert metric_value(samples, "strom_log_cleaner_read_bytes_total") > metric_value(samples, "strom_log_cleaner_written_bytes_total") > 0


def test_topic_deletion_keeps_the_totals_and_drops_the_series(broker):
    url, topic = broker.metrics_url, unique_name("short-lived")
    create_topic(broker.bootstrap, topic)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.produce(topic, value=b"once")
    assert producer.flush(30) == 0
    before = scrape(url)
    assert metric_value(before, "strom_topic_messages_in_total", topic=topic) == 1
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    wait_for(lambda: ("strom_topic_messages_in_total", frozenset({("topic", topic)})) not in scrape(url),
             timeout=30, what="the deleted topic's series to go")
    assert metric_value(scrape(url), "strom_messages_in_total") >= metric_value(before, "strom_messages_in_total")


def strom(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strom", *args], capture_output=True, text=True, timeout=60)


def test_request_logging_turns_on_and_off_at_runtime(broker):
    """kafka-configs --entity-type broker-loggers: a level set through IncrementalAlterConfigs
    applies at once, shows in DescribeConfigs, and DELETE restores inheritance."""
    server = ("--bootstrap-server", broker.bootstrap)
    done = strom("configs", "alter", *server, "--broker-logger", "0", "--add-config", "kafka.request.logger=DEBUG")
    assert done.returncode == 0, done.stderr
    described = strom("configs", "describe", *server, "--broker-logger", "0")
    assert described.returncode == 0, described.stderr
    assert "  strom.request=DEBUG " in described.stdout and "  root=INFO " in described.stdout
    topic = unique_name("logged")
    create_topic(broker.bootstrap, topic)
    wait_for(lambda: any("DEBUG strom.request: CreateTopics v" in line for line in broker.stderr_lines),
             timeout=10, what="a request log line")
    done = strom("configs", "alter", *server, "--broker-logger", "0", "--delete-config", "strom.request")
    assert done.returncode == 0, done.stderr
    seen = len(broker.stderr_lines)
    create_topic(broker.bootstrap, unique_name("not-logged"))
    time.sleep(0.5)
    assert not any("strom.request" in line for line in broker.stderr_lines[seen:])
    refused = strom("configs", "alter", *server, "--broker-logger", "0", "--add-config", "strom.request=LOUD")
    assert refused.returncode == 1 and "not a log level" in refused.stderr
    wrong_broker = strom("configs", "describe", *server, "--broker-logger", "7")
    assert wrong_broker.returncode == 1 and "broker 7 is not in the cluster" in wrong_broker.stderr


def test_log_level_spec_at_start_up():
    with BrokerProcess(env={"STROM_LOG_LEVEL": "WARN,strom.request=DEBUG"}) as b:
        create_topic(b.bootstrap, unique_name("spec"))
        wait_for(lambda: any("DEBUG strom.request: CreateTopics" in line for line in b.stderr_lines),
                 timeout=10, what="a request log line")
        # --log-level INFO (what BrokerProcess passes) sets the root level over the environment.
        assert any(" INFO strom." in line for line in b.stderr_lines)


def _series_names(samples: dict) -> set[str]:
    """Metric names as PromQL uses them: counters with _total, histograms as their base name."""
    names = set()
    for name, _ in samples:
        for suffix in ("_bucket", "_count", "_sum"):
            if name.endswith(suffix) and not name.endswith("_total"):
                names.add(name.removesuffix(suffix))
        names.add(name)
    return names


def test_the_docs_and_the_dashboard_name_what_is_served(broker):
    """docs/metrics.md lists every strom_* metric a broker serves and nothing else, and every
    metric the Grafana dashboard queries exists."""
    topic, group = unique_name("documented"), unique_name("documented-group")
    create_topic(broker.bootstrap, topic)
    produce_acked(broker.bootstrap, topic, [b"one"])
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    wait_for(lambda: (message := consumer.poll(0.2)) is not None and not message.error(), timeout=30,
             what="the record")
    consumer.commit(asynchronous=False)
    consumer.close()
    served = {n for n in _series_names(scrape(broker.metrics_url)) if n.startswith("strom_")}
    served -= {n for n in served if n.endswith("_created")}  # prometheus-client's counter timestamps
    docs = (REPO / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"`(strom_[a-z_]+)`", docs))
    histograms = {n.removesuffix("_bucket") for n in served if n.endswith("_bucket")}
    parts = {f"{h}{s}" for h in histograms for s in ("_bucket", "_count", "_sum")}
    # the quorum's raft metrics are a dedicated controller's (tests/kraft/test_quorum.py scrapes them),
    # Iceberg topics' those of brokers with iceberg.enabled (tests/tables/test_iceberg_schemas.py),
    # share groups' dead letters appear with the first (tests/integration/test_share_groups.py)
    assert documented - served == {n for n in documented
                                   if n.startswith(("strom_raft_", "strom_iceberg_", "strom_share_dead_letter_"))}
    assert served - parts - documented == set()
    dashboard = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
    queried = {name for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"\b(strom_[a-z_]+|process_[a-z_]+)\b", target["expr"])}
    all_served = _series_names(scrape(broker.metrics_url))
    assert queried and queried - all_served == set()
