"""The transaction coordinator (seed 000 "TransactionCoordinator", KIP-98).

A transactional id's life: InitProducerId gives it a producer id and bumps the epoch, which
fences any older producer with the same id (and aborts what it left open); AddPartitionsToTxn
and AddOffsetsToTxn make the transaction Ongoing and record every partition it touches;
EndTxn moves it to PrepareCommit or PrepareAbort, writes a marker to every one of those
partitions, then records CompleteCommit or CompleteAbort. Each transition is written to
`__transaction_state` before the coordinator acts on it, so after a restart a transaction
found in a Prepare state gets its markers (again) and completes. Transactions open longer
than their timeout are aborted with a bumped epoch, so the stuck producer is fenced too.

Transactions version 2 (KIP-890 part 2) changes three things for clients that use it: the
partition leaders add partitions on the producer's behalf (Produce v12, TxnOffsetCommit v5)
instead of AddPartitionsToTxn/AddOffsetsToTxn; every EndTxn bumps the producer epoch (a new
producer id once the epoch runs out), the markers carry the bumped epoch, and the response
tells the producer the epoch of its next transaction; and so a retried EndTxn is recognised
by its epoch being one behind.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol

from strom.coordinator.transaction.records import TransactionLogValue, TxnState
from strom.protocol.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
MAX_EPOCH = 32767  # Short.MAX_VALUE; an id whose epoch would pass it gets a new producer id
_PREPARED = {TxnState.PREPARE_COMMIT: True, TxnState.PREPARE_ABORT: False}
_COMPLETE = {True: TxnState.COMPLETE_COMMIT, False: TxnState.COMPLETE_ABORT}


class TransactionStore(Protocol):
    def is_local(self, transactional_id: str) -> bool: ...
    def partition_for(self, transactional_id: str) -> int: ...
    def coordinator_epoch(self, transactional_id: str) -> int: ...
    def store(self, transactional_id: str, value: TransactionLogValue | None) -> ErrorCode: ...


# write_markers(producer_id, epoch, coordinator_epoch, committed, partitions) -> errors
MarkerWriter = Callable[[int, int, int, bool, Iterable[TopicPartition]], dict[TopicPartition, ErrorCode]]


@dataclass(slots=True, frozen=True)
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int = -1
    last_producer_id: int = -1
    last_producer_epoch: int = -1
    timeout_ms: int = 60000
    state: TxnState = TxnState.EMPTY
    partitions: frozenset[TopicPartition] = field(default_factory=frozenset)
    start_ms: int = -1
    last_update_ms: int = -1
    next_producer_id: int = -1  # TV2: the id a prepared transaction's producer goes on with
    client_transaction_version: int = 0

    def to_value(self) -> TransactionLogValue:
        return TransactionLogValue(self.producer_id, self.producer_epoch, self.timeout_ms, self.state,
                                   set(self.partitions), self.last_update_ms, self.start_ms,
                                   self.last_producer_id, self.next_producer_id,
                                   self.client_transaction_version)

    @property
    def bumps_epoch(self) -> bool:
        """Transactions version 2 rules apply (not while fencing, which bumps on its own)."""
        return self.client_transaction_version >= 2 and self.state != TxnState.PREPARE_EPOCH_FENCE

    def after_completion(self) -> tuple[int, int]:
        """The producer id and epoch its producer uses once this (prepared) transaction ends."""
        if self.next_producer_id >= 0:
            return self.next_producer_id, 0
        return self.producer_id, self.producer_epoch


@dataclass(slots=True, frozen=True)
class InitResult:
    """InitProducerId's and (TV2) EndTxn's answer: an error, or the id and epoch to use."""

    error: ErrorCode
    producer_id: int = -1
    producer_epoch: int = -1


class TransactionCoordinator:
    def __init__(self, store: TransactionStore, generate_producer_id: Callable[[], int],
                 write_markers: MarkerWriter, max_timeout_ms: int,
                 id_expiration_ms: int = 7 * 24 * 3600 * 1000,
                 now_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        self.store = store
        self.generate_producer_id = generate_producer_id
        self.write_markers = write_markers
        self.max_timeout_ms = max_timeout_ms
        self.id_expiration_ms = id_expiration_ms  # transactional.id.expiration.ms
        self.now_ms = now_ms
        self.txns: dict[str, TransactionMetadata] = {}
        self.active = False
        # `__transaction_state` partitions being loaded (off the event loop), each with the token
        # of its load: their ids are answered COORDINATOR_LOAD_IN_PROGRESS meanwhile.
        self.loading: dict[int, object] = {}

    # --- lifecycle ------------------------------------------------------------------------------
    def startup(self, loaded: dict[str, TransactionLogValue]) -> None:
        """Take over the loaded transactions and finish those a restart caught half-way."""
        for txn_id, v in loaded.items():
            self.txns[txn_id] = TransactionMetadata(
                txn_id, v.producer_id, v.producer_epoch, last_producer_id=v.previous_producer_id,
                timeout_ms=v.timeout_ms, state=v.state, partitions=frozenset(v.partitions),
                start_ms=v.start_ms, last_update_ms=v.last_update_ms, next_producer_id=v.next_producer_id,
                client_transaction_version=v.client_transaction_version)
        self.active = True
        pending = [m for m in map(self.txns.get, loaded) if m is not None and m.state in _PREPARED]
        for meta in pending:
            log.info("completing transaction %s (%s) found at start-up", meta.transactional_id,
                     meta.state.display)
            self._send_markers(meta)
        if self.txns:
            log.info("loaded %d transactional ids from the transaction state topic", len(self.txns))

    def shutdown(self) -> None:
        self.active = False
        self.loading.clear()

    def unload_partition(self, partition: int) -> None:
        """Leadership of `__transaction_state` partition `partition` left this broker."""
        self.loading.pop(partition, None)  # a load still running is not applied
        for txn_id in [t for t in self.txns if self.store.partition_for(t) == partition]:
            del self.txns[txn_id]

    def retry_markers(self, producer_id: int) -> None:
        """Markers sent to other brokers came back: finish the producer's prepared transaction."""
        for meta in list(self.txns.values()):
            if meta.producer_id == producer_id and meta.state in _PREPARED:
                self._send_markers(meta)

    # --- writing state --------------------------------------------------------------------------
    def _persist(self, meta: TransactionMetadata) -> ErrorCode:
        """Write the new state; only once it is in the log does it become the current one."""
        error = self.store.store(meta.transactional_id, meta.to_value())
        if error == ErrorCode.NONE:
            self.txns[meta.transactional_id] = meta
        return error

    def _check_coordinator(self, transactional_id: str) -> ErrorCode | None:
        if not transactional_id:
            return ErrorCode.INVALID_REQUEST
        if not self.active:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if self.loading and self.store.partition_for(transactional_id) in self.loading:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        if not self.store.is_local(transactional_id):
            return ErrorCode.NOT_COORDINATOR
        return None

    def _current(self, transactional_id: str, producer_id: int, producer_epoch: int
                 ) -> tuple[ErrorCode | None, TransactionMetadata | None]:
        """The transaction, if the caller is its current producer."""
        error = self._check_coordinator(transactional_id)
        if error is not None:
            return error, None
        meta = self.txns.get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING, None
        if meta.producer_epoch != producer_epoch:
            return ErrorCode.PRODUCER_FENCED, None
        return None, meta

    # --- InitProducerId -------------------------------------------------------------------------
    def init_producer_id(self, transactional_id: str, timeout_ms: int, expected_producer_id: int = -1,
                         expected_epoch: int = -1) -> InitResult:
        error = self._check_coordinator(transactional_id)
        if error is not None:
            return InitResult(error)
        if not 0 < timeout_ms <= self.max_timeout_ms:
            return InitResult(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
        meta = self.txns.get(transactional_id)
        if meta is None:
            meta = TransactionMetadata(transactional_id, self.generate_producer_id(), timeout_ms=timeout_ms)
        elif expected_producer_id >= 0:
            # KIP-360: a producer bumping its own epoch must still be the current one; a retry
            # of a bump that already happened gets the same answer again.
            if (expected_producer_id, expected_epoch) == (meta.last_producer_id, meta.last_producer_epoch) \
                    and meta.state == TxnState.EMPTY:
                return InitResult(ErrorCode.NONE, meta.producer_id, meta.producer_epoch)
            if (expected_producer_id, expected_epoch) != (meta.producer_id, meta.producer_epoch):
                return InitResult(ErrorCode.PRODUCER_FENCED)
        if meta.state in _PREPARED:
            meta = self._send_markers(meta)  # a retry may finish it now
            if meta.state in _PREPARED:
                return InitResult(ErrorCode.CONCURRENT_TRANSACTIONS)
        if meta.state == TxnState.ONGOING:
            # A new producer for this id: the old one's open transaction is aborted under a
            # bumped epoch, which fences it everywhere the markers go.
            error = self._abort_fencing(meta, "a new producer initialized the transactional id")
            if error != ErrorCode.NONE:
                return InitResult(error)
            meta = self.txns[transactional_id]
            if meta.state != TxnState.COMPLETE_ABORT:
                return InitResult(ErrorCode.CONCURRENT_TRANSACTIONS)
        if meta.producer_epoch + 1 >= MAX_EPOCH:
            producer_id, epoch = self.generate_producer_id(), 0
        else:
            producer_id, epoch = meta.producer_id, meta.producer_epoch + 1
        bumped = replace(meta, producer_id=producer_id, producer_epoch=epoch,
                         last_producer_id=meta.producer_id, last_producer_epoch=meta.producer_epoch,
                         timeout_ms=timeout_ms, state=TxnState.EMPTY, partitions=frozenset(),
                         start_ms=-1, last_update_ms=self.now_ms())
        error = self._persist(bumped)
        if error != ErrorCode.NONE:
            return InitResult(error)
        return InitResult(ErrorCode.NONE, producer_id, epoch)

    # --- AddPartitionsToTxn / AddOffsetsToTxn ---------------------------------------------------
    def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: Iterable[TopicPartition], transaction_version: int = 0) -> ErrorCode:
        """AddPartitionsToTxn / AddOffsetsToTxn (`transaction_version` 0), or a partition
        leader adding a partition for a producer of transactions version 2."""
        error, meta = self._current(transactional_id, producer_id, producer_epoch)
        if error is not None:
            return error
        if meta.state in _PREPARED or meta.state == TxnState.PREPARE_EPOCH_FENCE:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        wanted = frozenset(partitions)
        if meta.state == TxnState.ONGOING and wanted <= meta.partitions:
            return ErrorCode.NONE
        now = self.now_ms()
        starting = meta.state != TxnState.ONGOING
        return self._persist(replace(
            meta, state=TxnState.ONGOING, partitions=meta.partitions | wanted,
            start_ms=now if starting else meta.start_ms, last_update_ms=now,
            client_transaction_version=transaction_version if starting else meta.client_transaction_version))

    def verify_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          partitions: Iterable[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        """AddPartitionsToTxn v4 with verify_only: are these partitions in the open transaction?"""
        partitions = list(partitions)
        error, meta = self._current(transactional_id, producer_id, producer_epoch)
        if error is None and meta.state in _PREPARED:
            error = ErrorCode.CONCURRENT_TRANSACTIONS
        if error is not None:
            return dict.fromkeys(partitions, error)
        # Kafka 3.x answers TRANSACTION_ABORTABLE here even at v4; the asking broker maps it.
        return {tp: ErrorCode.NONE if tp in meta.partitions else ErrorCode.TRANSACTION_ABORTABLE
                for tp in partitions}

    # --- EndTxn ---------------------------------------------------------------------------------
    def end_transaction(self, transactional_id: str, producer_id: int, producer_epoch: int,
                        committed: bool, transaction_version: int = 0) -> InitResult:
        """EndTxn. With `transaction_version` 2 (EndTxn v5) the answer carries the producer id
        and epoch for the producer's next transaction."""
        error = self._check_coordinator(transactional_id)
        if error is not None:
            return InitResult(error)
        meta = self.txns.get(transactional_id)
        if meta is None:
            return InitResult(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
        error = self._end_txn_fencing(meta, producer_id, producer_epoch)
        if error is not None:
            return InitResult(error)
        state = meta.state
        if state == TxnState.ONGOING:
            error, meta = self._end(meta, committed, bump=transaction_version >= 2)
            return InitResult(error, *meta.after_completion()) if error == ErrorCode.NONE else InitResult(error)
        if state == _COMPLETE[committed]:  # a retry of an EndTxn that already finished
            return InitResult(ErrorCode.NONE, meta.producer_id, meta.producer_epoch)
        if state in _PREPARED and _PREPARED[state] == committed:
            return InitResult(ErrorCode.CONCURRENT_TRANSACTIONS)  # markers still being written
        return InitResult(ErrorCode.INVALID_TXN_STATE)

    @staticmethod
    def _end_txn_fencing(meta: TransactionMetadata, producer_id: int, producer_epoch: int) -> ErrorCode | None:
        """Is the EndTxn from the transaction's current producer (or a retry of its last one)?
        Under transactions version 2 the epoch moved on when the transaction ended, so a retry
        comes one epoch behind, or, when that bump ran out of epochs, from the previous id."""
        if not meta.bumps_epoch:
            if meta.producer_id != producer_id:
                return ErrorCode.INVALID_PRODUCER_ID_MAPPING
            return None if producer_epoch == meta.producer_epoch else ErrorCode.PRODUCER_FENCED
        retry_of_bump = meta.producer_id == producer_id and meta.producer_epoch == producer_epoch + 1
        retry_of_overflow = (meta.last_producer_id == producer_id and producer_epoch == MAX_EPOCH - 1
                             and meta.producer_epoch == 0)
        if meta.producer_id != producer_id and not retry_of_overflow:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if meta.state in (TxnState.ONGOING, TxnState.EMPTY):
            valid = producer_epoch == meta.producer_epoch
        elif meta.state in _PREPARED:
            valid = retry_of_bump
        else:
            valid = retry_of_bump or retry_of_overflow
        return None if valid else ErrorCode.PRODUCER_FENCED

    def _end(self, meta: TransactionMetadata, committed: bool, bump: bool = False
             ) -> tuple[ErrorCode, TransactionMetadata]:
        """Record the decision (under transactions version 2 with the epoch bumped, and a new
        producer id lined up when the epoch is spent), then write the markers."""
        changes = {}
        if bump:
            changes = {"producer_epoch": meta.producer_epoch + 1, "client_transaction_version": 2}
            if meta.producer_epoch + 1 >= MAX_EPOCH - 1:
                try:
                    changes["next_producer_id"] = self.generate_producer_id()
                except KafkaError as e:  # no id to give yet (a KRaft broker's block): retriable
                    return e.code, meta
        prepared = replace(meta, state=TxnState.PREPARE_COMMIT if committed else TxnState.PREPARE_ABORT,
                           last_update_ms=self.now_ms(), **changes)
        error = self._persist(prepared)
        if error == ErrorCode.NONE:
            self._send_markers(prepared)  # the decision is durable: the client may go on
        return error, prepared

    def _abort_fencing(self, meta: TransactionMetadata, reason: str) -> ErrorCode:
        """Abort an open transaction under epoch + 1 (Kafka's PrepareEpochFence)."""
        log.info("aborting transaction %s of producer %d epoch %d: %s", meta.transactional_id,
                 meta.producer_id, meta.producer_epoch, reason)
        epoch = meta.producer_epoch + 1 if meta.producer_epoch + 1 < MAX_EPOCH else meta.producer_epoch
        fenced = replace(meta, producer_epoch=epoch, state=TxnState.PREPARE_EPOCH_FENCE)
        self.txns[meta.transactional_id] = fenced  # in memory only, as in Kafka
        error, _ = self._end(fenced, committed=False)
        if error != ErrorCode.NONE:
            self.txns[meta.transactional_id] = meta
        return error

    def _send_markers(self, meta: TransactionMetadata) -> TransactionMetadata:
        """Write the markers of a prepared transaction, then record its completion. Partitions
        that could not take theirs stay pending and are retried by `abort_timed_out`."""
        committed = _PREPARED[meta.state]
        errors = self.write_markers(meta.producer_id, meta.producer_epoch,
                                    self.store.coordinator_epoch(meta.transactional_id), committed,
                                    sorted(meta.partitions))
        retry = frozenset(tp for tp, e in errors.items() if e not in _MARKER_DONE)
        for tp, e in errors.items():
            if e in _MARKER_GIVE_UP:
                log.warning("dropping the %s marker of %s for %s-%d: %s", "commit" if committed else "abort",
                            meta.transactional_id, tp[0], tp[1], e.name)
        if retry:
            meta = replace(meta, partitions=retry)
            self.txns[meta.transactional_id] = meta
            return meta
        complete = replace(meta, state=_COMPLETE[committed], partitions=frozenset(),
                           last_update_ms=self.now_ms())
        if meta.next_producer_id >= 0:  # TV2 ran out of epochs: the producer goes on as a new id
            complete = replace(complete, producer_id=meta.next_producer_id, producer_epoch=0,
                               last_producer_id=meta.producer_id, last_producer_epoch=meta.producer_epoch,
                               next_producer_id=-1)
        if self._persist(complete) != ErrorCode.NONE:
            return meta  # markers are written; recording that is retried
        return complete

    # --- timeouts -------------------------------------------------------------------------------
    def abort_timed_out(self) -> int:
        """Abort transactions open past their timeout; retry pending markers. Returns how many
        transactions were aborted."""
        if not self.active:
            return 0
        now = self.now_ms()
        aborted = 0
        for meta in list(self.txns.values()):
            if meta.state in _PREPARED:
                self._send_markers(meta)
            elif meta.state == TxnState.ONGOING and meta.start_ms + meta.timeout_ms < now:
                if self._abort_fencing(meta, f"open longer than its timeout of {meta.timeout_ms} ms") \
                        == ErrorCode.NONE:
                    aborted += 1
        return aborted

    def remove_expired(self) -> int:
        """Forget transactional ids unused for `transactional.id.expiration.ms` (a tombstone in
        the log), as Kafka does; ids with a transaction in flight stay."""
        if not self.active:
            return 0
        deadline = self.now_ms() - self.id_expiration_ms
        idle = (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
        removed = 0
        for meta in list(self.txns.values()):
            if meta.state in idle and meta.last_update_ms <= deadline and \
                    self.store.store(meta.transactional_id, None) == ErrorCode.NONE:
                del self.txns[meta.transactional_id]
                removed += 1
        if removed:
            log.info("expired %d transactional ids", removed)
        return removed

    # --- admin ----------------------------------------------------------------------------------
    def describe(self, transactional_id: str) -> tuple[ErrorCode, TransactionMetadata | None]:
        error = self._check_coordinator(transactional_id)
        if error is not None:
            return error, None
        meta = self.txns.get(transactional_id)
        if meta is None:
            return ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, None
        return ErrorCode.NONE, meta

    def list(self, states: Iterable[str] = (), producer_ids: Iterable[int] = (),
             min_duration_ms: int = -1) -> tuple[list[TransactionMetadata], list[str]]:
        """Transactions matching every filter given, and the state names not known."""
        known = {s.display: s for s in TxnState}
        states = list(states)
        unknown = [s for s in states if s not in known]
        wanted_states = {known[s] for s in states if s in known}
        wanted_ids = set(producer_ids)
        now = self.now_ms()
        out = [m for m in self.txns.values()
               if (not states or m.state in wanted_states)
               and (not wanted_ids or m.producer_id in wanted_ids)
               and (min_duration_ms < 0 or (m.state == TxnState.ONGOING and now - m.start_ms >= min_duration_ms))]
        return out, unknown


# Marker results that end a partition's part: written, or it can never take one (the topic is
# gone, or the partition already moved past this producer epoch or coordinator).
_MARKER_GIVE_UP = {ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.INVALID_PRODUCER_EPOCH,
                   ErrorCode.TRANSACTION_COORDINATOR_FENCED}
_MARKER_DONE = {ErrorCode.NONE} | _MARKER_GIVE_UP
