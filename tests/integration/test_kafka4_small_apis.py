"""The small APIs whose versions Strom advertises as a Kafka 4.2 broker does, against real
broker processes: FindCoordinator v5-6 (a share partition key answered with its share
coordinator), the ACL and delegation token APIs from v1 (KIP-896: v0 is refused as any
unsupported version is, by closing the connection), DescribeCluster v2 (KIP-1073: is_fenced) and
ListClientMetricsResources v0 (key 74, KIP-714), by hand on the wire and through kafka-python's
admin client where it speaks them. (confluent-kafka 2.x has no list_client_metrics_resources.)"""

from __future__ import annotations

import pytest
from kafka import KafkaAdminClient
from kafka.protocol.admin import DescribeClusterRequest, ListConfigResourcesRequest
from kafka.protocol.metadata import FindCoordinatorRequest

from strom.client import ClientSecurity, Connection
from strom.protocol import messages
from strom.protocol.errors import ErrorCode
from strom.testing import BrokerProcess, Cluster, acl_broker_overrides, unique_name, wait_for

pytestmark = pytest.mark.timeout(180)

FIND_COORDINATOR, API_VERSIONS, INCREMENTAL_ALTER_CONFIGS = 10, 18, 44
DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31
CREATE_TOKEN, RENEW_TOKEN, EXPIRE_TOKEN, DESCRIBE_TOKEN = 38, 39, 40, 41
DESCRIBE_CLUSTER, LIST_CLIENT_METRICS_RESOURCES = 60, 74
GROUP, TRANSACTION, SHARE = 0, 1, 2
CLIENT_METRICS, SET, DELETE = 16, 0, 1
# What a Kafka 4.2 broker advertises for these keys.
KAFKA_4_2 = {FIND_COORDINATOR: (0, 6), DESCRIBE_ACLS: (1, 3), CREATE_ACLS: (1, 3), DELETE_ACLS: (1, 3),
             CREATE_TOKEN: (1, 3), RENEW_TOKEN: (1, 2), EXPIRE_TOKEN: (1, 2), DESCRIBE_TOKEN: (1, 3),
             DESCRIBE_CLUSTER: (0, 2), LIST_CLIENT_METRICS_RESOURCES: (0, 1)}

USERS = ("admin", "bob")


