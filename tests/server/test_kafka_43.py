"""Strom as a Kafka 4.3 broker: ApiVersions key by key against Kafka 4.3's table, kafka-python
taking it for 4.3, and each version 4.1-4.3 added over 4.0 that Strom serves, through a real client
where one speaks it (kafka-python's admin client: ListConfigResources v1, ListTransactions v2)
and by hand on the wire otherwise (kafka-python's producer and consumer stop at Produce v9,
Fetch v12, OffsetCommit/OffsetFetch v8; librdkafka 2.16 at Produce v10, Fetch v16,
OffsetCommit/OffsetFetch v9, ListOffsets v7). One broker for the module."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer
from kafka import KafkaAdminClient

from strom.client import Connection
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import encode_request
from strom.protocol.records import build_batch, iter_records
from strom.testing import (
    TIMESTAMP_BASE_MS,
    BrokerProcess,
    close_client,
    create_topic,
    produce_acked,
    tiered_overrides,
    unique_name,
    wait_for,
)

pytestmark = pytest.mark.timeout(120)

PRODUCE, FETCH, LIST_OFFSETS, METADATA, OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 0, 1, 2, 3, 8, 9, 10
API_VERSIONS, WRITE_TXN_MARKERS, LIST_CONFIG_RESOURCES = 18, 27, 74

# Kafka 4.3's ApiVersions answer on a client listener of a broker (KRaft; no client telemetry
# receiver configured), as the release advertises it: 4.2's, and DescribeLogDirs v5 (KIP-1066's
# cordoned log dirs).
KAFKA_4_3 = {
    0: (0, 13), 1: (4, 18), 2: (1, 11), 3: (0, 13), 8: (2, 10), 9: (1, 10), 10: (0, 6), 11: (0, 9),
    12: (0, 4), 13: (0, 5), 14: (0, 5), 15: (0, 6), 16: (0, 5), 17: (0, 1), 18: (0, 4), 19: (2, 7),
    20: (1, 6), 21: (0, 2), 22: (0, 5), 23: (2, 4), 24: (0, 5), 25: (0, 4), 26: (0, 5), 27: (1, 2),
    28: (0, 5), 29: (1, 3), 30: (1, 3), 31: (1, 3), 32: (1, 4), 33: (0, 2), 34: (1, 2), 35: (1, 5),
    36: (0, 2), 37: (0, 3), 38: (1, 3), 39: (1, 2), 40: (1, 2), 41: (1, 3), 42: (0, 2), 43: (0, 2),
    44: (0, 1), 45: (0, 1), 46: (0, 0), 47: (0, 0), 48: (0, 1), 49: (0, 1), 50: (0, 0), 51: (0, 0),
    55: (0, 2), 57: (0, 2), 60: (0, 2), 61: (0, 0), 64: (0, 0), 65: (0, 0), 66: (0, 2), 68: (0, 1),
    69: (0, 1), 74: (0, 1), 75: (0, 0), 76: (1, 1), 77: (1, 1), 78: (1, 2), 79: (1, 2), 80: (0, 1),
    81: (0, 0), 83: (0, 0), 84: (0, 0), 85: (0, 1), 86: (0, 0), 87: (0, 1), 88: (0, 0), 89: (0, 0),
    90: (0, 1), 91: (0, 0), 92: (0, 0),
}
# What this broker (ZooKeeper mode, Strom's default) leaves out of 4.3's table, and why.
NOT_SERVED = {
    55: "DescribeQuorum: KRaft only (a KRaft broker serves it)",
    64: "UnregisterBroker: KRaft only (a KRaft broker forwards it: tests/kraft/test_kraft_cluster.py)",
    80: "AddRaftVoter: KRaft only, served by Strom's controllers, not forwarded by its brokers",
    81: "RemoveRaftVoter: as AddRaftVoter",
    88: "StreamsGroupHeartbeat (KIP-1071): streams groups are not built",
    89: "StreamsGroupDescribe (KIP-1071): as StreamsGroupHeartbeat",
}
# What a ZooKeeper-mode broker adds: LeaderAndIsr, StopReplica, UpdateMetadata and
# ControlledShutdown at the versions Kafka 3.x's controller sends, and AlterPartition.
ZOOKEEPER_MODE = {4: (7, 7), 5: (4, 4), 6: (8, 8), 7: (3, 3), 56: (0, 1)}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """With tiered storage to a directory, for ListOffsets' earliest pending upload."""
    store = {"rsm.config.storage.root": str(tmp_path_factory.mktemp("remote"))}
    with BrokerProcess(overrides=tiered_overrides(store, **{
            "transaction.state.log.num.partitions": "1", "offsets.topic.num.partitions": "1",
            "group.initial.rebalance.delay.ms": "0"})) as b:
        yield b


