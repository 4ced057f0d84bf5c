"""SharePartitionManager and ShareSessionCache: the broker side of KIP-932's ShareFetch and
ShareAcknowledge.

A share session (one per group and member) remembers which partitions the member fetches, as
a fetch session does; its epoch must advance by one with every request (0 opens it, -1 closes
it). The manager keeps a SharePartition per (group, topic, partition) this broker leads,
built on first use from `__share_group_state` (or, the first time a group reads the
partition, from `share.auto.offset.reset`: the log end or start, written at once so that
"latest" does not move after a restart). What a request changes is written back as one
snapshot per share partition in one append per state-topic partition, before the response
goes out: an acknowledged record is never delivered again after a crash, and an acquired
one is delivered again with its delivery count.

Acquisition locks are timers on the event loop, one per share partition at its earliest
deadline; an expiry, a release or a departing member wakes the long polls waiting on the
partition. Bounds: group.share.max.share.sessions sessions, and per share partition
group.share.partition.max.record.locks records in flight.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from strom.coordinator import SHARE_GROUP_STATE_TOPIC, partition_for
from strom.coordinator.share.share_partition import Acquired, LogBatch, SharePartition, ShareState
from strom.coordinator.share.state_store import SharePartitionKey, ShareStateStore
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.records import HEADER_SIZE, read_header

log = logging.getLogger(__name__)

INITIAL_EPOCH, FINAL_EPOCH = 0, -1
EARLIEST, LATEST = "earliest", "latest"
_STATE_WAIT_S = 10.0  # how long a first fetch waits for the state topic to be led here
_PARTITION_READ_BYTES = 1 << 20


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(eq=False, slots=True)
class ShareSession:
    group_id: str
    member_id: str
    epoch: int = 0  # the epoch the next request must carry (advanced as each one ends)
    partitions: set[tuple[uuid.UUID, int]] = field(default_factory=set)

    def advance(self) -> None:
        self.epoch = 1 if self.epoch >= 2**31 - 1 else self.epoch + 1


class ShareSessionCache:
    def __init__(self, max_sessions: int, alive: Callable[[str, str], bool] = lambda group, member: True) -> None:
        self.max_sessions = max_sessions
        self.sessions: dict[tuple[str, str], ShareSession] = {}
        # Whether a session's member still belongs to its group: when the cache is full, the
        # sessions of members that left without closing them make room first.
        self.alive = alive

    def begin(self, group_id: str, member_id: str, epoch: int) -> ShareSession:
        """The session a request with `epoch` continues (or, epoch 0, opens). Raises KafkaError
        SHARE_SESSION_NOT_FOUND, INVALID_SHARE_SESSION_EPOCH or SHARE_SESSION_LIMIT_REACHED."""
        key = (group_id, member_id)
        if epoch == INITIAL_EPOCH:
            if key not in self.sessions and len(self.sessions) >= self.max_sessions:
                for stale in [k for k in self.sessions if not self.alive(*k)]:
                    del self.sessions[stale]
            if key not in self.sessions and len(self.sessions) >= self.max_sessions:
                raise KafkaError("The limit of share sessions has been reached.",
                                 ErrorCode.SHARE_SESSION_LIMIT_REACHED)
            session = self.sessions[key] = ShareSession(group_id, member_id)
            return session
        session = self.sessions.get(key)
        if session is None:
            raise KafkaError("The share session was not found.", ErrorCode.SHARE_SESSION_NOT_FOUND)
        if epoch != FINAL_EPOCH and epoch != session.epoch:
            raise KafkaError(f"The share session epoch is {session.epoch}, the request has {epoch}.",
                             ErrorCode.INVALID_SHARE_SESSION_EPOCH)
        return session

    def end(self, session: ShareSession, epoch: int) -> None:
        if epoch == FINAL_EPOCH:
            self.sessions.pop((session.group_id, session.member_id), None)
        else:
            session.advance()


@dataclass(slots=True)
class FetchedPartition:
    error: ErrorCode = ErrorCode.NONE
    records: bytes | None = None
    acquired: list[Acquired] = field(default_factory=list)


class SharePartitionManager:
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        config = broker.config
        self.sessions = ShareSessionCache(config["group.share.max.share.sessions"], self.member_alive)
        self.store = ShareStateStore(broker.replica_manager,
                                     lambda: broker.auto_topics.internal_partitions(SHARE_GROUP_STATE_TOPIC))
        self.partitions: dict[SharePartitionKey, SharePartition] = {}
        self._timers: dict[SharePartitionKey, asyncio.TimerHandle] = {}

    @property
    def config(self):
        return self.broker.config

    def member_alive(self, group_id: str, member_id: str) -> bool:
        """False only when this broker coordinates the group and the member is not in it."""
        coordinator = self.broker.group_coordinator
        if coordinator is None or coordinator.validate_group_status(group_id, 76) is not None:
            return True
        return coordinator.share_groups.is_member(group_id, member_id)

    # --- group configs --------------------------------------------------------------------------
    def group_config(self, group_id: str, name: str, default: str) -> str:
        return self.broker.group_configs.get(group_id, {}).get(name, default)

    def lock_duration_ms(self, group_id: str) -> int:
        value = self.group_config(group_id, "share.record.lock.duration.ms", "")
        return int(value) if value else self.config["group.share.record.lock.duration.ms"]

    def read_committed(self, group_id: str) -> bool:
        return self.group_config(group_id, "share.isolation.level", "read_uncommitted") == "read_committed"

    # --- share partitions -----------------------------------------------------------------------
    def key(self, group_id: str, topic_id: uuid.UUID, partition: int) -> SharePartitionKey:
        return SharePartitionKey(group_id, topic_id, partition)

    async def share_partition(self, key: SharePartitionKey, topic: str) -> tuple[SharePartition | None, ErrorCode]:
        """The share partition of `key`, loaded or initialised. Its state must be led here."""
        sp = self.partitions.get(key)
        if sp is not None:
            return sp, ErrorCode.NONE
        partition, error = self.broker.replica_manager.leader_partition((topic, key.partition))
        if partition is None:
            return None, error
        error = await self._await_state_partition(key)
        if error != ErrorCode.NONE:
            return None, error
        sp = self.partitions.get(key)  # made while we waited
        if sp is not None:
            return sp, ErrorCode.NONE
        state = self.store.get(key)
        if state is None:
            reset = self.group_config(key.group_id, "share.auto.offset.reset", LATEST)
            start = partition.log.log_start_offset if reset == EARLIEST else partition.high_watermark
            state = ShareState(start)
        sp = SharePartition(state.start_offset, delivery_limit=self.config["group.share.delivery.count.limit"],
                            max_in_flight=self.config["group.share.partition.max.record.locks"], state=state)
        if self.store.get(key) is None:
            sp.dirty = True  # initialise: write where it starts before anything is delivered
        self.partitions[key] = sp
        return sp, ErrorCode.NONE

    async def _await_state_partition(self, key: SharePartitionKey) -> ErrorCode:
        auto = self.broker.auto_topics
        try:
            await auto.ensure_internal_topic(SHARE_GROUP_STATE_TOPIC)
        except KafkaError as e:
            return e.code
        index = partition_for(key.coordinator_key, auto.internal_partitions(SHARE_GROUP_STATE_TOPIC))
        deadline = time.monotonic() + _STATE_WAIT_S
        while True:
            partition = self.broker.replica_manager.get_partition(SHARE_GROUP_STATE_TOPIC, index)
            if partition is not None and partition.is_leader and index in self.store.loaded:
                return ErrorCode.NONE
            if time.monotonic() > deadline:
                return ErrorCode.COORDINATOR_NOT_AVAILABLE
            await asyncio.sleep(0.05)

    def acquire(self, key: SharePartitionKey, sp: SharePartition, topic: str, member_id: str,
                max_records: int, max_bytes: int) -> FetchedPartition:
        """Read from where the share partition needs records and acquire what it may."""
        rm = self.broker.replica_manager
        tp = (topic, key.partition)
        partition, error = rm.leader_partition(tp)
        if partition is None:
            return FetchedPartition(error)
        if sp.start_offset < partition.log.log_start_offset:
            sp.move_start(partition.log.log_start_offset)
        offset = sp.fetch_offset()
        if offset is None or max_records <= 0:
            return FetchedPartition()
        read_committed = self.read_committed(key.group_id)
        # One partition's read is bounded like a consumer's max.partition.fetch.bytes, so that
        # what the loop reads at once stays small whatever MaxBytes the client asked for.
        result = rm.read(tp, offset, min(max_bytes, _PARTITION_READ_BYTES), min_one_message=True,
                         read_committed=read_committed)
        if result.error != ErrorCode.NONE:
            return FetchedPartition(result.error)
        if result.records is None or not result.records.size:
            return FetchedPartition()
        data = result.records.read_bytes()
        aborted = result.aborted or []
        batches, ends = [], []
        pos = 0
        while pos + HEADER_SIZE <= len(data):
            h = read_header(data, pos)
            if pos + h.size > len(data):
                break
            skip = h.is_control or (h.is_transactional and any(
                t.producer_id == h.producer_id and t.first_offset <= h.base_offset <= t.last_offset
                for t in aborted))
            batches.append(LogBatch(h.base_offset, h.last_offset, skip))
            ends.append((pos, pos + h.size))
            pos += h.size
        acquired = sp.acquire(member_id, batches, max_records, now_ms(), self.lock_duration_ms(key.group_id))
        if not acquired:
            return FetchedPartition()
        self._schedule_expiry(key, sp)
        first, last = acquired[0].first_offset, acquired[-1].last_offset
        # Send the batches that hold acquired records; the client drops what was not acquired.
        spans = [span for b, span in zip(batches, ends, strict=True)
                 if b.last_offset >= first and b.base_offset <= last]
        return FetchedPartition(records=data[spans[0][0]:spans[-1][1]], acquired=acquired)

    def _schedule_expiry(self, key: SharePartitionKey, sp: SharePartition) -> None:
        deadline = sp.next_lock_deadline()
        timer = self._timers.get(key)
        if deadline is None:
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + max(deadline - now_ms(), 0) / 1000
        if timer is not None and timer.when() <= when:
            return
        if timer is not None:
            timer.cancel()
        self._timers[key] = loop.call_at(when, self._expire, key)

    def _expire(self, key: SharePartitionKey) -> None:
        self._timers.pop(key, None)
        sp = self.partitions.get(key)
        if sp is None:
            return
        if sp.expire_locks(now_ms()):
            self.wake(key)
        if sp.next_lock_deadline() is not None:
            self._schedule_expiry(key, sp)

    def wake(self, key: SharePartitionKey) -> None:
        self.broker.replica_manager.fetch_purgatory.wake(("share", key.group_id, key.topic_id, key.partition))

    def wait_keys(self, group_id: str, parts: Iterable[tuple[str, uuid.UUID, int]]) -> list:
        keys: list = []
        for topic, topic_id, p in parts:
            keys += [(topic, p), ("share", group_id, topic_id, p)]
        return keys

    # --- members and persistence ---------------------------------------------------------------
    def member_left(self, group_id: str, member_id: str) -> None:
        """Group coordinator listener: what a departed member holds goes back to the group.
        Its share session stays for the final ShareAcknowledge a closing client may send
        after its leave heartbeat; when the cache is full, such sessions make room first."""
        for key, sp in self.partitions.items():
            if key.group_id == group_id and sp.release_member(member_id):
                self.wake(key)

    def release_session(self, session: ShareSession) -> None:
        for key, sp in self.partitions.items():
            if key.group_id == session.group_id and sp.release_member(session.member_id):
                self.wake(key)

    async def persist(self, keys: Iterable[SharePartitionKey]) -> dict[SharePartitionKey, ErrorCode]:
        """Write the changed share partitions among `keys` and wait until the state topic has
        them (acks=all); each key's error."""
        entries = []
        for key in set(keys):
            sp = self.partitions.get(key)
            if sp is not None and sp.dirty:
                entries.append((key, sp.state()))
        if not entries:
            return {}
        errors, written = self.store.write(entries)
        for key, _ in entries:
            if errors[key] == ErrorCode.NONE:
                self.partitions[key].dirty = False
        await self._await_written(written, [k for k, _ in entries], errors)
        return errors

    # --- admin ----------------------------------------------------------------------------------
    def group_ids(self) -> set[str]:
        return self.store.group_ids() | {k.group_id for k in self.partitions}

    def start_offsets(self, group_id: str) -> dict[tuple[uuid.UUID, int], int]:
        out = {(k.topic_id, k.partition): s.start_offset for k, s in self.store.states.items()
               if k.group_id == group_id}
        for k, sp in self.partitions.items():
            if k.group_id == group_id:
                out[(k.topic_id, k.partition)] = sp.start_offset
        return out

    async def set_start_offsets(self, starts: dict[SharePartitionKey, int]) -> dict[SharePartitionKey, ErrorCode]:
        """AlterShareGroupOffsets (the group has no members): each share partition starts over
        at its offset, a new state epoch, nothing in flight."""
        entries = []
        for key, offset in starts.items():
            error = await self._await_state_partition(key)
            if error != ErrorCode.NONE:
                continue
            sp = self.partitions.get(key)
            if sp is None:
                old = self.store.get(key)
                state = ShareState(offset, [], 0 if old is None else old.state_epoch + 1)
            else:
                sp.reset(offset)
                state = sp.state()
            entries.append((key, state))
        errors = {key: ErrorCode.COORDINATOR_NOT_AVAILABLE for key in starts}
        if entries:
            written, indexes = self.store.write(entries)
            errors |= written
            for key, _ in entries:
                if key in self.partitions and written[key] == ErrorCode.NONE:
                    self.partitions[key].dirty = False
            await self._await_written(indexes, [k for k, _ in entries], errors)
        return errors

    async def delete_partitions(self, keys: list[SharePartitionKey]) -> dict[SharePartitionKey, ErrorCode]:
        """DeleteShareGroupOffsets: forget these share partitions (tombstones)."""
        for key in keys:
            self.partitions.pop(key, None)
            timer = self._timers.pop(key, None)
            if timer is not None:
                timer.cancel()
        if not keys:
            return {}
        errors, indexes = self.store.write([(k, None) for k in keys])
        await self._await_written(indexes, keys, errors)
        return errors

    async def _await_written(self, indexes: set[int], keys: list[SharePartitionKey],
                             errors: dict[SharePartitionKey, ErrorCode]) -> None:
        n = self.store.num_partitions()
        for index in indexes:
            owned = [k for k in keys if partition_for(k.coordinator_key, n) == index]
            error = await self.broker.coordinators.await_internal_replication(SHARE_GROUP_STATE_TOPIC,
                                                                              owned[0].coordinator_key)
            if error != ErrorCode.NONE:
                for k in owned:
                    errors[k] = error

    async def delete_group_state(self, group_id: str) -> ErrorCode:
        keys = set(self.store.keys_of(group_id)) | {k for k in self.partitions if k.group_id == group_id}
        errors = await self.delete_partitions(list(keys))
        return next((e for e in errors.values() if e != ErrorCode.NONE), ErrorCode.NONE)

    # --- leadership -----------------------------------------------------------------------------
    def load(self, index: int | None = None) -> None:
        self.store.load(index)

    def unload(self, index: int) -> None:
        self.store.unload(index)
        n = self.store.num_partitions()
        for key in [k for k in self.partitions if partition_for(k.coordinator_key, n) == index]:
            self.partitions.pop(key)
            timer = self._timers.pop(key, None)
            if timer is not None:
                timer.cancel()

    def leadership_left(self, topic_id: uuid.UUID, partition: int) -> None:
        """This broker no longer leads the partition (or hosts it): its share partitions are
        dropped here; their state stays in `__share_group_state` for the next leader."""
        for key in [k for k in self.partitions if k.topic_id == topic_id and k.partition == partition]:
            self.partitions.pop(key)
            timer = self._timers.pop(key, None)
            if timer is not None:
                timer.cancel()

    def topics_deleted(self) -> None:
        """Topics went: the share-partition state of topics no longer in the metadata is
        tombstoned (in the state partitions led here), as Kafka deletes it with the topic."""
        known = self.broker.metadata_cache.names_by_id
        gone = {k for k in set(self.store.states) | set(self.partitions) if k.topic_id not in known}
        if not gone:
            return
        for key in gone:
            self.leadership_left(key.topic_id, key.partition)
        local = [k for k in gone if self.store.available(k)]
        if local:
            self.store.write([(k, None) for k in local])

    def shutdown(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
