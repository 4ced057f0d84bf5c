"""TransactionStateManager: the transactions' durable state in `__transaction_state`.

Every state change is one record (key: transactional id, value: the whole transaction) written
with acks=-1 through the partition leader before the coordinator acts on it; start-up replays
the partitions this broker leads, and an election the partition it brings (`log_store`), the
latest record per id winning.
"""

from __future__ import annotations

import logging

from strom.coordinator import TRANSACTION_STATE_TOPIC, log_store
from strom.coordinator.transaction import records
from strom.coordinator.transaction.records import TransactionLogValue
from strom.protocol.errors import ErrorCode
from strom.protocol.record_schema import RecordFormatError

log = logging.getLogger(__name__)


class TransactionStateManager(log_store.InternalTopic):
    topic = TRANSACTION_STATE_TOPIC

    def coordinator_epoch(self, transactional_id: str) -> int:
        """The leader epoch of the id's partition: markers carry it so that a deposed
        coordinator's late markers are refused."""
        partition = self.partition_of(transactional_id)
        return partition.leader_epoch if partition is not None else -1

    def store(self, transactional_id: str, value: TransactionLogValue | None) -> ErrorCode:
        tp = (TRANSACTION_STATE_TOPIC, self.partition_for(transactional_id))
        error = log_store.append(self.replica_manager, tp, [
            (records.key(transactional_id), None if value is None else records.value(value))])
        if error != ErrorCode.NONE:
            log.warning("writing transaction %s to %s-%d failed: %s", transactional_id, *tp, error.name)
        return log_store.STORE_ERRORS.get(error, error)

    def new_state(self) -> dict[str, TransactionLogValue]:
        """The last state of every transactional id replayed."""
        return {}

    def replay_into(self, log_, state: dict[str, TransactionLogValue], start: int | None = None,
                    end: int | None = None) -> None:
        for item in log_store.replay(log_, start, end):
            if item.key is None:
                continue
            try:
                transactional_id = records.read_key(item.key)
                if item.value is None:
                    state.pop(transactional_id, None)
                else:
                    state[transactional_id] = records.read_value(item.value)
            except RecordFormatError as e:
                log.warning("skipping an unreadable record in %s: %s", log_.name, e)
