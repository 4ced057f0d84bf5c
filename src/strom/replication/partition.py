"""Partition: one partition this broker hosts, as leader or follower: its log, replicas, ISR and
the maximal ISR (additions awaiting the controller), the followers' fetch state, the high
watermark (the smallest log end offset in the maximal ISR, held while the ISR is below
min.insync.replicas), and its producer state.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from strom.log.config import LONG_MAX, LogConfig
from strom.log.log import AppendInfo, Log
from strom.log.producer_state import ProducerStateManager
from strom.protocol.errors import ErrorCode, InvalidTimestampError, KafkaError
from strom.protocol.records import (
    CONTROL_MASK,
    NO_TIMESTAMP,
    BatchHeader,
    build_marker_batch,
    iter_records,
    recompress,
    validate_batches,
)

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


@dataclass(slots=True)
class FollowerState:
    """What the leader knows of one follower replica from its fetches (Kafka's Replica)."""

    log_end_offset: int = 0
    last_caught_up_ms: int = 0  # when it last had everything the leader had
    last_fetch_leader_leo: int = 0
    last_fetch_ms: int = 0
    # The follower's fetch session while the follower is up to date here and its fetches pass
    # this partition by (see ReplicaManager.follower_news): caught up at each of its fetches.
    quiet_in: Any = None

    def caught_up_ms(self) -> int:
        return self.quiet_in.fetched_ms if self.quiet_in is not None else self.last_caught_up_ms

    def caught_up_until(self, fetched_ms: int) -> None:
        """No longer passed by: what each fetch since it was would have recorded, once."""
        self.quiet_in = None
        self.last_caught_up_ms = self.last_fetch_ms = fetched_ms
        self.last_fetch_leader_leo = self.log_end_offset


def now_ms() -> int:
    return int(time.time() * 1000)


def check_timestamps(records, batches: list[tuple[int, BatchHeader]], config: LogConfig, now: int) -> None:
    """message.timestamp.before.max.ms / after.max.ms for CreateTime topics, on every record as
    Kafka checks them. The batch headers settle it without reading records when each batch's
    largest timestamp is in range and no lower bound is set (before.max.ms at its default);
    otherwise the records are read, and every one out of range is named (KIP-467)."""
    before, after = config.message_timestamp_before_max_ms, config.message_timestamp_after_max_ms
    if before >= LONG_MAX:
        for _, h in batches:
            if h.max_timestamp - now > after:
                break
        else:
            return
    bad: list[tuple[int, str]] = []
    first_index = 0
    for pos, header in batches:
        for i, record in enumerate(iter_records(records, pos)):
            ts = record.timestamp
            if ts == NO_TIMESTAMP:
                continue
            if now - ts > before:
                bad.append((first_index + i, f"timestamp {ts} is more than message.timestamp.before.max.ms="
                                             f"{before} before the broker's time {now}"))
            elif ts - now > after:
                bad.append((first_index + i, f"timestamp {ts} is more than message.timestamp.after.max.ms="
                                             f"{after} after the broker's time {now}"))
        first_index += header.record_count
    if bad:
        raise InvalidTimestampError(f"{len(bad)} record(s) out of the topic's timestamp range; "
                                    f"record {bad[0][0]}: {bad[0][1]}", record_errors=bad)


def _check_batch_kinds(batches: list[tuple[int, BatchHeader]], from_client: bool) -> bool:
    """Refuse control batches (the transaction coordinator writes those) and, from clients, a
    producer id without a sequence; returns whether any batch has a producer id. One pass:
    asked of every append, most of them one batch."""
    idempotent = False
    for _, h in batches:
        if h.attributes & CONTROL_MASK:
            raise KafkaError("control batches are written by the transaction coordinator, "
                             "not by clients", ErrorCode.INVALID_RECORD)
        if h.producer_id >= 0:
            idempotent = True
            if from_client and h.base_sequence < 0:
                raise KafkaError("invalid sequence number in a batch with a producer id",
                                 ErrorCode.INVALID_RECORD)
    return idempotent


class Partition:
    def __init__(self, topic: str, index: int, topic_id: uuid.UUID, broker_id: int, log: Log,
                 high_watermark: int | None = None) -> None:
        self.topic = topic
        self.index = index
        self.topic_id = topic_id
        self.broker_id = broker_id
        self.log = log
        self.leader_id = broker_id
        self.leader_epoch = 0
        self.partition_epoch = 0  # the version of the partition's state in the metadata store
        self.replicas: list[int] = [broker_id]
        self.isr: list[int] = [broker_id]
        # ISR additions asked of the controller and not yet confirmed: counted for the high
        # watermark at once (Kafka's maximal ISR), so acks=all never needs fewer replicas.
        self.pending_isr: list[int] | None = None
        self.leader_epoch_start_offset = 0  # the log end when this replica last became leader
        self.followers: dict[int, FollowerState] = {}
        # Ticks when the high watermark moves; shared by every partition of a ReplicaManager,
        # so an idle broker's checkpoint sees at once that nothing moved (see ReplicaManager).
        self.hw_clock: list[int] = [0]
        leo = log.log_end_offset
        self._high_watermark = leo if high_watermark is None else min(high_watermark, leo)
        # Read from its snapshot and the log when first needed (or by load_in_background):
        # becoming leader of 100,000 partitions reads no files on the loop.
        self._producer_state: ProducerStateManager | None = None
        self._load_lock = threading.Lock()
        self.snapshot_offset = -1  # log end offset of the last producer snapshot written

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @high_watermark.setter
    def high_watermark(self, value: int) -> None:
        if value != self._high_watermark:
            self._high_watermark = value
            self.hw_clock[0] += 1

    @property
    def producer_state(self) -> ProducerStateManager:
        state = self._producer_state
        return state if state is not None else self.load_producer_state()

    @producer_state.setter
    def producer_state(self, state: ProducerStateManager) -> None:
        self._producer_state = state

    @property
    def producer_state_loaded(self) -> bool:
        return self._producer_state is not None

    def load_producer_state(self) -> ProducerStateManager:
        """The producers' state from the newest snapshot and the batches after it (any
        thread; a load in progress elsewhere is waited for, not repeated)."""
        with self._load_lock:
            if self._producer_state is None:
                state = ProducerStateManager(self.log.dir)
                if not (self.log.offline or self.log.closed):  # else nothing is read or written
                    state.rebuild(self.log)
                self._producer_state = state
            return self._producer_state

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.broker_id

    @property
    def maximal_isr(self) -> list[int]:
        return self.pending_isr if self.pending_isr is not None else self.isr

    def make_leader(self, leader_epoch: int, replicas: list[int], isr: list[int],
                    partition_epoch: int = 0) -> None:
        """Kafka's makeLeader: followers start as caught up now, so that none leaves the ISR
        before it had the chance to fetch from this new leader."""
        now = now_ms()
        self.tell_followers()
        self.leader_id = self.broker_id
        self.leader_epoch = leader_epoch
        self.partition_epoch = partition_epoch
        self.replicas = list(replicas)
        self.isr = list(isr)
        self.pending_isr = None
        self.followers = {r: FollowerState(last_caught_up_ms=now if r in isr else 0)
                          for r in replicas if r != self.broker_id}
        # The new epoch starts at the log end: what followers truncate against, and what a
        # follower must have before it may join the ISR.
        self.leader_epoch_start_offset = self.log.log_end_offset
        self.log.assign_leader_epoch(leader_epoch, self.leader_epoch_start_offset)
        self.maybe_increment_high_watermark()

    def make_follower(self, leader: int, leader_epoch: int, replicas: list[int], isr: list[int],
                      partition_epoch: int = 0) -> None:
        self.tell_followers()
        self.leader_id = leader
        self.leader_epoch = leader_epoch
        self.partition_epoch = partition_epoch
        self.replicas = list(replicas)
        self.isr = list(isr)
        self.pending_isr = None
        self.followers.clear()

    def tell_followers(self) -> None:
        """Something a follower's fetch session must see changed here (log end or start, high
        watermark, leader, epoch, ISR): followers' sessions look at it again at their next fetch."""
        for state in self.followers.values():
            if state.quiet_in is not None:
                state.quiet_in.wake((self.topic, self.index))

    @property
    def under_min_isr(self) -> bool:
        """A leader whose ISR is smaller than min.insync.replicas (at most the replication
        factor, as Kafka's effectiveMinIsr)."""
        return self.is_leader and len(self.isr) < min(self.log.config.min_insync_replicas, len(self.replicas))

    def maybe_increment_high_watermark(self) -> bool:
        """HW = the smallest log end offset in the (maximal) ISR; it never goes back. Under min
        ISR it stands still (KIP-966's strict min ISR, as Kafka 4.0): whatever a replica that
        leaves the ISR then lacks is not committed, which is what lets it lead later as an ELR."""
        isr = self.isr
        # under_min_isr, spelled out: asked at every append
        if (len(isr) < len(self.replicas) and len(isr) < self.log.config.min_insync_replicas
                and self.leader_id == self.broker_id):
            return False
        leo = self.log.log_end_offset
        maximal = self.pending_isr if self.pending_isr is not None else isr
        if len(maximal) == 1 and maximal[0] == self.broker_id:
            new_hw = leo  # the leader alone: no list of ends per append
        else:
            ends = [leo if r == self.broker_id else self._follower(r).log_end_offset for r in maximal]
            new_hw = min(ends) if ends else leo
        if new_hw > self._high_watermark:
            self._high_watermark = new_hw  # the setter's work, without its call
            self.hw_clock[0] += 1
            return True
        return False

    def _follower(self, replica: int) -> FollowerState:
        state = self.followers.get(replica)
        if state is None:
            state = self.followers[replica] = FollowerState()
        return state

    def update_follower(self, replica: int, fetch_offset: int, now_ms: int) -> bool:
        """A follower fetched from `fetch_offset` (its log end offset). Returns True when the
        high watermark moved."""
        state = self._follower(replica)
        if state.quiet_in is not None:  # read after all (a full fetch, say: a new session)
            state.quiet_in.wake((self.topic, self.index))
        leo = self.log.log_end_offset
        if fetch_offset >= leo:
            state.last_caught_up_ms = now_ms
        elif fetch_offset >= state.last_fetch_leader_leo and state.last_fetch_ms:
            state.last_caught_up_ms = state.last_fetch_ms
        state.log_end_offset = fetch_offset
        state.last_fetch_leader_leo = leo
        state.last_fetch_ms = now_ms
        return self.maybe_increment_high_watermark()

    def isr_to_expand(self, replica: int) -> list[int] | None:
        """The new ISR if `replica`, which just fetched, is outside it and has caught up to the
        high watermark and the start of this leader's epoch, else None. One change in flight
        at a time."""
        if self.pending_isr is not None or not self.is_leader or replica in self.isr:
            return None
        state = self.followers.get(replica)
        # Kafka's isFollowerInSync (KAFKA-7128): the high watermark of a new leader may lag
        # what the previous one acknowledged, up to where this epoch starts.
        if replica not in self.replicas or state is None:
            return None
        if state.log_end_offset < self.high_watermark or state.log_end_offset < self.leader_epoch_start_offset:
            return None
        return [*self.isr, replica]

    def isr_to_shrink(self, now_ms: int, lag_ms: int) -> list[int] | None:
        if self.pending_isr is not None or not self.is_leader:
            return None
        out = [r for r in self.isr if r != self.broker_id
               and now_ms - self._follower(r).caught_up_ms() > lag_ms]
        return [r for r in self.isr if r not in out] if out else None

    def follower_high_watermark(self, leader_hw: int) -> None:
        """A follower's high watermark follows the leader's, never past its own log end."""
        hw = min(leader_hw, self.log.log_end_offset)
        if hw > self.high_watermark:
            self.high_watermark = hw

    def append_as_follower(self, records) -> AppendInfo | None:
        """Write the leader's batches as they are (offsets and epochs kept) and keep the
        producer state in step, so this replica can lead with the same idempotence."""
        if not len(records):
            return None
        info = self.log.append_as_follower(records)
        self.producer_state.apply_batches(records, self.log)
        return info

    def replace_log(self, moved: Log) -> None:
        """The same log, moved to another log dir (AlterReplicaLogDirs)."""
        self.log = moved
        self.producer_state = ProducerStateManager(moved.dir)
        self.producer_state.rebuild(moved)
        self.snapshot_offset = -1

    def truncate_to(self, offset: int) -> bool:
        """Drop everything from `offset` on (a follower's divergence from its leader)."""
        if not self.log.truncate_to(offset):
            return False
        self.producer_state.rebuild(self.log)  # forgets what the truncation removed
        self.high_watermark = min(self.high_watermark, self.log.log_end_offset)
        return True

    @property
    def last_stable_offset(self) -> int:
        """What read_committed consumers may read up to: the high watermark, or the first
        offset of the earliest open transaction if that is lower."""
        unstable = self.producer_state.first_unstable_offset
        hw = self.high_watermark
        return hw if unstable is None or unstable > hw else unstable

    def check_leader_epoch(self, current_leader_epoch: int) -> ErrorCode:
        """KIP-320: a client that names the leader epoch it knows learns whether it is behind
        (FENCED_LEADER_EPOCH) or ahead (UNKNOWN_LEADER_EPOCH) of this leader."""
        if current_leader_epoch < 0 or current_leader_epoch == self.leader_epoch:
            return ErrorCode.NONE
        if current_leader_epoch < self.leader_epoch:
            return ErrorCode.FENCED_LEADER_EPOCH
        return ErrorCode.UNKNOWN_LEADER_EPOCH

    def _check_leader(self, required_acks: int, min_insync: int) -> None:
        if self.leader_id != self.broker_id:  # is_leader, without the property's call (every append)
            raise KafkaError("this broker is not the leader", ErrorCode.NOT_LEADER_OR_FOLLOWER)
        if required_acks == -1 and len(self.isr) < min_insync:
            raise KafkaError(
                f"ISR {self.isr} is smaller than min.insync.replicas={min_insync}",
                ErrorCode.NOT_ENOUGH_REPLICAS,
            )

    def append_records_to_leader(self, records: bytearray, required_acks: int, min_insync: int,
                                 from_client: bool = True) -> AppendInfo:
        """Append a record set; `from_client` False for coordinators' own writes (transactional
        offset commits), which carry no sequence numbers to check."""
        self._check_leader(required_acks, min_insync)
        config = self.log.config
        batches = validate_batches(records, config.max_message_bytes, check_records=from_client,
                                   require_keys=from_client and config.compact)
        idempotent = _check_batch_kinds(batches, from_client)
        if from_client and not config.log_append_time:
            check_timestamps(records, batches, config, int(time.time() * 1000))
        if from_client and batches[0][1].producer_id >= 0:
            duplicate = self._check_sequences(batches)
            if duplicate is not None:
                return duplicate
        target = config.recompress_to if from_client else None
        if target is not None:
            recompressed = recompress(records, batches, *target)
            if recompressed is not None:  # the topic's compression.type differs from the producer's
                records = recompressed
                batches = validate_batches(records, LONG_MAX)
        info = self.log.append(records, leader_epoch=self.leader_epoch, batches=batches)
        if idempotent:
            offset = info.first_offset
            for _, header in batches:
                if header.producer_id >= 0:
                    self.producer_state.update(header, offset)
                offset += header.last_offset_delta + 1
        self.maybe_increment_high_watermark()
        return info

    def append_txn_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                          committed: bool) -> AppendInfo:
        """Write the marker that commits or aborts the producer's transaction here."""
        self._check_leader(1, 1)
        self.producer_state.check_marker(producer_id, producer_epoch, coordinator_epoch)
        now = int(time.time() * 1000)
        batch = bytearray(build_marker_batch(producer_id, producer_epoch, committed,
                                             coordinator_epoch, now))
        info = self.log.append(batch, leader_epoch=self.leader_epoch)
        aborted = self.producer_state.complete_txn(producer_id, producer_epoch, coordinator_epoch,
                                                   info.first_offset, committed, now)
        if aborted is not None:
            self.log.add_aborted_txn(aborted)
        self.maybe_increment_high_watermark()
        return info

    def _check_sequences(self, batches: list[tuple[int, BatchHeader]]) -> AppendInfo | None:
        """Kafka's idempotence checks: a retry of a recent batch gets its first answer back."""
        headers = [h for _, h in batches]
        first = headers[0]
        earlier = self.producer_state.check(first)
        if earlier is not None:
            log.info("%s-%d: duplicate batch from producer %d (sequence %d) answered with offset %d",
                     self.topic, self.index, first.producer_id, first.base_sequence, earlier.first_offset)
            return AppendInfo(first_offset=earlier.first_offset, last_offset=earlier.last_offset,
                              max_timestamp=earlier.timestamp, offset_of_max_timestamp=earlier.first_offset,
                              log_append_time=-1, log_start_offset=self.log.log_start_offset,
                              valid_bytes=0)
        for prev, nxt in zip(headers, headers[1:], strict=False):
            if (nxt.producer_id, nxt.producer_epoch) != (prev.producer_id, prev.producer_epoch) or (
                    nxt.base_sequence != prev.base_sequence + prev.last_offset_delta + 1):
                raise KafkaError("batches of one request are not in sequence",
                                 ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
        return None

    def producer_snapshot(self, even_if_empty: bool = False) -> tuple[int, bytes] | None:
        """(offset, bytes) of a producer-state snapshot if the state moved since the last one
        (`even_if_empty`: also when there are no producers, for a clean shutdown)."""
        end = self.log.log_end_offset
        if end == self.snapshot_offset or end == 0 or self._producer_state is None:
            return None  # unchanged, empty, or never read since the snapshot it came from
        if not (even_if_empty or self._producer_state.producers):
            return None
        self.snapshot_offset = end
        return end, self.producer_state.encode_snapshot()
