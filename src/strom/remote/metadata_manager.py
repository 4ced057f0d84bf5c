"""RemoteLogMetadataManager: the remote segments of the tiered partitions this broker hosts, kept
in the `__remote_log_metadata` topic as Kafka's TopicBasedRemoteLogMetadataManager keeps them
(KIP-405), so that every replica of a partition, and its next leader, knows what was copied.

Each record has a null key and a value of strom.log.remote.records.serialize (a segment's
metadata, an update of its state, or a partition's deletion); all the records of one user
partition go to one partition of the topic, Kafka's RemoteLogMetadataTopicPartitioner
(strom.log.remote.partitioner). The topic is made on first use with the `rlmm.config.` settings
(remote.log.metadata.topic.num.partitions, .replication.factor, .retention.ms), delete policy.

One code path in every mode (the embedded broker, ZooKeeper and KRaft clusters), whether a
metadata partition's leader is this broker or another: real Produce and Fetch requests over
this broker's own inter-broker connections (authenticated as the broker), to the leader this
broker's metadata names, looked up again with a growing backoff after NOT_LEADER, an unknown
leader or a lost connection.

- publish: one record, acks=all, to the metadata partition's leader; it returns once this
  manager's own cache has applied it (as Kafka waits for its consumer to reach its own write).
- Reading: one tail task per followed metadata partition (at most the topic's partitions), each
  a long-polling consumer Fetch (read_uncommitted, up to 1 MiB a request) on a connection of its
  own, so a long poll never holds up another partition's reading or a publish. Each assigned
  user partition has its own RemoteLogMetadataCache and its own position in the metadata
  partition: a partition assigned while others of its metadata partition are being read is
  read from the start of the metadata partition without applying anything twice to the others.
  Records of partitions not assigned are skipped, most without decoding (the topic id sits at a
  fixed place in the value). A record a cache refuses (a transition Kafka's states forbid) is
  logged in one line and skipped; reading goes on.
- A cache is ready (`cache`, `wait_ready`) once its metadata partition has been read up to the
  high watermark the first fetch after its assignment answered.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from strom.client.inter_broker import ConnectionPool
from strom.client.topic_io import (
    FETCH_MAX_WAIT_MS,
    PartitionTail,
    create_or_await,
    produce_acks_all,
)
from strom.log.remote import (
    RemoteLogMetadata,
    RemoteLogMetadataCache,
    RemoteLogMetadataStateError,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemotePartitionDeleteMetadata,
    RemoteStorageError,
    partitioner,
    records,
)
from strom.protocol import remote_log_metadata as wire
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.records import CorruptRecordError, build_value_batch, iter_records
from strom.protocol.remote_log_metadata import RemoteLogMetadataError

log = logging.getLogger(__name__)

TOPIC = "__remote_log_metadata"
FETCH_MAX_BYTES = 1 << 20
_CREATE_WAIT_S = 30.0
_CREATE_RETRY_S = 10.0
_PRODUCE_CONNECTIONS = 2  # per leader: publishes are a few per copied segment
# A value's first bytes when it is one of the three records of a partition (frame version 1,
# api key 0, 1 or 2, version 0): its TopicIdPartition follows (name, then the id's 16 bytes).
_PARTITION_RECORD_HEADS = frozenset(bytes((wire.FRAME_VERSION, key, wire.VERSION)) for key in (
    wire.SEGMENT_METADATA, wire.SEGMENT_METADATA_UPDATE, wire.PARTITION_DELETE_METADATA))

Key = tuple[uuid.UUID, str, int]  # (topic id, topic, partition): Kafka's TopicIdPartition


def key_of(metadata: RemoteLogMetadata) -> Key:
    """The user partition a record is about."""
    if isinstance(metadata, (RemoteLogSegmentMetadata, RemoteLogSegmentMetadataUpdate)):
        s = metadata.segment_id
        return s.topic_id, s.topic, s.partition
    if isinstance(metadata, RemotePartitionDeleteMetadata):
        return metadata.topic_id, metadata.topic, metadata.partition
    raise TypeError(f"not remote log metadata: {type(metadata).__name__}")


def _peek_topic_id(value: bytes) -> uuid.UUID | None:
    """The topic id of a partition's record, read without decoding the rest (None: not such a
    record, or not readable so far; the decoder decides)."""
    if value[:3] not in _PARTITION_RECORD_HEADS:
        return None
    length, shift, pos = 0, 0, 3  # the name: a compact string, its length + 1 as a uvarint
    while pos < len(value) and shift < 35:
        byte = value[pos]
        length |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            break
        shift += 7
    else:
        return None
    start = pos + length - 1
    if length < 1 or start + 16 > len(value):
        return None
    return uuid.UUID(bytes=bytes(value[start:start + 16]))


@dataclass(slots=True)
class _Assigned:
    """One assigned user partition: its cache, the next offset of the metadata partition it has
    not considered yet, and the offset it is ready at (the high watermark the first fetch after
    its assignment answered; None until then)."""

    cache: RemoteLogMetadataCache = field(default_factory=RemoteLogMetadataCache)
    next_offset: int = 0
    ready_at: int | None = None
    generation: int = 0

    @property
    def ready(self) -> bool:
        return self.ready_at is not None and self.next_offset >= self.ready_at


class _Follower(PartitionTail):
    """The reading of one metadata partition for the user partitions assigned to it."""

    def __init__(self, manager: RemoteLogMetadataManager, index: int) -> None:
        super().__init__(manager.broker, TOPIC, index, f"broker-{manager.broker.broker_id}-rlmm",
                         FETCH_MAX_BYTES, log)
        self.manager = manager
        self.index = index
        self.assigned: dict[Key, _Assigned] = {}
        self.generation = 0  # of assignments: a fetch answers for those made before it was sent

    def assign(self, key: Key) -> None:
        if key not in self.assigned:
            self.generation += 1
            self.assigned[key] = _Assigned(generation=self.generation)

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.close_conn()
        self.moved()

    # --- the tail --------------------------------------------------------------------------------
    def reading(self) -> bool:
        return bool(self.assigned)

    def leaderless(self) -> None:
        self.manager.create_topic_soon()

    async def refused(self, state: Any, backoff: float) -> None:
        cache = self.broker.metadata_cache
        await cache.wait_for(lambda: cache.partition(TOPIC, self.index) != state, backoff)

    async def read_once(self, leader: int, leader_epoch: int) -> bool:
        position = min(a.next_offset for a in self.assigned.values())
        generation = self.generation
        # A partition waiting to be ready wants the log's end now, not after a long poll.
        waiting = any(a.ready_at is None for a in self.assigned.values())
        error, answer = await self.fetch(leader, leader_epoch, position, 0 if waiting else FETCH_MAX_WAIT_MS)
        if answer is None:
            return False
        if error == ErrorCode.OFFSET_OUT_OF_RANGE:
            self._out_of_range(position, answer.log_start_offset, answer.high_watermark)
            return True
        return self._apply(position, generation, answer.high_watermark, answer.records or b"")

    def _apply(self, position: int, generation: int, high_watermark: int, data: bytes) -> bool:
        batches = self.batches(data, position)
        if batches is None:
            return False
        # Those that have considered every record before `position` take this answer; one
        # assigned since has not, and is read from its own position next time.
        taking = [a for a in self.assigned.values() if a.next_offset >= position]
        for pos, header in batches:
            if header.is_control:
                continue
            pending = {key: a for key, a in self.assigned.items() if position <= a.next_offset <= header.last_offset}
            if pending:
                self._apply_batch(data, pos, header.base_offset, pending)
        end = batches[-1][1].last_offset + 1 if batches else position
        for assigned in taking:
            assigned.next_offset = max(assigned.next_offset, end)
        for assigned in self.assigned.values():
            if assigned.ready_at is None and assigned.generation <= generation:
                assigned.ready_at = high_watermark
        self.moved()
        return True

    def _apply_batch(self, data: bytes, pos: int, base_offset: int, pending: dict[Key, _Assigned]) -> None:
        """The batch's records applied to the caches of `pending`, each from its own position."""
        topic_ids = {key[0] for key in pending}
        try:
            for record in iter_records(data, pos):
                value = record.value
                if value is None:
                    continue
                topic_id = _peek_topic_id(value)
                if topic_id is not None and topic_id not in topic_ids:
                    continue  # a partition this broker does not follow
                try:
                    metadata = records.deserialize(value)
                except RemoteLogMetadataError as e:
                    log.warning("%s-%d offset %d: skipped, not readable: %s", TOPIC, self.index, record.offset, e)
                    continue
                key = key_of(metadata)
                assigned = pending.get(key)
                if assigned is None or assigned.next_offset > record.offset:
                    continue
                try:
                    assigned.cache.apply(metadata)
                except RemoteLogMetadataStateError as e:
                    log.warning("%s-%d offset %d: skipped for %s-%d: %s", TOPIC, self.index, record.offset,
                                key[1], key[2], e)
                assigned.next_offset = record.offset + 1
        except CorruptRecordError as e:
            log.warning("%s-%d: skipped the batch at offset %d: %s", TOPIC, self.index, base_offset, e)

    def _out_of_range(self, position: int, log_start: int, high_watermark: int) -> None:
        if position < log_start:
            log.warning("%s-%d: offsets before %d are gone (retention); reading on from there",
                        TOPIC, self.index, log_start)
            for assigned in self.assigned.values():
                assigned.next_offset = max(assigned.next_offset, log_start)
            return
        # Past the log's end: the topic was made again, or its leader lost records we applied.
        # What this broker read no longer stands: every cache is built again from the start.
        log.warning("%s-%d: offset %d is past the log's end %d; reading the partition again",
                    TOPIC, self.index, position, high_watermark)
        for key in self.assigned:
            self.generation += 1
            self.assigned[key] = _Assigned(next_offset=max(log_start, 0), generation=self.generation)
        self.moved()


