"""The quorum against a client that is not a node: DescribeQuorum on the broker listeners of a
SASL cluster with an authorizer, on every node (three combined nodes as real processes)."""

from __future__ import annotations

import pytest

from strom.client import ClientSecurity, Connection
from strom.testing import KRaftQuorum, wait_for

DESCRIBE_QUORUM, CLUSTER_AUTHORIZATION_FAILED = 55, 31
_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
         'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";')
SECURE = {
    "listeners": "SASL_PLAINTEXT://127.0.0.1:0", "inter.broker.listener.name": "SASL_PLAINTEXT",
    "listener.security.protocol.map": "CONTROLLER:SASL_PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
    "sasl.enabled.mechanisms": "PLAIN", "sasl.mechanism.controller.protocol": "PLAIN",
    "sasl.mechanism.inter.broker.protocol": "PLAIN",
    "listener.name.controller.plain.sasl.jaas.config": _JAAS,
    "listener.name.sasl_plaintext.plain.sasl.jaas.config": _JAAS,
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer", "super.users": "User:admin",
    "controller.quorum.election.timeout.ms": "500", "controller.quorum.fetch.timeout.ms": "1000",
}
FIELDS = {"topics": [{"topic_name": "__cluster_metadata", "partitions": [{"partition_index": 0}]}]}


@pytest.fixture(scope="module")
def secure():
    with KRaftQuorum(3, combined=True, overrides=SECURE) as q:
        yield q


def _describe(node, user: str, password: str):
    conn = Connection("127.0.0.1", node.ports["SASL_PLAINTEXT"], security=ClientSecurity(None, "PLAIN", user, password))
    try:
        return conn.call(DESCRIBE_QUORUM, 1, FIELDS)
    finally:
        conn.close()


def test_describe_quorum_wants_describe_on_the_cluster_and_is_forwarded_authenticated(secure):
    """Kafka answers DescribeQuorum only to a principal with DESCRIBE on the cluster: the leader
    answered anyone, and a follower forwarded it to the leader unauthenticated, which a SASL
    controller listener closes, so only the leader's node could answer `metadata-quorum`."""
    def leader_from_its_own_node() -> int | None:
        for node in secure.nodes.values():
            try:
                part = _describe(node, "admin", "admin-secret").topics[0].partitions[0]
            except (OSError, ConnectionError, IndexError):
                continue
            if part.error_code == 0:
                return part.leader_id
        return None

    leader = wait_for(leader_from_its_own_node, 60, what="a quorum leader")
    for node_id, node in secure.nodes.items():
        refused = _describe(node, "alice", "alice-secret")
        assert refused.error_code == CLUSTER_AUTHORIZATION_FAILED, (node_id, node_id == leader)
        answer = _describe(node, "admin", "admin-secret")
        assert answer.error_code == 0, node_id
        (part,) = answer.topics[0].partitions
        assert part.error_code == 0 and part.leader_id == leader, (node_id, leader)
        assert sorted(v.replica_id for v in part.current_voters) == [1, 2, 3]
