"""KRaft clusters with brokers on the quorum: what only KRaft has (the active controller is a
quorum member, brokers are fenced by missed heartbeats, controllers and brokers may be separate
processes). The rest of the cluster behaviour runs in both modes in tests/cluster."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import defaultdict

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kraft_support import metadata_dir, replay, wait_caught_up

from strom.client import Connection
from strom.metadata.storage import parse_kafka_uuid, read_meta
from strom.network.request import RequestContext
from strom.protocol.errors import ErrorCode
from strom.protocol.messages import RequestHeader
from strom.server.kraft import envelope
from strom.testing import (
    KRAFT,
    Cluster,
    KRaftQuorum,
    RawClient,
    consume_all,
    create_topic,
    metric_value,
    scrape,
    unique_name,
    wait_for,
)

OVERRIDES = {"offsets.topic.num.partitions": "3", "transaction.state.log.num.partitions": "3",
             "group.initial.rebalance.delay.ms": "0", "default.replication.factor": "3", "metrics.port": "0"}
SESSION_MS = 3000


@pytest.fixture(scope="module")
def cluster():
    with Cluster(3, zookeeper=KRAFT, overrides=OVERRIDES, session_timeout_ms=SESSION_MS) as c:
        yield c


def view(broker, topic: str) -> dict[int, tuple[int, list[int]]]:
    """partition -> (leader, isr) as `broker` answers Metadata; {} if it cannot answer."""
    try:
        with RawClient(broker) as client:
            body = client.call(3, 12, {"topics": [{"name": topic, "topic_id": None}],
                                       "allow_auto_topic_creation": False,
                                       "include_topic_authorized_operations": False})
    except (OSError, ConnectionError):
        return {}
    return {p.partition_index: (p.leader_id, sorted(p.isr_nodes)) for t in body.topics if t.error_code == 0
            for p in t.partitions}


def brokers_listed(broker) -> set[int]:
    with RawClient(broker) as client:
        body = client.call(3, 12, {"topics": [], "allow_auto_topic_creation": False,
                                   "include_topic_authorized_operations": False})
    return {b.node_id for b in body.brokers}


class AckedProducer:
    """An idempotent acks=all producer writing numbered records round-robin over `partitions`
    in a thread, remembering what was acknowledged where."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                  "linger.ms": 5, "message.timeout.ms": 120000})
        self.topic, self.partitions = topic, partitions
        self.acked: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
        self.failed: list = []
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _done(self, err, msg) -> None:
        if err is not None:
            self.failed.append(err)
        else:
            self.acked[msg.partition()].append((msg.offset(), msg.value()))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.producer.produce(self.topic, b"%08d" % self.sent, partition=self.sent % self.partitions,
                                  on_delivery=self._done)
            self.sent += 1
            self.producer.poll(0.002)

    def __enter__(self) -> AckedProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        assert self.producer.flush(120) == 0, "records left unacknowledged"

    def count(self) -> int:
        return sum(len(v) for v in self.acked.values())


def test_the_node_whose_controller_is_active_says_so(cluster):
    active = cluster.controller_id()
    topic = unique_name("counted")
    create_topic(cluster.bootstrap, topic, 4, replication_factor=3)
    for node_id, node in cluster.brokers.items():
        samples = scrape(node.metrics_url)
        assert metric_value(samples, "strom_active_controller") == (node_id == active)
        if node_id == active:
            assert metric_value(samples, "strom_global_partitions") >= 4
            assert metric_value(samples, "strom_offline_partitions") == 0