@pytest.fixture(scope="module")
def topic(broker) -> tuple[str, uuid.UUID]:
    name = unique_name("kafka42")
    create_topic(broker.bootstrap, name, partitions=2)
    with Connection("127.0.0.1", broker.port) as conn:
        body = conn.call(METADATA, 12, {"topics": [{"name": name, "topic_id": None}], "allow_auto_topic_creation": False,
                                        "include_topic_authorized_operations": False})
    (t,) = body.topics
    assert t.error_code == 0 and t.topic_id != uuid.UUID(int=0)
    return name, t.topic_id


def advertised(port: int) -> dict[int, tuple[int, int]]:
    with Connection("127.0.0.1", port) as conn:
        body = conn.call(API_VERSIONS, 4, {"client_software_name": "t", "client_software_version": "1"})
    assert body.error_code == 0
    return {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}


def test_api_versions_are_kafka_4_3s_key_by_key(broker):
    got = advertised(broker.port)
    want = {k: v for k, v in KAFKA_4_3.items() if k not in NOT_SERVED} | ZOOKEEPER_MODE
    differences = {k: (got.get(k), want.get(k)) for k in sorted(got.keys() | want.keys()) if got.get(k) != want.get(k)}
    assert differences == {}, "api key: (Strom, expected)"


TELEMETRY = {71: (0, 0), 72: (0, 0)}  # GetTelemetrySubscriptions, PushTelemetry


def test_client_telemetry_is_advertised_only_with_a_place_for_pushed_metrics(broker):
    """Kafka needs a telemetry receiver for it; Strom's is the metrics endpoint (metrics.port)."""
    assert TELEMETRY.keys().isdisjoint(advertised(broker.port))
    with BrokerProcess(overrides={"metrics.port": "0"}) as with_metrics:
        got = advertised(with_metrics.port)
    assert {k: got.get(k) for k in TELEMETRY} == TELEMETRY


def test_produce_below_v3_is_advertised_but_refused(broker):
    """Produce from v0 in ApiVersions, for librdkafka's compression check (KAFKA-18659), but a
    v0-v2 request closes the connection, as Kafka 4 does."""
    assert advertised(broker.port)[PRODUCE] == (0, 13)
    with Connection("127.0.0.1", broker.port) as conn:
        conn.send_raw(encode_request(PRODUCE, 2, {"acks": 1, "timeout_ms": 1000, "topic_data": []}, 1, "t"))
        assert conn.read_frame() is None


def test_kafka_python_takes_strom_for_kafka_4_3(broker):
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        assert str(admin.get_broker_version_data(0)) == "<BrokerVersionData 4.3>"
    finally:
        admin.close()


