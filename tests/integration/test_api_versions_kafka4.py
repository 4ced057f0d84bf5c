"""ApiVersions key by key against what a Kafka 4.0 broker advertises.

The table is Kafka 4.0.0's answer on a client listener (protocol guide and KIP-896's removals),
written here by hand. Strom differs only where it says why below: it is a ZooKeeper-mode
cluster (its inter-broker APIs are Kafka 3.x's, and KRaft's quorum APIs do not exist), and
where Kafka 4.1 advertises a wider range it has that one: JoinGroup v0-v1 (dropped by 4.0,
served again by 4.1), AlterPartitionReassignments v1 (4.1's
allow_replication_factor_change) and KIP-932's share group APIs: ShareGroupHeartbeat,
ShareGroupDescribe, ShareFetch and ShareAcknowledge at v1, their first stable version in 4.1
(4.0's v0 was early access, not advertised by default), the share group offsets APIs at v0, and
the share coordinator's inter-broker share-state RPCs (Initialize/Read/Write/Delete
ShareGroupState, ReadShareGroupStateSummary) at v0."""

from __future__ import annotations

import pytest
from kafka.admin import KafkaAdminClient

from strom.client import Connection
from strom.testing import BrokerProcess

API_VERSIONS = 18

KAFKA_4_0 = {
    0: (0, 12),   # Produce: v0-v2 advertised for librdkafka's sake, refused (KAFKA-18659)
    1: (4, 17), 2: (1, 10), 3: (0, 13), 8: (2, 9), 9: (1, 9), 10: (0, 6), 11: (2, 9), 12: (0, 4),
    13: (0, 5), 14: (0, 5), 15: (0, 6), 16: (0, 5), 17: (0, 1), 18: (0, 4), 19: (2, 7), 20: (1, 6),
    21: (0, 2), 22: (0, 5), 23: (2, 4), 24: (0, 5), 25: (0, 4), 26: (0, 5), 27: (1, 1), 28: (0, 5),
    29: (1, 3), 30: (1, 3), 31: (1, 3), 32: (1, 4), 33: (0, 2), 34: (1, 2), 35: (1, 4), 36: (0, 2),
    37: (0, 3), 38: (1, 3), 39: (1, 2), 40: (1, 2), 41: (1, 3), 42: (0, 2), 43: (0, 2), 44: (0, 1),
    45: (0, 0), 46: (0, 0), 47: (0, 0), 48: (0, 1), 49: (0, 1), 50: (0, 0), 51: (0, 0),
    55: (0, 2),   # DescribeQuorum (KRaft)
    57: (0, 2), 60: (0, 2), 61: (0, 0),
    64: (0, 0),   # UnregisterBroker (KRaft)
    65: (0, 0), 66: (0, 1), 68: (0, 1), 69: (0, 1), 74: (0, 0), 75: (0, 0),
    80: (0, 0), 81: (0, 0),  # AddRaftVoter, RemoveRaftVoter (KRaft)
}
KRAFT_ONLY = {55, 64, 80, 81}
# What a ZooKeeper-mode broker adds: LeaderAndIsr, StopReplica, UpdateMetadata and
# ControlledShutdown at the versions Kafka 3.x's controller sends, and AlterPartition.
ZOOKEEPER_MODE = {4: (7, 7), 5: (4, 4), 6: (8, 8), 7: (3, 3), 56: (0, 1)}
AS_KAFKA_4_1 = {11: (0, 9), 45: (0, 1),
                76: (1, 1), 77: (1, 1), 78: (1, 1), 79: (1, 1),  # ShareGroupHeartbeat/Describe, ShareFetch/Acknowledge
                83: (0, 0), 84: (0, 0), 85: (0, 0), 86: (0, 0), 87: (0, 0),  # the share-state RPCs
                90: (0, 0), 91: (0, 0), 92: (0, 0)}  # Describe/Alter/DeleteShareGroupOffsets
TELEMETRY = {71: (0, 0), 72: (0, 0)}  # only with a place for pushed metrics to go


def advertised(port: int) -> dict[int, tuple[int, int]]:
    with Connection("127.0.0.1", port) as conn:
        body = conn.call(API_VERSIONS, 4, {"client_software_name": "t", "client_software_version": "1"})
    assert body.error_code == 0
    return {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}


def expected(telemetry: bool) -> dict[int, tuple[int, int]]:
    table = {k: v for k, v in KAFKA_4_0.items() if k not in KRAFT_ONLY}
    table |= ZOOKEEPER_MODE | AS_KAFKA_4_1
    return table | (TELEMETRY if telemetry else {})


@pytest.mark.parametrize("metrics", [False, True], ids=["plain", "metrics-endpoint"])
def test_api_versions_match_kafka_4_0_key_by_key(metrics: bool):
    with BrokerProcess(overrides={"metrics.port": "0"} if metrics else None) as broker:
        got = advertised(broker.port)
    want = expected(telemetry=metrics)
    differences = {k: (got.get(k), want.get(k)) for k in sorted(got.keys() | want.keys()) if got.get(k) != want.get(k)}
    assert differences == {}, "api key: (Strom, expected)"


def test_kafka_python_takes_strom_for_kafka_4_0():
    with BrokerProcess() as broker:
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        try:
            assert str(admin.get_broker_version_data(0)) == "<BrokerVersionData 4.0>"
        finally:
            admin.close()


def test_produce_below_v3_is_advertised_but_refused():
    from strom.protocol import messages

    with BrokerProcess() as broker, Connection("127.0.0.1", broker.port) as conn:
        conn.send_raw(messages.encode_request(0, 2, {"acks": 1, "timeout_ms": 1000, "topic_data": []}))
        assert conn.read_frame() is None  # closed, as Kafka 4.0 does
