"""docs/architecture.md's durability table, one row at a time, proven by cutting the power.

Each test runs a real broker whose log dir lives on the power-loss filesystem, has real
clients produce (acks=all) and read, then SIGKILLs the broker, throws away every change that
was not fsynced, mounts the disk again and restarts the broker on what is left. `kill -9`
alone keeps the page cache, so only a power cut can tell whether an fsync happened.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import ConfigResource, ResourceType

from integration.conftest import Rec, admin, ck_produce, set_topic_configs, watermarks
from strom.testing import BrokerProcess, consume_all, create_topic, unique_name, wait_for

from .harness import PowerLossMount, brokers_on, mounted

pytestmark = pytest.mark.timeout(180)

PAD = b"." * 100  # records of about 100 bytes, so a few hundred fill several small segments
SMALL_SEGMENTS = {"segment.bytes": "16384"}


@pytest.fixture
def power(tmp_path: Path) -> Iterator[PowerLossMount]:
    yield from mounted(tmp_path)


@pytest.fixture
def start_broker(power: PowerLossMount) -> Iterator[Callable[..., BrokerProcess]]:
    yield from brokers_on(power)


@pytest.fixture
def topic(request) -> str:
    return unique_name(request.node.name)


def values(prefix: str, count: int) -> list[bytes]:
    return [b"%s-%05d" % (prefix.encode(), i) + PAD for i in range(count)]


def produce(bootstrap: str, topic: str, batch: list[bytes], **conf) -> list[tuple[int, bytes]]:
    """Produce to partition 0 with acks=all in batches of about 4 KB (so a few hundred records
    make several segments); the (offset, value) of every acknowledged record."""
    conf = {"acks": "all", "batch.size": 4096, **conf}
    reports = ck_produce(bootstrap, topic, [Rec(v, partition=0) for v in batch], **conf)
    return [(m.offset(), m.value()) for m in reports]


def stored(bootstrap: str, topic: str) -> list[tuple[int, bytes]]:
    """(offset, value) of every record in partition 0, as a consumer reads them."""
    return [(m.offset(), m.value()) for m in consume_all(bootstrap, topic, [0], allow_empty=True)]


def checkpointed(power: PowerLossMount, name: str, topic: str) -> int | None:
    """The offset a checkpoint file in the log dir holds for partition 0 of `topic`."""
    try:
        lines = (power.mountpoint / "logs" / name).read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in lines[2:]:
        fields = line.split()
        if fields[:2] == [topic, "0"]:
            return int(fields[2])
    return None


def active_segment_base(power: PowerLossMount, topic: str) -> int:
    return max(int(p.stem) for p in (power.mountpoint / "logs" / f"{topic}-0").glob("*.log"))


def wait_until_rolled_segments_are_flushed(power: PowerLossMount, topic: str) -> int:
    """Wait until the recovery-point checkpoint reaches the active segment (the flush after
    each roll covers everything before it); returns that offset."""
    base = active_segment_base(power, topic)
    assert base > 0, "the records did not fill a segment"
    wait_for(lambda: checkpointed(power, "recovery-point-offset-checkpoint", topic) == base,
             timeout=30, what=f"the recovery point of {topic}-0 to reach {base}")
    return base


def assert_no_traceback(broker: BrokerProcess) -> None:
    assert "Traceback" not in broker.log_text(), broker.log_text()[-3000:]


# -- flush.messages=1: nothing acknowledged is lost -------------------------------------------

def test_flush_messages_1_loses_no_acknowledged_record(power, start_broker, topic):
    broker = start_broker()
    create_topic(broker.bootstrap, topic, config={"flush.messages": "1", **SMALL_SEGMENTS})
    acked = produce(broker.bootstrap, topic, values("a", 300))
    # From here every fsync takes 2 s: a response sent before its fsync finished would reach
    # the client while the data is still unsynced, and the cut right after it would take it.
    power.slow_fsync(2)
    acked += produce(broker.bootstrap, topic, values("last", 1))
    power.power_cycle(broker)
    assert stored(broker.bootstrap, topic) == acked
    assert_no_traceback(broker)


# -- flush.messages=N: at most N-1 acknowledged records are lost ---------------------------------

def test_flush_messages_n_loses_fewer_than_n_acknowledged_records(power, start_broker, topic):
    n = 5
    broker = start_broker()
    create_topic(broker.bootstrap, topic, config={"flush.messages": str(n)})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0})
    acked: list[tuple[int, bytes]] = []
    for value in values("one-by-one", 23):  # one record per produce request
        producer.produce(topic, value, partition=0,
                         on_delivery=lambda err, msg: acked.append((msg.offset(), msg.value()))
                         if err is None else None)
        assert producer.flush(30) == 0
    assert [offset for offset, _ in acked] == list(range(23))
    power.power_cycle(broker)
    survivors = stored(broker.bootstrap, topic)
    assert survivors == acked[:len(survivors)], "a power cut leaves a prefix of the log"
    assert len(acked) - len(survivors) <= n - 1
    # Records 21-23 came after the last flush (at 20): a cut that kept them kept unsynced data.
    assert len(survivors) < len(acked)


# -- Kafka's defaults: the unflushed segment may go, nothing else, never a corrupt log -----------

def test_default_flush_loses_only_the_unflushed_segment(power, start_broker, topic):
    broker = start_broker({"log.flush.offset.checkpoint.interval.ms": "200"})
    create_topic(broker.bootstrap, topic, config=SMALL_SEGMENTS)
    acked = produce(broker.bootstrap, topic, values("a", 400))
    flushed = wait_until_rolled_segments_are_flushed(power, topic)
    power.power_cycle(broker)
    # Every flushed record is intact; the active segment (never fsynced) is gone, and nothing
    # of it comes back half-written.
    assert stored(broker.bootstrap, topic) == acked[:flushed]
    # Its offsets go to new records, each served once.
    more = produce(broker.bootstrap, topic, values("b", 50))
    assert [offset for offset, _ in more] == list(range(flushed, flushed + 50))
    assert stored(broker.bootstrap, topic) == acked[:flushed] + more
    assert_no_traceback(broker)


def test_default_flush_torn_power_cuts_leave_a_clean_prefix(power, start_broker, topic):
    """Write-back part way through at each cut: the active segment may keep a prefix of its
    data, torn anywhere, and start-up must cut it at the last whole batch."""
    broker = start_broker({"log.flush.offset.checkpoint.interval.ms": "200"})
    create_topic(broker.bootstrap, topic, config=SMALL_SEGMENTS)
    log: list[bytes] = []  # what partition 0 holds, by offset
    for seed in range(1, 5):
        acked = produce(broker.bootstrap, topic, values(f"cut{seed}", 250))
        assert [offset for offset, _ in acked] == list(range(len(log), len(log) + 250))
        written = log + [value for _, value in acked]
        flushed = wait_until_rolled_segments_are_flushed(power, topic)
        power.power_cycle(broker, "torn", seed)
        survivors = stored(broker.bootstrap, topic)
        assert [offset for offset, _ in survivors] == list(range(len(survivors)))
        log = [value for _, value in survivors]
        assert log == written[:len(log)], f"cut {seed}: not a prefix of what was written"
        assert len(log) >= flushed, f"cut {seed}: flushed records lost"
    assert_no_traceback(broker)


# -- clean shutdown: nothing is lost --------------------------------------------------------------

def test_clean_shutdown_then_power_cut_loses_nothing(power, start_broker, topic):
    broker = start_broker()
    create_topic(broker.bootstrap, topic, config=SMALL_SEGMENTS)
    acked = produce(broker.bootstrap, topic, values("a", 300))
    assert broker.stop() == 0
    power.cut()  # whatever the shutdown did not fsync is gone now
    power.mount()
    broker.restart()
    assert stored(broker.bootstrap, topic) == acked
    assert_no_traceback(broker)


# -- what else must survive: metadata, checkpoints, producer state, committed offsets -------------

def test_topics_and_configs_survive_a_power_cut(power, start_broker, topic):
    broker = start_broker()
    create_topic(broker.bootstrap, topic, partitions=3, config={"retention.ms": "86400000"})
    set_topic_configs(broker.bootstrap, topic, {"retention.ms": "172800000", "max.message.bytes": "65536"})
    power.power_cycle(broker)
    client = admin(broker.bootstrap)
    assert len(client.list_topics(topic, timeout=10).topics[topic].partitions) == 3
    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = client.describe_configs([resource])[resource].result(timeout=15)
    assert configs["retention.ms"].value == "172800000"
    assert configs["max.message.bytes"].value == "65536"


def test_delete_records_survives_a_power_cut(power, start_broker, topic):
    broker = start_broker()
    create_topic(broker.bootstrap, topic, config={"flush.messages": "1"})
    produce(broker.bootstrap, topic, values("a", 100))
    client = admin(broker.bootstrap)
    deleted = client.delete_records([TopicPartition(topic, 0, 60)], operation_timeout=10)
    assert next(iter(deleted.values())).result(timeout=15).low_watermark == 60
    power.power_cycle(broker)
    assert watermarks(broker.bootstrap, topic, 0) == (60, 100)
    assert checkpointed(power, "log-start-offset-checkpoint", topic) == 60


def test_an_idempotent_producer_carries_on_across_a_power_cut(power, start_broker, topic):
    """The broker's producer state (snapshots plus the log after them) comes back as it was:
    the same producer, with its next sequence numbers, is neither refused nor duplicated."""
    broker = start_broker({"log.flush.offset.checkpoint.interval.ms": "200"})
    create_topic(broker.bootstrap, topic, config={"flush.messages": "1", **SMALL_SEGMENTS})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True,
                         "linger.ms": 5, "message.timeout.ms": 60000})
    acked: list[tuple[int, bytes]] = []
    errors: list[str] = []

    def report(err, msg) -> None:
        if err is None:
            acked.append((msg.offset(), msg.value()))
        else:
            errors.append(str(err))

    def send(batch: list[bytes]) -> None:
        for value in batch:
            producer.produce(topic, value, partition=0, on_delivery=report)
        assert producer.flush(60) == 0

    send(values("before", 200))
    pdir = power.mountpoint / "logs" / f"{topic}-0"
    wait_for(lambda: list(pdir.glob("*.snapshot")), timeout=30, what="a producer snapshot")
    power.power_cycle(broker)
    send(values("after", 200))
    assert not errors, errors
    assert stored(broker.bootstrap, topic) == sorted(acked)
    assert len({value for _, value in acked}) == 400


def test_committed_offsets_survive_a_power_cut(power, start_broker, topic):
    """`__consumer_offsets` is a log like any other: with flush.messages=1 (broker-wide, so
    the internal topic has it too) an acknowledged commit survives."""
    broker = start_broker({"log.flush.interval.messages": "1", "offsets.topic.num.partitions": "1",
                           "group.initial.rebalance.delay.ms": "0"})
    create_topic(broker.bootstrap, topic)
    group = unique_name("group")

    def group_consumer() -> Consumer:
        return Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                         "enable.auto.commit": False})

    c = group_consumer()
    try:
        c.commit(offsets=[TopicPartition(topic, 0, 7)], asynchronous=False)
        c.commit(offsets=[TopicPartition(topic, 0, 11)], asynchronous=False)
    finally:
        c.close()
    power.power_cycle(broker)
    c = group_consumer()
    try:
        committed = wait_for(lambda: [tp for tp in c.committed([TopicPartition(topic, 0)], timeout=10)
                                      if tp.error is None], timeout=30, what="the committed offset")
        assert committed[0].offset == 11
    finally:
        c.close()


# -- a log dir Strom creates itself ---------------------------------------------------------------

def test_a_log_dir_the_broker_creates_survives_a_power_cut(power, topic):
    """The broker makes its log dir on first start; the directory that holds it must be
    fsynced, or a power cut takes the whole log dir (Kafka fsyncs the parent after creating a
    log dir)."""
    broker = BrokerProcess(data_dir=power.mountpoint)  # no provisioned log dir
    try:
        broker.start()
        create_topic(broker.bootstrap, topic, config={"flush.messages": "1"})
        acked = produce(broker.bootstrap, topic, values("a", 20))
        power.power_cycle(broker)
        assert stored(broker.bootstrap, topic) == acked
    finally:
        broker.close()
