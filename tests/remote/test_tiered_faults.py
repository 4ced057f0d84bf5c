"""Tiered storage when the object store misbehaves, against real processes: a store that stops
answering (SeaweedFS under SIGSTOP) holds back neither produce nor local reads, and no local
segment is deleted before it is uploaded; copying resumes by itself. What the store returns is
checked before it is served: a truncated or corrupted segment object is refused, never sent."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from strom.log import Log, LogConfig
from strom.log.remote import LogSegmentData, RemoteLogSegmentId, RemoteLogSegmentMetadata
from strom.protocol.records import build_value_batch
from strom.remote.directory import DirectoryStorage
from strom.remote.objects import SEGMENT_SUFFIX
from strom.remote.reader import CorruptRemoteData, IndexCache, RemoteReader
from strom.s3_server import S3Server
from strom.testing import (
    BrokerProcess,
    free_ports,
    list_offset,
    tiered_overrides,
    unique_name,
    wait_for,
)

EARLIEST_LOCAL, LATEST_TIERED = -4, -5


@pytest.fixture(scope="module")
def s3():
    with S3Server(ports=free_ports) as server:
        yield server




def tiered_topic(broker: BrokerProcess, base: str) -> str:
    topic = unique_name(base)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={
        "remote.storage.enable": "true", "segment.bytes": "4096", "local.retention.ms": "1"})])[topic].result(15)
    return topic


def produce(broker: BrokerProcess, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "batch.size": 1024, "linger.ms": 0, "acks": "all"})
    for i, value in enumerate(values):
        producer.produce(topic, value)
        if i % 10 == 9:
            producer.flush(10)
    assert producer.flush(15) == 0


def read_values(broker: BrokerProcess, topic: str, expected: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": uuid.uuid4().hex,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(out) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                out.append(message.value())
    finally:
        consumer.close()
    return out


def test_a_store_that_stops_answering_holds_back_nothing_and_loses_nothing(s3, tmp_path):
    overrides = tiered_overrides(s3.rsm_config(key_prefix=f"{uuid.uuid4().hex[:8]}/"), **{
        "rsm.config.storage.s3.api.call.attempt.timeout": "1000", "rsm.config.storage.s3.api.call.timeout": "2000"})
    with BrokerProcess(tmp_path, overrides) as broker:
        topic = tiered_topic(broker, "stalled")
        first = [b"before-%04d-" % i + b"c" * 200 for i in range(300)]
        produce(broker, topic, first)
        wait_for(lambda: list_offset(broker.bootstrap, topic, EARLIEST_LOCAL) >= 200, timeout=30)
        os.kill(s3.proc.pid, signal.SIGSTOP)
        try:
            tiered = list_offset(broker.bootstrap, topic, LATEST_TIERED)
            second = [b"during-%04d-" % i + b"d" * 200 for i in range(300)]
            produce(broker, topic, second)  # acknowledged while the store is away
            time.sleep(3)  # copy attempts fail by their timeouts meanwhile
            # nothing more is in remote storage, so nothing more may leave the local disk
            assert list_offset(broker.bootstrap, topic, LATEST_TIERED) == tiered
            assert list_offset(broker.bootstrap, topic, EARLIEST_LOCAL) == tiered + 1
            wait_for(lambda: "to remote storage" in broker.log_text() and "retried every" in broker.log_text(),
                     timeout=20)
        finally:
            os.kill(s3.proc.pid, signal.SIGCONT)
        # copying resumes by itself, and local retention follows
        wait_for(lambda: list_offset(broker.bootstrap, topic, EARLIEST_LOCAL) >= len(first) + 200, timeout=60)
        assert read_values(broker, topic, len(first) + len(second)) == first + second


def remote_segment(tmp_path: Path) -> tuple[DirectoryStorage, RemoteLogSegmentMetadata, bytes]:
    """A real segment of a Strom log (100 batches, one record each), copied to a directory store."""
    log = Log.open(tmp_path / "clicks-0", LogConfig(segment_bytes=1 << 20, index_interval_bytes=256))
    for i in range(100):
        log.append(bytearray(build_value_batch([b"value-%03d-" % i + b"e" * 100])), leader_epoch=3)
    log.roll()
    segment = log.segments[0]
    storage = DirectoryStorage(tmp_path / "remote")
    metadata = RemoteLogSegmentMetadata(RemoteLogSegmentId(uuid.uuid4(), "clicks", 0), 0, 99, 0, 1, 0,
                                        ((3, 0),), segment.size)
    index = b"".join(o.to_bytes(4, "big") + p.to_bytes(4, "big") for o, p in segment.offset_index.entries())
    storage.copy_log_segment_data(metadata, LogSegmentData(segment.log_path, index, b"", None, b"", b"0\n0\n"))
    data = segment.log_path.read_bytes()
    log.close()
    return storage, metadata, data


def test_remote_reads_return_whole_batches_and_refuse_damaged_objects(tmp_path):
    storage, metadata, data = remote_segment(tmp_path)
    reader = RemoteReader(storage, IndexCache(1 << 20))
    # from an offset inside the segment: whole batches from the one holding it, as the local read
    got = reader.read(metadata, 57, 1 << 20, True)
    assert data.endswith(got) and len(got) == len(data) * 43 // 100
    # max bytes short of one batch: one batch with min_one_message, none without
    one = reader.read(metadata, 10, 10, True)
    assert data.count(one) == 1 and len(one) == len(data) // 100
    assert reader.read(metadata, 10, 10, False) == b""
    key = storage._path(storage.key(metadata, SEGMENT_SUFFIX))
    corrupted = bytearray(data)
    corrupted[len(data) // 2 + 40] ^= 0xFF  # inside a batch's records
    key.write_bytes(bytes(corrupted))
    with pytest.raises(CorruptRemoteData, match="CRC"):
        reader.read(metadata, 0, 1 << 20, True)
    key.write_bytes(data[: len(data) // 2 + 7])  # truncated
    with pytest.raises(CorruptRemoteData):
        reader.read(metadata, 0, 1 << 20, True)
    shifted = bytearray(data)
    shifted[0] ^= 0x40  # the first batch's base offset, outside the segment's offsets
    key.write_bytes(bytes(shifted))
    with pytest.raises(CorruptRemoteData, match="no record batch"):
        reader.read(metadata, 0, 1 << 20, True)


def remote_metadata(broker: BrokerProcess, topic: str):
    """The topic's partition 0 as `__remote_log_metadata` says, read as a consumer."""
    from strom.log.remote import RemoteLogMetadataCache
    from strom.log.remote.records import deserialize

    cache = RemoteLogMetadataCache()
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": uuid.uuid4().hex,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    partitions = consumer.list_topics("__remote_log_metadata", timeout=10).topics["__remote_log_metadata"].partitions
    consumer.assign([TopicPartition("__remote_log_metadata", i, 0) for i in partitions])
    try:
        idle = 0
        while idle < 4:
            message = consumer.poll(0.5)
            if message is None:
                idle += 1
                continue
            if message.error() is not None:
                continue
            record = deserialize(message.value())
            name = record.segment_id.topic if hasattr(record, "segment_id") else record.topic
            if name == topic:
                cache.apply(record)
    finally:
        consumer.close()
    return cache


