"""Where a KRaft broker's metadata comes from: the committed records of `__cluster_metadata`,
from a Raft driver that runs on a thread of its own.

A combined node's broker reads the node's own quorum (the controller's driver): it starts from a
copy of the controller's image, taken between two applied effects, and then follows every
effect committed after it. A dedicated broker runs an observer of the quorum (a Raft driver
that fetches from the leader and never votes) in `metadata.log.dir`, on its own thread, as a
Kafka broker runs its RaftManager, and snapshots its image there when the Raft core says one
is due. Either way the effects cross to the broker's loop through a
queue, in order, and the broker's MetadataLoader replays them there.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

from strom.controller.loop_thread import LoopThread
from strom.controller.quorum_controller import snapshot_image
from strom.metadata.image import MetadataImage
from strom.metadata.loader import MetadataLoader
from strom.metadata.storage import METADATA_PARTITION_DIR, parse_kafka_uuid
from strom.raft import effects as fx
from strom.raft.driver import RaftDriver
from strom.raft.snapshots import read_snapshot

log = logging.getLogger(__name__)


class MetadataFeed:
    """Raft effects from the driver's thread to the loader, on the broker's loop."""

    def __init__(self, loader: MetadataLoader) -> None:
        self.loader = loader
        self.loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._task = self.loop.create_task(self._run(), name="metadata-loader")

    def on_effect(self, e: fx.Effect) -> None:
        """Called on the driver's thread, after the effect is durable."""
        if isinstance(e, (fx.Committed, fx.LoadSnapshot)):
            self.loop.call_soon_threadsafe(self._queue.put_nowait, e)

    def start_from(self, image: MetadataImage) -> None:
        """Called on the controller's thread, before any effect after `image` is given."""
        self.loop.call_soon_threadsafe(self._queue.put_nowait, image)

    async def image_copy(self) -> MetadataImage | None:
        """A copy of the image between two replays (called on the broker's loop), or None in
        the middle of a metadata transaction: what a snapshot of this broker's log holds."""
        done = self.loop.create_future()
        self._queue.put_nowait(done)
        return await done

    async def _run(self) -> None:
        while True:
            item = await self._queue.get()
            try:
                if isinstance(item, asyncio.Future):
                    image = self.loader.image
                    item.set_result(None if image.transaction is not None else image.copy())
                elif isinstance(item, MetadataImage):
                    await self.loader.load_image(item)
                elif isinstance(item, fx.LoadSnapshot):
                    image = await asyncio.to_thread(_image_of_snapshot, item.data)
                    image.end_offset = item.snapshot_id.offset
                    await self.loader.load_image(image)
                else:
                    batches = [b for b in item.batches if b.base_offset >= self.loader.offset]
                    await self.loader.replay_batches(batches)
            except Exception:
                log.exception("metadata change at offset %d not applied", self.loader.offset)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def _image_of_snapshot(data: bytes) -> MetadataImage:
    image = MetadataImage()
    image.replay_values(read_snapshot(data).values)
    return image


class MetadataObserver:
    """A dedicated broker's own Raft driver, an observer of the quorum, on a thread of its own."""

    def __init__(self, config: Any, cluster_id: str, directory_id: str | None, feed: MetadataFeed) -> None:
        self.config = config
        self.cluster_id = cluster_id
        self.directory_id = parse_kafka_uuid(directory_id) if directory_id else None
        self.feed = feed
        self.thread: LoopThread | None = None
        self.driver: RaftDriver | None = None
        self.transport: Any = None

    async def start(self) -> None:
        self.thread = LoopThread(f"metadata-observer-{self.config.broker_id}")
        await self.thread.call(self._start())

    async def _start(self) -> None:
        from strom.security.sasl import broker_security
        from strom.server.kraft.controller_server import ControllerView, quorum_config
        from strom.server.kraft.raft_transport import RaftTransport

        qc = quorum_config(self.config, self.cluster_id)
        self.transport = RaftTransport(qc, self.config.controller_listener_names[0], lambda: self.driver.core.voters,
                                       broker_security(ControllerView(self.config)))
        self.driver = RaftDriver(qc, self.config.metadata_log_dir / METADATA_PARTITION_DIR, self.transport,
                                 listener=self._on_effect, rng=random.Random(), directory_id=self.directory_id,
                                 segment_bytes=self.config["metadata.log.segment.bytes"])
        await self.driver.start()

    def _on_effect(self, e: fx.Effect) -> None:
        if isinstance(e, fx.SnapshotDue):
            asyncio.get_running_loop().create_task(self._snapshot())
        else:
            self.feed.on_effect(e)

    async def _snapshot(self) -> None:
        """metadata.log.max.record.bytes.between.snapshots (or the interval) passed: the
        broker snapshots the image it has applied, and its log before that goes, as a Kafka
        broker's does; otherwise its copy of the metadata log would grow for ever."""
        copy = asyncio.run_coroutine_threadsafe(self.feed.image_copy(), self.feed.loop)
        await snapshot_image(self.driver, await asyncio.wrap_future(copy))

    async def close(self) -> None:
        if self.thread is None:
            return
        try:
            await self.thread.call(self._close())
        finally:
            self.thread.stop()

    async def _close(self) -> None:
        if self.driver is not None and self.driver.core is not None:
            await self.driver.close(resign=False)
        if self.transport is not None:
            self.transport.close()
