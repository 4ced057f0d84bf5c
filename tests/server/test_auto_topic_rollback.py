"""A creation undone because a log could not be made leaves nothing behind: its answer comes
only once the metadata store has forgotten the topic, so the same name can be created again
at once (brokers' metadata drops a deleted topic before the controller removes it from the
store, after every replica's log is gone)."""

import asyncio
import uuid
from types import SimpleNamespace

import pytest

from strom.metadata.cache import MetadataCache
from strom.metadata.model import PartitionState, TopicMetadata
from strom.protocol.errors import ErrorCode, KafkaError
from strom.server.auto_topic_creation import AutoTopicCreationManager


class SlowForgettingAdmin:
    """The controller's deletion as it happens: brokers' metadata forgets the topic at once,
    the store some turns of the loop later, and a creation of a name still in the store fails."""

    def __init__(self, cache_topics: dict, recorded_for: int) -> None:
        self.cache_topics = cache_topics
        self.recorded = {"t"}
        self.recorded_for = recorded_for

    def delete_topic(self, name: str) -> None:
        self.cache_topics.pop(name, None)

    def is_recorded(self, name: str) -> bool:
        if self.recorded_for == 0:
            self.recorded.discard(name)
        self.recorded_for -= 1
        return name in self.recorded

    def create_topic(self, name: str) -> None:
        if name in self.recorded:
            raise KafkaError(f"Topic '{name}' already exists.", ErrorCode.TOPIC_ALREADY_EXISTS)
        self.recorded.add(name)


def _broker(recorded_for: int) -> SimpleNamespace:
    cache = MetadataCache(broker_id=1)
    cache.topics["t"] = TopicMetadata("t", uuid.uuid4(), {0: PartitionState(1, 0, [1], [1])})
    offline = SimpleNamespace(log=SimpleNamespace(offline=True), is_leader=True)

    async def store_io(fn, *args):
        await asyncio.sleep(0)
        return fn(*args)

    return SimpleNamespace(broker_id=1, metadata_cache=cache, admin=SlowForgettingAdmin(cache.topics, recorded_for),
                           replica_manager=SimpleNamespace(get_partition=lambda *_: offline), store_io=store_io)


def test_an_undone_creation_is_answered_once_the_store_forgot_the_topic() -> None:
    broker = _broker(recorded_for=5)

    async def scenario() -> None:
        with pytest.raises(KafkaError) as failed:
            await AutoTopicCreationManager(broker).wait_until_created("t", 1, timeout_s=5)
        assert failed.value.code == ErrorCode.KAFKA_STORAGE_ERROR
        await broker.store_io(broker.admin.create_topic, "t")  # the name is free again

    asyncio.run(scenario())
    assert broker.admin.recorded == {"t"}
