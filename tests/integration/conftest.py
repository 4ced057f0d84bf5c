"""Real clients against real `strom serve` processes over 127.0.0.1.

Fixtures: `broker` is one broker shared by the whole session (tests only ever touch their own,
uniquely named topics); `fresh_broker` is a broker of the test's own, for tests that stop,
kill or restart it; `retention_broker` checks retention every 200 ms. Helpers: `ck_produce` /
`ck_consume` (confluent-kafka), `roundtrip`, the one "produce these records and read them back
exactly" check, and `retention_has_run`. What every suite shares (`create_topic`, `wait_for`,
`consume_all`, `consume_until`) is in `strom.testing`.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from strom.protocol import messages, records
from strom.testing import (
    BrokerProcess,
    closing,
    consume_until,
    create_topic,
    make_pki,
    report_broker_logs,
    unique_name,
    wait_for,
)

GROUP = "strom-it"  # librdkafka wants a group.id; with assign() and no commits it never needs the group


pytest_runtest_makereport = pytest.hookimpl(hookwrapper=True)(report_broker_logs)


@pytest.fixture(scope="session")
def broker():
    """One broker for a worker's whole run. Tests write records stamped years ago (fixed
    CreateTimes make their assertions exact), which a week's retention deletes as Kafka would:
    its retention check runs once a day here, not every 5 minutes in the middle of a test
    (CI once lost test_many_segments' records that way). Retention has brokers of its own."""
    with BrokerProcess(overrides={"auto.create.topics.enable": "true", "num.partitions": "2",
                                  "log.retention.check.interval.ms": str(24 * HOUR_MS)}) as proc:
        yield proc


@pytest.fixture
def fresh_broker():
    with BrokerProcess() as proc:
        yield proc


@pytest.fixture
def retention_broker():
    """A broker of the test's own that checks retention every 200 ms (log.retention.bytes is
    set explicitly, at its default, so that it shows as a static broker config)."""
    with BrokerProcess(overrides={"log.retention.check.interval.ms": "200",
                                  "log.retention.bytes": "-1"}) as proc:
        yield proc


HOUR_MS = 3_600_000


def old_records(n: int, hours: float = 2) -> list[Rec]:
    """`n` records of partition 0 stamped `hours` ago: a week's retention keeps them, a
    minute's does not."""
    then = int(time.time() * 1000) - int(hours * HOUR_MS)
    return [Rec(b"old-%03d" % i * 10, partition=0, timestamp=then + i) for i in range(n)]


def retention_has_run(bootstrap: str) -> None:
    """Returns once a retention check has run over every log that existed when it was called:
    a topic of its own, created after them, whose old records a minute's retention must drop
    (a check visits every log, so the one that trimmed this topic visited the others too)."""
    marker = unique_name("retention-marker")
    create_topic(bootstrap, marker, config={"segment.bytes": "1024", "retention.ms": "60000"})
    ck_produce(bootstrap, marker, old_records(20) + [Rec(b"new", partition=0)],
               **{"linger.ms": 0, "batch.num.messages": 5})
    wait_for(lambda: watermarks(bootstrap, marker, 0)[0] > 0, timeout=60,
             what="a retention check to trim " + marker)


# Group coordinator settings that keep group tests fast: no initial rebalance delay, sessions as
# short as 1 s allowed, a small `__consumer_offsets`, frequent KIP-848 heartbeats.
GROUP_OVERRIDES = {
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
    "offsets.topic.num.partitions": "10",
    "group.consumer.heartbeat.interval.ms": "250",
    "group.consumer.min.heartbeat.interval.ms": "100",
    "group.consumer.session.timeout.ms": "3000",
    "group.consumer.min.session.timeout.ms": "1000",
}


@pytest.fixture(scope="session")
def group_broker():
    """A broker for group tests (each uses its own group and topic names)."""
    with BrokerProcess(overrides=GROUP_OVERRIDES) as proc:
        yield proc


@pytest.fixture
def topic(request) -> str:
    """A topic name no other test uses (not created: tests create it as they need)."""
    return unique_name(request.node.name)




# --- admin -------------------------------------------------------------------------------------
def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


# --- confluent-kafka produce / consume -----------------------------------------------------------
@dataclass(frozen=True)
class Rec:
    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp: int | None = None  # CreateTime in ms, or None to let the client stamp it
    partition: int | None = None  # None: the client's partitioner decides (by key)


def ck_produce(bootstrap: str, topic: str, records: Iterable[Rec], **conf) -> list[Message]:
    """Produce with confluent-kafka, flush, and return the delivery reports in produce order;
    fails the test on any delivery error."""
    reports: dict[int, tuple[object, Message]] = {}  # reports come per partition, not in order
    with closing(Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, **conf})) as producer:
        # Learn the topic's partitions first: records produced before librdkafka knows them wait
        # unassigned, and once flush() has begun, librdkafka sends them as they are assigned, one
        # batch each, which breaks tests that expect a single batch (linger.ms=30000).
        producer.list_topics(topic, timeout=10)
        for i, r in enumerate(records):
            extra = {}
            if r.partition is not None:
                extra["partition"] = r.partition
            if r.timestamp is not None:
                extra["timestamp"] = r.timestamp
            producer.produce(topic, value=r.value, key=r.key, headers=list(r.headers) or None,
                             on_delivery=lambda err, msg, i=i: reports.__setitem__(i, (err, msg)), **extra)
        assert producer.flush(30) == 0, "messages still queued after 30 s"
    errors = [str(err) for err, _ in reports.values() if err is not None]
    assert not errors, errors
    assert len(reports) == i + 1
    return [reports[j][1] for j in range(len(reports))]


