"""Feature versioning (KIP-584): ApiVersions v3+ reports the supported features and the
finalized levels with their epoch; UpdateFeatures v0-v2 changes them, all or nothing; the
levels live in the metadata store and survive a restart; group.version gates KIP-848."""

from __future__ import annotations

import pytest
from kafka.admin import KafkaAdminClient

from strom.client import Connection
from strom.protocol.errors import ErrorCode
from strom.testing import BrokerProcess, wait_for

FIND_COORDINATOR, API_VERSIONS, UPDATE_FEATURES, CONSUMER_GROUP_HEARTBEAT = 10, 18, 57, 68
UPGRADE, SAFE_DOWNGRADE = 1, 2


@pytest.fixture
def broker():
    with BrokerProcess() as proc:
        yield proc


def features(conn: Connection, version: int = 4):
    body = conn.call(API_VERSIONS, version, {"client_software_name": "t", "client_software_version": "1"})
    assert body.error_code == 0
    supported = {f.name: (f.min_version, f.max_version) for f in body.supported_features or []}
    finalized = {f.name: (f.min_version_level, f.max_version_level) for f in body.finalized_features or []}
    return supported, finalized, body.finalized_features_epoch


def update(conn: Connection, version: int, *updates: tuple[str, int, int], validate_only: bool = False):
    entries = []
    for name, level, kind in updates:
        entry = {"feature": name, "max_version_level": level}
        entry |= {"upgrade_type": kind} if version >= 1 else {"allow_downgrade": kind != UPGRADE}
        entries.append(entry)
    fields = {"timeout_ms": 10000, "feature_updates": entries}
    if version >= 1:
        fields["validate_only"] = validate_only
    return conn.call(UPDATE_FEATURES, version, fields)


def test_a_new_cluster_finalizes_what_kafka_4_0_does(broker):
    with Connection("127.0.0.1", broker.port) as conn:
        supported, finalized, epoch = features(conn)
        # share.version (KIP-932) is Kafka 4.1's; Strom finalizes it at 1 (share groups on), and
        # eligible.leader.replicas.version (KIP-966) at 1, as Kafka 4.1 does for a new cluster.
        assert supported == {"metadata.version": (7, 25), "transaction.version": (0, 2), "group.version": (0, 1),
                             "share.version": (0, 1), "eligible.leader.replicas.version": (0, 1)}
        assert finalized == {"metadata.version": (25, 25), "transaction.version": (2, 2), "group.version": (1, 1),
                             "share.version": (1, 1), "eligible.leader.replicas.version": (1, 1)}
        assert epoch == 0
        # Before v3 the fields do not exist on the wire.
        old = conn.call(API_VERSIONS, 2, {})
        assert old.error_code == 0 and not getattr(old, "supported_features", None)


def test_kafka_python_describes_and_updates_features(broker):
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        assert admin.update_features({"transaction.version": ("SAFE_DOWNGRADE", 1)}) == {"transaction.version": "OK"}
        described = admin.describe_features()
        assert described["transaction.version"]["finalized"] == (1, 1)
        assert described["transaction.version"]["finalized_epoch"] == 1
        assert described["metadata.version"]["finalized"] == (25, 25)
        # Lowering to 0 removes the feature from the finalized list.
        admin.update_features({"transaction.version": ("SAFE_DOWNGRADE", 0)})
        assert "finalized" not in admin.describe_features()["transaction.version"]
        admin.update_features({"transaction.version": 2})
        assert admin.describe_features()["transaction.version"]["finalized"] == (2, 2)
    finally:
        admin.close()


def test_refused_updates_change_nothing(broker):
    with Connection("127.0.0.1", broker.port) as conn:
        _, before, epoch = features(conn)
        cases = [
            (("unknown.feature", 1, UPGRADE), "not supported"),
            (("transaction.version", 1, UPGRADE), "SAFE_DOWNGRADE"),  # lower without saying so
            (("transaction.version", 3, UPGRADE), "outside the range"),
            (("metadata.version", 20, SAFE_DOWNGRADE), "cannot be downgraded"),
            (("metadata.version", 0, SAFE_DOWNGRADE), "cannot be downgraded"),
        ]
        for u, message in cases:
            body = update(conn, 2, u)
            assert body.error_code == ErrorCode.INVALID_UPDATE_VERSION, u
            assert message in body.error_message, (u, body.error_message)
        # All or nothing: a good update next to a bad one is not applied either.
        body = update(conn, 1, ("group.version", 0, SAFE_DOWNGRADE), ("unknown.feature", 1, UPGRADE))
        assert body.error_code == 0
        assert {r.feature: r.error_code for r in body.results} == {
            "group.version": ErrorCode.NONE, "unknown.feature": ErrorCode.INVALID_UPDATE_VERSION}
        body = update(conn, 2, ("group.version", 0, SAFE_DOWNGRADE), ("group.version", 1, UPGRADE))
        assert body.error_code == ErrorCode.INVALID_REQUEST and "more than once" in body.error_message
        assert update(conn, 2).error_code == ErrorCode.INVALID_REQUEST
        # validate_only checks and writes nothing.
        assert update(conn, 2, ("group.version", 0, SAFE_DOWNGRADE), validate_only=True).error_code == 0
        assert features(conn)[1:] == (before, epoch)


def test_v0_answers_per_feature_and_allow_downgrade_means_safe_downgrade(broker):
    with Connection("127.0.0.1", broker.port) as conn:
        body = update(conn, 0, ("transaction.version", 1, UPGRADE))
        assert body.error_code == 0
        assert [(r.feature, r.error_code) for r in body.results] == [
            ("transaction.version", ErrorCode.INVALID_UPDATE_VERSION)]
        body = update(conn, 0, ("transaction.version", 1, SAFE_DOWNGRADE))
        assert [(r.feature, r.error_code) for r in body.results] == [("transaction.version", 0)]
        assert features(conn)[1]["transaction.version"] == (1, 1)


def test_finalized_levels_survive_a_restart(broker):
    with Connection("127.0.0.1", broker.port) as conn:
        assert update(conn, 2, ("transaction.version", 1, SAFE_DOWNGRADE)).error_code == 0
    broker.stop()
    broker.start()
    with Connection("127.0.0.1", broker.port) as conn:
        _, finalized, epoch = features(conn)
    assert finalized["transaction.version"] == (1, 1) and epoch == 1


def test_group_version_0_turns_the_consumer_protocol_away(broker):
    heartbeat = {"group_id": "g-features", "member_id": "", "member_epoch": 0, "instance_id": None,
                 "rack_id": None, "rebalance_timeout_ms": 30000, "subscribed_topic_names": ["t"],
                 "server_assignor": None, "topic_partitions": []}
    with Connection("127.0.0.1", broker.port) as conn:
        conn.call(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": ["g-features"]})
        # The offsets topic is made by that first lookup; its coordinator loads in a moment.
        wait_for(lambda: conn.call(CONSUMER_GROUP_HEARTBEAT, 0, heartbeat).error_code == 0,
                 timeout=30, what="a first KIP-848 heartbeat accepted")
        assert update(conn, 2, ("group.version", 0, SAFE_DOWNGRADE)).error_code == 0
        body = conn.call(CONSUMER_GROUP_HEARTBEAT, 0, {**heartbeat, "group_id": "g-features-2"})
        assert body.error_code == ErrorCode.UNSUPPORTED_VERSION
        assert "group.version" in body.error_message