def test_produce_v13_and_fetch_v18_name_topics_by_id(broker, topic):
    name, topic_id = topic
    unknown = uuid.uuid4()
    batch = build_batch([(b"k", b"by-id")], timestamp=TIMESTAMP_BASE_MS)  # not one retention deletes
    with Connection("127.0.0.1", broker.port) as conn:
        body = conn.call(PRODUCE, 13, {"transactional_id": None, "acks": -1, "timeout_ms": 10000, "topic_data": [
            {"topic_id": topic_id, "partition_data": [{"index": 1, "records": batch}]},
            {"topic_id": unknown, "partition_data": [{"index": 0, "records": batch}]}]})
        answers = {t.topic_id: [(p.index, p.error_code) for p in t.partition_responses] for t in body.responses}
        assert answers == {topic_id: [(1, ErrorCode.NONE)], unknown: [(0, ErrorCode.UNKNOWN_TOPIC_ID)]}
        base_offset = body.responses[0].partition_responses[0].base_offset

        body = conn.call(FETCH, 18, {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                                     "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [
            {"topic_id": topic_id, "partitions": [{"partition": 1, "fetch_offset": base_offset,
                                                   "partition_max_bytes": 1 << 20}]},
            {"topic_id": unknown, "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 100}]}],
            "forgotten_topics_data": [], "rack_id": ""})
    assert body.error_code == 0
    by_id = {t.topic_id: t.partitions[0] for t in body.responses}
    assert by_id[unknown].error_code == ErrorCode.UNKNOWN_TOPIC_ID
    read = by_id[topic_id]
    assert read.error_code == 0 and read.high_watermark == base_offset + 1
    assert [(r.key, r.value) for r in iter_records(bytes(read.records))] == [(b"k", b"by-id")]


def test_offset_commit_and_fetch_v10_by_topic_id(broker, topic):
    name, topic_id = topic
    group, unknown = unique_name("kafka42-group"), uuid.uuid4()
    with Connection("127.0.0.1", broker.port) as conn:
        wait_for(lambda: conn.call(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": [group]})
                 .coordinators[0].error_code == 0)  # the offsets topic made and loaded
        body = conn.call(OFFSET_COMMIT, 10, {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
                                             "group_instance_id": None, "topics": [
            {"topic_id": topic_id, "partitions": [{"partition_index": 0, "committed_offset": 42,
                                                   "committed_leader_epoch": -1, "committed_metadata": "m"}]},
            {"topic_id": unknown, "partitions": [{"partition_index": 0, "committed_offset": 1,
                                                  "committed_leader_epoch": -1, "committed_metadata": None}]}]})
        assert {t.topic_id: [(p.partition_index, p.error_code) for p in t.partitions] for t in body.topics} == {
            topic_id: [(0, ErrorCode.NONE)], unknown: [(0, ErrorCode.UNKNOWN_TOPIC_ID)]}

        def fetch(topics):
            body = conn.call(OFFSET_FETCH, 10, {"require_stable": False, "groups": [
                {"group_id": group, "member_id": None, "member_epoch": -1, "topics": topics}]})
            (g,) = body.groups
            assert g.error_code == 0
            return {t.topic_id: [(p.partition_index, p.committed_offset, p.metadata, p.error_code)
                                 for p in t.partitions] for t in g.topics}

        asked = fetch([{"topic_id": topic_id, "partition_indexes": [0, 1]}, {"topic_id": unknown, "partition_indexes": [0]}])
        assert asked == {topic_id: [(0, 42, "m", 0), (1, -1, "", 0)],
                         unknown: [(0, -1, "", ErrorCode.UNKNOWN_TOPIC_ID)]}
        assert fetch(None) == {topic_id: [(0, 42, "m", 0)]}  # every committed offset, under its topic's id
        # The same offset read by name at v9.
        body = conn.call(OFFSET_FETCH, 9, {"require_stable": False, "groups": [
            {"group_id": group, "member_id": None, "member_epoch": -1,
             "topics": [{"name": name, "partition_indexes": [0]}]}]})
        assert body.groups[0].topics[0].partitions[0].committed_offset == 42


def list_offsets(conn: Connection, name: str, version: int, timestamp: int) -> tuple[int, int]:
    body = conn.call(LIST_OFFSETS, version, {"replica_id": -1, "isolation_level": 0, "timeout_ms": 1000, "topics": [
        {"name": name, "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": timestamp}]}]})
    p = body.topics[0].partitions[0]
    return p.error_code, p.offset


