"""Dead-letter topics for share groups (KIP-1191's design): a record a share group gives up on,
rejected by a member (REJECT) or out of deliveries (the group's delivery count limit), is
written to the group's dead-letter topic by the leader of the record's partition.

Kafka's names and rules:
- group configs `errors.deadletterqueue.topic.name` (blank, the default: no dead letters) and
  `errors.deadletterqueue.copy.record.enable` (false: the dead letter carries Kafka's headers
  alone; true: the source record's key, value and headers too: a Strom choice, Kafka copies
  key and value only; a reader tells the two apart by the `__dlq.errors.` prefix, which
  follows the source's headers);
- the topic must opt in with its topic config `errors.deadletterqueue.group.enable=true`, its
  name start with the broker config `errors.deadletterqueue.topic.name.prefix` ("dlq." by
  default; blank: any name) and never with "__"; a topic that does not exist is created
  (partitions and replication factor the broker's defaults, the opt-in set, CreateTime) only
  with `errors.deadletterqueue.auto.create.topics.enable=true`. The broker writes, as itself:
  these rules, not the members' ACLs, decide which topic may receive dead letters.
- each dead letter: headers `__dlq.errors.topic`, `.partition`, `.offset`, `.group`,
  `.delivery.count`, `.message` (Kafka's two causes), the time of the write as its timestamp,
  partition = source partition modulo the topic's partitions.
A group whose topic breaks a rule gets its records archived without a dead letter, logged
with Kafka's message (as Kafka's writer fails the record's dead letter and archives it).

Exactly once per archived record, across failovers. A pending dead letter is a persisted
Strom-only record state (share_partition.py); it is written here only after the state write
that holds it succeeded, and archived only after its dead letter is in the topic (acks=all).
Each share partition writes its dead letters one batch at a time, in the order they became
ready. So after a crash (a new leader restores pending records) or after a write whose outcome
is unknown (a lost connection, a timeout, NOT_ENOUGH_REPLICAS_AFTER_APPEND), the share
partition first looks in the topic for the pending offsets: it waits until the dead-letter
partition's high watermark reaches its log end (OffsetForLeaderEpoch answers the leader's log
end), so that an append of the old leader's is either readable or gone, then reads the
partition backwards from the high watermark in growing chunks, looking at the headers of its
own dead letters (same group, topic and partition), newest first. Every one whose offset is
pending was written: it is archived. The first of its own that is not pending ends the search:
being written one batch at a time, and a batch archived only once written, everything older
was archived before the pending state was persisted. What was not found is written. The cost
of the search is the dead letters written to that partition since the share partition's last
one, and it runs only after a crash or an unknown outcome.

Bounds: what is pending is part of the share partition's window (`group.share.partition.max.
record.locks` in flight, the window does not move past a pending dead letter); a batch holds
at most MAX_DEAD_LETTERS_PER_BATCH records and MAX_BATCH_BYTES; up to MAX_WRITES_IN_FLIGHT
share partitions write at once. Source records are read from the local log and batches built
and parsed in the executor; the event loop only sends and waits.

Not covered: a dead-letter topic renamed or its partitions added while records are pending
(the search looks in the new partition; a dead letter may then be written twice); a leader
that lost leadership and still runs (it checks that it leads before each write, which narrows
the window but does not close it); source records only in remote storage are written
without key, value or headers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from strom.client.inter_broker import ConnectionPool
from strom.client.topic_io import (
    FETCH,
    FETCH_TIMEOUT_S,
    NETWORK_ERRORS,
    PRODUCE,
    PRODUCE_VERSION,
    RETRIABLE,
    create_or_await,
    error_code,
)
from strom.coordinator.share.share_partition import DEAD_LETTER_REJECTED, SharePartition
from strom.coordinator.share.state_store import SharePartitionKey
from strom.protocol.errors import ErrorCode, KafkaError
from strom.protocol.records import (
    CorruptRecordError,
    Record,
    build_batch,
    iter_records,
    scan_valid_prefix,
)

log = logging.getLogger(__name__)

TOPIC_NAME, COPY_RECORD = "errors.deadletterqueue.topic.name", "errors.deadletterqueue.copy.record.enable"
TOPIC_ENABLE = "errors.deadletterqueue.group.enable"  # the topic's opt-in
PREFIX, AUTO_CREATE = "errors.deadletterqueue.topic.name.prefix", "errors.deadletterqueue.auto.create.topics.enable"
# What a dead letter copies of its source record (copy.record.enable): key, value, headers.
SourceRecord = tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]

HEADER_TOPIC, HEADER_PARTITION, HEADER_OFFSET = "__dlq.errors.topic", "__dlq.errors.partition", "__dlq.errors.offset"
HEADER_GROUP, HEADER_DELIVERY_COUNT = "__dlq.errors.group", "__dlq.errors.delivery.count"
HEADER_MESSAGE = "__dlq.errors.message"
CLIENT_REJECT = "Offset rejected by client."
DELIVERY_COUNT_EXCEEDED = "Offset delivery count exceeded the threshold."

MAX_DEAD_LETTERS_PER_BATCH = 500
MAX_BATCH_BYTES = 1 << 20
MAX_WRITES_IN_FLIGHT = 8
_READ_BYTES = 1 << 20
_SCAN_FIRST, _SCAN_MAX = 512, 65536  # offsets read per step of the backward search
_PRODUCE_TIMEOUT_S = 30.0
_SETTLE_TIMEOUT_S = 15.0  # for the partition's high watermark to reach its log end
_BACKOFF_S, _MAX_BACKOFF_S = 0.1, 5.0
_CREATE_WAIT_S = 30.0
OFFSET_FOR_LEADER_EPOCH = 23
# Of the answers a write is tried again after, those after which the batch may have been
# appended (looked for before it is written again), and the others: surely not appended.
_MAYBE_APPENDED = frozenset({ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                             ErrorCode.KAFKA_STORAGE_ERROR})
_NOT_APPENDED = RETRIABLE - _MAYBE_APPENDED


class Refused(Exception):
    """The group's dead letters cannot go to its topic (Kafka's message): archived without."""


class TryAgain(Exception):
    """Not now (no leader, a lost connection): the same work later."""


class _Unknown(TryAgain):
    """A call whose outcome is not known (a lost connection, a timeout): a write may be in the
    topic."""


@dataclass(frozen=True, slots=True)
class Settings:
    topic: str
    copy_record: bool


def group_settings(configs: Mapping[str, str]) -> Settings | None:
    """The group's dead-letter topic and copy option; None when it has no topic."""
    topic = configs.get(TOPIC_NAME, "")
    if not topic:
        return None
    return Settings(topic, configs.get(COPY_RECORD, "false").lower() == "true")


