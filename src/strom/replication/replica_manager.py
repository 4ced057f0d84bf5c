"""ReplicaManager: the partitions this broker hosts, their logs and watermarks.

A `Partition` (partition.py) knows its replicas and ISR and moves the high watermark to the smallest log end
offset in the ISR. With ISR = {this broker} that is the leader's own log end offset right after
the append, so a cluster of one needs no special case: acks=-1 completes as soon as the
write is in the log.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, field
from typing import Any

from strom.heap import settle_after_bulk_change
from strom.log.config import LogConfig
from strom.log.index import READ_THREADS, in_parallel
from strom.log.log import FetchSlice, Log
from strom.log.manager import LogManager
from strom.log.txn_index import AbortedTxn
from strom.metrics.stats import (
    BYTES_IN,
    BYTES_REJECTED,
    FAILED_PRODUCE_REQUESTS,
    MESSAGES_IN,
    PRODUCE_REQUESTS,
    BrokerTopicStats,
    remote_wait,
)
from strom.protocol.errors import ErrorCode, KafkaError
from strom.replication.fetch_session import FULL_SCAN_EVERY, FetchSession
from strom.replication.partition import Partition, TopicPartition, now_ms
from strom.replication.purgatory import Purgatory
from strom.replication.quota import ReplicationQuota
from strom.replication.replica_selector import ReadPreference, ReplicaView

log = logging.getLogger(__name__)

LOAD_SLICE = 256  # lazily opened logs a request reads per turn of the loop (~50 ms)
MAKE_FILES_TOGETHER = 128  # new logs whose files a first write makes at once (~30-60 ms)


@dataclass(slots=True)
class ProduceResult:
    error: ErrorCode = ErrorCode.NONE
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    message: str | None = None
    end_offset: int = -1  # the log end offset right after this append (what acks=all waits for)
    durable_at: int = -1  # flush.messages reached: answer once the log is fsynced below this
    record_errors: list[tuple[int, str]] = field(default_factory=list)  # KIP-467 (index, message)


@dataclass(slots=True)
class ReadResult:
    error: ErrorCode
    high_watermark: int = -1
    log_start_offset: int = -1
    records: FetchSlice | None = None
    last_stable_offset: int = -1
    aborted: list[AbortedTxn] | None = None  # read_committed only
    diverging_epoch: tuple[int, int] | None = None  # a follower's log left the leader's here
    # The offset lies in remote storage (tiered, below the local log start): the fetch reads it
    # there, off the loop, (fetch offset, read_committed upper bound or None)
    remote: tuple[int, int | None] | None = None
    # KIP-392: the follower the consumer should read from instead (nothing is read then)
    preferred_read_replica: int = -1


class ReplicaManager:
    def __init__(self, broker_id: int, log_manager: LogManager,
                 known_partition: Callable[[str, int], bool] = lambda _t, _p: False) -> None:
        self.broker_id = broker_id
        self.log_manager = log_manager
        self.partitions: dict[TopicPartition, Partition] = {}
        # Until the background load has read them all, some logs may be lazily opened ones
        # (a restart opens them so): requests check theirs first. Never true again after.
        self._lazy_logs_left = True
        # Partitions a LeaderAndIsr named whose log could not be made (why): clients get
        # KAFKA_STORAGE_ERROR for them, not a partition that seems to be elsewhere.
        self.unmade: dict[TopicPartition, str] = {}
        self._hosted: Counter[str] = Counter()  # partitions hosted per topic
        self.fetch_purgatory = Purgatory()
        self.produce_purgatory = Purgatory()  # acks=all waiting for the high watermark
        # Asks the controller for a new ISR (AlterPartition); set by the broker.
        self.alter_isr: Callable[[Partition, list[int]], None] = lambda _p, _isr: None
        # May this replica join an ISR: registered, not fenced, not shutting down (KIP-841)?
        # Set by the broker from its metadata; asking for one that may not only gets refused.
        self.isr_eligible: Callable[[int], bool] = lambda _replica: True
        self.checkpointed_hw: dict[TopicPartition, int] = {}
        self.leader_quota: ReplicationQuota | None = None  # set by the broker
        # Does the cluster have this partition (somewhere else)? Decides between
        # NOT_LEADER_OR_FOLLOWER (clients refresh metadata and re-route) and UNKNOWN_TOPIC.
        self.known_partition = known_partition
        self.topic_stats = BrokerTopicStats()
        self.isr_shrinks = 0
        self.isr_expands = 0
        # Ticks whenever a hosted partition's high watermark moves, or partitions come or go:
        # replication-offset-checkpoint is rebuilt only when it moved (an idle broker with
        # 100,000 partitions would otherwise rebuild it every 5 s for nothing).
        self.hw_clock: list[int] = [0]

    def _host(self, partition: Partition) -> None:
        partition.hw_clock = self.hw_clock
        self.hw_clock[0] += 1
        self.unmade.pop((partition.topic, partition.index), None)
        self.partitions[(partition.topic, partition.index)] = partition
        self._hosted[partition.topic] += 1

    def hosts_topic(self, topic: str) -> bool:
        return topic in self._hosted

    def get_partition(self, topic: str, index: int) -> Partition | None:
        return self.partitions.get((topic, index))

    def missing_partition_error(self, tp: TopicPartition) -> ErrorCode:
        if tp in self.unmade:
            return ErrorCode.KAFKA_STORAGE_ERROR
        if self.known_partition(*tp):
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    def leader_partition(self, tp: TopicPartition) -> tuple[Partition | None, ErrorCode]:
        """The partition if this broker leads it, else the error a client gets."""
        partition = self.partitions.get(tp)
        if partition is None:
            return None, self.missing_partition_error(tp)
        if not partition.is_leader:
            return None, ErrorCode.NOT_LEADER_OR_FOLLOWER
        return partition, ErrorCode.NONE

    def become_leader_or_follower(
        self, topic: str, index: int, topic_id: uuid.UUID, leader: int, leader_epoch: int,
        replicas: list[int], isr: list[int], config: LogConfig, partition_epoch: int = 0,
    ) -> Partition:
        """Kafka's makeLeaders / makeFollowers for one partition (the log is created on the
        first LeaderAndIsr that names this broker; its high watermark is the checkpointed one)."""
        tp = (topic, index)
        partition = self.partitions.get(tp)
        if partition is None:
            log_ = self.log_manager.get_or_create_log(topic, index, config)
            partition = Partition(topic, index, topic_id, self.broker_id, log_,
                                  self.checkpointed_hw.pop(tp, None))
            self._host(partition)
        partition.log.config = config
        if leader == self.broker_id:
            partition.make_leader(leader_epoch, replicas, isr, partition_epoch)
        else:
            partition.make_follower(leader, leader_epoch, replicas, isr, partition_epoch)
        self.high_watermark_moved(tp)  # long polls and acks=all learn of the change
        return partition

    async def prepare_partitions(self, wanted: list[tuple[str, int, uuid.UUID, LogConfig, bool]]) -> None:
        """Make the logs and Partition objects of the partitions a LeaderAndIsr names that this
        broker does not host yet (topic, index, id, config, will it follow), their files in
        batches off the loop (see LogManager.get_or_create_logs). A follower's leader epoch
        cache is read here too, in worker threads: it fetches and truncates by it at once. A
        leader's waits (Log.assign_leader_epoch). What fails is left out:
        `become_leader_or_follower` answers it."""
        new = [w for w in wanted if (w[0], w[1]) not in self.partitions]
        if not new:
            return
        logs = await self.log_manager.get_or_create_logs([((t, i), c) for t, i, _, c, _ in new])
        following = [lg for t, i, _, _, follows in new if follows and isinstance(lg := logs.get((t, i)), Log)]
        for start in range(0, len(following), 1000):  # small file reads: several threads at once
            await asyncio.to_thread(in_parallel, Log.read_epoch_file, following[start:start + 1000], READ_THREADS)
        for t, i, tid, _, _ in new:
            lg = logs.get((t, i))
            if isinstance(lg, Log) and (t, i) not in self.partitions:
                partition = Partition(t, i, tid, self.broker_id, lg, self.checkpointed_hw.pop((t, i), None))
                # In no state yet: the LeaderAndIsr that follows applies whatever its epoch.
                partition.leader_id = partition.leader_epoch = -1
                self._host(partition)

    async def load_in_background(self, batch: int = 256) -> None:
        """After start-up: read lazily opened logs and the producer state of every partition
        in a worker thread, a batch at a time, before clients or timers need them."""
        self.log_manager.on_loaded = settle_after_bulk_change
        await self.log_manager.load_in_background(batch)
        if self.log_manager.background_load_stopped:  # the broker is stopping
            return
        for i, partition in enumerate(list(self.partitions.values())):
            self._check_corrected_end(partition)
            if i % 5000 == 4999:
                await asyncio.sleep(0)
        self._lazy_logs_left = False  # only a start-up opens logs lazily
        pending = [p for p in self.partitions.values() if not p.producer_state_loaded]

        def load(partitions: list[Partition]) -> None:
            for p in partitions:
                if not (p.log.closed or p.log.offline):
                    try:
                        p.load_producer_state()
                    except (OSError, KafkaError) as e:
                        log.warning("%s-%d: producer state not loaded in advance: %s", p.topic, p.index, e)

        for start in range(0, len(pending), batch):
            chunk = pending[start:start + batch]
            await asyncio.to_thread(load, chunk)
            settle_after_bulk_change(len(chunk))

    async def load_logs(self, tps: Iterable[TopicPartition]) -> None:
        """Read the lazily opened logs among `tps` that the background load has not reached
        yet, LOAD_SLICE at a time with the loop given back between slices: a wide Fetch or
        Produce just after a restart would otherwise read thousands of directories in one
        stretch while every other client waits. (On the loop rather than in a thread: the
        reads are mostly parsing, and threads next to the background load's took twice as
        long for a 20,000-partition Fetch.)"""
        if not self._lazy_logs_left:  # the usual case: no walk over the request's partitions
            return
        await self._load_lazily_opened(tps)

    @property
    def lazy_logs_left(self) -> bool:
        """Some log may still be unread since start-up (else load_logs has nothing to do)."""
        return self._lazy_logs_left

    async def _load_lazily_opened(self, tps: Iterable[TopicPartition]) -> None:
        partitions = [p for tp in tps if (p := self.partitions.get(tp)) is not None and not p.log.loaded]
        for start in range(0, len(partitions), LOAD_SLICE):
            if start:
                await asyncio.sleep(0)
            for partition in partitions[start:start + LOAD_SLICE]:
                if not (partition.log.closed or partition.log.offline):
                    self._read_lazily_opened(partition)

    async def make_files(self, tps: Iterable[TopicPartition]) -> None:
        """Before writing to `tps`: the logs among them that have no files yet (new partitions
        never written, see Log.create) get their directory and segment file in worker threads,
        so that a first produce to thousands of new partitions does not make them on the loop;
        more of their topics' new logs come along (LogManager.unmade_alongside). A failure is
        left for the write to meet again and report (KAFKA_STORAGE_ERROR)."""
        fresh = [p.log for tp in tps if (p := self.partitions.get(tp)) is not None and not p.log.dir_made]
        if fresh:
            batch = self.log_manager.unmade_alongside(fresh, max(len(fresh), MAKE_FILES_TOGETHER))
            await asyncio.to_thread(self.log_manager.make_files, batch)

    def _read_lazily_opened(self, partition: Partition) -> None:
        """Read the directory of a lazily opened log that the background load has not reached
        yet, before its end offset is used (it may correct it)."""
        if not partition.log.loaded:
            partition.log.load()
            self._check_corrected_end(partition)

    def _check_corrected_end(self, partition: Partition) -> None:
        """A lazily opened log found to end elsewhere than checkpointed: its high watermark
        is held to the real end, and a leader's may move up to it."""
        log_ = partition.log
        if not log_.end_corrected:
            return
        log_.end_corrected = False
        partition.high_watermark = min(partition.high_watermark, log_.log_end_offset)
        if partition.is_leader and partition.maybe_increment_high_watermark():
            self.high_watermark_moved((partition.topic, partition.index))

    def high_watermark_moved(self, tp: TopicPartition, partition: Partition | None = None) -> None:
        """Something moved in the partition (records, the high watermark, its leader or ISR):
        long polls, acks=all and idle followers' sessions look again. (`partition`: the one
        at `tp`, when the caller has it at hand.)"""
        if partition is not None or (partition := self.partitions.get(tp)) is not None:
            if partition.followers:
                partition.tell_followers()
        self.fetch_purgatory.wake(tp)
        self.produce_purgatory.wake(tp)

    def isr_changed(self, partition: Partition, isr: list[int], partition_epoch: int) -> None:
        """The controller accepted this leader's AlterPartition."""
        if len(isr) < len(partition.isr):
            self.isr_shrinks += 1
        elif len(isr) > len(partition.isr):
            self.isr_expands += 1
        partition.isr = list(isr)
        partition.partition_epoch = partition_epoch
        partition.pending_isr = None
        partition.maybe_increment_high_watermark()
        self.high_watermark_moved((partition.topic, partition.index))

    def isr_change_dropped(self, partition: Partition) -> None:
        """The controller refused (or never got) this leader's AlterPartition: the ISR is what
        it was. An expansion no longer holds the high watermark back, so acks=all writes
        waiting on the replica it would have added are answered now, not at their timeout."""
        partition.pending_isr = None
        if partition.is_leader and partition.maybe_increment_high_watermark():
            self.high_watermark_moved((partition.topic, partition.index))

    def maybe_expand_isr(self, partition: Partition, replica: int) -> None:
        new_isr = partition.isr_to_expand(replica)
        if new_isr is not None and self.isr_eligible(replica):
            partition.pending_isr = new_isr
            self.alter_isr(partition, new_isr)

    def maybe_shrink_isr(self, lag_ms: int) -> None:
        """Kafka's isr-expiration task: followers that have not caught up for
        replica.lag.time.max.ms leave the ISR (the controller records it)."""
        now = now_ms()
        for partition in list(self.partitions.values()):
            if not partition.followers:
                continue  # a follower, or a leader with no other replica
            new_isr = partition.isr_to_shrink(now, lag_ms)
            if new_isr is not None:
                log.info("%s-%d: shrinking ISR from %s to %s", partition.topic, partition.index,
                         partition.isr, new_isr)
                partition.pending_isr = list(partition.isr)  # still counted until confirmed
                self.alter_isr(partition, new_isr)

    async def await_high_watermark(self, tp: TopicPartition, end_offset: int, timeout_s: float) -> ErrorCode:
        """acks=all for a write ending at `end_offset` that is not a client's produce."""
        result = ProduceResult(end_offset=end_offset)
        await self.await_replication({tp: result}, -1, timeout_s)
        return result.error

    async def await_replication(self, results: dict[TopicPartition, ProduceResult], acks: int,
                                timeout_s: float) -> None:
        """acks=all: answer once the high watermark covers each write (every ISR member has
        it), with NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR fell below min.insync.replicas
        meanwhile, or REQUEST_TIMED_OUT (Kafka's DelayedProduce)."""
        waiting = self.unreplicated(results, acks)
        if waiting:
            await self.wait_replicated(waiting, timeout_s)

    def unreplicated(self, results: dict[TopicPartition, ProduceResult], acks: int
                     ) -> dict[TopicPartition, ProduceResult]:
        """acks=all: settles the writes that need no wait (the high watermark already covers
        them, as at once with one replica, or they failed); returns those left to wait for."""
        if acks != -1:
            return {}
        return {tp: r for tp, r in results.items()
                if r.error == ErrorCode.NONE and r.end_offset > 0 and not self._replicated(tp, r)}

    async def wait_replicated(self, waiting: dict[TopicPartition, ProduceResult], timeout_s: float) -> None:
        """The rest of await_replication: wait in the produce purgatory until each write is
        settled or the timeout passes."""
        deadline = time.monotonic() + timeout_s
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                for result in waiting.values():
                    result.error = ErrorCode.REQUEST_TIMED_OUT
                return
            await self.produce_purgatory.wait_any(list(waiting), remaining)
            waiting = {tp: r for tp, r in waiting.items() if not self._replicated(tp, r)}

    def _replicated(self, tp: TopicPartition, result: ProduceResult) -> bool:
        """Whether an acks=all write is settled, its error set if it failed."""
        partition = self.partitions.get(tp)
        if partition is None or not partition.is_leader:
            result.error = ErrorCode.NOT_LEADER_OR_FOLLOWER
        elif partition.high_watermark >= result.end_offset:
            if len(partition.isr) < partition.log.config.min_insync_replicas:
                result.error = ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        else:
            return False
        return True

    def stop_replica(self, topic: str, index: int, delete: bool) -> None:
        """Stop serving a replica; with `delete`, remove its log even if it was never loaded
        as a partition (a replica of a topic deleted while this broker was away)."""
        self.unmade.pop((topic, index), None)
        self.hw_clock[0] += 1
        if (partition := self.partitions.pop((topic, index), None)) is not None:
            partition.tell_followers()
            self._hosted[topic] -= 1
            if not self._hosted[topic]:
                del self._hosted[topic]
        if delete and self.log_manager.get_log(topic, index) is not None:
            self.log_manager.delete_log(topic, index)
        if delete and topic not in self._hosted:
            self.topic_stats.remove_topic(topic)
        self.high_watermark_moved((topic, index))  # waiting fetches and acks=all answer now

    def append_records(self, required_acks: int, entries: Iterable[tuple[TopicPartition, bytearray]],
                       from_client: bool = True) -> dict[TopicPartition, ProduceResult]:
        results: dict[TopicPartition, ProduceResult] = {}
        topics = self.topic_stats.topics
        for tp, records in entries:
            partition = self.partitions.get(tp)
            if partition is None:
                results[tp] = ProduceResult(self.missing_partition_error(tp))
                continue
            stats = topics[tp[0]]
            stats[PRODUCE_REQUESTS] += 1
            log_ = partition.log
            config = log_.config
            try:
                info = partition.append_records_to_leader(records, required_acks, config.min_insync_replicas,
                                                          from_client)
            except KafkaError as e:
                stats[FAILED_PRODUCE_REQUESTS] += 1
                stats[BYTES_REJECTED] += len(records)
                log.warning("produce to %s-%d rejected: %s (%s)", tp[0], tp[1], e.code.name, e)
                results[tp] = ProduceResult(e.code, message=str(e) or None, record_errors=e.record_errors)
                continue
            except OSError as e:
                stats[FAILED_PRODUCE_REQUESTS] += 1
                log.error("produce to %s-%d failed writing the log: %s", tp[0], tp[1], e)
                results[tp] = ProduceResult(ErrorCode.KAFKA_STORAGE_ERROR, message=str(e))
                continue
            stats[BYTES_IN] += len(records)
            stats[MESSAGES_IN] += info.last_offset - info.first_offset + 1
            end = info.last_offset + 1
            flush_due = log_.flush_hook is not None and end - log_.recovery_point >= config.flush_messages
            results[tp] = ProduceResult(
                ErrorCode.NONE, info.first_offset, info.log_append_time, log_.log_start_offset,
                end_offset=end, durable_at=end if flush_due else -1,
            )
            self.high_watermark_moved(tp, partition)
        return results

    def write_txn_markers(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                          committed: bool, partitions: Iterable[TopicPartition]
                          ) -> dict[TopicPartition, ErrorCode]:
        """Write one transaction's markers to the partitions this broker leads (the local half
        of WriteTxnMarkers)."""
        errors: dict[TopicPartition, ErrorCode] = {}
        for tp in partitions:
            partition = self.partitions.get(tp)
            if partition is None:
                errors[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            try:
                partition.append_txn_marker(producer_id, producer_epoch, coordinator_epoch, committed)
            except KafkaError as e:
                log.warning("transaction marker for producer %d in %s-%d rejected: %s (%s)",
                            producer_id, tp[0], tp[1], e.code.name, e)
                errors[tp] = e.code
                continue
            except OSError as e:
                log.error("transaction marker in %s-%d failed writing the log: %s", tp[0], tp[1], e)
                errors[tp] = ErrorCode.KAFKA_STORAGE_ERROR
                continue
            errors[tp] = ErrorCode.NONE
            self.fetch_purgatory.wake(tp)
        return errors

    async def await_flushes(self, results: dict[TopicPartition, ProduceResult]) -> None:
        """Hold a produce response until the fsyncs that flush.messages started are done, as
        Kafka's synchronous flush would; a failed fsync becomes KAFKA_STORAGE_ERROR."""
        for tp, result in results.items():
            partition = self.partitions.get(tp)
            if result.durable_at < 0 or partition is None:
                continue
            try:
                with remote_wait():
                    await self.log_manager.flusher.wait_durable(partition.log, result.durable_at)
            except OSError as e:
                result.error, result.message = ErrorCode.KAFKA_STORAGE_ERROR, str(e)

    def follower_news(self, session: FetchSession, named: Container[TopicPartition],
                      replica_id: int) -> list[tuple[TopicPartition, Any]]:
        """The partitions of a follower's fetch session (their cached fetch states) to read:
        those its request named, and the others unless the follower is up to date on them:
        this broker leads in the epoch the follower names, the follower is in the ISR and has
        the whole log (as its last read recorded), and already has the high watermark and log
        start offset. Those become quiet: passed by at each fetch, the follower caught up as
        of it, until the partition changes (Partition.tell_followers) or the follower names
        it. So an idle fetch looks only at what changed, and at everything every
        FULL_SCAN_EVERY fetches (what changes unannounced: a log start moved by retention)."""
        for tp in named:  # caught up until the last fetch, then read
            session.wake(tp)
        now = session.fetched_ms = now_ms()
        if session.until_full_scan <= 0:
            session.until_full_scan = FULL_SCAN_EVERY
            candidates: Iterable[TopicPartition] = list(session.partitions)
        else:
            candidates = list(session.active)
        partitions, me, cache = self.partitions, self.broker_id, session.partitions
        out = []
        for tp in candidates:
            cached = cache.get(tp)
            if cached is None:  # forgotten meanwhile
                session.active.pop(tp, None)
                continue
            if tp not in named:
                partition = partitions.get(tp)
                if (partition is not None and partition.leader_id == me
                        and partition.leader_epoch == cached.current_leader_epoch):
                    log_, offset = partition.log, cached.fetch_offset
                    if (offset == log_.log_end_offset and cached.sent_high_watermark == partition.high_watermark
                            and cached.sent_log_start_offset == log_.log_start_offset and log_.loaded):
                        state = partition.followers.get(replica_id)
                        if state is not None and state.log_end_offset == offset and replica_id in partition.isr:
                            if state.quiet_in is not session:
                                state.last_caught_up_ms = state.last_fetch_ms = now
                                state.last_fetch_leader_leo = offset
                                session.make_quiet(tp, state)
                            continue
            session.wake(tp)  # a full scan may find one quiet that changed unannounced
            out.append((tp, cached))
        return out

    def preferred_read_replica(self, partition: Partition, offset: int, preference: ReadPreference) -> int:
        """Kafka's findPreferredReadReplica: the replica the selector picks for a consumer at
        `offset` among this leader and the ISR followers whose log reaches it (a follower out
        of the ISR may lag without end), or -1 for this leader. Followers on brokers the
        consumer cannot reach are left out. Kafka also checks each follower's log start; Strom
        does not track it and uses the leader's."""
        me, racks, log_ = self.broker_id, preference.racks, partition.log
        leader = ReplicaView(me, racks.get(me), log_.log_end_offset, 0)
        views = [leader]
        if offset >= log_.log_start_offset:
            now = now_ms()
            for replica in partition.isr:
                state = partition.followers.get(replica)
                if replica != me and state is not None and replica in racks and state.log_end_offset >= offset:
                    views.append(ReplicaView(replica, racks[replica], state.log_end_offset,
                                             now - state.caught_up_ms()))
        try:
            chosen = preference.selector.select(partition.topic, partition.index, preference.client, leader, views)
        except Exception:  # noqa: BLE001 - a plugged-in selector's fault: the leader serves
            log.exception("%s-%d: replica selector failed", partition.topic, partition.index)
            return -1
        if chosen is None or chosen.broker_id == me or all(v.broker_id != chosen.broker_id for v in views):
            return -1
        return chosen.broker_id

    def read(self, tp: TopicPartition, offset: int, max_bytes: int, min_one_message: bool,
             read_committed: bool = False, current_leader_epoch: int = -1,
             replica_id: int = -1, last_fetched_epoch: int = -1, fetch_only_leader: bool = True,
             preference: ReadPreference | None = None) -> ReadResult:
        """Read from the leader up to the high watermark, or for read_committed up to the last
        stable offset, with the aborted transactions the client must skip. A follower
        (`replica_id` >= 0) reads up to the log end: its fetch offset is its log end offset,
        which may move the high watermark and bring it into the ISR.

        A consumer that may read from followers (`fetch_only_leader` False: Fetch v11+, KIP-392)
        is served by a follower too, up to the follower's high watermark; with a `preference`,
        a leader may instead name the follower it should read from, and read nothing."""
        if replica_id < 0 and not fetch_only_leader:
            partition = self.partitions.get(tp)
            if partition is None:
                return ReadResult(self.missing_partition_error(tp))
        else:
            partition, error = self.leader_partition(tp)
            if partition is None:
                return ReadResult(error)
        epoch_error = partition.check_leader_epoch(current_leader_epoch)
        if epoch_error != ErrorCode.NONE:
            return ReadResult(epoch_error)
        if partition.leader_id < 0:  # made, and no LeaderAndIsr applied yet: no state to serve
            return ReadResult(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        self._read_lazily_opened(partition)  # the first read, before the background load
        log_ = partition.log
        if preference is not None and partition.is_leader:
            preferred = self.preferred_read_replica(partition, offset, preference)
            if preferred >= 0:
                return ReadResult(ErrorCode.NONE, partition.high_watermark, log_.log_start_offset,
                                  last_stable_offset=partition.last_stable_offset,
                                  preferred_read_replica=preferred)
        if replica_id >= 0 and last_fetched_epoch >= 0:
            # KIP-320: the follower's last epoch ends earlier here, or is unknown: it must
            # truncate before it may append more.
            epoch, end = log_.end_offset_for_epoch(last_fetched_epoch)
            if epoch >= 0 and (epoch < last_fetched_epoch or end < offset):
                return ReadResult(ErrorCode.NONE, partition.high_watermark, log_.log_start_offset,
                                  last_stable_offset=partition.last_stable_offset,
                                  diverging_epoch=(epoch, end))
        if log_.tiered and log_.log_start_offset <= offset < log_.local_log_start_offset:
            hw, lso = partition.high_watermark, partition.last_stable_offset
            if replica_id >= 0:  # KIP-405: the follower builds what is below from remote storage
                return ReadResult(ErrorCode.OFFSET_MOVED_TO_TIERED_STORAGE, hw, log_.log_start_offset,
                                  last_stable_offset=lso)
            return ReadResult(ErrorCode.NONE, hw, log_.log_start_offset, None, lso,
                              remote=(offset, lso if read_committed else None))
        if replica_id >= 0:
            if partition.update_follower(replica_id, offset, now_ms()):
                self.high_watermark_moved(tp)
            self.maybe_expand_isr(partition, replica_id)
            quota = self.leader_quota
            throttled = quota is not None and log_.config.replication_throttled(False, tp[1], self.broker_id)
            if throttled and quota.exceeded():
                return ReadResult(ErrorCode.NONE, partition.high_watermark, log_.log_start_offset,
                                  last_stable_offset=partition.last_stable_offset)
            try:
                records = log_.read(offset, max_bytes, max_offset=log_.log_end_offset,
                                    min_one_message=min_one_message)
                if throttled:
                    quota.record(records.size)
            except KafkaError as e:
                return ReadResult(e.code, partition.high_watermark, log_.log_start_offset)
            return ReadResult(ErrorCode.NONE, partition.high_watermark, log_.log_start_offset, records,
                              partition.last_stable_offset)
        hw = partition.high_watermark
        lso = partition.last_stable_offset
        if offset == (lso if read_committed else hw) and not log_.offline:
            # Caught up: nothing to read. The common case of a consumer of many partitions, and
            # of every partition an incremental fetch session carries along.
            return ReadResult(ErrorCode.NONE, hw, log_.log_start_offset, None, lso, [] if read_committed else None)
        try:
            records = log_.read(offset, max_bytes, max_offset=lso if read_committed else hw,
                                min_one_message=min_one_message)
            aborted = None
            if read_committed:
                aborted = log_.collect_aborted_txns(offset, lso) if records.size else []
        except KafkaError as e:
            return ReadResult(e.code, hw, log_.log_start_offset, last_stable_offset=lso)
        return ReadResult(ErrorCode.NONE, hw, log_.log_start_offset, records, lso, aborted)
