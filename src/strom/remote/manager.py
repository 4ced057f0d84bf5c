"""RemoteLogManager: the tiered-storage work of a broker (Kafka's RemoteLogManager, KIP-405).

For each tiered partition it leads, a periodic task (remote.log.manager.task.interval.ms):
- copies each rolled segment below the last stable offset to the remote store, with its
  indexes, producer snapshot and leader epochs, recording COPY_SEGMENT_STARTED / FINISHED in
  `__remote_log_metadata` (a leader change in between leaves the copy unfinished: the new
  leader's cleaning deletes it);
- expires remote segments past retention.ms / retention.bytes (of the whole log) or below the
  log start offset, moving the log start offset first so that no reader is sent to them;
- cleans what no epoch serves: copies left STARTED by a crash, deletions a crash interrupted,
  segments a later copy replaced.
For every tiered partition it hosts (leader or follower) it keeps the log's
highest_offset_in_remote_storage, which local retention waits for.

Fetches below a leader's local log start are read here (`read`). The loop only schedules:
store calls and segment reads run in bounded thread pools (copier, expiration, reader)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from strom.log.producer_state import ProducerStateManager
from strom.log.remote import (
    IndexType,
    RemoteLogMetadataCache,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    RemoteStorageError,
    RemoteStorageManager,
)
from strom.log.remote.metadata_cache import is_within_lineage
from strom.log.txn_index import AbortedTxn
from strom.protocol.errors import KafkaError
from strom.remote.reader import READ_CAP, IndexCache, RemoteReader
from strom.remote.segment_data import (
    ProducerReplay,
    epoch_entries,
    parse_epoch_checkpoint,
    segment_data,
)
from strom.throttle import TokenBucket

log = logging.getLogger(__name__)

_S = RemoteLogSegmentState
Key = tuple[uuid.UUID, str, int]  # topic id, topic, partition
ERROR_LOG_INTERVAL_S = 60.0
YIELD_EVERY = 4096  # partitions looked at between two turns of the event loop
YIELD_EVERY_TIERED = 64  # tiered partitions whose remote segments are walked between two turns


class RemoteFetchRefused(Exception):
    """Too many remote reads are waiting (remote.log.reader.max.pending.tasks)."""


@dataclass(slots=True)
class PartitionTiering:
    """What the manager keeps of one tiered partition it hosts."""

    key: Key
    copying: asyncio.Task | None = None
    expiring: asyncio.Task | None = None
    in_flight: set[uuid.UUID] = field(default_factory=set)  # segment ids this broker is copying
    copy_lag_bytes: int = 0
    copy_lag_segments: int = 0
    remote_size_bytes: int = 0
    remote_segments: int = 0
    producer_replay: ProducerReplay | None = None  # carried from one copy to the next ...
    replay_epoch: int = -1  # ... within one leader epoch (a new one may have truncated the log)


@dataclass(slots=True)
class RemoteStats:
    """Kafka's remote storage metrics (BrokerTopicStats' Remote*), broker-wide totals."""

    copy_bytes: int = 0
    copy_requests: int = 0
    copy_errors: int = 0
    fetch_bytes: int = 0
    fetch_requests: int = 0
    fetch_errors: int = 0
    delete_requests: int = 0
    delete_errors: int = 0
    store_unavailable: bool = False


class RemoteLogManager:
    def __init__(self, broker_id: int, config: dict[str, Any], storage: RemoteStorageManager, metadata,
                 partitions: Callable[[], Iterable[Any]], now_ms: Callable[[], int] | None = None) -> None:
        """`metadata`: the RemoteLogMetadataManager; `partitions`: the hosted Partitions (of
        the replica manager), looked at every task interval. `config`: the broker's values."""
        self.broker_id = broker_id
        self.config = config
        self.storage = storage
        self.metadata = metadata
        self.partitions = partitions
        self.now_ms = now_ms or (lambda: int(time.time() * 1000))
        self.tiered: dict[Key, PartitionTiering] = {}
        self.stats = RemoteStats()
        self._copiers = ThreadPoolExecutor(config["remote.log.manager.copier.thread.pool.size"], "remote-copy")
        self._expirers = ThreadPoolExecutor(config["remote.log.manager.expiration.thread.pool.size"], "remote-expire")
        self._readers = ThreadPoolExecutor(config["remote.log.reader.threads"], "remote-read")
        self._copy_slots = asyncio.Semaphore(config["remote.log.manager.copier.thread.pool.size"])
        self._pending_reads = 0
        self._prefetching = 0  # read-aheads under way (reader threads), at most half of them
        self._max_prefetching = max(1, config["remote.log.reader.threads"] // 2)
        self.copy_quota = TokenBucket(lambda: self.config["remote.log.manager.copy.max.bytes.per.second"])
        self.fetch_quota = TokenBucket(lambda: self.config["remote.log.manager.fetch.max.bytes.per.second"])
        self.reader = RemoteReader(storage, IndexCache(config["remote.log.index.file.cache.total.size.bytes"]))
        self._task: asyncio.Task | None = None
        self._last_error_log = 0.0
        self._deleting: set[asyncio.Task] = set()
        self.closed = False

    # --- lifecycle ---

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="remote-log-manager")

    async def close(self) -> None:
        self.closed = True
        tasks = [t for t in (self._task, *(p.copying for p in self.tiered.values()),
                             *(p.expiring for p in self.tiered.values()), *self._deleting) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for pool in (self._copiers, self._expirers, self._readers):
            pool.shutdown(wait=False, cancel_futures=True)
        await self.metadata.close()
        await asyncio.to_thread(self.storage.close)

    async def _run(self) -> None:
        while not self.closed:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("remote log manager task failed")
            await asyncio.sleep(self.config["remote.log.manager.task.interval.ms"] / 1000)

    # --- the periodic task ---

    async def tick(self) -> None:
        """Follow the tiered partitions hosted now; for each whose remote metadata is read,
        keep its highest remote offset, and as leader start its copy and expiration."""
        hosted: dict[Key, Any] = {}
        every: dict[Key, Any] = {}  # of the partitions followed so far: which are still here
        for i, p in enumerate(list(self.partitions())):
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)  # 100,000 partitions are looked at in slices
            key = (p.topic_id, p.topic, p.index)
            if key in self.tiered:
                every[key] = p
            if p.log.tiered and not p.log.offline:
                hosted[key] = p
        new = [k for k in hosted if k not in self.tiered]
        gone = [k for k in self.tiered if k not in hosted]
        for k in new:
            self.tiered[k] = PartitionTiering(k)
        if new:
            await self.metadata.assign(new)
        if gone:
            for k in gone:
                state = self.tiered.pop(k)
                for t in (state.copying, state.expiring):
                    if t is not None:
                        t.cancel()
                p = every.get(k)
                if p is not None and not p.log.offline and not p.log.tiered:
                    self._tiering_disabled(p)
            self.metadata.unassign(gone)
        for i, (key, p) in enumerate(hosted.items()):
            if i % YIELD_EVERY_TIERED == YIELD_EVERY_TIERED - 1:
                await asyncio.sleep(0)  # each costs a walk of its remote segments
            if key not in self.tiered:
                continue  # dropped while this tick yielded
            cache = self.metadata.cache(*key)
            if cache is None:
                continue
            state = self.tiered[key]
            self._update_remote_offsets(p, cache, state)
            if not p.is_leader:
                continue
            loop = asyncio.get_running_loop()
            if state.copying is None or state.copying.done():
                state.copying = loop.create_task(self._copy(p, cache, state), name=f"remote copy {p.topic}-{p.index}")
                state.copying.add_done_callback(_report_failure)
            if state.expiring is None or state.expiring.done():
                state.expiring = loop.create_task(self._expire(p, cache, state),
                                                  name=f"remote expire {p.topic}-{p.index}")
                state.expiring.add_done_callback(_report_failure)

    async def _follow(self, p) -> Key:
        """Follow a partition's remote log metadata now, before the next task interval would."""
        key = (p.topic_id, p.topic, p.index)
        if key not in self.tiered:
            self.tiered[key] = PartitionTiering(key)
            await self.metadata.assign([key])
        return key

    def _update_remote_offsets(self, p, cache: RemoteLogMetadataCache, state: PartitionTiering) -> None:
        log_ = p.log
        lineage = lineage_of(log_)
        served = served_segments(cache, lineage, log_.log_end_offset)
        state.remote_segments = len(served)
        state.remote_size_bytes = sum(m.size_bytes for m in served)
        highest = highest_remote_offset(cache, lineage)
        if highest > log_.highest_offset_in_remote_storage:
            log_.highest_offset_in_remote_storage = highest
        segments = log_.segments
        lag = [s for s, nxt in zip(segments, segments[1:], strict=False) if nxt.base_offset - 1 > highest]
        state.copy_lag_segments = len(lag)
        state.copy_lag_bytes = sum(s.size for s in lag)

    def _still_leading(self, p, epoch: int) -> bool:
        return not self.closed and p.is_leader and p.leader_epoch == epoch and not p.log.closed

    # --- copy ---

    async def _copy(self, p, cache: RemoteLogMetadataCache, state: PartitionTiering) -> None:
        log_ = p.log
        if log_.config.remote_log_copy_disable:
            return
        epoch = p.leader_epoch
        if state.replay_epoch != epoch:
            state.producer_replay, state.replay_epoch = None, epoch
        copied = log_.highest_offset_in_remote_storage
        lso = p.last_stable_offset
        segments = log_.segments
        for segment, nxt in zip(segments, segments[1:], strict=False):
            end = nxt.base_offset  # the segment holds [base, end)
            if end - 1 <= copied or segment.base_offset < log_.local_log_start_offset:
                continue
            if end > lso or not self._still_leading(p, epoch):
                return
            try:
                await self._copy_segment(p, epoch, segment, end, state)
            except (RemoteStorageError, OSError) as e:
                self.stats.copy_errors += 1
                self._store_error(f"cannot copy segment {segment.base_offset} of {p.topic}-{p.index} "
                                  f"to remote storage: {e}")
                return
            except (KafkaError, ValueError) as e:  # the log changed under the copy (truncated, deleted)
                self.stats.copy_errors += 1
                log.info("%s-%d: copy of segment %d given up for now: %s", p.topic, p.index,
                         segment.base_offset, e)
                return
            self.stats.store_unavailable = False
            copied = end - 1
            self._update_remote_offsets(p, cache, state)

    async def _copy_segment(self, p, epoch: int, segment, end: int, state: PartitionTiering) -> None:
        log_ = p.log
        loop = asyncio.get_running_loop()
        async with self._copy_slots:
            data, state.producer_replay = await loop.run_in_executor(
                self._copiers, segment_data, log_, segment, end, state.producer_replay)
            metadata = RemoteLogSegmentMetadata(
                RemoteLogSegmentId(p.topic_id, p.topic, p.index), segment.base_offset, end - 1,
                segment.largest_timestamp, self.broker_id, self.now_ms(),
                epoch_entries(log_, segment.base_offset, end), segment.size)
            if not metadata.segment_leader_epochs:
                raise RemoteStorageError(f"no leader epoch covers offset {segment.base_offset}")
            state.in_flight.add(metadata.segment_id.id)
            try:
                await self.metadata.publish(metadata)
                while (wait := self.copy_quota.wait_s()) > 0:
                    await asyncio.sleep(min(wait, 1.0))
                self.copy_quota.record(segment.size)
                try:
                    await loop.run_in_executor(self._copiers, self.storage.copy_log_segment_data, metadata, data)
                except BaseException:
                    await self._delete_objects_quietly(metadata)
                    raise
                if not self._still_leading(p, epoch):
                    # fenced: left COPY_SEGMENT_STARTED, for the next leader's cleaning
                    await self._delete_objects_quietly(metadata)
                    return
                await self.metadata.publish(self._update(metadata, _S.COPY_SEGMENT_FINISHED))
            finally:
                state.in_flight.discard(metadata.segment_id.id)
        self.stats.copy_bytes += segment.size
        self.stats.copy_requests += 1
        log_.highest_offset_in_remote_storage = max(log_.highest_offset_in_remote_storage, end - 1)
        log.info("%s-%d: copied segment [%d, %d] (%d bytes) to remote storage", p.topic, p.index,
                 segment.base_offset, end - 1, segment.size)

    async def _delete_objects_quietly(self, metadata: RemoteLogSegmentMetadata) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(
                self._copiers, self.storage.delete_log_segment_data, metadata)
        except Exception as e:  # cleaning deletes them later
            log.debug("cannot delete the objects of an unfinished copy: %s", e)

    def _update(self, metadata: RemoteLogSegmentMetadata, state: RemoteLogSegmentState) -> RemoteLogSegmentMetadataUpdate:
        return RemoteLogSegmentMetadataUpdate(metadata.segment_id, self.now_ms(), state, self.broker_id)

    # --- expiration and cleaning ---

    async def _expire(self, p, cache: RemoteLogMetadataCache, state: PartitionTiering) -> None:
        log_ = p.log
        epoch = p.leader_epoch
        config = log_.config
        lineage = lineage_of(log_)
        served = served_segments(cache, lineage, log_.log_end_offset)
        now = self.now_ms()
        expired: list[RemoteLogSegmentMetadata] = []
        why: dict[uuid.UUID, str] = {}
        if config.delete_enabled:
            excess = -1
            if config.retention_bytes >= 0:
                local_only = sum(s.size for s in log_.segments if s.base_offset > log_.highest_offset_in_remote_storage)
                excess = sum(m.size_bytes for m in served) + local_only - config.retention_bytes
            for m in served:
                by_time = config.retention_ms >= 0 and now - m.max_timestamp_ms > config.retention_ms
                by_size = excess >= m.size_bytes
                below_start = m.end_offset < log_.log_start_offset
                if not (by_time or by_size or below_start):
                    break
                expired.append(m)
                why[m.segment_id.id] = ("retention.ms" if by_time else "retention.bytes" if by_size
                                        else "below the log start")
                excess -= m.size_bytes
        else:
            expired = [m for m in served if m.end_offset < log_.log_start_offset]
            why.update((m.segment_id.id, "below the log start") for m in expired)
        if expired:
            # readers first: the log starts after what goes (Kafka moves it before deleting)
            new_start = expired[-1].end_offset + 1
            if new_start > log_.log_start_offset and self._still_leading(p, epoch):
                log_.increment_log_start_offset(min(new_start, log_.log_end_offset))
        ours = state.in_flight
        unreferenced = [m for m in cache.unreferenced_segments() if m.segment_id.id not in ours]
        for m in [*expired, *unreferenced]:
            if not self._still_leading(p, epoch):
                return
            try:
                await self._delete_segment(cache, m, why.get(m.segment_id.id, "no epoch serves it"))
            except (RemoteStorageError, OSError) as e:
                self.stats.delete_errors += 1
                self._store_error(f"cannot delete remote segment {m.segment_id.id} of {p.topic}-{p.index}: {e}")
                return

    async def _delete_segment(self, cache: RemoteLogMetadataCache, m: RemoteLogSegmentMetadata,
                              why: str = "its partition is deleted") -> None:
        current = cache.segment(m.segment_id)
        if current is None:
            return
        if current.state is not _S.DELETE_SEGMENT_STARTED:
            await self.metadata.publish(self._update(m, _S.DELETE_SEGMENT_STARTED))
        await asyncio.get_running_loop().run_in_executor(self._expirers, self.storage.delete_log_segment_data, m)
        await self.metadata.publish(self._update(m, _S.DELETE_SEGMENT_FINISHED))
        self.stats.store_unavailable = False
        self.stats.delete_requests += 1
        log.info("%s-%d: deleted remote segment [%d, %d] (%s, %s; max timestamp %d, epochs %s)",
                 m.segment_id.topic, m.segment_id.partition, m.start_offset, m.end_offset, why,
                 current.state.name, m.max_timestamp_ms, list(m.segment_leader_epochs))

    def partition_deleted(self, topic_id: uuid.UUID, topic: str, index: int, whole_partition: bool = True) -> None:
        """The partition's topic was deleted, or (not `whole_partition`) its remote storage
        turned off with remote.log.delete.on.disable (KIP-950): delete its remote segments in
        the background."""
        task = asyncio.get_running_loop().create_task(
            self._delete_partition((topic_id, topic, index), whole_partition), name=f"remote delete {topic}-{index}")
        self._deleting.add(task)
        task.add_done_callback(self._deleting.discard)

    def _tiering_disabled(self, p) -> None:
        """remote.storage.enable turned off (KIP-950: only with its data deleted): the log starts
        at its local start again, and its leader deletes what is in remote storage."""
        log_ = p.log
        if log_.local_log_start_offset > log_.log_start_offset:
            log_.increment_log_start_offset(log_.local_log_start_offset)
        log_.highest_offset_in_remote_storage = -1
        if p.is_leader and log_.config.remote_log_delete_on_disable:
            log.info("%s-%d: remote storage turned off; deleting its remote data", p.topic, p.index)
            self.partition_deleted(p.topic_id, p.topic, p.index, whole_partition=False)

    async def _delete_partition(self, key: Key, whole_partition: bool = True) -> None:
        topic_id, topic, index = key
        backoff = self.config["remote.log.manager.task.retry.backoff.ms"] / 1000
        await self.metadata.assign([key])
        try:
            while not self.closed:
                try:
                    cache = await self.metadata.wait_ready(*key, timeout_s=30.0)
                    if not cache.all_segments() and (cache.partition_delete_state is None or not whole_partition):
                        return  # never tiered, or nothing left
                    for state in (RemotePartitionDeleteState.DELETE_PARTITION_MARKED,
                                  RemotePartitionDeleteState.DELETE_PARTITION_STARTED):
                        if whole_partition and (cache.partition_delete_state is None
                                                or cache.partition_delete_state < state):
                            await self.metadata.publish(self._partition_delete(key, state))
                    for m in cache.all_segments():
                        await self._delete_segment(cache, m)
                    if whole_partition and cache.partition_delete_state != \
                            RemotePartitionDeleteState.DELETE_PARTITION_FINISHED:
                        await self.metadata.publish(
                            self._partition_delete(key, RemotePartitionDeleteState.DELETE_PARTITION_FINISHED))
                    log.info("%s-%d: remote data deleted", topic, index)
                    return
                except (RemoteStorageError, OSError) as e:
                    self._store_error(f"cannot delete the remote data of {topic}-{index}: {e}")
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, self.config["remote.log.manager.task.retry.backoff.max.ms"] / 1000)
        finally:
            if key not in self.tiered:
                self.metadata.unassign([key])

    def _partition_delete(self, key: Key, state: RemotePartitionDeleteState) -> RemotePartitionDeleteMetadata:
        return RemotePartitionDeleteMetadata(key[0], key[1], key[2], state, self.now_ms(), self.broker_id)

    def _store_error(self, message: str) -> None:
        self.stats.store_unavailable = True
        now = time.monotonic()
        if now - self._last_error_log >= ERROR_LOG_INTERVAL_S:
            self._last_error_log = now
            log.warning("%s (retried every remote.log.manager.task.interval.ms; local segments are kept "
                        "until copied)", message)

    # --- remote reads ---

    def segment_for(self, p, offset: int) -> RemoteLogSegmentMetadata | None:
        """The remote segment a fetch at `offset` reads, within the leader's epoch lineage."""
        cache = self.metadata.cache(p.topic_id, p.topic, p.index)
        if cache is None:
            return None
        log_ = p.log
        epoch = log_.leader_epoch_cache.epoch_for(offset)
        return cache.segment_for(epoch, offset, lineage_of(log_), log_.log_end_offset)

    async def read(self, p, offset: int, max_bytes: int, min_one_message: bool,
                   upper_bound: int | None) -> tuple[bytes, list[AbortedTxn] | None]:
        """Batches from `offset` out of the remote segment holding it, and with `upper_bound`
        (read_committed: the last stable offset) the aborted transactions they overlap.
        Raises LookupError when no remote segment holds the offset, RemoteFetchRefused when
        too many reads wait, RemoteStorageError when the store fails."""
        if self.metadata.cache(p.topic_id, p.topic, p.index) is None:
            # a new leader still reading its remote log metadata: wait for it (within the fetch's
            # remote.fetch.max.wait.ms), never answer OFFSET_OUT_OF_RANGE for what it is reading
            key = await self._follow(p)
            try:
                await self.metadata.wait_ready(*key, timeout_s=self.config["remote.fetch.max.wait.ms"] / 1000)
            except RemoteStorageError:
                raise TimeoutError(f"the remote log metadata of {p.topic}-{p.index} is not read yet") from None
        metadata = self.segment_for(p, offset)
        if metadata is None:
            log.debug("%s-%d: offset %d (log start %d, local log start %d) is in no remote segment",
                      p.topic, p.index, offset, p.log.log_start_offset, p.log.local_log_start_offset)
            raise LookupError(f"offset {offset} of {p.topic}-{p.index} is in no remote segment")
        if self._pending_reads >= self.config["remote.log.reader.max.pending.tasks"]:
            raise RemoteFetchRefused("too many remote reads waiting")
        self._pending_reads += 1
        try:
            data, aborted = await asyncio.get_running_loop().run_in_executor(
                self._readers, self._read, p, metadata, offset, max_bytes, min_one_message, upper_bound)
        except RemoteStorageError:
            self.stats.fetch_errors += 1
            raise
        finally:
            self._pending_reads -= 1
        self.stats.fetch_bytes += len(data)
        self.stats.fetch_requests += 1
        self.fetch_quota.record(len(data))
        return data, aborted

    async def find_offset_by_timestamp(self, p, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record in remote storage with a timestamp >=
        `timestamp` (ListOffsets; Kafka looks in remote storage before the local log), or None."""
        cache = self.metadata.cache(p.topic_id, p.topic, p.index)
        if cache is None:
            return None
        log_ = p.log
        candidates = [m for m in served_segments(cache, lineage_of(log_), log_.log_end_offset)
                      if m.max_timestamp_ms >= timestamp and m.end_offset >= log_.log_start_offset
                      and m.start_offset < log_.local_log_start_offset]
        start = log_.log_start_offset
        for m in candidates:
            found = await asyncio.get_running_loop().run_in_executor(
                self._readers, self.reader.find_offset_by_timestamp, m, timestamp, start)
            if found is not None:
                return found
        return None

    def _prefetch(self, metadata: RemoteLogSegmentMetadata, position: int, length: int) -> None:
        try:
            self.reader.prefetch(metadata, position, length)
        except Exception as e:  # only an optimization: the read itself fetches and reports
            log.debug("read-ahead of remote segment %s failed: %s", metadata.segment_id.id, e)
        finally:
            self._prefetching -= 1

    def fetch_throttled(self) -> bool:
        return self.fetch_quota.exceeded()

    def _read(self, p, metadata: RemoteLogSegmentMetadata, offset: int, max_bytes: int, min_one_message: bool,
              upper_bound: int | None) -> tuple[bytes, list[AbortedTxn] | None]:
        read = self.reader.read_at(metadata, offset, max_bytes, min_one_message)
        data = read.data
        if data and read.next_position < metadata.size_bytes and self._prefetching < self._max_prefetching:
            # a consumer reading on asks for what follows next: fetched while this is sent
            self._prefetching += 1
            self._readers.submit(self._prefetch, metadata, read.next_position, min(max_bytes, READ_CAP) + 65536)
        if upper_bound is None or not data:
            return data, None
        # Aborted transactions overlapping what was read: this segment's index and the later
        # ones', remote then local, until one says the rest cannot overlap (Kafka's
        # collectAbortedTransactions across tiers).
        aborted: list[AbortedTxn] = []
        cache = self.metadata.cache(p.topic_id, p.topic, p.index)
        log_ = p.log
        segment = metadata
        while segment is not None:
            found = self.reader.aborted(segment, offset, upper_bound)
            aborted += found
            if found and found[-1].last_stable_offset >= upper_bound:
                return data, aborted
            nxt = segment.end_offset + 1
            if nxt >= log_.local_log_start_offset or cache is None:
                break
            segment = cache.segment_for(log_.leader_epoch_cache.epoch_for(nxt), nxt, lineage_of(log_),
                                        log_.log_end_offset)
        if segment is None or segment.end_offset + 1 >= log_.local_log_start_offset:
            aborted += log_.collect_aborted_txns(max(offset, log_.local_log_start_offset), upper_bound)
        return data, aborted

    # --- followers ---

    async def build_follower_state(self, p, leader_local_start: int, leader_log_start: int) -> None:
        """KIP-405's follower: the leader keeps offsets below `leader_local_start` only in remote
        storage, so this replica's log starts there, with the leader epochs and the producer
        state as of that offset from the remote segment that ends just before it."""
        key = await self._follow(p)
        cache = await self.metadata.wait_ready(*key, timeout_s=30.0)
        before = leader_local_start - 1
        candidates = [m for m in cache.all_segments()
                      if m.state is _S.COPY_SEGMENT_FINISHED and m.start_offset <= before <= m.end_offset]
        if not candidates:
            raise RemoteStorageError(f"no remote segment holds offset {before}")
        segment = max(candidates, key=lambda m: (m.segment_leader_epochs[-1][0], m.event_timestamp_ms))
        loop = asyncio.get_running_loop()
        epochs_data = await loop.run_in_executor(self._readers, self.storage.fetch_index, segment,
                                                 IndexType.LEADER_EPOCH)
        snapshot = await loop.run_in_executor(self._readers, self.storage.fetch_index, segment,
                                              IndexType.PRODUCER_SNAPSHOT)
        epochs = [(e, start) for e, start in parse_epoch_checkpoint(epochs_data) if start < leader_local_start]
        log_ = p.log
        if log_.log_end_offset >= leader_local_start:
            return  # caught up meanwhile
        log_.truncate_fully_and_start_at(leader_local_start, leader_log_start)
        log_.leader_epoch_cache.clear()  # the leader's lineage replaces this replica's
        for epoch, start in epochs:
            log_.leader_epoch_cache.assign(epoch, max(start, leader_log_start))
        state = ProducerStateManager(log_.dir)
        await loop.run_in_executor(self._readers, state.write_snapshot, leader_local_start, snapshot)
        p.producer_state = state
        await loop.run_in_executor(self._readers, state.rebuild, log_)
        log_.highest_offset_in_remote_storage = max(log_.highest_offset_in_remote_storage, segment.end_offset)
        log.info("%s-%d: log restarted at the leader's local log start %d (log start %d), with %d leader "
                 "epoch(s) and the producer state of remote segment [%d, %d]", p.topic, p.index,
                 leader_local_start, leader_log_start, len(epochs), segment.start_offset, segment.end_offset)

    # --- what operators see ---

    def partition_sizes(self, topic: str, index: int) -> tuple[int, int] | None:
        """(remote bytes, remote segments) of a hosted tiered partition, or None."""
        for key, state in self.tiered.items():
            if key[1] == topic and key[2] == index:
                return state.remote_size_bytes, state.remote_segments
        return None


def _report_failure(task: asyncio.Task) -> None:
    """A copy or expiration that failed in a way it does not handle: logged (at most once a task
    interval for a partition) and tried again at the next."""
    if not task.cancelled() and task.exception() is not None:
        log.error("%s failed: %r", task.get_name(), task.exception())


def lineage_of(log_) -> list[tuple[int, int]]:
    return [(e.epoch, e.start_offset) for e in log_.leader_epoch_cache.entries]


def served_segments(cache: RemoteLogMetadataCache, lineage: list[tuple[int, int]],
                    log_end_offset: int) -> list[RemoteLogSegmentMetadata]:
    """The COPY_SEGMENT_FINISHED segments within the leader's lineage, by start offset, each
    reaching past the one before (a copy that a later one covers whole is not counted twice)."""
    out: list[RemoteLogSegmentMetadata] = []
    for m in cache.all_segments():
        if m.state is not _S.COPY_SEGMENT_FINISHED or not is_within_lineage(m, lineage, log_end_offset):
            continue
        if out and m.end_offset <= out[-1].end_offset:
            continue
        out.append(m)
    return out


def highest_remote_offset(cache: RemoteLogMetadataCache, lineage: list[tuple[int, int]]) -> int:
    """The last offset copied of the latest epoch of the lineage that has any, bounded by where
    that epoch ends in the lineage (Kafka's findHighestRemoteOffset); -1 for none."""
    for i in range(len(lineage) - 1, -1, -1):
        epoch = lineage[i][0]
        highest = cache.highest_offset_for_epoch(epoch)
        if highest is not None:
            if i + 1 < len(lineage):
                highest = min(highest, lineage[i + 1][1] - 1)
            return highest
    return -1
