"""What Metadata and DescribeTopicPartitions say of a partition whose leader is not a live
broker: Kafka's LEADER_NOT_AVAILABLE with no leader id (as between a broker's death and its
partitions' election: a new ZooKeeper controller first tells the brokers who is alive, with
every partition's state as it was)."""

import uuid

from strom.metadata.model import PartitionState, TopicMetadata
from strom.protocol.errors import ErrorCode
from strom.server.apis.metadata import _partitions, _topic_entry

TOPIC = TopicMetadata("t", uuid.uuid4(), {
    0: PartitionState(1, 4, [1, 2], [1, 2]),  # led by a live broker
    1: PartitionState(3, 7, [3, 2], [3, 2]),  # led by broker 3, which is dead
    2: PartitionState(-1, 2, [3], [3]),  # no leader at all
})
LIVE = {1: object(), 2: object()}


def test_metadata_names_no_dead_leader():
    answered = [(e.error_code, e.leader, e.leader_epoch, list(e.offline)) for e in _partitions(TOPIC, LIVE)]
    assert answered == [(ErrorCode.NONE, 1, 4, []),
                        (ErrorCode.LEADER_NOT_AVAILABLE, -1, 7, [3]),
                        (ErrorCode.LEADER_NOT_AVAILABLE, -1, 2, [3])]


def test_describe_topic_partitions_names_no_dead_leader():
    answered = [(p["error_code"], p["leader_id"]) for p in _topic_entry(TOPIC, LIVE)["partitions"]]
    assert answered == [(ErrorCode.NONE, 1), (ErrorCode.LEADER_NOT_AVAILABLE, -1),
                        (ErrorCode.LEADER_NOT_AVAILABLE, -1)]