def test_brokers_name_a_live_broker_as_controller_and_controllers_describe_the_quorum(cluster):
    """Kafka 4's KRaft answers: Metadata and DescribeCluster (endpoint type 1) on a broker name
    a live broker picked at random as the controller, and admin requests sent there are
    forwarded; DescribeCluster with endpoint type 2 on a controller listener lists the
    controllers and the active one; each kind of listener refuses the other endpoint type;
    DescribeQuorum answers through every broker."""
    ids = set(cluster.brokers)
    active = cluster.controller_id()
    confluent = AdminClient({"bootstrap.servers": cluster.bootstrap})
    described = confluent.describe_cluster().result(timeout=30)
    assert {n.id for n in described.nodes} == ids and described.controller.id in ids
    named = set()
    for node in cluster.brokers.values():
        with RawClient(node) as client:
            for _ in range(10):
                body = client.call(3, 12, {"topics": [], "allow_auto_topic_creation": False,
                                           "include_topic_authorized_operations": False})
                named.add(body.controller_id)
                body = client.call(60, 1, {"include_cluster_authorized_operations": False, "endpoint_type": 1})
                assert body.error_code == 0 and {b.broker_id for b in body.brokers} == ids
                named.add(body.controller_id)
            wrong = client.call(60, 1, {"include_cluster_authorized_operations": False, "endpoint_type": 2})
            assert wrong.error_code == ErrorCode.MISMATCHED_ENDPOINT_TYPE
            quorum = client.call(55, 2, {"topics": [{"topic_name": "__cluster_metadata",
                                                      "partitions": [{"partition_index": 0}]}]})
            assert quorum.error_code == 0 and quorum.topics[0].partitions[0].leader_id == active
    # 60 answers naming one broker each at random: all three named (the chance of fewer is 3 * (2/3)^60).
    assert named == ids
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30000)
    try:
        assert admin.describe_cluster()["controller_id"] in ids
        topic = unique_name("via-named-controller")
        admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=3)])
        wait_for(lambda: all(len(view(b, topic)) == 2 for b in cluster.brokers.values()), 30,
                 what="the topic created through the named controller on every broker")
    finally:
        admin.close()
    for port in cluster.quorum.ports.values():
        with Connection("127.0.0.1", port) as conn:
            body = conn.call(60, 2, {"include_cluster_authorized_operations": False, "endpoint_type": 2,
                                     "include_fenced_brokers": False})
            assert body.error_code == 0 and body.endpoint_type == 2 and body.cluster_id == cluster.quorum.cluster_id
            assert {(b.broker_id, b.port) for b in body.brokers} == set(cluster.quorum.ports.items())
            assert body.controller_id == active
            wrong = conn.call(60, 1, {"include_cluster_authorized_operations": False, "endpoint_type": 1})
            assert wrong.error_code == ErrorCode.MISMATCHED_ENDPOINT_TYPE
            assert conn.call(60, 1, {"include_cluster_authorized_operations": False,
                                     "endpoint_type": 3}).error_code == ErrorCode.UNSUPPORTED_ENDPOINT_TYPE


def test_brokers_register_their_log_directories(cluster):
    """KIP-858: each broker's RegisterBrokerRecord carries the directory.id of its log dir, as
    `strom storage format` wrote it in meta.properties."""
    hw = wait_caught_up(cluster.quorum, set(cluster.brokers))
    image = replay(metadata_dir(cluster.quorum, cluster.controller_id()), hw)
    for node_id, node in cluster.brokers.items():
        meta = read_meta(node.data_dir / "logs")
        assert image.brokers[node_id].log_dirs == [parse_kafka_uuid(meta.directory_id)]


def _cordon(cluster, node_id: int, op) -> None:
    """cordoned.log.dirs of broker `node_id` set to (or cleared of) its one log dir, as a
    per-broker dynamic config through that broker."""
    from confluent_kafka.admin import ConfigEntry, ConfigResource

    entry = ConfigEntry("cordoned.log.dirs", str(cluster.brokers[node_id].data_dir / "logs"), incremental_operation=op)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    future = admin.incremental_alter_configs([ConfigResource("BROKER", str(node_id), incremental_configs=[entry])])
    next(iter(future.values())).result(30)


def _cordoned_dirs(node) -> dict[str, bool]:
    with RawClient(node) as client:
        return {r.log_dir: r.is_cordoned for r in client.call(35, 5, {"topics": None}).results}


def test_a_broker_other_than_the_active_controller_cordons_its_dirs(cluster):
    """KIP-1066: cordoned.log.dirs names the broker's own log dirs, which the active controller
    (another node, with dirs of its own) cannot check: it leaves that to the broker, and the
    change is taken."""
    from confluent_kafka.admin import AlterConfigOpType

    node_id = next(b for b in sorted(cluster.brokers) if b != cluster.controller_id())
    log_dir = str(cluster.brokers[node_id].data_dir / "logs")
    try:
        _cordon(cluster, node_id, AlterConfigOpType.SET)
        assert _cordoned_dirs(cluster.brokers[node_id]) == {log_dir: True}
    finally:
        _cordon(cluster, node_id, AlterConfigOpType.DELETE)
    assert _cordoned_dirs(cluster.brokers[node_id]) == {log_dir: False}