def check_topic(group: str, topic: str, exists: bool, enabled: bool, auto_create: bool, prefix: str) -> str | None:
    """Kafka's checks of a group's dead-letter topic, in its order: None, or why not."""
    if not topic:
        return f"Configured DLQ topic name in share group: {group} is empty."
    if topic.startswith("__"):
        return f"Configured DLQ topic name in share group: {group} cannot start with __, topic: {topic}."
    if exists and not enabled:
        return f"DLQ is not enabled on configured DLQ topic for share group: {group}, topic: {topic}."
    if not exists and not auto_create:
        return (f"DLQ topic does not exist and auto create is disabled on cluster for share group: {group}, "
                f"topic: {topic}.")
    if prefix and not topic.startswith(prefix):
        return (f"Configured DLQ topic name does not comply with the DLQ topic prefix in share group: {group}, "
                f"topic: {topic}, prefix: {prefix}.")
    return None


def dead_letter_headers(group: str, topic: str, partition: int, offset: int, delivery_count: int,
                        reason: int) -> tuple[tuple[str, bytes], ...]:
    return ((HEADER_TOPIC, topic.encode()), (HEADER_PARTITION, str(partition).encode()),
            (HEADER_OFFSET, str(offset).encode()), (HEADER_GROUP, group.encode()),
            (HEADER_DELIVERY_COUNT, str(delivery_count).encode()),
            (HEADER_MESSAGE, (CLIENT_REJECT if reason == DEAD_LETTER_REJECTED else DELIVERY_COUNT_EXCEEDED).encode()))


