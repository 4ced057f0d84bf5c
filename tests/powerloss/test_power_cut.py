"""The durability table of docs/architecture.md, row by row, under a real power cut: a broker on
CrashFS is SIGKILLed, every change it did not fsync is dropped (some tests keep a torn prefix
of the unsynced bytes, as write-back may), and it restarts on what is left.

Each test's docstring names the row it proves.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from strom.testing import BrokerProcess, unique_name

from .crash_harness import Power, powered

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def power(tmp_path: Path) -> Iterator[Power]:
    yield from powered(tmp_path)


# --- clients ------------------------------------------------------------------------------------
def create_topic(bootstrap: str, name: str, partitions: int = 1, **config: str) -> None:
    client = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)
    client.create_topics([topic], operation_timeout=20)[name].result(timeout=30)


def produce_numbers(bootstrap: str, topic: str, numbers: range, **conf) -> dict[int, int]:
    """Produce each number (its decimal value padded to 100 bytes, so segments fill) to
    partition 0 with acks=all; returns number -> acknowledged offset, failing the test on any
    delivery error."""
    acked: dict[int, int] = {}
    errors: list[str] = []

    def report(err, msg) -> None:
        if err is None:
            acked[int(msg.value())] = msg.offset()
        else:
            errors.append(str(err))

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "batch.size": 2048, **conf})  # many batches: segments roll
    for n in numbers:
        producer.produce(topic, str(n).ljust(100).encode(), partition=0, on_delivery=report)
        producer.poll(0)
    assert producer.flush(60) == 0, "records still queued after 60 s"
    assert not errors, errors[:5]
    return acked


def read_partition(bootstrap: str, topic: str, partition: int = 0,
                   timeout: float = 30.0) -> tuple[int, list[tuple[int, int]]]:
    """(log start offset, [(offset, number)]) of every record up to the high watermark."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "powerloss-reader",
                        "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    try:
        tp = TopicPartition(topic, partition)
        low, high = consumer.get_watermark_offsets(tp, timeout=20)
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        out: list[tuple[int, int]] = []
        deadline = time.monotonic() + timeout
        while (not out or out[-1][0] < high - 1) and high > low:
            assert time.monotonic() < deadline, f"read {len(out)} records of [{low}, {high})"
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            out.append((msg.offset(), int(msg.value())))
        return low, out
    finally:
        consumer.close()


def assert_clean_prefix(read: list[tuple[int, int]], start: int = 0) -> None:
    """The log holds consecutive offsets from `start`, and no number twice."""
    assert [o for o, _ in read] == list(range(start, start + len(read))), "a gap or a repeat"
    numbers = [n for _, n in read]
    assert len(set(numbers)) == len(numbers), "a record is served twice"


def wait_for(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)
    return value


def checkpoint(broker: BrokerProcess, name: str) -> dict[tuple[str, int], int]:
    """A checkpoint file of the broker's log dir, as it reads on the mount now."""
    try:
        lines = (broker.data_dir / "logs" / name).read_text().splitlines()
    except FileNotFoundError:
        return {}
    return {(t, int(p)): int(o) for t, p, o in (line.split() for line in lines[2:])}


def active_base(broker: BrokerProcess, topic: str, partition: int = 0) -> int:
    """The base offset of the partition's newest segment, from its file names."""
    d = broker.data_dir / "logs" / f"{topic}-{partition}"
    return max(int(f.name.split(".")[0]) for f in d.iterdir() if f.name.endswith(".log"))