def test_a_cordoned_log_dir_reaches_the_controller_in_heartbeats(cluster):
    """KIP-1066: cordoned.log.dirs set on a running broker reaches the controller in that
    broker's next heartbeats (v2): its registration in the metadata names the dir's
    directory.id; cleared, it names none again."""
    from confluent_kafka.admin import AlterConfigOpType

    node_id = max(cluster.brokers)
    dir_id = parse_kafka_uuid(read_meta(cluster.brokers[node_id].data_dir / "logs").directory_id)

    def registered_cordoned() -> list:
        hw = wait_caught_up(cluster.quorum, set(cluster.brokers))
        return replay(metadata_dir(cluster.quorum, cluster.controller_id()), hw).brokers[node_id].cordoned_log_dirs

    try:
        _cordon(cluster, node_id, AlterConfigOpType.SET)
        wait_for(lambda: registered_cordoned() == [dir_id], 30, what=f"broker {node_id}'s dir cordoned in the metadata")
    finally:
        _cordon(cluster, node_id, AlterConfigOpType.DELETE)
        wait_for(lambda: registered_cordoned() == [], 30, what=f"broker {node_id}'s dir uncordoned in the metadata")


def test_token_requests_on_a_controller_listener(cluster):
    """A controller answers Create/Renew/ExpireDelegationToken as Kafka's: directly over
    PLAINTEXT, refused; in an Envelope (as a broker forwards them), answered as the client's,
    here DELEGATION_TOKEN_AUTH_DISABLED (this cluster has no delegation.token.secret.key); a
    garbled envelope is INVALID_REQUEST. Through a broker, the same answer."""
    create = {"owner_principal_type": None, "owner_principal_name": None, "renewers": [], "max_lifetime_ms": -1}
    port = cluster.quorum.ports[cluster.controller_id()]
    with Connection("127.0.0.1", port) as conn:
        body = conn.call(38, 3, create)
        assert body.error_code == ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED
        header = RequestHeader(38, 3, 9, "a-client", True)
        client = RequestContext(header, "SASL_SSL", "10.0.0.1:1234", "User:alice", "SASL_SSL")
        answer = conn.call(58, 0, envelope.wrap(client, create))
        assert answer.error_code == 0
        inner = envelope.unwrap_response(client, bytes(answer.response_data))
        assert inner.error_code == ErrorCode.DELEGATION_TOKEN_AUTH_DISABLED and inner.principal_name == "alice"
        garbled = conn.call(58, 0, {**envelope.wrap(client, create), "request_data": b"\x00\x26"})
        assert garbled.error_code == ErrorCode.INVALID_REQUEST and garbled.response_data is None
    with RawClient(next(iter(cluster.brokers.values()))) as client:
        # PLAINTEXT on the broker: refused there, before any forwarding.
        assert client.call(38, 3, create).error_code == ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED


def test_unregister_broker_through_a_broker(cluster):
    """UnregisterBroker sent to a broker goes to the active controller (as Kafka's brokers
    forward it): each broker advertises it, and an id no broker has is answered by the
    controller; `strom cluster unregister` works against a broker too."""
    for node in cluster.brokers.values():
        with RawClient(node) as client:
            keys = {k.api_key: (k.min_version, k.max_version) for k in client.call(18, 3, {
                "client_software_name": "t", "client_software_version": "1"}).api_keys}
            assert keys[64] == (0, 0)
            body = client.call(64, 0, {"broker_id": 99})
            assert (body.error_code, body.error_message) == (ErrorCode.BROKER_ID_NOT_REGISTERED,
                                                             "Broker 99 is not registered.")
    done = subprocess.run([sys.executable, "-m", "strom", "cluster", "unregister", "--id", "99",
                           "--bootstrap-server", cluster.bootstrap.split(",")[0]],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr.strip()) == (
        1, "Error: unregistering broker 99 failed: BROKER_ID_NOT_REGISTERED: Broker 99 is not registered.")


def test_killing_the_active_controller_loses_no_acknowledged_record(cluster):
    topic = unique_name("controller-kill")
    create_topic(cluster.bootstrap, topic, 6, replication_factor=3, config={"min.insync.replicas": "2"})
    victim = cluster.controller_id()
    with AckedProducer(cluster.bootstrap, topic, 6) as producer:
        wait_for(lambda: producer.count() > 500, 60, what="records acknowledged before the kill")
        cluster.brokers[victim].kill()
        new = wait_for(lambda: (c := cluster.controller_id()) not in (-1, victim) and c, 30,
                       what="a new active controller")
        before = producer.count()
        wait_for(lambda: producer.count() > before + 500, 60, what="records acknowledged after the kill")
        cluster.brokers[victim].start()
        after = producer.count()
        wait_for(lambda: producer.count() > after + 200, 60, what="records acknowledged after the restart")
    assert not producer.failed, producer.failed[:3]
    assert new != victim
    for p, acked in producer.acked.items():
        offsets = [o for o, _ in acked]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets), f"partition {p} acked twice"
    # Every acknowledged record is there once, where it was acknowledged, in order.
    got = consume_all(cluster.bootstrap, topic, count=producer.count())
    read: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    for m in got:
        read[m.partition()].append((m.offset(), m.value()))
    for p, acked in producer.acked.items():
        assert set(acked) <= set(read[p]), f"partition {p} lost acknowledged records"
    assert len({v for m in got if (v := m.value())}) == len(got), "a record was written twice"
    # The restarted node is back in the ISR of all of them.
    wait_for(lambda: all(victim in isr for _, isr in view(cluster.brokers[new], topic).values()), 60,
             what="the restarted node back in every ISR")


