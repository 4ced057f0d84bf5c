"""The `strom` sink: the columns and rules of Spark's Kafka sink, written by librdkafka's
idempotent producer from Arrow batches.

Delivery is at-least-once: every task flushes and checks every delivery before it reports
success, and the idempotent producer (acks=all) never duplicates a record through its own
retries; but a task or micro-batch that Spark runs again writes its records again."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
from confluent_kafka import KafkaError, Producer
from pyspark import TaskContext
from pyspark.sql import DataFrame
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructType

from strom.spark.offsets import Admin
from strom.spark.options import SinkOptions, StromOptionError
from strom.spark.schema import HEADERS

FLUSH_TIMEOUT_S = 180.0
OVERWRITE_REFUSED = ("Save mode Overwrite is not allowed for the strom sink: Kafka topics are append-only "
                     "(use mode 'append', or leave the mode unset)")


@dataclass
class SinkCommit(WriterCommitMessage):
    records: int


def check_schema(schema: StructType, opts: SinkOptions) -> None:
    """Spark's Kafka sink rules for the input columns, checked on the driver."""
    types = {f.name: f.dataType for f in schema.fields}
    text = (StringType(), BinaryType())
    if "value" not in types:
        raise StromOptionError("Required attribute 'value' not found in the data written to the strom sink")
    rules = [
        ("value", types["value"] in text, "string or binary"),
        ("key", types.get("key", BinaryType()) in text, "string or binary"),
        ("topic", types.get("topic", StringType()) == StringType(), "string"),
        ("partition", types.get("partition", IntegerType()) == IntegerType(), "int"),
        ("headers", types.get("headers", HEADERS) == HEADERS, "array<struct<key:string,value:binary>>"),
    ]
    for name, ok, wanted in rules:
        if not ok:
            raise StromOptionError(f"The {name} column must be of type {wanted}, not {types[name].simpleString()}")
    if opts.topic is None and "topic" not in types:
        raise StromOptionError("The strom sink needs a topic: set the 'topic' option, or write a 'topic' "
                               "column (the option wins when both are there)")


def _driver_checks(opts: SinkOptions, schema: StructType) -> None:
    check_schema(schema, opts)
    if TaskContext.get() is None:  # on the driver (tasks build the writer too)
        Admin(opts.client).topics()  # an unreachable broker fails here, in bounded time


def producer_conf(opts: SinkOptions, errors: list[KafkaError], **extra: object) -> dict:
    user = opts.client.conf
    # As the Java producer: idempotent by default, unless acks is set to something other than
    # all and idempotence is not asked for explicitly (then it is quietly off).
    weaker = user.get("acks", "all").strip().lower() not in ("all", "-1")
    idempotent = "enable.idempotence" in user or not weaker
    timeout = opts.client.request_timeout_ms
    return opts.client.client_conf(**{
        "enable.idempotence": idempotent,
        "acks": "all",
        **({"request.timeout.ms": timeout} if timeout else {}),
        "linger.ms": 20,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 1_000_000,
        "delivery.timeout.ms": 120_000,
        "partitioner": "murmur2_random",  # the Java client's: same key, same partition as Spark's sink
        "delivery.report.only.error": True,
        "on_delivery": lambda err, _msg: errors.append(err) if err else None,
        **extra,
    })


def produce_all(producer: Producer, opts: SinkOptions, batches: Iterator[pa.RecordBatch]) -> int:
    """Queue every row of every batch; returns the count. Delivery is checked by the caller. A
    full queue waits for deliveries, at most max.block.ms per record (Java's bound on send())."""
    max_block_s = (opts.client.max_block_ms if opts.client.max_block_ms is not None else 60_000) / 1000
    count = 0
    for batch in batches:
        n = batch.num_rows
        names = batch.schema.names
        col = {name: batch.column(name).to_pylist() for name in
               ("key", "value", "topic", "partition", "headers") if name in names}
        values = col["value"]
        keys = col.get("key") or [None] * n
        topics = [opts.topic] * n if opts.topic else col["topic"]
        partitions = col.get("partition") or [None] * n
        headers = col.get("headers") or [None] * n
        for topic, value, key, partition, hdrs in zip(topics, values, keys, partitions, headers, strict=True):
            if topic is None:
                raise ValueError("null topic in the data written to the strom sink; set the 'topic' option")
            extra = {"headers": [(h["key"], h["value"]) for h in hdrs]} if hdrs else {}
            part = -1 if partition is None else partition  # -1: the partitioner chooses
            blocked = None
            while True:
                try:
                    producer.produce(topic, value, key, part, **extra)
                    break
                except BufferError:  # queue full: let deliveries drain
                    blocked = blocked or time.monotonic()
                    if time.monotonic() - blocked > max_block_s:
                        raise TimeoutError(f"the producer queue stayed full for max.block.ms "
                                           f"({max_block_s * 1000:.0f} ms)") from None
                    producer.poll(0.1)
        producer.poll(0)
        count += n
    return count


def write_task(opts: SinkOptions, batches: Iterator[pa.RecordBatch]) -> SinkCommit:
    errors: list[KafkaError] = []
    producer = Producer(producer_conf(opts, errors))
    count = produce_all(producer, opts, batches)
    check_delivered(producer, errors)
    return SinkCommit(count)


def check_delivered(producer: Producer, errors: list[KafkaError]) -> None:
    left = producer.flush(FLUSH_TIMEOUT_S)
    if errors:
        raise RuntimeError(f"{len(errors)} record(s) were not written by the strom sink, first error: {errors[0]}")
    if left:
        raise RuntimeError(f"{left} record(s) still unacknowledged after {FLUSH_TIMEOUT_S:.0f} s")


def foreach_batch(**options: str) -> Callable[[DataFrame, int], None]:
    """A `foreachBatch` function writing each micro-batch to the strom sink: the way to
    `outputMode("update")`, which PySpark's Python streaming writers cannot take (Spark's
    writer builder for them supports append and complete only). At-least-once, like the sink."""
    def write(df: DataFrame, batch_id: int) -> None:
        df.write.format("strom").options(**options).mode("append").save()

    return write


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, opts: SinkOptions, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise StromOptionError(OVERWRITE_REFUSED)
        if opts.transactional_id_prefix:
            raise StromOptionError("transactionalIdPrefix is for streaming writes (writeStream) only")
        _driver_checks(opts, schema)
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        return write_task(self.opts, iterator)


class StreamWriter(DataSourceStreamArrowWriter):
    """At-least-once by default: each micro-batch's tasks flush before they succeed, commit has
    nothing left to do, and a replayed batch is written again. Exactly-once with the option
    transactionalIdPrefix (see txn.py)."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        _driver_checks(opts, schema)
        self.opts = opts
        self.prefix = opts.transactional_id_prefix

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        if self.prefix:
            from strom.spark import txn

            return txn.write_task(self.opts, self.prefix, iterator)
        return write_task(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.prefix:
            from strom.spark import txn

            txn.commit_batch(self.opts, self.prefix, messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.prefix:
            from strom.spark import txn

            txn.abort_batch(self.opts, self.prefix, messages, batchId)
