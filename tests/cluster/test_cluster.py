"""Three brokers and a controller on a real ZooKeeper: election and failover, fencing, topic
lifecycle across brokers, metadata on every broker, configs that reach every broker."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
)

from strom.protocol.errors import ErrorCode
from strom.testing import Cluster, RawClient, create_topic, unique_name

METADATA, INIT_PRODUCER_ID, PRODUCE = 3, 22, 0
LEADER_AND_ISR, UPDATE_METADATA, DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 4, 6, 32, 44


def metadata(broker, topics: list[str] | None = None):
    with RawClient(broker) as client:
        return client.call(METADATA, 12, {
            "topics": None if topics is None else [{"name": t, "topic_id": None} for t in topics],
            "allow_auto_topic_creation": False, "include_topic_authorized_operations": False})


def partition_view(broker, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
    """partition -> (leader, replicas, isr) as `broker` answers Metadata."""
    for t in metadata(broker, [topic]).topics:
        if t.name == topic and t.error_code == 0:
            return {p.partition_index: (p.leader_id, list(p.replica_nodes), list(p.isr_nodes))
                    for p in t.partitions}
    return {}


def live_brokers(cluster: Cluster) -> list:
    return [b for b in cluster.brokers.values() if b.proc is not None and b.proc.poll() is None]


def admin(cluster: Cluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


def create(cluster: Cluster, topic: str, partitions: int = 3, factor: int = 3, *,
           assignment: list[list[int]] | None = None, configs: dict[str, str] | None = None) -> None:
    """Create `topic` (`assignment`, a replica list per partition, replaces `partitions` and
    `factor`) and wait until every live broker knows it, each partition with a leader: the
    controller's broker answered; the others hear from the controller in their own time."""
    create_topic(cluster.bootstrap, topic, partitions, replication_factor=factor, config=configs,
                 assignment=assignment)
    cluster.wait_for(lambda: _same_view_everywhere(cluster, topic), 30, "the topic on every broker")


def log_dir(broker) -> Path:
    return Path(broker.overrides["log.dirs"])


def fill(cluster: Cluster, topic: str, count: int, partitions: int) -> None:
    """`count` small records spread round-robin over the partitions, all acknowledged."""
    producer = Producer({"bootstrap.servers": cluster.bootstrap})
    for i in range(count):
        producer.produce(topic, b"%d" % i, partition=i % partitions)
    assert producer.flush(30) == 0


def topic_dirs(broker, topic: str) -> list[Path]:
    return sorted(log_dir(broker).glob(f"{topic}-*"))


# --- controller election, failover, fencing ---------------------------------------------------

def test_one_controller_and_failover_after_kill(cluster):
    first = cluster.controller_id()
    epoch = cluster.controller_epoch()
    assert first in cluster.brokers and epoch >= 1
    for broker in cluster.brokers.values():  # every broker names the same controller
        cluster.wait_for(lambda b=broker: metadata(b).controller_id == first, 10, "metadata naming the controller")
    cluster.brokers[first].kill()
    cluster.wait_for(lambda: cluster.controller_id() not in (-1, first), 30, "a new controller")
    second = cluster.controller_id()
    assert cluster.controller_epoch() > epoch
    for broker in live_brokers(cluster):
        cluster.wait_for(lambda b=broker: metadata(b).controller_id == second, 10,
                         "metadata naming the new controller")
        assert first not in {n.node_id for n in metadata(broker).brokers}
    # The old controller comes back as an ordinary broker.
    cluster.brokers[first].start()
    cluster.wait_for(lambda: first in {n.node_id for n in metadata(cluster.brokers[second]).brokers}, 30,
                     "the old controller back in the cluster")
    assert cluster.controller_id() == second


