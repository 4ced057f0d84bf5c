"""Share group (KIP-932) throughput beside classic consumers, on one partition and on 16.

    .venv/bin/python benchmarks/share_groups.py [--records 200000] [--size 100] [--batch 100]
        [--partitions 1 16] [--members 1 4 16] [--rounds 5] [--brokers 1]

Prints one JSON document to stdout (progress on stderr). One broker process (127.0.0.1,
ephemeral port, temp dir), or with --brokers 3 a KRaft cluster of three whose topics have
three replicas (acks=all, min.insync.replicas 2): there most share partitions' state is kept
by another broker than their leader, reached over the share-state RPCs. For each --partitions count a topic is filled once by a
confluent-kafka producer with `batch.num.messages=--batch` (a share fetch acquires whole
batches, so the batch size is how finely records can be spread over members), keyless and
spread evenly over the partitions. Then, on each topic, reading from the start:

- classic_N: N classic consumers (N from --members), each assigned its share of the
  partitions (assign(), no group protocol, so no rebalance delay is measured), each polled by
  its own thread; records/s from the assign() calls to the moment every record was received.
  librdkafka prefetches up to 100,000 records before the first poll returns, so the time from
  the first record polled would flatter it; a poll waits at most 20 ms for a full 10,000.
- share_N: N ShareConsumers of one new group (implicit acknowledgement: each poll accepts the
  previous poll's records), each polled by its own thread; records/s of distinct records from
  the subscribe() calls to the moment every record was received (`from_first_record` times
  from the first record any of them got instead, without the group join), and how many each
  received (`deliveries` counts redeliveries too: librdkafka 2.16's close() does not accept
  the last poll's records, so the broker releases them to the members still polling).
  `ratio` is share_N's records/s over classic_N's.
- redelivery: a member acquires records and stops (explicit acknowledgement, never given);
  another member polls. The time from the first member's poll returning to the second
  receiving them again, past the group's `share.record.lock.duration.ms` (1,000 ms here):
  how late after its lock runs out a record is offered again, median and max of --rounds.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid

try:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, ShareConsumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from strom.client import Connection
    from strom.testing import KRAFT, BrokerProcess, Cluster
except ImportError as e:  # pragma: no cover - a usage error, not a benchmark result
    sys.exit(f"share_groups.py needs the project venv (confluent-kafka and strom): {e}")

TIMEOUT_S = 300


def progress(message: str) -> None:
    print(f"[share_groups] {message}", file=sys.stderr, flush=True)


def fill(bootstrap: str, topic: str, partitions: int, records: int, size: int, batch: int, replicas: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, replicas)])[topic].result()
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": batch, "acks": "all",
                  "queue.buffering.max.messages": 1_000_000})
    value = b"x" * size
    for i in range(records):
        while True:
            try:
                p.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0


def earliest(bootstrap: str, group: str) -> None:
    host, port = bootstrap.split(",")[0].split(":")
    with Connection(host, int(port)) as conn:
        body = conn.call(44, 1, {"resources": [{"resource_type": 32, "resource_name": group, "configs": [
            {"name": "share.auto.offset.reset", "config_operation": 0, "value": "earliest"}]}],
            "validate_only": False})
    assert body.responses[0].error_code == 0, body


class Tally:
    """Distinct records received by a pool of consumer threads, and when."""

    def __init__(self, records: int, members: int) -> None:
        self.records = records
        self.lock = threading.Lock()
        self.counts = [0] * members
        self.seen: set[tuple[int, int]] = set()
        self.first: float | None = None
        self.last: float | None = None
        self.done = threading.Event()

    def add(self, i: int, batch: list) -> None:
        with self.lock:
            now = time.monotonic()
            self.first = self.first or now
            self.counts[i] += len(batch)
            self.seen.update((m.partition(), m.offset()) for m in batch)
            if len(self.seen) >= self.records:
                self.last = now
                self.done.set()

    def result(self, started: float) -> dict:
        last = self.last or time.monotonic()
        total, elapsed = len(self.seen), last - started
        out = {"records": total, "deliveries": sum(self.counts), "per_member": self.counts,
               "seconds": round(elapsed, 3), "records_per_s": round(total / elapsed) if elapsed > 0 else None}
        if self.first is not None and last > self.first:
            out["from_first_record"] = round(total / (last - self.first))
        return out


def run_pool(members: int, tally: Tally, make, poll) -> float:
    """Start `members` threads that each make a consumer and poll it until every record came;
    the time they were all started."""
    def run(i: int) -> None:
        c = make(i)
        deadline = time.monotonic() + TIMEOUT_S
        try:
            while not tally.done.is_set() and time.monotonic() < deadline:
                batch = [m for m in poll(c) if m.error() is None]
                if batch:
                    tally.add(i, batch)
        finally:
            c.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(members)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S + 30)
    return started


def classic(bootstrap: str, topic: str, partitions: int, records: int, members: int) -> dict:
    tally = Tally(records, members)

    def make(i: int) -> Consumer:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"classic-{uuid.uuid4()}",
                      "enable.auto.commit": False})
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(i, partitions, members)])
        return c

    started = run_pool(members, tally, make, lambda c: c.consume(10_000, 0.02))
    return {"members": members, **tally.result(started)}


def share(bootstrap: str, topic: str, records: int, members: int) -> dict:
    group = f"share-{uuid.uuid4()}"
    earliest(bootstrap, group)
    tally = Tally(records, members)

    def make(i: int) -> ShareConsumer:
        c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group})
        c.subscribe([topic])
        return c

    started = run_pool(members, tally, make, lambda c: c.poll(0.5))
    return {"members": members, **tally.result(started)}


LOCK_MS = 1000


def redelivery(bootstrap: str, topic: str, rounds: int) -> dict:
    """Seconds past the lock's expiry until another member gets a stalled member's records."""
    late = []
    for _ in range(rounds):
        group = f"share-{uuid.uuid4()}"
        earliest(bootstrap, group)
        host, port = bootstrap.split(",")[0].split(":")
        with Connection(host, int(port)) as conn:
            body = conn.call(44, 1, {"resources": [{"resource_type": 32, "resource_name": group, "configs": [
                {"name": "share.record.lock.duration.ms", "config_operation": 0, "value": str(LOCK_MS)}]}],
                "validate_only": False})
        assert body.responses[0].error_code == 0, body
        stalled = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group,
                                 "share.acknowledgement.mode": "explicit", "max.poll.records": 10})
        stalled.subscribe([topic])
        held: set[int] = set()
        deadline = time.monotonic() + 60
        while not held and time.monotonic() < deadline:
            held = {m.offset() for m in stalled.poll(0.5) if m.error() is None}
        acquired = time.monotonic()  # the lock started before this: what follows is an upper bound
        other = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group})
        other.subscribe([topic])
        again = None
        while again is None and time.monotonic() < deadline:
            if any(m.error() is None and m.offset() in held and m.delivery_count() == 2 for m in other.poll(0.05)):
                again = time.monotonic()
        other.close()
        stalled.close()
        if again is not None:
            late.append(again - acquired - LOCK_MS / 1000)
    late.sort()
    return {"rounds": len(late), "lock_ms": LOCK_MS,
            "after_lock_ms_median": round(late[len(late) // 2] * 1000) if late else None,
            "after_lock_ms_max": round(late[-1] * 1000) if late else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=100, help="records per produced batch")
    parser.add_argument("--partitions", type=int, nargs="*", default=[1, 16], help="partitions of the topics")
    parser.add_argument("--members", type=int, nargs="*", default=[1, 4, 16], help="consumers per group")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the redelivery scenario")
    parser.add_argument("--brokers", type=int, default=1,
                        help="brokers (more than 1: a KRaft cluster, topics with 3 replicas, min.insync.replicas 2)")
    args = parser.parse_args()
    out: dict = {"meta": {"records": args.records, "size": args.size, "batch": args.batch, "brokers": args.brokers},
                 "results": {}}
    overrides = {"offsets.topic.num.partitions": "4", "share.coordinator.state.topic.num.partitions": "4",
                 "group.share.min.record.lock.duration.ms": str(LOCK_MS)}
    replicas = min(args.brokers, 3)
    if args.brokers > 1:
        overrides |= {"default.replication.factor": str(replicas), "min.insync.replicas": str(min(replicas, 2)),
                      "group.initial.rebalance.delay.ms": "0"}
        servers = Cluster(args.brokers, zookeeper=KRAFT, overrides=overrides)
    else:
        servers = BrokerProcess(overrides=overrides)
    with servers:
        bootstrap = servers.bootstrap
        topics = []
        for partitions in args.partitions:
            topic = f"share-bench-{partitions}p-{uuid.uuid4().hex[:8]}"
            progress(f"filling {topic} ({partitions} partitions) with {args.records} records of {args.size} B")
            fill(bootstrap, topic, partitions, args.records, args.size, args.batch, replicas)
            topics.append(topic)
            results = out["results"][f"{partitions}_partitions"] = {}
            for n in args.members:
                progress(f"{partitions} partition(s): {n} classic consumer(s), then {n} share consumer(s)")
                results[f"classic_{n}"] = base = classic(bootstrap, topic, partitions, args.records, n)
                results[f"share_{n}"] = mine = share(bootstrap, topic, args.records, n)
                if base["records_per_s"] and mine["records_per_s"]:
                    mine["ratio"] = round(mine["records_per_s"] / base["records_per_s"], 2)
        if args.rounds and topics:
            progress(f"redelivery after a lock expiry, {args.rounds} rounds")
            out["results"]["redelivery"] = redelivery(bootstrap, topics[0], args.rounds)
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
