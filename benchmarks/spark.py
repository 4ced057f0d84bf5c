"""Throughput of the PySpark connector (`strom.spark`) against one real broker process, beside
the broker's own rate for the same data, and the start-up of a first read.

    .venv/bin/python benchmarks/spark.py [--records 1000000] [--sizes 100,1024] [--partitions 4]
        [--masters local,standalone] [--passes 3] [--before REF]

For each record size, produces --records records into a --partitions topic (timed: the
broker's produce rate, a confluent-kafka producer with the sink's settings), reads them back
outside Spark (the broker's consume rate: kcat, librdkafka's own command-line consumer, and a
confluent-kafka consumer in Python), then measures on each Spark master, each the median of
--passes runs:

- local: `local[2]`, the driver's JVM running two tasks at a time;
- standalone: a Spark standalone cluster started from the installed PySpark (a master and
  two workers of one core each, executors in their own JVMs with 512 MiB).

Scenarios:
- spark-batch-read: spark.read.format("strom") ... .write.format("noop"): every row goes
  through Spark, nothing is kept;
- spark-stream-read: readStream with Trigger.AvailableNow into the noop sink, from a new
  checkpoint each pass (start-up and the micro-batch's fixed cost included);
- spark-generate: the DataFrame the write scenario writes, made by Spark into the noop sink
  (what Spark itself spends before the sink);
- spark-batch-write: that DataFrame written with format("strom") to a new topic, until every
  record is acknowledged;
- spark-stream-copy-eos: readStream of the topic -> writeStream format("strom") with
  transactionalIdPrefix (exactly-once), AvailableNow: read, write and the transaction commits;
- spark-micro-batch (local only): a running stream (processingTime 0) into the noop sink, fed
  one record at a time: seconds from produce to the micro-batch's progress report (p50, p95),
  and Spark's own breakdown of each micro-batch (durationMs medians).

Each Spark scenario's line carries `vs_broker`: its rows/s over the broker's rate for the same
direction (reads: kcat's consume rate; writes and the copy: the producer's rate).

Then the first read of a fresh Spark application, in a new process each time (`first-read`):
seconds to start the session, to define the DataFrame (Spark's data source lookup and the
source's schema, each in a new Python process), for the first count() of a small topic
(planning and the first tasks, in more new Python processes), for a second count(), and for a
first Python job that does not use the connector, with the CPU seconds all of the
application's Python processes had used by the end of the first count (`python_cpu_s`: wall
times swing with the machine's load, CPU time much less); plus `connector-imports`: what
importing the connector costs in each kind of Python process Spark starts (after what PySpark
itself imports there), wall and CPU milliseconds.

With --before REF, the same runs first with commit REF's `src/` first on PYTHONPATH (driver,
Spark's Python workers and the broker alike), and each scenario is printed for both with the
ratio. Prints one JSON line per scenario (progress on stderr). Needs `pip install -e ".[spark]"`
and, for the broker's consume rate, kcat.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

T0 = time.monotonic()
# Spark's Python processes, and what PySpark imports in each before the connector is needed.
PROCESSES = {"lookup": "pyspark.sql.worker.lookup_data_sources",
             "create-source": "pyspark.sql.worker.create_data_source",
             "plan-read": "pyspark.sql.worker.plan_data_source_read",
             "task": "pyspark.worker",
             "commit-write": "pyspark.sql.worker.commit_data_source_write"}
# ...and what the connector imports there.
CONNECTOR = {"lookup": ["pyspark_strom"],
             "create-source": ["strom.spark.source"],
             "plan-read": ["strom.spark.source", "strom.spark.offsets"],
             "task": ["strom.spark.source", "strom.spark.fetch", "strom.spark.sink"],
             "commit-write": ["strom.spark.sink"]}


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def done(result: dict) -> dict:
    """A finished scenario, also logged in full (a later failure does not lose it)."""
    log("result " + json.dumps(result))
    return result


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(15)


def load() -> str:
    """The machine's load average over the last minute, for the record."""
    return f"{os.getloadavg()[0]:.2f}"


