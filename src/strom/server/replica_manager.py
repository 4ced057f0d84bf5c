"""ReplicaManager and Partition: the partitions this broker hosts, their logs and watermarks.

A `Partition` knows its replicas and ISR and moves the high watermark to the smallest log end
offset in the ISR. With ISR = {this broker} that is the leader's own log end offset right after
the append, so a cluster of one needs no special case: acks=-1 completes as soon as the
write is in the log.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from strom.log.config import LogConfig
from strom.log.log import AppendInfo, FetchSlice, Log
from strom.log.manager import LogManager
from strom.log.producer_state import ProducerStateManager
from strom.log.txn_index import AbortedTxn
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.records import build_marker_batch, iter_records, validate_batches
from strom.server.purgatory import Purgatory

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


class Partition:
    def __init__(self, topic: str, index: int, topic_id: uuid.UUID, broker_id: int, log: Log) -> None:
        self.topic = topic
        self.index = index
        self.topic_id = topic_id
        self.broker_id = broker_id
        self.log = log
        self.leader_id = broker_id
        self.leader_epoch = 0
        self.replicas: list[int] = [broker_id]
        self.isr: list[int] = [broker_id]
        # Log end offsets of follower replicas, reported by their fetches.
        self.follower_leo: dict[int, int] = {}
        self.high_watermark = log.log_end_offset
        self.producer_state = ProducerStateManager(log.dir)
        self.producer_state.rebuild(log)
        self.snapshot_offset = -1  # log end offset of the last producer snapshot written

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.broker_id

    def make_leader(self, leader_epoch: int, replicas: list[int], isr: list[int]) -> None:
        self.leader_id = self.broker_id
        self.leader_epoch = leader_epoch
        self.replicas = list(replicas)
        self.isr = list(isr)
        self.maybe_increment_high_watermark()

    def make_follower(self, leader: int, leader_epoch: int, replicas: list[int], isr: list[int]) -> None:
        self.leader_id = leader
        self.leader_epoch = leader_epoch
        self.replicas = list(replicas)
        self.isr = list(isr)
        self.follower_leo.clear()

    def maybe_increment_high_watermark(self) -> bool:
        leo = self.log.log_end_offset
        ends = [leo if r == self.broker_id else self.follower_leo.get(r, 0) for r in self.isr]
        new_hw = min(ends) if ends else leo
        if new_hw > self.high_watermark:
            self.high_watermark = new_hw
            return True
        return False

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
        if not self.is_leader:
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
        batches = validate_batches(records, self.log.config.max_message_bytes)
        headers = [h for _, h in batches]
        if any(h.is_control for h in headers):
            raise KafkaError("control batches are written by the transaction coordinator, "
                             "not by clients", ErrorCode.INVALID_RECORD)
        if from_client and self.log.config.compact:
            _require_keys(records, batches)
        if from_client and headers[0].producer_id >= 0:
            duplicate = self._check_sequences(headers)
            if duplicate is not None:
                return duplicate
        info = self.log.append(records, leader_epoch=self.leader_epoch, batches=batches)
        offset = info.first_offset
        for header in headers:
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

    def _check_sequences(self, headers) -> AppendInfo | None:
        """Kafka's idempotence checks: a retry of a recent batch gets its first answer back."""
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
        if end == self.snapshot_offset or not (even_if_empty or self.producer_state.producers):
            return None
        self.snapshot_offset = end
        return end, self.producer_state.encode_snapshot()


def _require_keys(records, batches) -> None:
    """Kafka refuses keyless records in a compacted topic: the cleaner could not keep them.
    Only compacted topics pay for decoding records on produce."""
    for pos, header in batches:
        if not header.is_control and any(r.key is None for r in iter_records(records, pos)):
            raise KafkaError("Compacted topic cannot accept message without key",
                             ErrorCode.INVALID_RECORD)


@dataclass(slots=True)
class ProduceResult:
    error: ErrorCode = ErrorCode.NONE
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    message: str | None = None
    durable_at: int = -1  # flush.messages reached: answer once the log is fsynced below this


@dataclass(slots=True)
class ReadResult:
    error: ErrorCode
    high_watermark: int = -1
    log_start_offset: int = -1
    records: FetchSlice | None = None
    last_stable_offset: int = -1
    aborted: list[AbortedTxn] | None = None  # read_committed only