def build_dead_letters(letters: list[tuple[int, int, int]], sources: Mapping[int, SourceRecord],
                       group: str, topic: str, partition: int, timestamp: int, max_bytes: int) -> tuple[bytes, list[int]]:
    """One batch of dead letters for (offset, delivery count, reason) in order, as many as fit
    in `max_bytes` (at least one): the batch and the source offsets it holds."""
    records, included, size = [], [], 61  # a batch header
    for i, (offset, count, reason) in enumerate(letters):
        key, value, own = sources.get(offset, (None, None, ()))
        headers = (*own, *dead_letter_headers(group, topic, partition, offset, count, reason))
        grows = 24 + len(key or b"") + len(value or b"") + sum(len(k) + len(v or b"") + 4 for k, v in headers)
        if records and size + grows > max_bytes:
            break
        records.append(Record(i, timestamp, key, value, headers))
        included.append(offset)
        size += grows
    return build_batch(records, timestamp=timestamp), included


def source_records(data: bytes, wanted: set[int]) -> tuple[dict[int, SourceRecord], int]:
    """Key, value and headers of the `wanted` offsets among the batches of `data`, and the
    offset after the last whole batch (-1: none)."""
    batches, _ = scan_valid_prefix(data)
    found: dict[int, SourceRecord] = {}
    after = -1
    for pos, header in batches:
        after = header.last_offset + 1
        if header.is_control or header.last_offset < min(wanted, default=0):
            continue
        try:
            for record in iter_records(data, pos):
                if record.offset in wanted:
                    found[record.offset] = (record.key, record.value, tuple(record.headers))
        except CorruptRecordError:
            continue
    return found, after


def own_dead_letters(data: bytes, begin: int, end: int, group: str, topic: str, partition: int
                     ) -> tuple[list[int], int]:
    """The source offsets, in log order, of the dead letters in `data` at [begin, end) that
    `group` wrote for `topic`-`partition`, and the offset after the last whole batch (-1: none)."""
    batches, _ = scan_valid_prefix(data)
    mine: list[int] = []
    after = -1
    wanted = {HEADER_GROUP: group.encode(), HEADER_TOPIC: topic.encode(), HEADER_PARTITION: str(partition).encode()}
    for pos, header in batches:
        if header.base_offset >= end:
            break
        after = header.last_offset + 1
        if header.is_control:
            continue
        try:
            for record in iter_records(data, pos):
                if record.offset >= end:
                    break
                if record.offset < begin:
                    continue
                headers = dict(record.headers)
                if all(headers.get(k) == v for k, v in wanted.items()):
                    try:
                        mine.append(int(headers.get(HEADER_OFFSET) or b"-1"))
                    except ValueError:
                        continue
        except CorruptRecordError:
            continue
    return mine, after


