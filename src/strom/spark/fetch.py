"""Task side of a read: one offset range of one partition -> Arrow record batches built column
by column (no per-row tuples: that is the fast path of a Python data source).

Two ways to fetch, one way to build columns (`Rows`):
- raw (plain TCP, the default): Fetch requests straight to the partition leader (wire.py),
  record batches decoded by aiokafka's C decoder: ~3x the rows per second of librdkafka's
  per-message objects;
- librdkafka (`Consumer`): for what the raw client does not speak (TLS, SASL, ...).
"""

from __future__ import annotations

import gc
import logging
import struct
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from operator import attrgetter, itemgetter

import pyarrow as pa
import pyarrow.compute as pc
from aiokafka.record.memory_records import MemoryRecords
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from strom.spark import clients
from strom.spark.options import SourceOptions, StromDataLossError, data_loss  # noqa: F401 - re-exported
from strom.spark.ranges import Range
from strom.spark.schema import arrow_schema
from strom.spark.wire import RETRIABLE, KafkaProtocolError, PartitionClient, PartitionGone

log = logging.getLogger("strom.spark")

BATCH_ROWS = 20_000  # rows per Arrow batch handed to Spark, and per consume() call (kafka.max.poll.records)
WATERMARK_TIMEOUT_S = 15.0
GONE = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
DENIED = {KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
          KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.SASL_AUTHENTICATION_FAILED,
          KafkaError._AUTHENTICATION}
FETCH_MAX_BYTES = 32 << 20  # per Fetch and per partition, unless kafka.fetch.max.bytes /
FETCH_WAIT_MS = 100  # kafka.max.partition.fetch.bytes / kafka.fetch.max.wait.ms say otherwise
SOCKET_TIMEOUT_S = 30.0
RETRY_BACKOFF_S = 0.2
OFFSET_OUT_OF_RANGE = 1
def raw_fetch_ok(conf: Mapping[str, str]) -> bool:
    """Whether the raw client can serve this client configuration: plain TCP, no auth. (TLS
    and SASL settings mean nothing without a security.protocol that uses them; jobs often
    carry them all the same, e.g. ssl.endpoint.identification.algorithm.)"""
    return conf.get("security.protocol", "plaintext").lower() == "plaintext"


def batch_rows(opts: SourceOptions) -> int:
    """Rows per Arrow batch: kafka.max.poll.records, the most records one poll hands over."""
    return opts.client.max_poll_records or BATCH_ROWS


def read_range(opts: SourceOptions, r: Range) -> Iterator[pa.RecordBatch]:
    """Records with offsets in [r.start, r.end) of one partition, as Arrow batches. Offsets
    missing inside the range (compaction, transaction markers, aborted data) are not data loss;
    a start below the log start offset is."""
    read = read_raw if raw_fetch_ok(opts.client.conf) else read_librdkafka
    rows = batch_rows(opts)
    for batch in read(opts, r):
        for begin in range(0, batch.num_rows, rows):
            yield batch.slice(begin, rows)


def _checked_start(low: int, opts: SourceOptions, r: Range) -> int:
    """Where reading may start given the log start offset `low`; below it is data loss."""
    if r.start < low:
        data_loss(opts, f"Offsets {r.start}-{min(low, r.end) - 1} of {r.topic}-{r.partition} were "
                        f"to be read but the log now starts at {low}")
        return low
    return r.start


def _out_of_range(low: int, high: int, opts: SourceOptions, r: Range, position: int) -> int:
    """Deleted while we read: fail, or go on from the new log start. Returns the new position."""
    if position >= high:
        data_loss(opts, f"{r.topic}-{r.partition} now ends at offset {high}, before offset "
                        f"{position} that was there when the read was planned")
        return r.end
    return _checked_start(low, opts, Range(r.topic, r.partition, position, r.end))


def _log_ends(opts: SourceOptions, r: Range, end: int) -> None:
    """Reading reached the end of the log at `end`: past the range, what is left of it were gaps."""
    if end < r.end:
        data_loss(opts, f"{r.topic}-{r.partition} ends at offset {end}, before offset "
                        f"{r.end} that was there when the read was planned (truncated or recreated?)")


def _timeout(opts: SourceOptions, r: Range, position: int) -> TimeoutError:
    return TimeoutError(f"Cannot fetch offset {position} of {r.topic}-{r.partition} from "
                        f"{opts.client.bootstrap} in {opts.poll_timeout_ms} ms (kafkaConsumer.pollTimeoutMs)")


