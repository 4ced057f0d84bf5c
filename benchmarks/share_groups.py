"""Share group (KIP-932) throughput beside a classic consumer group, on one partition.

    .venv/bin/python benchmarks/share_groups.py [--records 200000] [--size 100] [--batch 100]

Prints one JSON document to stdout (progress on stderr). One broker process (127.0.0.1,
ephemeral port, temp dir). The topic has one partition, filled once by a confluent-kafka
producer with `batch.num.messages=--batch` (a share fetch acquires whole batches, so the batch
size is how finely records can be spread over members). Then, each with a group of its own
reading from the start:

- classic_1: one classic consumer (subscribe, auto commit), records/s from its first record
  to its last.
- share_1, share_4 and share_16: 1, 4 and 16 ShareConsumers (implicit acknowledgement: each poll accepts
  the previous poll's records), each polled by its own thread; records/s of distinct records
  from the first record any of them got to the moment every record was received, and how
  many each received (`deliveries` counts redeliveries too: librdkafka 2.16's close() does
  not accept the last poll's records, so the broker releases them to the members still
  polling).
  Every acknowledgement and acquisition is written to `__share_group_state`, one append per
  ShareFetch.
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
    from confluent_kafka import Consumer, Producer, ShareConsumer
    from confluent_kafka.admin import AdminClient, NewTopic

    from strom.client import Connection
    from strom.testing import BrokerProcess
except ImportError as e:  # pragma: no cover - a usage error, not a benchmark result
    sys.exit(f"share_groups.py needs the project venv (confluent-kafka and strom): {e}")

TIMEOUT_S = 300


def progress(message: str) -> None:
    print(f"[share_groups] {message}", file=sys.stderr, flush=True)


def fill(bootstrap: str, topic: str, records: int, size: int, batch: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result()
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": batch,
                  "queue.buffering.max.messages": 1_000_000})
    value = b"x" * size
    for _ in range(records):
        while True:
            try:
                p.produce(topic, value, partition=0)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0


def earliest(bootstrap: str, group: str) -> None:
    host, port = bootstrap.split(":")
    with Connection(host, int(port)) as conn:
        body = conn.call(44, 1, {"resources": [{"resource_type": 32, "resource_name": group, "configs": [
            {"name": "share.auto.offset.reset", "config_operation": 0, "value": "earliest"}]}],
            "validate_only": False})
    assert body.responses[0].error_code == 0, body


def classic(bootstrap: str, topic: str, records: int) -> dict:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"classic-{uuid.uuid4()}",
                  "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got, first, deadline = 0, None, time.monotonic() + TIMEOUT_S
    while got < records and time.monotonic() < deadline:
        batch = c.consume(10_000, 0.5)
        if batch and first is None:
            first = time.monotonic()
        got += sum(1 for m in batch if m.error() is None)
    elapsed = time.monotonic() - (first or time.monotonic())
    c.close()
    return {"records": got, "seconds": round(elapsed, 3), "records_per_s": round(got / elapsed) if elapsed else None}


def share(bootstrap: str, topic: str, records: int, members: int) -> dict:
    group = f"share-{uuid.uuid4()}"
    earliest(bootstrap, group)
    lock = threading.Lock()
    counts = [0] * members
    offsets: set[int] = set()
    state = {"first": None, "last": None}
    done = threading.Event()

    def run(i: int) -> None:
        c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group})
        c.subscribe([topic])
        deadline = time.monotonic() + TIMEOUT_S
        try:
            while not done.is_set() and time.monotonic() < deadline:
                batch = [m for m in c.poll(0.5) if m.error() is None]
                if not batch:
                    continue
                with lock:
                    now = time.monotonic()
                    state["first"] = state["first"] or now
                    counts[i] += len(batch)
                    offsets.update(m.offset() for m in batch)
                    if len(offsets) >= records:
                        state["last"] = now
                        done.set()
        finally:
            c.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(members)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S + 30)
    elapsed = (state["last"] or time.monotonic()) - (state["first"] or time.monotonic())
    total = len(offsets)
    return {"members": members, "records": total, "deliveries": sum(counts), "per_member": counts,
            "seconds": round(elapsed, 3), "records_per_s": round(total / elapsed) if elapsed > 0 else None}


LOCK_MS = 1000


def redelivery(bootstrap: str, topic: str, rounds: int) -> dict:
    """Seconds past the lock's expiry until another member gets a stalled member's records."""
    late = []
    for _ in range(rounds):
        group = f"share-{uuid.uuid4()}"
        earliest(bootstrap, group)
        host, port = bootstrap.split(":")
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
    parser.add_argument("--members", type=int, nargs="*", default=[1, 4, 16], help="share group sizes")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the redelivery scenario")
    args = parser.parse_args()
    out: dict = {"meta": {"records": args.records, "size": args.size, "batch": args.batch}, "results": {}}
    with BrokerProcess(overrides={"offsets.topic.num.partitions": "4",
                                  "share.coordinator.state.topic.num.partitions": "4",
                                  "group.share.min.record.lock.duration.ms": str(LOCK_MS),
                                  "group.share.max.groups": str(len(args.members) + args.rounds + 10)}) as broker:
        topic = f"share-bench-{uuid.uuid4().hex[:8]}"
        progress(f"filling {topic} with {args.records} records of {args.size} B")
        fill(broker.bootstrap, topic, args.records, args.size, args.batch)
        progress("classic consumer group, 1 consumer")
        out["results"]["classic_1"] = classic(broker.bootstrap, topic, args.records)
        for n in args.members:
            progress(f"share group, {n} share consumer(s)")
            out["results"][f"share_{n}"] = share(broker.bootstrap, topic, args.records, n)
        progress(f"redelivery after a lock expiry, {args.rounds} rounds")
        out["results"]["redelivery"] = redelivery(broker.bootstrap, topic, args.rounds)
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
