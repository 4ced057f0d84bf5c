"""What a hostile client still did to a broker, round 3: each case against a real broker (or
KRaft cluster) process, checking the answer Kafka gives."""

from __future__ import annotations

import pytest

from strom.testing import (
    KRAFT,
    BrokerProcess,
    Cluster,
    RawClient,
    create_topic,
    produce_acked,
    unique_name,
    wait_for,
)

DELETE_RECORDS, LIST_OFFSETS, METADATA = 21, 2, 3
NONE, UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER = 0, 3, 6


@pytest.fixture(scope="module")
def kraft_cluster():
    """Three combined KRaft nodes: a replica on two of them and none on the third."""
    with Cluster(3, zookeeper=KRAFT, overrides={"num.partitions": "1"}) as cluster:
        yield cluster


def _log_start(broker, topic: str) -> int:
    with RawClient(broker) as client:
        body = client.call(LIST_OFFSETS, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": -2}]}]})
    answer = body.topics[0].partitions[0]
    assert answer.error_code == NONE, answer
    return answer.offset


def _delete_records(broker, topic: str, offset: int) -> tuple[int, int]:
    with RawClient(broker) as client:
        body = client.call(DELETE_RECORDS, 2, {"timeout_ms": 10_000, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "offset": offset}]}]})
    p = body.topics[0].partitions[0]
    return p.error_code, p.low_watermark


# --- item 1: DeleteRecords only on the leader ---------------------------------------------------
def test_delete_records_is_for_the_leader_alone(kraft_cluster):
    topic = unique_name("trim")
    create_topic(kraft_cluster.bootstrap, topic, assignment=[[1, 2]])
    leader, follower, outsider = (kraft_cluster.brokers[i] for i in (1, 2, 3))
    wait_for(lambda: _known_everywhere(kraft_cluster, topic), what="the topic known to every node")
    assert produce_acked(leader.bootstrap, topic, [b"r-%d" % i for i in range(10)], acks="all")[-1] == 9
    # A follower, and a broker with no replica of a partition the cluster has, are not where
    # records are deleted: the client is sent to the leader, and the replicas keep agreeing.
    assert _delete_records(follower, topic, 5) == (NOT_LEADER_OR_FOLLOWER, -1)
    assert _delete_records(outsider, topic, 5) == (NOT_LEADER_OR_FOLLOWER, -1)
    assert _log_start(leader, topic) == 0
    assert _delete_records(leader, topic, 5) == (NONE, 5)
    assert _log_start(leader, topic) == 5


def _known_everywhere(cluster: Cluster, topic: str) -> bool:
    for broker in cluster.brokers.values():
        with RawClient(broker) as client:
            body = client.call(METADATA, 12, {"topics": [{"name": topic, "topic_id": None}],
                                              "allow_auto_topic_creation": False,
                                              "include_topic_authorized_operations": False})
        t = body.topics[0]
        if t.error_code or not t.partitions or t.partitions[0].leader_id != 1:
            return False
    return True


# --- item 8: DescribeConfigs synonyms from the config's own name on ------------------------------
DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS, TOPIC_RESOURCE, BROKER_RESOURCE = 32, 44, 2, 4
DYNAMIC_TOPIC, DYNAMIC_BROKER, STATIC_BROKER, DEFAULT = 1, 2, 4, 5


def _synonyms(client, kind: int, name: str, key: str) -> tuple[int, list[tuple[str, str, int]]]:
    body = client.call(DESCRIBE_CONFIGS, 4, {"resources": [
        {"resource_type": kind, "resource_name": name, "configuration_keys": [key]}],
        "include_synonyms": True, "include_documentation": False})
    entry = body.results[0].configs[0]
    return entry.config_source, [(s.name, s.value, s.source) for s in entry.synonyms]


