"""Persister: how a share partition's leader (and the group coordinator's admin side) reads
and writes share-partition state at its ShareCoordinator, as Kafka's DefaultStatePersister and
PersisterStateManager do.

The coordinator of a key ("group:topicId:partition") is the leader of the partition of
`__share_group_state` that owns it, the broker FindCoordinator with key type SHARE names; this
broker reads that from its metadata, which is what FindCoordinator answers from. A call's
items go to their coordinators at once, one request per coordinator (and group, which the
RPCs carry once): when the coordinator is this broker the ShareCoordinatorService is called in
process, else the share-state RPC is sent over a pooled inter-broker connection. Keys answered
NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE or COORDINATOR_LOAD_IN_PROGRESS (or whose
coordinator could not be reached) are looked up again and retried with a growing backoff
until the call's deadline. Bounds: calls in flight per coordinator (the pool), and the bytes
of requests waiting or in flight.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any

from strom.client.inter_broker import ConnectionPool
from strom.coordinator import SHARE_GROUP_STATE_TOPIC, partition_for
from strom.coordinator.share.coordinator import Results, StateResult, WriteState
from strom.coordinator.share.state_store import SharePartitionKey
from strom.protocol.errors import ErrorCode, KafkaError
from strom.share.coordinator_service import (
    DELETE,
    INITIALIZE,
    READ,
    READ_SUMMARY,
    WRITE,
    ShareCoordinatorService,
    request_fields,
    response_results,
)

log = logging.getLogger(__name__)

RETRIABLE = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                       ErrorCode.COORDINATOR_LOAD_IN_PROGRESS})
_CALL_DEADLINE_S = 15.0  # a failed-over coordinator is found again well within this
_BACKOFF_S, _MAX_BACKOFF_S = 0.05, 1.0
_RPC_TIMEOUT_S = 10.0
MAX_IN_FLIGHT = 4  # calls per coordinator
MAX_PENDING_BYTES = 32 << 20
_ITEM_BYTES, _BATCH_BYTES = 64, 24  # what an item and a state batch add to a request, about
# The version each RPC is sent at (else 0): the summary at v1 for its delivery-complete count
# (KIP-1226). Writes stay at v0: the coordinator derives the count from the runs it stores.
_VERSIONS = {READ_SUMMARY: 1}


class Persister:
    def __init__(self, broker: Any, service: ShareCoordinatorService) -> None:
        self.broker = broker
        self.service = service
        self.pool = ConnectionPool(broker, MAX_IN_FLIGHT)
        self.pending_bytes = 0
        self._room: asyncio.Condition | None = None

    async def initialize(self, items: dict[SharePartitionKey, tuple[int, int]]) -> Results:
        """(state epoch, start offset) per key."""
        return await self._call(INITIALIZE, items)

    async def read(self, items: dict[SharePartitionKey, int]) -> Results:
        """The leader epoch per key; a result without state: the share partition has none."""
        return await self._call(READ, items)

    async def write(self, items: dict[SharePartitionKey, WriteState]) -> Results:
        return await self._call(WRITE, items)

    async def delete(self, keys: list[SharePartitionKey]) -> Results:
        return await self._call(DELETE, dict.fromkeys(keys))

    async def summary(self, keys: list[SharePartitionKey]) -> Results:
        """Start offset and epochs (no batches) per key; no state: not initialized."""
        return await self._call(READ_SUMMARY, dict.fromkeys(keys, -1))

    def close(self) -> None:
        self.pool.close()

    # --- one call ------------------------------------------------------------------------------
    async def _call(self, api_key: int, items: dict[SharePartitionKey, Any]) -> Results:
        if not items:
            return {}
        deadline = time.monotonic() + _CALL_DEADLINE_S
        size = sum(_ITEM_BYTES + _BATCH_BYTES * len(getattr(d, "batches", ())) for d in items.values())
        if not await self._reserve(size, deadline):
            return {k: StateResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, message="too much share state pending")
                    for k in items}
        try:
            return await self._call_until(api_key, items, deadline)
        finally:
            self._release(size)

    async def _call_until(self, api_key: int, items: dict[SharePartitionKey, Any], deadline: float) -> Results:
        results: Results = {}
        pending = items
        backoff = _BACKOFF_S
        while True:
            calls: list[Awaitable[Results]] = []
            for coordinator, keys in (await self._coordinators(list(pending), results)).items():
                by_group: dict[str, dict[SharePartitionKey, Any]] = {}
                for key in keys:
                    by_group.setdefault(key.group_id, {})[key] = pending[key]
                calls += [self._send(api_key, coordinator, group, its) for group, its in by_group.items()]
            for answered in await asyncio.gather(*calls):
                results.update(answered)
            pending = {k: d for k, d in pending.items()
                       if results.get(k, StateResult(ErrorCode.COORDINATOR_NOT_AVAILABLE)).error in RETRIABLE}
            if not pending or time.monotonic() + backoff > deadline or self.broker.stopping:
                return results
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF_S)

    async def _coordinators(self, keys: list[SharePartitionKey], results: Results) -> dict[int, list[SharePartitionKey]]:
        """The current share coordinator of each key (FindCoordinator's answer, from this
        broker's metadata); a key without one is answered COORDINATOR_NOT_AVAILABLE."""
        try:
            topic = await self.broker.auto_topics.ensure_internal_topic(SHARE_GROUP_STATE_TOPIC)
        except KafkaError as e:
            for key in keys:
                results[key] = StateResult(e.code if e.code in RETRIABLE else ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                           message=str(e))
            return {}
        n = len(topic.partitions)
        out: dict[int, list[SharePartitionKey]] = {}
        for key in keys:
            state = self.broker.metadata_cache.partition(SHARE_GROUP_STATE_TOPIC, partition_for(key.coordinator_key, n))
            leader = state.leader if state is not None else -1
            if leader < 0:
                results[key] = StateResult(ErrorCode.COORDINATOR_NOT_AVAILABLE)
            else:
                out.setdefault(leader, []).append(key)
        return out

    async def _send(self, api_key: int, coordinator: int, group_id: str,
                    items: dict[SharePartitionKey, Any]) -> Results:
        if coordinator == self.broker.broker_id:
            return await self.service.call(api_key, items)
        try:
            body = await self.pool.call(coordinator, api_key, _VERSIONS.get(api_key, 0),
                                        request_fields(api_key, group_id, items), _RPC_TIMEOUT_S)
        except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError, LookupError) as e:
            log.info("share coordinator %d not reached: %s", coordinator, e or type(e).__name__)
            return {k: StateResult(ErrorCode.COORDINATOR_NOT_AVAILABLE) for k in items}
        results = response_results(api_key, group_id, body)
        for key in items.keys() - results.keys():
            results[key] = StateResult(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return {k: results[k] for k in items}

    # --- the pending-bytes bound ---------------------------------------------------------------
    async def _reserve(self, size: int, deadline: float) -> bool:
        if self.pending_bytes + size <= MAX_PENDING_BYTES or self.pending_bytes == 0:
            self.pending_bytes += size
            return True
        if self._room is None:
            self._room = asyncio.Condition()
        async with self._room:
            try:
                await asyncio.wait_for(self._room.wait_for(
                    lambda: self.pending_bytes + size <= MAX_PENDING_BYTES or self.pending_bytes == 0),
                    max(deadline - time.monotonic(), 0))
            except TimeoutError:
                return False
            self.pending_bytes += size
            return True

    def _release(self, size: int) -> None:
        self.pending_bytes -= size
        if self._room is not None:  # calls wait for room: wake them to look again
            asyncio.get_running_loop().create_task(_notify(self._room))


async def _notify(room: asyncio.Condition) -> None:
    async with room:
        room.notify_all()
