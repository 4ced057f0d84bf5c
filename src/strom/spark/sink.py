"""The `strom` sink: the columns and rules of Spark's Kafka sink, written by librdkafka's
idempotent producer from Arrow batches (produce.py).

Delivery is at-least-once: every task flushes and checks every delivery before it reports
success, and the idempotent producer (acks=all) never duplicates a record through its own
retries; but a task or micro-batch that Spark runs again writes its records again. With
`transactionalIdPrefix`, writes within a streaming query (writeStream, or df.write in
foreachBatch) are exactly-once per micro-batch (txn.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark import TaskContext
from pyspark.sql import DataFrame
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, DataType, IntegerType, StringType, StructType

from strom.spark import txn
from strom.spark.offsets import Admin
from strom.spark.options import SinkOptions, StromOptionError
from strom.spark.produce import Delivery, producer, write_task
from strom.spark.schema import HEADERS

if TYPE_CHECKING:
    import pyarrow as pa

OVERWRITE_REFUSED = ("Save mode Overwrite is not allowed for the strom sink: Kafka topics are append-only "
                     "(use mode 'append', or leave the mode unset)")


@dataclass
class SinkCommit(WriterCommitMessage):
    records: int


def _is(actual: DataType, *wanted: DataType) -> bool:
    """Whether `actual` is one of `wanted`, nullability aside (as Spark's KafkaWriter checks)."""
    return any(actual.simpleString() == w.simpleString() for w in wanted)


def check_schema(schema: StructType, opts: SinkOptions) -> None:
    """Spark's Kafka sink rules for the input columns, checked on the driver."""
    types = {f.name: f.dataType for f in schema.fields}
    if "value" not in types:
        raise StromOptionError("Required attribute 'value' not found in the data written to the strom sink")
    typed = {f.column for f in opts.formats}  # encoded from their own types (typed_sink.py)
    rules = [
        ("value", "value" in typed or _is(types["value"], StringType(), BinaryType()), "string or binary"),
        ("key", "key" in typed or _is(types.get("key", BinaryType()), StringType(), BinaryType()),
         "string or binary"),
        ("topic", _is(types.get("topic", StringType()), StringType()), "string"),
        ("partition", _is(types.get("partition", IntegerType()), IntegerType()), "int"),
        ("headers", _is(types.get("headers", HEADERS), HEADERS), HEADERS.simpleString()),
    ]
    for name, ok, wanted in rules:
        if not ok:
            raise StromOptionError(f"The {name} column must be of type {wanted}, not {types[name].simpleString()}")
    if opts.topic is None and "topic" not in types:
        raise StromOptionError("The strom sink needs a topic: set the 'topic' option, or write a 'topic' "
                               "column (the option wins when both are there)")


def _driver_checks(opts: SinkOptions, schema: StructType) -> None:
    check_schema(schema, opts)
    for f in opts.formats:
        if f.column not in schema.fieldNames():
            raise StromOptionError(f"{f.column}Format={f.kind} but the data written has no {f.column} column")
    if TaskContext.get() is None:  # on the driver (tasks build the writer too)
        Admin(opts.client).topics()  # an unreachable broker fails here, in bounded time
        producer(opts, Delivery(opts.client.bootstrap))  # librdkafka checks the settings here, not in each task


def foreach_batch(**options: str) -> Callable[[DataFrame, int], None]:
    """A `foreachBatch` function writing each micro-batch to the strom sink, the way to
    `outputMode("update")` (PySpark's Python streaming writers take append and complete
    only). At-least-once, like the sink; exactly-once with the option `transactionalIdPrefix`
    (unique per query, stable across its restarts): each micro-batch is written in
    transactions committed once per batch id, and a batch Spark runs again after a failure is
    not written twice. Spark's rule for that: the batch's output must be the same each time
    it runs (as it is for aggregations over a Kafka source)."""
    def write(df: DataFrame, batch_id: int) -> None:
        df.write.format("strom").options(**options).mode("append").save()

    return write


def _sink_plans(opts: SinkOptions, schema: StructType) -> tuple:
    """Typed columns' schemas (typed_sink.SinkPlan), registered where they are not yet."""
    if not opts.formats:
        return ()
    from strom.spark.typed_sink import plan_sink

    return plan_sink(opts.formats, schema)


def _write(opts: SinkOptions, prefix: str | None, plans: tuple, schema: StructType,
           iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
    if plans:
        from strom.spark.typed_sink import encode_batches

        iterator = encode_batches(iterator, plans, schema)
    if prefix:
        return txn.write_task(opts, prefix, iterator)
    return SinkCommit(write_task(opts, iterator))


class BatchWriter(DataSourceArrowWriter):
    """df.write: at-least-once; with transactionalIdPrefix (within foreachBatch only), the
    micro-batch's exactly-once write."""

    def __init__(self, opts: SinkOptions, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise StromOptionError(OVERWRITE_REFUSED)
        _driver_checks(opts, schema)
        self.opts = opts
        self.prefix = opts.transactional_id_prefix
        self.schema, self.typed = schema, _sink_plans(opts, schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _write(self.opts, self.prefix, self.typed, self.schema, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.prefix:
            txn.commit_batch(self.opts, self.prefix, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.prefix:
            txn.abort_batch(self.opts, self.prefix, messages)


class StreamWriter(DataSourceStreamArrowWriter):
    """At-least-once by default: each micro-batch's tasks flush before they succeed, commit has
    nothing left to do, and a replayed batch is written again. Exactly-once with the option
    transactionalIdPrefix (see txn.py)."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        _driver_checks(opts, schema)
        self.opts = opts
        self.prefix = opts.transactional_id_prefix
        self.schema, self.typed = schema, _sink_plans(opts, schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _write(self.opts, self.prefix, self.typed, self.schema, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.prefix:
            txn.commit_batch(self.opts, self.prefix, messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.prefix:
            txn.abort_batch(self.opts, self.prefix, messages, batchId)
