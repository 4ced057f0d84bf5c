"""RemoteLogMetadataManager against real brokers: an in-process Broker (its own event loop on
a thread, listening on 127.0.0.1) whose manager writes and reads `__remote_log_metadata` over
real Produce and Fetch requests on its own inter-broker connections; and a ZooKeeper cluster of
three broker processes beside such an in-process broker, whose metadata partition's leader is
killed between two writes."""

from __future__ import annotations

import asyncio
import logging
import tempfile
import threading
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import confluent_kafka.admin as kadmin
import pytest

from strom.config.broker import BrokerConfig
from strom.log.remote import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    RemoteStorageError,
)
from strom.log.remote.partitioner import metadata_partition, murmur2, topic_partition_hash
from strom.remote.metadata_manager import TOPIC, RemoteLogMetadataManager
from strom.server.broker import Broker
from strom.testing import Cluster, wait_for

S = RemoteLogSegmentState
METADATA_PARTITIONS = 5
NOW = 1_700_000_000_000


class InProcessBroker:
    """A Broker on an event loop of its own thread; `run` runs a coroutine there."""

    def __init__(self, data_dir: Path, overrides: dict[str, str]) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="in-process broker", daemon=True)
        self.thread.start()
        self.broker = Broker(BrokerConfig({"listeners": "PLAINTEXT://127.0.0.1:0",
                                           "log.dirs": str(data_dir / "logs"), **overrides}))
        self.run(self.broker.startup())

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn, *args) -> Any:
        """A plain function of the broker's objects, on its loop."""
        async def call() -> Any:
            return fn(*args)
        return self.run(call())

    def close(self) -> None:
        try:
            self.run(self.broker.shutdown())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


def new_manager(node: InProcessBroker) -> RemoteLogMetadataManager:
    return node.call(RemoteLogMetadataManager, node.broker)


def segment(key: tuple[uuid.UUID, str, int], start: int, epoch: int = 0, size: int = 1000) -> RemoteLogSegmentMetadata:
    topic_id, topic, partition = key
    return RemoteLogSegmentMetadata(RemoteLogSegmentId(topic_id, topic, partition), start, start + 99, NOW,
                                    0, NOW, ((epoch, start),), size)


def update(metadata: RemoteLogSegmentMetadata, state: RemoteLogSegmentState) -> RemoteLogSegmentMetadataUpdate:
    return RemoteLogSegmentMetadataUpdate(metadata.segment_id, NOW + 1, state, 0)


def sharing_partitions(n: int, count: int = 3) -> tuple[uuid.UUID, list[int], int]:
    """A topic id and `count` of its partitions that share one metadata partition (of n)."""
    topic_id = uuid.uuid4()
    by_index: dict[int, list[int]] = {}
    for p in range(1000):
        found = by_index.setdefault(metadata_partition(topic_id, p, n), [])
        found.append(p)
        if len(found) == count:
            return topic_id, found, metadata_partition(topic_id, p, n)
    raise AssertionError("no partitions share a metadata partition")


@pytest.fixture(scope="module")
def node():
    with tempfile.TemporaryDirectory(prefix="strom-rlmm-") as tmp:
        node = InProcessBroker(Path(tmp), {
            "rlmm.config.remote.log.metadata.topic.num.partitions": str(METADATA_PARTITIONS)})
        try:
            yield node
        finally:
            node.close()


@pytest.fixture
def manager(node):
    manager = new_manager(node)
    yield manager
    node.run(manager.close())


# --- where a partition's records go ---------------------------------------------------------------

def test_murmur2_is_kafkas():
    # Kafka's UtilsTest.testMurmur2 cases
    assert murmur2(b"21") == -973932308
    assert murmur2(b"foobar") == -790332482
    assert murmur2(b"a-little-bit-long-string") == -985981536
    assert murmur2(b"a-little-bit-longer-string") == -1486304829
    assert murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") == -58897971
    assert murmur2(b"abc") == 479470107


