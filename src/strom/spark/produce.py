"""The task side of every write: rows of Arrow batches produced by librdkafka's idempotent
producer, every delivery checked before the task reports success. The sink (sink.py) uses it
as it is (at-least-once); the exactly-once writes (txn.py) inside a transaction."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Producer

from strom.spark import clients
from strom.spark.options import SinkOptions

FLUSH_TIMEOUT_S = 180.0
# What the Java producer counts on top of key, value and headers when it checks a record
# against max.request.size: a record batch header, and a record's own length fields.
RECORD_OVERHEAD = 61 + 21


@dataclass
class Delivery:
    """What a producer's callbacks report: failed deliveries, and the brokers' refusals."""
    bootstrap: str
    failed: list[KafkaError] = field(default_factory=list)
    broker: clients.BrokerErrors = field(init=False)

    def __post_init__(self) -> None:
        self.broker = clients.BrokerErrors(self.bootstrap)

    def on_delivery(self, err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            self.failed.append(err)


def producer(opts: SinkOptions, delivery: Delivery, **extra: object) -> Producer:
    """The sink's producer: the Java producer's defaults (idempotent with acks=all, unless
    acks is weakened and idempotence not asked for), then the user's kafka.* settings."""
    user = opts.client.conf
    weaker = user.get("acks", "all").strip().lower() not in ("all", "-1")
    idempotent = "enable.idempotence" in user or not weaker
    timeout = opts.client.request_timeout_ms
    return clients.make(Producer, opts.client, "producer", delivery.broker, **{
        "enable.idempotence": idempotent,
        "acks": "all",
        **({"request.timeout.ms": timeout} if timeout else {}),
        "linger.ms": 20,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 1_000_000,
        "delivery.timeout.ms": 120_000,
        "partitioner": "murmur2_random",  # the Java client's: same key, same partition as Spark's sink
        "delivery.report.only.error": True,
        "on_delivery": delivery.on_delivery,
        **extra,
    })


def _record_size(key: bytes | str | None, value: bytes | str | None, headers: list | None) -> int:
    def size(x: bytes | str | None) -> int:
        return 0 if x is None else len(x.encode() if isinstance(x, str) else x)

    return RECORD_OVERHEAD + size(key) + size(value) + sum(size(h["key"]) + size(h["value"]) for h in headers or ())


def produce_all(p: Producer, opts: SinkOptions, batches: Iterator[pa.RecordBatch], delivery: Delivery) -> int:
    """Queue every row of every batch; returns the count. Delivery is checked by the caller. A
    full queue waits for deliveries, at most max.block.ms per record (Java's bound on send())."""
    max_block_s = (opts.client.max_block_ms if opts.client.max_block_ms is not None else 60_000) / 1000
    max_size = opts.client.max_request_size
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
            if max_size is not None and (size := _record_size(key, value, hdrs)) > max_size:
                raise ValueError(f"A record of {size} bytes (with Kafka's record overhead) is larger than "
                                 f"kafka.max.request.size={max_size}")
            extra = {"headers": [(h["key"], h["value"]) for h in hdrs]} if hdrs else {}
            part = -1 if partition is None else partition  # -1: the partitioner chooses
            blocked = None
            while True:
                try:
                    p.produce(topic, value, key, part, **extra)
                    break
                except BufferError:  # queue full: let deliveries drain
                    blocked = blocked or time.monotonic()
                    if time.monotonic() - blocked > max_block_s:
                        raise TimeoutError(f"the producer queue stayed full for max.block.ms "
                                           f"({max_block_s * 1000:.0f} ms)") from None
                    p.poll(0.1)
                    delivery.broker.check()
                except KafkaException as e:
                    raise _in_user_terms(e.args[0], opts) from None
        p.poll(0)
        delivery.broker.check()
        count += n
    return count


def _in_user_terms(error: KafkaError, opts: SinkOptions) -> Exception:
    if error.code() == KafkaError.MSG_SIZE_TOO_LARGE and "message.max.bytes" in opts.client.conf:
        return KafkaException(KafkaError(error.code(), f"{error.str()} (larger than "
                                         f"{opts.client.option_name('message.max.bytes')}="
                                         f"{opts.client.conf['message.max.bytes']})"))
    return KafkaException(error)


def check_delivered(p: Producer, delivery: Delivery) -> None:
    """Wait until every queued record is acknowledged; fail on the first that was not, and at
    once when the brokers refuse the connection."""
    deadline = time.monotonic() + FLUSH_TIMEOUT_S
    left = len(p)
    while left and time.monotonic() < deadline:
        left = p.flush(min(1.0, deadline - time.monotonic()))
        delivery.broker.check()
    if delivery.failed:
        raise RuntimeError(f"{len(delivery.failed)} record(s) were not written by the strom sink, first error: "
                           f"{delivery.failed[0]}")
    if left:
        raise RuntimeError(f"{left} record(s) still unacknowledged after {FLUSH_TIMEOUT_S:.0f} s")


def write_task(opts: SinkOptions, batches: Iterator[pa.RecordBatch]) -> int:
    """One task of an at-least-once write: its rows produced and acknowledged; the count."""
    delivery = Delivery(opts.client.bootstrap)
    p = producer(opts, delivery)
    try:
        count = produce_all(p, opts, batches, delivery)
        check_delivered(p, delivery)
    finally:
        # Closed here, not when collected: a failed task's traceback keeps `p` alive in the
        # Python worker, which Spark reuses, and it would go on connecting to its brokers.
        # What a failed task queued goes nowhere (Spark runs the task again).
        p.purge()
        if hasattr(p, "close"):  # not in every confluent-kafka this supports
            p.close()
    return count
