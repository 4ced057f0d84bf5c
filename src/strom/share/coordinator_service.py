"""ShareCoordinatorService: the share coordinator as this broker runs it, for the state
partitions of `__share_group_state` it leads. Each operation is the ShareCoordinator's
decision and append (`coordinator/share/coordinator.py`), then the acks=all wait of what it
wrote, so that an answer is as durable as a produce. The share-state RPCs
(`apis/share_state.py`) and this broker's own Persister, when the coordinator is local, both
call it.

Also here: the RPCs' bodies as plain dicts, built from and read into (key, data) items and
per-key StateResults, the one codec both ends use.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any

from strom.coordinator import SHARE_GROUP_STATE_TOPIC
from strom.coordinator.share.coordinator import (
    UNINITIALIZED,
    Results,
    ShareCoordinator,
    StateResult,
    WriteState,
)
from strom.coordinator.share.share_partition import ShareState, StateBatch
from strom.coordinator.share.state_store import SharePartitionKey, ShareStateStore
from strom.protocol.errors import ErrorCode

INITIALIZE, READ, WRITE, DELETE, READ_SUMMARY = 83, 84, 85, 86, 87
_ZERO = uuid.UUID(int=0)


class ShareCoordinatorService:
    def __init__(self, broker: Any, store: ShareStateStore) -> None:
        self.broker = broker
        self.store = store
        self.coordinator = ShareCoordinator(store)

    async def call(self, api_key: int, items: dict[SharePartitionKey, Any]) -> Results:
        """One share-state operation (api key) on (key -> data) items, answered once durable."""
        c = self.coordinator
        if api_key == INITIALIZE:
            results, written = c.initialize((k, epoch, start) for k, (epoch, start) in items.items())
        elif api_key in (READ, READ_SUMMARY):
            results, written = c.read(items.items(), summary=api_key == READ_SUMMARY)
        elif api_key == WRITE:
            results, written = c.write(items.items())
        elif api_key == DELETE:
            results, written = c.delete(items)
        else:
            raise ValueError(f"not a share-state api: {api_key}")
        await self._await_written(written, results)
        return results

    async def _await_written(self, indexes: set[int], results: Results) -> None:
        if not indexes:
            return
        by_index: dict[int, list[SharePartitionKey]] = {}
        for key in results:
            by_index.setdefault(self.store.partition_for(key.coordinator_key), []).append(key)
        for index in indexes:
            keys = by_index.get(index, [])
            if not keys:
                continue
            error = await self.broker.coordinators.await_internal_replication(SHARE_GROUP_STATE_TOPIC,
                                                                              keys[0].coordinator_key)
            if error != ErrorCode.NONE:
                for key in keys:
                    results[key] = StateResult(error)


# --- the RPCs' bodies --------------------------------------------------------------------------
def _batches(batches: Iterable[StateBatch]) -> list[dict]:
    return [{"first_offset": b.first_offset, "last_offset": b.last_offset, "delivery_state": b.state,
             "delivery_count": b.delivery_count, "strom_not_before_ms": b.not_before} for b in batches]


def _state_batch(b: Any) -> StateBatch:
    """A StateBatch of a decoded request or response (Strom's tagged not-before: 0 when absent)."""
    return StateBatch(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count,
                      getattr(b, "strom_not_before_ms", 0) or 0)


_PARTITION_FIELDS: dict[int, Callable[[Any], dict]] = {
    INITIALIZE: lambda d: {"state_epoch": d[0], "start_offset": d[1]},
    READ: lambda d: {"leader_epoch": d},
    READ_SUMMARY: lambda d: {"leader_epoch": d},
    WRITE: lambda d: {"state_epoch": d.state_epoch, "leader_epoch": d.leader_epoch,
                      "start_offset": d.start_offset, "state_batches": _batches(d.batches)},
    DELETE: lambda d: {},
}


def request_fields(api_key: int, group_id: str, items: dict[SharePartitionKey, Any]) -> dict:
    """The request body for items of one group."""
    topics: dict[uuid.UUID, list[dict]] = {}
    fields = _PARTITION_FIELDS[api_key]
    for key, data in items.items():
        topics.setdefault(key.topic_id, []).append({"partition": key.partition, **fields(data)})
    return {"group_id": group_id, "topics": [{"topic_id": t, "partitions": ps} for t, ps in topics.items()]}


def request_items(api_key: int, request) -> dict[SharePartitionKey, Any]:
    """A decoded request's (key -> data) items."""
    items: dict[SharePartitionKey, Any] = {}
    for topic in request.topics:
        topic_id = topic.topic_id or _ZERO  # the codec reads the zero (null) id as None
        for p in topic.partitions:
            key = SharePartitionKey(request.group_id or "", topic_id, p.partition)
            if api_key == INITIALIZE:
                items[key] = (p.state_epoch, p.start_offset)
            elif api_key in (READ, READ_SUMMARY):
                items[key] = p.leader_epoch
            elif api_key == WRITE:
                items[key] = WriteState(p.state_epoch, p.leader_epoch, p.start_offset,
                                        [_state_batch(b) for b in p.state_batches])
            else:
                items[key] = None
    return items


def response_fields(api_key: int, results: Results) -> dict:
    topics: dict[uuid.UUID, list[dict]] = {}
    for key, r in results.items():
        entry: dict[str, Any] = {"partition": key.partition, "error_code": r.error,
                                 "error_message": r.message if r.error != ErrorCode.NONE else None}
        if api_key in (READ, READ_SUMMARY):
            state = r.state
            entry["state_epoch"] = 0 if state is None else state.state_epoch
            entry["start_offset"] = UNINITIALIZED if state is None else state.start_offset
            if api_key == READ:
                entry["state_batches"] = [] if state is None else _batches(state.batches)
            else:
                entry["leader_epoch"] = -1 if state is None else state.leader_epoch
                entry["delivery_complete_count"] = r.delivery_complete_count  # v1 (KIP-1226)
        topics.setdefault(key.topic_id, []).append(entry)
    return {"results": [{"topic_id": t, "partitions": ps} for t, ps in topics.items()]}


def response_results(api_key: int, group_id: str, response) -> Results:
    results: Results = {}
    for topic in response.results:
        for p in topic.partitions:
            key = SharePartitionKey(group_id, topic.topic_id or _ZERO, p.partition)
            state = None
            if api_key in (READ, READ_SUMMARY) and p.error_code == ErrorCode.NONE and p.start_offset >= 0:
                batches = [] if api_key == READ_SUMMARY else [_state_batch(b) for b in p.state_batches]
                state = ShareState(p.start_offset, batches, p.state_epoch,
                                   p.leader_epoch if api_key == READ_SUMMARY else -1)
            try:
                error = ErrorCode(p.error_code)
            except ValueError:  # a code this broker does not know
                error = ErrorCode.UNKNOWN_SERVER_ERROR
            count = getattr(p, "delivery_complete_count", -1) if state is not None else -1
            results[key] = StateResult(error, state, p.error_message, count)
    return results