def test_list_offsets_v11_earliest_pending_upload(broker, topic):
    """KIP-1023: the first offset not yet in remote storage. -1 for a topic that is not tiered;
    a tiered one's log start while nothing was copied, then the offset after the last copied."""
    name, _ = topic
    tiered = unique_name("kafka42-tiered")
    create_topic(broker.bootstrap, tiered, config={"remote.storage.enable": "true", "segment.bytes": "4096"})
    with Connection("127.0.0.1", broker.port) as conn:
        assert list_offsets(conn, name, 11, -6) == (ErrorCode.NONE, -1)
        assert list_offsets(conn, tiered, 11, -6) == (ErrorCode.NONE, 0)  # empty: its log start
        # Before v11 the timestamp is not one a client may ask for.
        assert list_offsets(conn, tiered, 10, -6)[0] == ErrorCode.UNSUPPORTED_VERSION
        produce_acked(broker.bootstrap, tiered, [bytes(1000)] * 20, batch_each=True)  # segments rolled at 4 KB
        wait_for(lambda: list_offsets(conn, tiered, 11, -5)[1] >= 0, what="a segment copied to remote storage")

        def pending_upload_after_the_last_copied() -> bool:
            # Copies go on meanwhile: compared when no copy landed between the two reads of -5.
            before = list_offsets(conn, tiered, 11, -5)[1]
            pending = list_offsets(conn, tiered, 11, -6)
            return list_offsets(conn, tiered, 11, -5)[1] == before and pending == (ErrorCode.NONE, before + 1)

        wait_for(pending_upload_after_the_last_copied, what="earliest pending upload = last copied + 1")


def test_list_config_resources_v1_through_kafka_python(broker, topic):
    name, _ = topic
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        everything = admin.list_config_resources()
        assert name in everything["topic"] and everything["broker"] == everything["broker_logger"] == ["0"]
        assert set(everything) <= {"topic", "broker", "broker_logger", "client_metrics", "group"}
        assert admin.list_config_resources(["TOPIC"]).keys() == {"topic"}
    finally:
        admin.close()
    with Connection("127.0.0.1", broker.port) as conn:
        body = conn.call(LIST_CONFIG_RESOURCES, 1, {"resource_types": [2, 64]})  # 64: no such resource type
        assert (body.error_code, body.config_resources) == (ErrorCode.UNSUPPORTED_VERSION, [])
        body = conn.call(LIST_CONFIG_RESOURCES, 0, {})  # v0: client metrics only, as before
        assert body.error_code == 0 and body.config_resources == []