def fill(bootstrap: str, topic: str, records: int, size: int, partitions: int) -> dict:
    """Produce the records with the sink's producer settings, timed: the broker's produce rate."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 1_000_000, "enable.idempotence": True, "acks": "all"})
    value = b"x" * size
    begin = time.monotonic()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(300) == 0
    seconds = time.monotonic() - begin
    return {"scenario": "broker-produce-python", "records": records, "record_bytes": size,
            "seconds": round(seconds, 3), "records_per_s": round(records / seconds), "load": load()}


def consume_python(bootstrap: str, topic: str, records: int, partitions: int, size: int) -> dict:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                  "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20,
                  "queued.min.messages": 1_000_000})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got, begin = 0, time.monotonic()
    while got < records:
        got += sum(1 for m in c.consume(20_000, 1.0) if m.error() is None)
    seconds = time.monotonic() - begin
    c.close()
    return {"scenario": "broker-consume-python", "records": records, "record_bytes": size,
            "seconds": round(seconds, 3), "records_per_s": round(records / seconds), "load": load()}


def consume_kcat(bootstrap: str, topic: str, records: int, size: int) -> dict | None:
    if shutil.which("kcat") is None:
        return None
    begin = time.monotonic()
    done = subprocess.run(["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-q",
                           "-f", "%o\n", "-X", "fetch.max.bytes=67108864"],
                          stdout=subprocess.PIPE, check=True)
    seconds = time.monotonic() - begin
    assert done.stdout.count(b"\n") == records
    return {"scenario": "broker-consume-kcat", "records": records, "record_bytes": size,
            "seconds": round(seconds, 3), "records_per_s": round(records / seconds), "load": load()}


def measure(name: str, records: int, passes: int, run: Callable[[int], None], **meta) -> dict:
    seconds = []
    for i in range(passes):
        begin = time.monotonic()
        run(i)
        seconds.append(time.monotonic() - begin)
        log(f"{name} {meta.get('master')} {meta.get('record_bytes')} B pass {i + 1}: "
            f"{records / seconds[-1]:,.0f} records/s")
    best = statistics.median(seconds)
    return done({"scenario": name, "records": records, "seconds_median": round(best, 3),
            "records_per_s": round(records / best), "records_per_s_passes": [round(records / s) for s in seconds],
            "load": load(), **meta})


def micro_batches(spark, bootstrap: str, tmp: str, samples: int = 25) -> dict:
    """One-record micro-batches of a running stream: produce-to-progress latency, and Spark's
    durationMs breakdown (medians) of those batches."""
    create_topic(bootstrap, "micro", 2)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    query = (spark.readStream.format("strom").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", "micro").load().writeStream.format("noop")
             .option("checkpointLocation", f"{tmp}/micro").trigger(processingTime="0 seconds").start())
    seen: set[int] = set()
    latencies, durations = [], []
    try:
        time.sleep(5)  # the first (empty) batches, workers started
        for i in range(samples + 5):
            seen.update(p["batchId"] for p in query.recentProgress)
            producer.produce("micro", b"x")
            producer.flush(10)
            begin = time.monotonic()
            while time.monotonic() - begin < 30:
                fresh = [p for p in query.recentProgress if p["batchId"] not in seen and p["numInputRows"]]
                if fresh:
                    if i >= 5:  # warm-up samples dropped
                        latencies.append(time.monotonic() - begin)
                        durations.append(fresh[-1]["durationMs"])
                    break
                time.sleep(0.005)
    finally:
        query.stop()
    latencies.sort()
    parts = ("latestOffset", "queryPlanning", "addBatch", "walCommit", "commitOffsets", "triggerExecution")
    return {"scenario": "spark-micro-batch", "master": "local[2]", "samples": len(latencies),
            "produce_to_progress_s_p50": round(statistics.median(latencies), 3),
            "produce_to_progress_s_p95": round(latencies[int(len(latencies) * 0.95) - 1], 3),
            "duration_ms_median": {k: statistics.median(d.get(k, 0) for d in durations) for k in parts},
            "load": load()}


def spark_scenarios(spark, bootstrap: str, tmp: str, topic: str, args: argparse.Namespace, size: int,
                    master: str, rates: dict[str, int]) -> list[dict]:
    meta = {"record_bytes": size, "master": master, "partitions": args.partitions}
    n, records = args.partitions, args.records
    source = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "startingOffsets": "earliest"}
    tag = f"{master.split('[')[0].split()[0]}-{size}"  # for topic names: local-100, standalone-1024

    def batch_read(_: int) -> None:
        spark.read.format("strom").options(**source).load().write.format("noop").mode("overwrite").save()

    def stream_read(i: int) -> None:
        query = (spark.readStream.format("strom").options(**source).load().writeStream.format("noop")
                 .option("checkpointLocation", f"{tmp}/ckpt-{tag}-{i}").trigger(availableNow=True).start())
        query.awaitTermination()
        rows = sum(p["numInputRows"] for p in query.recentProgress)
        assert rows == records, rows

    data = (spark.range(records, numPartitions=n)
            .selectExpr(f"cast(rpad(cast(id as string), {size}, 'x') as binary) as value"))

    def generate(_: int) -> None:
        data.write.format("noop").mode("overwrite").save()

    def batch_write(i: int) -> None:
        create_topic(bootstrap, f"out-{tag}-{i}", n)
        data.write.format("strom").option("kafka.bootstrap.servers", bootstrap) \
            .option("topic", f"out-{tag}-{i}").mode("append").save()

    def stream_copy(i: int) -> None:
        create_topic(bootstrap, f"copy-{tag}-{i}", n)
        query = (spark.readStream.format("strom").options(**source).load().select("value").writeStream
                 .format("strom").option("kafka.bootstrap.servers", bootstrap).option("topic", f"copy-{tag}-{i}")
                 .option("transactionalIdPrefix", f"copy-{tag}-{i}")
                 .option("checkpointLocation", f"{tmp}/copy-{tag}-{i}").trigger(availableNow=True).start())
        query.awaitTermination()
        assert query.exception() is None, query.exception()

    batch_read(-1)  # warm-up: Python workers started, code imported
    results = [
        measure("spark-batch-read", records, args.passes, batch_read, **meta, baseline="broker-consume-kcat"),
        measure("spark-stream-read", records, args.passes, stream_read, **meta, baseline="broker-consume-kcat"),
        measure("spark-generate", records, args.passes, generate, **meta),
        measure("spark-batch-write", records, args.passes, batch_write, **meta, baseline="broker-produce-python"),
        measure("spark-stream-copy-eos", records, args.passes, stream_copy, **meta,
                baseline="broker-produce-python"),
    ]
    for result in results:
        base = rates.get(result.get("baseline", ""))
        if base:
            result["vs_broker"] = round(result["records_per_s"] / base, 3)
    written = spark.read.format("strom").option("kafka.bootstrap.servers", bootstrap) \
        .option("subscribe", f"out-{tag}-0").load().count()
    assert written == records, written
    copied = spark.read.format("strom").option("kafka.bootstrap.servers", bootstrap) \
        .option("subscribe", f"copy-{tag}-0").option("kafka.isolation.level", "read_committed").load().count()
    assert copied == records, copied
    return results


def standalone_cluster_class() -> type:
    """StandaloneCluster from this working tree, also when --before runs an older `src/` that
    has none (it is the harness, not what is measured)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "src/strom/spark/standalone.py"
    spec = importlib.util.spec_from_file_location("strom_bench_standalone", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.StandaloneCluster


def throughput(args: argparse.Namespace) -> list[dict]:
    import strom.spark
    from strom.testing import BrokerProcess

    StandaloneCluster = standalone_cluster_class()  # noqa: N806 - a class

    results: list[dict] = []
    with BrokerProcess() as broker, tempfile.TemporaryDirectory(prefix="strom-spark-bench-") as tmp:
        bootstrap = broker.bootstrap
        rates: dict[int, dict[str, int]] = {}
        for size in args.sizes:
            topic = f"bench-{size}"
            create_topic(bootstrap, topic, args.partitions)
            log(f"producing {args.records:,} records of {size} bytes")
            found = [fill(bootstrap, topic, args.records, size, args.partitions),
                     consume_kcat(bootstrap, topic, args.records, size),
                     consume_python(bootstrap, topic, args.records, args.partitions, size)]
            found = [f for f in found if f]
            results += found
            rates[size] = {f["scenario"]: f["records_per_s"] for f in found}
            for f in found:
                done(f)
        for master in args.masters:
            if master == "local":
                spark = strom.spark.local_session("local[2]", "strom-bench", **{"spark.sql.shuffle.partitions": "2"})
                cluster = None
            else:
                cluster = StandaloneCluster(workers=2, cores=1, memory="1g", executor_memory="512m").start()
                spark = cluster.session("strom-bench")
            spark.sparkContext.setLogLevel("ERROR")
            name = "local[2]" if master == "local" else "standalone 2x1 core"
            try:
                for size in args.sizes:
                    results += spark_scenarios(spark, bootstrap, tmp, f"bench-{size}", args, size, name, rates[size])
                if master == "local":
                    results.append(micro_batches(spark, bootstrap, tmp))
            finally:
                spark.stop()
                if cluster is not None:
                    cluster.close()
    return results


FIRST_READ = r"""
import json, os, sys, time
t0 = time.monotonic()
from pyspark.sql import SparkSession
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def python_cpu_s():
    # CPU seconds of the Python processes Spark started for this application (daemons, their
    # workers, and the workers that have exited), from /proc.
    total, me = 0, os.getpid()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = open(f"/proc/{pid}/cmdline", "rb").read()
            if b"pyspark.daemon" not in command and b"pyspark.worker" not in command:
                continue  # not a Python process of Spark's (the driver's JVM is one of ours too)
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            parent, ours = int(fields[1]), False
            while parent > 1:
                if parent == me:
                    ours = True
                    break
                parent = int(open(f"/proc/{parent}/stat").read().rsplit(")", 1)[1].split()[1])
            if ours:
                total += sum(int(x) for x in fields[11:15])
        except OSError:
            pass
    return total / os.sysconf("SC_CLK_TCK")


spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
t1 = time.monotonic()
df = (spark.read.format("strom").option("kafka.bootstrap.servers", sys.argv[1])
      .option("subscribe", sys.argv[2]).load())
t2 = time.monotonic()
assert df.count() == int(sys.argv[3])
t3 = time.monotonic()
cpu = python_cpu_s()
assert df.count() == int(sys.argv[3])
t4 = time.monotonic()
spark.sparkContext.parallelize(range(4), 2).map(lambda x: x).count()
t5 = time.monotonic()
print(json.dumps({"session_s": round(t1 - t0, 2), "load_s": round(t2 - t1, 2), "first_count_s": round(t3 - t2, 2),
                  "python_cpu_s": round(cpu, 2), "second_count_s": round(t4 - t3, 2),
                  "first_python_job_after_s": round(t5 - t4, 2)}))
spark.stop()
"""

IMPORTS = r"""
import importlib, json, sys, time
importlib.import_module(sys.argv[1])
begin, cpu = time.perf_counter(), time.process_time()
for name in sys.argv[2:]:
    importlib.import_module(name)
print(json.dumps([round((time.perf_counter() - begin) * 1000), round((time.process_time() - cpu) * 1000)]))
"""


def start_up(args: argparse.Namespace) -> list[dict]:
    """The first read of a fresh application, and the connector's import cost per process."""
    from strom.testing import BrokerProcess

    out = []
    with BrokerProcess() as broker:
        create_topic(broker.bootstrap, "small", 2)
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(100):
            producer.produce("small", b"%d" % i, partition=i % 2)
        assert producer.flush(30) == 0
        runs = []
        for i in range(args.start_runs):
            done = subprocess.run([sys.executable, "-c", FIRST_READ, broker.bootstrap, "small", "100"],
                                  capture_output=True, text=True, check=True)
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            log(f"first read run {i + 1}: {runs[-1]}")
        out.append({"scenario": "first-read", "runs": len(runs), "load": load(),
                    **{k: statistics.median(r[k] for r in runs) for k in runs[0]}})
    wall: dict[str, int] = {}
    cpu: dict[str, int] = {}
    for process, pre in PROCESSES.items():
        times = [json.loads(subprocess.run([sys.executable, "-c", IMPORTS, pre, *CONNECTOR[process]],
                                           capture_output=True, text=True, check=True).stdout)
                 for _ in range(max(args.start_runs, 5))]
        wall[process] = statistics.median(t[0] for t in times)
        cpu[process] = statistics.median(t[1] for t in times)
    out.append({"scenario": "connector-imports", "wall_ms_median": wall, "cpu_ms_median": cpu,
                "cpu_ms_total": sum(cpu.values()), "load": load()})
    return out


def run_all(args: argparse.Namespace) -> list[dict]:
    results = start_up(args) if args.start_runs else []
    if args.records:
        results += throughput(args)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000, help="0: start-up only")
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[100, 1024],
                    help="value bytes per record, comma-separated")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--masters", type=lambda s: s.split(","), default=["local", "standalone"])
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--start-runs", type=int, default=3, help="fresh applications timed for first-read (0: none)")
    ap.add_argument("--before", metavar="REF", help="also run commit REF's src/ and compare")
    ap.add_argument("--json-out", type=Path, help=argparse.SUPPRESS)  # a --before child's results
    args = ap.parse_args()
    child_args = ["--records", str(args.records), "--sizes", ",".join(map(str, args.sizes)),
                  "--partitions", str(args.partitions), "--masters", ",".join(args.masters),
                  "--passes", str(args.passes), "--start-runs", str(args.start_runs)]
    if not args.before:
        results = run_all(args)
        if args.json_out:
            args.json_out.write_text(json.dumps(results))
        for result in results:
            print(json.dumps(result), flush=True)
        return
    from hardening import commit_variant  # benchmarks/ is on sys.path: this script's directory

    workdir = Path(tempfile.mkdtemp(prefix="strom-spark-before-"))
    try:
        variant, commit = commit_variant(args.before, workdir)
        log(f"before: commit {commit}")
        subprocess.run([sys.executable, __file__, *child_args, "--json-out", str(workdir / "before.json")],
                       env={**os.environ, **variant.env}, check=True, stdout=subprocess.DEVNULL)
        before = json.loads((workdir / "before.json").read_text())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    log("after: this working tree")
    after = run_all(args)
    for b, a in zip(before, after, strict=True):
        key = next((k for k in ("records_per_s", "python_cpu_s", "produce_to_progress_s_p50", "cpu_ms_total")
                    if k in a), None)
        ratio = {f"{key}_ratio_after_to_before": round(a[key] / b[key], 3)} if key and b.get(key) else {}
        print(json.dumps({"scenario": a["scenario"], "before_commit": commit, "before": b, "after": a, **ratio}),
              flush=True)


if __name__ == "__main__":
    main()
