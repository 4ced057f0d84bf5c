"""The translation of one partition a broker leads into its topic's Iceberg table.

A PartitionTranslator long-polls read_committed Fetches of its partition over the broker's own
connection (so tiered history is read as any consumer reads it), keeps the committed batches it
got, and every iceberg.commit.interval.ms (sooner past a size bound) decodes them, converts them
to an Arrow table and commits it, with the partition's next offset, in one catalog commit. All
of that (decoding, conversion, Parquet writes, catalog calls) runs in the translation's
executor; the loop only fetches and hands over.

It starts from the partition's entry in the table (none: the log start), and a commit goes
through only from that entry (table.py): when another leader moved it, the batch is dropped and
reading resumes from the table's entry. A catalog that cannot be reached stops translation (the
batch is kept, reading waits) until it can; produce is not involved.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from strom.client.topic_io import FETCH_MAX_WAIT_MS, READ_COMMITTED, PartitionTail
from strom.protocol.errors import ErrorCode
from strom.protocol.records import BatchHeader, CorruptRecordError, Record, iter_records
from strom.tables.errors import TableGone, TableRefused
from strom.tables.settings import IcebergSettings

log = logging.getLogger(__name__)

T = TypeVar("T")
FETCH_MAX_BYTES = 1 << 20
REFUSED_RECHECK_S = 30.0  # a table Strom may not touch is looked at again this often (quietly)
EXECUTOR_THREADS = 2

# Fetched batches kept for the next commit: (the answer's records, its kept batches, the first
# offset wanted: a fetch may answer from the start of the batch holding it).
Pending = tuple[bytes, list[tuple[int, BatchHeader]], int]


class CatalogHealth:
    """One log line when the catalog stops answering and one when it answers again, however many
    translators try meanwhile."""

    def __init__(self) -> None:
        self.down = False

    def failed(self, what: str, error: BaseException) -> None:
        if not self.down:
            self.down = True
            log.warning("Iceberg catalog unavailable (%s: %s: %s); translation waits until it answers",
                        what, type(error).__name__, error)

    def answered(self) -> None:
        if self.down:
            self.down = False
            log.info("Iceberg catalog available again; translation goes on")


class Translation:
    """What a broker's translators share: the settings, the catalog (opened on first use, in
    the executor: pyiceberg is imported only there), the executor and the catalog's health."""

    def __init__(self, settings: IcebergSettings, schema_source: Any = None) -> None:
        self.settings = settings
        self.schema_source = schema_source  # values.SchemaSource: the broker's registry, if it runs one
        self.executor = ThreadPoolExecutor(EXECUTOR_THREADS, thread_name_prefix="iceberg")
        self.health = CatalogHealth()
        self._catalog: Any = None
        self._lock = threading.Lock()

    def catalog(self) -> Any:
        """The catalog, opened once (called in the executor)."""
        with self._lock:
            if self._catalog is None:
                from strom.tables.table import open_catalog

                self._catalog = open_catalog(self.settings)
            return self._catalog

    async def run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


def converter_for(mode: str, topic: str, schema_source: Any) -> Any:
    """The record -> row converter of an iceberg.mode (called in the executor)."""
    if mode == "key_value":
        from strom.tables.key_value import KeyValueConverter

        return KeyValueConverter()
    if schema_source is None:
        raise TableRefused(f"iceberg.mode {mode} reads the schema registry, which this broker does not run "
                           "(schema.registry.listeners)")
    from strom.tables.values import SchemaConverter

    return SchemaConverter(mode, topic, schema_source)