def consumer(bootstrap: str, **conf) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False,
                     "enable.auto.offset.store": False, "fetch.wait.max.ms": 100, **conf})


def ck_consume(bootstrap: str, assignment: Sequence[tuple[str, int, int]], count: int,
               timeout: float = 60.0, **conf) -> list[Message]:
    """Assign (topic, partition, offset)s and read until `count` messages arrived; the first
    `count` (whether more follow is for `consume_all` and the watermarks to tell)."""
    return consume_until(bootstrap, assignment, lambda progress: len(progress.records) >= count,
                         timeout=timeout, what=f"{count} messages", **conf).records[:count]


def watermarks(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    c = consumer(bootstrap)
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
    finally:
        c.close()


def offsets_for_times(bootstrap: str, topic: str, timestamps: list[int]) -> list[int]:
    """ListOffsets by timestamp on partition 0, one lookup per request."""
    c = consumer(bootstrap)
    try:
        found = [c.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=10)[0] for ts in timestamps]
    finally:
        c.close()
    assert [tp.error for tp in found] == [None] * len(found)
    return [tp.offset for tp in found]


def as_rec(msg: Message, with_timestamp: bool) -> Rec:
    return Rec(msg.value(), msg.key(), tuple(msg.headers() or ()),
               msg.timestamp()[1] if with_timestamp else None, msg.partition())


def roundtrip(bootstrap: str, topic: str, records: Sequence[Rec], **producer_conf) -> list[Message]:
    """Produce `records`, read every partition they went to from offset 0, and check that each
    partition holds exactly the produced records, in order, with their offsets as acknowledged."""
    reports = ck_produce(bootstrap, topic, records, **producer_conf)
    assert [m.topic() for m in reports] == [topic] * len(records)
    partitions = sorted({m.partition() for m in reports})
    got = ck_consume(bootstrap, [(topic, p, 0) for p in partitions], len(records))
    acked = producer_conf.get("acks") not in (0, "0")
    with_ts = all(r.timestamp is not None for r in records)
    for p in partitions:
        sent = [(r, m) for r, m in zip(records, reports, strict=True) if m.partition() == p]
        read = [m for m in got if m.partition() == p]
        expected = [Rec(r.value, r.key, r.headers, r.timestamp if with_ts else None, p) for r, _ in sent]
        assert [as_rec(m, with_ts) for m in read] == expected
        assert [m.offset() for m in read] == list(range(len(sent)))
        if acked:
            assert [m.offset() for _, m in sent] == list(range(len(sent)))
        assert watermarks(bootstrap, topic, p) == (0, len(sent))
    return got


# --- the raw wire, for what no client shows -----------------------------------------------------
def wire_call(bootstrap: str, api_key: int, version: int, fields: dict):
    """One request on a fresh connection; the decoded response body."""
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(messages.encode_request(api_key, version, fields))
        reader = sock.makefile("rb")
        (size,) = struct.unpack(">i", reader.read(4))
        _, body = messages.decode_response(api_key, version, reader.read(size))
    return body


def stored_batches(bootstrap: str, topic: str, partition: int, offset: int = 0) -> list[records.BatchHeader]:
    """The record batch headers a Fetch v4 returns from `offset`: how the log stores them."""
    body = wire_call(bootstrap, 1, 4, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 64 << 20, "isolation_level": 0,
        "topics": [{"topic": topic, "partitions": [
            {"partition": partition, "fetch_offset": offset, "partition_max_bytes": 64 << 20}]}],
    })
    data = body.responses[0].partitions[0]
    assert data.error_code == 0, data.error_code
    buf, pos, out = data.records or b"", 0, []
    while pos < len(buf):
        header = records.read_header(buf, pos)
        out.append(header)
        pos += header.size
    return out


def set_topic_configs(bootstrap: str, topic: str, configs: dict[str, str | None]) -> None:
    """IncrementalAlterConfigs through confluent-kafka: SET each value, DELETE where None."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.DELETE if v is None
                           else AlterConfigOpType.SET) for k, v in configs.items()]
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
    client = admin(bootstrap)
    client.incremental_alter_configs([resource])[resource].result(timeout=15)


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> dict[str, Any]:
    return make_pki(tmp_path_factory.mktemp("pki"))
