"""Transactions benchmark: transactional produce throughput and what read_committed adds to latency.

    .venv/bin/python benchmarks/transactions.py [--quick] [--loops asyncio,uvloop] [--seconds 5]
                                                [--latency-seconds 10] [--partitions 4]
                                                [--output FILE]

Prints one JSON document to stdout (progress on stderr). Per event loop, one broker process
(`strom serve` through BrokerProcess: 127.0.0.1, ephemeral port, temp dir) serves every
scenario; each scenario has its own topic of `--partitions` partitions. The client is
confluent-kafka (librdkafka) in this process; records are exactly 100 bytes, spread round-robin
over the partitions.

Throughput (`produce-*`), each for `--seconds`:
- `produce-idempotent` (the baseline): enable.idempotence=true, acks=all, linger.ms=5, a
  produce() loop and one flush at the end. No transactions.
- `produce-txn-100` / `produce-txn-10000`: the same producer with a transactional.id, in
  transactions of 100 or 10,000 records (begin, produce N, commit_transaction; repeated).
  Every transaction touches every partition, so each one costs an AddPartitionsToTxn, an
  EndTxn, one marker per partition and the `__transaction_state` writes.
- records_per_s / mb_per_s: records acknowledged (committed) ÷ wall time from the first
  produce() to the last flush / commit returning; mb = 10^6 bytes of payload.
- ratio_to_idempotent: records_per_s ÷ that of `produce-idempotent` in the same invocation.
- commit_ms: p50 / p99 of commit_transaction() (it includes flushing the transaction's last
  records); txns_per_s.
- broker_cpu_s_per_gb: broker utime+stime per 10^9 payload bytes; client_cpu_s: this process.
- complete: afterwards the log holds exactly the records plus one marker per partition per
  transaction, and the read_committed end (LSO) equals the high watermark.

Latency (`latency-*`), each for `--latency-seconds`: the producer here sends transactions of
`--latency-txn-records` (10) records at `--latency-txns-per-s` (100/s), committing each at once;
every record carries the CLOCK_MONOTONIC time of its produce() call. Two consumer processes
(assign from offset 0, fetch.wait.max.ms=5), one read_committed and one read_uncommitted, read the
same topic at the same time and subtract that time on arrival. `latency-idempotent` is the
same load without transactions (an acks=all idempotent producer, flushed per 10 records) read
with read_uncommitted: the baseline. The first 0.5 s of records is left out. Reported: p50,
p99, p99.9, max, mean in ms. read_committed can only see a record once its transaction's
COMMIT marker is written, so `committed_minus_uncommitted_p50_ms` is the latency that
read_committed adds.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import struct
import sys
import time
import uuid
from datetime import UTC, datetime

try:
    import confluent_kafka
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from strom.testing import BrokerProcess
except ImportError as e:  # pragma: no cover - a usage error, not a benchmark result
    sys.exit(f"transactions.py needs the project venv (confluent-kafka and strom): {e}")

import run  # noqa: E402  (the harness next to this file: its machine description)

RECORD_SIZE = 100
CLK_TCK = os.sysconf("SC_CLK_TCK")
T0 = time.monotonic()
BROKER_OVERRIDES = {"transaction.state.log.num.partitions": "4", "offsets.topic.num.partitions": "4"}
_STAMP = struct.Struct(">d")


def progress(message: str) -> None:
    print(f"[transactions {time.monotonic() - T0:6.1f}s] {message}", file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(15)


def end_offsets(bootstrap: str, topic: str, partitions: int, isolation: str) -> list[int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-offsets", "isolation.level": isolation})
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)]
    finally:
        c.close()


# --- throughput -------------------------------------------------------------------------------
def produce_pass(broker: BrokerProcess, topic: str, partitions: int, seconds: float,
                 txn_records: int | None) -> dict:
    conf = {"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 5, "batch.size": 1_000_000, "batch.num.messages": 100_000,
            "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1_048_576}
    if txn_records is not None:
        conf["transactional.id"] = f"bench-{uuid.uuid4().hex[:8]}"
    producer = Producer(conf)
    payload = b"x" * RECORD_SIZE
    failed = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            failed.append(str(err))

    if txn_records is not None:
        producer.init_transactions(30)
    else:  # the same set-up cost outside the measurement: InitProducerId and metadata
        producer.produce(topic, payload, partition=0, on_delivery=on_delivery)
        producer.flush(30)
    broker_cpu0, client_cpu0 = cpu_seconds(broker.proc.pid), time.process_time()
    start = time.monotonic()
    records, txns, commit_ms = 0, 0, []

    def produce_one(i: int) -> None:
        while True:
            try:
                producer.produce(topic, payload, partition=i % partitions, on_delivery=on_delivery)
                return
            except BufferError:
                producer.poll(0.001)

    if txn_records is None:
        while time.monotonic() - start < seconds:
            for _ in range(1000):
                produce_one(records)
                records += 1
            producer.poll(0)
        producer.flush(60)
    else:
        while time.monotonic() - start < seconds:
            producer.begin_transaction()
            for _ in range(txn_records):
                produce_one(records)
                records += 1
            began = time.monotonic()
            producer.commit_transaction(60)
            commit_ms.append((time.monotonic() - began) * 1000)
            txns += 1
    elapsed = time.monotonic() - start
    broker_cpu = cpu_seconds(broker.proc.pid) - broker_cpu0
    client_cpu = time.process_time() - client_cpu0
    producer.flush(10)

    high = end_offsets(broker.bootstrap, topic, partitions, "read_uncommitted")
    lso = end_offsets(broker.bootstrap, topic, partitions, "read_committed")
    extra = 1 if txn_records is None else 0  # the warm-up record
    markers = txns * min(partitions, txn_records) if txn_records is not None else 0
    result = {
        "records": records, "seconds": round(elapsed, 3),
        "records_per_s": round(records / elapsed), "mb_per_s": round(records * RECORD_SIZE / elapsed / 1e6, 2),
        "broker_cpu_s": round(broker_cpu, 2), "broker_cpu_util": round(broker_cpu / elapsed, 2),
        "broker_cpu_s_per_gb": round(broker_cpu / (records * RECORD_SIZE / 1e9), 1),
        "client_cpu_s": round(client_cpu, 2),
        "delivery_errors": len(failed),
        "complete": sum(high) == records + extra + markers and lso == high and not failed,
    }
    if txn_records is not None:
        commit_ms.sort()
        result.update({"transaction_records": txn_records, "transactions": txns,
                       "txns_per_s": round(txns / elapsed, 1),
                       "commit_ms_p50": round(percentile(commit_ms, 0.5), 2),
                       "commit_ms_p99": round(percentile(commit_ms, 0.99), 2)})
    return result


# --- latency ----------------------------------------------------------------------------------
def _consumer_main(bootstrap: str, topic: str, partitions: int, isolation: str, warmup_until: float,
                   stop_at: float, ready, out) -> None:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-latency", "isolation.level": isolation,
                  "enable.auto.commit": False, "fetch.wait.max.ms": 5, "fetch.error.backoff.ms": 5})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    c.poll(0.5)  # connect, look up offsets
    ready.put(isolation)
    latencies = []
    while time.monotonic() < stop_at:
        msg = c.poll(0.05)
        if msg is None or msg.error() is not None:
            continue
        now = time.monotonic()
        (sent,) = _STAMP.unpack_from(msg.value())
        if sent >= warmup_until:
            latencies.append((now - sent) * 1000)
    c.close()
    out.put((isolation, latencies))


def latency_run(broker: BrokerProcess, partitions: int, seconds: float, txn_records: int,
                txns_per_s: float, transactional: bool) -> dict[str, dict]:
    topic = f"bench-latency-{'txn' if transactional else 'idem'}-{uuid.uuid4().hex[:6]}"
    create_topic(broker.bootstrap, topic, partitions)
    ctx = multiprocessing.get_context("spawn")
    ready, out = ctx.Queue(), ctx.Queue()
    isolations = ["read_committed", "read_uncommitted"] if transactional else ["read_uncommitted"]
    start = time.monotonic() + 3.0  # the consumer processes start (spawn) meanwhile
    warmup_until, stop_at = start + 0.5, start + seconds
    procs = [ctx.Process(target=_consumer_main, args=(broker.bootstrap, topic, partitions, iso,
                                                      warmup_until, stop_at + 2.0, ready, out))
             for iso in isolations]
    for p in procs:
        p.start()
    conf = {"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 0}
    if transactional:
        conf["transactional.id"] = f"bench-lat-{uuid.uuid4().hex[:8]}"
    producer = Producer(conf)
    if transactional:
        producer.init_transactions(30)
    for _ in isolations:
        ready.get(timeout=30)
    while time.monotonic() < start:
        time.sleep(0.01)
    padding = b"x" * (RECORD_SIZE - _STAMP.size)
    n, slot = 0, start
    broker_cpu0 = cpu_seconds(broker.proc.pid)
    while time.monotonic() < stop_at:
        if transactional:
            producer.begin_transaction()
        for _ in range(txn_records):
            producer.produce(topic, _STAMP.pack(time.monotonic()) + padding, partition=n % partitions)
            n += 1
        if transactional:
            producer.commit_transaction(30)
        else:
            producer.flush(30)
        slot += 1.0 / txns_per_s
        pause = slot - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    broker_cpu = cpu_seconds(broker.proc.pid) - broker_cpu0
    producer.flush(10)
    results = {}
    for _ in procs:
        isolation, latencies = out.get(timeout=60)
        latencies.sort()
        results[isolation] = {
            "count": len(latencies), "p50_ms": round(percentile(latencies, 0.5), 2),
            "p99_ms": round(percentile(latencies, 0.99), 2), "p99_9_ms": round(percentile(latencies, 0.999), 2),
            "max_ms": round(latencies[-1], 2) if latencies else None,
            "mean_ms": round(statistics.fmean(latencies), 2) if latencies else None,
            "broker_cpu_util": round(broker_cpu / seconds, 2)}
    for p in procs:
        p.join(30)
    return results


# --- main -------------------------------------------------------------------------------------
def machine_info() -> dict:
    """run.py's machine description plus the client library's versions."""
    return {**run.machine_info(), "confluent_kafka": confluent_kafka.__version__,
            "librdkafka": confluent_kafka.libversion()[0]}


def run_loop(loop: str, args) -> dict:
    results: dict[str, dict] = {}
    with BrokerProcess(overrides=BROKER_OVERRIDES, env={"STROM_EVENT_LOOP": loop}) as broker:
        progress(f"{loop}: broker ready on {broker.bootstrap}")
        for name, txn_records in (("produce-idempotent", None), ("produce-txn-100", 100),
                                  ("produce-txn-10000", 10_000)):
            topic = f"bench-{name}-{uuid.uuid4().hex[:6]}"
            create_topic(broker.bootstrap, topic, args.partitions)
            res = produce_pass(broker, topic, args.partitions, args.seconds, txn_records)
            base = results.get("produce-idempotent", {}).get("records_per_s")
            if base and txn_records is not None:
                res["ratio_to_idempotent"] = round(res["records_per_s"] / base, 3)
            results[name] = res
            progress(f"{loop}: {name}: {res['records_per_s']:,} rec/s, {res['mb_per_s']} MB/s, "
                     f"complete={res['complete']}")
        txn = latency_run(broker, args.partitions, args.latency_seconds, args.latency_txn_records,
                          args.latency_txns_per_s, transactional=True)
        idem = latency_run(broker, args.partitions, args.latency_seconds, args.latency_txn_records,
                           args.latency_txns_per_s, transactional=False)
        results["latency-txn-read_committed"] = txn["read_committed"]
        results["latency-txn-read_uncommitted"] = txn["read_uncommitted"]
        results["latency-idempotent"] = idem["read_uncommitted"]
        results["latency-txn-read_committed"]["committed_minus_uncommitted_p50_ms"] = round(
            txn["read_committed"]["p50_ms"] - txn["read_uncommitted"]["p50_ms"], 2)
        results["latency-txn-read_committed"]["committed_minus_uncommitted_p99_ms"] = round(
            txn["read_committed"]["p99_ms"] - txn["read_uncommitted"]["p99_ms"], 2)
        for name in ("latency-txn-read_committed", "latency-txn-read_uncommitted", "latency-idempotent"):
            r = results[name]
            progress(f"{loop}: {name}: p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms ({r['count']} records)")
        if "Traceback" in broker.log_text():
            results["broker_errors"] = [line for line in broker.stderr_lines if "Error" in line][-5:]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 s produce passes, 4 s latency runs")
    parser.add_argument("--loops", default="asyncio,uvloop", help="broker event loops (STROM_EVENT_LOOP)")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each produce pass")
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--latency-txn-records", type=int, default=10)
    parser.add_argument("--latency-txns-per-s", type=float, default=100.0)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--output", help="also write the JSON document to this file")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.latency_seconds = 2.0, 4.0
    doc = {"benchmark": "transactions",
           "started": datetime.now(UTC).isoformat(timespec="seconds"),
           "meta": {**machine_info(), "record_bytes": RECORD_SIZE, "partitions": args.partitions,
                    "seconds": args.seconds, "latency_seconds": args.latency_seconds,
                    "latency_txn_records": args.latency_txn_records,
                    "latency_txns_per_s": args.latency_txns_per_s, "broker_overrides": BROKER_OVERRIDES},
           "results": {}}
    for loop in [x.strip() for x in args.loops.split(",") if x.strip()]:
        doc["results"][loop] = run_loop(loop, args)
    text = json.dumps(doc, indent=2)
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
