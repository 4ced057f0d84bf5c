"""What both coordinators do with their internal topic: map a key to the partition that owns
it, append key/value records through the partition leader with acks=-1 (as durable as
produced data), and replay the partitions this broker leads, batch by batch: all of them at
start-up (before the broker serves), one on election off the event loop (`load_off_loop`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from strom.coordinator import partition_for
from strom.protocol.errors import ErrorCode
from strom.protocol.records import (
    CONTROL_COMMIT,
    HEADER_SIZE,
    BatchHeader,
    build_batch,
    control_type,
    iter_records,
    read_header,
)

TopicPartition = tuple[str, int]
_READ_CHUNK = 4 << 20

# How Kafka reports a failed append to a coordinator's log to the client.
STORE_ERRORS = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
}


class InternalTopic:
    """A coordinator's internal topic (`topic`, set by subclasses) as its manager sees it."""

    topic = ""

    def __init__(self, replica_manager, num_partitions: Callable[[], int]) -> None:
        self.replica_manager = replica_manager
        # The partition count of the topic if it exists, else the configured one.
        self.num_partitions = num_partitions

    def partition_for(self, key: str) -> int:
        return partition_for(key, self.num_partitions())

    def partition_of(self, key: str):
        """The hosted Partition that owns `key` (None if this broker has none)."""
        return self.replica_manager.get_partition(self.topic, self.partition_for(key))

    def is_local(self, key: str) -> bool:
        """True when this broker leads the partition that owns `key`."""
        partition = self.partition_of(key)
        return partition is not None and partition.is_leader

    def new_state(self) -> Any:
        """An empty result of a replay (subclasses)."""
        raise NotImplementedError

    def replay_into(self, log_, state: Any, start: int | None = None, end: int | None = None) -> None:
        """Apply the records of `log_` in [start, end) to `state` (subclasses)."""
        raise NotImplementedError

    def load(self, only: int | None = None) -> Any:
        """Every partition of the topic this broker leads (or partition `only`) replayed into
        one `new_state()`, here, on the calling thread (start-up, before the broker serves)."""
        state = self.new_state()
        for log_ in self.local_logs(only):
            self.replay_into(log_, state)
        return state

    async def load_off_loop(self, index: int) -> Any | None:
        """Partition `index` replayed without holding up the event loop: read and parsed in the
        executor (nothing there touches a coordinator), then what was appended meanwhile (a
        transaction marker) replayed on the loop, so that the caller, applying the result before
        it awaits anything else, has the whole log. None if this broker does not lead it."""
        partition = self.replica_manager.get_partition(self.topic, index)
        if partition is None or not partition.is_leader:
            return None
        log_, state = partition.log, self.new_state()
        end = log_.log_end_offset
        await asyncio.get_running_loop().run_in_executor(None, self.replay_into, log_, state, None, end)
        if log_.log_end_offset > end:
            self.replay_into(log_, state, end)
        return state

    def local_logs(self, only: int | None = None) -> Iterator:
        """The logs of the topic's partitions this broker leads (what start-up replays), or
        just partition `only` when leadership of it arrives later."""
        for p in range(self.num_partitions()) if only is None else (only,):
            partition = self.replica_manager.get_partition(self.topic, p)
            if partition is not None and partition.is_leader:
                yield partition.log


def append(replica_manager, tp: TopicPartition, entries: list[tuple[bytes, bytes | None]], *,
           producer_id: int = -1, producer_epoch: int = -1) -> ErrorCode:
    """Append one batch of (key, value) records with acks=-1; the partition's raw error.
    With a producer id the batch is transactional (a transactional offset commit)."""
    batch = bytearray(build_batch(entries, timestamp=int(time.time() * 1000), producer_id=producer_id,
                                  producer_epoch=producer_epoch, transactional=producer_id >= 0))
    return replica_manager.append_records(-1, [(tp, batch)], from_client=False)[tp].error


@dataclass(slots=True)
class Replayed:
    """One record of a replayed log, or (record None) a transaction marker."""

    header: BatchHeader
    key: bytes | None = None
    value: bytes | None = None
    committed: bool = False  # for markers


def replay(log_, start: int | None = None, end: int | None = None) -> Iterator[Replayed]:
    """Every data record (with its batch header) and every transaction marker of `log_` from
    `start` (its start) up to `end` (its end), in offset order."""
    offset = log_.log_start_offset if start is None else max(start, log_.log_start_offset)
    end = log_.log_end_offset if end is None else end
    while offset < end:
        data = log_.read(offset, _READ_CHUNK, min_one_message=True).read_bytes()
        if not data:
            return
        pos = 0
        while pos + HEADER_SIZE <= len(data):
            header = read_header(data, pos)
            if pos + header.size > len(data):
                break
            if header.is_control:
                yield Replayed(header, committed=control_type(data, pos) == CONTROL_COMMIT)
            else:
                for record in iter_records(data, pos):
                    if record.key is not None and record.offset >= offset:
                        yield Replayed(header, record.key, record.value)
            offset = header.base_offset + header.last_offset_delta + 1
            pos += header.size
        if pos == 0:
            return  # a batch larger than the chunk would need min_one_message; never loop forever
