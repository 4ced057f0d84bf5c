"""A cluster whose brokers reach each other over SASL_SSL (inter.broker.listener.name), as
clients do, with ACLs on: the controller's requests, followers' fetches and ISR changes all
authenticate as the brokers' super user (on KRaft the controller listener is SASL_SSL too, and
the quorum's own traffic is authorized on it as Kafka's controllers authorize it). SCRAM users,
ACLs and delegation tokens made through one broker work on the others."""

from __future__ import annotations

import base64
import ssl
import subprocess
import sys

import pytest
from confluent_kafka import Consumer, Producer

from strom.client import ClientSecurity, Connection
from strom.protocol.errors import ErrorCode
from strom.testing import KRAFT, Cluster, make_pki, unique_name, wait_for

from .conftest import CLUSTER_OVERRIDES

CLUSTER_MODES = ("zookeeper", "kraft")

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="broker" '
        'password="broker-secret" user_broker="broker-secret" user_admin="admin-secret" user_alice="alice-secret";')


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    """One cluster for the module: its tests add users, ACLs and tokens, and stop no broker."""
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    overrides = {**CLUSTER_OVERRIDES, "listeners": "PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
                 "inter.broker.listener.name": "SASL_SSL", "sasl.mechanism.inter.broker.protocol": "PLAIN",
                 "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
                 "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS,
                 "ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki["server"]),
                 "ssl.truststore.type": "PEM", "ssl.truststore.location": str(pki["ca"]),
                 "min.insync.replicas": "3", "delegation.token.secret.key": "cluster-secret",
                 "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
                 "super.users": "User:broker;User:admin"}
    if zookeeper == KRAFT:  # the quorum's listener, secured as the brokers' (Kafka's settings for it)
        overrides |= {"listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:SASL_SSL",
                      "sasl.mechanism.controller.protocol": "PLAIN",
                      "listener.name.controller.plain.sasl.jaas.config": JAAS}
    with Cluster(3, zookeeper=zookeeper, overrides=overrides) as c:
        c.pki = pki
        yield c


