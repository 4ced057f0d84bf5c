"""A power cut during a wide topic's creation and during the first writes to it. A new
partition's log has no files until its first write (Log.create): the topic exists by its
record in the metadata store, and the first produce to each partition makes its directory
and segment file (in worker threads, a batch at a time). Nothing acknowledged before a cut
is lost, the topic comes back whole, and what is acknowledged after a restart survives the
next cut too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from strom.testing import RawClient, consume_all, unique_name, wait_for

from .crash_harness import Power, powered
from .test_power_cut import create_topic

pytestmark = pytest.mark.timeout(420)

CREATE_TOPICS, METADATA = 19, 3
WIDE = 1000
WRITTEN = range(0, WIDE, 5)  # what is produced to the new topic (an fsync each on CrashFS is slow)


@pytest.fixture
def power(tmp_path: Path) -> Iterator[Power]:
    yield from powered(tmp_path)


def produce_one_each(bootstrap: str, topic: str, partitions, tag: bytes) -> dict[int, bytes]:
    """One record per partition, acks=all; returns what was acknowledged, failing on errors."""
    acked: dict[int, bytes] = {}
    errors: list = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20})
    for p in partitions:
        value = tag + b"-%d" % p
        producer.produce(topic, value, partition=p, on_delivery=lambda err, msg, v=value: (
            errors.append(err) if err else acked.__setitem__(msg.partition(), v)))
    assert producer.flush(240) == 0
    producer.close()
    assert not errors, errors[:3]
    return acked


def led(bootstrap_broker, topic: str, partitions: int) -> bool:
    with RawClient(bootstrap_broker) as client:
        body = client.call(METADATA, 12, {"topics": [{"name": topic}], "allow_auto_topic_creation": False,
                                          "include_topic_authorized_operations": False})
    parts = body.topics[0].partitions
    return body.topics[0].error_code == 0 and len(parts) == partitions and all(p.leader_id >= 0 for p in parts)


def read(bootstrap: str, topic: str, partitions, count: int) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {p: [] for p in partitions}
    for m in consume_all(bootstrap, topic, list(partitions), count=count, timeout=120):
        out[m.partition()].append(m.value())
    return out


def produce_until_cut(bootstrap: str, topic: str, partitions, tag: bytes, acked: dict[int, bytes]) -> None:
    """One record per partition, acks=all, recording each acknowledged value in `acked` as it
    comes; what the cut leaves unanswered times out."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "message.timeout.ms": 15000, "retries": 0})
    for p in partitions:
        value = tag + b"-%d" % p
        producer.produce(topic, value, partition=p, on_delivery=lambda err, msg, v=value: (
            None if err else acked.__setitem__(msg.partition(), v)))
        producer.poll(0)
    producer.flush(60)


def test_a_power_cut_during_a_wide_creation_loses_nothing_acknowledged(power: Power) -> None:
    broker = power.broker(**{"log.flush.interval.messages": "1", "max.broker.partitions": str(WIDE + 1000)})
    before, wide = unique_name("before"), unique_name("wide")
    create_topic(broker.bootstrap, before, partitions=50)
    kept = produce_one_each(broker.bootstrap, before, range(50), b"kept")

    # The creation is cut before its answer, or right after it: either way it made no files.
    def create() -> None:
        try:
            with RawClient(broker) as client:
                client.call(CREATE_TOPICS, 5, {"topics": [{"name": wide, "num_partitions": WIDE,
                                                           "replication_factor": 1, "assignments": [],
                                                           "configs": []}],
                                               "timeout_ms": 300_000, "validate_only": False})
        except (ConnectionError, OSError):
            pass  # the power went before the answer

    creating = threading.Thread(target=create, daemon=True)
    creating.start()
    wait_for(lambda: led(broker, wide, WIDE), 120, interval=0.05)
    logs = broker.data_dir / "logs"
    assert not list(logs.glob(f"{wide}-*"))
    power.cut()
    creating.join(30)

    broker.restart()
    wait_for(lambda: led(broker, wide, WIDE), 180, interval=0.2)
    # The first writes to the new partitions make their files; the power goes meanwhile.
    acked: dict[int, bytes] = {}
    producing = threading.Thread(target=produce_until_cut, args=(broker.bootstrap, wide, WRITTEN, b"first", acked),
                                 daemon=True)
    producing.start()
    wait_for(lambda: len(acked) > len(WRITTEN) // 10, 120, interval=0.01)
    power.cut()
    producing.join(90)
    assert acked

    broker.restart()
    wait_for(lambda: led(broker, wide, WIDE), 180, interval=0.2)
    assert read(broker.bootstrap, before, range(50), 50) == {p: [v] for p, v in kept.items()}, power.logs()
    survived = read(broker.bootstrap, wide, acked, len(acked))
    assert all(v in survived[p] for p, v in acked.items()), power.logs()
    after = produce_one_each(broker.bootstrap, wide, WRITTEN, b"after")

    power.cut()
    broker.restart()
    wait_for(lambda: led(broker, wide, WIDE), 180, interval=0.2)
    got = read(broker.bootstrap, wide, WRITTEN, len(WRITTEN))
    assert all(got[p][-1] == v for p, v in after.items()), power.logs()
    assert read(broker.bootstrap, before, range(50), 50) == {p: [v] for p, v in kept.items()}, power.logs()
