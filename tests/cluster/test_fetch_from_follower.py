"""Fetch from the closest replica (KIP-392) on a real three-broker cluster, one broker per rack
(a, b, c), on ZooKeeper and on KRaft, with Kafka's RackAwareReplicaSelector: a confluent-kafka
consumer with client.rack=b reads a topic led by the rack-a broker from the rack-b follower,
through a restart of that follower; consumers with no rack, or in the leader's rack, read from
the leader. Which broker served a consumer is read from each broker's BytesOut per topic."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import KafkaError, Producer, TopicPartition

from strom.log import Log, LogConfig
from strom.protocol.errors import ErrorCode
from strom.protocol.records import build_batch
from strom.replication.partition import Partition
from strom.replication.replica_manager import ReplicaManager
from strom.replication.replica_selector import (
    ClientMetadata,
    RackAwareReplicaSelector,
    ReadPreference,
    ReplicaView,
    replica_selector,
)
from strom.testing import (
    Cluster,
    RawClient,
    consume_all,
    create_topic,
    metric_value,
    produce_acked,
    reading_consumer,
    scrape,
    unique_name,
    wait_for,
)

from .conftest import CLUSTER_OVERRIDES

CLUSTER_MODES = ("zookeeper", "kraft")
FETCH = 1
RACKS = {1: "a", 2: "b", 3: "c"}
LEADER, FOLLOWER = 1, 2  # the rack-a leader and the rack-b follower


@pytest.fixture(scope="module")
def racked(zookeeper):
    cluster = Cluster(3, zookeeper=zookeeper, overrides={
        **CLUSTER_OVERRIDES, "metrics.port": "0",
        "replica.selector.class": "org.apache.kafka.common.replica.RackAwareReplicaSelector"})
    for broker_id, rack in RACKS.items():
        cluster.brokers[broker_id].overrides["broker.rack"] = rack
    with cluster:
        yield cluster


def bytes_out(cluster: Cluster, broker_id: int, topic: str) -> float:
    """Record bytes the broker sent consumers from `topic` since it started (0: none)."""
    samples = scrape(cluster.brokers[broker_id].metrics_url)
    return samples.get(("strom_topic_bytes_out_total", frozenset({("topic", topic)})), 0.0)


def in_sync(cluster: Cluster) -> bool:
    """Every partition the rack-a broker leads has all its replicas in its ISR."""
    samples = scrape(cluster.brokers[LEADER].metrics_url)
    return metric_value(samples, "strom_under_replicated_partitions") == 0


def values(n: int, start: int = 0) -> list[bytes]:
    return [f"{i:06d}".encode() * 16 for i in range(start, start + n)]


def test_a_consumer_in_rack_b_reads_from_the_rack_b_follower_through_its_restart(racked):
    topic = unique_name("closest")
    create_topic(racked.bootstrap, topic, replication_factor=3, assignment=[[LEADER, FOLLOWER, 3]])
    first = values(200)
    produce_acked(racked.bootstrap, topic, first, acks="all")
    consumer = reading_consumer(racked.bootstrap, **{"client.rack": "b"})
    read: list[bytes] = []

    def read_until(n: int, what: str) -> None:
        deadline = time.monotonic() + 60
        while len(read) < n:
            assert time.monotonic() < deadline, f"read {len(read)} of {n} records ({what})"
            for msg in consumer.consume(500, 0.2):
                err = msg.error()
                if err is None:
                    read.append(msg.value())
                elif err.fatal() or err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                    raise AssertionError(f"consumer error: {err}")

    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        read_until(len(first), "before the restart")
        # The leader only named the follower: every record byte came from rack b.
        assert bytes_out(racked, LEADER, topic) == 0
        assert bytes_out(racked, 3, topic) == 0
        assert bytes_out(racked, FOLLOWER, topic) >= sum(map(len, first))

        follower = racked.brokers[FOLLOWER]
        follower.stop()  # a clean shutdown: it leaves the ISR
        during = values(50, len(first))
        produce_acked(racked.bootstrap, topic, during, acks="all")
        follower.restart()  # its counters start again from 0
        wait_for(lambda: in_sync(racked), timeout=60, what="the restarted follower back in the ISR")
        after = values(200, len(first) + len(during))
        produce_acked(racked.bootstrap, topic, after, acks="all")
        read_until(len(first) + len(during) + len(after), "through the restart")
        assert read == first + during + after  # each record once, in order
        # Back on the rack-b follower: it served at least what was written once it was in sync.
        wait_for(lambda: bytes_out(racked, FOLLOWER, topic) >= sum(map(len, after)), timeout=10,
                 what="the follower's bytes out after its restart")
        assert bytes_out(racked, 3, topic) == 0
    finally:
        consumer.close()


@pytest.mark.parametrize("conf", [{}, {"client.rack": "a"}, {"client.rack": "nowhere"}],
                         ids=["no-rack", "leader-rack", "unknown-rack"])
def test_other_consumers_read_from_the_leader(racked, conf):
    topic = unique_name("leader-read")
    create_topic(racked.bootstrap, topic, replication_factor=3, assignment=[[LEADER, FOLLOWER, 3]])
    written = values(100)
    produce_acked(racked.bootstrap, topic, written, acks="all")
    got = [m.value() for m in consume_all(racked.bootstrap, topic, count=len(written), **conf)]
    assert got == written
    assert bytes_out(racked, LEADER, topic) >= sum(map(len, written))
    assert bytes_out(racked, FOLLOWER, topic) == 0 and bytes_out(racked, 3, topic) == 0


def test_read_committed_from_the_follower_skips_aborted_records(racked):
    """The follower indexes the aborts it copies and bounds reads by its last stable offset."""
    topic = unique_name("committed")
    create_topic(racked.bootstrap, topic, replication_factor=3, assignment=[[LEADER, FOLLOWER, 3]])
    producer = Producer({"bootstrap.servers": racked.bootstrap, "transactional.id": unique_name("txn")})
    producer.init_transactions(30)
    kept, dropped = values(20), values(20, 20)
    for batch, commit in ((kept[:10], True), (dropped, False), (kept[10:], True)):
        producer.begin_transaction()
        for value in batch:
            producer.produce(topic, value, partition=0)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
    got = [m.value() for m in consume_all(racked.bootstrap, topic, count=len(kept), **{
        "client.rack": "b", "isolation.level": "read_committed"})]
    assert got == kept
    assert bytes_out(racked, LEADER, topic) == 0 and bytes_out(racked, FOLLOWER, topic) > 0


def fetch(broker, topic: str, version: int, rack: str, offset: int = 0, leader_epoch: int = -1):
    """One consumer Fetch of partition 0 (no session), answered at once: that partition's answer."""
    with RawClient(broker) as client:
        body = client.call(FETCH, version, {
            "replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": rack,
            "topics": [{"topic": topic, "partitions": [{
                "partition": 0, "current_leader_epoch": leader_epoch, "fetch_offset": offset,
                "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]})
    assert body.error_code == 0
    return body.responses[0].partitions[0]


def test_what_leader_and_follower_answer_a_consumer(racked):
    topic = unique_name("answers")
    create_topic(racked.bootstrap, topic, replication_factor=3, assignment=[[LEADER, FOLLOWER, 3]])
    produce_acked(racked.bootstrap, topic, values(10), acks="all")
    leader, follower = racked.brokers[LEADER], racked.brokers[FOLLOWER]
    wait_for(lambda: fetch(follower, topic, 12, "b").high_watermark == 10, timeout=10,
             what="the follower's high watermark")
    # The leader names the rack-b follower and reads nothing; asked without a rack, it reads.
    redirected = fetch(leader, topic, 12, "b")
    assert (redirected.error_code, redirected.preferred_read_replica, redirected.high_watermark) == (0, FOLLOWER, 10)
    assert not redirected.records
    direct = fetch(leader, topic, 12, "")
    assert (direct.error_code, direct.preferred_read_replica) == (0, -1) and direct.records
    # The follower serves v11+ consumers up to its high watermark, and never redirects them.
    served = fetch(follower, topic, 12, "b")
    assert (served.error_code, served.preferred_read_replica) == (0, -1) and served.records
    assert fetch(follower, topic, 12, "b", offset=10).records in (None, b"")  # at its high watermark
    assert fetch(follower, topic, 12, "b", offset=11).error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert fetch(follower, topic, 12, "b", leader_epoch=5).error_code == ErrorCode.UNKNOWN_LEADER_EPOCH
    # Before v11 a consumer reads from the leader only.
    assert fetch(follower, topic, 10, "").error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER


# -- the rack-aware rule itself -------------------------------------------------------------

def _client(rack: str) -> ClientMetadata:
    return ClientMetadata(rack, "c", "127.0.0.1", "PLAINTEXT")


LEADER_VIEW = ReplicaView(1, "a", 100, 0)
B_BEHIND, B_AHEAD, C = ReplicaView(2, "b", 90, 50), ReplicaView(4, "b", 100, 20), ReplicaView(3, "c", 100, 0)


@pytest.mark.parametrize(("rack", "replicas", "expected"), [
    ("", [LEADER_VIEW, B_AHEAD], LEADER_VIEW),  # no rack: the leader
    ("a", [LEADER_VIEW, B_AHEAD], LEADER_VIEW),  # the leader's rack
    ("z", [LEADER_VIEW, B_AHEAD, C], LEADER_VIEW),  # no replica there
    ("c", [LEADER_VIEW, B_AHEAD, C], C),
    ("b", [LEADER_VIEW, B_BEHIND, B_AHEAD], B_AHEAD),  # the largest log end of the rack
    ("b", [LEADER_VIEW, ReplicaView(2, "b", 100, 70), B_AHEAD], B_AHEAD),  # then the latest caught up
], ids=["no-rack", "leader-rack", "no-replica-there", "follower", "most-caught-up", "latest-caught-up"])
def test_rack_aware_selector(rack, replicas, expected):
    assert RackAwareReplicaSelector().select("t", 0, _client(rack), LEADER_VIEW, replicas) == expected


def test_the_leader_names_only_reachable_in_sync_followers_that_have_the_offset(tmp_path):
    rm = ReplicaManager(1, log_manager=None)
    rm.alter_isr = lambda _partition, _isr: None
    partition = Partition("t", 0, uuid.uuid4(), 1, Log.open(tmp_path / "t-0", LogConfig()))
    partition.make_leader(0, [1, 2, 3], [1, 2, 3])
    rm._host(partition)
    assert rm.append_records(1, [(("t", 0), bytearray(build_batch([(None, b"v")] * 10)))])[("t", 0)].error == 0
    for replica in (2, 3):
        rm.read(("t", 0), 10, 1 << 20, True, replica_id=replica)  # both caught up

    def preferred(rack: str, offset: int = 5, racks: dict | None = None) -> int:
        preference = ReadPreference(_client(rack), RackAwareReplicaSelector(), racks or RACKS)
        return rm.preferred_read_replica(partition, offset, preference)

    assert (preferred("b"), preferred("c"), preferred("a"), preferred("")) == (2, 3, -1, -1)
    assert preferred("b", offset=11) == -1  # past every follower's log end: the leader
    assert preferred("b", racks={1: "a", 3: "c"}) == -1  # broker 2 unreachable on the listener
    partition.isr = [1, 3]  # out of the ISR: it may lag without end
    assert preferred("b") == -1 and preferred("c") == 3
    read = rm.read(("t", 0), 5, 1 << 20, True, fetch_only_leader=False,
                   preference=ReadPreference(_client("c"), RackAwareReplicaSelector(), RACKS))
    assert (read.preferred_read_replica, read.records, read.high_watermark) == (3, None, 10)
    partition.log.close()


def test_selector_names():
    assert replica_selector(None) is None and replica_selector("") is None
    assert isinstance(replica_selector("org.apache.kafka.common.replica.RackAwareReplicaSelector"),
                      RackAwareReplicaSelector)
    with pytest.raises(ValueError):
        replica_selector("no.such.Selector")