@pytest.mark.shares_cluster
def test_stale_controller_and_broker_epochs_are_refused(cluster):
    topic = unique_name("fenced")
    create(cluster, topic, 1, 3)
    victim = next(b for i, b in cluster.brokers.items() if i != cluster.controller_id())
    epoch = cluster.controller_epoch()
    stale = {"controller_id": 99, "controller_epoch": epoch - 1, "broker_epoch": -1,
             "topic_states": [], "live_brokers": []}
    with RawClient(victim) as client:
        assert client.call(UPDATE_METADATA, 8, stale).error_code == ErrorCode.STALE_CONTROLLER_EPOCH
        # From the real controller (another one is refused outright: CLUSTER_AUTHORIZATION_FAILED).
        old_registration = {**stale, "controller_id": cluster.controller_id(), "controller_epoch": epoch,
                            "broker_epoch": 1}
        assert client.call(UPDATE_METADATA, 8, old_registration).error_code == ErrorCode.STALE_BROKER_EPOCH
        # A stale LeaderAndIsr cannot take a partition's leadership away either.
        response = client.call(LEADER_AND_ISR, 7, {
            "controller_id": 99, "controller_epoch": epoch - 1, "broker_epoch": -1, "request_type": 0,
            "topic_states": [{"topic_name": topic, "topic_id": uuid.uuid4(), "partition_states": [
                {"partition_index": 0, "controller_epoch": epoch - 1, "leader": 99, "leader_epoch": 99,
                 "isr": [99], "partition_epoch": 0, "replicas": [99], "adding_replicas": [],
                 "removing_replicas": [], "is_new": False}]}],
            "live_leaders": []})
        assert response.error_code == ErrorCode.STALE_CONTROLLER_EPOCH
    assert {p[0] for p in partition_view(victim, topic).values()} <= set(cluster.brokers)


def test_bounced_broker_gets_a_new_epoch_and_the_metadata(cluster):
    broker_id = next(i for i in cluster.brokers if i != cluster.controller_id())
    topic = unique_name("bounce")
    create(cluster, topic, 3, 3)
    zk = cluster.zk()
    epoch_before = zk.exists(f"/brokers/ids/{broker_id}").czxid
    cluster.brokers[broker_id].kill()
    cluster.brokers[broker_id].start()  # waits for the old registration to expire
    assert zk.exists(f"/brokers/ids/{broker_id}").czxid > epoch_before
    other = cluster.brokers[cluster.controller_id()]
    cluster.wait_for(lambda: partition_view(cluster.brokers[broker_id], topic) == partition_view(other, topic)
                     and partition_view(other, topic) != {}, 20, "the same metadata on the bounced broker")
    assert {n.node_id for n in metadata(cluster.brokers[broker_id]).brokers} == set(cluster.brokers)


# --- topics across brokers ----------------------------------------------------------------------

def _same_view_everywhere(cluster: Cluster, topic: str) -> bool:
    views = [partition_view(b, topic) for b in live_brokers(cluster)]
    return bool(views[0]) and all(v == views[0] for v in views) \
        and all(leader >= 0 for leader, _, _ in views[0].values())


