"""What a KRaft broker's metadata publisher hands its broker.

Past its controlled shutdown the broker acts on no more metadata, as Kafka's broker closes its
publishers once its shutdown begins: the changes that move every partition off it (100,000 at
the largest) would otherwise be applied, a slice at a time, while it stops. And a broker new to
the cluster hears of the topics made before it joined, which its log holds ahead of its own
registration."""

import asyncio
import uuid
from types import SimpleNamespace

from strom.metadata import records as r
from strom.metadata.image import MetadataImage
from strom.metadata.loader import MetadataDelta
from strom.server.kraft.publisher import PUBLISH_SLICE, BrokerMetadataPublisher


def _image(partitions: int, broker: int = 1) -> MetadataImage:
    """Topic "orders" on broker 1, as broker `broker` has it (only broker 1 registered)."""
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

    inter_broker_listener = "PLAINTEXT"

    def __init__(self, broker_id: int = 1, stops: bool = True) -> None:
        self.broker_id = broker_id
        self.stops = stops
        self.stopping = False
        self.delivered: list[int] = []
        self.requests: list[tuple[int, dict]] = []
        self.replica_manager = SimpleNamespace(partitions={})

    async def deliver_local(self, api_key: int, version: int, fields: dict) -> SimpleNamespace:
        self.delivered.append(api_key)
        self.requests.append((api_key, fields))
        if api_key == 4 and self.stops:  # the first slice of LeaderAndIsr
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


def test_a_broker_not_yet_registered_hears_of_the_topics_before_it() -> None:
    """Broker 4 replays topic "orders" before its own registration is in its log: the topic
    still reaches its metadata cache, and no client is told of broker 4 itself."""
    broker, image = StoppingBroker(broker_id=4, stops=False), _image(3)
    tid = image.topics["orders"].topic_id
    asyncio.run(_publisher(broker).publish(image, MetadataDelta(partitions={(tid, i) for i in range(3)})))
    updates = [fields for key, fields in broker.requests if key == 6]
    assert updates, broker.delivered
    told = {(t["topic_name"], p["partition_index"]) for u in updates for t in u["topic_states"]
            for p in t["partition_states"]}
    assert told == {("orders", 0), ("orders", 1), ("orders", 2)}
    assert all(b["id"] != 4 for u in updates for b in u["live_brokers"])
