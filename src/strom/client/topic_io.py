"""An internal topic read and written by the broker itself, over its own inter-broker
connections (authenticated as the broker), in every mode: the schema registry's `_schemas` and
the remote log metadata manager's `__remote_log_metadata` both go through here.

- PartitionTail: one task long-polling consumer Fetches (read_uncommitted, or read_committed
  when asked: Iceberg topics) of one partition from the leader the broker's metadata names, on
  a connection of its own, looked up again with a growing backoff after NOT_LEADER, an unknown
  leader or a lost connection. A subclass says where to read from and takes what comes.
- produce_acks_all: one batch to a partition's leader, acks=all, tried again at the leader
  named then until a deadline.
- create_or_await: make a topic, or wait for the one someone else made.

`broker` is the running broker (its metadata cache, endpoints, security, auto_topics): this
module sits below the server and only uses it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from strom.client import AsyncConnection
from strom.client.inter_broker import ConnectionPool
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.records import (
    CONTROL_ABORT,
    HEADER_SIZE,
    BatchHeader,
    control_type,
    read_header,
    scan_valid_prefix,
)

PRODUCE, PRODUCE_VERSION = 0, 9
FETCH, FETCH_VERSION = 1, 12
FETCH_MAX_WAIT_MS = 500
FETCH_TIMEOUT_S = FETCH_MAX_WAIT_MS / 1000 + 30.0
CONNECT_TIMEOUT_S = 10.0
BACKOFF_S, MAX_BACKOFF_S = 0.05, 1.0
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
NETWORK_ERRORS = (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError, LookupError)
# Answers after which a write or a read is tried again, at the leader named then.
RETRIABLE = frozenset({
    ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, ErrorCode.REQUEST_TIMED_OUT,
    ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.REPLICA_NOT_AVAILABLE})


def error_code(number: int) -> ErrorCode:
    """The answer's code; one this broker does not know counts as UNKNOWN_SERVER_ERROR."""
    try:
        return ErrorCode(number)
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR


def backed_off(backoff: float) -> float:
    return min(backoff * 2, MAX_BACKOFF_S)


class PartitionTail:
    """The reading of one partition of `topic`. Subclasses implement `read_once` (mostly with
    `fetch` and `batches`), and may say when to stop (`reading`) and what to do while the
    partition has no leader (`leaderless`)."""

    # at least this long between looks at a leaderless partition's metadata
    leaderless_wait_s = 0.0

    def __init__(self, broker: Any, topic: str, partition: int, client_id: str, max_bytes: int,
                 logger: logging.Logger, *, isolation_level: int = READ_UNCOMMITTED) -> None:
        self.broker = broker
        self.topic = topic
        self.partition = partition
        self.client_id = client_id
        self.max_bytes = max_bytes
        self.isolation_level = isolation_level
        self.log = logger
        self.label = f"{topic}-{partition}"
        self.conn: AsyncConnection | None = None
        self.conn_leader = -1
        self.task: asyncio.Task | None = None
        self._progress = asyncio.Event()

    # --- hooks -----------------------------------------------------------------------------------
    def reading(self) -> bool:
        return True

    def leaderless(self) -> None:
        """Called each time the partition is found without a leader."""

    async def read_once(self, leader: int, leader_epoch: int) -> bool:
        """One fetch from the leader and its answer taken; False when it asks for a backoff."""
        raise NotImplementedError

    async def refused(self, state: Any, backoff: float) -> None:
        """After an answer that asks for a backoff: wait (the partition's metadata may change)."""
        await asyncio.sleep(backoff)

    # --- progress --------------------------------------------------------------------------------
    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run(), name=f"{self.label} tail")

    def moved(self) -> None:
        """Wake whoever waits on this partition's reading."""
        event, self._progress = self._progress, asyncio.Event()
        event.set()

    async def wait(self, until: Callable[[], bool], deadline: float,
                   closed: Callable[[], bool] = lambda: False) -> bool:
        """Until `until()` holds after some progress (or at once); at the deadline (or once
        `closed()`), whether it holds then."""
        loop = asyncio.get_running_loop()
        while not until():
            remaining = deadline - loop.time()
            if remaining <= 0 or closed():
                return until()
            try:
                async with asyncio.timeout(remaining):
                    await self._progress.wait()
            except TimeoutError:
                return until()
        return True

    # --- the tail --------------------------------------------------------------------------------
    async def run(self) -> None:
        backoff = BACKOFF_S
        cache = self.broker.metadata_cache
        try:
            while self.reading() and not self.broker.stopping:
                state = cache.partition(self.topic, self.partition)
                if state is None or state.leader < 0:
                    self.leaderless()
                    await cache.wait_for(lambda: (s := cache.partition(self.topic, self.partition)) is not None
                                         and s.leader >= 0, max(backoff, self.leaderless_wait_s))
                    backoff = backed_off(backoff)
                    continue
                try:
                    took = await self.read_once(state.leader, state.leader_epoch)
                except Exception as e:  # a reader that stopped would leave its readers behind for good
                    if isinstance(e, NETWORK_ERRORS):
                        self.log.info("%s: fetch from broker %d failed: %s", self.label, state.leader,
                                      e or type(e).__name__)
                    else:
                        self.log.exception("%s: reading failed; trying again", self.label)
                    self.close_conn()
                    await asyncio.sleep(backoff)
                    backoff = backed_off(backoff)
                    continue
                if took:
                    backoff = BACKOFF_S
                else:
                    await self.refused(state, backoff)
                    backoff = backed_off(backoff)
        finally:
            self.close_conn()

    def close_conn(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn, self.conn_leader = None, -1

    async def fetch(self, leader: int, leader_epoch: int, position: int, max_wait_ms: int) -> tuple[ErrorCode, Any]:
        """One Fetch of the partition from `position`: (NONE, its answer), (OFFSET_OUT_OF_RANGE,
        its answer), or (the error, None) for any other, logged unless it is retriable."""
        if self.conn is None or self.conn_leader != leader:
            self.close_conn()
            host, port = self.broker.broker_endpoint(leader)
            self.conn = await AsyncConnection.open(host, port, self.client_id, CONNECT_TIMEOUT_S,
                                                   security=self.broker.inter_broker_security)
            self.conn_leader = leader
        body = await self.conn.call(FETCH, FETCH_VERSION, {
            "replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": 1, "max_bytes": self.max_bytes,
            "isolation_level": self.isolation_level, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": self.topic, "partitions": [{
                "partition": self.partition, "current_leader_epoch": leader_epoch, "fetch_offset": position,
                "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": self.max_bytes}]}],
            "forgotten_topics_data": [], "rack_id": ""}, FETCH_TIMEOUT_S)
        error = error_code(body.error_code)
        answer = next((p for t in body.responses if t.topic == self.topic for p in t.partitions
                       if p.partition_index == self.partition), None)
        if error == ErrorCode.NONE and answer is not None:
            error = error_code(answer.error_code)
        if error in (ErrorCode.NONE, ErrorCode.OFFSET_OUT_OF_RANGE) and answer is not None:
            return error, answer
        if error not in RETRIABLE:
            self.log.warning("%s: fetch from broker %d answered %s", self.label, leader, error.name)
        return error, None

    def batches(self, data: bytes, position: int) -> list[tuple[int, BatchHeader]] | None:
        """The whole batches of a fetched answer; None when its first one is corrupt (the answer
        is fetched again rather than read past)."""
        batches, _ = scan_valid_prefix(data)
        if not batches and len(data) >= HEADER_SIZE and read_header(data).size <= len(data):
            self.log.warning("%s: a corrupt batch at offset %d; fetching it again", self.label, position)
            return None
        return batches

    def committed(self, data: bytes, batches: list[tuple[int, BatchHeader]], answer: Any) -> list[tuple[int, BatchHeader]]:
        """Of the `batches` of a read_committed answer, those a consumer takes: no control batch,
        none of an aborted transaction the answer lists (KIP-98's consumer rule: a producer's
        transactional batches are aborted from the listed first offset up to its abort marker)."""
        starts = sorted(((t.first_offset, t.producer_id) for t in answer.aborted_transactions or ()), reverse=True)
        aborting: set[int] = set()
        kept = []
        for pos, header in batches:
            while starts and starts[-1][0] <= header.base_offset:
                aborting.add(starts.pop()[1])
            if header.is_control:
                if header.producer_id in aborting and control_type(data, pos) == CONTROL_ABORT:
                    aborting.discard(header.producer_id)
            elif not (header.is_transactional and header.producer_id in aborting):
                kept.append((pos, header))
        return kept