def test_metadata_partition_is_kafkas_partitioner():
    # Kafka's RemoteLogMetadataTopicPartitioner, by hand for topic id (msb 1, lsb 2), partition 3:
    # Objects.hash(lsb, msb, partition) = 31 * (31 * (31 * 1 + Long.hashCode(2)) + Long.hashCode(1)) + 3
    #                                   = 31 * (31 * 33 + 1) + 3 = 31747 = 0x00007c03,
    # written big-endian as 00 00 7c 03; murmur2 of those bytes is 1392720365 (the same in
    # kafka-python's port of Kafka's murmur2), positive already; 1392720365 % 50 = 15.
    topic_id = uuid.UUID(int=(1 << 64) | 2)
    assert topic_partition_hash(topic_id, 3) == 31747
    assert murmur2(bytes.fromhex("00007c03")) == 1392720365
    assert metadata_partition(topic_id, 3, 50) == 1392720365 % 50 == 15
    # Long.hashCode folds the high half into the low one (v ^ v >>> 32), on negative longs too:
    # msb 0xffffffff00000000 hashes to 0xffffffff; lsb 0 to 0. 31 * (31 * 31 + 0xffffffff) + 0
    # taken to 32 bits.
    topic_id = uuid.UUID(int=0xFFFFFFFF00000000 << 64)
    assert topic_partition_hash(topic_id, 0) == (31 * (31 * 31 + 0xFFFFFFFF)) & 0xFFFFFFFF
    # the topic's name plays no part, the manager's mapping is this one
    with pytest.raises(ValueError):
        metadata_partition(topic_id, 0, 0)


def test_manager_maps_with_the_topics_partition_count(node, manager):
    topic_id = uuid.uuid4()
    for p in range(20):
        assert manager.metadata_partition(topic_id, "any-name", p) == metadata_partition(
            topic_id, p, METADATA_PARTITIONS)


# --- writing and reading ------------------------------------------------------------------------

def test_publish_then_cache_shows_the_segment(node, manager):
    key = (uuid.uuid4(), "clicks", 0)
    node.run(manager.assign([key]))
    node.run(manager.wait_ready(*key, timeout_s=30))
    started = segment(key, 0)
    node.run(manager.publish(started))
    cache = manager.cache(*key)
    assert cache.segment(started.segment_id).state is S.COPY_SEGMENT_STARTED
    assert cache.segment_for(0, 50) is None  # not served before the copy finished
    node.run(manager.publish(update(started, S.COPY_SEGMENT_FINISHED)))
    served = manager.cache(*key).segment_for(0, 50)
    assert served is not None and served.segment_id == started.segment_id
    assert served.state is S.COPY_SEGMENT_FINISHED
    # the topic was made on first use, as configured
    topic = node.broker.metadata_cache.topics[TOPIC]
    assert len(topic.partitions) == METADATA_PARTITIONS
    configs = node.broker.config_repository.topics[TOPIC]
    assert configs["cleanup.policy"] == "delete" and configs["retention.ms"] == "-1"
    assert configs["retention.bytes"] == "-1" and configs["min.insync.replicas"] == "1"