def test_describe_configs_lists_synonyms_from_the_configs_own_name_on():
    # Kafka lists a topic config's broker synonyms in source order (dynamic broker, dynamic
    # default, server.properties, default) and drops those before the first one with the
    # topic config's own broker name (log.retention.ms), as kafka-configs --describe shows.
    with BrokerProcess(overrides={"log.retention.minutes": "120", "log.retention.hours": "5"}) as broker:
        topic = unique_name("synonyms")
        create_topic(broker.bootstrap, topic, config={"retention.ms": "3600000"})
        with RawClient(broker) as client:
            assert _synonyms(client, TOPIC_RESOURCE, topic, "retention.ms") == (
                DYNAMIC_TOPIC, [("retention.ms", "3600000", DYNAMIC_TOPIC)])
            altered = client.call(INCREMENTAL_ALTER_CONFIGS, 1, {"validate_only": False, "resources": [
                {"resource_type": BROKER_RESOURCE, "resource_name": "0", "configs": [
                    {"name": "log.retention.ms", "config_operation": 0, "value": "60000"}]}]})
            assert altered.responses[0].error_code == NONE
            broker_side = [("log.retention.ms", "60000", DYNAMIC_BROKER),
                           ("log.retention.minutes", "120", STATIC_BROKER),
                           ("log.retention.hours", "5", STATIC_BROKER),
                           ("log.retention.hours", "168", DEFAULT)]
            assert _synonyms(client, TOPIC_RESOURCE, topic, "retention.ms") == (
                DYNAMIC_TOPIC, [("retention.ms", "3600000", DYNAMIC_TOPIC), *broker_side])
            # The broker's own keys: the same rule, from the described name on.
            assert _synonyms(client, BROKER_RESOURCE, "0", "log.retention.ms") == (DYNAMIC_BROKER, broker_side)
            assert _synonyms(client, BROKER_RESOURCE, "0", "log.retention.hours") == (
                STATIC_BROKER, broker_side[2:])


# --- item 10: authorization errors before the group's state -------------------------------------
FIND_COORDINATOR, SHARE_GROUP_HEARTBEAT, DESCRIBE_SHARE_GROUP_OFFSETS, ALTER_SHARE_GROUP_OFFSETS = 10, 76, 90, 91
TOPIC_AUTHORIZATION_FAILED, NON_EMPTY_GROUP = 29, 68
_USERS_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
               'user_admin="admin-secret" user_alice="alice-secret";')


