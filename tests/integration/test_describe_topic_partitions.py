"""DescribeTopicPartitions (KIP-966) page by page, and the authorized-operations fields
(KIP-430) of Metadata, DescribeCluster, DescribeGroups and DescribeTopicPartitions, with and
without an authorizer, through confluent-kafka's admin client and by hand."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicCollection
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from strom.client import ClientSecurity, Connection
from strom.protocol.errors import ErrorCode
from strom.testing import BrokerProcess, acl_broker_overrides, create_topic

DESCRIBE_TOPIC_PARTITIONS = 75
TOPIC_OPERATIONS = {AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DESCRIBE,
                    AclOperation.DELETE, AclOperation.ALTER, AclOperation.DESCRIBE_CONFIGS,
                    AclOperation.ALTER_CONFIGS}
CLUSTER_OPERATIONS = {AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
                      AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER,
                      AclOperation.DESCRIBE}


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(overrides={"auto.create.topics.enable": "false"}) as proc:
        for name, partitions in (("pages-a", 3), ("pages-b", 5), ("pages-c", 1)):
            create_topic(proc.bootstrap, name, partitions=partitions)
        yield proc


def describe(conn: Connection, names: list[str], limit: int = 2000, cursor: tuple[str, int] | None = None):
    body = conn.call(DESCRIBE_TOPIC_PARTITIONS, 0, {
        "topics": [{"name": n} for n in names], "response_partition_limit": limit,
        "cursor": None if cursor is None else {"topic_name": cursor[0], "partition_index": cursor[1]}})
    page = [(t.name, t.error_code, [p.partition_index for p in t.partitions]) for t in body.topics]
    nxt = body.next_cursor
    return page, None if nxt is None else (nxt.topic_name, nxt.partition_index), body


def test_pages_follow_the_cursor(broker):
    names = ["pages-c", "pages-a", "pages-b", "pages-missing"]
    with Connection("127.0.0.1", broker.port) as conn:
        page, cursor, _ = describe(conn, names, limit=4)
        assert page == [("pages-a", 0, [0, 1, 2]), ("pages-b", 0, [0])] and cursor == ("pages-b", 1)
        page, cursor, _ = describe(conn, names, limit=4, cursor=cursor)
        assert page == [("pages-b", 0, [1, 2, 3, 4])] and cursor == ("pages-c", 0)
        page, cursor, _ = describe(conn, names, limit=4, cursor=cursor)
        assert page == [("pages-c", 0, [0]), ("pages-missing", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, [])]
        assert cursor is None
        # No names: every topic, in name order; one page when the limit allows.
        page, cursor, body = describe(conn, [])
        assert [name for name, _, _ in page] == ["pages-a", "pages-b", "pages-c"] and cursor is None
        assert {t.topic_authorized_operations for t in body.topics} == {sum(1 << op.value for op in TOPIC_OPERATIONS)}
        # A cursor naming a topic the request does not: every topic gets INVALID_REQUEST.
        page, _, _ = describe(conn, ["pages-a"], cursor=("pages-b", 0))
        assert page == [("pages-a", ErrorCode.INVALID_REQUEST, [])]


def test_authorized_operations_without_an_authorizer(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topics = admin.describe_topics(TopicCollection(["pages-b"]), include_authorized_operations=True)
    described = topics["pages-b"].result(15)
    assert len(described.partitions) == 5 and set(described.authorized_operations) == TOPIC_OPERATIONS
    cluster = admin.describe_cluster(include_authorized_operations=True).result(15)
    assert set(cluster.authorized_operations) == CLUSTER_OPERATIONS
    assert admin.describe_cluster().result(15).authorized_operations is None  # not asked, not told


def test_authorized_operations_follow_the_acls():
    with BrokerProcess(overrides=acl_broker_overrides(("admin", "alice"), {
            "group.initial.rebalance.delay.ms": "0"})) as proc:
        port = proc.ports["SASL_PLAINTEXT"]

        def admin(user: str) -> AdminClient:
            return AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_PLAINTEXT",
                                "sasl.mechanisms": "PLAIN", "sasl.username": user, "sasl.password": f"{user}-secret"})

        boss = admin("admin")
        for name in ("open", "closed"):
            boss.create_topics([NewTopic(name, 2, 1)])[name].result(15)
        grants = [AclBinding(ResourceType.TOPIC, "open", ResourcePatternType.LITERAL, "User:alice", "*",
                             AclOperation.READ, AclPermissionType.ALLOW),
                  AclBinding(ResourceType.GROUP, "g", ResourcePatternType.LITERAL, "User:alice", "*",
                             AclOperation.DESCRIBE, AclPermissionType.ALLOW),
                  AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, "User:alice",
                             "*", AclOperation.IDEMPOTENT_WRITE, AclPermissionType.ALLOW)]
        # (librdkafka's BROKER resource type is Kafka's CLUSTER, wire id 4.)
        for future in boss.create_acls(grants).values():
            future.result(15)
        alice = admin("alice")
        described = alice.describe_topics(TopicCollection(["open"]), include_authorized_operations=True)["open"]
        assert set(described.result(15).authorized_operations) == {AclOperation.READ, AclOperation.DESCRIBE}
        cluster = alice.describe_cluster(include_authorized_operations=True).result(15)
        assert set(cluster.authorized_operations) == {AclOperation.IDEMPOTENT_WRITE}
        groups = alice.describe_consumer_groups(["g"], include_authorized_operations=True)["g"].result(15)
        assert set(groups.authorized_operations) == {AclOperation.DESCRIBE}
        with Connection("127.0.0.1", port, security=ClientSecurity(
                sasl_mechanism="PLAIN", username="alice", password="alice-secret")) as conn:
            page, _, _ = describe(conn, [])
            assert page == [("open", 0, [0, 1])]  # "closed" is left out of the full listing
            page, _, _ = describe(conn, ["closed", "open"])
            assert page == [("closed", ErrorCode.TOPIC_AUTHORIZATION_FAILED, []), ("open", 0, [0, 1])]
