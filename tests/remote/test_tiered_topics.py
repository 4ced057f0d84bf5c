"""Tiered topics end to end (KIP-405) on one broker process and a real S3 server (SeaweedFS on
127.0.0.1): rolled segments are copied, local ones deleted by local retention, and every
client reads the whole history from offset 0 through the broker; read_committed skips aborted
transactions in remote segments; retention of the whole log and topic deletion delete remote
objects; configs Kafka refuses are refused; a restart keeps serving the remote history."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from strom.remote import storage_from_config
from strom.s3_server import S3Server
from strom.testing import (
    BrokerProcess,
    free_ports,
    list_offset,
    tiered_overrides,
    unique_name,
    wait_for,
)

EARLIEST, EARLIEST_LOCAL, LATEST_TIERED = -2, -4, -5
PREFIX = "tiered-test/"


@pytest.fixture(scope="module")
def s3():
    with S3Server(ports=free_ports) as server:
        yield server


@pytest.fixture(scope="module")
def broker(s3, tmp_path_factory):
    overrides = tiered_overrides(s3.rsm_config(key_prefix=PREFIX),
                                 **{"rlmm.config.remote.log.metadata.topic.num.partitions": "3"})
    with BrokerProcess(tmp_path_factory.mktemp("tiered"), overrides) as b:
        yield b


def objects(s3: S3Server, topic: str) -> list[str]:
    import obstore

    store = storage_from_config(s3.rsm_config())._store
    # obstore's prefix is a path's leading segments: the topic's directory is filtered here
    return sorted(o["path"] for batch in obstore.list(store, prefix=PREFIX.rstrip("/")) for o in batch
                  if o["path"].startswith(f"{PREFIX}{topic}-"))


def tiered_topic(broker: BrokerProcess, **config: str) -> str:
    name = unique_name("tiered")
    configs = {"remote.storage.enable": "true", "segment.bytes": "4096", "local.retention.ms": "1", **config}
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config=configs)])[name].result(15)
    return name


def produce(broker: BrokerProcess, topic: str, values: list[bytes], **conf) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "batch.size": 1024, "linger.ms": 0, **conf})
    for i, value in enumerate(values):
        producer.produce(topic, value)
        if i % 10 == 9:
            producer.flush(10)
    assert producer.flush(15) == 0




def read_all(broker: BrokerProcess, topic: str, expected: int, **conf) -> list[tuple[int, bytes]]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": uuid.uuid4().hex,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest", **conf})
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 30
    try:
        while len(out) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            out.append((message.offset(), message.value()))
        extra = consumer.poll(1.0)  # nothing beyond what is expected
        assert extra is None or extra.error() is not None, extra.offset()
    finally:
        consumer.close()
    return out


def test_history_below_the_local_log_is_read_from_the_object_store_by_every_client(broker, s3):
    topic = tiered_topic(broker)
    values = [b"record-%05d-" % i + b"x" * 200 for i in range(1500)]
    produce(broker, topic, values)
    # local retention deletes what is copied: the local log starts well past 0 ...
    wait_for(lambda: list_offset(broker.bootstrap, topic, EARLIEST_LOCAL) >= 1000, timeout=30)
    local_start = list_offset(broker.bootstrap, topic, EARLIEST_LOCAL)
    # ... while the log still starts at 0, in remote storage, copied up to the local start
    assert list_offset(broker.bootstrap, topic, EARLIEST) == 0
    assert list_offset(broker.bootstrap, topic, LATEST_TIERED) >= local_start - 1
    keys = objects(s3, topic)
    assert any(k.endswith(".log") for k in keys) and any(k.endswith(".index") for k in keys)
    assert any(k.endswith(".leader-epoch-checkpoint") for k in keys)
    # librdkafka
    got = read_all(broker, topic, len(values))
    assert [o for o, _ in got] == list(range(len(values)))
    assert [v for _, v in got] == values
    # kafka-python, another client's fetch path, from the start
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                             consumer_timeout_ms=5000)
    consumer.assign([KTP(topic, 0)])
    consumer.seek_to_beginning()
    seen = []
    for message in consumer:
        seen.append(message.value)
        if len(seen) == len(values):
            break
    consumer.close()
    assert seen == values


def test_read_committed_skips_transactions_aborted_in_remote_segments(broker):
    topic = tiered_topic(broker)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": uuid.uuid4().hex,
                         "batch.size": 1024, "linger.ms": 0})
    producer.init_transactions(15)
    committed, aborted = [], []
    for round_ in range(6):
        producer.begin_transaction()
        batch = [b"%s-%d-%03d-" % (b"abort" if round_ % 2 else b"commit", round_, i) + b"y" * 150
                 for i in range(60)]
        for i, value in enumerate(batch):
            producer.produce(topic, value)
            if i % 10 == 9:
                producer.flush(10)
        if round_ % 2:
            producer.abort_transaction(15)
            aborted += batch
        else:
            producer.commit_transaction(15)
            committed += batch
    produce(broker, topic, [b"tail-%03d" % i + b"z" * 200 for i in range(200)])
    end_of_transactions = len(committed) + len(aborted) + 6  # each transaction's marker
    wait_for(lambda: list_offset(broker.bootstrap, topic, EARLIEST_LOCAL) > end_of_transactions, timeout=30)
    # every offset of the transactions is in remote storage now
    got = read_all(broker, topic, len(committed) + 200, **{"isolation.level": "read_committed"})
    values = [v for _, v in got]
    assert values[:len(committed)] == committed
    assert not set(values) & set(aborted)
    uncommitted = read_all(broker, topic, len(committed) + len(aborted) + 200,
                           **{"isolation.level": "read_uncommitted"})
    assert {v for _, v in uncommitted} >= set(aborted)


def test_retention_of_the_whole_log_deletes_remote_segments(broker, s3):
    topic = tiered_topic(broker, **{"retention.ms": "3000"})
    produce(broker, topic, [b"old-%04d-" % i + b"w" * 200 for i in range(400)])
    wait_for(lambda: any(k.endswith(".log") for k in objects(s3, topic)), timeout=30)
    copied = {k for k in objects(s3, topic) if k.endswith(".log")}
    # past retention.ms the remote segments go and the log start moves past them
    wait_for(lambda: list_offset(broker.bootstrap, topic, EARLIEST) > 0, timeout=30)
    wait_for(lambda: not copied & set(objects(s3, topic)), timeout=30)
    start = list_offset(broker.bootstrap, topic, EARLIEST)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": uuid.uuid4().hex,
                         "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, 0, 0)])  # below the log start: reset to earliest
    try:
        message = None
        deadline = time.monotonic() + 20
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
        assert message is not None and message.error() is None
        assert message.offset() >= start
    finally:
        consumer.close()


def test_deleting_a_tiered_topic_deletes_its_remote_objects(broker, s3):
    topic = tiered_topic(broker)
    produce(broker, topic, [b"gone-%04d-" % i + b"v" * 200 for i in range(300)])
    wait_for(lambda: len([k for k in objects(s3, topic) if k.endswith(".log")]) >= 3, timeout=30)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_topics([topic])[topic].result(15)
    wait_for(lambda: objects(s3, topic) == [], timeout=30)


@pytest.mark.parametrize(("configs", "message"), [
    ({"remote.storage.enable": "true", "cleanup.policy": "compact"}, "only supported for topics with cleanup.policy=delete"),
    ({"remote.storage.enable": "true", "retention.ms": "1000", "local.retention.ms": "5000"},
     "must not be more than retention.ms"),
])
def test_configs_kafka_refuses_for_tiered_topics(broker, configs, message):
    name = unique_name("refused")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    with pytest.raises(KafkaException, match=message):
        admin.create_topics([NewTopic(name, 1, 1, config=configs)])[name].result(15)


def test_a_restarted_broker_serves_the_remote_history(broker):
    topic = tiered_topic(broker)
    values = [b"kept-%04d-" % i + b"u" * 200 for i in range(500)]
    produce(broker, topic, values)
    wait_for(lambda: list_offset(broker.bootstrap, topic, EARLIEST_LOCAL) >= 300, timeout=30)
    assert broker.stop() == 0  # a clean stop with the remote log manager at work
    broker.restart()
    assert list_offset(broker.bootstrap, topic, EARLIEST) == 0
    got = read_all(broker, topic, len(values))
    assert [v for _, v in got] == values


def test_timestamps_are_looked_up_in_remote_segments_first(broker):
    topic = tiered_topic(broker)
    base = int(time.time() * 1000) - 3_600_000
    producer = Producer({"bootstrap.servers": broker.bootstrap, "batch.size": 1024, "linger.ms": 0})
    for i in range(600):
        producer.produce(topic, b"t-%04d-" % i + b"s" * 200, timestamp=base + 1000 * i)
        if i % 10 == 9:
            producer.flush(10)
    assert producer.flush(15) == 0
    wait_for(lambda: list_offset(broker.bootstrap, topic, EARLIEST_LOCAL) >= 400, timeout=30)
    local_start = list_offset(broker.bootstrap, topic, EARLIEST_LOCAL)
    for target in (0, 37, 123, local_start - 1, local_start + 5):
        assert list_offset(broker.bootstrap, topic, base + 1000 * target) == target
        assert list_offset(broker.bootstrap, topic, base + 1000 * target - 500) == target  # between two records
    assert list_offset(broker.bootstrap, topic, base - 5000) == 0
    assert list_offset(broker.bootstrap, topic, base + 1000 * 600) == -1  # later than every record


def alter(broker: BrokerProcess, topic: str, **configs: str) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource("TOPIC", topic, incremental_configs=[
        ConfigEntry(key.replace("_", "."), value, incremental_operation=AlterConfigOpType.SET)
        for key, value in configs.items()])
    admin.incremental_alter_configs([resource])[resource].result(15)


def test_copy_disable_keeps_remote_data_readable_and_turning_off_deletes_it(broker, s3):
    topic = tiered_topic(broker)
    values = [b"kip950-%04d-" % i + b"r" * 200 for i in range(400)]
    produce(broker, topic, values)
    wait_for(lambda: list_offset(broker.bootstrap, topic, EARLIEST_LOCAL) >= 200, timeout=30)
    # KIP-950: copying stops, what is remote stays readable
    alter(broker, topic, remote_log_copy_disable="true")
    # A copy already under way when the config lands still finishes (as in Kafka): what is
    # tiered is read once it has stayed put for a second (several task intervals).
    seen = [list_offset(broker.bootstrap, topic, LATEST_TIERED)]

    def settled() -> bool:
        time.sleep(0.25)
        seen.append(list_offset(broker.bootstrap, topic, LATEST_TIERED))
        return len(seen) >= 5 and len(set(seen[-5:])) == 1

    wait_for(settled, timeout=60, interval=0, what="copies under way to finish")
    tiered = seen[-1]
    more = [b"later-%04d-" % i + b"q" * 200 for i in range(200)]
    produce(broker, topic, more)
    time.sleep(1.5)  # several task intervals
    assert list_offset(broker.bootstrap, topic, LATEST_TIERED) == tiered
    assert [v for _, v in read_all(broker, topic, len(values) + len(more))] == values + more
    # turning remote storage off is refused unless its data goes with it ...
    with pytest.raises(KafkaException, match="remote storage can be turned off only with its data deleted"):
        alter(broker, topic, remote_storage_enable="false")
    # ... and with it, the remote objects are deleted and the log starts at its local start
    alter(broker, topic, remote_storage_enable="false", remote_log_delete_on_disable="true")
    wait_for(lambda: objects(s3, topic) == [], timeout=30)
    local_start = list_offset(broker.bootstrap, topic, EARLIEST_LOCAL)
    assert local_start > 0 and list_offset(broker.bootstrap, topic, EARLIEST) == local_start
    got = read_all(broker, topic, len(values) + len(more) - local_start)
    assert got[0][0] == local_start and [v for _, v in got] == (values + more)[local_start:]


def test_delete_records_below_the_local_log_deletes_remote_segments(broker, s3):
    topic = tiered_topic(broker)
    values = [b"dr-%04d-" % i + b"n" * 200 for i in range(500)]
    produce(broker, topic, values)
    wait_for(lambda: list_offset(broker.bootstrap, topic, EARLIEST_LOCAL) >= 400, timeout=30)
    copied = {k for k in objects(s3, topic) if k.endswith(".log")}
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    target = 250  # inside the remote part
    result = admin.delete_records([TopicPartition(topic, 0, target)])[TopicPartition(topic, 0, target)].result(15)
    assert result.low_watermark == target
    assert list_offset(broker.bootstrap, topic, EARLIEST) == target
    # the segments wholly below it leave the store; the one holding it stays
    below = {k for k in copied if int(k.rsplit("/", 1)[1].split("-", 1)[0]) < target}
    wait_for(lambda: len(below - set(objects(s3, topic))) >= len(below) - 1, timeout=30)
    got = read_all(broker, topic, len(values) - target, **{"auto.offset.reset": "earliest"})
    assert got[0][0] == target and [v for _, v in got] == values[target:]
