"""TransactionStateManager: the transactions' durable state in `__transaction_state`.

Every state change is one record (key: transactional id, value: the whole transaction) written
with acks=-1 through the partition leader before the coordinator acts on it; start-up replays
the partitions this broker leads, the latest record per id winning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from strom.coordinator import TRANSACTION_STATE_TOPIC, log_store, partition_for
from strom.coordinator.schema import RecordFormatError
from strom.coordinator.transaction import records
from strom.coordinator.transaction.records import TransactionLogValue
from strom.protocol.errors import ErrorCode

log = logging.getLogger(__name__)


class TransactionStateManager:
    def __init__(self, replica_manager, num_partitions: Callable[[], int]) -> None:
        self.replica_manager = replica_manager
        self.num_partitions = num_partitions

    def partition_for(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.num_partitions())

    def _partition(self, transactional_id: str):
        return self.replica_manager.get_partition(TRANSACTION_STATE_TOPIC,
                                                  self.partition_for(transactional_id))

    def is_local(self, transactional_id: str) -> bool:
        partition = self._partition(transactional_id)
        return partition is not None and partition.is_leader

    def coordinator_epoch(self, transactional_id: str) -> int:
        """The leader epoch of the id's partition: markers carry it so that a deposed
        coordinator's late markers are refused."""
        partition = self._partition(transactional_id)
        return partition.leader_epoch if partition is not None else -1

    def store(self, transactional_id: str, value: TransactionLogValue | None) -> ErrorCode:
        tp = (TRANSACTION_STATE_TOPIC, self.partition_for(transactional_id))
        error = log_store.append(self.replica_manager, tp, [
            (records.key(transactional_id), None if value is None else records.value(value))])
        if error != ErrorCode.NONE:
            log.warning("writing transaction %s to %s-%d failed: %s", transactional_id, *tp, error.name)
        return log_store.STORE_ERRORS.get(error, error)

    def load(self) -> dict[str, TransactionLogValue]:
        """The last state of every transactional id in the partitions this broker leads."""
        loaded: dict[str, TransactionLogValue] = {}
        for p in range(self.num_partitions()):
            partition = self.replica_manager.get_partition(TRANSACTION_STATE_TOPIC, p)
            if partition is None or not partition.is_leader:
                continue
            for item in log_store.replay(partition.log):
                if item.key is None:
                    continue
                try:
                    transactional_id = records.read_key(item.key)
                    if item.value is None:
                        loaded.pop(transactional_id, None)
                    else:
                        loaded[transactional_id] = records.read_value(item.value)
                except RecordFormatError as e:
                    log.warning("skipping an unreadable record in %s: %s", partition.log.name, e)
        return loaded