class NumberedProducer(threading.Thread):
    """Produces 0, 1, 2, ... with acks=all over `partitions` partitions until stopped, and
    records where each acknowledged number went."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        super().__init__(daemon=True)
        self.topic, self.partitions = topic, partitions
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                                  "message.timeout.ms": 5000, "reconnect.backoff.max.ms": 200})
        self.acked: dict[int, tuple[int, int]] = {}
        self.stopped = threading.Event()

    def _report(self, err, msg) -> None:
        if err is None:
            self.acked[int(msg.value())] = (msg.partition(), msg.offset())

    def run(self) -> None:
        n = 0
        while not self.stopped.is_set():
            try:
                self.producer.produce(self.topic, str(n).encode(), partition=n % self.partitions,
                                      on_delivery=self._report)
                n += 1
            except BufferError:
                pass
            self.producer.poll(0.002)
        self.producer.purge()  # what is still in flight goes unacknowledged
        self.producer.flush(5)

    def stop(self) -> None:
        self.stopped.set()
        self.join(30)


# --- the table ----------------------------------------------------------------------------------
@pytest.mark.parametrize("every", [1, 20])
def test_flush_messages_loses_at_most_the_unflushed_acknowledged_records(power: Power, every: int) -> None:
    """Rows `flush.messages=1` and `flush.messages=N`, power cut: nothing acknowledged is lost
    with 1, at most N-1 acknowledged records per partition with N, because the produce that
    reaches N is answered only after the fsync that covers it. The disk is slow (every fsync
    takes 50 ms) and the power goes while records are being produced, so an acknowledgement
    sent before its fsync finished would be caught; the unsynced tail is torn at a random
    byte."""
    broker = power.broker(**{"log.flush.interval.messages": str(every)})
    topic = unique_name(f"flush-{every}")
    create_topic(broker.bootstrap, topic, partitions=2, **{"segment.bytes": "8192"})
    power.mount.set_fsync_delay(0.05)
    producer = NumberedProducer(broker.bootstrap, topic, partitions=2)
    producer.start()
    try:
        wait_for(lambda: len(producer.acked) >= 200, timeout=60, what="200 acknowledged records")
        power.cut(torn_seed=18)
    finally:
        producer.stop()
    acked = dict(producer.acked)
    broker.restart()
    for partition in range(2):
        low, read = read_partition(broker.bootstrap, topic, partition)
        assert low == 0
        assert_clean_prefix(read)
        at = dict(read)
        mine = [(n, o) for n, (p, o) in acked.items() if p == partition]
        assert mine, f"nothing was acknowledged on partition {partition}"
        assert all(at[o] == n for n, o in mine if o < len(read)), "a record at another offset"
        lost = sorted(n for n, o in mine if o >= len(read))
        assert len(lost) <= every - 1, (
            f"partition {partition}: {len(lost)} acknowledged records lost by the power cut, "
            f"e.g. {lost[:5]} (log end {len(read)}, flush.messages={every})")


def test_default_flush_loses_only_unflushed_records_and_never_corrupts(power: Power) -> None:
    """Row "Kafka's defaults", power cut: no fsync per write, so the active segment's records
    may go, but everything flushed (the segments before the last roll, up to the checkpointed
    recovery point) survives, the log is a clean prefix of what was written (torn batches
    cut off), no record is served twice, and the log takes new records after the cut."""
    broker = power.broker(**{"log.flush.offset.checkpoint.interval.ms": "200"})
    topic = unique_name("default-flush")
    create_topic(broker.bootstrap, topic, **{"segment.bytes": "4096"})
    total = 0
    for cut, seed in enumerate((None, 7)):  # a plain cut, then one that tears the tail
        acked = produce_numbers(broker.bootstrap, topic, range(total, total + 400))
        total += 400
        # The roll's flush has fsynced every segment below the active one once the recovery
        # point checkpoint says so.
        base = active_base(broker, topic)
        assert base > 0, "no segment was rolled"
        wait_for(lambda b=base: checkpoint(broker, "recovery-point-offset-checkpoint").get((topic, 0)) == b,
                 what=f"the recovery point checkpoint to reach {base}")
        power.cut(torn_seed=seed)
        assert checkpoint(broker, "recovery-point-offset-checkpoint")[(topic, 0)] == base
        broker.restart()
        low, read = read_partition(broker.bootstrap, topic, 0)
        assert low == 0
        assert_clean_prefix(read)
        assert len(read) >= base, f"cut {cut}: flushed records lost: log end {len(read)} < {base}"
        assert all(n == o for o, n in read), "a record at another offset than acknowledged"
        assert all(acked[n] == o for o, n in read if n in acked)
        if seed is None:
            # Nothing fsynced the active segment: its records are gone (the harness drops what
            # was not synced, and the default syncs nothing per write).
            assert len(read) < total, "records of the never-synced segment survived"
        total = len(read)  # numbers continue from the recovered log end: number == offset
    after = produce_numbers(broker.bootstrap, topic, range(total, total + 20))
    assert sorted(after.values()) == list(range(total, total + 20))
    _, read = read_partition(broker.bootstrap, topic, 0)
    assert_clean_prefix(read)
    assert len(read) == total + 20


def test_flush_ms_makes_the_active_segment_durable(power: Power) -> None:
    """Row `flush.ms=T`: without any roll, the flush scheduler fsyncs the active segment once
    its last flush is T old, so records whose flush the recovery point checkpoint shows are
    all there after a power cut (with the default they would all be gone: see above)."""
    broker = power.broker(**{"log.flush.interval.ms": "100", "log.flush.scheduler.interval.ms": "50",
                             "log.flush.offset.checkpoint.interval.ms": "100"})
    topic = unique_name("flush-ms")
    create_topic(broker.bootstrap, topic)
    produce_numbers(broker.bootstrap, topic, range(50))
    wait_for(lambda: checkpoint(broker, "recovery-point-offset-checkpoint").get((topic, 0)) == 50,
             what="the recovery point checkpoint to reach the log end")
    assert active_base(broker, topic) == 0, "a roll flushed it, not flush.ms"
    power.cut(torn_seed=9)
    broker.restart()
    _, read = read_partition(broker.bootstrap, topic, 0)
    assert read == [(n, n) for n in range(50)]


def test_clean_shutdown_loses_nothing_and_the_next_crash_is_recovered(power: Power) -> None:
    """Row "clean shutdown (SIGTERM)": a power cut after it loses nothing (every log flushed
    and checkpointed first). After the restart the clean-shutdown marker is gone for good, so
    a power cut later is recovered as a crash (torn batches cut off), not trusted as clean."""
    broker = power.broker()
    topic = unique_name("clean-stop")
    create_topic(broker.bootstrap, topic)
    produce_numbers(broker.bootstrap, topic, range(300))
    assert broker.stop() == 0
    power.cut(torn_seed=3)
    broker.restart()
    _, read = read_partition(broker.bootstrap, topic, 0)
    assert read == [(n, n) for n in range(300)]
    produce_numbers(broker.bootstrap, topic, range(300, 600))
    power.cut(torn_seed=4)
    broker.restart()
    assert "no clean shutdown marker, recovered" in broker.log_text(), power.logs()
    _, read = read_partition(broker.bootstrap, topic, 0)
    assert_clean_prefix(read)
    assert read[:300] == [(n, n) for n in range(300)]
    assert all(n == o for o, n in read)


def test_metadata_and_checkpoints_survive(power: Power) -> None:
    """"Metadata (topics, topic and broker configs) is rewritten atomically with fsyncs of the
    file and its directory on every change; a DeleteRecords is checkpointed before it is
    answered": a power cut right after each keeps them, and the broker keeps its cluster id
    (meta.properties)."""
    broker = power.broker(**{"log.flush.interval.messages": "1"})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    cluster_id = admin.describe_cluster().result(timeout=20).cluster_id
    kept, trimmed = unique_name("kept"), unique_name("trimmed")
    create_topic(broker.bootstrap, kept, partitions=3, **{"retention.ms": "123456789"})
    create_topic(broker.bootstrap, trimmed)
    resource = ConfigResource(ResourceType.TOPIC, kept, incremental_configs=[
        ConfigEntry("max.message.bytes", "654321", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(timeout=20)
    produce_numbers(broker.bootstrap, trimmed, range(100))
    done = admin.delete_records([TopicPartition(trimmed, 0, 40)], request_timeout=20)
    assert done[TopicPartition(trimmed, 0, 40)].result(timeout=20).low_watermark == 40
    power.cut()
    broker.restart()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert admin.describe_cluster().result(timeout=20).cluster_id == cluster_id
    topics = admin.list_topics(timeout=20).topics
    assert len(topics[kept].partitions) == 3 and len(topics[trimmed].partitions) == 1
    described = admin.describe_configs([ConfigResource(ResourceType.TOPIC, kept)])
    configs = next(iter(described.values())).result(timeout=20)
    assert configs["retention.ms"].value == "123456789"
    assert configs["max.message.bytes"].value == "654321"
    low, read = read_partition(broker.bootstrap, trimmed, 0)
    assert low == 40
    assert read == [(n, n) for n in range(40, 100)]


# Each of the next three caught a durability bug when it was written (a snapshot renamed
# without a directory fsync, offset commits answered before their flush.messages fsync, a
# new log dir whose parent was never fsynced).
def test_producer_snapshots_survive(power: Power) -> None:
    """Producer snapshots survive a power cut: the newest one the broker wrote before it is
    still there after it (the producers' state does not fall back to an older snapshot or to
    a replay of the whole log), and the idempotent producer's records are there once each."""
    broker = power.broker(**{"log.flush.interval.messages": "1",
                             "log.flush.offset.checkpoint.interval.ms": "200"})
    topic = unique_name("snapshots")
    create_topic(broker.bootstrap, topic)
    produce_numbers(broker.bootstrap, topic, range(50), **{"enable.idempotence": True})
    part = broker.data_dir / "logs" / f"{topic}-0"

    def snapshots() -> list[str]:
        return sorted(f.name for f in part.iterdir() if f.name.endswith(".snapshot"))

    wait_for(snapshots, what="a producer snapshot")
    # A snapshot's name shows before the directory holding it is synced (write, rename, fsync of
    # the directory): a cut in between loses it, as it may. The one checked is the newest after
    # a second more, by when its writer has synced the directory.
    time.sleep(1.0)
    written = snapshots()
    power.cut()
    assert written[-1] in snapshots(), f"{written[-1]} was lost: {sorted(f.name for f in part.iterdir())}"
    broker.restart()
    _, read = read_partition(broker.bootstrap, topic, 0)
    assert read == [(n, n) for n in range(50)]


