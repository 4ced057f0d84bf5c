"""A KRaft broker past its controlled shutdown acts on no more metadata, as Kafka's broker
closes its publishers once its shutdown begins: the changes that move every partition off it
(100,000 at the largest) would otherwise be applied, a slice at a time, while it stops."""

import asyncio
import uuid
from types import SimpleNamespace

from strom.metadata import records as r
from strom.metadata.image import MetadataImage
from strom.metadata.loader import MetadataDelta
from strom.server.kraft.publisher import PUBLISH_SLICE, BrokerMetadataPublisher


def _image(partitions: int) -> MetadataImage:
    image, tid = MetadataImage(), uuid.uuid4()
    image.replay(r.RegisterBrokerRecord(
        broker_id=1, incarnation_id=uuid.uuid4(), broker_epoch=5,
        end_points=[r.RegisterBrokerRecord.BrokerEndpoint(name="PLAINTEXT", host="127.0.0.1", port=9091,
                                                          security_protocol=0)],
        features=[], rack=None, fenced=False))
    image.replay(r.TopicRecord(name="orders", topic_id=tid))
    for i in range(partitions):
        image.replay(r.PartitionRecord(partition_id=i, topic_id=tid, replicas=[1], isr=[1], leader=1,
                                       leader_epoch=0, partition_epoch=0, directories=[None]))
    return image


class StoppingBroker:
    """Delivers the publisher's requests to nobody, and begins its shutdown after the first."""

    broker_id = 1
    inter_broker_listener = "PLAINTEXT"

    def __init__(self) -> None:
        self.stopping = False
        self.delivered: list[int] = []
        self.replica_manager = SimpleNamespace(partitions={})

    async def deliver_local(self, api_key: int, version: int, fields: dict) -> SimpleNamespace:
        self.delivered.append(api_key)
        if api_key == 4:  # the first slice of LeaderAndIsr
            self.stopping = True
        return SimpleNamespace(error_code=0)


def _publisher(broker: StoppingBroker) -> BrokerMetadataPublisher:
    publisher = BrokerMetadataPublisher(broker)
    publisher._publish_configs = publisher._publish_security = lambda image, delta: None
    return publisher


def test_a_stopping_broker_applies_no_further_slice_of_a_change() -> None:
    broker = StoppingBroker()
    asyncio.run(_publisher(broker).publish(_image(3 * PUBLISH_SLICE), MetadataDelta(full=True)))
    assert broker.delivered.count(4) == 1  # of three slices, only the one begun before the stop


def test_a_stopped_broker_applies_no_change_at_all() -> None:
    broker = StoppingBroker()
    broker.stopping = True
    asyncio.run(_publisher(broker).publish(_image(2), MetadataDelta(full=True)))
    assert broker.delivered == []
