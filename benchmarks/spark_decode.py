"""What typed columns cost: Avro values decoded by the `strom` source, against reading the
same records as raw bytes, in one invocation against one broker process with its schema
registry.

    .venv/bin/python benchmarks/spark_decode.py [--records 200000] [--passes 3] [--no-spark]

Fills a one-partition topic with --records Avro order records (~50 bytes each: longs,
strings, a nested record, an array, an enum, a nullable union, a timestamp), framed as
confluent-kafka's AvroSerializer frames them, then measures, each the median of --passes:

- task-binary: the task side of a read without Spark, Arrow batches of the Kafka columns as
  fetched (the raw-bytes baseline: what a binary read hands Spark);
- task-avro: the same batches with the value decoded into a struct column (the writer schema
  is the reader's: no resolution);
- task-avro-evolved: the same, read with a newer reader schema (a field added with a
  default): every record goes through Avro schema resolution;
- spark-binary / spark-avro: spark.read.format("strom") ... .write.format("noop") on
  local[2], value as bytes and value as a struct.

Each line is JSON with records/s; the typed lines carry `vs_binary`, their rate over the
binary baseline's of the same kind.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import statistics
import sys
import time
from collections.abc import Callable

import fastavro
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from strom.schemas import frame
from strom.testing import BrokerProcess, create_topic, free_ports

T0 = time.monotonic()
ORDER = {"type": "record", "name": "Order", "namespace": "bench", "fields": [
    {"name": "id", "type": "long"},
    {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
        {"name": "name", "type": "string"}, {"name": "tier", "type": "int"}]}},
    {"name": "items", "type": {"type": "array", "items": "string"}},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "amount", "type": "double"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}
ORDER_V2 = {**ORDER, "fields": [*ORDER["fields"], {"name": "channel", "type": "string", "default": "web"}]}


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def fill(bootstrap: str, registry: SchemaRegistryClient, topic: str, records: int) -> int:
    """The records, framed with the id of ORDER under <topic>-value; their mean size."""
    schema_id = registry.register_schema(f"{topic}-value", Schema(json.dumps(ORDER), "AVRO"))
    parsed = fastavro.parse_schema(ORDER)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 1_000_000})
    at = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    total = 0
    for i in range(records):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, {
            "id": i, "customer": {"name": f"customer-{i % 997}", "tier": i % 4},
            "items": [f"sku-{i % 50}", f"sku-{i % 7}"][: i % 3], "status": ("NEW", "PAID", "SHIPPED")[i % 3],
            "note": None if i % 4 else "leave at the door", "amount": i * 0.25,
            "at": at + datetime.timedelta(milliseconds=i)})
        value = frame(schema_id, buf.getvalue())
        total += len(value)
        while True:
            try:
                producer.produce(topic, value, partition=0)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(300) == 0
    return total // records


def median_rate(name: str, records: int, passes: int, run: Callable[[], None]) -> dict:
    seconds = []
    for i in range(passes):
        begin = time.process_time() if name.startswith("task") else time.monotonic()
        run()
        seconds.append((time.process_time() if name.startswith("task") else time.monotonic()) - begin)
        log(f"{name} pass {i + 1}: {records / seconds[-1]:,.0f} records/s")
    best = statistics.median(seconds)
    return {"scenario": name, "records": records, "seconds_median": round(best, 3),
            "records_per_s": round(records / best),
            "clock": "process cpu" if name.startswith("task") else "wall"}


def task_side(bootstrap: str, registry_url: str, topic: str, records: int, passes: int) -> list[dict]:
    """The decode step in this process over batches fetched once (CPU time)."""
    from strom.spark.fetch import read_range
    from strom.spark.options import source_options
    from strom.spark.ranges import Range
    from strom.spark.schema import source_schema
    from strom.spark.typed import decode_batches, plan, typed_schema

    options = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "valueformat": "avro",
               "schema.registry.url": registry_url}
    opts = source_options(options, batch=True)
    batches = list(read_range(opts, Range(topic, 0, 0, records)))
    assert sum(b.num_rows for b in batches) == records

    def binary() -> None:
        for b in batches:
            b.column("value").to_pylist()  # the bytes as Python sees them: the least a decoder does

    results = [median_rate("task-binary", records, passes, binary)]
    for name, subject_version in (("task-avro", 1), ("task-avro-evolved", 2)):
        typed_opts = source_options({**options, "valueschemaversion": str(subject_version)}, batch=True)
        plans = plan(typed_opts.formats)
        schema = typed_schema(source_schema(False), plans)

        def decode(plans=plans, schema=schema) -> None:
            for _ in decode_batches(iter(batches), plans, schema):
                pass

        results.append(median_rate(name, records, passes, decode))
    return results


def spark_side(bootstrap: str, registry_url: str, topic: str, records: int, passes: int) -> list[dict]:
    import strom.spark

    spark = strom.spark.local_session("local[2]", "strom-decode-bench", **{"spark.sql.shuffle.partitions": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    source = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "minPartitions": "2"}
    try:
        results = []
        for name, extra in (("spark-binary", {}),
                            ("spark-avro", {"valueFormat": "avro", "schema.registry.url": registry_url})):
            def run(extra=extra) -> None:
                (spark.read.format("strom").options(**source, **extra).load()
                 .write.format("noop").mode("overwrite").save())

            run()  # warm: Spark's Python workers started, modules imported
            results.append(median_rate(name, records, passes, run))
        return results
    finally:
        spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--no-spark", action="store_true", help="the task-side measurements only")
    args = parser.parse_args()
    url = f"http://127.0.0.1:{free_ports(1)[0]}"
    with BrokerProcess(overrides={"schema.registry.listeners": url}) as broker:
        registry = SchemaRegistryClient({"url": url})
        topic = "orders"
        create_topic(broker.bootstrap, topic)
        log(f"producing {args.records:,} Avro records")
        size = fill(broker.bootstrap, registry, topic, args.records)
        registry.register_schema(f"{topic}-value", Schema(json.dumps(ORDER_V2), "AVRO"))  # version 2
        results = task_side(broker.bootstrap, url, topic, args.records, args.passes)
        if not args.no_spark:
            results += spark_side(broker.bootstrap, url, topic, args.records, args.passes)
    baseline = {r["scenario"].split("-")[0]: r["records_per_s"] for r in results if r["scenario"].endswith("binary")}
    for r in results:
        kind = r["scenario"].split("-")[0]
        if not r["scenario"].endswith("binary"):
            r["vs_binary"] = round(r["records_per_s"] / baseline[kind], 3)
        print(json.dumps({**r, "value_bytes": size}), flush=True)


if __name__ == "__main__":
    main()
