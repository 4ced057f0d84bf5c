"""Three brokers and their controller, on a real ZooKeeper and on a KRaft quorum of combined
nodes: election and failover, fencing, topic lifecycle across brokers, metadata on every
broker, configs that reach every broker.

Each test checks what a user sees through the Kafka protocol, the same in both modes; in
ZooKeeper mode it also checks where Kafka keeps the same facts in ZooKeeper (`zookeeper_of`)."""

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

from strom.client import Connection
from strom.controller import znodes
from strom.protocol.errors import ErrorCode
from strom.testing import Cluster, RawClient, create_topic, unique_name

CLUSTER_MODES = ("zookeeper", "kraft")

METADATA, INIT_PRODUCER_ID, PRODUCE = 3, 22, 0
LEADER_AND_ISR, UPDATE_METADATA, DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 4, 6, 32, 44
BEGIN_QUORUM_EPOCH, DESCRIBE_CLUSTER, BROKER_HEARTBEAT = 53, 60, 63
FENCED_LEADER_EPOCH = 74


def zookeeper_of(cluster: Cluster):
    """ZooKeeper mode: a kazoo client on the cluster's chroot, to check also what Kafka keeps
    in ZooKeeper; KRaft mode (the same facts are records of the metadata log): None."""
    return None if cluster.kraft else cluster.zk()


def controller_call(cluster: Cluster, node_id: int, api_key: int, version: int, body: dict):
    """A request to KRaft node `node_id`'s controller listener."""
    with Connection("127.0.0.1", cluster.quorum.ports[node_id]) as conn:
        return conn.call(api_key, version, body)


def named_controller(cluster: Cluster, broker_id: int) -> int:
    """The active controller as node `broker_id` names it. ZooKeeper mode: its Metadata's
    controller_id. KRaft: the leader its controller listener names in DescribeCluster (KIP-919,
    as `kafka-metadata-quorum --bootstrap-controller` asks); a KRaft broker's Metadata names a
    random live broker instead, as Kafka 4's do."""
    if not cluster.kraft:
        return metadata(cluster.brokers[broker_id]).controller_id
    body = controller_call(cluster, broker_id, DESCRIBE_CLUSTER, 1,
                           {"include_cluster_authorized_operations": False, "endpoint_type": 2})
    assert body.error_code == 0, body.error_message
    return body.controller_id


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
    for broker_id in cluster.brokers:  # every node names the same controller
        cluster.wait_for(lambda b=broker_id: named_controller(cluster, b) == first, 10,
                         f"node {broker_id} naming the controller")
    topic = unique_name("failover")
    create(cluster, topic, 3, 3)  # the controller follows the partitions it does not lead
    cluster.brokers[first].kill()
    cluster.wait_for(lambda: cluster.controller_id() not in (-1, first), 30, "a new controller")
    second = cluster.controller_id()
    assert cluster.controller_epoch() > epoch
    # The dead controller leaves every ISR, led by survivors, at the new controller's hands (a
    # ZooKeeper controller at its failover: no broker change tells it of the death), well
    # before its leaders would drop it themselves (replica.lag.time.max.ms, 30 s): acks=all
    # producers stop waiting for it.
    cluster.wait_for(lambda: all(first not in isr and leader not in (-1, first) for leader, _, isr
                                 in partition_view(cluster.brokers[second], topic).values()), 20,
                     "the dead controller out of every ISR")
    for broker_id, broker in cluster.brokers.items():
        if broker_id == first:
            continue
        cluster.wait_for(lambda b=broker_id: named_controller(cluster, b) == second, 10,
                         f"node {broker_id} naming the new controller")
        # ZooKeeper: the dead broker's session expired; KRaft: it is fenced, its heartbeats
        # missing for broker.session.timeout.ms. Either way clients are no longer sent to it.
        cluster.wait_for(lambda b=broker: first not in {n.node_id for n in metadata(b).brokers}, 30,
                         "the dead controller gone from metadata")
    # The old controller comes back as an ordinary broker.
    cluster.brokers[first].start()
    cluster.wait_for(lambda: first in {n.node_id for n in metadata(cluster.brokers[second]).brokers}, 30,
                     "the old controller back in the cluster")
    assert cluster.controller_id() == second


@pytest.mark.shares_cluster
def test_stale_controller_and_broker_epochs_are_refused(cluster):
    topic = unique_name("fenced")
    create(cluster, topic, 1, 3)
    victim_id = next(i for i in cluster.brokers if i != cluster.controller_id())
    victim = cluster.brokers[victim_id]
    before = partition_view(victim, topic)
    if cluster.kraft:
        _stale_epochs_refused_by_the_quorum(cluster, victim_id)
    else:
        _stale_epochs_refused_by_a_zookeeper_broker(cluster, victim, topic)
    assert partition_view(victim, topic) == before


