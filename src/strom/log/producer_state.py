"""Idempotent and transactional producers: per partition, each producer's epoch, its last five
batches and its open transaction.

Kafka de-duplicates retried batches by (producer id, epoch, sequence range): a retry of one of
the last five batches is answered with the offsets it got the first time instead of being
written again, and a sequence gap is OUT_OF_ORDER_SEQUENCE_NUMBER. The state lives next to
the segments as `<offset>.snapshot` files (the state as of that offset) and is rebuilt on
start-up from the newest usable snapshot plus the batch headers written after it.

A transactional producer's first batch in a partition opens its transaction there; the
transaction marker (a control batch written by the transaction coordinator) closes it. The
first offset of the earliest open transaction bounds the last stable offset (LSO) that
read_committed consumers may read up to; an abort becomes an entry of the transaction index.

Snapshot format (big endian, as Kafka's ProducerStateManager writes it): version i16,
crc32c u32 over the rest, entry count i32, then per producer: producer id i64, epoch i16,
last sequence i32, last offset i64, offset delta i32, timestamp i64, coordinator epoch i32,
current transaction first offset i64.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from crc32c import crc32c

from strom.log.index import fsync_path
from strom.log.txn_index import AbortedTxn
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.records import (
    CONTROL_COMMIT,
    HEADER_SIZE,
    BatchHeader,
    control_type,
    read_header,
)

log = logging.getLogger(__name__)

SNAPSHOT_SUFFIX = ".snapshot"
BATCHES_KEPT = 5  # Kafka's NumBatchesToRetain; also the client's max.in.flight bound
INT_MAX = 2**31 - 1
_HEAD = struct.Struct(">hIi")
_ENTRY = struct.Struct(">qhiqiqiq")
_SNAPSHOTS_KEPT = 2


@dataclass(slots=True, frozen=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass(slots=True)
class ProducerStateEntry:
    producer_id: int
    producer_epoch: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=BATCHES_KEPT))
    coordinator_epoch: int = -1  # of the last marker: older coordinators are fenced
    current_txn_first_offset: int = -1  # -1: no transaction open in this partition
    last_timestamp: int = -1  # of its last batch or marker: idle producers expire

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    def duplicate_of(self, header: BatchHeader) -> BatchMetadata | None:
        last_seq = _last_seq(header)
        for batch in self.batches:
            if batch.first_seq == header.base_sequence and batch.last_seq == last_seq:
                return batch
        return None


def _last_seq(header: BatchHeader) -> int:
    return (header.base_sequence + header.last_offset_delta) % (INT_MAX + 1)


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (last_seq == INT_MAX and next_seq == 0)


# Snapshot writers, striped by partition directory (a lock each would be 100,000 locks).
_SNAPSHOT_LOCKS = tuple(threading.Lock() for _ in range(64))


class ProducerStateManager:
    def __init__(self, dir: Path) -> None:
        self.dir = dir
        self.producers: dict[int, ProducerStateEntry] = {}
        self.ongoing: dict[int, int] = {}  # producer id -> first offset of its open transaction

    @property
    def first_unstable_offset(self) -> int | None:
        """First offset of the earliest open transaction (None: everything is decided)."""
        return min(self.ongoing.values()) if self.ongoing else None  # asked per partition per fetch

    def check(self, header: BatchHeader) -> BatchMetadata | None:
        """Validate an idempotent batch before it is written. Returns the earlier batch when
        this one is a retry of it; raises the error Kafka answers otherwise."""
        entry = self.producers.get(header.producer_id)
        if entry is None:
            return None  # unknown (new, or its state was removed): any sequence is accepted
        if header.producer_epoch < entry.producer_epoch:
            raise KafkaError(
                f"producer {header.producer_id} epoch {header.producer_epoch} is older than "
                f"{entry.producer_epoch}", ErrorCode.INVALID_PRODUCER_EPOCH)
        if header.producer_epoch > entry.producer_epoch:
            if header.base_sequence != 0:
                raise KafkaError(
                    f"new epoch {header.producer_epoch} of producer {header.producer_id} must "
                    f"start at sequence 0, not {header.base_sequence}",
                    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
            return None
        duplicate = entry.duplicate_of(header)
        if duplicate is not None:
            return duplicate
        if entry.batches and not _in_sequence(entry.last_seq, header.base_sequence):
            raise KafkaError(
                f"producer {header.producer_id}: sequence {header.base_sequence} does not follow "
                f"{entry.last_seq}", ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
        return None

    def update(self, header: BatchHeader, first_offset: int) -> None:
        """Record a data batch written at `first_offset` (its assigned base offset)."""
        entry = self._entry(header.producer_id, header.producer_epoch)
        entry.last_timestamp = max(entry.last_timestamp, header.max_timestamp)
        if header.base_sequence >= 0:  # coordinator writes (transactional offsets) carry none
            entry.batches.append(BatchMetadata(
                header.base_sequence, _last_seq(header), first_offset,
                first_offset + header.last_offset_delta, header.max_timestamp))
        if header.is_transactional and entry.current_txn_first_offset < 0:
            entry.current_txn_first_offset = first_offset
            self.ongoing[header.producer_id] = first_offset

    def _entry(self, producer_id: int, epoch: int) -> ProducerStateEntry:
        """The producer's entry, reset when `epoch` is newer (its batches are of no use then;
        an open transaction stays open until its marker)."""
        entry = self.producers.get(producer_id)
        if entry is None or epoch > entry.producer_epoch:
            fresh = ProducerStateEntry(producer_id, epoch)
            if entry is not None:
                fresh.coordinator_epoch = entry.coordinator_epoch
                fresh.current_txn_first_offset = entry.current_txn_first_offset
            self.producers[producer_id] = entry = fresh
        return entry

    # --- transaction markers ---------------------------------------------------------------
    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int) -> None:
        """Refuse a marker from a fenced producer epoch or an older coordinator."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        if epoch < entry.producer_epoch:
            raise KafkaError(f"marker for producer {producer_id} has epoch {epoch}, older than "
                             f"{entry.producer_epoch}", ErrorCode.INVALID_PRODUCER_EPOCH)
        if coordinator_epoch < entry.coordinator_epoch:
            raise KafkaError(f"marker for producer {producer_id} comes from coordinator epoch "
                             f"{coordinator_epoch}, older than {entry.coordinator_epoch}",
                             ErrorCode.TRANSACTION_COORDINATOR_FENCED)

    def complete_txn(self, producer_id: int, epoch: int, coordinator_epoch: int,
                     marker_offset: int, committed: bool, timestamp: int = -1) -> AbortedTxn | None:
        """Close the producer's transaction with the marker written at `marker_offset`.
        Returns the transaction-index entry when an abort discarded data here."""
        entry = self._entry(producer_id, epoch)
        entry.last_timestamp = max(entry.last_timestamp, timestamp)
        entry.coordinator_epoch = max(entry.coordinator_epoch, coordinator_epoch)
        first = entry.current_txn_first_offset
        entry.current_txn_first_offset = -1
        self.ongoing.pop(producer_id, None)
        if committed or first < 0:
            return None
        stable = self.first_unstable_offset
        return AbortedTxn(producer_id, first, marker_offset,
                          marker_offset + 1 if stable is None else stable)

    def remove_expired(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers idle for `producer.id.expiration.ms` with no open transaction (as
        Kafka does), so that short-lived producers do not pile up. Returns how many went."""
        expired = [pid for pid, e in self.producers.items()
                   if e.current_txn_first_offset < 0 and now_ms - e.last_timestamp >= expiration_ms]
        for pid in expired:
            del self.producers[pid]
        return len(expired)

    # --- snapshots -----------------------------------------------------------------------
    def snapshot_offsets(self) -> list[int]:
        return sorted(int(p.name[: -len(SNAPSHOT_SUFFIX)]) for p in self.dir.glob("*" + SNAPSHOT_SUFFIX)
                      if p.name[: -len(SNAPSHOT_SUFFIX)].isdigit())

    def encode_snapshot(self) -> bytes:
        """The snapshot bytes of the current state (cheap; call on the loop that owns it)."""
        body = bytearray(struct.pack(">i", len(self.producers)))
        for entry in self.producers.values():
            last = entry.batches[-1] if entry.batches else BatchMetadata(-1, -1, -1, -1, -1)
            body += _ENTRY.pack(entry.producer_id, entry.producer_epoch, last.last_seq,
                                last.last_offset, last.last_offset - last.first_offset,
                                entry.last_timestamp, entry.coordinator_epoch,
                                entry.current_txn_first_offset)
        return struct.pack(">hI", 1, crc32c(bytes(body))) + body

    def write_snapshot(self, offset: int, data: bytes) -> Path:
        """Write snapshot `data` taken at log end offset `offset` atomically (blocking: fsync),
        keeping only the newest few."""
        path = self.dir / f"{offset:020d}{SNAPSHOT_SUFFIX}"
        tmp = path.with_suffix(".snapshot.tmp")
        # One writer per partition: the periodic snapshot may still be writing in its thread
        # when the shutdown's starts, and two writers of one temp file fail each other.
        with _SNAPSHOT_LOCKS[hash(self.dir) % len(_SNAPSHOT_LOCKS)]:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fsync_path(self.dir)  # the new name, not only the bytes, must survive a power cut
            for old in self.snapshot_offsets()[:-_SNAPSHOTS_KEPT]:
                (self.dir / f"{old:020d}{SNAPSHOT_SUFFIX}").unlink(missing_ok=True)
        return path

    def load(self, log_end_offset: int, drop_newer: bool = True) -> int:
        """Load the newest readable snapshot at or below `log_end_offset` (newer ones describe
        data lost to truncation and are deleted, unless not `drop_newer`: a reader of the state
        as of an earlier offset); return its offset, or 0 when there is none. The caller then
        replays the batches from that offset (`replay`)."""
        self.producers, self.ongoing = {}, {}
        for offset in reversed(self.snapshot_offsets()):
            path = self.dir / f"{offset:020d}{SNAPSHOT_SUFFIX}"
            if offset > log_end_offset:
                if drop_newer:
                    path.unlink(missing_ok=True)
                continue
            try:
                self.producers = read_snapshot(path)
                self.ongoing = {pid: e.current_txn_first_offset for pid, e in self.producers.items()
                                if e.current_txn_first_offset >= 0}
                return offset
            except (OSError, ValueError, struct.error) as e:
                log.warning("%s: unreadable producer snapshot %s (%s); trying an older one",
                            self.dir.name, path.name, e)
                path.unlink(missing_ok=True)
        return 0

    def rebuild(self, log) -> None:
        """State of `log` (a strom.log.Log): the newest snapshot, then the batch headers
        written after it. Reads headers only; only transaction markers are decoded, and an
        abort found here is indexed again if the transaction index lost it."""
        self.replay(log, max(self.load(log.log_end_offset), log.local_log_start_offset), log.log_end_offset)

    def replay(self, log, offset: int, end: int, aborts=None) -> int:
        """Take in the batch headers of `log` from `offset` up to `end` (`apply_batches`, aborts
        indexed in `aborts`, default the log itself); return where it stopped."""
        while offset < end:
            data = log.read(offset, 1 << 20, max_offset=end, min_one_message=True).read_bytes()
            after = self.apply_batches(data, log if aborts is None else aborts, offset)
            if after == offset:
                break  # nothing readable at this offset: stop rather than spin
            offset = after
        return offset

    def apply_batches(self, data, log, from_offset: int = 0) -> int:
        """Take in whole batches already in `log` with their offsets (a replay, or what a
        follower just copied from its leader): data batches move producers' sequences, markers
        close transactions (an abort is indexed). Returns the offset after the last batch."""
        offset, pos = from_offset, 0
        while len(data) - pos >= HEADER_SIZE:
            header = read_header(data, pos)
            if pos + header.size > len(data):
                break
            if header.last_offset >= from_offset and header.producer_id >= 0:
                if header.is_control:
                    aborted = self.complete_txn(
                        header.producer_id, header.producer_epoch, -1, header.base_offset,
                        control_type(data, pos) == CONTROL_COMMIT, header.max_timestamp)
                    if aborted is not None:
                        log.add_aborted_txn(aborted)
                else:
                    self.update(header, header.base_offset)
            offset = max(offset, header.last_offset + 1)
            pos += header.size
        return offset


def read_snapshot(path: Path) -> dict[int, ProducerStateEntry]:
    """The producers of a `<offset>.snapshot` file (ValueError or struct.error if damaged)."""
    data = path.read_bytes()
    version, crc, count = _HEAD.unpack_from(data, 0)
    if version != 1 or crc32c(data[6:]) != crc:
        raise ValueError("bad version or checksum")
    if len(data) != 10 + count * _ENTRY.size:
        raise ValueError(f"{len(data)} bytes for {count} producers")
    producers = {}
    for i in range(count):
        pid, epoch, last_seq, last_offset, delta, ts, coordinator_epoch, txn_first = _ENTRY.unpack_from(
            data, 10 + i * _ENTRY.size)
        entry = ProducerStateEntry(pid, epoch, coordinator_epoch=coordinator_epoch,
                                   current_txn_first_offset=txn_first, last_timestamp=ts)
        if last_seq >= 0:
            first_seq = (last_seq - delta) % (INT_MAX + 1)
            entry.batches.append(BatchMetadata(first_seq, last_seq, last_offset - delta, last_offset, ts))
        producers[pid] = entry
    return producers