def _check_assignment(view: dict, brokers: set[int], partitions: int, factor: int) -> None:
    assert sorted(view) == list(range(partitions))
    for leader, replicas, isr in view.values():
        assert len(set(replicas)) == factor and set(replicas) <= brokers
        assert leader == replicas[0] and sorted(isr) == sorted(replicas)
    # Kafka's assignment spreads leaders round-robin: each broker leads the same number.
    leaders = [v[0] for v in view.values()]
    assert {leaders.count(b) for b in brokers} == {partitions // len(brokers)}


def _create_with_kafka_python(bootstrap: str, topic: str) -> None:
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewTopic as KpNewTopic

    client = KafkaAdminClient(bootstrap_servers=bootstrap.split(","))
    try:
        client.create_topics([KpNewTopic(topic, 6, 3)])
    finally:
        client.close()


def _create_with_aiokafka(bootstrap: str, topic: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin import NewTopic as AioNewTopic

    async def run() -> None:
        client = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await client.start()
        try:
            await client.create_topics([AioNewTopic(topic, 6, 3)])
        finally:
            await client.close()

    asyncio.run(run())


@pytest.mark.shares_cluster
@pytest.mark.parametrize("client", ["confluent", "kafka-python", "aiokafka"])
def test_create_topic_rf3_with_each_client(cluster, client):
    topic = unique_name(f"rf3-{client}")
    if client == "confluent":
        create(cluster, topic, 6, 3)
    elif client == "kafka-python":
        _create_with_kafka_python(cluster.bootstrap, topic)
    else:
        _create_with_aiokafka(cluster.bootstrap, topic)
    # Brokers hear from the controller in their own time; they must all come to agree.
    cluster.wait_for(lambda: _same_view_everywhere(cluster, topic), 10, "the same metadata on every broker")
    views = [partition_view(b, topic) for b in cluster.brokers.values()]
    _check_assignment(views[0], set(cluster.brokers), 6, 3)
    # The assignment, its state and the topic id are in ZooKeeper as Kafka lays them out.
    zk = cluster.zk()
    assignment = json.loads(zk.get(f"/brokers/topics/{topic}")[0])
    assert {int(p): r for p, r in assignment["partitions"].items()} == {p: v[1] for p, v in views[0].items()}
    assert assignment["topic_id"]
    state = json.loads(zk.get(f"/brokers/topics/{topic}/partitions/0/state")[0])
    assert state["leader"] == views[0][0][0] and state["leader_epoch"] == 0
    assert state["controller_epoch"] == cluster.controller_epoch()
    # Each replica has the partition's log on its own disk.
    for p, (_, replicas, _) in views[0].items():
        for broker_id in replicas:
            assert (log_dir(cluster.brokers[broker_id]) / f"{topic}-{p}").is_dir()


def test_requests_to_a_follower_get_not_leader_and_clients_recover(cluster):
    topic = unique_name("follower")
    create(cluster, topic, 1, 3)
    leader, replicas, _ = partition_view(cluster.brokers[1], topic)[0]
    follower = cluster.brokers[next(r for r in replicas if r != leader)]
    batch = _one_record_batch(b"to-a-follower")
    with RawClient(follower) as client:
        response = client.call(PRODUCE, 9, {"transactional_id": None, "acks": 1, "timeout_ms": 5000,
                                           "topic_data": [{"name": topic, "partition_data": [
                                               {"index": 0, "records": batch}]}]})
    assert response.responses[0].partition_responses[0].error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER

    # A producer that knows the old leader: once leadership moves, it finds the new one itself.
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "1", "linger.ms": 0,
                         "message.timeout.ms": 60000})
    delivered: list[int] = []

    def send(value: bytes) -> None:
        producer.produce(topic, value, partition=0,
                         on_delivery=lambda err, msg: delivered.append(msg.offset()) if err is None else None)
        producer.flush(60)

    send(b"before")
    assert len(delivered) == 1
    cluster.brokers[leader].kill()
    survivor = next(b for b in live_brokers(cluster))
    cluster.wait_for(lambda: partition_view(survivor, topic).get(0, (leader,))[0] not in (leader, -1), 30,
                     "a new leader for the partition")
    new_leader = partition_view(survivor, topic)[0][0]
    assert new_leader in replicas and new_leader != leader
    send(b"after")
    assert len(delivered) == 2, "the producer re-routed to the new leader by itself"


def _one_record_batch(value: bytes) -> bytes:
    from strom.protocol.records import build_batch

    return bytes(build_batch([(None, value)], timestamp=int(time.time() * 1000)))


def test_delete_topic_while_a_replica_is_down(cluster):
    topic = unique_name("delete-down")
    create(cluster, topic, 2, 3)
    fill(cluster, topic, 20, 2)
    controller = cluster.controller_id()
    down_id = next(i for i in cluster.brokers if i != controller)
    down = cluster.brokers[down_id]
    assert len(topic_dirs(down, topic)) == 2
    down.kill()
    cluster.wait_for(lambda: down_id not in {n.node_id for n in metadata(cluster.brokers[controller]).brokers},
                     30, "the controller to notice the dead broker")
    client = admin(cluster)
    client.delete_topics([topic], operation_timeout=30)[topic].result(30)
    for broker in live_brokers(cluster):
        assert partition_view(broker, topic) == {}
        cluster.wait_for(lambda b=broker: topic_dirs(b, topic) == [], 20, "the live replicas' logs deleted")
    assert len(topic_dirs(down, topic)) == 2, "the dead broker kept its replicas"
    assert cluster.zk().exists(f"/admin/delete_topics/{topic}") is not None, "deletion waits for it"
    down.start()
    cluster.wait_for(lambda: topic_dirs(down, topic) == [], 30, "the returning broker's logs deleted")
    # The controller removes the topic's znodes one after another, as Kafka's does, the
    # deletion marker last: once it is gone, the topic is.
    cluster.wait_for(lambda: cluster.zk().exists(f"/admin/delete_topics/{topic}") is None, 30,
                     "the deletion marker gone from ZooKeeper")
    assert cluster.zk().exists(f"/brokers/topics/{topic}") is None
    assert partition_view(down, topic) == {}


