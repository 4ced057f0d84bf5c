"""The `_schemas` topic over the broker's own inter-broker connections, in every mode (the
embedded broker, ZooKeeper and KRaft clusters), as the remote log metadata manager reaches
`__remote_log_metadata`: a tail task long-polls consumer Fetches of partition 0 from its leader
and hands each record to the store; writes are Produce requests with acks=all to the leader.

The topic is made on the first write (one partition, cleanup.policy=compact, replication factor
min(the configured one, live brokers)), not at start-up, when a cluster's other brokers may not
have registered yet.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from strom.client.inter_broker import ConnectionPool
from strom.client.topic_io import (
    FETCH_MAX_WAIT_MS,
    PartitionTail,
    create_or_await,
    produce_acks_all,
)
from strom.protocol.errors import ErrorCode
from strom.protocol.records import CorruptRecordError, build_batch, iter_records

log = logging.getLogger(__name__)

FETCH_MAX_BYTES = 4 << 20
_CREATE_WAIT_S = 30.0

Apply = Callable[[int, bytes | None, bytes | None], None]


class TopicError(Exception):
    """The topic could not be written or read in time."""


class SchemasTopic(PartitionTail):
    leaderless_wait_s = 0.5

    def __init__(self, broker: Any, name: str, replication_factor: int, apply: Apply,
                 reset: Callable[[], None]) -> None:
        super().__init__(broker, name, 0, f"broker-{broker.broker_id}-schema-registry", FETCH_MAX_BYTES, log)
        self.label = name
        self.name = name
        self.replication_factor = replication_factor
        self._apply = apply
        self._reset = reset
        self.next_offset = 0
        self.caught_up_once = False  # read to the end the first answer named (or no topic yet)
        self._pool = ConnectionPool(broker, 2)
        self._creation: asyncio.Task | None = None
        self._closed = False

    # --- where it is -------------------------------------------------------------------------
    def leader(self) -> int:
        """The broker leading partition 0 (-1: no topic yet, or no leader now)."""
        state = self.broker.metadata_cache.partition(self.name, 0)
        return -1 if state is None else state.leader

    @property
    def exists(self) -> bool:
        return self.name in self.broker.metadata_cache.topics

    @property
    def ready(self) -> bool:
        return self.caught_up_once or not self.exists

    # --- reading -----------------------------------------------------------------------------
    async def wait(self, until: Callable[[], bool], timeout_s: float) -> bool:  # type: ignore[override]
        deadline = asyncio.get_running_loop().time() + timeout_s
        return await super().wait(until, deadline, lambda: self._closed)

    def reading(self) -> bool:
        return not self._closed

    def leaderless(self) -> None:
        self.moved()  # a reader waiting on `ready` looks again

    async def read_once(self, leader: int, leader_epoch: int) -> bool:
        position = self.next_offset
        error, answer = await self.fetch(leader, leader_epoch, position,
                                         FETCH_MAX_WAIT_MS if self.caught_up_once else 0)
        if answer is None:
            return False
        if error == ErrorCode.OFFSET_OUT_OF_RANGE:
            if position < answer.log_start_offset:
                self.next_offset = answer.log_start_offset
            else:  # past the log's end: the topic was made again; what was read no longer stands
                log.warning("%s: offset %d is past the log's end %d; reading it again", self.name, position,
                            answer.high_watermark)
                self.next_offset = 0
                self._reset()
            return True
        self._take(position, answer.records or b"")
        if not self.caught_up_once and self.next_offset >= answer.high_watermark:
            self.caught_up_once = True
        self.moved()
        return True

    def _take(self, position: int, data: bytes) -> None:
        for pos, header in self.batches(data, position) or ():
            if header.last_offset < self.next_offset:
                continue
            if not header.is_control:
                try:
                    for record in iter_records(data, pos):
                        if record.offset >= self.next_offset:
                            self._apply(record.offset, record.key, record.value)
                except CorruptRecordError as e:
                    log.warning("%s: skipped the batch at offset %d: %s", self.name, header.base_offset, e)
            self.next_offset = header.last_offset + 1

    # --- writing -----------------------------------------------------------------------------
    async def produce(self, pairs: list[tuple[bytes, bytes | None]], timeout_s: float) -> int:
        """Write the records in one batch, acks=all, to partition 0's leader: the offset of the
        last. Raises TopicError when that does not happen within `timeout_s`."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        await self.ensure_topic(deadline)
        batch = build_batch(pairs, timestamp=int(time.time() * 1000))
        base = await produce_acks_all(self.broker, self._pool, self.name, 0, batch, deadline,
                                      lambda: self._closed, TopicError, log, self.name)
        return base + len(pairs) - 1

    async def ensure_topic(self, deadline: float) -> None:
        if self.exists:
            return
        if self._creation is None or self._creation.done():
            self._creation = asyncio.get_running_loop().create_task(self._create(), name=f"create {self.name}")
        remaining = deadline - asyncio.get_running_loop().time()
        done, _ = await asyncio.wait([self._creation], timeout=max(remaining, 0))
        if not done:
            raise TopicError(f"{self.name} is being created")
        if self._creation.exception() is not None:
            raise TopicError(f"cannot create {self.name}: {self._creation.exception()}")

    async def _create(self) -> None:
        factor = max(1, min(self.replication_factor, len(self.broker.metadata_cache.live_brokers)))
        configs = {"cleanup.policy": "compact", "min.insync.replicas": str(min(2, factor))}
        if await create_or_await(self.broker, self.name, 1, factor, configs, _CREATE_WAIT_S):
            log.info("created the schema registry's topic %s (replication factor %d)", self.name, factor)

    async def close(self) -> None:
        self._closed = True
        tasks = [t for t in (self.task, self._creation) if t is not None]
        for task in tasks:
            task.cancel()
        self.moved()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.close_conn()
        self._pool.close()