class ReplicaManager:
    def __init__(self, broker_id: int, log_manager: LogManager,
                 known_partition: Callable[[str, int], bool] = lambda _t, _p: False) -> None:
        self.broker_id = broker_id
        self.log_manager = log_manager
        self.partitions: dict[TopicPartition, Partition] = {}
        self.fetch_purgatory = Purgatory()
        # Does the cluster have this partition (somewhere else)? Decides between
        # NOT_LEADER_OR_FOLLOWER (clients refresh metadata and re-route) and UNKNOWN_TOPIC.
        self.known_partition = known_partition

    def get_partition(self, topic: str, index: int) -> Partition | None:
        return self.partitions.get((topic, index))

    def missing_partition_error(self, tp: TopicPartition) -> ErrorCode:
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
        replicas: list[int], isr: list[int], config: LogConfig,
    ) -> Partition:
        """Kafka's makeLeaders / makeFollowers for one partition (the log is created on the
        first LeaderAndIsr that names this broker)."""
        partition = self.partitions.get((topic, index))
        if partition is None:
            log_ = self.log_manager.get_or_create_log(topic, index, config)
            partition = Partition(topic, index, topic_id, self.broker_id, log_)
            self.partitions[(topic, index)] = partition
        partition.log.config = config
        if leader == self.broker_id:
            partition.make_leader(leader_epoch, replicas, isr)
        else:
            partition.make_follower(leader, leader_epoch, replicas, isr)
        self.fetch_purgatory.wake((topic, index))  # long polls learn of the change
        return partition

    def stop_replica(self, topic: str, index: int, delete: bool) -> None:
        """Stop serving a replica; with `delete`, remove its log even if it was never loaded
        as a partition (a replica of a topic deleted while this broker was away)."""
        self.partitions.pop((topic, index), None)
        if delete and self.log_manager.get_log(topic, index) is not None:
            self.log_manager.delete_log(topic, index)
        self.fetch_purgatory.wake((topic, index))

    def append_records(self, required_acks: int, entries: Iterable[tuple[TopicPartition, bytearray]],
                       from_client: bool = True) -> dict[TopicPartition, ProduceResult]:
        results: dict[TopicPartition, ProduceResult] = {}
        for tp, records in entries:
            partition = self.partitions.get(tp)
            if partition is None:
                results[tp] = ProduceResult(self.missing_partition_error(tp))
                continue
            try:
                info = partition.append_records_to_leader(
                    records, required_acks, partition.log.config.min_insync_replicas, from_client)
            except KafkaError as e:
                log.warning("produce to %s-%d rejected: %s (%s)", tp[0], tp[1], e.code.name, e)
                results[tp] = ProduceResult(e.code, message=str(e) or None)
                continue
            except OSError as e:
                log.error("produce to %s-%d failed writing the log: %s", tp[0], tp[1], e)
                results[tp] = ProduceResult(ErrorCode.KAFKA_STORAGE_ERROR, message=str(e))
                continue
            log_, end = partition.log, info.last_offset + 1
            flush_due = log_.flush_hook is not None and end - log_.recovery_point >= log_.config.flush_messages
            results[tp] = ProduceResult(
                ErrorCode.NONE, info.first_offset, info.log_append_time, log_.log_start_offset,
                durable_at=end if flush_due else -1,
            )
            self.fetch_purgatory.wake(tp)
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
                await self.log_manager.flusher.wait_durable(partition.log, result.durable_at)
            except OSError as e:
                result.error, result.message = ErrorCode.KAFKA_STORAGE_ERROR, str(e)

    def read(self, tp: TopicPartition, offset: int, max_bytes: int, min_one_message: bool,
             read_committed: bool = False, current_leader_epoch: int = -1) -> ReadResult:
        """Read from the leader up to the high watermark, or for read_committed up to the last
        stable offset, with the aborted transactions the client must skip."""
        partition, error = self.leader_partition(tp)
        if partition is None:
            return ReadResult(error)
        epoch_error = partition.check_leader_epoch(current_leader_epoch)
        if epoch_error != ErrorCode.NONE:
            return ReadResult(epoch_error)
        log_ = partition.log
        hw = partition.high_watermark
        lso = partition.last_stable_offset
        try:
            records = log_.read(offset, max_bytes, max_offset=lso if read_committed else hw,
                                min_one_message=min_one_message)
            aborted = None
            if read_committed:
                aborted = log_.collect_aborted_txns(offset, lso) if records.size else []
        except KafkaError as e:
            return ReadResult(e.code, hw, log_.log_start_offset, last_stable_offset=lso)
        return ReadResult(ErrorCode.NONE, hw, log_.log_start_offset, records, lso, aborted)