def test_partitions_sharing_a_metadata_partition_stay_apart(node, manager):
    topic_id, (p1, p2, p3), index = sharing_partitions(METADATA_PARTITIONS)
    a, b, unassigned = (topic_id, "shared", p1), (topic_id, "shared", p2), (topic_id, "shared", p3)
    assert manager.metadata_partition(*a) == manager.metadata_partition(*b) == index
    node.run(manager.assign([a, b]))
    assert manager.followed_partitions() == [index]  # one reader for both
    seg_a, seg_b, seg_other = segment(a, 0), segment(b, 500), segment(unassigned, 0)
    for record in (seg_a, seg_b, seg_other, update(seg_a, S.COPY_SEGMENT_FINISHED),
                   update(seg_other, S.COPY_SEGMENT_FINISHED)):
        node.run(manager.publish(record))
    cache_a, cache_b = manager.cache(*a), manager.cache(*b)
    assert [m.segment_id for m in cache_a.all_segments()] == [seg_a.segment_id]
    assert [m.segment_id for m in cache_b.all_segments()] == [seg_b.segment_id]
    assert cache_a.segment_for(0, 10).segment_id == seg_a.segment_id
    assert cache_b.segment_for(0, 510) is None  # b's copy never finished
    assert manager.cache(*unassigned) is None
    with pytest.raises(RemoteStorageError):
        node.run(manager.wait_ready(*unassigned, timeout_s=0.1))


def test_another_manager_rebuilds_the_same_caches(node, manager):
    topic_id, partitions, _ = sharing_partitions(METADATA_PARTITIONS, 2)
    keys = [(topic_id, "rebuilt", p) for p in partitions] + [(uuid.uuid4(), "rebuilt-2", 7)]
    node.run(manager.assign(keys))
    for n, key in enumerate(keys):
        first = segment(key, 0, epoch=0)
        second = segment(key, 100, epoch=1)
        for record in (first, update(first, S.COPY_SEGMENT_FINISHED), second,
                       update(second, S.COPY_SEGMENT_FINISHED), update(first, S.DELETE_SEGMENT_STARTED)):
            node.run(manager.publish(record))
        if n == 0:
            node.run(manager.publish(RemotePartitionDeleteMetadata(
                key[0], key[1], key[2], RemotePartitionDeleteState.DELETE_PARTITION_MARKED, NOW, 0)))

    def state(m: RemoteLogMetadataManager, key) -> tuple:
        cache = m.cache(*key)
        return ([(s.segment_id, s.state) for s in cache.all_segments()],
                [s.segment_id for s in cache.unreferenced_segments()],
                cache.partition_delete_state, cache.highest_offset_for_epoch(1))

    before = {key: state(manager, key) for key in keys}
    assert before[keys[0]][2] is RemotePartitionDeleteState.DELETE_PARTITION_MARKED
    assert before[keys[1]][2] is None
    assert len(before[keys[0]][0]) == 2 and before[keys[0]][3] == 199
    other = new_manager(node)
    try:
        node.run(other.assign(keys))
        for key in keys:
            node.run(other.wait_ready(*key, timeout_s=30))
        assert {key: state(other, key) for key in keys} == before
    finally:
        node.run(other.close())


def test_a_refused_record_is_logged_and_skipped(node, manager, caplog):
    key = (uuid.uuid4(), "refused", 3)
    node.run(manager.assign([key]))
    started = segment(key, 0)
    node.run(manager.publish(started))
    with caplog.at_level(logging.WARNING, logger="strom.remote.metadata_manager"):
        # STARTED cannot go straight to DELETE_SEGMENT_FINISHED: refused by the cache
        node.run(manager.publish(update(started, S.DELETE_SEGMENT_FINISHED)))
        node.run(manager.publish(update(started, S.COPY_SEGMENT_FINISHED)))
    refused = [r for r in caplog.records if "skipped for refused-3" in r.getMessage()]
    assert len(refused) == 1 and "\n" not in refused[0].getMessage()
    assert "DELETE_SEGMENT_FINISHED" in refused[0].getMessage()
    assert manager.cache(*key).segment(started.segment_id).state is S.COPY_SEGMENT_FINISHED