@pytest.mark.shares_cluster
def test_create_partitions_reach_every_broker(cluster):
    topic = unique_name("grow")
    create(cluster, topic, 3, 2)
    admin_client = admin(cluster)
    admin_client.create_partitions([NewPartitions(topic, 6)])[topic].result(30)
    for broker in cluster.brokers.values():
        cluster.wait_for(lambda b=broker: len(partition_view(b, topic)) == 6, 10, "six partitions")
    view = partition_view(cluster.brokers[1], topic)
    assert all(len(replicas) == 2 and leader >= 0 for leader, replicas, _ in view.values())


@pytest.mark.shares_cluster
def test_auto_created_topic_uses_default_replication_factor(cluster):
    topic = unique_name("auto")
    producer = Producer({"bootstrap.servers": cluster.bootstrap})
    producer.produce(topic, b"hello")
    assert producer.flush(30) == 0
    view = partition_view(cluster.brokers[1], topic)
    assert len(view) == 3 and all(len(v[1]) == 3 for v in view.values())


# --- configs and ids across brokers -------------------------------------------------------------

def _describe(broker, resource_type: int, name: str, key: str) -> tuple[str | None, int]:
    with RawClient(broker) as client:
        response = client.call(DESCRIBE_CONFIGS, 4, {
            "resources": [{"resource_type": resource_type, "resource_name": name,
                           "configuration_keys": [key]}],
            "include_synonyms": False, "include_documentation": False})
    result = response.results[0]
    assert result.error_code == 0, result.error_message
    entry = result.configs[0]
    return entry.value, entry.config_source


@pytest.mark.shares_cluster
def test_config_altered_on_one_broker_is_seen_on_another(cluster):
    topic = unique_name("configs")
    create(cluster, topic, 1, 3)
    first = AdminClient({"bootstrap.servers": cluster.brokers[1].bootstrap})
    resource = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry("retention.ms", "123456", incremental_operation=AlterConfigOpType.SET)])
    first.incremental_alter_configs([resource])[resource].result(30)
    cluster.wait_for(lambda: _describe(cluster.brokers[3], 2, topic, "retention.ms")[0] == "123456", 20,
                     "the topic config on broker 3")
    # The cluster-wide dynamic default (resource name ""), set on broker 1, reaches broker 3.
    with RawClient(cluster.brokers[1]) as client:
        response = client.call(INCREMENTAL_ALTER_CONFIGS, 1, {"resources": [{
            "resource_type": 4, "resource_name": "", "configs": [
                {"name": "log.retention.ms", "config_operation": 0, "value": "7654321"}]}],
            "validate_only": False})
    assert response.responses[0].error_code == 0, response.responses[0].error_message
    cluster.wait_for(lambda: _describe(cluster.brokers[3], 4, "3", "log.retention.ms")[0] == "7654321", 20,
                     "the default broker config on broker 3")
    assert _describe(cluster.brokers[3], 4, "3", "log.retention.ms")[1] == 3  # DYNAMIC_DEFAULT_BROKER_CONFIG
    changes = cluster.zk().get_children("/config/changes")
    assert changes and all(c.startswith("config_change_") for c in changes)