def test_flush_messages_1_keeps_acknowledged_offset_commits(power: Power) -> None:
    """`__consumer_offsets` under `flush.messages=1` (the broker's log.flush.interval.messages,
    which internal topics take): an acknowledged OffsetCommit survives a power cut, as an
    acknowledged produce does. The disk is slow, so a commit answered before its fsync
    finished is caught."""
    broker = power.broker(**{"log.flush.interval.messages": "1", "offsets.topic.num.partitions": "1"})
    topic, group = unique_name("commits"), unique_name("group")
    create_topic(broker.bootstrap, topic)
    produce_numbers(broker.bootstrap, topic, range(10))
    conf = {"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False}
    consumer = Consumer(conf)
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 7)], asynchronous=False)
        power.mount.set_fsync_delay(1.0)
        consumer.commit(offsets=[TopicPartition(topic, 0, 9)], asynchronous=False)
        power.cut()
    finally:
        consumer.close()
    broker.restart()
    consumer = Consumer(conf)
    try:
        committed = consumer.committed([TopicPartition(topic, 0)], timeout=30)
    finally:
        consumer.close()
    assert committed[0].offset == 9


def test_a_log_dir_the_broker_creates_survives(power: Power) -> None:
    """A log dir that `strom serve` creates itself (its parent exists) survives a power cut,
    with the metadata file and the fsynced records in it: creating it is made durable."""
    broker = power.broker(make_log_dir=False, **{"log.flush.interval.messages": "1"})
    topic = unique_name("new-dir")
    create_topic(broker.bootstrap, topic)
    produce_numbers(broker.bootstrap, topic, range(20))
    power.cut()
    assert (broker.data_dir / "logs").is_dir(), "the log dir vanished with the power"
    broker.restart()
    _, read = read_partition(broker.bootstrap, topic, 0)
    assert read == [(n, n) for n in range(20)]