def admin(cluster, *args: str) -> str:
    brokers = list(cluster.brokers.values())
    props = cluster.pki["ca"].parent / "admin.properties"
    props.write_text(f"security.protocol=SASL_SSL\nssl.truststore.location={cluster.pki['ca']}\n"
                     "sasl.mechanism=PLAIN\nsasl.username=admin\nsasl.password=admin-secret\n")
    done = subprocess.run([sys.executable, "-m", "strom", *args, "--command-config", str(props),
                           "--bootstrap-server", f"127.0.0.1:{brokers[-1].ports['SASL_SSL']}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_brokers_authenticate_to_each_other(cluster):
    brokers = list(cluster.brokers.values())
    topic, group = unique_name("secured"), unique_name("g")
    admin(cluster, "topics", "create", topic, "--replication-factor", "3")  # the controller reached every broker
    admin(cluster, "users", "scram-set", "bob", "--password", "bob-secret")
    # ACLs written through the last broker; the clients below go to the first.
    admin(cluster, "acls", "add", "--allow-principal", "User:bob", "--producer", "--consumer", "--topic", topic,
          "--group", group)
    ssl_bootstrap = f"127.0.0.1:{brokers[0].ports['SASL_SSL']}"
    secured = {"bootstrap.servers": ssl_bootstrap, "security.protocol": "SASL_SSL",
               "ssl.ca.location": str(cluster.pki["ca"]), "sasl.mechanisms": "SCRAM-SHA-256",
               "sasl.username": "bob", "sasl.password": "bob-secret"}
    producer = Producer({**secured, "acks": "all"})
    for i in range(20):
        producer.produce(topic, value=b"s%d" % i)
    # min.insync.replicas=3: every write waits for both followers, which fetch over SASL_SSL.
    assert producer.flush(60) == 0
    consumer = Consumer({**secured, "group.id": group, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[bytes] = []
    wait_for(lambda: got.extend(m.value() for m in consumer.consume(20, 0.5) if not m.error()) or len(got) >= 20,
             timeout=60, what="the records over SASL_SSL")
    consumer.close()
    assert sorted(got) == sorted(b"s%d" % i for i in range(20))


def test_a_token_from_one_broker_works_on_another(cluster):
    """Made on one broker, the token authenticates on another; renewed through the second,
    described by the third with the second's expiry time; expired through the second, it
    authenticates nowhere."""
    first, second, third = list(cluster.brokers.values())[:3]
    context = ClientSecurity(ssl=_client_ssl(cluster), sasl_mechanism="PLAIN", username="alice", password="alice-secret")
    with Connection("127.0.0.1", first.ports["SASL_SSL"], security=context) as alice:
        token = alice.call(38, 3, {"owner_principal_type": None, "owner_principal_name": None, "renewers": [],
                                   "max_lifetime_ms": -1})
        assert token.error_code == 0
        assert (token.principal_name, token.token_requester_principal_name) == ("alice", "alice")
    as_token = ClientSecurity(ssl=_client_ssl(cluster), sasl_mechanism="SCRAM-SHA-512", username=token.token_id,
                              password=_b64(token.hmac), token=True)

    def authenticates(broker) -> bool:
        try:
            with Connection("127.0.0.1", broker.ports["SASL_SSL"], security=as_token) as conn:
                return bool(conn.call(3, 1, {"topics": []}).brokers)
        except ConnectionError:
            return False

    wait_for(lambda: authenticates(second), timeout=15, what="the token accepted by another broker")
    with Connection("127.0.0.1", second.ports["SASL_SSL"], security=context) as alice:
        renewed = alice.call(39, 2, {"hmac": token.hmac, "renew_period_ms": 60_000})
        assert renewed.error_code == 0 and renewed.expiry_timestamp_ms < token.expiry_timestamp_ms
    with Connection("127.0.0.1", third.ports["SASL_SSL"], security=context) as alice:
        def described():
            body = alice.call(41, 3, {"owners": None})
            assert body.error_code == 0
            mine = [t for t in body.tokens if t.token_id == token.token_id]
            return mine and mine[0].expiry_timestamp == renewed.expiry_timestamp_ms and mine[0]
        found = wait_for(described, timeout=15, what="the renewal seen by a third broker")
        assert bytes(found.hmac) == bytes(token.hmac) and found.principal_name == "alice"
    with Connection("127.0.0.1", second.ports["SASL_SSL"], security=as_token) as conn:
        refused = conn.call(39, 2, {"hmac": token.hmac, "renew_period_ms": -1})  # never with a token
        assert refused.error_code == ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED
    with Connection("127.0.0.1", second.ports["SASL_SSL"], security=context) as alice:
        assert alice.call(40, 2, {"hmac": token.hmac, "expiry_time_period_ms": -1}).error_code == 0
        assert alice.call(40, 2, {"hmac": token.hmac, "expiry_time_period_ms": -1}).error_code == ErrorCode.DELEGATION_TOKEN_NOT_FOUND
    wait_for(lambda: not any(authenticates(b) for b in (first, second, third)), timeout=15,
             what="the expired token refused everywhere")


@pytest.mark.kraft_only("the controller listener is KRaft's")
def test_the_controller_listener_authorizes_what_reaches_it(cluster):
    """A principal on the controller listener needs what Kafka's controllers ask: alice (no
    ACL) is refused a heartbeat and DescribeQuorum; carol, a SCRAM user that only the metadata
    log holds, authenticates there, and may describe the quorum once an ACL in the log says so."""
    port = next(iter(cluster.brokers.values())).ports["CONTROLLER"]
    describe_quorum = {"topics": [{"topic_name": "__cluster_metadata", "partitions": [{"partition_index": 0}]}]}
    alice = ClientSecurity(ssl=_client_ssl(cluster), sasl_mechanism="PLAIN", username="alice", password="alice-secret")
    with Connection("127.0.0.1", port, security=alice) as conn:
        assert conn.call(55, 1, describe_quorum).error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        heartbeat = conn.call(63, 1, {"broker_id": 1, "broker_epoch": 0, "current_metadata_offset": 0,
                                      "want_fence": False, "want_shut_down": True})
        assert heartbeat.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    admin(cluster, "users", "scram-set", "carol", "--password", "carol-secret")
    carol = ClientSecurity(ssl=_client_ssl(cluster), sasl_mechanism="SCRAM-SHA-256", username="carol",
                           password="carol-secret")

    def as_carol(node_port: int = port):
        try:
            with Connection("127.0.0.1", node_port, security=carol) as conn:
                return conn.call(55, 1, describe_quorum)
        except ConnectionError:
            return None  # her credential has not reached this controller yet

    wait_for(lambda: (a := as_carol()) and a.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED, timeout=15,
             what="carol authenticated on the controller listener, without ACLs")
    admin(cluster, "acls", "add", "--allow-principal", "User:carol", "--operation", "describe", "--cluster")
    answer = wait_for(lambda: (a := as_carol()) and a.error_code == ErrorCode.NONE and a, timeout=15,
                      what="DescribeQuorum allowed by carol's ACL")
    # The nodes themselves (the brokers' super user) were never refused: each voter fetches.
    leader = answer.topics[0].partitions[0].leader_id
    quorum = as_carol(cluster.brokers[leader].ports["CONTROLLER"]).topics[0].partitions[0]
    assert quorum.error_code == ErrorCode.NONE
    assert sorted(v.replica_id for v in quorum.current_voters) == [1, 2, 3]
    assert all(v.log_end_offset > 0 for v in quorum.current_voters)


@pytest.mark.kraft_only("the controller listener is KRaft's")
def test_a_token_authenticates_on_the_controller_listener(cluster):
    """A delegation token made through a broker authenticates on every controller's listener as
    its owner (Kafka's controllers keep the tokens of their image too): alice's token is refused
    DescribeQuorum there for want of an ACL, not at authentication; once expired, it authenticates
    nowhere."""
    context = ClientSecurity(ssl=_client_ssl(cluster), sasl_mechanism="PLAIN", username="alice", password="alice-secret")
    broker = next(iter(cluster.brokers.values()))
    with Connection("127.0.0.1", broker.ports["SASL_SSL"], security=context) as alice:
        token = alice.call(38, 3, {"owner_principal_type": None, "owner_principal_name": None, "renewers": [],
                                   "max_lifetime_ms": -1})
        assert token.error_code == 0
    as_token = ClientSecurity(ssl=_client_ssl(cluster), sasl_mechanism="SCRAM-SHA-256", username=token.token_id,
                              password=_b64(token.hmac), token=True)
    describe_quorum = {"topics": [{"topic_name": "__cluster_metadata", "partitions": [{"partition_index": 0}]}]}

    def answer(node) -> int | None:
        try:
            with Connection("127.0.0.1", node.ports["CONTROLLER"], security=as_token) as conn:
                return conn.call(55, 1, describe_quorum).error_code
        except ConnectionError:
            return None  # not authenticated (the token has not reached this controller, or is gone)

    for node_id, node in cluster.brokers.items():
        wait_for(lambda node=node: answer(node) == ErrorCode.CLUSTER_AUTHORIZATION_FAILED, timeout=15,
                 what=f"the token authenticated on node {node_id}'s controller listener")
    with Connection("127.0.0.1", broker.ports["SASL_SSL"], security=context) as alice:
        assert alice.call(40, 2, {"hmac": token.hmac, "expiry_time_period_ms": -1}).error_code == 0
    wait_for(lambda: all(answer(node) is None for node in cluster.brokers.values()), timeout=15,
             what="the expired token refused on every controller listener")


def _client_ssl(cluster) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cluster.pki["ca"]))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
