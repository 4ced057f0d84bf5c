"""Iceberg topics (strom.tables) under load: how fast the broker translates a topic into its
table, what the table's lag is under a steady produce rate, and what translation costs produce.

    .venv/bin/python benchmarks/iceberg.py [--records 100000] [--record-size 1024] [--partitions 1]
                                           [--rate 2000] [--seconds 20] [--commit-interval-ms 1000]
                                           [--json FILE]

One `strom serve` process (strom.testing.BrokerProcess) with iceberg.enabled, its default SQLite
catalog and file:// warehouse under its log dir, and the metrics endpoint; the producer is
confluent-kafka in this process (linger.ms=20, 1 MB batches, acks=1). Phases, in order:

1. produce, translation off: --records records of --record-size bytes into a topic without
   iceberg.mode, as fast as the producer goes. records/s and MB/s (10^6 bytes) from the first
   to the last acknowledgement.
2. produce, translation on: the same into a topic with iceberg.mode=key_value, translated while
   it is written; then the time until the table holds every offset (its strom.offsets map at
   the end offsets).
3. backfill: the records of phase 1's topic translated after iceberg.mode=key_value is set on
   it: the time from the config change until the table holds every offset, and the broker
   process's CPU time (utime+stime) over it. translation records/s and MB/s per broker core =
   records (or their bytes) / the broker's CPU seconds; wall records/s beside it.
4. steady load: --rate records/s for --seconds into a new key_value topic; every 200 ms a
   scrape of strom_iceberg_translation_lag_seconds and _offsets (the maximum over the topic's
   partitions). p50/p99/max of the samples. A partition's lag in seconds is the age of its
   oldest record not yet in the table, so it is bounded below by the commit interval.

A compact table goes to stdout (--json FILE also writes every number), progress to stderr; the
broker and its temp dir are removed on exit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource  # noqa: E402

import run  # noqa: E402  (cpu_seconds, log, machine_info)
from strom.testing import BrokerProcess, create_topic, list_offset, scrape  # noqa: E402

MB = 1_000_000


def produce(bootstrap: str, topic: str, count: int, size: int, partitions: int) -> dict:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                         "batch.num.messages": 100_000, "queue.buffering.max.kbytes": 512 * 1024, "acks": 1})
    value = b"x" * size
    acked = [0]
    first_last = [0.0, 0.0]

    def done(err, _msg) -> None:
        if err is None:
            acked[0] += 1
            first_last[1] = time.monotonic()
            if not first_last[0]:
                first_last[0] = first_last[1]

    for i in range(count):
        while True:
            try:
                producer.produce(topic, value=value, partition=i % partitions, on_delivery=done)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 1000 == 0:
            producer.poll(0)
    producer.flush(120)
    elapsed = max(first_last[1] - first_last[0], 1e-6)
    return {"records": acked[0], "records_per_s": round(acked[0] / elapsed), "mb_per_s": round(acked[0] * size / MB / elapsed, 1)}


def catalog(broker: BrokerProcess):
    from pyiceberg.catalog.sql import SqlCatalog

    base = broker.data_dir / "logs" / "iceberg"
    base.mkdir(parents=True, exist_ok=True)  # the broker makes it on first use
    return SqlCatalog("strom", uri=f"sqlite:///{base / 'catalog.db'}", warehouse=(base / "warehouse").as_uri())


def wait_translated(cat, broker: BrokerProcess, topic: str, partitions: int, timeout: float = 600.0) -> float:
    """When the table's offsets map reaches every partition's end offset."""
    ends = {str(p): list_offset(broker.bootstrap, topic, -1, p) for p in range(partitions)}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cat.table_exists(("strom", topic)):
            snapshot = cat.load_table(("strom", topic)).current_snapshot()
            offsets = json.loads(snapshot.summary.get("strom.offsets", "{}")) if snapshot else {}
            if all(offsets.get(p, 0) >= end for p, end in ends.items()):
                return time.monotonic()
        time.sleep(0.1)
    raise TimeoutError(f"{topic} not translated within {timeout:g} s")


def set_mode(bootstrap: str, topic: str, mode: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource("TOPIC", topic, incremental_configs=[
        ConfigEntry("iceberg.mode", mode, incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(30)


def steady(broker: BrokerProcess, topic: str, rate: int, seconds: float, size: int, partitions: int) -> dict:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "acks": 1})
    value = b"x" * size
    lag_s: list[float] = []
    lag_offsets: list[float] = []
    start = time.monotonic()
    sent = 0
    next_scrape = start + 1.0  # the translators start within the scheduler's first second
    while (now := time.monotonic()) < start + seconds:
        due = int((now - start) * rate)
        while sent < due:
            producer.produce(topic, value=value, partition=sent % partitions)
            sent += 1
        producer.poll(0)
        if now >= next_scrape:
            next_scrape += 0.2
            samples = scrape(broker.metrics_url)
            for name, values in (("seconds", lag_s), ("offsets", lag_offsets)):
                mine = [v for (metric, labels), v in samples.items()
                        if metric == f"strom_iceberg_translation_lag_{name}" and ("topic", topic) in labels]
                if mine:
                    values.append(max(mine))
        time.sleep(0.002)
    producer.flush(60)

    def pct(values: list[float], q: float) -> float | None:
        return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 3) if len(values) >= 2 else None

    return {"records": sent, "samples": len(lag_s), "lag_seconds_p50": pct(lag_s, 50), "lag_seconds_p99": pct(lag_s, 99),
            "lag_seconds_max": round(max(lag_s), 3) if lag_s else None,
            "lag_offsets_p99": pct(lag_offsets, 99), "lag_offsets_max": max(lag_offsets) if lag_offsets else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--rate", type=int, default=2000, help="records/s of the steady phase")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the steady phase")
    parser.add_argument("--commit-interval-ms", type=int, default=1000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    size, parts = args.record_size, args.partitions
    overrides = {"iceberg.enabled": "true", "iceberg.commit.interval.ms": str(args.commit_interval_ms),
                 "metrics.port": "0", "log.segment.bytes": str(256 << 20)}
    result: dict = {"machine": run.machine_info(), "args": {k: str(v) for k, v in vars(args).items()}}
    with BrokerProcess(overrides=overrides) as broker:
        cat = catalog(broker)
        run.log("phase 1: produce, translation off")
        create_topic(broker.bootstrap, "plain", parts)
        result["produce_off"] = produce(broker.bootstrap, "plain", args.records, size, parts)
        run.log(f"  {result['produce_off']}")

        run.log("phase 2: produce, translation on")
        create_topic(broker.bootstrap, "translated", parts, config={"iceberg.mode": "key_value"})
        start = time.monotonic()
        result["produce_on"] = produce(broker.bootstrap, "translated", args.records, size, parts)
        produced = time.monotonic()
        done = wait_translated(cat, broker, "translated", parts)
        result["produce_on"]["table_complete_after_produce_s"] = round(done - produced, 2)
        result["produce_on"]["translated_records_per_s_wall"] = round(args.records / (done - start))
        run.log(f"  {result['produce_on']}")

        run.log("phase 3: backfill of phase 1's topic")
        cpu0 = run.cpu_seconds(broker.proc.pid)
        start = time.monotonic()
        set_mode(broker.bootstrap, "plain", "key_value")
        done = wait_translated(cat, broker, "plain", parts)
        cpu = run.cpu_seconds(broker.proc.pid) - cpu0
        wall = done - start
        result["backfill"] = {"records": args.records, "wall_s": round(wall, 2), "broker_cpu_s": round(cpu, 2),
                              "records_per_s_wall": round(args.records / wall),
                              "records_per_core_s": round(args.records / cpu),
                              "mb_per_core_s": round(args.records * size / MB / cpu, 1)}
        run.log(f"  {result['backfill']}")

        run.log(f"phase 4: steady load, {args.rate} records/s for {args.seconds:g} s")
        create_topic(broker.bootstrap, "steady", parts, config={"iceberg.mode": "key_value"})
        result["steady"] = steady(broker, "steady", args.rate, args.seconds, size, parts)
        run.log(f"  {result['steady']}")

    off, on, back, st = result["produce_off"], result["produce_on"], result["backfill"], result["steady"]
    print(f"produce, translation off      {off['records_per_s']:>9} records/s  {off['mb_per_s']:>7} MB/s")
    print(f"produce, translation on       {on['records_per_s']:>9} records/s  {on['mb_per_s']:>7} MB/s"
          f"  (table complete {on['table_complete_after_produce_s']} s after)")
    print(f"translation (backfill)        {back['records_per_core_s']:>9} records/core-s {back['mb_per_core_s']:>5}"
          f" MB/core-s  ({back['records_per_s_wall']} records/s wall, {back['broker_cpu_s']} broker CPU s)")
    print(f"lag at {args.rate} records/s      p50 {st['lag_seconds_p50']} s  p99 {st['lag_seconds_p99']} s"
          f"  max {st['lag_seconds_max']} s  (offsets p99 {st['lag_offsets_p99']})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