def _deadline(opts: SourceOptions) -> float:
    return time.monotonic() + opts.poll_timeout_ms / 1000


# --- raw path -------------------------------------------------------------------------------

def read_raw(opts: SourceOptions, r: Range) -> Iterator[pa.RecordBatch]:
    """The range by Fetch requests to the partition leader; batches of any size."""
    timeout_ms = opts.client.request_timeout_ms or SOCKET_TIMEOUT_S * 1000
    client = PartitionClient(opts.client.bootstrap, r.topic, r.partition,
                             min(timeout_ms, opts.poll_timeout_ms) / 1000,
                             opts.client_id)
    conf = opts.client.conf
    wait_ms = int(conf.get("fetch.wait.max.ms", FETCH_WAIT_MS))
    max_bytes = int(conf.get("fetch.max.bytes", FETCH_MAX_BYTES))
    partition_bytes = int(conf.get("max.partition.fetch.bytes", FETCH_MAX_BYTES))
    min_bytes = int(conf.get("fetch.min.bytes", 1))
    level = 1 if opts.isolation_level == "read_committed" else 0
    rows = Rows(r.topic, r.partition, opts.include_headers)
    limit = batch_rows(opts)
    position, deadline = r.start, _deadline(opts)
    try:
        while position < r.end:
            try:
                got = client.fetch(position, level, wait_ms, max_bytes, partition_bytes, min_bytes)
                if got.error_code == OFFSET_OUT_OF_RANGE:
                    position = _out_of_range(*client.watermarks(level), opts, r, position)
                    continue
                if got.error_code:
                    raise KafkaProtocolError(f"Fetch {r.topic}-{r.partition}", got.error_code)
            except PartitionGone as e:
                data_loss(opts, f"{r.topic}-{r.partition} no longer exists ({e})")
                break
            except (OSError, KafkaProtocolError) as e:
                _before_retry(client, opts, r, position, deadline, e)
                continue
            reached = rows.add_records(got.records, position, r.end, got.aborted if level else None)
            if reached > position:
                position, deadline = reached, _deadline(opts)
            # Nothing more is in the log now: the rest of the range were gaps (or were lost).
            log_end = got.last_stable_offset if level else got.high_watermark
            if position >= log_end:
                _log_ends(opts, r, log_end)
                break
            if time.monotonic() > deadline:
                raise _timeout(opts, r, position)
            if len(rows) >= limit:
                yield rows.flush()
        if len(rows):
            yield rows.flush()
    finally:
        client.close()


def _before_retry(client: PartitionClient, opts: SourceOptions, r: Range, position: int, deadline: float,
                  error: Exception) -> None:
    """A lost connection or a moved leader: look the leader up again after a pause, within
    kafkaConsumer.pollTimeoutMs. Other broker errors fail the task."""
    if isinstance(error, KafkaProtocolError) and error.code not in RETRIABLE:
        raise RuntimeError(f"Cannot read {r.topic}-{r.partition} from {opts.client.bootstrap}: {error}") from None
    client.reset()
    if time.monotonic() > deadline:
        raise _timeout(opts, r, position) from error
    log.warning("reading %s-%s: %s (retrying)", r.topic, r.partition, error)
    time.sleep(RETRY_BACKOFF_S)


class AbortedTransactions:
    """read_committed over one Fetch response, which lists (producer id, first offset) of the
    aborted transactions it overlaps: a producer's transactional batches are aborted from that
    first offset until the producer's abort marker (the consumer algorithm of KIP-98)."""

    def __init__(self, aborted: list[tuple[int, int]]) -> None:
        self.pending = sorted(aborted, key=itemgetter(1), reverse=True)  # next to start last
        self.open: set[int] = set()

    def skip(self, batch) -> bool:
        """Whether a transactional `batch` is to be dropped (aborted data or a marker)."""
        while self.pending and self.pending[-1][1] <= batch.base_offset:
            self.open.add(self.pending.pop()[0])
        if batch.is_control_batch:
            if batch.producer_id in self.open and _is_abort_marker(batch):
                self.open.discard(batch.producer_id)
            return True
        return batch.producer_id in self.open


_CONTROL_KEY = struct.Struct(">hh")  # version, type (0 abort, 1 commit)


def _is_abort_marker(batch) -> bool:
    return _CONTROL_KEY.unpack_from(next(iter(batch)).key)[1] == 0


