"""A batch read of a tiered topic by the PySpark connector: directly from the object store
(strom.spark.remote) against the same read through the broker, in one run.

    .venv/bin/python benchmarks/spark_tiered.py [--records 10000000] [--size 100] [--partitions 2]
        [--passes 3]

Starts a SeaweedFS S3 server and a broker process that tiers (remote.log.storage.system.enable,
the topic with remote.storage.enable, segment.bytes 8 MiB, local.retention.ms 1), produces
--records records of --size bytes (confluent-kafka), waits until local retention has deleted
all but the active segments (ListOffsets EARLIEST_LOCAL), then reads the whole topic with
spark.read.format("strom") into the noop sink on local[2], --passes times each way: with the
store's rsm.config.* options (direct) and with directRemoteReads=false (every offset read
by the broker from the store). Prints one JSON line per way (median of the passes) and the
ratio; progress on stderr. One untimed read each way first (Spark's first job).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from strom.s3_server import S3Server
from strom.testing import BrokerProcess, create_topic, free_ports, wait_for

EARLIEST_LOCAL = -4


def produce(bootstrap: str, topic: str, records: int, size: int) -> float:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20,
                         "compression.type": "none", "queue.buffering.max.messages": 1_000_000})
    value = b"x" * size
    begin = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, key=b"%d" % (i % 1000))
                break
            except BufferError:
                producer.poll(0.05)
        if i % 100_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0
    return time.perf_counter() - begin


def local_start(bootstrap: str, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench"})
    try:
        return [tp.offset for tp in consumer.offsets_for_times(
            [TopicPartition(topic, p, EARLIEST_LOCAL) for p in range(partitions)], timeout=10)]
    finally:
        consumer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=10_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args()

    import strom.spark

    with tempfile.TemporaryDirectory(prefix="strom-bench-tiered-") as tmp, \
            S3Server(Path(tmp) / "s3", ports=free_ports) as s3:
        config = s3.rsm_config(key_prefix="bench/")
        overrides = {"remote.log.storage.system.enable": "true", **config,
                     "remote.log.manager.task.interval.ms": "500", "log.retention.check.interval.ms": "500",
                     "log.segment.delete.delay.ms": "0"}
        with BrokerProcess(Path(tmp) / "broker", overrides) as broker:
            topic = "tiered-bench"
            create_topic(broker.bootstrap, topic, args.partitions,
                         config={"remote.storage.enable": "true", "segment.bytes": str(8 << 20),
                                 "local.retention.ms": "1"})
            seconds = produce(broker.bootstrap, topic, args.records, args.size)
            print(f"produced {args.records} records in {seconds:.1f} s", file=sys.stderr)
            per = args.records // args.partitions
            began = time.perf_counter()
            wait_for(lambda: min(local_start(broker.bootstrap, topic, args.partitions)) >= per * 0.8,
                     timeout=600, interval=1)
            print(f"tiered (local log starts {local_start(broker.bootstrap, topic, args.partitions)}) in "
                  f"{time.perf_counter() - began:.1f} s", file=sys.stderr)
            spark = strom.spark.local_session("local[2]", "strom-bench-tiered")
            spark.sparkContext.setLogLevel("ERROR")
            base = {"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic, **config}
            results = {}
            ways = (("direct", {}), ("broker", {"directRemoteReads": "false"}))
            try:
                for _, extra in ways:  # untimed: Spark's first job, Python workers and imports
                    spark.read.format("strom").options(**base, **extra).load().write.format("noop") \
                        .mode("overwrite").save()
                for way, extra in ways:
                    times = []
                    for _ in range(args.passes):
                        begin = time.perf_counter()
                        df = spark.read.format("strom").options(**base, **extra).load()
                        df.write.format("noop").mode("overwrite").save()
                        times.append(time.perf_counter() - begin)
                        print(f"{way}: {times[-1]:.2f} s", file=sys.stderr)
                    median = statistics.median(times)
                    results[way] = args.records / median
                    print(json.dumps({"scenario": f"spark-tiered-read-{way}", "records": args.records,
                                      "size": args.size, "partitions": args.partitions, "seconds": round(median, 2),
                                      "records_per_s": round(results[way])}))
            finally:
                spark.stop()
            print(json.dumps({"scenario": "spark-tiered-read", "direct_vs_broker":
                              round(results["direct"] / results["broker"], 2)}))


if __name__ == "__main__":
    main()