@pytest.fixture(scope="module")
def secure():
    """An authorizer (admin is a super user, bob has no ACLs) and delegation tokens on."""
    with BrokerProcess(overrides=acl_broker_overrides(USERS, {
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512", "delegation.token.secret.key": "the-cluster-secret"})) as b:
        yield b


@pytest.fixture(scope="module")
def cluster():
    """Two brokers on one ZooKeeper."""
    with Cluster(brokers=2) as c:
        yield c


def sasl(broker: BrokerProcess, user: str) -> Connection:
    return Connection("127.0.0.1", broker.ports["SASL_PLAINTEXT"], security=ClientSecurity(
        sasl_mechanism="PLAIN", username=user, password=f"{user}-secret"))


def plain(broker: BrokerProcess) -> Connection:
    return Connection("127.0.0.1", broker.port)


def kafka_python_admin(broker: BrokerProcess) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)


# --- ApiVersions ----------------------------------------------------------------------------------

def test_api_versions_advertise_kafka_4_2_ranges(broker):
    with plain(broker) as conn:
        body = conn.call(API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
    advertised = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
    assert {key: advertised.get(key) for key in KAFKA_4_2} == KAFKA_4_2


def test_kafka_python_negotiates_the_new_versions(broker):
    admin = kafka_python_admin(broker)
    try:
        versions = admin._manager.broker_version_data
        assert [versions.api_version(cls) for cls in (FindCoordinatorRequest, DescribeClusterRequest,
                                                      ListConfigResourcesRequest)] == [6, 2, 1]
    finally:
        admin.close()


# --- FindCoordinator v5 and v6 ----------------------------------------------------------------------

def find(conn: Connection, version: int, key_type: int, *keys: str) -> list[tuple]:
    body = conn.call(FIND_COORDINATOR, version, {"key_type": key_type, "coordinator_keys": list(keys)})
    return [(c.key, c.error_code, c.node_id, c.host, c.port) for c in body.coordinators]


@pytest.mark.parametrize("version", [5, 6])
def test_find_coordinator_groups_and_transactions(broker, version):
    """v5 and v6 find group and transaction coordinators as v4 does: this broker, per key."""
    with plain(broker) as conn:
        for key_type in (GROUP, TRANSACTION):
            keys = [unique_name("k"), unique_name("k")]
            found = find(conn, version, key_type, *keys)
            assert [(k, e, h, p) for k, e, _, h, p in found] == [(k, 0, "127.0.0.1", broker.port) for k in keys]
            assert all(node >= 0 for _, _, node, _, _ in found)


def test_find_coordinator_finds_the_share_coordinator(broker):
    """KIP-932's key type 2 (v6): a share partition's key "groupId:topicId:partition" names its
    share coordinator, the leader of the `__share_group_state` partition that owns it; a key
    not of that form, or any share key before v6, gets INVALID_REQUEST and no node. The
    connection stays usable."""
    no_node = (ErrorCode.INVALID_REQUEST, -1, "", -1)
    share_keys = ["g:AAAAAAAAAAAAAAAAAAAAAA:0", "g:AAAAAAAAAAAAAAAAAAAAAA:1"]
    with plain(broker) as conn:
        found = find(conn, 6, SHARE, *share_keys)
        assert [(k, e, h, p) for k, e, _, h, p in found] == [(k, 0, "127.0.0.1", broker.port) for k in share_keys]
        assert find(conn, 6, SHARE, "g:not-a-topic-id:0", "g-without-partition") == [
            ("g:not-a-topic-id:0", *no_node), ("g-without-partition", *no_node)]
        assert find(conn, 5, SHARE, "g:AAAAAAAAAAAAAAAAAAAAAA:0") == [("g:AAAAAAAAAAAAAAAAAAAAAA:0", *no_node)]
        assert find(conn, 6, 7, "x") == [("x", *no_node)]  # no such key type
        assert find(conn, 6, GROUP, "after")[0][1] == 0  # still serving this connection


def test_find_coordinator_share_key_needs_cluster_action(secure):
    """Kafka checks CLUSTER_ACTION on the cluster before it looks for the share coordinator."""
    with sasl(secure, "bob") as bob:
        assert find(bob, 6, SHARE, "g:AAAAAAAAAAAAAAAAAAAAAA:0")[0][1] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        assert find(bob, 6, GROUP, "g")[0][1] == ErrorCode.GROUP_AUTHORIZATION_FAILED
    with sasl(secure, "admin") as admin:
        assert find(admin, 6, SHARE, "g:AAAAAAAAAAAAAAAAAAAAAA:0")[0][1] == ErrorCode.NONE
        assert find(admin, 6, GROUP, "g")[0][1] == ErrorCode.NONE


def test_kafka_python_finds_a_group_coordinator_at_v6(broker):
    admin = kafka_python_admin(broker)
    try:
        group = unique_name("g")
        described = admin.describe_groups([group])  # FindCoordinator v6 first, then DescribeGroups
        assert described[group]["group_id"] == group
    finally:
        admin.close()


# --- ACL and delegation token APIs: v0 is gone (KIP-896) ----------------------------------------

V0_REQUESTS = {
    DESCRIBE_ACLS: {"resource_type_filter": 1, "resource_name_filter": None, "principal_filter": None,
                    "host_filter": None, "operation": 1, "permission_type": 1},
    CREATE_ACLS: {"creations": [{"resource_type": 2, "resource_name": "t", "principal": "User:x", "host": "*",
                                 "operation": 3, "permission_type": 3}]},
    DELETE_ACLS: {"filters": [{"resource_type_filter": 2, "resource_name_filter": "t", "principal_filter": None,
                               "host_filter": None, "operation": 1, "permission_type": 1}]},
    CREATE_TOKEN: {"renewers": [], "max_lifetime_ms": -1},
    RENEW_TOKEN: {"hmac": b"x", "renew_period_ms": 1000},
    EXPIRE_TOKEN: {"hmac": b"x", "expiry_time_period_ms": -1},
    DESCRIBE_TOKEN: {"owners": None},
}


@pytest.mark.parametrize("api_key", sorted(V0_REQUESTS))
def test_v0_of_acl_and_token_apis_closes_the_connection(secure, api_key):
    """As for any version a broker does not serve: the connection is closed, nothing answered,
    and the broker goes on serving (v1 of the same API on a new connection)."""
    for conn in (plain(secure), sasl(secure, "admin")):
        with conn:
            conn.send_raw(messages.encode_request(api_key, 0, V0_REQUESTS[api_key]))
            assert conn.is_closed()
    with sasl(secure, "admin") as conn:
        assert conn.call(API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"}).error_code == 0


def test_acl_apis_at_v1(secure):
    topic = unique_name("acl-v1")
    binding = {"resource_type": 2, "resource_name": topic, "resource_pattern_type": 3, "principal": "User:bob",
               "host": "*", "operation": 3, "permission_type": 3}  # TOPIC, LITERAL, READ, ALLOW
    wanted = {"resource_type_filter": 2, "resource_name_filter": topic, "pattern_type_filter": 3,
              "principal_filter": None, "host_filter": None, "operation": 1, "permission_type": 1}
    with sasl(secure, "admin") as admin:
        created = admin.call(CREATE_ACLS, 1, {"creations": [binding]})
        assert [r.error_code for r in created.results] == [0]
        described = admin.call(DESCRIBE_ACLS, 1, wanted)
        assert described.error_code == 0
        assert [(r.resource_name, [(a.principal, a.operation) for a in r.acls]) for r in described.resources] == \
            [(topic, [("User:bob", 3)])]
        deleted = admin.call(DELETE_ACLS, 1, {"filters": [wanted]})
        assert [[(m.resource_name, m.principal) for m in r.matching_acls] for r in deleted.filter_results] == \
            [[(topic, "User:bob")]]
        assert admin.call(DESCRIBE_ACLS, 1, wanted).resources == []
    with sasl(secure, "bob") as bob:
        assert bob.call(DESCRIBE_ACLS, 1, wanted).error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED


def test_delegation_token_apis_at_v1(secure):
    with sasl(secure, "admin") as admin:
        token = admin.call(CREATE_TOKEN, 1, {"renewers": [{"principal_type": "User", "principal_name": "admin"}],
                                             "max_lifetime_ms": -1})
        assert token.error_code == 0 and token.principal_name == "admin" and token.token_id
        described = admin.call(DESCRIBE_TOKEN, 1, {"owners": None})
        assert described.error_code == 0 and token.token_id in [t.token_id for t in described.tokens]
        renewed = admin.call(RENEW_TOKEN, 1, {"hmac": token.hmac, "renew_period_ms": 60_000})
        assert renewed.error_code == 0 and renewed.expiry_timestamp_ms > 0
        expired = admin.call(EXPIRE_TOKEN, 1, {"hmac": token.hmac, "expiry_time_period_ms": -1})
        assert expired.error_code == 0
        assert token.token_id not in [t.token_id for t in admin.call(DESCRIBE_TOKEN, 1, {"owners": None}).tokens]
    with plain(secure) as anonymous:  # PLAINTEXT never gets tokens: refused, but answered at v1
        assert anonymous.call(DESCRIBE_TOKEN, 1, {"owners": None}).error_code == \
            ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED


# --- DescribeCluster v2 ----------------------------------------------------------------------------

def describe_cluster(conn: Connection, version: int, include_fenced: bool = False):
    fields = {"include_cluster_authorized_operations": False, "endpoint_type": 1,
              "include_fenced_brokers": include_fenced}
    return conn.call(DESCRIBE_CLUSTER, version, fields)


def test_describe_cluster_v2_no_broker_is_fenced(cluster):
    """Every registered broker of a ZooKeeper-mode cluster is unfenced, with or without
    include_fenced_brokers; v1 lists the same brokers."""
    ports = sorted(b.port for b in cluster.brokers.values())
    for broker in cluster.brokers.values():
        with plain(broker) as conn:
            wait_for(lambda conn=conn: len(describe_cluster(conn, 2).brokers) == 2, timeout=20,
                     what="both brokers registered")
            for include_fenced in (False, True):
                body = describe_cluster(conn, 2, include_fenced)
                assert body.error_code == 0 and body.endpoint_type == 1
                assert sorted((b.port, b.is_fenced) for b in body.brokers) == [(p, False) for p in ports]
            v1 = describe_cluster(conn, 1)
            assert sorted(b.port for b in v1.brokers) == ports
    admin = kafka_python_admin(cluster.brokers[1])
    try:
        described = admin.describe_cluster()  # v2, the highest both speak
        assert sorted((b["port"], b["is_fenced"]) for b in described["brokers"]) == [(p, False) for p in ports]
    finally:
        admin.close()


# --- ListClientMetricsResources v0 --------------------------------------------------------------------

def alter_subscription(conn: Connection, name: str, op: int, key: str, value: str | None) -> None:
    body = conn.call(INCREMENTAL_ALTER_CONFIGS, 1, {
        "resources": [{"resource_type": CLIENT_METRICS, "resource_name": name,
                       "configs": [{"name": key, "config_operation": op, "value": value}]}],
        "validate_only": False})
    assert (body.responses[0].error_code, body.responses[0].error_message) == (0, None)


def list_resources(conn: Connection):
    body = conn.call(LIST_CLIENT_METRICS_RESOURCES, 0, {})
    return body.error_code, sorted(r.resource_name for r in body.config_resources)


def test_list_client_metrics_resources(fresh_broker):
    """Empty at first; a subscription made through IncrementalAlterConfigs is listed (by hand and
    through kafka-python's list_config_resources, asking for client metrics only: at v1 every
    resource type is listed by default, as Kafka 4.2 does), and gone once deleted."""
    admin = kafka_python_admin(fresh_broker)
    try:
        with plain(fresh_broker) as conn:
            assert list_resources(conn) == (0, [])
            assert admin.list_config_resources(["CLIENT_METRICS"]) == {}
            alter_subscription(conn, "all-metrics", SET, "metrics", "*")
            alter_subscription(conn, "some-metrics", SET, "interval.ms", "60000")
            assert list_resources(conn) == (0, ["all-metrics", "some-metrics"])
            listed = admin.list_config_resources(["CLIENT_METRICS"])
            assert {k: sorted(v) for k, v in listed.items()} == {"client_metrics": ["all-metrics", "some-metrics"]}
            alter_subscription(conn, "some-metrics", DELETE, "interval.ms", None)
            assert list_resources(conn) == (0, ["all-metrics"])
    finally:
        admin.close()


def test_list_client_metrics_resources_follows_other_brokers(cluster):
    """A subscription made on one broker is listed by the other once the config change
    notification reaches it."""
    with plain(cluster.brokers[2]) as two:
        assert list_resources(two) == (0, [])
        with plain(cluster.brokers[1]) as one:
            alter_subscription(one, "roaming", SET, "metrics", "org.apache.kafka.")
            assert list_resources(one) == (0, ["roaming"])
        wait_for(lambda: list_resources(two) == (0, ["roaming"]), timeout=20,
                 what="broker 2 to list the subscription")


def test_list_client_metrics_resources_needs_describe_configs_on_the_cluster(secure):
    with sasl(secure, "bob") as bob:
        assert list_resources(bob) == (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, [])
    with sasl(secure, "admin") as admin:
        assert list_resources(admin)[0] == 0