def test_a_fenced_broker_loses_leadership_and_rejoins(cluster):
    topic = unique_name("fenced")
    controller = cluster.controller_id()
    stopped = next(b for b in cluster.brokers if b != controller)
    others = [b for b in cluster.brokers if b != stopped]
    create_topic(cluster.bootstrap, topic, assignment=[[stopped, *others]])
    asker = cluster.brokers[controller]
    wait_for(lambda: view(asker, topic).get(0, (None,))[0] == stopped, 30, what="the topic led by the node to stop")
    cluster.brokers[stopped].pause()  # SIGSTOP: no heartbeats past broker.session.timeout.ms
    try:
        wait_for(lambda: view(asker, topic).get(0) == (others[0], sorted(others)), 30,
                 what="leadership and the ISR moved off the fenced node")
        assert stopped not in brokers_listed(asker), "a fenced broker is not offered to clients"
        with RawClient(asker) as client:  # DescribeCluster v2 (KIP-1073) lists it when asked to
            for include_fenced in (False, True):
                body = client.call(60, 2, {"include_cluster_authorized_operations": False, "endpoint_type": 1,
                                           "include_fenced_brokers": include_fenced})
                listed = {b.broker_id: b.is_fenced for b in body.brokers}
                assert listed == {**{b: False for b in others}, **({stopped: True} if include_fenced else {})}
        producer = Producer({"bootstrap.servers": asker.bootstrap, "acks": "all"})
        producer.produce(topic, b"while-fenced")
        assert producer.flush(30) == 0
    finally:
        cluster.brokers[stopped].resume()
    wait_for(lambda: stopped in brokers_listed(asker), 30, what="the node unfenced again")
    wait_for(lambda: stopped in view(asker, topic).get(0, (None, []))[1], 30, what="the node back in the ISR")
    assert "is unfenced" in cluster.brokers[stopped].log_text()
    got = consume_all(cluster.bootstrap, topic, count=1)
    assert [m.value() for m in got] == [b"while-fenced"]


def test_deleting_a_topic_removes_its_logs_everywhere(cluster):
    topic = unique_name("deleted")
    create_topic(cluster.bootstrap, topic, 3, replication_factor=3)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(30):
        producer.produce(topic, b"%d" % i, partition=i % 3)
    assert producer.flush(30) == 0

    def dirs() -> list:
        return [d for b in cluster.brokers.values() for d in b.data_dir.glob(f"logs/{topic}-*")]

    assert len(dirs()) == 9
    client = AdminClient({"bootstrap.servers": cluster.bootstrap})
    client.delete_topics([topic], operation_timeout=30)[topic].result(35)
    wait_for(lambda: not dirs(), 30, what="every replica's log deleted")
    for broker in cluster.brokers.values():
        assert view(broker, topic) == {}


def test_dedicated_controllers_and_brokers():
    """Three controllers (process.roles=controller) and three brokers (process.roles=broker),
    the brokers observers of the quorum; the active controller's kill -9 stops nothing."""
    with KRaftQuorum(3, brokers=3, overrides=OVERRIDES) as quorum:
        bootstrap = quorum.bootstrap
        topic = unique_name("dedicated")
        create_topic(bootstrap, topic, 3, replication_factor=3)
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for i in range(300):
            producer.produce(topic, b"%04d" % i, partition=i % 3)
        assert producer.flush(30) == 0
        active = quorum.leader()
        quorum.nodes[active].kill()
        quorum.leader(30, exclude=[active])
        after = unique_name("after-failover")
        create_topic(bootstrap, after, 2, replication_factor=3)
        for broker in quorum.brokers.values():
            wait_for(lambda b=broker: len(view(b, after)) == 2 and all(len(isr) == 3 for _, isr in
                                                                        view(b, after).values()),
                     30, what="the new topic on every broker")
        for i in range(300, 400):
            producer.produce(topic, b"%04d" % i, partition=i % 3)
        assert producer.flush(30) == 0
        got = consume_all(bootstrap, topic, count=400)
        assert sorted(m.value() for m in got) == [b"%04d" % i for i in range(400)]
