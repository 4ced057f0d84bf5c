"""AddPartitionsToTxnManager: the broker's questions to the transaction coordinator about a
producer's open transaction (KIP-890). Before a transactional Produce or TxnOffsetCommit is
written the partition leader asks whether the partitions are part of the transaction (part 1,
AddPartitionsToTxn v5 with verify_only), or, for transactions version 2 producers, which add
no partitions themselves, adds them (part 2). The coordinator is this broker's own when it
leads the transactional id's `__transaction_state` partition; otherwise it is asked over the
inter-broker connection."""

from __future__ import annotations

import asyncio
from typing import Any

from strom.coordinator import TRANSACTION_STATE_TOPIC, partition_for
from strom.protocol.errors import ErrorCode

ADD_PARTITIONS_TO_TXN = 24


class AddPartitionsToTxnManager:
    def __init__(self, broker: Any) -> None:
        self.broker = broker

    async def add(self, transactional_id: str, producer_id: int, producer_epoch: int,
                  partitions: list[tuple[str, int]], transaction_version: int = 0) -> ErrorCode:
        """This broker's coordinator adds the partitions; done once its ISR has the new state."""
        broker = self.broker
        error = broker.txn_coordinator.add_partitions(transactional_id, producer_id, producer_epoch, partitions,
                                                      transaction_version=transaction_version)
        if error == ErrorCode.NONE:
            error = await broker.coordinators.await_internal_replication(TRANSACTION_STATE_TOPIC, transactional_id)
        return error

    async def verify(self, transactional_id: str, producer_id: int, producer_epoch: int,
                     partitions: list[tuple[str, int]], add: bool = False
                     ) -> dict[tuple[str, int], ErrorCode]:
        """Are these partitions part of the producer's open transaction, or, with `add`, make
        them part: each partition's answer from the transaction coordinator."""
        coordinator = self._coordinator_id(transactional_id)
        if coordinator == self.broker.broker_id:
            if not add:
                return self.broker.txn_coordinator.verify_partitions(transactional_id, producer_id,
                                                                     producer_epoch, partitions)
            error = await self.add(transactional_id, producer_id, producer_epoch, partitions,
                                   transaction_version=2)
            return dict.fromkeys(partitions, error)
        if coordinator < 0:
            return dict.fromkeys(partitions, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        topics: dict[str, list[int]] = {}
        for topic, index in partitions:
            topics.setdefault(topic, []).append(index)
        try:
            response = await self.broker.connections.call(coordinator, ADD_PARTITIONS_TO_TXN, 5, {"transactions": [{
                "transactional_id": transactional_id, "producer_id": producer_id,
                "producer_epoch": producer_epoch, "verify_only": not add,
                "topics": [{"name": t, "partitions": p} for t, p in topics.items()]}]})
        except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError, LookupError):
            return dict.fromkeys(partitions, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if response.error_code != ErrorCode.NONE:
            return dict.fromkeys(partitions, ErrorCode(response.error_code))
        answers = dict.fromkeys(partitions, ErrorCode.COORDINATOR_NOT_AVAILABLE)  # unless answered
        for txn in response.results_by_transaction:
            for t in txn.topic_results:
                for p in t.results_by_partition:
                    if (t.name, p.partition_index) in answers:
                        answers[(t.name, p.partition_index)] = ErrorCode(p.partition_error_code)
        return answers

    def _coordinator_id(self, transactional_id: str) -> int:
        topic = self.broker.metadata_cache.topics.get(TRANSACTION_STATE_TOPIC)
        if topic is None:
            return -1
        state = topic.partitions.get(partition_for(transactional_id, len(topic.partitions)))
        return state.leader if state is not None else -1
