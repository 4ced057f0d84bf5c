"""ISR changes go to the controller (Kafka's AlterPartitionManager, KIP-497).

A leader never writes its ISR itself: it asks the controller with AlterPartition, naming the
leader epoch and partition epoch it knows, and adopts the ISR the controller answers with.
A request the controller refuses (a newer epoch exists) is dropped: the LeaderAndIsr that
made it stale is on its way. Requests are sent one at a time over one connection to the
current controller; the controller's own broker hands them over in-process.
"""

from __future__ import annotations

import asyncio
import logging

from strom.client import AsyncConnection
from strom.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

ALTER_PARTITION, ALTER_PARTITION_VERSION = 56, 1


class AlterPartitionManager:
    def __init__(self, broker) -> None:
        self.broker = broker
        self.lock = asyncio.Lock()
        self.conn: AsyncConnection | None = None
        self.conn_to = -1

    def submit(self, partition, new_isr: list[int]) -> None:
        asyncio.get_running_loop().create_task(self._send(partition, new_isr))

    async def _send(self, partition, new_isr: list[int]) -> None:
        fields = {"broker_id": self.broker.broker_id, "broker_epoch": self.broker.broker_epoch,
                  "topics": [{"topic_name": partition.topic, "partitions": [{
                      "partition_index": partition.index, "leader_epoch": partition.leader_epoch,
                      "new_isr": list(new_isr), "leader_recovery_state": 0,
                      "partition_epoch": partition.partition_epoch}]}]}
        try:
            async with self.lock:
                response = await self._call(fields)
        except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError, LookupError) as e:
            log.warning("AlterPartition for %s-%d not sent: %s", partition.topic, partition.index, e)
            partition.pending_isr = None  # asked again by the next fetch or expiration check
            return
        error = ErrorCode(response.error_code)
        answer = response.topics[0].partitions[0] if error == ErrorCode.NONE else None
        if answer is not None:
            error = ErrorCode(answer.error_code)
        if error != ErrorCode.NONE or answer is None:
            log.info("AlterPartition for %s-%d refused: %s", partition.topic, partition.index, error.name)
            partition.pending_isr = None
            return
        if answer.leader_epoch != partition.leader_epoch or not partition.is_leader:
            return  # leadership moved meanwhile; LeaderAndIsr says the rest
        log.info("%s-%d: ISR is now %s", partition.topic, partition.index, list(answer.isr))
        self.broker.replica_manager.isr_changed(partition, list(answer.isr), answer.partition_epoch)

    async def _call(self, fields: dict):
        controller = self.broker.metadata_cache.controller_id
        if controller == self.broker.broker_id:
            return await self.broker.deliver_local(ALTER_PARTITION, ALTER_PARTITION_VERSION, fields)
        if self.conn is None or self.conn_to != controller:
            self._close()
            host, port = self.broker.broker_endpoint(controller)
            self.conn = await AsyncConnection.open(host, port, f"broker-{self.broker.broker_id}-alter-partition",
                                                   security=self.broker.inter_broker_security)
            self.conn_to = controller
        try:
            return await self.conn.call(ALTER_PARTITION, ALTER_PARTITION_VERSION, fields)
        except BaseException:
            self._close()
            raise

    def _close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def shutdown(self) -> None:
        self._close()