def _stale_epochs_refused_by_the_quorum(cluster: Cluster, victim_id: int) -> None:
    """KRaft: the controller epoch is the quorum's leader epoch, the broker epoch the offset of
    the broker's registration. A leader of an older epoch is refused by a voter; a heartbeat
    with anything but the broker's current epoch is refused by the active controller."""
    controller, epoch = cluster.controller_id(), cluster.controller_epoch()
    body = controller_call(cluster, victim_id, BEGIN_QUORUM_EPOCH, 1, {
        "cluster_id": cluster.quorum.cluster_id, "voter_id": victim_id, "leader_endpoints": [],
        "topics": [{"topic_name": "__cluster_metadata", "partitions": [
            {"partition_index": 0, "voter_directory_id": uuid.UUID(int=0), "leader_id": 99,
             "leader_epoch": epoch - 1}]}]})
    answer = body.topics[0].partitions[0]
    assert answer.error_code == FENCED_LEADER_EPOCH
    assert (answer.leader_id, answer.leader_epoch) == (controller, epoch)
    broker_epoch = cluster.broker_epoch(victim_id)
    assert broker_epoch >= 0
    for stale in (broker_epoch - 1, broker_epoch + 1):
        body = controller_call(cluster, controller, BROKER_HEARTBEAT, 1, {
            "broker_id": victim_id, "broker_epoch": stale, "current_metadata_offset": 1 << 40,
            "want_fence": False, "want_shut_down": False})
        assert body.error_code == ErrorCode.STALE_BROKER_EPOCH
    assert (cluster.controller_id(), cluster.controller_epoch()) == (controller, epoch)


def _stale_epochs_refused_by_a_zookeeper_broker(cluster: Cluster, victim, topic: str) -> None:
    """ZooKeeper: a broker refuses UpdateMetadata and LeaderAndIsr of an older controller
    epoch, and of its own older registration."""
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


def test_bounced_broker_gets_a_new_epoch_and_the_metadata(cluster):
    broker_id = next(i for i in cluster.brokers if i != cluster.controller_id())
    topic = unique_name("bounce")
    create(cluster, topic, 3, 3)
    epoch_before = cluster.broker_epoch(broker_id)
    assert epoch_before >= 0
    cluster.brokers[broker_id].kill()
    cluster.brokers[broker_id].start()  # ZooKeeper: waits for the old registration to expire
    cluster.wait_for(lambda: cluster.broker_epoch(broker_id) > epoch_before, 30, "a new broker epoch")
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
    # One topic id, the same on every broker, and every partition at its first leader epoch.
    described = [next(t for t in metadata(b, [topic]).topics if t.name == topic) for b in cluster.brokers.values()]
    topic_ids = {t.topic_id for t in described}
    assert len(topic_ids) == 1 and topic_ids != {uuid.UUID(int=0)}
    assert {p.leader_epoch for t in described for p in t.partitions} == {0}
    if (zk := zookeeper_of(cluster)) is not None:
        # The assignment, its state and the topic id are in ZooKeeper as Kafka lays them out.
        assignment = json.loads(zk.get(f"/brokers/topics/{topic}")[0])
        assert {int(p): r for p, r in assignment["partitions"].items()} == {p: v[1] for p, v in views[0].items()}
        assert znodes.decode_assignment(assignment)[0] in topic_ids
        state = json.loads(zk.get(f"/brokers/topics/{topic}/partitions/0/state")[0])
        assert state["leader"] == views[0][0][0] and state["leader_epoch"] == 0
        assert state["controller_epoch"] == cluster.controller_epoch()
    # Each replica has the partition's log on its own disk once the partition is written (a
    # new log makes no files before): the leader's made by the produce, the followers' by the
    # replicated batch.
    fill(cluster, topic, 6, 6)
    for p, (_, replicas, _) in views[0].items():
        for broker_id in replicas:
            made = log_dir(cluster.brokers[broker_id]) / f"{topic}-{p}"
            cluster.wait_for(made.is_dir, 20, f"broker {broker_id}'s log of partition {p}")


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
    zk = zookeeper_of(cluster)
    if zk is not None:  # ZooKeeper-mode Kafka finishes a deletion only once every replica is gone
        assert zk.exists(f"/admin/delete_topics/{topic}") is not None, "deletion waits for it"
    down.start()
    cluster.wait_for(lambda: topic_dirs(down, topic) == [], 30, "the returning broker's logs deleted")
    if zk is not None:
        # The controller removes the topic's znodes one after another, as Kafka's does, the
        # deletion marker last: once it is gone, the topic is.
        cluster.wait_for(lambda: zk.exists(f"/admin/delete_topics/{topic}") is None, 30,
                         "the deletion marker gone from ZooKeeper")
        assert zk.exists(f"/brokers/topics/{topic}") is None
    assert partition_view(down, topic) == {}
    # The name is free again: a new topic of the same name starts empty on every broker.
    create(cluster, topic, 2, 3)
    fill(cluster, topic, 2, 2)
    for broker in cluster.brokers.values():
        cluster.wait_for(lambda b=broker: len(topic_dirs(b, topic)) == 2, 20, "the new topic's logs")
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": unique_name("g")})
    assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 1)
    consumer.close()


