"""A cluster whose brokers reach each other over SASL_SSL (inter.broker.listener.name), as
clients do, with ACLs on: the controller's requests, followers' fetches and ISR changes all
authenticate as the brokers' super user. SCRAM users, ACLs and delegation tokens made through
one broker work on the others."""

from __future__ import annotations

import base64
import ssl
import subprocess
import sys

import pytest
from confluent_kafka import Consumer, Producer

from strom.client import ClientSecurity, Connection
from strom.protocol.errors import ErrorCode
from strom.testing import Cluster, make_pki, unique_name, wait_for

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
    admin(cluster, "acls", "add", "--allow-principal", "User:bob", "--producer", "--consumer", "--topic", topic)
    admin(cluster, "acls", "add", "--allow-principal", "User:bob", "--consumer", "--group", group)
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


def _client_ssl(cluster) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cluster.pki["ca"]))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