def transactional_producer(broker, transactional_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": transactional_id})
    producer.init_transactions(30)
    return producer


def test_list_transactions_v2_pattern_through_kafka_python(broker):
    prefix = unique_name("kafka42-txn")
    producers = [transactional_producer(broker, f"{prefix}-{s}") for s in ("a", "b")]
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        listed = admin.list_transactions(transactional_id_pattern=f"{prefix}-a.*")
        assert [t.transactional_id for ts in listed.values() for t in ts] == [f"{prefix}-a"]
        both = admin.list_transactions(transactional_id_pattern=f"{prefix}-.")
        assert sorted(t.transactional_id for ts in both.values() for t in ts) == [f"{prefix}-a", f"{prefix}-b"]
        with Connection("127.0.0.1", broker.port) as conn:
            body = conn.call(66, 2, {"state_filters": [], "producer_id_filters": [], "duration_filter": -1,
                                     "transactional_id_pattern": "("})
            assert (body.error_code, body.transaction_states) == (ErrorCode.INVALID_REGULAR_EXPRESSION, [])
    finally:
        admin.close()
        for p in producers:
            close_client(p)


def test_write_txn_markers_v2_fences_a_transactions_v2_marker_at_the_same_epoch(broker, topic):
    """KIP-1228: a marker of a transactions-version-2 transaction must be above the epoch the
    partition saw; one of an older transaction version may equal it."""
    name, _ = topic
    producer = transactional_producer(broker, unique_name("kafka42-markers"))
    try:
        producer.begin_transaction()
        producer.produce(name, b"open", partition=0)
        producer.flush(30)
        with Connection("127.0.0.1", broker.port) as conn:
            body = conn.call(61, 0, {"topics": [{"name": name, "partition_indexes": [0]}]})  # DescribeProducers
            (state,) = [s for s in body.topics[0].partitions[0].active_producers if s.current_txn_start_offset >= 0]

            def marker(transaction_version: int, epoch: int) -> int:
                body = conn.call(WRITE_TXN_MARKERS, 2, {"markers": [{
                    "producer_id": state.producer_id, "producer_epoch": epoch, "transaction_result": False,
                    "topics": [{"name": name, "partition_indexes": [0]}], "coordinator_epoch": 0,
                    "transaction_version": transaction_version}]})
                return body.markers[0].topics[0].partitions[0].error_code

            assert marker(2, state.producer_epoch) == ErrorCode.INVALID_PRODUCER_EPOCH
            assert marker(1, state.producer_epoch) == ErrorCode.NONE  # ends it, as transactions v1 may
    finally:
        close_client(producer)


def test_fetch_v18_a_follower_behind_the_leaders_high_watermark_is_answered_at_once():
    """KIP-1166: the high watermark a v18 follower sends (a tagged field of each partition) is
    read from the frame, and a leader whose high watermark is further on answers without
    waiting; a partition the follower did not say it for, or is level with, does not."""
    from strom.protocol import messages
    from strom.protocol.fetch import PartitionData
    from strom.server.apis.fetch import _behind, _follower_high_watermarks

    def partition(index: int, **more) -> dict:
        return {"partition": index, "current_leader_epoch": 0, "fetch_offset": 5, "last_fetched_epoch": 0,
                "log_start_offset": 0, "partition_max_bytes": 1024, **more}

    topic_id = uuid.uuid4()
    frame = messages.encode_request(FETCH, 18, {
        "replica_state": {"replica_id": 2, "replica_epoch": 7}, "max_wait_ms": 500, "min_bytes": 1,
        "max_bytes": 1 << 20, "isolation_level": 0, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic_id": topic_id, "partitions": [partition(0, high_watermark=5), partition(1),
                                                          partition(2, high_watermark=-1)]}],
        "forgotten_topics_data": [], "rack_id": ""})[4:]
    request = messages.parse_request(frame).body
    requested = [(("t", p.partition), p) for t in request.topics for p in t.partitions]
    known = _follower_high_watermarks(requested)
    assert known == {("t", 0): 5, ("t", 2): -1}

    def answer(hw0: int, hw1: int, hw2: int) -> list:
        return [("t", [PartitionData(0, 0, hw0, hw0, 0), PartitionData(1, 0, hw1, hw1, 0),
                       PartitionData(2, 0, hw2, hw2, 0)])]

    assert not _behind({("t", 0): 5}, answer(5, 9, 9))  # level; partition 1 was not said
    assert _behind({("t", 0): 5}, answer(6, 5, 5))
    assert _behind(known, answer(5, 5, 0))  # -1: the follower does not know it


def test_offset_fetch_of_a_share_group_is_group_id_not_found(broker, topic):
    """A share group has no committed offsets: OffsetFetch answers as Kafka 4.2 does."""
    name, _ = topic
    group = unique_name("share-offsets")
    with Connection("127.0.0.1", broker.port) as conn:
        def joined():
            conn.call(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": [group]})
            answer = conn.call(76, 1, {"group_id": group, "member_id": str(uuid.uuid4()), "member_epoch": 0,
                                       "rack_id": None, "subscribed_topic_names": [name]})
            return answer.error_code == 0
        wait_for(joined, what="a share group member")
        body = conn.call(OFFSET_FETCH, 9, {"groups": [{"group_id": group, "member_id": None, "member_epoch": -1,
                                                         "topics": None}], "require_stable": False})
    assert [(g.group_id, g.error_code, g.topics) for g in body.groups] == [(group, ErrorCode.GROUP_ID_NOT_FOUND, [])]