def test_a_partition_whose_only_replica_is_down_has_no_leader_in_metadata(cluster):
    """As Kafka answers it: LEADER_NOT_AVAILABLE and leader -1, not the dead broker's id for
    clients to go looking for; the leader is back once its broker is."""
    topic = unique_name("orphan")
    controller = cluster.controller_id()
    down_id = next(i for i in cluster.brokers if i != controller)
    create(cluster, topic, assignment=[[down_id]])
    down = cluster.brokers[down_id]
    down.kill()

    def answers(broker) -> tuple[int, int]:
        p = next(t for t in metadata(broker, [topic]).topics if t.name == topic).partitions[0]
        return p.error_code, p.leader_id

    for broker in live_brokers(cluster):
        cluster.wait_for(lambda b=broker: answers(b) == (ErrorCode.LEADER_NOT_AVAILABLE, -1), 30,
                         "no leader for the dead broker's partition")
    down.start()
    for broker in live_brokers(cluster):
        cluster.wait_for(lambda b=broker: answers(b) == (ErrorCode.NONE, down_id), 30,
                         "the restarted broker leading it again")


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
    if (zk := zookeeper_of(cluster)) is not None:  # brokers heard of both through change notifications
        changes = zk.get_children("/config/changes")
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
    if (zk := zookeeper_of(cluster)) is not None:  # KRaft: ProducerIdsRecords of the metadata log
        block = json.loads(zk.get("/latest_producer_id_block")[0])
        assert block["block_end"] >= max(ids)


@pytest.mark.zookeeper_only("the znodes ZooKeeper-mode Kafka keeps; a KRaft cluster has no ZooKeeper")
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
    """UpdateFeatures reaches the controller (ZooKeeper mode: sent to it, others say
    NOT_CONTROLLER as ZooKeeper-mode Kafka brokers do; KRaft: through any broker, which
    forwards it) and every broker reports the new levels in ApiVersions, at a newer epoch."""
    api_versions, update_features = 18, 57
    defaults = {"eligible.leader.replicas.version": 1, "group.version": 1, "metadata.version": 25, "share.version": 1,
                "transaction.version": 2}

    def finalized(broker):
        with RawClient(broker) as client:
            body = client.call(api_versions, 3, {"client_software_name": "t", "client_software_version": "1"})
        return {f.name: f.max_version_level for f in body.finalized_features}, body.finalized_features_epoch

    epochs = {}
    for broker_id, broker in cluster.brokers.items():
        levels, epochs[broker_id] = finalized(broker)
        assert levels == defaults, f"broker {broker_id}"
    if (zk := zookeeper_of(cluster)) is not None:  # /feature is the controller's to write
        data, _ = zk.get("/feature")
        assert json.loads(data) == {"version": 2, "status": 1, "features": {
            name: {"max_version_level": level} for name, level in defaults.items()}}
    lower = {"timeout_ms": 10000, "validate_only": False, "feature_updates": [
        {"feature": "transaction.version", "max_version_level": 1, "upgrade_type": 2}]}
    other = next(b for i, b in cluster.brokers.items() if i != cluster.controller_id())
    with RawClient(other) as client:
        answer = client.call(update_features, 1, lower).error_code
    if cluster.kraft:
        assert answer == ErrorCode.NONE
    else:
        assert answer == ErrorCode.NOT_CONTROLLER
        with RawClient(cluster.brokers[cluster.controller_id()]) as client:
            assert client.call(update_features, 1, lower).error_code == ErrorCode.NONE

    def lowered(broker_id: int) -> bool:
        levels, epoch = finalized(cluster.brokers[broker_id])
        return levels == {**defaults, "transaction.version": 1} and epoch > epochs[broker_id]

    for broker_id in cluster.brokers:
        cluster.wait_for(lambda i=broker_id: lowered(i),
                         what=f"broker {broker_id} reporting transaction.version 1 at a newer epoch")
    if zk is not None:
        assert {finalized(b)[1] for b in cluster.brokers.values()} == {1}  # the znode's version
