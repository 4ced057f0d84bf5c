"""ISR changes go to the controller (Kafka's AlterPartitionManager, KIP-497).

A leader never writes its ISR itself: it asks the controller with AlterPartition, naming the
leader epoch and partition epoch it knows, and adopts the ISR the controller answers with.
A request the controller refuses (a newer epoch exists) is dropped: the LeaderAndIsr that
made it stale is on its way. As Kafka's manager does, every change waiting when a request goes
out travels in it (one request in flight, to the current controller), so a broker rejoining
the ISR of 10,000 partitions asks in a few requests, not 10,000; the controller's own broker
hands them over in-process.
"""

from __future__ import annotations

import asyncio
import logging

from strom.client import AsyncConnection
from strom.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

ALTER_PARTITION, ALTER_PARTITION_VERSION = 56, 1
MAX_PER_REQUEST = 5000  # partitions in one AlterPartition


class AlterPartitionManager:
    def __init__(self, broker) -> None:
        self.broker = broker
        self.conn: AsyncConnection | None = None
        self.conn_to = -1
        self._pending: dict[tuple[str, int], tuple[object, list[int]]] = {}
        self._sender: asyncio.Task | None = None

    def submit(self, partition, new_isr: list[int]) -> None:
        self._pending[(partition.topic, partition.index)] = (partition, list(new_isr))
        if self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(self._run(), name="alter-partition")

    async def _run(self) -> None:
        try:
            while self._pending:
                keys = list(self._pending)[:MAX_PER_REQUEST]
                await self._send([self._pending.pop(k) for k in keys])
        finally:
            self._sender = None

    async def _send(self, changes: list[tuple[object, list[int]]]) -> None:
        topics: dict[str, list[dict]] = {}
        for partition, new_isr in changes:
            topics.setdefault(partition.topic, []).append({
                "partition_index": partition.index, "leader_epoch": partition.leader_epoch,
                "new_isr": new_isr, "leader_recovery_state": 0, "partition_epoch": partition.partition_epoch})
        fields = {"broker_id": self.broker.broker_id, "broker_epoch": self.broker.broker_epoch,
                  "topics": [{"topic_name": t, "partitions": ps} for t, ps in topics.items()]}
        try:
            response = await self._call(fields)
        except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError, LookupError) as e:
            log.warning("AlterPartition for %d partitions not sent: %s", len(changes), e)
            for partition, _ in changes:  # asked again by the next fetch or expiration check
                self.broker.replica_manager.isr_change_dropped(partition)
            return
        error = ErrorCode(response.error_code)
        answers = {(t.topic_name, p.partition_index): p for t in response.topics for p in t.partitions} \
            if error == ErrorCode.NONE else {}
        accepted = []
        for partition, _ in changes:
            answer = answers.get((partition.topic, partition.index))
            code = error if answer is None or error != ErrorCode.NONE else ErrorCode(answer.error_code)
            if answer is None or code != ErrorCode.NONE:
                log.info("AlterPartition for %s-%d refused: %s", partition.topic, partition.index, code.name)
                self.broker.replica_manager.isr_change_dropped(partition)
                continue
            if answer.leader_epoch != partition.leader_epoch or not partition.is_leader:
                continue  # leadership moved meanwhile; LeaderAndIsr says the rest
            self.broker.replica_manager.isr_changed(partition, list(answer.isr), answer.partition_epoch)
            accepted.append(partition)
        if len(accepted) == 1:
            log.info("%s-%d: ISR is now %s", accepted[0].topic, accepted[0].index, accepted[0].isr)
        elif accepted:
            log.info("ISR changes of %d partitions accepted by the controller", len(accepted))

    async def _call(self, fields: dict):
        channel = self.broker.controller_channel
        if channel is not None:  # a KRaft broker: the quorum's active controller
            return await channel.call(ALTER_PARTITION, ALTER_PARTITION_VERSION, fields, timeout_s=10)
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
