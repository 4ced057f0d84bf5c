"""What fetch from the closest replica (KIP-392) saves a leader: three consumers in three racks
read one topic led by the rack-a broker, on a three-broker KRaft cluster with one broker per
rack (a, b, c), without and with a replica selector, in one invocation.

    .venv/bin/python benchmarks/fetch_from_follower.py [--megabytes 30] [--partitions 3]

Per run: a fresh cluster (replica.selector.class unset, then Kafka's RackAwareReplicaSelector),
a topic of --partitions partitions, each on brokers [1, 2, 3] (so broker 1, rack a, leads them
all), --megabytes of 1 KiB records written with acks=all, then three confluent-kafka consumers
(client.rack a, b and c) reading everything at once from the start. Reported per broker: the
record bytes it sent consumers (its BytesOut for the topic) and followers (replication), and
each consumer's read time. Progress on stderr, one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from confluent_kafka import Producer

from strom.testing import (
    KRAFT,
    Cluster,
    consume_all,
    create_topic,
    metric_value,
    scrape,
    unique_name,
)

RACKS = {1: "a", 2: "b", 3: "c"}
SELECTOR = "org.apache.kafka.common.replica.RackAwareReplicaSelector"
RECORD = 1024


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def produce(bootstrap: str, topic: str, partitions: int, count: int) -> None:
    value = b"x" * RECORD
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20,
                         "compression.type": "none", "queue.buffering.max.kbytes": 65536})
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0, "records left unacknowledged"


def one_run(selector: str | None, megabytes: int, partitions: int) -> dict:
    overrides = {"num.partitions": "1", "default.replication.factor": "3", "metrics.port": "0",
                 "offsets.topic.num.partitions": "1", "group.initial.rebalance.delay.ms": "0"}
    if selector:
        overrides["replica.selector.class"] = selector
    cluster = Cluster(3, zookeeper=KRAFT, overrides=overrides)
    for broker_id, rack in RACKS.items():
        cluster.brokers[broker_id].overrides["broker.rack"] = rack
    with cluster:
        topic = unique_name("closest")
        create_topic(cluster.bootstrap, topic, assignment=[[1, 2, 3]] * partitions)
        count = megabytes * 1024
        began = time.monotonic()
        produce(cluster.bootstrap, topic, partitions, count)
        log(f"  wrote {count} records in {time.monotonic() - began:.1f} s")
        read_s: dict[str, float] = {}
        failures: list[BaseException] = []

        def consumer(rack: str) -> None:
            try:
                start = time.monotonic()
                got = consume_all(cluster.bootstrap, topic, count=count, timeout=300, **{"client.rack": rack})
                assert len(got) == count, f"rack {rack}: read {len(got)} of {count}"
                read_s[rack] = round(time.monotonic() - start, 2)
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                failures.append(e)

        threads = [threading.Thread(target=consumer, args=(rack,)) for rack in RACKS.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failures:
            raise failures[0]
        brokers = {}
        for broker_id, rack in RACKS.items():
            samples = scrape(cluster.brokers[broker_id].metrics_url)
            brokers[f"{broker_id} ({rack})"] = {
                "consumer_bytes_out": int(samples.get(("strom_topic_bytes_out_total",
                                                       frozenset({("topic", topic)})), 0)),
                "replication_bytes_out": int(metric_value(samples, "strom_replication_bytes_out_total")),
            }
        return {"selector": selector, "records": count, "record_bytes": RECORD, "brokers": brokers,
                "read_seconds_by_consumer_rack": read_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=int, default=30)
    parser.add_argument("--partitions", type=int, default=3)
    args = parser.parse_args()
    runs = []
    for selector in (None, SELECTOR):
        log(f"replica.selector.class={selector or '(unset)'}")
        runs.append(one_run(selector, args.megabytes, args.partitions))
        for name, counts in runs[-1]["brokers"].items():
            log(f"  broker {name}: {counts['consumer_bytes_out'] / 2**20:.1f} MiB to consumers, "
                f"{counts['replication_bytes_out'] / 2**20:.1f} MiB to followers")
    leader = [r["brokers"]["1 (a)"]["consumer_bytes_out"] for r in runs]
    json.dump({"runs": runs, "leader_consumer_bytes_out_ratio": round(leader[1] / leader[0], 3)},
              sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
