"""A combined node's broker starts from a copy of its controller's image and then follows the
effects applied after it: the copy must reach the broker's loader before any of them, whatever
the two threads do meanwhile."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

from strom.controller.loop_thread import LoopThread
from strom.metadata import records as r
from strom.metadata.image import MetadataImage
from strom.metadata.loader import MetadataLoader
from strom.protocol.raft_records import data_batch, data_values
from strom.raft import effects as fx
from strom.raft.log import LogBatch
from strom.server.kraft.controller_server import ControllerServer
from strom.server.kraft.metadata_source import MetadataFeed


def _partition(tid: uuid.UUID) -> r.PartitionRecord:
    return r.PartitionRecord(partition_id=0, topic_id=tid, replicas=[1], isr=[1], removing_replicas=[],
                             adding_replicas=[], leader=1, leader_recovery_state=0, leader_epoch=0,
                             partition_epoch=0, directories=[None])


class _Controller:
    """The quorum controller's part in attaching: an image, and effects applied to it."""

    def __init__(self, image: MetadataImage) -> None:
        self.image = image

    async def _on_raft(self, e: fx.Committed) -> None:
        for batch in e.batches:
            self.image.replay_values(data_values(batch.data))
        self.image.end_offset = e.batches[-1].end_offset


class _Image(MetadataImage):
    """An image whose copying makes the controller apply `effect` as soon as it can: right
    after the attach that copies it lets go of the lock."""

    def copy(self) -> MetadataImage:
        asyncio.get_running_loop().create_task(self.server._on_raft(self.effect))
        return super().copy()


def test_the_copy_reaches_the_broker_before_the_effects_after_it():
    old, new = uuid.uuid4(), uuid.uuid4()
    image = _Image()
    image.replay(r.TopicRecord(name="old", topic_id=old))
    image.replay(_partition(old))
    image.end_offset = 2
    # The next committed batch: a new topic, and a change to the old one's partition.
    values = [r.encode(x) for x in (r.TopicRecord(name="new", topic_id=new), _partition(new),
                                    r.PartitionChangeRecord(partition_id=0, topic_id=old, isr=[1], leader=-2))]
    image.effect = fx.Committed(5, (LogBatch(2, 4, 1, False, data_batch(values, 2, 1, 0)),))

    async def run() -> tuple[MetadataImage, list]:
        thread = LoopThread("controller-test")
        server = ControllerServer.__new__(ControllerServer)
        server.thread, server.metadata_listeners, server.authorizer = thread, [], None
        server.delegation_tokens, server._acls_of, server._tokens_of = SimpleNamespace(enabled=False), None, None
        server.controller = _Controller(image)
        image.server = server
        server._applying = await thread.call(_lock())
        loader = MetadataLoader()
        removed = []

        async def publisher(_image, delta):
            removed.extend(delta.removed_topics)

        loader.publishers.append(publisher)
        feed = MetadataFeed(loader)
        await server.attach_broker(feed)
        for _ in range(200):
            if loader.offset == 5:
                break
            await asyncio.sleep(0.01)
        await feed.close()
        thread.stop()
        return loader.image, removed

    got, removed = asyncio.run(run())
    assert got.end_offset == 5
    assert sorted(got.topics) == ["new", "old"]
    assert got.topics["old"].partitions[0].zk_version == 1  # the change applied once, on top of the copy
    assert removed == []


async def _lock() -> asyncio.Lock:
    return asyncio.Lock()