class DeadLetterWriter:
    """Writes the dead letters of the share partitions this broker leads: one task per share
    partition with work, at most MAX_WRITES_IN_FLIGHT writing at once."""

    def __init__(self, broker: Any, partitions: Mapping[SharePartitionKey, SharePartition],
                 changed: Callable[[SharePartitionKey], None]) -> None:
        self.broker = broker
        self.partitions = partitions
        self.changed = changed  # dead letters were archived: persist the share partition, wake its polls
        self.pool = ConnectionPool(broker, 2)
        self.written: dict[tuple[str, str], int] = {}  # (group, dead-letter topic) -> dead letters written
        self.dropped: dict[tuple[str, str], int] = {}  # archived without one (the topic refused them)
        self._tasks: dict[SharePartitionKey, asyncio.Task] = {}
        self._slots = asyncio.Semaphore(MAX_WRITES_IN_FLIGHT)
        self._closed = False

    def kick(self, key: SharePartitionKey) -> None:
        """The share partition of `key` has dead letters ready or to look for."""
        running = self._tasks.get(key)
        if self._closed or (running is not None and not running.done()):  # it looks again before it ends
            return
        task = asyncio.get_running_loop().create_task(self._run(key), name=f"dead letters {key.coordinator_key}")
        self._tasks[key] = task
        task.add_done_callback(lambda t: self._tasks.pop(key, None) if self._tasks.get(key) is t else None)

    def close(self) -> None:
        self._closed = True
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()
        self.pool.close()

    # --- one share partition's work ---------------------------------------------------------
    async def _run(self, key: SharePartitionKey) -> None:
        sp = self.partitions.get(key)
        backoff = _BACKOFF_S
        while sp is not None and self.partitions.get(key) is sp and (sp.ready or sp.recovering):
            if self._closed or self.broker.stopping:
                return
            try:
                async with self._slots:
                    await self._step(key, sp)
                backoff = _BACKOFF_S
            except Refused as e:
                self._drop(key, sp, str(e))
            except TryAgain as e:
                log.info("share group %s: dead letters of %s wait: %s", key.group_id, key.coordinator_key, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
            except Exception:  # noqa: BLE001 - the share partition's window must not stay held for good
                log.exception("share group %s: writing dead letters of %s failed", key.group_id, key.coordinator_key)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)

    def _drop(self, key: SharePartitionKey, sp: SharePartition, why: str, offsets: set[int] | None = None) -> None:
        """Archive `offsets` (default: every dead letter waiting) without dead letters."""
        offsets = sp.ready | sp.recovering if offsets is None else offsets
        log.warning("share group %s: %d records of %s archived without a dead letter: %s", key.group_id,
                    len(offsets), key.coordinator_key, why)
        settings = group_settings(self.broker.group_configs.get(key.group_id, {}))
        label = (key.group_id, settings.topic if settings else "")
        self.dropped[label] = self.dropped.get(label, 0) + len(offsets)
        if sp.dead_letters_written(offsets):
            self.changed(key)

    async def _step(self, key: SharePartitionKey, sp: SharePartition) -> None:
        settings = group_settings(self.broker.group_configs.get(key.group_id, {}))
        if settings is None:
            raise Refused(f"Configured DLQ topic name in share group: {key.group_id} is empty.")
        source_topic = self.broker.metadata_cache.names_by_id.get(key.topic_id)
        if source_topic is None:
            raise Refused("the source topic is gone")
        partitions = await self._topic(key.group_id, settings.topic)
        target = key.partition % partitions
        if sp.recovering:
            wanted = set(sp.recovering)
            found = await self._search(settings.topic, target, key.group_id, source_topic, key.partition, wanted)
            for offset in wanted - found:
                if sp.dead_letter(offset) is not None:
                    sp.ready.add(offset)
            sp.recovering -= wanted
            if found:
                log.info("share group %s: %d dead letters of %s were written before; archived", key.group_id,
                         len(found), key.coordinator_key)
                if sp.dead_letters_written(found):
                    self.changed(key)
            return
        letters = []
        for offset in sorted(sp.ready)[:MAX_DEAD_LETTERS_PER_BATCH]:
            record = sp.dead_letter(offset)
            if record is None:
                sp.ready.discard(offset)
            else:
                letters.append((offset, record.delivery_count, record.state))
        if not letters:
            return
        self._still_leader(source_topic, key, sp)
        sources = await self._sources(source_topic, key.partition, [o for o, _, _ in letters]) \
            if settings.copy_record else {}
        loop = asyncio.get_running_loop()
        max_bytes = min(MAX_BATCH_BYTES, await self._max_message_bytes(settings.topic))
        batch, included = await loop.run_in_executor(
            None, build_dead_letters, letters, sources, key.group_id, source_topic, key.partition,
            int(time.time() * 1000), max_bytes)
        self._still_leader(source_topic, key, sp)
        try:
            await self._produce(settings.topic, target, batch)
        except _Unknown:  # maybe appended: looked for before anything is written again
            sp.ready.difference_update(included)
            sp.recovering.update(included)
            raise
        except Refused as e:  # this batch (a record too large, say): the others may still go
            self._drop(key, sp, str(e), set(included))
            return
        label = (key.group_id, settings.topic)
        self.written[label] = self.written.get(label, 0) + len(included)
        if sp.dead_letters_written(included):
            self.changed(key)

    def _still_leader(self, topic: str, key: SharePartitionKey, sp: SharePartition) -> None:
        # (a leader's epoch also moves with ISR changes: whether it still leads is the question;
        # a share partition outlives no leadership change here, leadership_left drops it)
        partition, _ = self.broker.replica_manager.leader_partition((topic, key.partition))
        if partition is None or self.partitions.get(key) is not sp:
            raise TryAgain("no longer the partition's leader")  # the loop ends: the share partition went

    # --- the topic ---------------------------------------------------------------------------
    async def _topic(self, group: str, topic: str) -> int:
        """The dead-letter topic's partition count, once Kafka's checks pass (made if asked)."""
        broker = self.broker
        meta = broker.metadata_cache.topics.get(topic)
        configs = await broker.read_topic_configs(topic) if meta is not None else {}
        why = check_topic(group, topic, meta is not None, configs.get(TOPIC_ENABLE, "false").lower() == "true",
                          bool(broker.config[AUTO_CREATE]), broker.config[PREFIX])
        if why is not None:
            raise Refused(why)
        if meta is None:
            factor = max(1, min(broker.config["default.replication.factor"], len(broker.metadata_cache.live_brokers)))
            try:
                if await create_or_await(broker, topic, broker.config["num.partitions"], factor,
                                         {TOPIC_ENABLE: "true", "message.timestamp.type": "CreateTime"},
                                         _CREATE_WAIT_S):
                    log.info("share group %s: created its dead-letter topic %s", group, topic)
            except KafkaError as e:
                if e.code in (ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.NOT_CONTROLLER,
                              ErrorCode.REQUEST_TIMED_OUT):
                    raise TryAgain(str(e)) from None
                raise Refused(f"DLQ topic {topic} cannot be created: {e}") from None
            meta = broker.metadata_cache.topics.get(topic)
            if meta is None:
                raise TryAgain(f"{topic} is not in the metadata yet")
        if not meta.partitions:
            raise TryAgain(f"{topic} has no partitions yet")
        return len(meta.partitions)

    async def _max_message_bytes(self, topic: str) -> int:
        configs = await self.broker.read_topic_configs(topic)
        try:
            return int(configs.get("max.message.bytes") or self.broker.config["message.max.bytes"])
        except (ValueError, KeyError):
            return MAX_BATCH_BYTES

    def _leader(self, topic: str, partition: int) -> tuple[int, int]:
        state = self.broker.metadata_cache.partition(topic, partition)
        if state is None or state.leader < 0:
            raise TryAgain(f"{topic}-{partition} has no leader")
        return state.leader, state.leader_epoch

    async def _call(self, leader: int, api_key: int, version: int, fields: dict, timeout_s: float) -> Any:
        try:
            return await self.pool.call(leader, api_key, version, fields, timeout_s)
        except NETWORK_ERRORS as e:
            raise _Unknown(f"broker {leader}: {e or type(e).__name__}") from None

    async def _produce(self, topic: str, partition: int, batch: bytes) -> None:
        leader, _ = self._leader(topic, partition)
        body = await self._call(leader, PRODUCE, PRODUCE_VERSION, {
            "transactional_id": None, "acks": -1, "timeout_ms": int(_PRODUCE_TIMEOUT_S * 1000),
            "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": batch}]}]},
            _PRODUCE_TIMEOUT_S + 5.0)
        answer = next((p for t in body.responses if t.name == topic for p in t.partition_responses
                       if p.index == partition), None)
        error = error_code(answer.error_code) if answer is not None else ErrorCode.UNKNOWN_SERVER_ERROR
        if error == ErrorCode.NONE:
            return
        if error in _NOT_APPENDED:
            raise TryAgain(f"{topic}-{partition} at broker {leader}: {error.name}")
        if error in _MAYBE_APPENDED or error == ErrorCode.UNKNOWN_SERVER_ERROR:
            raise _Unknown(f"{topic}-{partition} at broker {leader}: {error.name}")
        raise Refused(f"{topic}-{partition} at broker {leader} refused them: {error.name}")

    # --- reading ------------------------------------------------------------------------------
    async def _sources(self, topic: str, partition: int, offsets: list[int]) -> dict[int, SourceRecord]:
        """Key, value and headers of the source records at `offsets`, from the local log (what
        it no longer has locally is left out)."""
        rm = self.broker.replica_manager
        loop = asyncio.get_running_loop()
        wanted, found = set(offsets), {}
        position, last = min(offsets), max(offsets)
        while position <= last:
            result = rm.read((topic, partition), position, _READ_BYTES, min_one_message=True)
            if result.error != ErrorCode.NONE or result.records is None or not result.records.size:
                break
            data = result.records.read_bytes()
            got, after = await loop.run_in_executor(None, source_records, data, wanted)
            found.update(got)
            if after <= position:
                break
            position = after
        return found

    async def _fetch(self, leader: int, epoch: int, topic: str, partition: int, offset: int) -> Any:
        body = await self._call(leader, FETCH, 12, {
            "replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": _READ_BYTES, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "topics": [{"topic": topic, "partitions": [{
                "partition": partition, "current_leader_epoch": epoch, "fetch_offset": offset,
                "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": _READ_BYTES}]}],
            "forgotten_topics_data": [], "rack_id": ""}, FETCH_TIMEOUT_S)
        answer = next((p for t in body.responses if t.topic == topic for p in t.partitions
                       if p.partition_index == partition), None)
        error = error_code(body.error_code)
        if error == ErrorCode.NONE and answer is not None:
            error = error_code(answer.error_code)
        if answer is None or error not in (ErrorCode.NONE, ErrorCode.OFFSET_OUT_OF_RANGE):
            raise TryAgain(f"fetch of {topic}-{partition} from broker {leader}: {error.name}")
        return answer

    async def _settled(self, topic: str, partition: int) -> tuple[int, int, int, int]:
        """(leader, leader epoch, log start, high watermark) once the high watermark reached
        the log end the leader had when asked: every append made before is readable or gone."""
        leader, epoch = self._leader(topic, partition)
        body = await self._call(leader, OFFSET_FOR_LEADER_EPOCH, 4, {"replica_id": -1, "topics": [{
            "topic": topic, "partitions": [{"partition": partition, "current_leader_epoch": epoch,
                                            "leader_epoch": epoch}]}]}, 10.0)
        answer = next((p for t in body.topics if t.topic == topic for p in t.partitions
                       if p.partition == partition), None)
        if answer is None or answer.error_code != 0 or answer.end_offset < 0:
            raise TryAgain(f"the log end of {topic}-{partition} at broker {leader} is not known")
        deadline = asyncio.get_running_loop().time() + _SETTLE_TIMEOUT_S
        while True:
            fetched = await self._fetch(leader, epoch, topic, partition, answer.end_offset)
            if fetched.high_watermark >= answer.end_offset:
                return leader, epoch, fetched.log_start_offset, fetched.high_watermark
            if asyncio.get_running_loop().time() > deadline:
                raise TryAgain(f"{topic}-{partition}'s high watermark stays below its log end")
            await asyncio.sleep(0.05)

    async def _search(self, topic: str, partition: int, group: str, source: str, source_partition: int,
                      pending: set[int]) -> set[int]:
        """Which of the `pending` source offsets have a dead letter in `topic`-`partition`."""
        leader, epoch, start, end = await self._settled(topic, partition)
        loop = asyncio.get_running_loop()
        found: set[int] = set()
        chunk = _SCAN_FIRST
        while end > start:
            begin = max(start, end - chunk)
            mine: list[int] = []
            position = begin
            while position < end:
                answer = await self._fetch(leader, epoch, topic, partition, position)
                data = answer.records or b""
                if not data:
                    break
                got, after = await loop.run_in_executor(None, own_dead_letters, data, begin, end, group, source,
                                                        source_partition)
                mine += got
                if after <= position:
                    break
                position = after
            for offset in reversed(mine):
                if offset not in pending:
                    return found  # older than every pending one: the search ends
                found.add(offset)
            if found >= pending:
                return found
            end = begin
            chunk = min(chunk * 2, _SCAN_MAX)
        return found