# --- librdkafka path ------------------------------------------------------------------------

def consumer(opts: SourceOptions, errors: clients.BrokerErrors) -> Consumer:
    # librdkafka wants fetch.max.bytes >= message.max.bytes (1000 at least), where Java takes
    # any fetch.max.bytes (a first batch is returned whatever its size): a smaller one lowers
    # the consumer's message.max.bytes, which only bounds the requests it sends.
    fetch_max = opts.client.conf.get("fetch.max.bytes")
    forced = {}
    if fetch_max is not None and "message.max.bytes" not in opts.client.conf:
        forced = {"fetch.max.bytes": max(int(fetch_max), 1000),
                  "message.max.bytes": max(1000, min(int(fetch_max), 1_000_000))}
    return clients.make(Consumer, opts.client, "consumer", errors, forced=forced, **{
        "group.id": opts.group_id or "strom-spark",  # never joined, nothing is committed
        "client.id": opts.client_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",  # an offset that is gone must surface, not be skipped
        "enable.partition.eof": True,  # tells where the log ends: the tail may be gaps
        "fetch.wait.max.ms": 20,
        "fetch.max.bytes": 64 << 20,
        "max.partition.fetch.bytes": 16 << 20,
        "queued.min.messages": 1_000_000,  # keep fetching ahead: 4x faster than 100k
        "socket.connection.setup.timeout.ms": 10_000,
    })


def read_librdkafka(opts: SourceOptions, r: Range) -> Iterator[pa.RecordBatch]:
    """The range by a librdkafka consumer; batches of any size."""
    errors = clients.BrokerErrors(opts.client.bootstrap)
    c = consumer(opts, errors)
    limit = batch_rows(opts)
    try:
        start = _checked_start(_watermarks(c, r, errors)[0], opts, r)
        if start >= r.end:
            return
        tp = TopicPartition(r.topic, r.partition, start)
        c.assign([tp])
        rows = Rows(r.topic, r.partition, opts.include_headers)
        position = start
        deadline = _deadline(opts)
        while position < r.end:
            msgs = c.consume(limit, 0.5)
            if not msgs:
                errors.check()
                if time.monotonic() > deadline:
                    raise _timeout(opts, r, position)
                continue
            deadline = _deadline(opts)
            good = msgs
            if any(map(Message.error, msgs)):
                good = [m for m in msgs if m.error() is None]
                position = max(position, _on_errors(c, opts, r, [m for m in msgs if m.error()], position, errors))
            if good:
                if good[-1].offset() >= r.end:
                    good = [m for m in good if m.offset() < r.end]
                    position = r.end
                if good:
                    position = max(position, good[-1].offset() + 1)
                    rows.add_messages(good)
            if len(rows) >= limit:
                yield rows.flush()
        if len(rows):
            yield rows.flush()
    finally:
        c.close()


def _watermarks(c: Consumer, r: Range, errors: clients.BrokerErrors) -> tuple[int, int]:
    tp = TopicPartition(r.topic, r.partition)
    try:
        return clients.wait(lambda s: c.get_watermark_offsets(tp, timeout=s), errors, WATERMARK_TIMEOUT_S,
                            c.poll, lambda e: e.args[0].code() in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT))
    except KafkaException as e:
        raise RuntimeError(f"Could not list offsets of {r.topic}-{r.partition}: {e.args[0]}") from None


def _on_errors(c: Consumer, opts: SourceOptions, r: Range, failed: list[Message], position: int,
               errors: clients.BrokerErrors) -> int:
    """Handle consumer error events; returns the position reading has reached."""
    for m in failed:
        err: KafkaError = m.error()
        if err.code() == KafkaError._PARTITION_EOF:
            _log_ends(opts, r, m.offset())
            return r.end
        if err.code() in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET):
            low = _out_of_range(*_watermarks(c, r, errors), opts, r, position)
            if low < r.end:
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


# --- columns --------------------------------------------------------------------------------

_KEY, _VALUE, _OFFSET, _TIMESTAMP, _HEADERS = map(attrgetter, ("key", "value", "offset", "timestamp", "headers"))