class PartitionTranslator(PartitionTail):
    leaderless_wait_s = 0.5

    def __init__(self, broker: Any, translation: Translation, topic: str, partition: int, topic_id: str,
                 mode: str, spec: str, properties: str) -> None:
        super().__init__(broker, topic, partition, f"broker-{broker.broker_id}-iceberg", FETCH_MAX_BYTES, log,
                         isolation_level=READ_COMMITTED)
        self.translation = translation
        self.settings = translation.settings
        self.topic_id = topic_id
        self.mode = mode
        self.spec = spec
        self.properties = properties
        self.table: Any = None  # table.TopicTable once loaded
        self.converter: Any = None
        self.start_offset: int | None = None  # the partition's entry in the table (None: none yet)
        self.next_offset = 0  # where reading goes on
        self.pending: list[Pending] = []
        self.pending_bytes = 0
        self.last_commit = 0.0
        self.refusal: str | None = None  # why the table is not translated into, logged once
        self.past_end_logged = False
        self.closed = False
        self.dead_letters: Any = None  # the <topic>~dlq TopicTable of a schema mode
        self.dead_letter_count = 0
        # Lag: the partition's last stable offset as last fetched, and the newest timestamp
        # (ms) of the records the table holds as far as this translator committed them.
        self.log_end: int | None = None
        self.committed_timestamp: int | None = None

    # --- the tail's hooks --------------------------------------------------------------------
    def reading(self) -> bool:
        return not self.closed

    async def refused(self, state: Any, backoff: float) -> None:
        await asyncio.sleep(REFUSED_RECHECK_S if self.refusal is not None else backoff)

    async def read_once(self, leader: int, leader_epoch: int) -> bool:
        if self.table is None:
            return await self._load()
        loop = asyncio.get_running_loop()
        due = self.last_commit + self.settings.commit_interval_s
        if self.pending and (loop.time() >= due or self.pending_bytes >= self.settings.commit_max_bytes):
            return await self._commit()
        wait_ms = FETCH_MAX_WAIT_MS
        if self.pending:
            wait_ms = max(0, min(wait_ms, int((due - loop.time()) * 1000)))
        position = self.next_offset
        error, answer = await self.fetch(leader, leader_epoch, position, wait_ms)
        if answer is None:
            return False
        if error == ErrorCode.OFFSET_OUT_OF_RANGE:
            return self._out_of_range(position, answer)
        if error == ErrorCode.NONE:
            stable = getattr(answer, "last_stable_offset", -1)
            self.log_end = stable if stable is not None and stable >= 0 else answer.high_watermark
        self.past_end_logged = False
        fetched = self.batches(answer.records or b"", position)
        if fetched is None:
            return False
        batches = [(pos, h) for pos, h in fetched if h.last_offset >= position]
        if not batches:
            return not fetched  # an answer of only what was read already: no busy loop over it
        data = answer.records
        kept = self.committed(data, batches, answer)
        if kept:
            self.pending.append((data, kept, position))
            self.pending_bytes += sum(h.size for _, h in kept)
        self.next_offset = batches[-1][1].last_offset + 1
        return True

    def _out_of_range(self, position: int, answer: Any) -> bool:
        if position < answer.log_start_offset:
            if self.start_offset is not None or self.pending:
                log.warning("%s: offsets %d to %d were deleted before they were translated", self.label,
                            position, answer.log_start_offset - 1)
            self.next_offset = answer.log_start_offset
            return True
        if not self.past_end_logged:  # the log lost what the table holds (an unclean election)
            self.past_end_logged = True
            log.warning("%s: the table %s holds offsets up to %d, past the log's end %d; waiting for the log",
                        self.label, self.table.name, position, answer.high_watermark)
        return False

    # --- the table ---------------------------------------------------------------------------
    async def _load(self) -> bool:
        was_refused = self.refusal is not None

        def load() -> tuple[Any, dict[str, int]]:
            from strom.tables.table import TopicTable

            converter = converter_for(self.mode, self.topic, self.translation.schema_source)
            catalog = self.translation.catalog()
            table = TopicTable(catalog, self.settings.namespace, self.topic, self.topic_id,
                               converter, self.spec, self.properties)
            offsets = table.load()
            if getattr(converter, "evolves", False):
                from strom.tables.values import DeadLetterConverter

                self.dead_letters = TopicTable(catalog, self.settings.namespace, f"{self.topic}~dlq", self.topic_id,
                                               DeadLetterConverter(), self.spec, self.properties)
            return table, offsets

        try:
            table, offsets = await self.translation.run(load)
        except TableRefused as e:
            self.translation.health.answered()
            if self.refusal is None:
                log.warning("%s: the Iceberg table %s.%s is not translated into: %s; it is left as it is",
                            self.label, self.settings.namespace, self.topic, e)
            self.refusal = str(e)
            return False
        except Exception as e:  # the catalog cannot be reached, or answers what it should not
            self.translation.health.failed(f"loading {self.settings.namespace}.{self.topic}", e)
            return False
        self.translation.health.answered()
        if was_refused:
            log.info("%s: the Iceberg table %s is translated into now", self.label, table.name)
        self.refusal = None
        self.table, self.converter = table, table.converter
        self._resume(offsets.get(str(self.partition)))
        log.info("%s: translating into the Iceberg table %s from %s", self.label, table.name,
                 "the log start" if self.start_offset is None else f"offset {self.start_offset}")
        self.last_commit = asyncio.get_running_loop().time()
        return True

    def _resume(self, start: int | None) -> None:
        """Read from the table's entry on: what was read since is dropped."""
        self.start_offset = start
        self.next_offset = 0 if start is None else start
        self.pending, self.pending_bytes = [], 0

    async def _commit(self) -> bool:
        start, end, pending = self.start_offset, self.next_offset, self.pending

        def commit() -> int | None:
            records = _records(self.label, pending)
            if self.dead_letters is None:
                return self.table.commit(self.partition, start, end, self.converter.convert(self.partition, records))
            from strom.tables.table import commit_with_dead_letters

            moved, dead = commit_with_dead_letters(self.table, self.dead_letters, self.partition, start, end, records)
            self.dead_letter_count += dead
            return moved

        newest = max((h.max_timestamp for _, kept, _ in pending for _, h in kept), default=None)

        try:
            moved = await self.translation.run(commit)
        except (TableRefused, TableGone) as e:  # the table changed hands or went: load it again
            log.warning("%s: the Iceberg table %s changed (%s); loading it again", self.label, self.table.name,
                        e or type(e).__name__)
            self.table = None
            return False
        except Exception as e:
            self.translation.health.failed(f"committing to {self.table.name}", e)
            return False
        self.translation.health.answered()
        self.last_commit = asyncio.get_running_loop().time()
        if moved is None:
            self.start_offset = end
            self.pending, self.pending_bytes = [], 0
            if newest is not None and newest >= 0:
                self.committed_timestamp = max(newest, self.committed_timestamp or newest)
            return True
        entry = None if moved < 0 else moved
        log.info("%s: the table %s holds offsets up to %s, not %s: another leader translated them; "
                 "offsets %s to %d dropped here, reading from %s", self.label, self.table.name, entry, start,
                 start, end - 1, entry)
        self._resume(entry)
        return True

    def lag(self, now_ms: int) -> tuple[int, float] | None:
        """(offsets, seconds) the table is behind the partition's last stable offset: the
        records not yet committed to the table, and the age of the oldest of them (its batch's
        first timestamp once fetched; before that, how long since the newest record committed).
        None until the table is loaded and a fetch answered."""
        if self.table is None or self.log_end is None:
            return None
        if not self.pending:  # what was read since the entry held no row (markers, aborted records)
            translated = self.next_offset
        else:
            translated = self.start_offset if self.start_offset is not None else self.pending[0][2]
        offsets = max(0, self.log_end - translated)
        if offsets == 0:
            return 0, 0.0
        oldest = next((h.base_timestamp for _, kept, _ in self.pending for _, h in kept if h.base_timestamp >= 0),
                      self.committed_timestamp)
        return offsets, max(0.0, (now_ms - oldest) / 1000) if oldest is not None else 0.0

    async def close(self) -> None:
        self.closed = True
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        self.close_conn()


def _records(label: str, pending: list[Pending]) -> Iterator[tuple[Record, int]]:
    """The records of the kept batches, each with its timestamp type (0 CreateTime, 1
    LogAppendTime)."""
    for data, kept, first in pending:
        for pos, header in kept:
            try:
                for record in iter_records(data, pos):
                    if record.offset >= first:
                        yield record, int(header.log_append_time)
            except CorruptRecordError as e:
                log.warning("%s: skipped the batch at offset %d: %s", label, header.base_offset, e)
