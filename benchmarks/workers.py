"""Client processes for the benchmarks, each printing one JSON line to stdout when done.

    python benchmarks/workers.py produce  --bootstrap B --topic T --size N --seconds S [--acks A]
    python benchmarks/workers.py consume  --bootstrap B --topic T --partitions 0,1 --ends 10,12
    python benchmarks/workers.py latency-consumer --bootstrap B --topic T --count N --seconds S
    python benchmarks/workers.py latency-producer --bootstrap B --topic T --rate R --seconds S

`produce` and `consume` are the fallback generators when kcat is missing (run.py starts several
in parallel); the two latency roles always run here. Each role is bounded in time and count.
Timestamps are CLOCK_MONOTONIC nanoseconds, which Linux shares between processes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import confluent_kafka as ck

# Throughput settings shared with run.py's kcat command lines.
PRODUCER_THROUGHPUT = {
    "linger.ms": 20,
    "batch.size": 1_000_000,
    "batch.num.messages": 1_000_000,
    "queue.buffering.max.messages": 500_000,
    "compression.type": "none",
}
CONSUMER_THROUGHPUT = {
    "fetch.wait.max.ms": 5,
    "fetch.max.bytes": 64 << 20,
    "max.partition.fetch.bytes": 4 << 20,
    "queued.max.messages.kbytes": 256 << 10,
}


def _emit(result: dict) -> None:
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def produce(args) -> None:
    conf = {"bootstrap.servers": args.bootstrap, "acks": args.acks, **PRODUCER_THROUGHPUT}
    producer = ck.Producer(conf)
    failed = [0]

    def on_delivery(err, _msg) -> None:
        if err is not None:
            failed[0] += 1

    value = b"x" * args.size
    topic = args.topic
    sent = 0
    begin = time.monotonic()
    deadline = begin + args.seconds
    produce_ = producer.produce
    while sent < args.max_records:
        # Check the clock once per 1000 records: time.monotonic() per record costs ~5%.
        if time.monotonic() >= deadline:
            break
        for _ in range(1000):
            try:
                produce_(topic, value, on_delivery=on_delivery)
            except BufferError:
                producer.poll(0.001)
                continue
            sent += 1
        producer.poll(0)
    left = producer.flush(30)
    _emit({"sent": sent, "failed": failed[0], "unflushed": left,
           "seconds": time.monotonic() - begin})


def consume(args) -> None:
    partitions = [int(p) for p in args.partitions.split(",")]
    ends = dict(zip(partitions, (int(e) for e in args.ends.split(",")), strict=True))
    conf = {"bootstrap.servers": args.bootstrap, "group.id": "strom-bench",
            "enable.auto.commit": False, "enable.auto.offset.store": False, **CONSUMER_THROUGHPUT}
    consumer = ck.Consumer(conf)
    consumer.assign([ck.TopicPartition(args.topic, p, 0) for p in partitions])
    remaining = {p: e for p, e in ends.items() if e > 0}
    count = nbytes = errors = 0
    first = last = None
    deadline = time.monotonic() + args.seconds
    while remaining and time.monotonic() < deadline:
        for msg in consumer.consume(1000, 0.05):
            if msg.error() is not None:
                errors += 1
                continue
            if first is None:
                first = time.monotonic()
            count += 1
            nbytes += len(msg.value())
            p = msg.partition()
            if p in remaining and msg.offset() + 1 >= remaining[p]:
                del remaining[p]
        last = time.monotonic()
    consumer.close()
    _emit({"count": count, "bytes": nbytes, "errors": errors, "complete": not remaining,
           "seconds": (last - first) if first is not None else 0.0})


def latency_consumer(args) -> None:
    conf = {"bootstrap.servers": args.bootstrap, "group.id": "strom-bench-latency",
            "enable.auto.commit": False, "fetch.wait.max.ms": args.fetch_wait_ms,
            "fetch.min.bytes": 1, "enable.auto.offset.store": False}
    consumer = ck.Consumer(conf)
    consumer.assign([ck.TopicPartition(args.topic, 0, 0)])
    consumer.poll(0.5)  # connect and start fetching before the producer begins
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    latencies: list[int] = []
    errors = 0
    deadline = time.monotonic() + args.seconds
    # poll() returns each record as soon as it arrives; consume(n, timeout) would hold records
    # back until n of them had arrived, which adds up to n/rate seconds of latency.
    while len(latencies) < args.count and time.monotonic() < deadline:
        msg = consumer.poll(0.05)
        now = time.monotonic_ns()
        if msg is None:
            continue
        if msg.error() is not None:
            errors += 1
            continue
        value = msg.value()
        if value[20:21] != b"w":
            latencies.append(now - int(value[:20]))
    consumer.close()
    latencies.sort()

    def pct(q: float) -> float | None:
        if not latencies:
            return None
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] / 1e6

    _emit({"received": len(latencies), "errors": errors,
           "p50_ms": pct(0.50), "p99_ms": pct(0.99), "p999_ms": pct(0.999),
           "max_ms": latencies[-1] / 1e6 if latencies else None,
           "mean_ms": sum(latencies) / len(latencies) / 1e6 if latencies else None})


def latency_producer(args) -> None:
    conf = {"bootstrap.servers": args.bootstrap, "acks": args.acks, "linger.ms": 0,
            "compression.type": "none"}
    producer = ck.Producer(conf)
    padding = b"." * max(0, args.size - 21)
    total = int(args.rate * args.seconds)
    warm_total = int(args.rate * args.warmup)
    failed = [0]

    def on_delivery(err, _msg) -> None:
        if err is not None:
            failed[0] += 1

    # Warm-up records (marked "w") open the connection and settle the pipeline; the consumer
    # ignores them. Then `total` records at a fixed rate, each stamped when produce() runs.
    start = time.monotonic()
    sent = 0
    for i in range(warm_total + total):
        due = start + i / args.rate
        delay = due - time.monotonic()
        if delay > 0.0005:
            time.sleep(delay)
        mark = b"w" if i < warm_total else b"m"
        producer.produce(args.topic, b"%020d" % time.monotonic_ns() + mark + padding,
                         partition=0, on_delivery=on_delivery)
        producer.poll(0)
        sent += 1
    left = producer.flush(30)
    elapsed = time.monotonic() - start
    _emit({"sent": sent - warm_total, "failed": failed[0], "unflushed": left,
           "achieved_rate": (sent - warm_total) / max(1e-9, elapsed - args.warmup)})


def main() -> None:
    parser = argparse.ArgumentParser(description="Strom benchmark client processes")
    sub = parser.add_subparsers(dest="role", required=True)
    p = sub.add_parser("produce")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--acks", default="1")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--max-records", type=int, default=50_000_000)
    p.set_defaults(func=produce)
    c = sub.add_parser("consume")
    c.add_argument("--bootstrap", required=True)
    c.add_argument("--topic", required=True)
    c.add_argument("--partitions", required=True)
    c.add_argument("--ends", required=True)
    c.add_argument("--seconds", type=float, default=60.0)
    c.set_defaults(func=consume)
    lc = sub.add_parser("latency-consumer")
    lc.add_argument("--bootstrap", required=True)
    lc.add_argument("--topic", required=True)
    lc.add_argument("--count", type=int, required=True)
    lc.add_argument("--seconds", type=float, required=True)
    lc.add_argument("--fetch-wait-ms", type=int, default=5)
    lc.set_defaults(func=latency_consumer)
    lp = sub.add_parser("latency-producer")
    lp.add_argument("--bootstrap", required=True)
    lp.add_argument("--topic", required=True)
    lp.add_argument("--rate", type=float, default=5000)
    lp.add_argument("--seconds", type=float, default=10)
    lp.add_argument("--warmup", type=float, default=0.5)
    lp.add_argument("--size", type=int, default=100)
    lp.add_argument("--acks", default="1")
    lp.set_defaults(func=latency_producer)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
