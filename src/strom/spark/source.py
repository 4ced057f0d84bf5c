"""The `strom` data source: batch and streaming reads planned on the driver (one task per
partition offset range), read by tasks (fetch.py).

Spark runs each step in its own Python process (the lookup of data sources, creating the
source, planning, each task, each commit), and every one of them imports this module first:
what only some steps need (the Kafka clients, the record decoder, Arrow) is imported where
it is used, so that a planning step does not pay for the decoder's imports."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from strom.spark import ranges as off
from strom.spark.options import (
    EARLIEST,
    LATEST,
    SourceOptions,
    StromOptionError,
    data_loss,
    sink_options,
    source_options,
)
from strom.spark.schema import source_schema

if TYPE_CHECKING:
    import pyarrow as pa

    from strom.spark.offsets import Admin

log = logging.getLogger("strom.spark")


class StromDataSource(DataSource):
    """Spark's Kafka source and sink, as a Python data source named `strom`."""

    @classmethod
    def name(cls) -> str:
        return "strom"

    def schema(self) -> StructType:
        # Spark asks for the schema when the DataFrame is defined (load()), reads only: the
        # time to refuse a bad option, before a stream starts.
        opts = source_options(self.options, batch=None)
        base = source_schema(opts.include_headers)
        if not opts.formats:
            return base
        from strom.spark.typed import plan, typed_schema  # the reader schemas, from the registry

        return typed_schema(base, plan(opts.formats))

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = source_options(self.options, batch=True)
        return BatchReader(opts, _typed(opts, schema), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = source_options(self.options, batch=False)
        return StreamReader(opts, _typed(opts, schema), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from strom.spark.sink import BatchWriter

        return BatchWriter(sink_options(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from strom.spark.sink import StreamWriter

        return StreamWriter(sink_options(self.options), schema)


def _typed(opts: SourceOptions, schema: StructType) -> tuple:
    """The typed columns' plans (typed.ColumnPlan), with the reader schemas the query's
    columns were planned with."""
    if not opts.formats:
        return ()
    from strom.spark.typed import plan

    return plan(opts.formats, seen=schema)


def _input_partitions(ranges: list[off.Range], opts: SourceOptions) -> list[InputPartition]:
    ranges = [r for r in ranges if r.size > 0]
    if not opts.latest_by_key:  # else one task sees a whole partition: the latest of a key is in it
        ranges = off.split(ranges, opts.min_partitions, opts.max_records_per_partition)
    if opts.remote_storage and opts.direct_remote_reads:
        from strom.spark.remote import plan  # tiered offsets: which segments of the store hold them

        return [InputPartition(r) for r in plan(opts, ranges)]
    return [InputPartition(r) for r in ranges]


def _read(opts: SourceOptions, partition: InputPartition | None, typed: tuple = (),
          schema: StructType | None = None) -> Iterator[pa.RecordBatch]:
    batches = _read_binary(opts, partition)
    if typed:
        from strom.spark.typed import decode_batches

        batches = decode_batches(batches, typed, schema)
    yield from batches


def _read_binary(opts: SourceOptions, partition: InputPartition | None) -> Iterator[pa.RecordBatch]:
    from strom.spark.fetch import read_range

    r = getattr(partition, "value", None)
    if r is None:  # with no partitions planned, Spark still reads one, empty
        return
    if getattr(r, "segments", None) is not None:  # a TieredRange: the store first, then the broker
        from strom.spark.fetch import Rows, batch_rows
        from strom.spark.remote import read_tiered

        batches = read_tiered(opts, r, lambda part: read_range(opts, part), Rows, batch_rows(opts))
    else:
        batches = read_range(opts, r)
    if opts.latest_by_key:
        yield from latest_by_key(batches, opts.include_headers)
    else:
        yield from batches


def latest_by_key(batches: Iterator[pa.RecordBatch], include_headers: bool) -> Iterator[pa.RecordBatch]:
    """A partition as a table: the last record of each key, unless its value is null (a
    tombstone deletes the key); records without a key are left out. What a compacted topic
    holds once fully cleaned, whether or not the cleaner has run."""
    import pyarrow as pa

    from strom.spark.schema import arrow_schema

    table = pa.Table.from_batches(list(batches), schema=arrow_schema(include_headers))
    last: dict[bytes, int] = {}
    for i, key in enumerate(table.column("key").to_pylist()):
        if key is not None:
            last[key] = i
    deleted = table.column("value").is_null().to_pylist()
    keep = pa.array(sorted(i for i in last.values() if not deleted[i]), pa.int64())
    yield from table.take(keep).to_batches()


class BatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions, typed: tuple = (), schema: StructType | None = None) -> None:
        self.opts = opts
        self.typed, self.schema = typed, schema

    def partitions(self) -> Sequence[InputPartition]:
        from strom.spark.offsets import Admin

        opts = self.opts
        admin = Admin.of(opts)
        parts = admin.partitions(opts, batch=True)
        start = admin.resolve(opts.starting, parts, opts.by_timestamp_strategy, missing=EARLIEST)
        # An ending timestamp after the last record means the end, as in Spark.
        end = admin.resolve(opts.ending, parts, "latest", missing=LATEST, name="endingOffsets")
        if isinstance(opts.ending, dict):
            log_end = admin.latest(parts)
            beyond = [f"{t}-{p} (asked {end[t, p]}, ends at {log_end[t, p]})" for t, p in parts
                      if end[t, p] > log_end[t, p]]
            if beyond:
                raise StromOptionError(f"endingOffsets is beyond the end of the log of {', '.join(beyond)}: "
                                       "use -1 (latest) to read to the end")
        ranges = []
        for tp in parts:
            if start[tp] > end[tp]:
                raise ValueError(f"The starting offset {start[tp]} of {tp[0]}-{tp[1]} is after its "
                                 f"ending offset {end[tp]} (startingOffsets / endingOffsets)")
            ranges.append(off.Range(tp[0], tp[1], start[tp], end[tp]))
        return _input_partitions(ranges, opts)

    def read(self, partition: InputPartition | None) -> Iterator[pa.RecordBatch]:
        yield from _read(self.opts, partition, self.typed, self.schema)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are Spark's Kafka source JSON, {"topic": {"0": 42}}, journaled in the checkpoint;
    this object lives in one driver-side Python process for the query's lifetime (the tasks
    build their own from the data source)."""

    def __init__(self, opts: SourceOptions, typed: tuple = (), schema: StructType | None = None) -> None:
        self.opts = opts
        self.typed, self.schema = typed, schema
        self._admin: Admin | None = None
        self._target: off.Offsets | None = None  # Trigger.AvailableNow: read no further
        self._last_batch = time.monotonic()  # for minOffsetsPerTrigger's maxTriggerDelay

    @property
    def admin(self) -> Admin:
        if self._admin is None:
            from strom.spark.offsets import Admin

            self._admin = Admin.of(self.opts)
        return self._admin

    def initialOffset(self) -> dict:
        parts = self.admin.partitions(self.opts)
        return off.to_json(self.admin.resolve(self.opts.starting, parts, self.opts.by_timestamp_strategy,
                                              missing=EARLIEST))

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.opts.max_offsets_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.admin.latest(self.admin.partitions(self.opts))

    def reportLatestOffset(self) -> dict | None:
        return off.to_json(self.admin.latest(self.admin.partitions(self.opts)))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = self._known(off.from_json(start))
        latest = self.admin.latest(begin)
        if self._target is not None:  # partitions new since the trigger started stay where they are
            latest = {tp: min(o, self._target.get(tp, begin[tp])) for tp, o in latest.items()}
        end = {}
        for tp, b in begin.items():
            if latest[tp] < b:
                data_loss(self.opts, f"{tp[0]}-{tp[1]} now ends at offset {latest[tp]}, before "
                                     f"offset {b} that was already read (truncated or recreated?)")
            end[tp] = latest[tp]
        if isinstance(limit, ReadMaxRows):
            end = rate_limit(begin, end, limit.max_rows)
        if self._too_few(begin, end):
            return off.to_json(begin)  # no micro-batch yet: wait for more records or the delay
        self._last_batch = time.monotonic()
        return off.to_json(end)

    def _too_few(self, begin: off.Offsets, end: off.Offsets) -> bool:
        """minOffsetsPerTrigger: hold back a micro-batch with fewer new offsets, until
        maxTriggerDelay has passed since the last one (Spark's rule; never for AvailableNow)."""
        wanted = self.opts.min_offsets_per_trigger
        if wanted is None or self._target is not None:
            return False
        if (time.monotonic() - self._last_batch) * 1000 >= self.opts.max_trigger_delay_ms:
            return False
        return sum(end[tp] - begin.get(tp, end[tp]) for tp in end) < wanted

    def _known(self, begin: off.Offsets) -> off.Offsets:
        """`begin` plus partitions that appeared since (from their earliest offset), minus those
        that are gone (data loss: the topic was deleted)."""
        parts = self.admin.partitions(self.opts)
        gone = sorted(set(begin) - set(parts))
        if gone:
            data_loss(self.opts, f"Partitions {', '.join(f'{t}-{p}' for t, p in gone)} are gone")
        new = [tp for tp in parts if tp not in begin]
        if new:
            log.info("strom source: new partitions %s, read from their earliest offsets", new)
        known = {tp: o for tp, o in begin.items() if tp in parts}
        known.update(self.admin.earliest(new))
        return known

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, stop = off.from_json(start), off.from_json(end)
        new = [tp for tp in stop if tp not in begin]
        begin.update(self.admin.earliest(new))
        low = self.admin.earliest([tp for tp in stop if stop[tp] > begin[tp]])
        ranges = []
        for tp, e in stop.items():
            b = begin[tp]
            if tp in low and b < low[tp]:
                data_loss(self.opts, f"Offsets {b}-{min(low[tp], e) - 1} of {tp[0]}-{tp[1]} were to be "
                                     f"read but the log now starts at {low[tp]}")
                b = min(low[tp], e)
            ranges.append(off.Range(tp[0], tp[1], b, e))
        return _input_partitions(ranges, self.opts)

    def read(self, partition: InputPartition | None) -> Iterator[pa.RecordBatch]:
        yield from _read(self.opts, partition, self.typed, self.schema)

    def commit(self, end: dict) -> None:
        pass  # progress lives in Spark's checkpoint; nothing is committed to Kafka

    def stop(self) -> None:
        self._admin = None


def rate_limit(begin: off.Offsets, end: off.Offsets, max_rows: int) -> off.Offsets:
    """At most `max_rows` offsets over all partitions, shared in proportion to each one's lag
    (as Spark's Kafka source does); the rounding remainder goes to the largest lags."""
    lag = {tp: end[tp] - begin[tp] for tp in end if end[tp] > begin[tp]}
    total = sum(lag.values())
    if total <= max_rows:
        return end
    out = dict(end)
    share = {tp: lag[tp] * max_rows // total for tp in lag}
    left = max_rows - sum(share.values())
    for tp in sorted(lag, key=lambda tp: lag[tp] - share[tp], reverse=True):
        if left <= 0:
            break
        extra = min(left, lag[tp] - share[tp])
        share[tp] += extra
        left -= extra
    for tp in lag:
        out[tp] = begin[tp] + share[tp]
    return out
