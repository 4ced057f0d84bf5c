"""MetadataImage: replay of Kafka's metadata records, and a snapshot (records()) that replays
into an equal image."""

from __future__ import annotations

import uuid

import pytest

from strom.metadata import records as r
from strom.metadata.image import FENCE, TOPIC_RESOURCE, UNFENCE, MetadataImage
from strom.metadata.model import EndPoint


def _broker(broker_id: int, epoch: int) -> r.RegisterBrokerRecord:
    return r.RegisterBrokerRecord(
        broker_id=broker_id, incarnation_id=uuid.uuid4(), broker_epoch=epoch,
        end_points=[r.RegisterBrokerRecord.BrokerEndpoint(name="PLAINTEXT", host="127.0.0.1", port=9090 + broker_id,
                                                          security_protocol=0)],
        features=[r.RegisterBrokerRecord.BrokerFeature(name="metadata.version", min_supported_version=7,
                                                        max_supported_version=25)],
        rack=None, fenced=True)


def _image_state(img: MetadataImage) -> tuple:
    return (img.features, img.brokers, {n: (t.topic_id, t.partitions) for n, t in img.topics.items()},
            img.configs, img.client_quotas, img.scram, img.acls, img.delegation_tokens, img.next_producer_id)


def test_replay_and_snapshot_round_trip():
    img = MetadataImage()
    tid = uuid.uuid4()
    log = [
        r.FeatureLevelRecord(name="metadata.version", feature_level=25),
        r.FeatureLevelRecord(name="group.version", feature_level=1),
        _broker(1, 10), _broker(2, 11),
        r.UnfenceBrokerRecord(id=1, epoch=10),
        r.BrokerRegistrationChangeRecord(broker_id=2, broker_epoch=11, fenced=UNFENCE),
        r.FenceBrokerRecord(id=1, epoch=9),  # a stale epoch: ignored
        r.TopicRecord(name="orders", topic_id=tid),
        r.PartitionRecord(partition_id=0, topic_id=tid, replicas=[1, 2], isr=[1, 2], leader=1, leader_epoch=0,
                          partition_epoch=0, directories=[None, None]),
        r.PartitionRecord(partition_id=1, topic_id=tid, replicas=[2, 1], isr=[2, 1], leader=2, leader_epoch=0,
                          partition_epoch=0, directories=[None, None]),
        r.PartitionChangeRecord(partition_id=0, topic_id=tid, isr=[1]),
        r.PartitionChangeRecord(partition_id=1, topic_id=tid, leader=1, isr=[1]),
        r.ConfigRecord(resource_type=TOPIC_RESOURCE, resource_name="orders", name="retention.ms", value="1000"),
        r.ConfigRecord(resource_type=4, resource_name="", name="log.retention.hours", value="1"),
        r.ConfigRecord(resource_type=4, resource_name="", name="log.retention.hours", value=None),
        r.ClientQuotaRecord(entity=[r.ClientQuotaRecord.EntityData(entity_type="user", entity_name="alice")],
                            key="producer_byte_rate", value=1024.0, remove=False),
        r.ProducerIdsRecord(broker_id=1, broker_epoch=10, next_producer_id=2000),
        r.AccessControlEntryRecord(id=uuid.uuid4(), resource_type=2, resource_name="orders", pattern_type=3,
                                   principal="User:alice", host="*", operation=3, permission_type=3),
        r.UserScramCredentialRecord(name="alice", mechanism=1, salt=b"s", stored_key=b"k", server_key=b"v",
                                    iterations=4096),
        r.NoOpRecord(),
    ]
    for rec in log:
        img.replay(r.decode(r.encode(rec)))
    assert img.features == {"metadata.version": 25, "group.version": 1}
    assert not img.brokers[1].fenced and not img.brokers[2].fenced
    assert img.brokers[1].endpoints == [EndPoint("PLAINTEXT", "127.0.0.1", 9091, "PLAINTEXT")]
    p0, p1 = img.topics["orders"].partitions[0], img.topics["orders"].partitions[1]
    # An ISR change keeps the leader epoch; a new leader starts one; both are partition epochs.
    assert (p0.leader, p0.leader_epoch, p0.isr, p0.partition_epoch) == (1, 0, [1], 1)
    assert (p1.leader, p1.leader_epoch, p1.isr, p1.partition_epoch) == (1, 1, [1], 1)
    assert img.configs == {(TOPIC_RESOURCE, "orders"): {"retention.ms": "1000"}}
    assert img.next_producer_id == 2000 and img.partition_count == 2

    copy = img.copy()
    snapshot = img.encode()
    assert r.decode(snapshot[0]).name == "metadata.version"
    again = MetadataImage()
    again.replay_values(snapshot)
    assert _image_state(again) == _image_state(img)

    # The copy keeps its state while the image moves on; removing a topic drops its configs.
    img.replay(r.RemoveTopicRecord(topic_id=tid))
    assert "orders" not in img.topics and not img.configs and img.partition_count == 0
    assert copy.topics["orders"].partitions[0] is p0


def test_unknown_partition_changes_are_refused():
    img = MetadataImage()
    with pytest.raises(ValueError):
        img.replay(r.PartitionChangeRecord(partition_id=0, topic_id=uuid.uuid4(), isr=[1]))
    img.replay(r.BrokerRegistrationChangeRecord(broker_id=5, broker_epoch=1, fenced=FENCE))  # no such broker
    assert img.brokers == {}


def test_a_copy_taken_inside_a_metadata_transaction_replays_on_its_own():
    """A broker may copy a controller's image between two batches of one transaction (a topic of
    more than 10,000 partitions): both go on replaying the same records, and each applies every
    record once (a shared list of pending records applied a leader change twice)."""
    tid = uuid.uuid4()
    img = MetadataImage()
    img.replay(r.BeginTransactionRecord(name="big topic"))
    img.replay(r.TopicRecord(name="big", topic_id=tid))
    copy = img.copy()
    rest = [r.PartitionRecord(partition_id=0, topic_id=tid, replicas=[1, 2], isr=[1, 2], removing_replicas=[],
                              adding_replicas=[], leader=1, leader_recovery_state=0, leader_epoch=0,
                              partition_epoch=0, directories=[None, None]),
            r.PartitionChangeRecord(partition_id=0, topic_id=tid, leader=2),
            r.EndTransactionRecord()]
    for rec in rest:  # interleaved, as the controller and its broker replay the same batches
        img.replay(rec)
        copy.replay(rec)
    for image in (img, copy):
        state = image.topics["big"].partitions[0]
        assert image.transaction is None and (state.leader, state.leader_epoch) == (2, 1)