def test_share_group_offsets_answer_authorization_before_the_group_state():
    from confluent_kafka import admin as ck

    from strom.client import ClientSecurity, Connection

    with BrokerProcess(overrides={
            "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
            "sasl.enabled.mechanisms": "PLAIN", "listener.name.sasl_plaintext.plain.sasl.jaas.config": _USERS_JAAS,
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer", "super.users": "User:admin",
            "allow.everyone.if.no.acl.found": "false", "offsets.topic.num.partitions": "1",
            "share.coordinator.state.topic.num.partitions": "1"}) as broker:
        port = broker.ports["SASL_PLAINTEXT"]

        def connect(user: str) -> Connection:
            return Connection("127.0.0.1", port, security=ClientSecurity(
                sasl_mechanism="PLAIN", username=user, password=f"{user}-secret"))

        topic, group = unique_name("hidden"), unique_name("share")
        admin_conf = {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_PLAINTEXT",
                      "sasl.mechanisms": "PLAIN", "sasl.username": "admin", "sasl.password": "admin-secret"}
        admin = ck.AdminClient(admin_conf)
        admin.create_topics([ck.NewTopic(topic, 1, 1)])[topic].result(30)
        grants = [ck.AclBinding(ck.ResourceType.GROUP, group, ck.ResourcePatternType.LITERAL, "User:alice", "*",
                                op, ck.AclPermissionType.ALLOW) for op in (ck.AclOperation.READ, ck.AclOperation.DESCRIBE)]
        for future in admin.create_acls(grants).values():
            future.result(30)
        member = unique_name("member")
        with connect("admin") as client:  # a member: the group is not empty
            wait_for(lambda: client.call(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": [group]})
                     .coordinators[0].error_code == NONE, what="the group's coordinator")
            wait_for(lambda: client.call(SHARE_GROUP_HEARTBEAT, 1, {
                "group_id": group, "member_id": member, "member_epoch": 0, "rack_id": None,
                "subscribed_topic_names": [topic]}).error_code == NONE, what="the member joined")
        missing = unique_name("missing")
        alter = {"group_id": group, "topics": [
            {"topic_name": name, "partitions": [{"partition_index": 0, "start_offset": 0}]}
            for name in (topic, missing)]}
        with connect("alice") as client:
            body = client.call(ALTER_SHARE_GROUP_OFFSETS, 0, alter)
            # Neither whether the group has members nor whether a topic exists is told to a
            # user who may not read the topic.
            assert {t.topic_name: [p.error_code for p in t.partitions] for t in body.responses} == {
                topic: [TOPIC_AUTHORIZATION_FAILED], missing: [TOPIC_AUTHORIZATION_FAILED]}
            described = client.call(DESCRIBE_SHARE_GROUP_OFFSETS, 0, {"groups": [{"group_id": group, "topics": [
                {"topic_name": name, "partitions": [0]} for name in (topic, missing)]}]})
            assert {t.topic_name: [p.error_code for p in t.partitions] for t in described.groups[0].topics} == {
                topic: [TOPIC_AUTHORIZATION_FAILED], missing: [TOPIC_AUTHORIZATION_FAILED]}
        with connect("admin") as client:  # a user who may read it still hears the group is busy
            body = client.call(ALTER_SHARE_GROUP_OFFSETS, 0, alter)
            assert {t.topic_name: [p.error_code for p in t.partitions] for t in body.responses} == {
                topic: [NON_EMPTY_GROUP], missing: [UNKNOWN_TOPIC_OR_PARTITION]}


# --- item 2: every advertised version of a forwarded API reaches the controller ----------------
ALTER_PARTITION_REASSIGNMENTS, NOT_CONTROLLER = 45, 41
def _advertised() -> dict[int, range]:
    """What a broker's ApiVersions lists: api key -> versions."""
    from types import SimpleNamespace

    from strom.server.apis import load_all, supported_versions

    load_all()
    return {k["api_key"]: range(k["min_version"], k["max_version"] + 1)
            for k in supported_versions(SimpleNamespace(metrics_server=None))}


def test_the_controller_takes_every_version_a_broker_forwards():
    from strom.server.kraft.controller_apis import CLUSTER_OPERATION, FORWARDABLE, VERSIONS
    from strom.server.kraft.forwarding import ENVELOPED

    advertised = _advertised()
    for key in sorted(ENVELOPED):
        assert key in FORWARDABLE and key in CLUSTER_OPERATION, key
        lo, hi = VERSIONS[key]
        assert [v for v in advertised[key] if not lo <= v <= hi] == [], key


def test_a_kraft_broker_forwards_every_version_it_advertises():
    import asyncio
    import contextlib
    from types import SimpleNamespace

    from strom.network.request import RequestContext
    from strom.protocol.messages import RequestHeader
    from strom.server.kraft.broker import KRaftBrokerApis
    from strom.server.kraft.forwarding import ENVELOPED

    forwarded: list[tuple[int, int]] = []

    async def forward(ctx, body):
        forwarded.append((ctx.header.api_key, ctx.header.api_version))
        return {}

    broker = SimpleNamespace(authorizer=SimpleNamespace(authorize=lambda *_: True), forward=forward, controller=None)
    apis = KRaftBrokerApis(broker)
    advertised = _advertised()
    wanted = [(key, v) for key in sorted(ENVELOPED) for v in advertised[key]]
    for key, version in wanted:
        ctx = RequestContext(RequestHeader(key, version, 1, "c", True), "PLAINTEXT", "127.0.0.1:5000", "User:a")
        with contextlib.suppress(AttributeError):  # not forwarded: a local handler read the empty body
            asyncio.run(apis.handle(ctx, SimpleNamespace()))
    assert forwarded == wanted


def test_alter_partition_reassignments_v1_on_a_kraft_broker(kraft_cluster):
    broker = kraft_cluster.brokers[2]
    with RawClient(broker) as client:
        for version in (0, 1):
            fields = {"timeout_ms": 10_000, "topics": []}
            if version >= 1:
                fields["allow_replication_factor_change"] = True
            body = client.call(ALTER_PARTITION_REASSIGNMENTS, version, fields)
            assert (version, body.error_code) == (version, NONE), body
