"""MetadataLoader: a broker's copy of the cluster metadata, replayed from `__cluster_metadata`,
and what each replay changed (Kafka's MetadataLoader handing a MetadataDelta to publishers).

The loader owns its MetadataImage and changes it only from the loop it runs on; the committed
batches it is given come from the Raft driver's thread. A large batch is decoded in a worker
thread (pure work on bytes) and replayed a slice at a time, so that a topic of 100,000
partitions does not hold the broker's loop. What a replay touched is gathered in a
MetadataDelta, handed to the publishers once no metadata transaction is open (KIP-868: its
records are applied only when it ends).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from strom.metadata import records as r
from strom.metadata.image import MetadataImage, PartitionState
from strom.protocol.raft_records import data_values

# Records replayed between two turns of the loop; above DECODE_OFF_LOOP records a batch list
# is decoded in a worker thread.
REPLAY_SLICE = 2_000
DECODE_OFF_LOOP = 2_000
RETRY_S = 1.0  # after a publish that failed

log = logging.getLogger(__name__)

_BROKER_RECORDS = (r.RegisterBrokerRecord, r.UnregisterBrokerRecord, r.FenceBrokerRecord, r.UnfenceBrokerRecord,
                   r.BrokerRegistrationChangeRecord)
_OTHER = {r.ClientQuotaRecord: "quotas", r.AccessControlEntryRecord: "acls", r.RemoveAccessControlEntryRecord: "acls",
          r.UserScramCredentialRecord: "scram", r.RemoveUserScramCredentialRecord: "scram",
          r.DelegationTokenRecord: "tokens", r.RemoveDelegationTokenRecord: "tokens", r.FeatureLevelRecord: "features",
          r.ProducerIdsRecord: "producer_ids"}


@dataclass
class MetadataDelta:
    """What changed between two published images. `full` (a snapshot was loaded, or the loader
    started from a copy) means everything is to be looked at again."""

    full: bool = False
    partitions: set[tuple[uuid.UUID, int]] = field(default_factory=set)  # (topic id, index)
    # Topics removed, with their last partition states: a broker must stop their replicas.
    removed_topics: dict[str, tuple[uuid.UUID, dict[int, PartitionState]]] = field(default_factory=dict)
    brokers: bool = False
    configs: set[tuple[int, str]] = field(default_factory=set)  # (resource type, name)
    other: set[str] = field(default_factory=set)  # "acls", "quotas", "scram", "tokens", "features"

    def __bool__(self) -> bool:
        return bool(self.full or self.partitions or self.removed_topics or self.brokers or self.configs or self.other)


Publisher = Callable[[MetadataImage, MetadataDelta], Awaitable[None]]


class MetadataLoader:
    def __init__(self, image: MetadataImage | None = None) -> None:
        self.image = image or MetadataImage()
        self.publishers: list[Publisher] = []
        self._delta = MetadataDelta(full=image is not None)
        self.published = asyncio.Event()  # set after the first publish
        # The offset up to which every publisher has acted on the log: what a broker reports
        # to the controller as caught up, as Kafka's loader's last applied offset.
        self.published_offset = 0
        self._publishing = asyncio.Lock()

    @property
    def offset(self) -> int:
        """The offset up to which the image has applied the log (its next record's)."""
        return self.image.end_offset

    async def replay_batches(self, batches: list[Any]) -> None:
        """Committed batches of the metadata log, in offset order."""
        data = [b for b in batches if not b.is_control]
        count = sum(b.last_offset - b.base_offset + 1 for b in data)

        def decode() -> list[Any]:
            return [r.decode(v) for b in data for v in data_values(b.data)]

        records = await asyncio.to_thread(decode) if count > DECODE_OFF_LOOP else decode()
        for i in range(0, len(records), REPLAY_SLICE):
            for rec in records[i:i + REPLAY_SLICE]:
                self._note(rec)
                self.image.replay(rec)
            if len(records) > REPLAY_SLICE:
                await asyncio.sleep(0)
        if batches:
            self.image.end_offset = batches[-1].end_offset
        await self._publish()

    async def load_image(self, image: MetadataImage) -> None:
        """Start again from `image` (a snapshot that was loaded, or a copy of a controller's)."""
        old = self.image
        self.image = image
        delta = MetadataDelta(full=True)
        for name, topic in old.topics.items():
            if image.topics.get(name) is None or image.topics[name].topic_id != topic.topic_id:
                delta.removed_topics[name] = (topic.topic_id, dict(topic.partitions))
        delta.removed_topics.update(self._delta.removed_topics)
        self._delta = delta
        await self._publish()

    def _note(self, rec: Any) -> None:
        delta, kind = self._delta, type(rec)
        if kind is r.PartitionRecord or kind is r.PartitionChangeRecord:
            delta.partitions.add((rec.topic_id, rec.partition_id))
        elif kind is r.RemoveTopicRecord:
            topic = self.image.topics_by_id.get(rec.topic_id)
            if topic is not None:
                delta.removed_topics[topic.name] = (topic.topic_id, dict(topic.partitions))
        elif kind is r.ConfigRecord:
            delta.configs.add((rec.resource_type, rec.resource_name))
        elif kind in _BROKER_RECORDS:
            delta.brokers = True
        elif kind in _OTHER:
            delta.other.add(_OTHER[kind])

    async def _publish(self) -> None:
        async with self._publishing:  # one at a time: a change is never applied after a later one
            await self._publish_delta()

    async def _publish_delta(self) -> None:
        if self.image.transaction is not None:
            return
        offset = self.image.end_offset  # the image may move on while the publishers work
        if not self._delta:
            self.published_offset = offset
            return
        delta, self._delta = self._delta, MetadataDelta()
        for publish in self.publishers:
            try:
                await publish(self.image, delta)
            except Exception:
                # What this change was is lost with it: the next publish looks at everything,
                # and comes soon even if the metadata does not change again.
                log.exception("metadata at offset %d not published; publishing all of it again", self.offset)
                self._delta.full = True
                asyncio.get_running_loop().call_later(RETRY_S, lambda: asyncio.ensure_future(self._publish()))
                return
        self.published_offset = offset
        self.published.set()
