"""MetadataLoader: what a broker's publishers are handed, and that a change whose publishing
failed is not lost."""

from __future__ import annotations

import asyncio
import uuid

from strom.metadata import loader as loader_module
from strom.metadata import records as r
from strom.metadata.image import MetadataImage
from strom.metadata.loader import MetadataLoader


def _image_with_topic(name: str) -> MetadataImage:
    image = MetadataImage()
    tid = uuid.uuid4()
    image.replay(r.TopicRecord(name=name, topic_id=tid))
    image.replay(r.PartitionRecord(partition_id=0, topic_id=tid, replicas=[1], isr=[1], removing_replicas=[],
                                   adding_replicas=[], leader=1, leader_recovery_state=0, leader_epoch=0,
                                   partition_epoch=0, directories=[None]))
    return image


def test_a_failed_publish_is_done_again_whole(monkeypatch):
    monkeypatch.setattr(loader_module, "RETRY_S", 0.01)
    seen = []

    async def publisher(image, delta):
        seen.append((sorted(image.topics), delta.full, sorted(delta.removed_topics)))
        if len(seen) == 1:
            raise RuntimeError("a handler failed")

    async def run():
        loader = MetadataLoader()
        loader.publishers.append(publisher)
        await loader.load_image(_image_with_topic("a"))
        await asyncio.sleep(0.2)
        return loader

    loader = asyncio.run(run())
    assert seen == [(["a"], True, []), (["a"], True, [])]
    assert loader.published.is_set()


def test_the_offset_reported_as_caught_up_is_the_published_one(monkeypatch):
    """A broker tells the controller it has caught up (and is unfenced for it) only once its
    parts have acted on the metadata, not when the image has merely read it."""
    monkeypatch.setattr(loader_module, "RETRY_S", 0.05)
    failing = [True]
    offsets = []

    async def publisher(image, delta):
        offsets.append((loader.offset, loader.published_offset))
        if failing[0]:
            raise RuntimeError("a handler failed")

    async def run():
        loader.publishers.append(publisher)
        image = _image_with_topic("a")
        image.end_offset = 7
        await loader.load_image(image)
        failed = (loader.offset, loader.published_offset)
        failing[0] = False
        await asyncio.sleep(0.3)  # the retry
        return failed

    loader = MetadataLoader()
    assert asyncio.run(run()) == (7, 0)
    assert offsets[0] == (7, 0) and loader.published_offset == 7


def test_starting_again_from_an_image_names_the_topics_it_no_longer_has():
    seen = []

    async def publisher(image, delta):
        seen.append((sorted(image.topics), sorted(delta.removed_topics)))

    async def run():
        loader = MetadataLoader()
        loader.publishers.append(publisher)
        await loader.load_image(_image_with_topic("gone"))
        await loader.load_image(_image_with_topic("kept"))

    asyncio.run(run())
    assert seen == [(["gone"], []), (["kept"], ["gone"])]