def stored_segment_ids(s3: S3Server, prefix: str, topic: str) -> set[str]:
    import obstore

    from strom.remote import storage_from_config

    store = storage_from_config(s3.rsm_config())._store
    keys = [o["path"] for batch in obstore.list(store, prefix=prefix.rstrip("/")) for o in batch
            if o["path"].startswith(f"{prefix}{topic}-")]
    return {key.rsplit("/", 1)[1].split("-", 1)[1].split(".", 1)[0] for key in keys}


def test_kill_9_during_copies_and_deletions_leaves_no_object_served_or_kept(s3, tmp_path):
    from strom.log.remote import RemoteLogSegmentState
    from strom.metadata.storage import kafka_uuid

    prefix = f"{uuid.uuid4().hex[:8]}/"
    overrides = tiered_overrides(s3.rsm_config(key_prefix=prefix), **{
        "remote.log.manager.task.interval.ms": "100",
        "remote.log.manager.copy.max.bytes.per.second": "30000"})  # copies spread over seconds
    rng = __import__("random").Random(7)
    with BrokerProcess(tmp_path, overrides) as broker:
        topic = tiered_topic(broker, "killed")
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        values = [b"acked-%04d-" % i + b"k" * 200 for i in range(700)]
        produce(broker, topic, values)
        for _ in range(3):  # kill -9 while segments are being copied
            time.sleep(rng.uniform(0.3, 1.2))
            broker.kill()
            broker.restart()
        wait_for(lambda: list_offset(broker.bootstrap, topic, EARLIEST_LOCAL) >= 650, timeout=60)
        assert read_values(broker, topic, len(values)) == values
        # unfinished copies are cleaned: what the store holds is exactly what is served
        def settled() -> bool:
            cache = remote_metadata(broker, topic)
            finished = {kafka_uuid(m.segment_id.id) for m in cache.all_segments()
                        if m.state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED}
            return bool(finished) and stored_segment_ids(s3, prefix, topic) == finished and \
                not cache.unreferenced_segments()
        wait_for(settled, timeout=30)
        # retention of the whole log deletes everything remote; kill -9 in the middle of it
        from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

        resource = ConfigResource("TOPIC", topic, incremental_configs=[
            ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([resource])[resource].result(15)
        time.sleep(0.15)
        broker.kill()
        broker.restart()
        wait_for(lambda: stored_segment_ids(s3, prefix, topic) == set(), timeout=60)
        wait_for(lambda: remote_metadata(broker, topic).all_segments() == [], timeout=30)
        assert list_offset(broker.bootstrap, topic, 0 - 2) >= list_offset(broker.bootstrap, topic, EARLIEST_LOCAL) - 1


def test_a_store_answering_errors_and_truncated_bodies_serves_nothing_wrong(s3, tmp_path):
    """One request in four answered 503, one in ten cut short after half its body: copies and
    reads are retried (the S3 client's backoff, then the next task or fetch), and every record
    comes back once, in order, from offset 0."""
    from faulty_s3 import FaultyS3Proxy

    with FaultyS3Proxy(s3.endpoint_url, fail=0.25, truncate=0.1, seed=5) as proxy:
        overrides = tiered_overrides(s3.rsm_config(key_prefix=f"{uuid.uuid4().hex[:8]}/"),
                                     **{"rsm.config.storage.s3.endpoint.url": proxy.endpoint_url})
        with BrokerProcess(tmp_path, overrides) as broker:
            topic = tiered_topic(broker, "faulty")
            values = [b"flaky-%04d-" % i + b"f" * 200 for i in range(400)]
            produce(broker, topic, values)
            wait_for(lambda: list_offset(broker.bootstrap, topic, EARLIEST_LOCAL) >= 300, timeout=90)
            for _ in range(2):  # many ranged GETs through the proxy, some of them failing
                assert read_values(broker, topic, len(values)) == values
        assert proxy.counts["failed"] > 5 and proxy.counts["truncated"] > 2, proxy.counts
