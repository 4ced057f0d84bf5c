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

from strom.client import AsyncConnection
from strom.client.inter_broker import ConnectionPool
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.records import (
    HEADER_SIZE,
    CorruptRecordError,
    build_batch,
    iter_records,
    read_header,
    scan_valid_prefix,
)

log = logging.getLogger(__name__)

PRODUCE, PRODUCE_VERSION = 0, 9
FETCH, FETCH_VERSION = 1, 12
FETCH_MAX_WAIT_MS = 500
FETCH_MAX_BYTES = 4 << 20
_CONNECT_TIMEOUT_S = 10.0
_BACKOFF_S, _MAX_BACKOFF_S = 0.05, 1.0
_CREATE_WAIT_S = 30.0
_NETWORK_ERRORS = (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError, LookupError)
_RETRIABLE = frozenset({
    ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, ErrorCode.REQUEST_TIMED_OUT,
    ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.REPLICA_NOT_AVAILABLE})

Apply = Callable[[int, bytes | None, bytes | None], None]


class TopicError(Exception):
    """The topic could not be written or read in time."""


def _code(number: int) -> ErrorCode:
    try:
        return ErrorCode(number)
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR


class SchemasTopic:
    def __init__(self, broker: Any, name: str, replication_factor: int, apply: Apply,
                 reset: Callable[[], None]) -> None:
        self.broker = broker
        self.name = name
        self.replication_factor = replication_factor
        self._apply = apply
        self._reset = reset
        self.next_offset = 0
        self.caught_up_once = False  # read to the end the first answer named (or no topic yet)
        self._progress = asyncio.Event()
        self._conn: AsyncConnection | None = None
        self._conn_leader = -1
        self._pool = ConnectionPool(broker, 2)
        self._task: asyncio.Task | None = None
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
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"{self.name} tail")

    def _moved(self) -> None:
        event, self._progress = self._progress, asyncio.Event()
        event.set()

    async def wait(self, until: Callable[[], bool], timeout_s: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not until():
            remaining = deadline - loop.time()
            if remaining <= 0 or self._closed:
                return until()
            try:
                async with asyncio.timeout(remaining):
                    await self._progress.wait()
            except TimeoutError:
                return until()
        return True

    async def _run(self) -> None:
        backoff = _BACKOFF_S
        cache = self.broker.metadata_cache
        try:
            while not self._closed and not self.broker.stopping:
                state = cache.partition(self.name, 0)
                if state is None or state.leader < 0:
                    self._moved()  # a reader waiting on `ready` looks again
                    await cache.wait_for(lambda: (s := cache.partition(self.name, 0)) is not None
                                         and s.leader >= 0, max(backoff, 0.5))
                    backoff = min(backoff * 2, _MAX_BACKOFF_S)
                    continue
                try:
                    moved = await self._fetch(state.leader, state.leader_epoch)
                except _NETWORK_ERRORS as e:
                    log.info("%s: fetch from broker %d failed: %s", self.name, state.leader, e or type(e).__name__)
                    moved = False
                    self._close_conn()
                except Exception:  # the reader must not stop: every read of the registry depends on it
                    log.exception("%s: reading failed; trying again", self.name)
                    moved = False
                    self._close_conn()
                if moved:
                    backoff = _BACKOFF_S
                else:
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, _MAX_BACKOFF_S)
        finally:
            self._close_conn()

    def _close_conn(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn, self._conn_leader = None, -1

    async def _fetch(self, leader: int, leader_epoch: int) -> bool:
        if self._conn is None or self._conn_leader != leader:
            self._close_conn()
            host, port = self.broker.broker_endpoint(leader)
            self._conn = await AsyncConnection.open(host, port, f"broker-{self.broker.broker_id}-schema-registry",
                                                    _CONNECT_TIMEOUT_S, security=self.broker.inter_broker_security)
            self._conn_leader = leader
        position = self.next_offset
        body = await self._conn.call(FETCH, FETCH_VERSION, {
            "replica_id": -1, "max_wait_ms": FETCH_MAX_WAIT_MS if self.caught_up_once else 0, "min_bytes": 1,
            "max_bytes": FETCH_MAX_BYTES, "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": self.name, "partitions": [{
                "partition": 0, "current_leader_epoch": leader_epoch, "fetch_offset": position,
                "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": FETCH_MAX_BYTES}]}],
            "forgotten_topics_data": [], "rack_id": ""}, FETCH_MAX_WAIT_MS / 1000 + 30.0)
        error = _code(body.error_code)
        answer = next((p for t in body.responses if t.topic == self.name for p in t.partitions
                       if p.partition_index == 0), None)
        if error == ErrorCode.NONE and answer is not None:
            error = _code(answer.error_code)
        if error == ErrorCode.NONE and answer is not None:
            self._take(position, answer.records or b"")
            if not self.caught_up_once and self.next_offset >= answer.high_watermark:
                self.caught_up_once = True
            self._moved()
            return True
        if error == ErrorCode.OFFSET_OUT_OF_RANGE and answer is not None:
            if position < answer.log_start_offset:
                self.next_offset = answer.log_start_offset
            else:  # past the log's end: the topic was made again; what was read no longer stands
                log.warning("%s: offset %d is past the log's end %d; reading it again", self.name, position,
                            answer.high_watermark)
                self.next_offset = 0
                self._reset()
            return True
        if error not in _RETRIABLE:
            log.warning("%s: fetch from broker %d answered %s", self.name, leader, error.name)
        return False

    def _take(self, position: int, data: bytes) -> None:
        batches, _ = scan_valid_prefix(data)
        if not batches and len(data) >= HEADER_SIZE and read_header(data).size <= len(data):
            log.warning("%s: a corrupt batch at offset %d; fetching it again", self.name, position)
            return
        for pos, header in batches:
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
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        await self.ensure_topic(deadline)
        batch = build_batch(pairs, timestamp=int(time.time() * 1000))
        cache = self.broker.metadata_cache
        backoff, why = _BACKOFF_S, "no leader"
        while not self._closed and not self.broker.stopping:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            leader = self.leader()
            if leader < 0:
                why = "no leader"
                await cache.wait_for(lambda: self.leader() >= 0, min(backoff, remaining))
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
                continue
            try:
                body = await self._pool.call(leader, PRODUCE, PRODUCE_VERSION, {
                    "transactional_id": None, "acks": -1, "timeout_ms": int(min(remaining, 30.0) * 1000),
                    "topic_data": [{"name": self.name, "partition_data": [{"index": 0, "records": batch}]}]},
                    remaining + 1.0)
            except _NETWORK_ERRORS as e:
                why = f"broker {leader} not reached: {e or type(e).__name__}"
            else:
                answer = next((p for t in body.responses if t.name == self.name for p in t.partition_responses
                               if p.index == 0), None)
                error = _code(answer.error_code) if answer is not None else ErrorCode.UNKNOWN_SERVER_ERROR
                if error == ErrorCode.NONE:
                    return answer.base_offset + len(pairs) - 1
                why = f"broker {leader} answered {error.name}"
                if error not in _RETRIABLE:
                    raise TopicError(f"writing to {self.name}: {why}")
            log.info("writing to %s: %s; trying again", self.name, why)
            await asyncio.sleep(min(backoff, max(deadline - loop.time(), 0)))
            backoff = min(backoff * 2, _MAX_BACKOFF_S)
        raise TopicError(f"writing to {self.name} did not succeed: {why}")

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
        broker = self.broker
        factor = max(1, min(self.replication_factor, len(broker.metadata_cache.live_brokers)))
        configs = {"cleanup.policy": "compact", "min.insync.replicas": str(min(2, factor))}
        try:
            topic = await broker.auto_topics.create(self.name, 1, factor, configs, _CREATE_WAIT_S)
            log.info("created the schema registry's topic %s (replication factor %d)", self.name, factor)
        except KafkaError as e:
            if e.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                raise
            topic = await broker.auto_topics.wait_for_topic(self.name, 1, _CREATE_WAIT_S)
        if topic is None:
            raise KafkaError(f"{self.name} has no leader yet", ErrorCode.LEADER_NOT_AVAILABLE)

    async def close(self) -> None:
        self._closed = True
        tasks = [t for t in (self._task, self._creation) if t is not None]
        for task in tasks:
            task.cancel()
        self._moved()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._close_conn()
        self._pool.close()
