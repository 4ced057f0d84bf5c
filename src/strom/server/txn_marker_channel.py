"""TransactionMarkerChannelManager: how the transaction coordinator's markers reach the
partitions of a transaction. Markers for partitions this broker leads are written at once;
the others go to their leaders as WriteTxnMarkers and stay pending (retried by the
coordinator) until the answer arrives, which finishes the transaction. WriteTxnMarkers from
another broker's coordinator is written through the same path."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from strom.coordinator import GROUP_METADATA_TOPIC
from strom.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

WRITE_TXN_MARKERS = 27
# A marker on its way to another broker: neither written nor given up, so retried.
_MARKER_PENDING = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS


class TransactionMarkerChannelManager:
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self._results: dict[tuple, ErrorCode] = {}  # answers of other leaders, until collected
        self._in_flight: set[tuple] = set()  # (leader, transaction) with a request on its way

    def write(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
              committed: bool, partitions) -> dict:
        """WriteTxnMarkers for partitions this broker leads (the coordinator's marker channel,
        and the API): write each marker, then let the group coordinator apply or drop offsets
        the transaction committed to a `__consumer_offsets` partition."""
        broker = self.broker
        errors = broker.replica_manager.write_txn_markers(producer_id, producer_epoch, coordinator_epoch,
                                                          committed, partitions)
        for (topic, index), error in errors.items():
            if topic == GROUP_METADATA_TOPIC and error == ErrorCode.NONE:
                broker.group_coordinator.complete_txn(producer_id, index, committed)
        return errors

    def send(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
             committed: bool, partitions) -> dict:
        """The transaction coordinator's marker channel: each partition's marker written here,
        sent to its leader, or answered from that leader's reply once it came."""
        broker = self.broker
        by_leader: dict[int, list] = {}
        for tp in partitions:
            state = broker.metadata_cache.partition(*tp)
            # A partition gone from the cluster is answered here: UNKNOWN_TOPIC_OR_PARTITION.
            by_leader.setdefault(state.leader if state is not None else broker.broker_id, []).append(tp)
        errors = self.write(producer_id, producer_epoch, coordinator_epoch, committed,
                            by_leader.pop(broker.broker_id, []))
        key = (producer_id, producer_epoch, committed)
        for leader, tps in by_leader.items():
            waiting = []
            for tp in tps:
                done = self._results.pop((key, tp), None)
                if done is not None:
                    errors[tp] = done
                else:
                    errors[tp] = ErrorCode.NOT_LEADER_OR_FOLLOWER if leader < 0 else _MARKER_PENDING
                    waiting.append(tp)
            if leader >= 0 and waiting and (leader, key) not in self._in_flight:
                self._in_flight.add((leader, key))
                asyncio.get_running_loop().create_task(self._send_remote(leader, key, coordinator_epoch, waiting))
        return errors

    async def _send_remote(self, leader: int, key: tuple, coordinator_epoch: int, tps) -> None:
        producer_id, producer_epoch, committed = key
        topics: dict[str, list[int]] = {}
        for topic, index in tps:
            topics.setdefault(topic, []).append(index)
        try:
            response = await self.broker.connections.call(leader, WRITE_TXN_MARKERS, 1, {"markers": [{
                "producer_id": producer_id, "producer_epoch": producer_epoch,
                "transaction_result": committed, "coordinator_epoch": coordinator_epoch,
                "topics": [{"name": t, "partition_indexes": ps} for t, ps in topics.items()]}]})
            for marker in response.markers:
                for t in marker.topics:
                    for p in t.partitions:
                        self._results[(key, (t.name, p.partition_index))] = ErrorCode(p.error_code)
        except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError, LookupError) as e:
            log.warning("transaction markers to broker %d not sent: %s", leader, e or type(e).__name__)
            await asyncio.sleep(0.5)
        finally:
            self._in_flight.discard((leader, key))
        if self.broker.txn_coordinator is not None:
            self.broker.txn_coordinator.retry_markers(producer_id)
