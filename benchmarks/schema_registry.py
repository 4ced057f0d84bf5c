"""The schema registry and schema validation on produce, on one real broker process.

    .venv/bin/python benchmarks/schema_registry.py [--seconds 3] [--rounds 3]

Prints one JSON line per measurement:
  lookup-by-id      GET /schemas/ids/{id} (the store's answer) per second, 8 requests at once
                    over keep-alive connections (aiohttp);
  lookup-by-schema  POST /subjects/{s} of a registered schema per second, the same way: each is
                    parsed and made canonical again (not cached), then found by its text;
  client-cached     confluent-kafka's SchemaRegistryClient.get_schema, which caches: what a
                    serializer pays per record once warm (the baseline of the two above);
  produce           records/s and MB/s of 1 KiB Avro-framed values through librdkafka, to a
                    topic with confluent.value.schema.validation on and to one without (the
                    baseline), alternated for --rounds rounds in the same invocation, with the
                    broker's CPU seconds per GB written (from /proc: the client is often the
                    bottleneck, so the broker's CPU is what shows validation's cost), and the
                    cost of validation as the ratio of the medians of both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

import aiohttp
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from strom.schemas import frame
from strom.testing import BrokerProcess, create_topic, free_ports, unique_name

SCHEMA = json.dumps({"type": "record", "name": "Reading", "namespace": "bench",
                     "fields": [{"name": "sensor", "type": "string"}, {"name": "payload", "type": "bytes"}]})
RECORD_BYTES = 1024


def per_second(call, seconds: float) -> float:
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        call()
        count += 1
    return count / (time.perf_counter() - start)


def concurrent_per_second(method: str, url: str, body: str | None, seconds: float, concurrency: int = 8) -> float:
    headers = {"Content-Type": "application/vnd.schemaregistry.v1+json"}

    async def run() -> float:
        count = 0
        async with aiohttp.ClientSession() as session:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + seconds

            async def worker() -> None:
                nonlocal count
                while loop.time() < deadline:
                    async with session.request(method, url, data=body, headers=headers) as answer:
                        assert answer.status == 200, await answer.text()
                        await answer.read()
                    count += 1

            start = loop.time()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return count / (loop.time() - start)

    return asyncio.run(run())


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def produce_rate(bootstrap: str, topic: str, value: bytes, seconds: float) -> float:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1 << 20,
                         "queue.buffering.max.messages": 500_000, "acks": 1})
    sent, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(1000):
            try:
                producer.produce(topic, value)
            except BufferError:
                producer.poll(0.01)
        sent += 1000
        producer.poll(0)
    assert producer.flush(60) == 0
    return sent / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    port = free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    with BrokerProcess(overrides={"schema.registry.listeners": url}) as broker:
        client = SchemaRegistryClient({"url": url})
        validated, plain = unique_name("validated"), unique_name("plain")
        schema_id = client.register_schema(f"{validated}-value", Schema(SCHEMA, "AVRO"))
        body = json.dumps({"schema": SCHEMA})
        for name, rate in (
                ("lookup-by-id", lambda: concurrent_per_second("GET", f"{url}/schemas/ids/{schema_id}", None,
                                                               args.seconds)),
                ("lookup-by-schema", lambda: concurrent_per_second("POST", f"{url}/subjects/{validated}-value",
                                                                   body, args.seconds)),
                ("client-cached", lambda: per_second(lambda: client.get_schema(schema_id), args.seconds))):
            print(json.dumps({"measure": name, "per_s": round(rate())}), flush=True)

        create_topic(broker.bootstrap, validated, config={"confluent.value.schema.validation": "true"})
        create_topic(broker.bootstrap, plain)
        value = frame(schema_id, b"\x0cbench1" + b"\x02" * (RECORD_BYTES - 12))
        rates: dict[str, list[float]] = {"validation-on": [], "validation-off": []}
        cpu: dict[str, list[float]] = {"validation-on": [], "validation-off": []}
        produce_rate(broker.bootstrap, plain, value, 1.0)  # warm-up, not counted
        for _ in range(args.rounds):
            for label, topic in (("validation-on", validated), ("validation-off", plain)):
                before, start = cpu_seconds(broker.proc.pid), time.perf_counter()
                rate = produce_rate(broker.bootstrap, topic, value, args.seconds)
                written_gb = rate * (time.perf_counter() - start) * len(value) / 1e9
                rates[label].append(rate)
                cpu[label].append((cpu_seconds(broker.proc.pid) - before) / written_gb)
        for label, values in rates.items():
            median = statistics.median(values)
            print(json.dumps({"measure": f"produce-1KiB-{label}", "records_per_s": round(median),
                              "mb_per_s": round(median * len(value) / 1e6, 1),
                              "broker_cpu_s_per_gb": round(statistics.median(cpu[label]), 2),
                              "rounds": [round(v) for v in values]}), flush=True)
        on, off = statistics.median(rates["validation-on"]), statistics.median(rates["validation-off"])
        cpu_on, cpu_off = statistics.median(cpu["validation-on"]), statistics.median(cpu["validation-off"])
        print(json.dumps({"measure": "validation-cost", "throughput_slowdown_pct": round(100 * (1 - on / off), 1),
                          "broker_cpu_increase_pct": round(100 * (cpu_on / cpu_off - 1), 1)}), flush=True)


if __name__ == "__main__":
    main()
