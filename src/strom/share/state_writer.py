"""StateWriter: how a leader's share partitions reach their share coordinators, batched and
pipelined (Kafka's SharePartition writes through its Persister the same way: on
acknowledgement, release and lock expiry, never on acquisition).

A caller that changed share partitions asks for their next write (`persist`, awaited before a
response) or just schedules it (`persist_soon`). Every share partition waited on and not being
written now goes into one write (one WriteShareGroupState per coordinator and group, through
the Persister); up to MAX_IN_FLIGHT writes run at once. A share partition is in at most one
write at a time and its snapshot is taken as that write starts, so an older state never lands
after a newer one; a change made while it is written goes out with the next one. A waiter
whose changes were already in the write that just ended hears that write's answer.

Dead letters: a snapshot carries the share partition's newly pending dead letters; only once
its write succeeded are they handed on (`dead_letters`) to be written to the group's
dead-letter topic, so a dead letter is never in the topic before the state that says it is
pending is durable.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping

from strom.coordinator.share.coordinator import Results, WriteState
from strom.coordinator.share.share_partition import SharePartition
from strom.coordinator.share.state_store import SharePartitionKey
from strom.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 4  # writes at once, each batching every share partition waited on
# What a write answered when the share partition's state moved on without this broker: it is
# dropped (and loaded again on next use).
FENCED = frozenset({ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.FENCED_STATE_EPOCH,
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION})
Errors = dict[SharePartitionKey, ErrorCode]
_Batch = dict[SharePartitionKey, tuple[SharePartition, WriteState, list[asyncio.Future], frozenset[int]]]


def _resolve(futures: list[asyncio.Future], error: ErrorCode) -> None:
    for future in futures:
        if not future.done():
            future.set_result(error)


class StateWriter:
    def __init__(self, write: Callable[[dict[SharePartitionKey, WriteState]], Awaitable[Results]],
                 partitions: Mapping[SharePartitionKey, SharePartition],
                 fenced: Callable[[SharePartitionKey, SharePartition], None],
                 stopping: Callable[[], bool] = lambda: False,
                 dead_letters: Callable[[SharePartitionKey, SharePartition], None] = lambda key, sp: None) -> None:
        self.write = write  # the Persister's WriteShareGroupState
        self.partitions = partitions  # the share partitions this broker holds now
        self.fenced = fenced  # drops a fenced share partition
        self.stopping = stopping
        self.dead_letters = dead_letters  # a write made pending dead letters durable: write them
        self._waiters: dict[SharePartitionKey, list[asyncio.Future]] = {}
        self._writing: set[SharePartitionKey] = set()
        self._in_flight = 0
        self._tasks: set[asyncio.Task] = set()
        self._last_errors: Errors = {}
        self._kick_scheduled = False

    def persist(self, keys: Iterable[SharePartitionKey]) -> Awaitable[Errors]:
        """Each key's error once what its share partition holds now is with its share
        coordinator (acks=all). The wait starts at the call, not when awaited. A share
        partition dropped before its write answers NOT_LEADER_OR_FOLLOWER."""
        loop = asyncio.get_running_loop()
        waiting: dict[SharePartitionKey, asyncio.Future] = {}
        for key in set(keys):
            if key in self.partitions:
                waiting[key] = future = loop.create_future()
                self._waiters.setdefault(key, []).append(future)
        if waiting:
            self._kick_soon()

        async def written() -> Errors:
            return {key: await future for key, future in waiting.items()}

        return written()

    def persist_soon(self, keys: Iterable[SharePartitionKey]) -> None:
        """Write these share partitions' changes; nobody waits."""
        for key in keys:
            if key in self.partitions:
                self._waiters.setdefault(key, [])
        self._kick_soon()

    def forget(self, key: SharePartitionKey) -> None:
        """The share partition of `key` was dropped here: its waiters' changes went with it."""
        self._last_errors.pop(key, None)
        _resolve(self._waiters.pop(key, []), ErrorCode.NOT_LEADER_OR_FOLLOWER)

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for futures in self._waiters.values():
            _resolve(futures, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        self._waiters.clear()

    def _kick_soon(self) -> None:
        """Start the next write once the loop has run what is ready: the requests handled in
        one turn of the loop share a write."""
        if not self._kick_scheduled:
            self._kick_scheduled = True
            asyncio.get_running_loop().call_soon(self._kick)

    def _kick(self) -> None:
        self._kick_scheduled = False
        while self._in_flight < MAX_IN_FLIGHT:
            batch: _Batch = {}
            for key in [k for k in self._waiters if k not in self._writing]:
                futures = self._waiters.pop(key)
                sp = self.partitions.get(key)
                if sp is None:
                    _resolve(futures, ErrorCode.NOT_LEADER_OR_FOLLOWER)
                elif not sp.dirty:  # what they wait for went out with the write that just ended
                    _resolve(futures, self._last_errors.get(key, ErrorCode.NONE))
                else:
                    state = sp.state()
                    batch[key] = (sp, WriteState(state.state_epoch, sp.leader_epoch, state.start_offset,
                                                 state.batches), futures, sp.snapshot_dead_letters())
                    sp.dirty = False
            if not batch:
                return
            self._in_flight += 1
            self._writing.update(batch)
            task = asyncio.get_running_loop().create_task(self._flush(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _flush(self, batch: _Batch) -> None:
        try:
            try:
                results = await self.write({k: w for k, (_, w, _, _) in batch.items()})
                errors = {k: results[k].error for k in batch}
            except Exception:  # noqa: BLE001 - every waiter must hear back
                log.exception("writing share state failed")
                errors = dict.fromkeys(batch, ErrorCode.UNKNOWN_SERVER_ERROR)
            for key, (sp, _, futures, dead_letters) in batch.items():
                error = errors[key]
                if dead_letters:
                    sp.dead_letters_persisted(dead_letters, error == ErrorCode.NONE)
                    if error == ErrorCode.NONE and self.partitions.get(key) is sp:
                        self.dead_letters(key, sp)
                if error in FENCED:
                    log.info("share partition %s was fenced (%s): loading it again", key.coordinator_key, error.name)
                    self.fenced(key, sp)
                elif error != ErrorCode.NONE:
                    sp.dirty = True  # written again with the next change
                if self.partitions.get(key) is sp:
                    self._last_errors[key] = error
                _resolve(futures, error)
        finally:
            self._writing.difference_update(batch)
            self._in_flight -= 1
            if not self.stopping():
                self._kick()
