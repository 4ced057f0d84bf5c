"""Crash and restart: kill -9 while producing with acks=all, clean SIGTERM stops, restarts on the
same port and data dir."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Producer, TopicPartition
from confluent_kafka.admin import OffsetSpec

from strom.testing import TIMESTAMP_BASE_MS, consume_all, create_topic, wait_for

from .conftest import (
    Rec,
    admin,
    ck_consume,
    ck_produce,
    consumer,
    roundtrip,
    stored_batches,
    watermarks,
)

pytestmark = pytest.mark.timeout(90)

T0 = TIMESTAMP_BASE_MS
# Records that must share one batch: a linger no produce loop outlasts; flush() sends at once.
ONE_BATCH = {"linger.ms": 30_000}


def assert_clean_log(proc) -> None:
    text = proc.log_text()
    assert "Traceback" not in text and " ERROR " not in text, text[-3000:]


class NumberedProducer(threading.Thread):
    """Produces 0, 1, 2, ... round-robin over partitions until stopped, with an idempotent
    acks=all producer (so a retry after a broker restart cannot write a record twice); records
    which numbers the broker acknowledged, and where."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        super().__init__(daemon=True)
        self.topic, self.partitions = topic, partitions
        # A message timeout far longer than a restart: records in flight at the kill are retried
        # on the restarted broker, not given up.
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                  "enable.idempotence": True, "linger.ms": 2,
                                  "message.timeout.ms": 120_000, "reconnect.backoff.max.ms": 200})
        self.acked: dict[int, tuple[int, int]] = {}
        self.failed: list = []
        self.sent = 0
        self.unflushed = -1
        self.stop = threading.Event()

    def _report(self, err, msg) -> None:
        if err is None:
            self.acked[int(msg.value())] = (msg.partition(), msg.offset())
        else:
            self.failed.append(err)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.producer.produce(self.topic, b"%d" % self.sent, partition=self.sent % self.partitions,
                                      on_delivery=self._report)
                self.sent += 1
            except BufferError:
                self.producer.poll(0.01)
            self.producer.poll(0)
        self.unflushed = self.producer.flush(150)


@pytest.mark.timeout(240)
def test_kill_9_while_producing_acks_all_loses_no_acked_record(fresh_broker, topic):
    create_topic(fresh_broker.bootstrap, topic, partitions=2)
    producer = NumberedProducer(fresh_broker.bootstrap, topic, 2)
    producer.start()
    wait_for(lambda: len(producer.acked) >= 3000, timeout=90, interval=0.01, what="3000 acknowledgements")
    fresh_broker.kill()
    acked_at_kill = len(producer.acked)
    fresh_broker.start()  # same port, same data dir: recovery of an unclean shutdown
    # The producer goes on through the restart; its retries meet the recovered producer state.
    wait_for(lambda: len(producer.acked) >= acked_at_kill + 1000, timeout=90,
             what="1000 more acknowledgements after the restart")
    producer.stop.set()
    producer.join(180)
    assert not producer.is_alive()
    assert producer.unflushed == 0 and producer.failed == [], producer.failed[:3]
    assert len(producer.acked) == producer.sent

    for p in range(2):
        log = consume_all(fresh_broker.bootstrap, topic, [p])
        # Exactly the numbers produced to this partition, each once, in produce order ...
        assert [int(m.value()) for m in log] == list(range(p, producer.sent, 2))
        # ... each at the offset it was acknowledged with, before the kill as after.
        assert {int(m.value()): (p, m.offset()) for m in log} == \
            {n: at for n, at in producer.acked.items() if at[0] == p}
        # The recovered log takes new appends right after its end.
        [report] = ck_produce(fresh_broker.bootstrap, topic, [Rec(b"after", partition=p)], acks="all")
        assert report.offset() == len(log)
    assert "Traceback" not in fresh_broker.log_text()


