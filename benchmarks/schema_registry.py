"""The schema registry and schema validation on produce, on one real broker process.

    .venv/bin/python benchmarks/schema_registry.py [--seconds 3] [--rounds 3]

Prints one JSON line per measurement:
  lookup-by-id      GET /schemas/ids/{id} (the store's answer) per second, one client;
  lookup-by-schema  POST /subjects/{s} of a registered schema per second: each is parsed and
                    made canonical again (not cached), then found by its text;
  client-cached     confluent-kafka's SchemaRegistryClient.get_schema, which caches: what a
                    serializer pays per record once warm (the baseline of the two above);
  produce           records/s and MB/s of 1 KiB Avro-framed values through librdkafka, to a
                    topic with confluent.value.schema.validation on and to one without (the
                    baseline), alternated for --rounds rounds in the same invocation, and the
                    cost of validation as the ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import requests
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
        session = requests.Session()
        body = json.dumps({"schema": SCHEMA})
        headers = {"Content-Type": "application/vnd.schemaregistry.v1+json"}

        def by_id() -> None:
            assert session.get(f"{url}/schemas/ids/{schema_id}").status_code == 200

        def by_schema() -> None:
            assert session.post(f"{url}/subjects/{validated}-value", data=body, headers=headers).status_code == 200

        for name, call in (("lookup-by-id", by_id), ("lookup-by-schema", by_schema),
                           ("client-cached", lambda: client.get_schema(schema_id))):
            print(json.dumps({"measure": name, "per_s": round(per_second(call, args.seconds))}), flush=True)

        create_topic(broker.bootstrap, validated, config={"confluent.value.schema.validation": "true"})
        create_topic(broker.bootstrap, plain)
        value = frame(schema_id, b"\x0cbench1" + b"\x02" * (RECORD_BYTES - 12))
        rates: dict[str, list[float]] = {"validation-on": [], "validation-off": []}
        for _ in range(args.rounds):
            for label, topic in (("validation-on", validated), ("validation-off", plain)):
                rates[label].append(produce_rate(broker.bootstrap, topic, value, args.seconds))
        for label, values in rates.items():
            median = statistics.median(values)
            print(json.dumps({"measure": f"produce-1KiB-{label}", "records_per_s": round(median),
                              "mb_per_s": round(median * len(value) / 1e6, 1),
                              "rounds": [round(v) for v in values]}), flush=True)
        on, off = statistics.median(rates["validation-on"]), statistics.median(rates["validation-off"])
        print(json.dumps({"measure": "validation-cost", "slowdown_pct": round(100 * (1 - on / off), 1)}), flush=True)


if __name__ == "__main__":
    main()