class Rows:
    """Records collected column-wise (plain lists) into Arrow arrays of Spark's Kafka schema,
    from librdkafka messages or from raw record batches."""

    def __init__(self, topic: str, partition: int, include_headers: bool) -> None:
        self.topic, self.partition, self.include_headers = topic, partition, include_headers
        self.schema = arrow_schema(include_headers)
        self._clear()

    def _clear(self) -> None:
        self.keys: list = []
        self.values: list = []
        self.offsets: list[int] = []
        self.stamps: list[int] = []  # ms since the epoch
        self.kinds: list[int] = []  # timestamp types as Kafka's Java client numbers them
        self.headers: list = []  # per record: [(key, value), ...], empty or None for none

    def __len__(self) -> int:
        return len(self.offsets)

    def add_messages(self, msgs: list[Message]) -> None:
        # map() over the unbound methods: the cheapest per-row call Python has (this loop is
        # the read path's cost; Message.timestamp() alone is ~0.4 us a row).
        stamps = list(map(Message.timestamp, msgs))
        kinds = {kind for kind, _ in stamps}
        self.keys += map(Message.key, msgs)
        self.values += map(Message.value, msgs)
        self.offsets += map(Message.offset, msgs)
        self.stamps += map(itemgetter(1), stamps)
        # librdkafka numbers timestamp types from 1 (CreateTime); Kafka's Java client from 0.
        self.kinds += [kinds.pop() - 1] * len(msgs) if len(kinds) == 1 else [k - 1 for k, _ in stamps]
        if self.include_headers:
            self.headers += map(Message.headers, msgs)

    def add_records(self, data: bytes, start: int, end: int, aborted: list[tuple[int, int]] | None) -> int:
        """Decode the record batches of a Fetch response, keeping records in [start, end) and,
        when `aborted` is given (read_committed), not of aborted transactions. Returns the
        offset after the last whole batch (a response may end in a partial one)."""
        position = start
        txns = AbortedTransactions(aborted) if aborted else None
        records = MemoryRecords(data)
        with _gc_paused():
            while (batch := records.next_batch()) is not None:
                position = max(position, batch.next_offset)
                if getattr(batch, "is_transactional", False) and txns and txns.skip(batch):
                    continue
                if getattr(batch, "is_control_batch", False):
                    continue
                self._add_batch(batch, start, end)
        return position

    def _add_batch(self, batch, start: int, end: int) -> None:
        recs = list(batch)
        if not recs:
            return
        if recs[0].offset < start or recs[-1].offset >= end:
            recs = [x for x in recs if start <= x.offset < end]
        self.keys += map(_KEY, recs)
        self.values += map(_VALUE, recs)
        self.offsets += map(_OFFSET, recs)
        self.stamps += map(_TIMESTAMP, recs)
        kind = getattr(batch, "timestamp_type", None)  # None: a pre-0.11 (v0/v1) batch
        self.kinds += [kind] * len(recs) if kind is not None else [_legacy_kind(x) for x in recs]
        if self.include_headers:
            self.headers += map(_HEADERS, recs)

    def flush(self) -> pa.RecordBatch:
        """The rows collected so far, as one batch; starts afresh."""
        n = len(self.offsets)
        ts_type = self.schema.field("timestamp").type
        columns = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.array([self.topic] * n, pa.string()),
            pa.array([self.partition] * n, pa.int32()),
            pa.array(self.offsets, pa.int64()),
            pc.multiply(pa.array(self.stamps, pa.int64()), 1000).view(ts_type),
            pa.array(self.kinds, pa.int32()),
        ]
        if self.include_headers:
            columns.append(self._headers_column())
        self._clear()
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def _headers_column(self) -> pa.Array:
        """array<struct<key,value>>, null for a record without headers (as Spark gives)."""
        ends, keys, values, none = [0], [], [], []
        for headers in self.headers:
            none.append(not headers)
            for k, v in headers or ():
                keys.append(k)
                values.append(v)
            ends.append(len(keys))
        list_type = self.schema.field("headers").type
        struct_ = pa.StructArray.from_arrays([pa.array(keys, pa.string()), pa.array(values, pa.binary())],
                                             fields=list(list_type.value_type))
        return pa.ListArray.from_arrays(pa.array(ends, pa.int32()), struct_, type=list_type,
                                        mask=pa.array(none, pa.bool_()))


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Decoding makes a record object per row, short-lived and free of cycles: the cyclic
    collector would scan them again and again (measured: 2.4x the decode time), while
    reference counting frees them anyway."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _legacy_kind(record) -> int:
    kind = record.timestamp_type
    return -1 if kind is None else kind