async def produce_acks_all(broker: Any, pool: ConnectionPool, topic: str, partition: int, batch: bytes,
                           deadline: float, closed: Callable[[], bool], failure: type[Exception],
                           logger: logging.Logger, label: str) -> int:
    """The base offset of `batch` once the partition's leader has it acks=all. Raises `failure`
    on an answer not worth trying again, or when the deadline comes first."""
    loop = asyncio.get_running_loop()
    cache = broker.metadata_cache
    backoff, why = BACKOFF_S, "no leader"
    while not closed() and not broker.stopping:
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        state = cache.partition(topic, partition)
        if state is None or state.leader < 0:
            why = "no leader"
            await cache.wait_for(lambda: (s := cache.partition(topic, partition)) is not None and s.leader >= 0,
                                 min(backoff, remaining))
            backoff = backed_off(backoff)
            continue
        try:
            body = await pool.call(state.leader, PRODUCE, PRODUCE_VERSION, {
                "transactional_id": None, "acks": -1, "timeout_ms": int(min(remaining, 30.0) * 1000),
                "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": batch}]}]},
                remaining + 1.0)
        except NETWORK_ERRORS as e:
            why = f"broker {state.leader} not reached: {e or type(e).__name__}"
        else:
            answer = next((p for t in body.responses if t.name == topic for p in t.partition_responses
                           if p.index == partition), None)
            error = error_code(answer.error_code) if answer is not None else ErrorCode.UNKNOWN_SERVER_ERROR
            if error == ErrorCode.NONE:
                return answer.base_offset
            why = f"broker {state.leader} answered {error.name}"
            if error not in RETRIABLE:
                raise failure(f"writing to {label}: {why}")
        logger.info("writing to %s: %s; trying again", label, why)
        await asyncio.sleep(min(backoff, max(deadline - loop.time(), 0)))
        backoff = backed_off(backoff)
    raise failure(f"writing to {label} did not succeed: {why}")


async def create_or_await(broker: Any, topic: str, partitions: int, factor: int, configs: dict[str, str],
                          wait_s: float) -> bool:
    """Make the topic; when another did, wait for it. True when this call made it. Raises
    KafkaError when it cannot be made, or LEADER_NOT_AVAILABLE when it has no leader in time."""
    made = False
    try:
        found = await broker.auto_topics.create(topic, partitions, factor, configs, wait_s)
        made = True
    except KafkaError as e:
        if e.code != ErrorCode.TOPIC_ALREADY_EXISTS:
            raise
        found = await broker.auto_topics.wait_for_topic(topic, 1, wait_s)
    if found is None:
        raise KafkaError(f"{topic} has no leader yet", ErrorCode.LEADER_NOT_AVAILABLE)
    return made
