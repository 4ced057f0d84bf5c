"""Task side of a read: one librdkafka consumer reads one offset range of one partition and
hands Spark Arrow record batches built column by column (no per-row tuples: that is the fast
path of a Python data source)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from operator import itemgetter

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from strom.spark.offsets import Range
from strom.spark.options import SourceOptions
from strom.spark.schema import arrow_schema

log = logging.getLogger("strom.spark")

CONSUME_MAX = 20_000  # messages per consume() call
BATCH_ROWS = 20_000  # rows per Arrow batch handed to Spark (the last one may be smaller)
WATERMARK_TIMEOUT_S = 15.0
GONE = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
DENIED = {KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
          KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.SASL_AUTHENTICATION_FAILED,
          KafkaError._AUTHENTICATION}


class StromDataLossError(RuntimeError):
    """Offsets the query must read no longer exist (retention, DeleteRecords, a deleted topic)."""


def data_loss(opts: SourceOptions, what: str) -> None:
    """Fail or warn, as failOnDataLoss says."""
    if opts.fail_on_data_loss:
        raise StromDataLossError(
            f"{what}. Some data may have been lost because it is no longer in Kafka: aged out by "
            "retention, removed by DeleteRecords, or the topic was deleted. Set the source option "
            "failOnDataLoss=false to skip it with a warning instead.")
    log.warning("%s; skipping it (failOnDataLoss=false)", what)


def consumer(opts: SourceOptions) -> Consumer:
    return Consumer(opts.client.client_conf(**{
        "group.id": "strom-spark",  # librdkafka wants one; nothing is ever committed
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",  # an offset that is gone must surface, not be skipped
        "enable.partition.eof": True,  # tells where the log ends: the tail may be gaps
        "fetch.wait.max.ms": 20,
        "fetch.max.bytes": 64 << 20,
        "max.partition.fetch.bytes": 16 << 20,
        "queued.min.messages": 1_000_000,  # keep fetching ahead: 4x faster than 100k
        "socket.connection.setup.timeout.ms": 10_000,
    }))


def read_range(opts: SourceOptions, r: Range) -> Iterator[pa.RecordBatch]:
    """Records with offsets in [r.start, r.end) of one partition, as Arrow batches. Offsets
    missing inside the range (compaction, transaction markers, aborted data) are not data loss;
    a start below the log start offset is."""
    c = consumer(opts)
    try:
        start = _checked_start(c, opts, r)
        if start >= r.end:
            return
        tp = TopicPartition(r.topic, r.partition, start)
        c.assign([tp])
        rows = Rows(r.topic, r.partition, opts.include_headers)
        position = start
        deadline = time.monotonic() + opts.poll_timeout_ms / 1000
        while position < r.end:
            msgs = c.consume(CONSUME_MAX, 0.5)
            if not msgs:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"Cannot fetch offset {position} of {r.topic}-{r.partition} from "
                        f"{opts.client.bootstrap} in {opts.poll_timeout_ms} ms (kafkaConsumer.pollTimeoutMs)")
                continue
            deadline = time.monotonic() + opts.poll_timeout_ms / 1000
            good = msgs
            if any(map(Message.error, msgs)):
                good = [m for m in msgs if m.error() is None]
                position = max(position, _on_errors(c, opts, r, [m for m in msgs if m.error()], position))
            if good:
                if good[-1].offset() >= r.end:
                    good = [m for m in good if m.offset() < r.end]
                    position = r.end
                if good:
                    position = max(position, good[-1].offset() + 1)
                    rows.add(good)
            if len(rows) >= BATCH_ROWS:
                yield rows.flush()
        if len(rows):
            yield rows.flush()
    finally:
        c.close()


def _checked_start(c: Consumer, opts: SourceOptions, r: Range) -> int:
    low, _ = _watermarks(c, r)
    if r.start < low:
        data_loss(opts, f"Offsets {r.start}-{min(low, r.end) - 1} of {r.topic}-{r.partition} were "
                        f"to be read but the log now starts at {low}")
        return low
    return r.start


def _watermarks(c: Consumer, r: Range) -> tuple[int, int]:
    try:
        return c.get_watermark_offsets(TopicPartition(r.topic, r.partition), timeout=WATERMARK_TIMEOUT_S)
    except KafkaException as e:
        raise RuntimeError(f"Could not list offsets of {r.topic}-{r.partition}: {e.args[0]}") from None


def _on_errors(c: Consumer, opts: SourceOptions, r: Range, errors: list[Message], position: int) -> int:
    """Handle consumer error events; returns the position reading has reached."""
    for m in errors:
        err: KafkaError = m.error()
        if err.code() == KafkaError._PARTITION_EOF:
            if m.offset() >= r.end:
                return r.end  # the log goes on past the range: what is left of it were gaps
            data_loss(opts, f"{r.topic}-{r.partition} ends at offset {m.offset()}, before offset "
                            f"{r.end} that was there when the read was planned (truncated or recreated?)")
            return r.end
        if err.code() in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET):
            # Deleted while we read: fail, or go on from the new log start.
            low, high = _watermarks(c, r)
            if position >= high:
                data_loss(opts, f"{r.topic}-{r.partition} now ends at offset {high}, before offset "
                                f"{position} that was there when the read was planned")
                return r.end
            low = _checked_start(c, opts, Range(r.topic, r.partition, position, r.end))
            if low >= r.end:
                return r.end
            c.assign([TopicPartition(r.topic, r.partition, low)])
            return low
        if err.code() in GONE:
            data_loss(opts, f"{r.topic}-{r.partition} no longer exists ({err.str()})")
            return r.end
        if err.fatal() or err.code() in DENIED:
            raise KafkaException(err)
        # Anything else (a broker restarting, a connection lost) librdkafka retries by itself;
        # kafkaConsumer.pollTimeoutMs bounds how long nothing may arrive.
        log.warning("reading %s-%s: %s (retrying)", r.topic, r.partition, err)
    return position


class Rows:
    """Messages collected column-wise into Arrow arrays of Spark's Kafka schema."""

    def __init__(self, topic: str, partition: int, include_headers: bool) -> None:
        self.topic, self.partition, self.include_headers = topic, partition, include_headers
        self.schema = arrow_schema(include_headers)
        self.msgs: list[Message] = []

    def __len__(self) -> int:
        return len(self.msgs)

    def add(self, msgs: list[Message]) -> None:
        self.msgs.extend(msgs)

    def flush(self) -> pa.RecordBatch:
        # map() over the unbound methods: the cheapest per-row call Python has (this loop is
        # the read path's cost; Message.timestamp() alone is ~0.4 us a row).
        msgs, self.msgs = self.msgs, []
        n = len(msgs)
        stamps = list(map(Message.timestamp, msgs))
        kinds = {kind for kind, _ in stamps}
        ts_type = self.schema.field("timestamp").type
        columns = [
            pa.array(list(map(Message.key, msgs)), pa.binary()),
            pa.array(list(map(Message.value, msgs)), pa.binary()),
            pa.array([self.topic] * n, pa.string()),
            pa.array([self.partition] * n, pa.int32()),
            pa.array(list(map(Message.offset, msgs)), pa.int64()),
            pc.multiply(pa.array(list(map(itemgetter(1), stamps)), pa.int64()), 1000).view(ts_type),
            # librdkafka numbers timestamp types from 1 (CreateTime); Kafka's Java client from 0.
            pa.array([kinds.pop() - 1] * n if len(kinds) == 1 else [k - 1 for k, _ in stamps], pa.int32()),
        ]
        if self.include_headers:
            columns.append(self._headers(msgs))
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def _headers(self, msgs: list[Message]) -> pa.Array:
        """array<struct<key,value>>, null for a record without headers (as Spark gives)."""
        ends, keys, values, none = [0], [], [], []
        for m in msgs:
            headers = m.headers()
            none.append(not headers)
            for k, v in headers or ():
                keys.append(k)
                values.append(v)
            ends.append(len(keys))
        list_type = self.schema.field("headers").type
        struct = pa.StructArray.from_arrays([pa.array(keys, pa.string()), pa.array(values, pa.binary())],
                                            fields=list(list_type.value_type))
        return pa.ListArray.from_arrays(pa.array(ends, pa.int32()), struct, type=list_type,
                                        mask=pa.array(none, pa.bool_()))
