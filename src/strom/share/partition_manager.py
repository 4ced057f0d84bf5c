"""SharePartitionManager and ShareSessionCache: the broker side of KIP-932's ShareFetch and
ShareAcknowledge.

A share session (one per group and member) remembers which partitions the member fetches, as
a fetch session does; its epoch must advance by one with every request (0 opens it, -1 closes
it). The manager keeps a SharePartition per (group, topic, partition) this broker leads, loaded
on first use from its ShareCoordinator through the Persister (ReadShareGroupState with the
partition's leader epoch, which fences the leader before this one). A share partition without
state is initialized (InitializeShareGroupState) where `share.auto.offset.reset` says, the log
end or start or the first record of the last <duration> (by_duration), before anything is
delivered, so that "latest" does not move after a restart.
What a request's acknowledgements change is written back (WriteShareGroupState) before the
response goes out, while its fetch runs: an acknowledged record is never delivered again after
a crash. As in Kafka, an acquisition alone is not written; releases, lock expiries and members
fenced or gone are written in the background. So a record acquired since the last write comes
back after a crash of the leader with the delivery count that write had. Writes are batched
(every share partition waiting, in one call per coordinator and group) and pipelined (a few in
flight), each share partition in one write at a time, so that an older snapshot never lands
after a newer one. A write the coordinator fences (a newer leader epoch or state epoch, or
state deleted) drops the share partition, to be loaded again.

Acquisition locks are timers on the event loop, one per share partition at its earliest
deadline; an expiry, a release or a departing member wakes the long polls waiting on the
partition. Bounds: group.share.max.share.sessions sessions, and per share partition the
group's share.partition.max.record.locks (else group.share.partition.max.record.locks) records
in flight; the group's share.delivery.count.limit (else group.share.delivery.count.limit)
deliveries of a record. Both are read before each change (KIP-1240: dynamic).

Delayed delivery (a Strom extension, `delayed_delivery.py`): the acquisition reads the
`strom.not-before` header of the batches that may hold records it has not seen, and the group
config `share.release.delay.ms` delays every RELEASE of the group; a second timer per share
partition, at the earliest not-before, wakes the long polls waiting on it.

Dead letters (KIP-1191's design, `dead_letters.py`): a share partition of a group with an
`errors.deadletterqueue.topic.name` keeps what it gives up on as pending dead letters; the
state writer hands them to the DeadLetterWriter once a write made them durable, a restored
share partition hands over those it restored, and what the writer archives is persisted a
moment later (ARCHIVE_LINGER_S, so that a burst of dead letters costs one state write).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from strom.config.repository import sanitize
from strom.controller.admin import read_configs
from strom.controller.store import StoreUnavailable
from strom.controller.znodes import is_internal
from strom.coordinator import SHARE_GROUP_STATE_TOPIC
from strom.coordinator.share.coordinator import StateResult
from strom.coordinator.share.share_partition import (
    ACKNOWLEDGE_TYPES,
    RENEW,
    AckBatch,
    Acquired,
    LogBatch,
    SharePartition,
    ShareState,
)
from strom.coordinator.share.state_store import SharePartitionKey, ShareReplay, ShareStateStore
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.records import HEADER_SIZE, read_header
from strom.share.coordinator_service import ShareCoordinatorService
from strom.share.dead_letters import DeadLetterWriter, group_settings
from strom.share.delayed_delivery import batch_not_before
from strom.share.persister import Persister
from strom.share.state_writer import StateWriter

log = logging.getLogger(__name__)

INITIAL_EPOCH, FINAL_EPOCH = 0, -1
EARLIEST, LATEST, BY_DURATION = "earliest", "latest", "by_duration:"
_PARTITION_READ_BYTES = 1 << 20
_ADMIN_KEYS_PER_CALL = 1000  # keys per Persister call when an admin request names no partitions
ARCHIVE_LINGER_S = 0.5  # dead letters archived are persisted together after this

# Java's Duration.parse: [-+]P[nD][T[nH][nM][n[.n]S]], each number signed, case-insensitive;
# numbers of at most 18 digits (a Java long), so that no text costs more than a few steps.
_DURATION = re.compile(r"([-+]?)P(?:([-+]?\d{1,18})D)?(?:T(?:([-+]?\d{1,18})H)?(?:([-+]?\d{1,18})M)?"
                       r"(?:([-+]?)(\d{1,18})(?:[.,](\d{0,9}))?S)?)?", re.IGNORECASE)


def by_duration_ms(value: str) -> int | None:
    """The duration of share.auto.offset.reset=by_duration:<ISO-8601 duration> in ms (whole ms,
    as the log's timestamps are); None for earliest, latest, or anything not a duration that
    is not negative."""
    if value[:len(BY_DURATION)].lower() != BY_DURATION:
        return None
    text = value[len(BY_DURATION):].strip()
    m = _DURATION.fullmatch(text)
    if m is None or text.upper().endswith("T") or not any(m.group(i) for i in (2, 3, 4, 6)):
        return None
    sign, days, hours, minutes, s_sign, secs, frac = m.groups()
    ms = ((int(days or 0) * 24 + int(hours or 0)) * 60 + int(minutes or 0)) * 60_000
    if secs is not None:
        seconds_ms = int(secs) * 1000 + int((frac or "").ljust(9, "0")[:9]) // 1_000_000
        ms += -seconds_ms if s_sign == "-" else seconds_ms
    ms = -ms if sign == "-" else ms
    return ms if ms >= 0 else None


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(eq=False, slots=True)
class ShareSession:
    group_id: str
    member_id: str
    epoch: int = 0  # the epoch the next request must carry (advanced as each one ends)
    partitions: set[tuple[uuid.UUID, int]] = field(default_factory=set)
    connection: str | None = None  # the client connection that opened it

    def advance(self) -> None:
        self.epoch = 1 if self.epoch >= 2**31 - 1 else self.epoch + 1


class ShareSessionCache:
    def __init__(self, max_sessions: int, alive: Callable[[str, str], bool] = lambda group, member: True) -> None:
        self.max_sessions = max_sessions
        self.sessions: dict[tuple[str, str], ShareSession] = {}
        # connection -> the keys of the sessions in the cache it opened (never more entries
        # than sessions: a session leaving the cache leaves this too)
        self.by_connection: dict[str, set[tuple[str, str]]] = {}
        # Whether a session's member still belongs to its group: when the cache is full, the
        # sessions of members that left without closing them make room first.
        self.alive = alive

    def begin(self, group_id: str, member_id: str, epoch: int, connection: str | None = None) -> ShareSession:
        """The session a request with `epoch` continues (or, epoch 0, opens on `connection`).
        Raises KafkaError SHARE_SESSION_NOT_FOUND, INVALID_SHARE_SESSION_EPOCH or
        SHARE_SESSION_LIMIT_REACHED."""
        key = (group_id, member_id)
        if epoch == INITIAL_EPOCH:
            if key not in self.sessions and len(self.sessions) >= self.max_sessions:
                for stale in [k for k in self.sessions if not self.alive(*k)]:
                    self._remove(stale)
            if key not in self.sessions and len(self.sessions) >= self.max_sessions:
                raise KafkaError("The limit of share sessions has been reached.",
                                 ErrorCode.SHARE_SESSION_LIMIT_REACHED)
            self._remove(key)  # reopened: the old session goes, on whatever connection it was
            session = self.sessions[key] = ShareSession(group_id, member_id, connection=connection)
            if connection is not None:
                self.by_connection.setdefault(connection, set()).add(key)
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
            if self.sessions.get((session.group_id, session.member_id)) is session:
                self._remove((session.group_id, session.member_id))
        else:
            session.advance()

    def connection_closed(self, connection: str) -> list[ShareSession]:
        """The client connection closed (Kafka 4.1's share session eviction on disconnect):
        the sessions it opened that are still in the cache, removed."""
        return [s for key in list(self.by_connection.get(connection, ())) if (s := self._remove(key)) is not None]

    def _remove(self, key: tuple[str, str]) -> ShareSession | None:
        session = self.sessions.pop(key, None)
        if session is not None and session.connection is not None:
            keys = self.by_connection.get(session.connection)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self.by_connection[session.connection]
        return session


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
        # The share coordinator's state (the state partitions led here) and how this broker
        # reaches any share coordinator, itself included.
        self.store = ShareStateStore(broker.replica_manager,
                                     lambda: broker.auto_topics.internal_partitions(SHARE_GROUP_STATE_TOPIC))
        self.coordinator = ShareCoordinatorService(broker, self.store)
        # State partitions being replayed after an election (server/coordinators.py), by index.
        self.loading: dict[int, object] = {}
        self.persister = Persister(broker, self.coordinator)
        self.partitions: dict[SharePartitionKey, SharePartition] = {}
        self._loading: dict[SharePartitionKey, asyncio.Task] = {}
        self.dead_letter_writer = DeadLetterWriter(broker, self.partitions, self._dead_letters_archived)
        self.writer = StateWriter(self.persister.write, self.partitions, self._drop, lambda: broker.stopping,
                                  lambda key, sp: self.dead_letter_writer.kick(key))
        self._archive_timers: dict[SharePartitionKey, asyncio.TimerHandle] = {}
        self._timers: dict[SharePartitionKey, asyncio.TimerHandle] = {}
        self._due_timers: dict[SharePartitionKey, asyncio.TimerHandle] = {}
        # The group configs a share partition was initialized under, read from the store then:
        # its first acquisition uses them too (isolation level, lock duration).
        self._first_configs: dict[SharePartitionKey, dict[str, str]] = {}

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
    def group_config(self, group_id: str, name: str, default: str, configs: dict[str, str] | None = None) -> str:
        return (self.broker.group_configs.get(group_id, {}) if configs is None else configs).get(name, default)

    def lock_duration_ms(self, group_id: str, configs: dict[str, str] | None = None) -> int:
        value = self.group_config(group_id, "share.record.lock.duration.ms", "", configs)
        return int(value) if value else self.config["group.share.record.lock.duration.ms"]

    def release_delay_ms(self, group_id: str, configs: dict[str, str] | None = None) -> int:
        """Strom's `share.release.delay.ms`: how long a released record waits (0: not at all)."""
        value = self.group_config(group_id, "share.release.delay.ms", "", configs)
        return int(value) if value else 0

    def delivery_count_limit(self, group_id: str, configs: dict[str, str] | None = None) -> int:
        """KIP-1240's share.delivery.count.limit, else group.share.delivery.count.limit."""
        value = self.group_config(group_id, "share.delivery.count.limit", "", configs)
        return int(value) if value else self.config["group.share.delivery.count.limit"]

    def max_record_locks(self, group_id: str, configs: dict[str, str] | None = None) -> int:
        """KIP-1240's share.partition.max.record.locks, else group.share.partition.max.record.locks."""
        value = self.group_config(group_id, "share.partition.max.record.locks", "", configs)
        return int(value) if value else self.config["group.share.partition.max.record.locks"]

    def configured(self, key: SharePartitionKey, sp: SharePartition,
                   configs: dict[str, str] | None = None) -> SharePartition:
        """The share partition under its group's configs as they are now, applied before each
        change (group configs are dynamic): whether what it gives up on becomes a dead letter
        (the group has a topic), its delivery count limit and its in-flight bound (KIP-1240: a
        lowered limit lets a record in flight finish its delivery, then archives it; a lowered
        bound stops new acquisitions until the window drains below it)."""
        sp.dead_letters = group_settings(self.broker.group_configs.get(key.group_id, {})) is not None
        sp.delivery_limit = self.delivery_count_limit(key.group_id, configs)
        sp.max_in_flight = self.max_record_locks(key.group_id, configs)
        return sp

    def _dead_letters_archived(self, key: SharePartitionKey) -> None:
        """The writer archived dead letters: the window may have moved (polls look again); the
        change is persisted shortly, with whatever else comes meanwhile."""
        self.wake(key)
        _arm(self._archive_timers, key, ARCHIVE_LINGER_S, self._persist_archived)

    def _persist_archived(self, key: SharePartitionKey) -> None:
        self._archive_timers.pop(key, None)
        self.persist_soon([key])

    def read_committed(self, group_id: str, configs: dict[str, str] | None = None) -> bool:
        return self.group_config(group_id, "share.isolation.level", "read_uncommitted", configs) == "read_committed"

    async def current_group_configs(self, group_id: str) -> dict[str, str]:
        """The group's configs as the metadata store has them now. The ones this broker follows
        through /config/changes arrive some tens of milliseconds after a change made on another
        broker: a group set to `earliest` just before its first fetch would otherwise start a
        partition led here at `latest`, for good. A KRaft broker has no store to ask: its
        configs are the metadata image's, as current as its last fetch of the metadata log."""
        broker = self.broker
        if getattr(broker, "forwards_admin", False) or getattr(broker, "store", None) is None:
            return dict(broker.group_configs.get(group_id, {}))
        try:
            return await broker.store_io(read_configs, broker.store, "groups", sanitize(group_id))
        except StoreUnavailable:
            return dict(broker.group_configs.get(group_id, {}))

    # --- share partitions -----------------------------------------------------------------------
    def key(self, group_id: str, topic_id: uuid.UUID, partition: int) -> SharePartitionKey:
        return SharePartitionKey(group_id, topic_id, partition)

    async def share_partition(self, key: SharePartitionKey, topic: str) -> tuple[SharePartition | None, ErrorCode]:
        """The share partition of `key`, loaded from its share coordinator on first use (one
        load at a time per key). Only the partition's leader has one."""
        sp = self.partitions.get(key)
        if sp is not None:
            return sp, ErrorCode.NONE
        partition, error = self.broker.replica_manager.leader_partition((topic, key.partition))
        if partition is None:
            return None, error
        task = self._loading.get(key)
        if task is None:
            task = self._loading[key] = asyncio.get_running_loop().create_task(self._load(key, topic))
            task.add_done_callback(lambda t: self._loading.pop(key, None) if self._loading.get(key) is t else None)
        return await asyncio.shield(task)

    async def _load(self, key: SharePartitionKey, topic: str) -> tuple[SharePartition | None, ErrorCode]:
        rm = self.broker.replica_manager
        partition, error = rm.leader_partition((topic, key.partition))
        if partition is None:
            return None, error
        leader_epoch = partition.leader_epoch
        state = None
        configs: dict[str, str] | None = None
        for _ in range(3):  # a concurrent initialization (FENCED_STATE_EPOCH) is read back
            read = (await self.persister.read({key: leader_epoch}))[key]
            if read.error != ErrorCode.NONE:
                return None, read.error
            if read.state is not None:
                state = read.state
                break
            if configs is None:
                configs = await self.current_group_configs(key.group_id)
            reset = self.group_config(key.group_id, "share.auto.offset.reset", LATEST, configs)
            start = reset_offset(partition, reset)
            init = (await self.persister.initialize({key: (0, start)}))[key]
            if init.error == ErrorCode.NONE:
                log.info("share group %s: %s-%d starts at offset %d (share.auto.offset.reset=%s)", key.group_id,
                         topic, key.partition, start, reset)
                state = ShareState(start)
                break
            if init.error != ErrorCode.FENCED_STATE_EPOCH:
                return None, init.error
        if state is None:
            return None, ErrorCode.COORDINATOR_NOT_AVAILABLE
        partition, error = rm.leader_partition((topic, key.partition))
        if partition is None or partition.leader_epoch != leader_epoch:
            return None, error if partition is None else ErrorCode.NOT_LEADER_OR_FOLLOWER  # leadership moved
        sp = SharePartition(state.start_offset, delivery_limit=self.delivery_count_limit(key.group_id, configs),
                            max_in_flight=self.max_record_locks(key.group_id, configs), state=state)
        sp.leader_epoch = leader_epoch
        self.configured(key, sp, configs)
        self.partitions[key] = sp
        self._schedule_due(key, sp)
        if configs is not None:
            self._first_configs[key] = configs
        if sp.recovering:  # restored dead letters: written before the crash, or not
            self.dead_letter_writer.kick(key)
        return sp, ErrorCode.NONE

    def acquire(self, key: SharePartitionKey, sp: SharePartition, topic: str, member_id: str,
                max_records: int, max_bytes: int, record_limit: bool = False) -> FetchedPartition:
        """Read from where the share partition needs records and acquire what it may (at most
        `max_records` with `record_limit`, else in whole batches)."""
        rm = self.broker.replica_manager
        tp = (topic, key.partition)
        partition, error = rm.leader_partition(tp)
        if partition is None:
            return FetchedPartition(error)
        if sp.start_offset < partition.log.local_log_start_offset:
            sp.move_start(partition.log.local_log_start_offset)
        configs = self._first_configs.get(key)
        if configs is not None and self.broker.group_configs.get(key.group_id, {}) == configs:
            configs = self._first_configs.pop(key)  # followed here by now
        self.configured(key, sp, configs)
        now = now_ms()
        offset = sp.fetch_offset(now)
        if offset is None or max_records <= 0:
            return FetchedPartition()
        read_committed = self.read_committed(key.group_id, configs)
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
        seen: list[tuple[LogBatch, int, int]] = []  # each batch handed out, and its bytes

        def batches() -> Iterator[LogBatch]:
            # Headers are parsed as the share partition asks for batches: it stops once it
            # has its records, so a 1 MiB read for a 500-record fetch costs a few headers.
            pos = 0
            while pos + HEADER_SIZE <= len(data):
                h = read_header(data, pos)
                if pos + h.size > len(data):
                    return
                skip = h.is_control or (h.is_transactional and any(
                    t.producer_id == h.producer_id and t.first_offset <= h.base_offset <= t.last_offset
                    for t in aborted))
                # Not-before headers only of batches with records not seen yet.
                not_before = None if skip or not sp.needs_headers(h.base_offset, h.last_offset) else \
                    batch_not_before(data, pos, h)
                batch = LogBatch(h.base_offset, h.last_offset, skip, not_before)
                seen.append((batch, pos, pos + h.size))
                yield batch
                pos += h.size

        acquired = sp.acquire(member_id, batches(), max_records, now,
                              self.lock_duration_ms(key.group_id, configs), record_limit)
        self._schedule_due(key, sp)
        if sp.dead_letters_to_persist:  # restored records past their limit: not waiting for another change
            self.persist_soon([key])
        if not acquired:
            return FetchedPartition()
        self._first_configs.pop(key, None)
        self._schedule_expiry(key, sp)
        first, last = acquired[0].first_offset, acquired[-1].last_offset
        # Send the batches that hold acquired records; the client drops what was not acquired.
        spans = [(start, end) for b, start, end in seen if b.last_offset >= first and b.base_offset <= last]
        return FetchedPartition(records=data[spans[0][0]:spans[-1][1]], acquired=acquired)

    def acknowledge(self, key: SharePartitionKey, sp: SharePartition, member_id: str, batches: list[AckBatch],
                    types: frozenset[int] = ACKNOWLEDGE_TYPES) -> ErrorCode:
        """A member's acknowledgements of one share partition; RENEW locks its records again
        for the group's lock duration from now."""
        renews = any(RENEW in kinds for _, _, kinds in batches)
        if renews and self.group_config(key.group_id, "share.renew.acknowledge.enable", "true").lower() == "false":
            return ErrorCode.INVALID_RECORD_STATE  # the group turned RENEW off (Kafka 4.3)
        delay = self.release_delay_ms(key.group_id)
        self.configured(key, sp)
        error = sp.acknowledge(member_id, batches, now_ms(), self.lock_duration_ms(key.group_id), types, delay)
        if error == ErrorCode.NONE and renews:
            self._schedule_expiry(key, sp)
        if error == ErrorCode.NONE and delay > 0:
            self._schedule_due(key, sp)
        return error

    def _schedule_due(self, key: SharePartitionKey, sp: SharePartition) -> None:
        """A timer at the earliest not-before of the records waiting for one: when they are
        due, the long polls waiting on the partition look again."""
        due = sp.next_due(now_ms())
        if due is None:
            return
        _arm(self._due_timers, key, (max(due - now_ms(), 0) + 1) / 1000, self._due)  # never before it is due

    def _due(self, key: SharePartitionKey) -> None:
        self._due_timers.pop(key, None)
        sp = self.partitions.get(key)
        if sp is None:
            return
        self.wake(key)
        self._schedule_due(key, sp)

    def _schedule_expiry(self, key: SharePartitionKey, sp: SharePartition) -> None:
        deadline = sp.next_lock_deadline()
        if deadline is not None:
            _arm(self._timers, key, max(deadline - now_ms(), 0) / 1000, self._expire)

    def _expire(self, key: SharePartitionKey) -> None:
        self._timers.pop(key, None)
        sp = self.partitions.get(key)
        if sp is None:
            return
        if self.configured(key, sp).expire_locks(now_ms()):
            self.wake(key)
            self.persist_soon([key])
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
        """Group coordinator listener: what a fenced member (its session timed out) holds goes
        back to the group. A member that left is not announced: its final ShareAcknowledge,
        which a closing client sends after its leave heartbeat, acknowledges what it holds and
        closes its share session (when the cache is full, sessions of departed members make
        room first)."""
        self._release(group_id, member_id)

    def release_session(self, session: ShareSession) -> None:
        self._release(session.group_id, session.member_id)

    def connection_closed(self, connection: str) -> None:
        """A client connection closed: the share sessions it opened and did not close are
        removed, and what their members hold here goes back to their groups at once, as Kafka
        4.1 does (a member that closes properly sent its final epoch first; one whose process
        died would otherwise hold its records until their locks expire)."""
        for session in self.sessions.connection_closed(connection):
            log.info("share group %s: member %s's connection closed; its records go back", session.group_id,
                     session.member_id)
            self.release_session(session)

    def _release(self, group_id: str, member_id: str) -> None:
        released = [key for key, sp in self.partitions.items()
                    if key.group_id == group_id and self.configured(key, sp).release_member(member_id)]
        for key in released:
            self.wake(key)
        self.persist_soon(released)

    def persist(self, keys: Iterable[SharePartitionKey]) -> Awaitable[dict[SharePartitionKey, ErrorCode]]:
        """Each key's error once its share partition's changes are with its share coordinator."""
        return self.writer.persist(keys)

    def persist_soon(self, keys: Iterable[SharePartitionKey]) -> None:
        self.writer.persist_soon(keys)

    def _drop(self, key: SharePartitionKey, sp: SharePartition | None = None) -> None:
        """Forget the share partition of `key` here (if it is still `sp`); its state stays
        with its share coordinator."""
        current = self.partitions.get(key)
        if current is None or (sp is not None and current is not sp):
            return
        del self.partitions[key]
        self._first_configs.pop(key, None)
        self.writer.forget(key)
        for timers in (self._timers, self._due_timers, self._archive_timers):
            timer = timers.pop(key, None)
            if timer is not None:
                timer.cancel()

    # --- admin ---------------------------------------------------------------------------------
    def group_ids(self) -> set[str]:
        """Share groups this broker knows of: by their state led here, or a share partition."""
        return self.store.group_ids() | {k.group_id for k in self.partitions}

    def candidate_keys(self, group_id: str, topic_ids: Iterable[uuid.UUID] | None = None) -> list[SharePartitionKey]:
        """The share partitions `group_id` may have state for, on any coordinator: every
        partition of the given topics (default: every topic of the cluster's metadata)."""
        topics = self.broker.metadata_cache.topics
        by_id = {t.topic_id: t for t in topics.values() if not is_internal(t.name)}
        wanted = by_id.keys() if topic_ids is None else [t for t in topic_ids if t in by_id]
        return [SharePartitionKey(group_id, tid, p) for tid in wanted for p in sorted(by_id[tid].partitions)]

    async def summaries(self, keys: list[SharePartitionKey]) -> dict[tuple[uuid.UUID, int], StateResult]:
        """The state summary (start offset, leader epoch, delivery-complete count) of each of
        `keys` that has state (ReadShareGroupStateSummary)."""
        out: dict[tuple[uuid.UUID, int], StateResult] = {}
        for i in range(0, len(keys), _ADMIN_KEYS_PER_CALL):
            for key, r in (await self.persister.summary(keys[i:i + _ADMIN_KEYS_PER_CALL])).items():
                if r.error == ErrorCode.NONE and r.state is not None:
                    out[(key.topic_id, key.partition)] = r
        return out

    async def start_offsets(self, keys: list[SharePartitionKey]) -> dict[tuple[uuid.UUID, int], int]:
        """The start offset of each of `keys` that has state."""
        return {tp: r.state.start_offset for tp, r in (await self.summaries(keys)).items()}

    async def set_start_offsets(self, starts: dict[SharePartitionKey, int]) -> dict[SharePartitionKey, ErrorCode]:
        """AlterShareGroupOffsets (the group has no members): each share partition starts over
        at its offset with nothing in flight, under the next state epoch, which fences the
        share partition its leader holds (it loads the new state)."""
        errors: dict[SharePartitionKey, ErrorCode] = {}
        items: dict[SharePartitionKey, tuple[int, int]] = {}
        for key, r in (await self.persister.summary(list(starts))).items():
            if r.error != ErrorCode.NONE:
                errors[key] = r.error
            else:
                items[key] = (0 if r.state is None else r.state.state_epoch + 1, starts[key])
        for key, r in (await self.persister.initialize(items)).items():
            errors[key] = r.error
            self._drop(key)
        return errors

    async def delete_partitions(self, keys: list[SharePartitionKey]) -> dict[SharePartitionKey, ErrorCode]:
        """DeleteShareGroupOffsets: forget these share partitions (their state is deleted; a
        leader holding one is answered UNKNOWN_TOPIC_OR_PARTITION at its next write)."""
        for key in keys:
            self._drop(key)
        errors: dict[SharePartitionKey, ErrorCode] = {}
        for i in range(0, len(keys), _ADMIN_KEYS_PER_CALL):
            for key, r in (await self.persister.delete(keys[i:i + _ADMIN_KEYS_PER_CALL])).items():
                errors[key] = r.error
        return errors

    async def delete_group_state(self, group_id: str) -> ErrorCode:
        keys = set(self.candidate_keys(group_id)) | set(self.store.keys_of(group_id)) | {
            k for k in self.partitions if k.group_id == group_id}
        errors = await self.delete_partitions(sorted(keys, key=str))
        return next((e for e in errors.values() if e != ErrorCode.NONE), ErrorCode.NONE)

    # --- leadership -----------------------------------------------------------------------------
    def startup(self, replay: ShareReplay) -> None:
        """This broker is now the share coordinator of the state partitions `replay` holds
        (every one it leads at start-up, or one it was elected to lead): their states served
        from now on (until then, COORDINATOR_LOAD_IN_PROGRESS)."""
        self.store.apply(replay)

    def unload(self, index: int) -> None:
        self.loading.pop(index, None)  # a load still running is not applied
        self.store.unload(index)

    def leadership_left(self, topic_id: uuid.UUID, partition: int) -> None:
        """This broker no longer leads the partition (or hosts it): its share partitions are
        dropped here; their state stays with their share coordinators for the next leader."""
        for key in [k for k in self.partitions if k.topic_id == topic_id and k.partition == partition]:
            self._drop(key)

    def topics_deleted(self) -> None:
        """Topics went: the share-partition state of topics no longer in the metadata is
        tombstoned (by the share coordinator of each, for the state led here), as Kafka
        deletes it with the topic."""
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
        self.dead_letter_writer.close()
        for timers in (self._timers, self._due_timers, self._archive_timers):
            for timer in timers.values():
                timer.cancel()
            timers.clear()
        self.writer.close()
        self.persister.close()


def reset_offset(partition: Any, reset: str) -> int:
    """Where share.auto.offset.reset starts a share partition: the log start (earliest; share
    fetches read local logs only, so a tiered log's local start), the first record whose
    timestamp is at or after now minus the duration (by_duration, KIP-1106: the time index, as
    ListOffsets finds a timestamp), else the high watermark (latest, or no record that recent)."""
    log_ = partition.log
    if reset == EARLIEST:
        return log_.local_log_start_offset
    duration = by_duration_ms(reset)
    if duration is not None:
        found = log_.fetch_offset_by_timestamp(now_ms() - duration)
        if found is not None and found[0] < partition.high_watermark:
            return max(found[0], log_.local_log_start_offset)
    return partition.high_watermark


def _arm(timers: dict, key: Any, delay_s: float, callback: Callable[[Any], None]) -> None:
    """One timer per key in `timers`, at the earliest time asked: `callback(key)` in `delay_s`,
    unless the key's timer already fires by then (a later one is replaced)."""
    loop = asyncio.get_running_loop()
    when = loop.time() + delay_s
    timer = timers.get(key)
    if timer is not None:
        if timer.when() <= when:
            return
        timer.cancel()
    timers[key] = loop.call_at(when, callback, key)