class RemoteLogMetadataManager:
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self._followers: dict[int, _Follower] = {}
        self._where: dict[Key, int] = {}  # an assigned user partition's metadata partition
        self._pool = ConnectionPool(broker, _PRODUCE_CONNECTIONS)
        self._creation: asyncio.Task | None = None
        self._creation_failed_at = 0.0  # a failed creation is tried again by a reader after a while
        self._closed = False

    # --- where records go ------------------------------------------------------------------------
    def partition_count(self) -> int:
        """The metadata topic's partitions: as created, or as configured until it exists."""
        topic = self.broker.metadata_cache.topics.get(TOPIC)
        if topic is not None and topic.partitions:
            return len(topic.partitions)
        return self.broker.config.remote_metadata_setting("remote.log.metadata.topic.num.partitions")

    def metadata_partition(self, topic_id: uuid.UUID, topic: str, partition: int) -> int:
        """The partition of `__remote_log_metadata` holding the user partition's records (Kafka's
        partitioner: the topic's name plays no part)."""
        return partitioner.metadata_partition(topic_id, partition, self.partition_count())

    # --- assignment ------------------------------------------------------------------------------
    async def assign(self, partitions: Iterable[tuple[uuid.UUID, str, int]]) -> None:
        """This broker hosts these tiered partitions (as leader or follower): read their records."""
        if self._closed:
            return
        for key in partitions:
            key = (key[0], key[1], key[2])
            if key in self._where:
                continue
            index = self.metadata_partition(*key)
            follower = self._followers.get(index)
            if follower is None:
                follower = self._followers[index] = _Follower(self, index)
                follower.assign(key)
                follower.start()
            else:
                follower.assign(key)
            self._where[key] = index
        if self._where and TOPIC not in self.broker.metadata_cache.topics:
            self.create_topic_soon()

    def unassign(self, partitions: Iterable[tuple[uuid.UUID, str, int]]) -> None:
        for key in partitions:
            key = (key[0], key[1], key[2])
            index = self._where.pop(key, None)
            if index is None:
                continue
            follower = self._followers[index]
            del follower.assigned[key]
            if follower.assigned:
                follower.moved()  # a publish waiting on the partition returns
            else:
                follower.stop()
                del self._followers[index]

    def followed_partitions(self) -> list[int]:
        """The metadata partitions being read now."""
        return sorted(i for i, f in self._followers.items() if f.task is not None and not f.task.done())

    def cache(self, topic_id: uuid.UUID, topic: str, partition: int) -> RemoteLogMetadataCache | None:
        """The user partition's remote segments, once its metadata partition has been read up to
        where it ended when the partition was assigned; None before (or when not assigned). A
        partition whose metadata was read again (its metadata partition's log went back) gets a
        new cache: ask for it each time rather than keeping it."""
        assigned = self._assigned((topic_id, topic, partition))
        return assigned.cache if assigned is not None and assigned.ready else None

    async def wait_ready(self, topic_id: uuid.UUID, topic: str, partition: int,
                         timeout_s: float) -> RemoteLogMetadataCache:
        key = (topic_id, topic, partition)
        index = self._where.get(key)
        if index is None:
            raise RemoteStorageError(f"{topic}-{partition} is not assigned to the remote log metadata manager")
        follower = self._followers[index]
        deadline = asyncio.get_running_loop().time() + timeout_s
        await follower.wait(lambda: (a := follower.assigned.get(key)) is None or a.ready, deadline)
        cache = self.cache(*key)
        if cache is None:
            raise RemoteStorageError(
                f"the remote log metadata of {topic}-{partition} ({TOPIC}-{index}) was not read within {timeout_s:g} s")
        return cache

    def _assigned(self, key: Key) -> _Assigned | None:
        index = self._where.get(key)
        return None if index is None else self._followers[index].assigned.get(key)

    # --- writing ---------------------------------------------------------------------------------
    async def publish(self, metadata: RemoteLogMetadata, timeout_s: float = 30.0) -> None:
        """Write the record (acks=all) and return once this manager's cache of its partition has
        applied it (at once after the write when the partition is not assigned here). Raises
        RemoteStorageError when that does not happen within `timeout_s`."""
        if self._closed:
            raise RemoteStorageError("the remote log metadata manager is closed")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        key = key_of(metadata)
        value = records.serialize(metadata)
        await self._ensure_topic(deadline)
        index = self.metadata_partition(*key)
        offset = await self._produce(index, value, deadline)
        follower = self._followers.get(index)
        if follower is None or key not in follower.assigned:
            return
        if not await follower.wait(lambda: (a := follower.assigned.get(key)) is None or a.next_offset > offset,
                                   deadline):
            raise RemoteStorageError(f"{TOPIC}-{index} was not read up to its offset {offset} "
                                     f"within {timeout_s:g} s")

    async def _produce(self, index: int, value: bytes, deadline: float) -> int:
        """The offset of the record once the metadata partition's leader has it acks=all."""
        batch = build_value_batch([value], timestamp=int(time.time() * 1000))
        return await produce_acks_all(self.broker, self._pool, TOPIC, index, batch, deadline,
                                      lambda: self._closed, RemoteStorageError, log, f"{TOPIC}-{index}")

    # --- the topic -------------------------------------------------------------------------------
    def create_topic_soon(self) -> None:
        """Start making the topic, unless that is under way (or it exists)."""
        if self._closed or TOPIC in self.broker.metadata_cache.topics:
            return
        if self._creation is None or self._creation.done() and (
                self._creation.cancelled() or self._creation.exception() is None
                or asyncio.get_running_loop().time() - self._creation_failed_at >= _CREATE_RETRY_S):
            self._creation = asyncio.get_running_loop().create_task(self._create_topic(), name=f"create {TOPIC}")
            self._creation.add_done_callback(self._created)

    def _created(self, creation: asyncio.Task) -> None:
        if not creation.cancelled() and creation.exception() is not None:
            self._creation_failed_at = asyncio.get_running_loop().time()
            log.warning("cannot create %s: %s", TOPIC, creation.exception())

    async def _ensure_topic(self, deadline: float) -> None:
        if TOPIC in self.broker.metadata_cache.topics:
            return
        self.create_topic_soon()
        creation = self._creation
        remaining = deadline - asyncio.get_running_loop().time()
        done, _ = await asyncio.wait([creation], timeout=max(remaining, 0))
        if not done:
            raise RemoteStorageError(f"{TOPIC} is being created")
        if creation.cancelled():
            raise RemoteStorageError(f"the creation of {TOPIC} was cancelled")
        if creation.exception() is not None:
            raise RemoteStorageError(f"cannot create {TOPIC}: {creation.exception()}")

    async def _create_topic(self) -> None:
        broker = self.broker
        config = broker.config
        partitions = config.remote_metadata_setting("remote.log.metadata.topic.num.partitions")
        factor = config.remote_metadata_setting("remote.log.metadata.topic.replication.factor")
        retention = config.remote_metadata_setting("remote.log.metadata.topic.retention.ms")
        live = len(broker.metadata_cache.live_brokers)
        if live < factor:
            if broker.clustered or getattr(broker, "forwards_admin", False):
                raise KafkaError(f"Number of alive brokers '{live}' does not meet the required replication "
                                 f"factor '{factor}' for the internal topic {TOPIC} (configured via "
                                 f"'rlmm.config.remote.log.metadata.topic.replication.factor')",
                                 ErrorCode.INVALID_REPLICATION_FACTOR)
            factor = max(live, 1)  # the embedded broker: its one broker holds it
        configs = {"cleanup.policy": "delete", "retention.ms": str(retention), "retention.bytes": "-1",
                   "min.insync.replicas": str(min(2, factor))}
        if await create_or_await(broker, TOPIC, partitions, factor, configs, _CREATE_WAIT_S):
            log.info("created internal topic %s (%d partitions, replication factor %d)", TOPIC, partitions, factor)

    async def close(self) -> None:
        self._closed = True
        tasks = [f.task for f in self._followers.values() if f.task is not None]
        for follower in self._followers.values():
            follower.stop()
        self._followers.clear()
        self._where.clear()
        if self._creation is not None:
            self._creation.cancel()
            tasks.append(self._creation)
        await asyncio.gather(*tasks, return_exceptions=True)
        self._pool.close()