@pytest.mark.shares_cluster
def test_producer_ids_are_unique_across_the_cluster(cluster):
    ids = []
    for broker in cluster.brokers.values():
        with RawClient(broker) as client:
            for _ in range(3):
                response = client.call(INIT_PRODUCER_ID, 4, {
                    "transactional_id": None, "transaction_timeout_ms": 60000,
                    "producer_id": -1, "producer_epoch": -1})
                assert response.error_code == 0
                ids.append(response.producer_id)
    assert len(set(ids)) == len(ids)
    block = json.loads(cluster.zk().get("/latest_producer_id_block")[0])
    assert block["block_end"] >= max(ids)


@pytest.mark.shares_cluster
def test_zookeeper_layout(cluster):
    zk = cluster.zk()
    assert json.loads(zk.get("/cluster/id")[0])["id"]
    cluster_ids = {metadata(b).cluster_id for b in cluster.brokers.values()}
    assert cluster_ids == {json.loads(zk.get("/cluster/id")[0])["id"]}
    registration = json.loads(zk.get("/brokers/ids/1")[0])
    assert registration["endpoints"] == [f"PLAINTEXT://127.0.0.1:{cluster.brokers[1].port}"]
    assert zk.exists("/brokers/ids/1").ephemeralOwner != 0
    assert zk.exists("/controller").ephemeralOwner != 0
    for path in ("/admin/delete_topics", "/config/topics", "/config/brokers", "/config/changes"):
        assert zk.exists(path) is not None, path


@pytest.mark.shares_cluster
def test_group_coordination_on_the_cluster(cluster):
    """__consumer_offsets is created with RF=3 across the brokers; a group commits and reads
    back its offsets through whichever broker coordinates it."""
    topic = unique_name("groups")
    create(cluster, topic, 3, 1)
    fill(cluster, topic, 30, 3)
    group = unique_name("group")
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        seen = 0
        deadline = time.monotonic() + 60
        while seen < 30 and time.monotonic() < deadline:
            msg = consumer.poll(1)
            if msg is not None and msg.error() is None:
                seen += 1
        assert seen == 30
        consumer.commit(asynchronous=False)
        committed = consumer.committed([TopicPartition(topic, p) for p in range(3)], timeout=30)
        assert sum(tp.offset for tp in committed) == 30
    finally:
        consumer.close()
    view = partition_view(cluster.brokers[1], "__consumer_offsets")
    assert len(view) == 6 and all(len(v[1]) == 3 for v in view.values())


@pytest.mark.shares_cluster
def test_features_are_finalized_by_the_controller_and_seen_by_every_broker(cluster):
    """/feature is written by the controller alone (others say NOT_CONTROLLER, as ZooKeeper-
    mode Kafka brokers do) and every broker reports what it holds, with its epoch."""
    api_versions, update_features = 18, 57

    def finalized(broker):
        with RawClient(broker) as client:
            body = client.call(api_versions, 3, {"client_software_name": "t", "client_software_version": "1"})
        return {f.name: f.max_version_level for f in body.finalized_features}, body.finalized_features_epoch

    data, _ = cluster.zk().get("/feature")
    assert json.loads(data) == {"version": 2, "status": 1, "features": {
        "group.version": {"max_version_level": 1}, "metadata.version": {"max_version_level": 25},
        "transaction.version": {"max_version_level": 2}, "share.version": {"max_version_level": 1}}}
    lower = {"timeout_ms": 10000, "validate_only": False, "feature_updates": [
        {"feature": "transaction.version", "max_version_level": 1, "upgrade_type": 2}]}
    other = next(b for i, b in cluster.brokers.items() if i != cluster.controller_id())
    with RawClient(other) as client:
        assert client.call(update_features, 1, lower).error_code == ErrorCode.NOT_CONTROLLER
    with RawClient(cluster.brokers[cluster.controller_id()]) as client:
        assert client.call(update_features, 1, lower).error_code == ErrorCode.NONE
    for broker_id, broker in cluster.brokers.items():
        cluster.wait_for(lambda b=broker: finalized(b) == (
            {"group.version": 1, "metadata.version": 25, "share.version": 1, "transaction.version": 1}, 1),
            what=f"broker {broker_id} reporting transaction.version 1 at epoch 1")