def test_sigterm_exits_0_and_data_survives_restart(fresh_broker, topic):
    bootstrap = fresh_broker.bootstrap
    create_topic(bootstrap, topic, partitions=2)
    appended = topic + "-lat"
    create_topic(bootstrap, appended, config={"message.timestamp.type": "LogAppendTime"})
    gone = topic + "-gone"
    create_topic(bootstrap, gone)
    records = [Rec(b"v%d" % i, b"k%d" % i, (("h", b"%d" % i),), 1_000_000 + i, i % 2) for i in range(100)]
    roundtrip(bootstrap, topic, records, **{"compression.type": "gzip"})
    client = admin(bootstrap)
    client.delete_topics([gone], operation_timeout=10)[gone].result(timeout=15)

    assert fresh_broker.stop() == 0
    assert_clean_log(fresh_broker)
    fresh_broker.start()

    got = ck_consume(bootstrap, [(topic, 0, 0), (topic, 1, 0)], 100)
    by_value = {m.value(): m for m in got}
    assert sorted(by_value) == sorted(r.value for r in records)
    for r in records:
        m = by_value[r.value]
        assert (m.key(), m.headers(), m.timestamp()[1], m.partition(), m.offset()) == \
            (r.key, list(r.headers), r.timestamp, r.partition, records.index(r) // 2)
    assert [watermarks(bootstrap, topic, p) for p in (0, 1)] == [(0, 50), (0, 50)]
    # New appends continue the offsets; topic configs and deletions survived the restart.
    assert [m.offset() for m in ck_produce(bootstrap, topic, [Rec(b"more", partition=1)])] == [50]
    [m] = ck_produce(bootstrap, appended, [Rec(b"lat", timestamp=5, partition=0)])
    assert m.timestamp()[0] == TIMESTAMP_LOG_APPEND_TIME and m.timestamp()[1] > 5
    assert set(admin(bootstrap).list_topics(timeout=10).topics) >= {topic, appended}
    assert gone not in admin(bootstrap).list_topics(timeout=10).topics


def test_clients_ride_through_a_restart(fresh_broker, topic):
    """A long-lived producer and consumer keep working across a clean restart on the same port."""
    bootstrap = fresh_broker.bootstrap
    create_topic(bootstrap, topic)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                         "reconnect.backoff.max.ms": 200})
    c = consumer(bootstrap, **{"reconnect.backoff.max.ms": 200})
    errors: list = []
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got: list[bytes] = []

        def produce_and_read(values: list[bytes]) -> None:
            for v in values:
                producer.produce(topic, v, partition=0, on_delivery=lambda err, _m: errors.append(err))
            assert producer.flush(60) == 0
            expected = len(got) + len(values)

            def read_more() -> bool:
                msg = c.poll(0.2)
                if msg is not None and msg.error() is None:
                    got.append(msg.value())
                return len(got) >= expected

            wait_for(read_more, timeout=60, interval=0, what=f"{expected} records read")

        produce_and_read([b"before-%d" % i for i in range(20)])
        assert fresh_broker.stop() == 0
        fresh_broker.start()
        produce_and_read([b"after-%d" % i for i in range(20)])
    finally:
        c.close()
    assert errors == [None] * 40
    assert got == [b"before-%d" % i for i in range(20)] + [b"after-%d" % i for i in range(20)]


def test_leader_epochs_across_restarts(fresh_broker, topic):
    """A leader restarted after a crash starts a new leader epoch (it may have lost unflushed
    records: consumers and followers must see the truncation); after a clean shutdown its
    log lost nothing and it keeps its epoch. Batches keep the epoch they were written in, and
    ListOffsets reports the epoch of the batch it found, as Kafka's leader-epoch cache does."""
    bootstrap = fresh_broker.bootstrap
    create_topic(bootstrap, topic)
    for generation, stop in enumerate(("clean", "crash", "crash")):
        ck_produce(bootstrap, topic, [Rec(b"g%d" % generation, partition=0, timestamp=T0 + 1000 * generation + i)
                                      for i in range(3)], **ONE_BATCH)
        if stop == "clean":
            assert fresh_broker.stop() == 0
        else:
            fresh_broker.kill()
        fresh_broker.start()
    assert [b.partition_leader_epoch for b in stored_batches(bootstrap, topic, 0)] == [0, 0, 1]
    c = consumer(bootstrap)
    try:
        found = [c.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=10)[0] for ts in (T0 + 1, T0 + 1001, T0 + 2002)]
    finally:
        c.close()
    assert [(tp.offset, tp.leader_epoch) for tp in found] == [(1, 0), (4, 0), (8, 1)]
    client = admin(bootstrap)
    ends = {}
    for name, spec in (("earliest", OffsetSpec.earliest()), ("latest", OffsetSpec.latest()),
                       ("max", OffsetSpec.max_timestamp())):
        info = client.list_offsets({TopicPartition(topic, 0): spec}, request_timeout=10)[
            TopicPartition(topic, 0)].result(timeout=15)
        ends[name] = (info.offset, info.leader_epoch)
    assert ends == {"earliest": (0, 0), "latest": (9, 2), "max": (8, 1)}


def test_clean_shutdown_with_connected_clients(fresh_broker, topic):
    create_topic(fresh_broker.bootstrap, topic)
    ck_produce(fresh_broker.bootstrap, topic, [Rec(b"x", partition=0)])
    # A long poll at the end that would outlast the stop's bound: shutting down must not wait
    # for it (stop() fails when the broker has not exited within its timeout).
    idle = consumer(fresh_broker.bootstrap, **{"fetch.wait.max.ms": 240_000, "socket.timeout.ms": 300_000})
    idle.assign([TopicPartition(topic, 0, 1)])
    try:
        assert idle.poll(1.0) is None
        assert fresh_broker.stop(timeout=60) == 0
    finally:
        idle.close()
    assert_clean_log(fresh_broker)
    assert "shutting down" in fresh_broker.log_text()