def test_a_partition_assigned_later_reads_its_metadata_from_the_start(node, manager):
    topic_id, (p1, p2), _ = sharing_partitions(METADATA_PARTITIONS, 2)
    early, late = (topic_id, "late", p1), (topic_id, "late", p2)
    node.run(manager.assign([early]))
    seg_early, seg_late = segment(early, 0), segment(late, 0)
    for record in (seg_early, seg_late, update(seg_late, S.COPY_SEGMENT_FINISHED)):
        node.run(manager.publish(record))
    node.run(manager.assign([late]))
    cache = node.run(manager.wait_ready(*late, timeout_s=30))
    assert cache.segment_for(0, 0).segment_id == seg_late.segment_id
    # the early partition's records were not applied twice (a second STARTED after FINISHED
    # would be refused): it moves on as before
    node.run(manager.publish(update(seg_early, S.COPY_SEGMENT_FINISHED)))
    assert manager.cache(*early).segment_for(0, 99).segment_id == seg_early.segment_id


def test_unassign_stops_reading(node, manager):
    key = (uuid.uuid4(), "unassigned", 1)
    index = manager.metadata_partition(*key)
    node.run(manager.assign([key]))
    node.run(manager.wait_ready(*key, timeout_s=30))
    task = manager._followers[index].task
    assert manager.followed_partitions() == [index] and not task.done()
    manager.unassign([key])
    wait_for(task.done, 10, what="the tail task to end")
    assert task.cancelled()
    assert manager.followed_partitions() == []
    assert manager.cache(*key) is None
    # a write for a partition no longer assigned returns once written
    begin = time.monotonic()
    node.run(manager.publish(segment(key, 0)))
    assert time.monotonic() - begin < 5
    with pytest.raises(RemoteStorageError):
        node.run(manager.wait_ready(*key, timeout_s=0.1))


def test_closed_manager_refuses_to_publish(node):
    manager = new_manager(node)
    key = (uuid.uuid4(), "closed", 0)
    node.run(manager.assign([key]))
    node.run(manager.close())
    assert manager.followed_partitions() == []
    with pytest.raises(RemoteStorageError):
        node.run(manager.publish(segment(key, 0)))


# --- a cluster: the metadata partition's leader fails ---------------------------------------------

def test_publish_survives_the_loss_of_the_metadata_partitions_leader(tmp_path):
    with Cluster(3, session_timeout_ms=3000) as cluster:
        admin = kadmin.AdminClient({"bootstrap.servers": cluster.bootstrap})
        # The metadata topic on the three processes only, so its leader can be killed.
        new = kadmin.NewTopic(TOPIC, 2, replica_assignment=[[1, 2, 3], [2, 3, 1]], config={
            "cleanup.policy": "delete", "retention.ms": "-1", "min.insync.replicas": "2"})
        admin.create_topics([new])[TOPIC].result(30)
        node = InProcessBroker(tmp_path, {
            "zookeeper.connect": cluster.zk_connect, "broker.id": "4",
            "zookeeper.session.timeout.ms": "3000",
            "rlmm.config.remote.log.metadata.topic.num.partitions": "2"})
        try:
            manager = new_manager(node)
            key = (uuid.uuid4(), "tiered", 0)
            index = manager.metadata_partition(*key)
            node.run(manager.assign([key]))
            node.run(manager.wait_ready(*key, timeout_s=30))
            started = segment(key, 0)
            node.run(manager.publish(started))
            leader = node.call(lambda: node.broker.metadata_cache.partition(TOPIC, index).leader)
            assert leader in (1, 2, 3)
            cluster.brokers[leader].kill()
            node.run(manager.publish(update(started, S.COPY_SEGMENT_FINISHED), 60), timeout=70)
            new_leader = node.call(lambda: node.broker.metadata_cache.partition(TOPIC, index).leader)
            assert new_leader not in (leader, -1)
            assert manager.cache(*key).segment_for(0, 5).segment_id == started.segment_id
            # a manager reading afresh from the new leader sees the same
            other = new_manager(node)
            node.run(other.assign([key]))
            assert node.run(other.wait_ready(*key, timeout_s=30)).segment(started.segment_id).state \
                is S.COPY_SEGMENT_FINISHED
            node.run(other.close())
            node.run(manager.close())
        finally:
            node.close()
